# Baseline: answers-only SFT on the RL questions, what one would do with answers and no solutions.
# Loaded after configs/demo.py or demo_novel.py. Each step is one supervised step on
# prompts_per_step * group_size RL questions (GRPO's completions per step), the target "</think>
# <answer>N</answer>": the final answer, no reasoning.
method = "sft_answers"
out_dir = "out/demo_sft_answers"
