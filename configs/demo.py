# The offline demo: R1-Zero in miniature on a laptop CPU, no network, no GPU.
#   python train.py configs/demo.py      # the warm start, then 60 GRPO steps; out/demo/curves.png
#
# A 0.2M-parameter model of model.py's Qwen2 shape, one character per token, trained from scratch on
# synthetic word problems in GSM8K's format. data.synthetic_split draws three sets from the seed:
# - warm start: 1-4 additions and subtractions; a seeded coin per problem gives 60% of them the
#   answer alone ("</think> <answer>26</answer>") and the rest a worked solution, a restated line
#   per clause ("gives away 4: 30-4=26"). So the base model can already reason at length, some of
#   the time;
# - RL: 3-4 operations, question and final answer only; a direct answer to them is mostly wrong, a
#   worked one often right; no chain (start, operations, operands) of the warm start;
# - held-out: the RL family, each chain new: in neither set above.
# GRPO on the final answer's correctness (and the format) then makes the model work it out more
# often and better: held-out pass@1, response length and the share of worked answers (worked_rate)
# rise together. What it shows and what it does not, with baselines over several warm starts:
# docs/experiments.md. Baselines from one warm start (init_from; `--max_steps=0` makes the warm
# start alone, out/demo/sft.pt), RFT here (configs/demo_sft_answers.py and configs/demo_random.py
# likewise: answers-only SFT, the random-reward control):
#   python train.py configs/demo.py configs/demo_rft.py --init_from=out/demo/sft.pt \
#       --data_seed=1337 --out_dir=out/demo_rft
model = "scratch"
# rope_theta 1e4 rather than Qwen's 1e6: positions within a 250-character context (not ablated)
model_args = dict(dim=64, n_layers=4, n_heads=4, n_kv_heads=2, head_dim=16, ffn_dim=176,
                  max_seq_len=288, rope_theta=10000.0)
tokenizer = "char"
# "Question: ...\nAnswer: <think>": the R1-Zero system prompt would triple the sequence length
template = "plain"
dataset = "synthetic_split"
synthetic_warm_size = 10000
synthetic_train_size = 5000
synthetic_eval_size = 200
# starts 1..20, operands 1..5: with starts up to 50 and operands up to 9 no warm start of a few
# minutes got more than 5% of its worked answers right; the warm family holds every length the RL
# family needs (a warm start that never wrote a 4th line gives RL no 4th line to reinforce)
synthetic_args = {"warm_ops": (1, 4), "warm_mix": "any", "rl_ops": (3, 4), "rl_mix": "any",
                  "max_operand": 5, "max_start": 20, "restate": True, "direct_share": 0.6}
eval_size = 200  # one standard error is up to 3.5 points

method = "grpo"
sft_steps = 4000  # batches of 8 reached a lower loss on fewer rows than batches of 16 or 64
sft_batch_size = 8
sft_lr = 2e-3  # 4e-3 learned less

group_size = 8
prompts_per_step = 8
max_new_tokens = 128  # a 4-line worked answer takes about 100 characters
reward_weights = {"correctness": 1.0, "format": 0.1}
beta = 0.0  # no KL anchor, as none of the baselines has one
max_steps = 60  # held-out pass@1 is near its top by step 40
lr = 3e-4
warmup_steps = 5
micro_batch_size = 128

eval_every = 20
eval_batch_size = 200
sample_every = 10
checkpoint_every = 20  # a SIGKILL or a lost machine costs at most the steps since the last
out_dir = "out/demo"
# the numbers in docs/experiments.md are CPU numbers; --device=auto would take a GPU (bf16) and
# others
device = "cpu"
# torch's own thread count: with 1 or 2 threads this run is the same to the last bit
# (docs/experiments.md)
seed = 1337
