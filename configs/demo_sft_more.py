# Baseline: the warm start continued, more SFT on its own family (its rows as the warm start has
# them), no RL question at all. Loaded after configs/demo.py or demo_novel.py. Each step is one
# supervised step on prompts_per_step * group_size warm-start problems.
method = "sft_more"
out_dir = "out/demo_sft_more"
