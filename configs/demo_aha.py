# The aha demo: R1-Zero's "aha moment" in miniature, offline on a CPU (on a quiet 2-core Intel Xeon
# 3 min 49 s to 4 min 54 s as the VM's speed moved, its warm start 2:56 to 3:44 of it; 6 min 43 s at
# one thread; slower beside other jobs: docs/experiments.md, issue 64).
#   python train.py configs/demo_aha.py    # the warm start, then 40 GRPO steps; out/demo_aha
#
# configs/demo.py's model and problem families (data.synthetic_split), with one thing planted in the
# warm start (data.rework_solution): its quick arithmetic drops the carry or borrow of a line that
# has one ("17+5=12"), and a re-check by counting finds it ("17+5=12 wait, 12 is wrong:
# 17+5=18+4=19+3=20+2=21+1=22"). Half of the warm start's questions are asked with "Check each
# step." and answered with a re-check on every line; of the others, asked as the RL and held-out
# questions are, 5% re-check unprompted and the rest keep their slips (and the answer the slips lead
# to). So after the warm start the model re-checks rarely (reflect_rate about 0.04 over GRPO's first
# 10 steps), and a re-checked answer is right far more often than a quick one: GRPO on the final
# answer alone then makes re-checking the common behaviour, and held-out pass@1 and the response
# length rise with it. What it shows beside baselines and controls over three warm starts and two RL
# seeds each: docs/experiments.md (python tools/aha_table.py).
#   python eval.py --model out/demo_aha/ckpt.pt --data out/demo_aha/heldout.jsonl --n 8
# splits the accuracy of reflective and other completions at T=1 (reflect_rate, accuracy_reflect,
# accuracy_unreflect).
model = "scratch"
# max_seq_len: a cued prompt (<= 114 characters) and a re-checked answer (<= 256). 3 layers (0.15M
# parameters): a warm-start step 1.3x faster than 4 layers' and GRPO's steps too, its warm starts
# reading the question as well (cued pass@1 94.5-97.0% against 96-97%); 2 layers read it worse (82%)
# (docs/experiments.md, issue 64)
model_args = dict(dim=64, n_layers=3, n_heads=4, n_kv_heads=2, head_dim=16, ffn_dim=176,
                  max_seq_len=416, rope_theta=10000.0)
tokenizer = "char"
# the prompt "Q: {question}\nA: " and questions without their last sentence (synthetic_args "ask"
# False: "Tom has 12 apples. He buys 7 more and gives away 5."): a warm-start row 219 tokens against
# 262 with "plain" and the asked question, the targets the same, a warm-start step about 14% faster
# (docs/experiments.md, issue 64)
template = {"prompt": "Q: {question}\nA: "}
dataset = "synthetic_split"
synthetic_warm_size = 10000
synthetic_train_size = 5000
synthetic_eval_size = 200
# direct_share 0: every warm solution is worked (demo.py's answer-only rows would make a second
# behaviour for RL to select); carry_slip 1: every quick line with a carry slips; rl_mix "one": an
# RL chain only adds or only takes away, so its slips (-10 for a dropped carry, +10 for a dropped
# borrow) never cancel and a quick answer to a problem with a carry is always wrong (with "any" they
# cancelled often enough that re-checking paid too little)
synthetic_args = {"warm_ops": (1, 4), "warm_mix": "any", "rl_ops": (3, 4), "rl_mix": "one",
                  "max_operand": 5, "max_start": 20, "restate": True, "direct_share": 0.0,
                  "cue_share": 0.5, "reflect_share": 0.05, "reflect_error": 0.0, "carry_slip": 1.0,
                  "ask": False}
eval_size = 200

method = "grpo"
# the warm start's rate decays to 0, so its model settles on the data's rates: about 5% unprompted
# re-checks from every seed (a constant rate left each seed's share where its last steps put it); at
# 4e-3 every seed learns to read the question in 2500 steps (at 2e-3 seed 3 had not, and its
# re-checks were right too rarely to pay); 3000 steps make its re-checks right often enough that
# every run ends at 93%+ at step 40 (at 2500 with the rows 4 to a pass, warm start 2 left GRPO, RFT
# and REINFORCE at 88.5-91%; shorter or faster schedules, 1,800-2,200 steps at 4e-3 to 1.2e-2, left
# it reading the question right 5.5-88.5% of the time against 97%; one pass over a larger warm set,
# 2,200 steps over 17,600 rows, reads it but re-checks right less often, and one GRPO run in six
# ended at 84.5%; at 3 layers 2,400 and 2,700 steps left warm start 1337's unprompted re-checks
# right 13% and 39% of the time against 79.5%, 2,400 at 5e-3 left warm start 2's right 36% and its
# GRPO run at 76%, and 4 rows a step for 3,000 steps 15%: docs/experiments.md, issue 64)
sft_steps = 3000
sft_batch_size = 8
sft_lr = 4e-3
sft_lr_decay = True
# the warm start's rows 4 to a pass, of a length, right-padded under causal attention with no mask
# (sft.causal_passes): the same loss, summed in another order; at 2500 steps 3 min 12 s -> 2 min
# 46 s (1.3x a step at one thread) against the left-padded rows under a dense mask (0:
# docs/experiments.md, issue 64)
sft_rows_per_pass = 4

group_size = 8
prompts_per_step = 8
max_new_tokens = 256  # a re-checked 4-line answer: about 190 characters
reward_weights = {"correctness": 1.0, "format": 0.1}
beta = 0.0
# 40 steps: at 3 layers the re-check takes off by step 24 in every GRPO run of the table; the lr is
# constant after its climb, so these are a 50-step run's first 40 steps bit for bit, 15-20 s sooner
# on a 2-core Xeon; held-out pass@1 at step 40 93.0-97.0% against 94.5-96.5% at step 50
# (docs/experiments.md, issue 64)
max_steps = 40
# the learning rate climbs over 20 steps (the warm start's too), so the first 10 steps still see the
# warm start's rare re-check, then it is large enough that the re-check takes off by mid-run from
# every warm start. A 5-step climb to 8e-5 let one run re-check 0.105 over its first 10 steps while
# another took off only at step 47 (docs/experiments.md, issue 50). 1.8e-4 with 3 layers: at 1.2e-4
# one warm start's re-checks, right less often unprompted (47% at T=1), ended at 89.5%; at 1.8e-4
# the same warm start ended at 93.5% (docs/experiments.md, issue 64)
lr = 1.8e-4
warmup_steps = 20
micro_batch_size = 128
progress_keys = ("reward", "accuracy", "reflect_rate", "response_length", "loss")

eval_every = 20
eval_batch_size = 200
sample_every = 10
checkpoint_every = 20
out_dir = "out/demo_aha"
device = "cpu"
seed = 1337
