# R1-Zero on GSM8K: RL straight from a base model, rule-based rewards only, one 80 GB GPU.
#   python data.py gsm8k --out data/gsm8k      # once: the two jsonl files, sha256-checked
#   python train.py configs/gsm8k.py
#
# Qwen2.5-1.5B base: R1-Zero starts from a base model, not a chat-tuned one, and 1.5B is the smallest Qwen2.5 that
# solves a useful share of GSM8K out of the box (68.5% 4-shot in the Qwen report, against 41.6% for 0.5B), so most
# groups of 8 hold both right and wrong answers and carry a learning signal from the first step.
#
# Memory on 80 GB: fp32 master weights + grads + AdamW state are 16 bytes/param (about 25 GB), plus bf16 copies for
# sampling and the reference (3 GB each), the KV cache of 256 rows (about 6 GB) and activation checkpointing.
# On 24 GB: model = "Qwen/Qwen2.5-0.5B" (8 GB of weights and optimizer state), micro_batch_size = 8, and
# prompts_per_step = 16 if the KV cache still does not fit.
model = "Qwen/Qwen2.5-1.5B"
template = "r1_zero"
dataset = "gsm8k"
data_dir = "data/gsm8k"
train_split = "train"  # RL questions: all 7,473
eval_split = "test"  # held out: never sampled for training
eval_size = 500

group_size = 8
prompts_per_step = 32
max_new_tokens = 512
temperature = 1.0
reward_weights = {"correctness": 1.0, "format": 0.1}
beta = 0.04
clip_eps = 0.2
mu = 1

max_steps = 300
lr = 1e-6
warmup_steps = 10
grad_clip = 1.0
micro_batch_size = 16
grad_checkpointing = True

eval_every = 25
eval_batch_size = 128
sample_every = 10
checkpoint_every = 50
out_dir = "out/gsm8k"
