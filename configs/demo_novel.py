# The novel-split demo (issue 12): RL from final answers alone on problems whose worked solutions no training data
# holds, against supervised baselines that see the same answers. The RL phase and each baseline start from one warm
# start (init_from), so they differ only in the update:
#   python train.py configs/demo_novel.py --max_steps=0 --out_dir=out/demo_novel_warm      # the warm start: sft.pt
#   python train.py configs/demo_novel.py --init_from=out/demo_novel_warm/sft.pt            # GRPO
#   python train.py configs/demo_novel.py configs/demo_novel_rft.py --init_from=out/demo_novel_warm/sft.pt
#   python train.py configs/demo_novel.py configs/demo_novel_sft_answers.py --init_from=out/demo_novel_warm/sft.pt
#   python train.py configs/demo_novel.py configs/demo_novel_sft_more.py --init_from=out/demo_novel_warm/sft.pt
# (python train.py configs/demo_novel.py alone runs the warm start, then GRPO.)
#
# Three sets drawn from the seed by data.demo_split (dataset = "demo"), the model and tokenizer of configs/demo.py:
# - warm start: WITH worked solutions ("27+3=30\n30-4=26"), the only solutions the model ever sees;
# - RL: question and final answer only, a family the warm start never saw;
# - held-out: the RL family, each chain (start, operations, operands) new: in neither set above, nor repeated.
model = "scratch"
model_args = dict(dim=128, n_layers=4, n_heads=4, n_kv_heads=2, head_dim=32, ffn_dim=352, max_seq_len=288)
tokenizer = "char"
template = "plain"
dataset = "demo"
synthetic_warm_size = 5000
synthetic_train_size = 5000
synthetic_eval_size = 300
# the warm start sees chains of one kind (only additions, or only subtractions); RL and held-out chains mix both
synthetic_args = {"warm_ops": (1, 4), "warm_mix": "one", "rl_ops": (2, 4), "rl_mix": "both", "max_operand": 9,
                  "max_start": 50, "restate": True}
eval_size = 300

algorithm = "grpo"  # the baselines' configs change this, lr and out_dir only
sft_steps = 500
sft_batch_size = 64
sft_lr = 1e-3

group_size = 8
prompts_per_step = 16
max_new_tokens = 128  # a 4-line restated solution and its answer take about 110 characters
reward_weights = {"correctness": 1.0, "format": 0.1}
beta = 0.04
max_steps = 60
lr = 1e-4
warmup_steps = 5
micro_batch_size = 128

eval_every = 30
eval_batch_size = 300
sample_every = 10
checkpoint_every = 0
out_dir = "out/demo_novel"
device = "cpu"
seed = 1337
