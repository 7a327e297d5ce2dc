# The loss switches' smoke run, loaded after configs/demo.py: a short warm start, then 4 GRPO steps
# of two updates each (mu = 2, so that the ratios leave 1), every switch's metric in log.jsonl
# within a minute on 2 CPU cores:
#   python train.py configs/demo.py configs/smoke.py --entropy_coef=0.05
# tools/smoke_switches.py runs each loss switch this way beside the default and prints the table
# of their metrics (docs/guide.md, "The loss: its parts and switches").
sft_steps = 150  # the format (reward 0.1) from the first step on; the right answer now and then
max_steps = 4
mu = 2
lr = 1e-3
warmup_steps = 1
max_new_tokens = 64  # some completions cut: mask_truncated_completions has something to mask
synthetic_warm_size = 2000
synthetic_train_size = 500
synthetic_eval_size = 20
eval_every = 0
sample_every = 0
checkpoint_every = 0
out_dir = "out/smoke"
