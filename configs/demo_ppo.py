# PPO with a learned critic (method="ppo"), loaded after configs/demo.py or configs/demo_aha.py:
# the same warm start, RL questions, held-out set and completions per step (group_size x
# prompts_per_step = 64), as classic PPO samples them: one completion of each of 64 questions, no
# group. A critic of the policy's shape, from the warm start's weights with a value head at zero,
# learns the value of each prefix (its own AdamW at critic_lr, by default 10 x lr); GAE (gamma =
# lam = 1, verl's defaults) on it gives the advantages, whitened over the step's tokens; its clipped
# value loss trains it (cliprange_value 0.5). No KL anchor, as in the demos' GRPO. log.jsonl adds
# value_loss, explained_variance, value_clip_frac, returns_mean and values_mean.
method = "ppo"
group_size = 1
prompts_per_step = 64
out_dir = "out/demo_ppo"
