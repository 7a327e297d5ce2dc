# R1-Zero on GSM8K: RL straight from a base model, rule-based rewards only, one 80 GB GPU.
#   python train.py configs/gsm8k.py       # GSM8K ships in data/gsm8k; the model comes from the hub
#
# Qwen2.5-1.5B base: R1-Zero starts from a base model, not a chat-tuned one, and 1.5B is the
# smallest Qwen2.5 that solves a useful share of GSM8K out of the box (68.5% 4-shot in the Qwen
# report, against 41.6% for 0.5B), so most groups of 8 hold both right and wrong answers and carry a
# learning signal from the first step. For an instruct model use template = "chat" (its own chat
# template, the R1-Zero instruction as the system turn).
#
# Memory on 80 GB: fp32 master weights + grads + AdamW state are 16 bytes/param (about 25 GB), plus
# bf16 copies for sampling and the reference (3 GB each), the KV cache of 256 rows (about 6 GB) and
# the update's activations. Measured for three steps at these shapes with activation checkpointing
# (random weights) on one H200 (docs/experiments.md, 2026-11-26): peak 39.4 GB allocated, 44.7 GB
# reserved, 13.3 s a step (300 steps: about 67 minutes, evaluations aside). On 24 GB:
# model = "Qwen/Qwen2.5-0.5B", micro_batch_size = 8 (not measured). A checkpoint (ckpt.pt: fp32
# weights 4, AdamW state 8, bf16 reference 2 bytes/param) is about 22 GB here; train.py checks the
# free disk space before writing one (the old one stays until the new one is complete).
model = "Qwen/Qwen2.5-1.5B"
template = "r1_zero"
dataset = "gsm8k"
data_dir = "data/gsm8k"
train_split = "train"  # RL questions: all 7,473
eval_split = "test"  # held out: never sampled for training
eval_size = 500

# DeepSeekMath sampled 64 per question; 8 x 32 = 256 completions a step fits one GPU's sampler
group_size = 8
prompts_per_step = 32
max_new_tokens = 512  # GSM8K solutions take ~100-200 tokens; room for R1-Zero-style lengths to grow
# sample from the policy itself: the ratio's log-probs are those of the sampling distribution
temperature = 1.0
# the answer is what counts; the layout is a small nudge
reward_weights = {"correctness": 1.0, "format": 0.1}
# DeepSeekMath's 0.04 holds a small model near its start; 1e-3 is the small-scale recipes'
# (nano-aha-moment, open-instruct)
beta = 0.001
clip_eps = 0.2  # PPO's and DeepSeekMath's
mu = 1  # one update per batch of samples (DeepSeekMath): the ratio is 1, clipping never acts
# truncated importance sampling: the sampler is a bf16 copy decoding with a KV cache, so its
# log-probs of the tokens it drew differ a little from the trainer's (logprob_gap in log.jsonl):
# each token's policy-gradient term is weighed by pi_trainer / pi_sampler capped at 2 (Yao et al.
# 2025; TRL's vllm_importance_sampling_mode="token_truncate" with this cap, not its default
# "sequence_mask" at 3), tis_capped_frac the share capped
tis_cap = 2.0

max_steps = 300  # 300 x 32 = 9,600 questions, about 1.3 epochs of the training set
lr = 2e-6  # DeepSeekMath used 1e-6 for 7B; public GSM8K recipes for 0.5B-1.5B use 2.5e-6 to 5e-6
warmup_steps = 10
grad_clip = 1.0
micro_batch_size = 16
# grad_checkpointing left unset: chosen at set-up and said in the output
# (run_management.grad_checkpointing_of): the activations of 16 rows of up to 809 tokens through 28
# layers, at most 36.7 GB by its estimate, beside the 35.6 GB held, 72.4 GB (the H200 measured 72.6
# GB at the peak), 79.6 GB reserved at the allocator's measured 1.10, fit in the 85 GB free on an
# 80 GB H100 and in an H200's: off on both (the recompute's second forward saved; the three steps
# measured above had it on); on where under 79.6 GB is free

eval_every = 25
eval_batch_size = 128
sample_every = 10
checkpoint_every = 50
out_dir = "out/gsm8k"
