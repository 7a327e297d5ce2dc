"""Issue 35's first-run failures: each says what is wrong and what to do, in a few lines without a traceback, before
any long wait: a model not in the cache without network, a GPU-sized config without a GPU, too little GPU memory,
a missing or malformed data file, a disk too small; and a crash names the saved step and the command that goes on."""
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time

import pytest
import torch

import run_management as preflight
import run as run_module
import train
from conftest import ROOT
from run_management import refused
from test_guards import tiny

# Qwen2.5-1.5B's shape (its config.json's keys), for checks that read a model's shape before its weights
QWEN_1_5B = {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "vocab_size": 151936, "hidden_size": 1536,
             "intermediate_size": 8960, "num_hidden_layers": 28, "num_attention_heads": 12, "num_key_value_heads": 2,
             "max_position_embeddings": 32768, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6,
             "tie_word_embeddings": True, "hidden_act": "silu"}


def command(*args, env=None, timeout=120):
    """Run a repo command line; (exit status, stderr, seconds)."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})
    return done.returncode, done.stderr, time.perf_counter() - start


def shaped_like(tmp_path, hf_config: dict) -> str:
    """A model directory holding only config.json: its shape is known, its weights are not there."""
    directory = tmp_path / "model"
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(hf_config))
    return str(directory)


def test_the_gsm8k_config_offline_names_what_to_download_in_seconds(tmp_path):
    """The issue's case: `python train.py configs/gsm8k.py` with no network waited ~50 s and ended in a 15-line
    traceback. Qwen2.5-1.5B is not in this machine's cache; HF_HUB_OFFLINE=1 stands for the missing network."""
    status, stderr, seconds = command("train.py", "configs/gsm8k.py", f"--out_dir={tmp_path / 'run'}",
                                      env={"HF_HUB_OFFLINE": "1"})
    assert status == 1 and "Traceback" not in stderr and seconds < 30, stderr
    assert stderr.startswith("train.py: model 'Qwen/Qwen2.5-1.5B' is not in the Hugging Face cache")
    assert "huggingface-cli download Qwen/Qwen2.5-1.5B" in stderr and "--model=LOCAL_DIR" in stderr
    assert "HF_HUB_OFFLINE" in stderr and len(stderr.strip().splitlines()) <= 4
    assert not os.path.exists(tmp_path / "run" / "config.json")  # refused before any work


def test_eval_offline_says_the_same(tmp_path):
    status, stderr, _ = command("eval.py", "--model", "Qwen/Qwen2.5-1.5B", "--data", "data/gsm8k/test.jsonl",
                                "--out", str(tmp_path / "eval"), env={"HF_HUB_OFFLINE": "1"})
    assert status == 1 and "Traceback" not in stderr
    assert stderr.startswith("eval.py: model 'Qwen/Qwen2.5-1.5B' is not in the Hugging Face cache"), stderr


def test_a_hub_name_without_cache_or_network_is_refused_without_waiting(tmp_path, monkeypatch):
    monkeypatch.setattr(preflight, "cached", lambda name, file: False)
    monkeypatch.setattr(preflight, "hub_reachable", lambda: False)
    start = time.perf_counter()
    with pytest.raises(OSError, match=r"model 'someone/some-model' is not in the Hugging Face cache .* the hub cannot "
                                      r"be reached \(no network\)") as error:
        train.train(tiny(tmp_path, model="someone/some-model", model_args={}))
    assert refused(error.value) and time.perf_counter() - start < 5
    monkeypatch.setattr(preflight, "hub_reachable", lambda: True)  # with network the download would go ahead
    preflight.check_reachable([("model", "someone/some-model", "config.json")])


def test_a_gpu_sized_config_without_a_gpu_says_what_it_needs(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match=r"\(1.54B parameters\) is sized for a GPU: a step needs \d+.\d\d GB at least "
                                           r"\(held: fp32 weights 6.17 GB, AdamW state 12.35 GB, .*gradients 6.17 GB.*"
                                           r"--device=cpu .*python train.py configs/demo.py") as error:
        train.train(tiny(tmp_path / "run", model=shaped_like(tmp_path, QWEN_1_5B), model_args={}, device="auto"))
    assert refused(error.value) and not os.path.exists(tmp_path / "run" / "config.json")


