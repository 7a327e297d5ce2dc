# The novel-split demo (issue 12): RL from final answers alone, on problems whose worked solutions no training data
# holds, against supervised baselines that see the same answers. No network, no GPU. It was configs/demo.py until
# issue 26; its result depends on the warm start, which depends on the CPU (docs/experiments.md).
#   python train.py configs/demo_novel.py                    # the warm start, then 200 GRPO steps
# The comparison starts every method from one warm start (init_from), so they differ only in the update:
#   python train.py configs/demo_novel.py --max_steps=0 --out_dir=out/demo_warm                       # the warm start
#   python train.py configs/demo_novel.py --init_from=out/demo_warm/sft.pt --out_dir=out/demo_grpo    # GRPO
#   python train.py configs/demo_novel.py configs/demo_rft.py --init_from=out/demo_warm/sft.pt         # and the
#   python train.py configs/demo_novel.py configs/demo_sft_answers.py --init_from=out/demo_warm/sft.pt # baselines,
#   python train.py configs/demo_novel.py configs/demo_sft_more.py --init_from=out/demo_warm/sft.pt    # overlays
#
# A 0.8M-parameter model of model.py's Qwen2 shape, one character per token, trained from scratch on synthetic word
# problems in GSM8K's format. Three sets drawn from the seed by data.synthetic_split (dataset = "synthetic_split"):
# - warm start: WITH worked solutions ("sells 4: 27-4=23"), the only solutions the model ever sees;
# - RL: question and final answer only, a family the warm start never saw;
# - held-out: the RL family, each chain (start, operations, operands) new: in neither set above, nor repeated.
model = "scratch"
model_args = dict(dim=128, n_layers=4, n_heads=4, n_kv_heads=2, head_dim=32, ffn_dim=352, max_seq_len=288)
tokenizer = "char"
template = "plain"  # "Question: ...\nAnswer: <think>": the R1-Zero system prompt would triple the sequence length
dataset = "synthetic_split"
synthetic_warm_size = 5000
synthetic_train_size = 5000
synthetic_eval_size = 300
# the warm start sees chains of one kind (only additions, or only subtractions); RL and held-out chains mix both
synthetic_args = {"warm_ops": (1, 4), "warm_mix": "one", "rl_ops": (2, 3), "rl_mix": "both", "max_operand": 9,
                  "max_start": 50, "restate": True}
eval_size = 300

method = "grpo"  # the baselines' configs change this and out_dir only
sft_steps = 500
sft_batch_size = 64
sft_lr = 1e-3

group_size = 8
prompts_per_step = 16
max_new_tokens = 128  # a 4-line restated solution and its answer take about 110 characters
reward_weights = {"correctness": 1.0, "format": 0.1}
beta = 0.0  # no KL anchor, as the baselines have none (at beta 0.04 GRPO gained less: docs/experiments.md)
max_steps = 200  # GRPO's training accuracy still rose at step 100
lr = 1e-4  # every method's: 1e-3 (the warm start's) made RFT stop writing answers
warmup_steps = 5
micro_batch_size = 128

eval_every = 20
eval_batch_size = 300
sample_every = 10
checkpoint_every = 20  # a SIGKILL or a lost machine costs at most the steps since the last
out_dir = "out/demo_novel"
device = "cpu"  # the numbers in docs/experiments.md are CPU numbers; --device=auto would take a GPU (bf16) and other numbers
threads = 1  # CPU sums depend on the thread count: with 2 threads the same seed gives another warm start (docs/experiments.md)
seed = 1337
