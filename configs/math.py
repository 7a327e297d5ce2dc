# R1-Zero on MATH: RL straight from a base model, rule-based rewards only, one 80 GB GPU.
#   python train.py configs/math.py     # MATH-500 ships; the training set downloads on first use
#   python eval.py --model out/math/ckpt.pt --data data/math500/test.jsonl   # by subject, level
#
# The recipe of SimpleRL-Zoo and Dr. GRPO's Oat-Zero: train on MATH's levels 3-5, report MATH-500.
# The training problems are PRM800K's MATH train split (the 12,000 MATH problems not in MATH-500),
# downloaded once into data/math and sha256-checked (`python data.py math` does it ahead,
# data.MATH_TRAIN_URL); levels 3-5 are kept and any problem whose text is a MATH-500 one is dropped
# (the count is printed). Held out: all 500 of MATH-500.
#
# Qwen2.5-Math-1.5B base: Oat-Zero's small model, pretrained on math, so most groups of 8 on levels
# 3-5 hold right and wrong answers from the first step. Qwen2.5-1.5B (--model=Qwen/Qwen2.5-1.5B,
# SimpleRL-Zoo's) has the same shapes, so the memory below holds for it too. Answers are read by the
# MATH checker (math_answers.is_equiv_math: x = 11 is 11, \dfrac{\pi}{2} is \frac{\pi}{2}) from the
# answer tag, a \boxed{} or "the answer is" (rewards.MATH_FORMS): Qwen2.5-Math tends to box its
# answer, which is credited with or without the tags; the format reward asks for the tags.
#
# Memory on 80 GB (an estimate: the GPU check measures configs/gsm8k.py's shapes, not these; GB =
# 1e9 bytes; run_management.memory_bytes, which refuses a config that does not fit before any work):
# held through the run, fp32 master weights 6.2 GB and AdamW state 12.3 GB for 1.54B parameters, a
# bf16 copy for sampling 3.1 GB, no reference (beta = 0). Sampling adds the KV cache, 28 layers x 2
# KV heads x 128 dims x 2 (K, V) x 2 bytes = 28,672 bytes a token, times 256 rows x (the step's
# longest prompt + 2,048, rounded up to a multiple of 8: sample.cache_slots): 17 GB for prompts of
# ~300 tokens, 27.8 GB at the longest R1-Zero prompt of the levels 3-5 problems (1,740 tokens,
# measured on a full copy of MATH); and the prefill of those prompts, 75 rows a forward
# (sample.PREFILL_TOKENS), its attention on the memory-efficient kernel (model.attention_kv):
# 8.2 GB. The update adds the gradients (6.2 GB) and the activations of micro-batches of 8 rows of
# up to ~3,800 tokens with activation checkpointing. Sampling and the update do not overlap: 57.7 GB
# at least at the longest prompt, activations aside. A checkpoint (ckpt.pt: fp32 weights 4 and
# AdamW state 8 bytes/param) is about 18.5 GB.
model = "Qwen/Qwen2.5-Math-1.5B"
template = "r1_zero"
dataset = "math"
data_dir = "data/math"  # training: data/math/train.jsonl, downloaded and verified on first use
train_split = "train"
math_levels = (3, 4, 5)  # SimpleRL-Zoo's and Oat-Zero's "hard" MATH problems
eval_data_dir = "data/math500"  # held out: MATH-500, never sampled for training
eval_split = "test"
eval_size = 500  # all of MATH-500: one standard error is about 2 points
answer_checker = "math"  # what dataset="math" defaults to; said here so the config reads whole

group_size = 8  # 8 x 32 = 256 completions a step, as configs/gsm8k.py
prompts_per_step = 32
# MATH's worked solutions run to 165 tokens at the median and 474 at the 90th percentile (MATH-500,
# Qwen tokenizer); R1-Zero-style reasoning runs longer and grows with training. Qwen2.5-Math-1.5B
# has 4,096 positions: prompt + max_new_tokens must fit (checked when the run starts, naming the
# longest prompt). The longest R1-Zero prompt is 877 tokens in MATH-500 and 1,740 among the levels
# 3-5 training problems, so 2,048 fits and Oat-Zero's 3,000 would not (with
# --model=Qwen/Qwen2.5-1.5B, 131,072 positions, it would)
max_new_tokens = 2048
# sample from the policy itself: the ratio's log-probs are those of the sampling distribution
temperature = 1.0
# the answer is what counts; the layout is a small nudge
reward_weights = {"correctness": 1.0, "format": 0.1}
# Dr. GRPO and Oat-Zero train without a KL term (SimpleRL-Zoo uses 1e-4); saves the reference's
# memory
beta = 0.0
clip_eps = 0.2  # PPO's and DeepSeekMath's
mu = 1  # one update per batch of samples: the ratio is 1, clipping never acts
# truncated importance sampling: the sampler is a bf16 copy decoding with a KV cache, so its
# log-probs of the tokens it drew differ a little from the trainer's (logprob_gap in log.jsonl):
# each token's policy-gradient term is weighed by pi_trainer / pi_sampler capped at 2 (Yao et al.
# 2025; TRL's vllm_importance_sampling_mode="token_truncate" with this cap, not its default
# "sequence_mask" at 3), tis_capped_frac the share capped
tis_cap = 2.0
# Dr. GRPO's unbiased variant: --adv_scale=none --loss_agg=constant

# 300 x 32 = 9,600 questions, a little over one epoch of the ~8,900 levels 3-5 problems
max_steps = 300
lr = 1e-6  # SimpleRL-Zoo's and Oat-Zero's
warmup_steps = 10
grad_clip = 1.0
micro_batch_size = 8  # rows up to ~3,800 tokens, 6 times configs/gsm8k.py's 640: half its 16 rows
grad_checkpointing = True

eval_every = 25
eval_batch_size = 128  # the KV cache of 128 rows is under 11 GB
sample_every = 10
checkpoint_every = 50
out_dir = "out/math"