def test_too_little_gpu_memory_is_refused_with_the_knobs_to_lower(tmp_path, monkeypatch):
    config = preflight.ModelConfig.from_hf(QWEN_1_5B)
    cfg = tiny(tmp_path, model=shaped_like(tmp_path, QWEN_1_5B), model_args={}, dtype="bfloat16", beta=0.04,
               prompts_per_step=32, group_size=8, max_new_tokens=512)
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(preflight.shutil, "disk_usage", lambda path: usage._replace(free=10**15))
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (20 * 10**9, 80 * 10**9))
    with pytest.raises(RuntimeError, match=r"cuda has 20.00 GB free of 80.00 GB, and this config needs "
                                           r"\d+.\d\d GB at least .*KV cache .*prefill .*lora_rank=16"):
        preflight.check_machine(cfg, torch.device("cuda"), config, prompt_len=128)
    parts = preflight.memory_bytes(config, cfg, prompt_len=128)
    assert parts["fp32 weights"] == 4 * 1_543_714_304 and parts["reference copy"] == parts["sampler copy"] > 0
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (79 * 10**9, 80 * 10**9))
    preflight.check_machine(cfg, torch.device("cuda"), config, prompt_len=128)  # fits: no refusal


@pytest.mark.parametrize("flags, message", [
    (["--dataset=jsonl", "--data_dir=nowhere", "--synthetic_args={}"],
     "train.py: nowhere/train.jsonl not found (dataset='jsonl' reads data_dir/"),
    (["--dataset=jsonl", "--data_dir=BAD", "--synthetic_args={}"], "BAD/train.jsonl:2: not valid JSON"),
    (["--lr=-1"], "train.py: config: lr and sft_lr must be > 0"),
    (["--grop_size=4"], "train.py: unknown config key 'grop_size' (command line); did you mean 'group_size'?"),
])
def test_bad_inputs_are_refused_in_a_few_lines_without_a_traceback(tmp_path, flags, message):
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "train.jsonl").write_text('{"question": "q", "answer": "#### 1"}\n{"question": \n')
    flags = [flag.replace("BAD", str(tmp_path / "bad")) for flag in flags]
    status, stderr, _ = command("train.py", "configs/demo.py", f"--out_dir={tmp_path / 'run'}", *flags)
    assert status == 1 and "Traceback" not in stderr and message.replace("BAD", str(tmp_path / "bad")) in stderr
    assert len(stderr.strip().splitlines()) <= 3, stderr


def test_a_crash_says_the_saved_step_and_the_command_that_goes_on(tmp_path, capsys):
    (tmp_path / "flaky.py").write_text("calls = []\n"
                                       "def flaky(completion, gold):\n"
                                       "    calls.append(1)\n"
                                       "    if len(calls) > 4:\n"
                                       "        raise ValueError('the grader is down')\n"
                                       "    return 0.0\n")
    cfg = tiny(tmp_path / "run", max_steps=3, reward_weights={f"{tmp_path}/flaky.py:flaky": 1.0})
    with pytest.raises(RuntimeError, match="the grader is down"):
        train.train(cfg)
    out = capsys.readouterr().out
    assert "step 2 failed (RuntimeError: reward " in out and "those of step 1. Continue with: " in out
    assert out.rstrip().endswith("--resume")


def test_the_estimate_counts_the_prefill_and_configs_math_fits_what_its_comment_states(monkeypatch):
    """Issue 42: the estimate holds the prefill of the longest prompt (the rows of one prefill forward: an attention
    layer with K and V repeated to every head, or an MLP layer, the stream, the last logits), beside the KV cache,
    and the two phases (sampling, the update) peak apart. configs/math.py at MATH's longest levels 3-5 prompt (1,740
    tokens) needs the 57.7 GB its comment states; one prefill of all 256 rows at once would add 18.9 GB more."""
    import dataclasses
    import sample
    from config import load_config
    config = preflight.ModelConfig.from_hf(QWEN_1_5B)  # Qwen2.5-Math-1.5B's shape too
    cfg = dataclasses.replace(load_config([os.path.join(ROOT, "configs", "math.py")]), dtype="bfloat16")
    parts = preflight.memory_bytes(config, cfg, prompt_len=1740)
    need = preflight.memory_need(parts)
    assert round(need / 1e9, 1) == 57.7 and "57.7 GB" in open(os.path.join(ROOT, "configs", "math.py")).read()
    held = parts["fp32 weights"] + parts["AdamW state"] + parts["sampler copy"]
    assert need == held + parts["KV cache"] + parts["prefill"] > held + parts["gradients"] + parts["logits chunk"]
    rows = 75  # 2**17 // 1740: the rows of one prefill forward
    mlp = 3 * rows * 1740 * 8960 * 2
    assert parts["prefill"] == mlp + 2 * rows * 1740 * 1536 * 2 + 256 * 151936 * 10
    monkeypatch.setattr(sample, "PREFILL_TOKENS", 256 * 1740)  # the whole batch in one forward
    assert round((preflight.memory_need(preflight.memory_bytes(config, cfg, prompt_len=1740)) - need) / 1e9, 1) == 18.9


