# Control: the random-reward GRPO run, loaded after configs/demo.py (every other setting kept). Each
# step samples and updates exactly as GRPO does, but the correctness reward is a coin that lands 1
# with probability random_reward, independent of the answer (rollout.coin_rewards); the format
# reward stays. What this run gains comes from the format reward, sampling or the update itself, not
# from right answers. The rate is GRPO's training accuracy over its first 10 steps from seed 1337's
# warm start (0.222); for another warm start pass its own, --random_reward=R (docs/experiments.md
# lists them).
random_reward = 0.22
out_dir = "out/demo_random"
