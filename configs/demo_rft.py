# Baseline: rejection-sampling fine-tuning (RFT, STaR), loaded after configs/demo.py or
# configs/demo_novel.py (every other setting kept: the same warm start, RL questions, samples per
# step and held-out set). Each step samples group_size completions of prompts_per_step questions
# exactly as GRPO does, keeps the correct ones and takes one supervised step on them (none correct:
# no update); log.jsonl's kept_fraction is their share.
method = "rft"
out_dir = "out/demo_rft"