def test_a_prefill_that_does_not_fit_is_refused_before_any_work_naming_the_knobs(monkeypatch):
    """A GPU with room for the weights, AdamW and the KV cache but not for the prefill of long prompts."""
    config = preflight.ModelConfig.from_hf(QWEN_1_5B)
    cfg = tiny("unused", dtype="bfloat16", beta=0.0, prompts_per_step=32, group_size=8, max_new_tokens=256,
               eval_batch_size=64)
    parts = preflight.memory_bytes(config, cfg, prompt_len=1500)
    without_prefill = preflight.memory_need({**parts, "prefill": 0})
    assert parts["prefill"] > 1e9 and preflight.memory_need(parts) > without_prefill
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (without_prefill + 10**8, 80 * 10**9))
    monkeypatch.setattr(preflight.shutil, "disk_usage", lambda path: shutil.disk_usage("/")._replace(free=10**15))
    with pytest.raises(RuntimeError, match=r"prefill .* shorter prompts \(the prefill\)"):
        preflight.check_machine(cfg, torch.device("cuda"), config, prompt_len=1500)


def test_tools_memory_prints_the_estimate_without_a_gpu_or_the_weights(tmp_path):
    """tools/memory.py: the preflight's estimate of a config, from a config.json and a longest prompt, offline; GRPO's,
    and PPO's beside it (issue 57): its critic, a policy-sized fp32 model with a head, holds 4 B of weights and 8 B of
    AdamW state per parameter, and its 4 B of gradients come in a phase of their own."""
    import memory
    (tmp_path / "config.json").write_text(json.dumps(QWEN_1_5B))
    lines = memory.main([os.path.join(ROOT, "configs", "math.py"), f"--hf_config={tmp_path / 'config.json'}",
                         "--prompt_len=1740"]).splitlines()
    assert lines[0].startswith("Qwen/Qwen2.5-Math-1.5B (its shape: ") and lines[0].endswith("1740 tokens:")
    assert lines[1].startswith("  grpo: 57.65 GB at least (held: ") and "critic" not in lines[1]
    assert lines[2].startswith("  ppo: ") and "critic weights 6.17 GB, critic AdamW state 12.35 GB" in lines[2]
    grpo, ppo = (float(line.split(": ")[1].split(" GB")[0]) for line in lines[1:])
    assert ppo == pytest.approx(grpo + 6.17 + 12.35, abs=0.02)  # the critic's gradients fit under the update's peak


def test_activation_checkpointing_left_unset_is_chosen_from_the_memory_and_said(monkeypatch):
    """Issue 56: grad_checkpointing None is chosen at set-up: on a GPU on only where what the run holds and the
    update's activations without it (an upper bound: every completion at max_new_tokens), times the allocator's
    reserve per allocated byte measured on an H200 (issue 63: 79.8 GB reserved at 72.6 GB allocated, 1.10), pass
    the free memory, said in a sentence; on the CPU off, silently, as before; an explicit setting is kept.
    configs/gsm8k.py leaves it unset: 35.6 GB held + 36.7 GB of activations = 72.4 GB (the H200 measured 72.6 GB),
    79.6 GB reserved: off on an 80 GB H100 (85.5e9 bytes) and on an H200, on for a 48 GB card."""
    from config import load_config
    config = preflight.ModelConfig.from_hf(QWEN_1_5B)
    cfg = dataclasses.replace(load_config([os.path.join(ROOT, "configs", "gsm8k.py")]), dtype="bfloat16")
    assert cfg.grad_checkpointing is None
    # by hand: per token and layer 4 dim + 5 q + 4 kv + 4 ffn elements, 2 bytes each; 16 rows of 297 + 512 tokens
    per_layer = 4 * 1536 + 5 * 12 * 128 + 4 * 2 * 128 + 4 * 8960
    assert preflight.activation_bytes(config, cfg, 809, False) == 2 * 16 * 809 * 28 * per_layer
    assert preflight.activation_bytes(config, cfg, 809, True) == 2 * 16 * 809 * (28 * 1536 + per_layer)
    held = preflight.memory_need(preflight.memory_bytes(config, cfg, 297))
    activations = preflight.activation_bytes(config, cfg, 809, False)
    comment = open(os.path.join(ROOT, "configs", "gsm8k.py")).read()
    assert f"{activations / 1e9:.1f} GB" in comment and f"{held / 1e9:.1f} GB held" in comment
    cuda = torch.device("cuda")
    # the free bytes of a 48 GB card, an H100 80GB HBM3 (85,520,809,984 in all) and an H200, each less a CUDA context
    for free, on in ((47 * 10**9, True), (85 * 10**9, False), (150 * 10**9, False)):
        monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device, free=free: (free, free + 10**9))
        chosen, said = preflight.grad_checkpointing_of(cfg, cuda, config, 297)
        assert chosen == on and said.startswith(f"grad_checkpointing {'on' if on else 'off'} (unset, so chosen)")
        assert ((held + activations) * 1.10 > free) == on and f"{(held + activations) * 1.10 / 1e9:.2f} GB" in said
    assert preflight.RESERVED_PER_ALLOCATED == pytest.approx(79.8 / 72.6, abs=0.005)
    assert round((held + activations) / 1e9, 1) == 72.4 and round(1.10 * (held + activations) / 1e9, 1) == 79.6
    for setting in (True, False):
        assert preflight.grad_checkpointing_of(dataclasses.replace(cfg, grad_checkpointing=setting), cuda, config,
                                               297) == (setting, "")
    assert preflight.grad_checkpointing_of(cfg, torch.device("cpu"), config, 297) == (False, "")


