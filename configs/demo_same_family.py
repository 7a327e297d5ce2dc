# The same-family demo (the repo's first demo): the R1 pipeline in miniature on a laptop CPU, no network.
#   python train.py configs/demo_same_family.py
#
# A 0.8M-parameter model of model.py's Qwen2 shape, trained from scratch on one character per token, solves
# synthetic word problems written in GSM8K's format ("Tom has 7 apples. He buys 3 more and gives away 4. ...",
# worked solution, "#### 6"). A short supervised warm start on the training problems' worked solutions teaches the
# <think>...</think> <answer>...</answer> layout and some arithmetic; GRPO then improves it on the same problems.
# Unlike configs/demo.py, RL sees the warm start's own family and the held-out questions share its chains of sums,
# so this measures sharpening, not what RL adds over more SFT (docs/experiments.md: "The same-family demo").
model = "scratch"
model_args = dict(dim=128, n_layers=4, n_heads=4, n_kv_heads=2, head_dim=32, ffn_dim=352, max_seq_len=256)
tokenizer = "char"
template = "plain"  # "Question: ...\nAnswer: <think>": the R1-Zero system prompt would triple the sequence length
dataset = "synthetic"
synthetic_train_size = 5000
synthetic_eval_size = 200
synthetic_args = {"max_operand": 9}  # 1-3 additions/subtractions of 1..9: learnable from scratch in minutes
eval_size = 200

# warm start: stopped on purpose while arithmetic is still shaky, so GRPO has something to fix
sft_steps = 300
sft_batch_size = 64
sft_lr = 1e-3

group_size = 8
prompts_per_step = 16
max_new_tokens = 64
reward_weights = {"correctness": 1.0, "format": 0.1}
beta = 0.04
max_steps = 150
lr = 5e-5  # 2e-4 undoes the warm start within 25 steps: noisy policy gradients + Adam's per-weight step size
warmup_steps = 5
micro_batch_size = 128

eval_every = 25
eval_batch_size = 200
sample_every = 25
checkpoint_every = 50
out_dir = "out/demo_same_family"
device = "cpu"  # the numbers in docs/experiments.md are CPU numbers; --device=auto would take a GPU (bf16) and other numbers
seed = 1337