def test_expandable_segments_are_set_on_a_gpu_unless_the_user_set_the_allocator():
    """Issue 63: command_line sets PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True before main() on a machine with a
    GPU where neither allocator variable is set, and says so; a user's setting (either name) is kept, and a machine
    without a GPU gets nothing."""
    environ = {}
    said = preflight.allocator_settings(environ, cuda=True)
    assert environ == {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"} and said.startswith(
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")
    for name in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
        environ = {name: "max_split_size_mb:512"}
        assert preflight.allocator_settings(environ, cuda=True) == "" and environ == {name: "max_split_size_mb:512"}
    environ = {}
    assert preflight.allocator_settings(environ, cuda=False) == "" and environ == {}


def test_a_cpu_run_leaves_checkpointing_off_unless_asked(tmp_path, monkeypatch):
    seen = []
    real = preflight.grad_checkpointing_of
    monkeypatch.setattr(run_module, "grad_checkpointing_of", lambda *args: seen.append(real(*args)) or seen[-1])
    train.train(tiny(tmp_path / "unset", max_steps=1))
    train.train(tiny(tmp_path / "asked", max_steps=1, grad_checkpointing=True))
    assert seen == [(False, ""), (True, "")]


def test_keeping_the_samplers_graphs_left_unset_is_chosen_where_the_cache_held_still_fits(monkeypatch):
    """Issue 63: the sampler keeps its CUDA graphs, and the KV cache they read, between rollouts (sample._kept) only
    where the memory allows: keep_graphs None is chosen at set-up, on a GPU with cuda_graphs, on where what the run
    holds with the KV cache held through the update, plus the update's activations under the checkpointing already
    chosen, times the allocator's reserve, fits the free memory; said in a sentence; off on the CPU, without
    cuda_graphs, or as set. configs/gsm8k.py (checkpointing off): 39.4 GB held with its 6.0 GB cache kept (35.6 GB
    without) + 36.7 GB of activations, 83.7 GB reserved: on for an 80 GB H100 (85.5e9 bytes) and an H200, off where
    80 GB is free."""
    from config import load_config
    config = preflight.ModelConfig.from_hf(QWEN_1_5B)
    cfg = dataclasses.replace(load_config([os.path.join(ROOT, "configs", "gsm8k.py")]), dtype="bfloat16")
    assert cfg.keep_graphs is None and cfg.cuda_graphs
    kept = preflight.memory_bytes(config, dataclasses.replace(cfg, keep_graphs=True), 297)
    phased = preflight.memory_bytes(config, cfg, 297)
    assert kept[preflight.KEPT_CACHE] == phased["KV cache"] and "KV cache" not in kept
    held = preflight.memory_need(kept)
    outside = sum(value for name, value in kept.items() if name not in preflight.PHASED)
    assert held == outside + max(kept["prefill"], kept["gradients"] + kept["logits chunk"])
    activations = preflight.activation_bytes(config, cfg, 809, False)
    assert round(phased["KV cache"] / 1e9, 1) == 6.0 and round(held / 1e9, 1) == 39.4
    assert round(1.10 * (held + activations) / 1e9, 1) == 83.7
    cuda = torch.device("cuda")
    for free, on in ((80 * 10**9, False), (85 * 10**9, True), (150 * 10**9, True)):  # an H100 80GB HBM3, an H200
        monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device, free=free: (free, free + 10**9))
        chosen, said = preflight.keep_graphs_of(cfg, cuda, config, 297, checkpointing=False)
        assert chosen == on and said.startswith(f"keep_graphs {'on' if on else 'off'} (unset, so chosen)")
        assert f"{(held + activations) * 1.10 / 1e9:.2f} GB" in said
    for setting in (True, False):
        assert preflight.keep_graphs_of(dataclasses.replace(cfg, keep_graphs=setting), cuda, config, 297,
                                        False) == (setting, "")
    assert preflight.keep_graphs_of(cfg, torch.device("cpu"), config, 297, False) == (False, "")
    assert preflight.keep_graphs_of(dataclasses.replace(cfg, cuda_graphs=False), cuda, config, 297, False) == (
        False, "")
