"""bench.py keeps working: its --tiny run measures every part of its own table on the CPU."""
import json
import tarfile

import pytest
import torch

import bench
from conftest import qwen_tokenizer_dir
from model import resolve_device


@pytest.fixture(scope="module")
def gpu_check(tmp_path_factory):
    """bench.py --gpu_check --tiny once: the one command of a GPU session, each part on the CPU with tiny shapes
    (its benchmark part `bench.py --tiny --skip trl,profile --fast_paths_on_cpu`, a fallback rehearsed); returns
    (DIR, the exit codes, the archive unpacked)."""
    out = tmp_path_factory.mktemp("gpu_check")
    codes = bench.main(["--gpu_check", str(out), "--tiny"])
    unpacked = tmp_path_factory.mktemp("unpacked")
    with tarfile.open(out / "gpu_check.tar.gz") as tar:
        tar.extractall(unpacked, filter="data")
    return out, codes, unpacked


def test_tiny_bench_fills_the_table(gpu_check):
    with open(gpu_check[2] / "bench_tiny.json") as f:
        result = json.load(f)
    sampler, step = result["sampler"], result["step"]
    assert sampler["ours_tokens_per_s"] > 0 and sampler["hf_tokens_per_s"] > 0
    assert sampler["speedup_vs_hf"] == sampler["ours_tokens_per_s"] / sampler["hf_tokens_per_s"]
    assert "roofline_fraction" not in sampler  # no bandwidth or peak is known for a CPU: no made-up fraction
    # issue 63: the median of the timed calls, after a warm-up with the same call; no compile while timed; the graphs'
    # capture seconds (none here: the rehearsal's CUDA graphs fell back in the warm-up)
    assert sampler["timed_calls"] == bench.TIMED_CALLS == len(sampler["ours_seconds_each"]) == 3
    assert sampler["ours_seconds"] == sorted(sampler["ours_seconds_each"])[1]
    assert sampler["triton_compiles_warmup"] == sampler["triton_compiles_timed"] == 0  # Triton's kernels: CUDA only
    assert sampler["compiled_while_timed"] == [] and sampler["graph_capture_seconds"] == sampler["graph_captures"] == 0
    parts = step["time_sample"] + step["time_reward"] + step["time_reference"] + step["time_update"]
    assert 0 < parts <= step["time_step"] and step["peak_memory_gib"] > 0
    assert 0 < step["response_length"] <= bench.WORKLOADS["tiny"]["step_new"]
    with open(gpu_check[2] / "profile_tiny.json") as f:
        profile = json.load(f)["profile"]  # the sampler's ops, and one step's: its update's AdamW step among them
    assert "aten::mm" in profile["decode_table"] and "Optimizer.step#AdamW.step" in profile["step_ops"]
    assert {"aten::scaled_dot_product_attention", "aten::mm"} <= set(profile["step_ops"])  # every op, not the top 30
    assert profile["device_events_per_decode_step"] is None  # kernels are counted on CUDA only
    text = bench.report(result)
    assert "| train.grpo_step |" in text and "| sample.generate |" in text
    assert "median of 3 calls after a warm-up with the same call" in text and " | 0.00 (0) | 0, 0 |" in text


def test_the_gpu_check_returns_what_a_gpu_machine_can_send_back_and_shows_a_fallback(gpu_check):
    """Issue 46: a GPU machine returns at most 8 files, at most 2 folders down, without saying which it dropped; DIR
    holds summary.md and one archive. The rehearsal's forced fallback (CUDA graphs tried on the CPU) is a warning in
    the benchmark's JSON and in the summary, with what failed."""
    out, _, unpacked = gpu_check
    files = [path.relative_to(out) for path in out.rglob("*") if path.is_file()]
    assert sorted(map(str, files)) == ["gpu_check.tar.gz", "summary.md"]
    with open(unpacked / "bench_tiny.json") as f:
        result = json.load(f)
    assert result["sampler"]["fast_paths"] == {"cuda_graphs": False, "fused_sampling": False, "fused_decode": False}
    assert result["step"]["fast_paths"] == {"cuda_graphs": False, "fused_sampling": False, "fused_decode": False}
    failed = "WARNING: sampler ran without cuda_graphs (sample.py: CUDA graphs failed to set up"
    assert any(w.startswith(failed) for w in result["warnings"])
    assert f"bench_tiny: {failed}" in (out / "summary.md").read_text()


def test_a_failed_profile_is_reported_and_costs_no_other_part(monkeypatch, tmp_path):
    monkeypatch.setattr(bench, "bench_profile", lambda *args, **kwargs: 1 / 0)
    result = bench.main(["--tiny", "--skip", "sampler", "--out", str(tmp_path / "r.json")])
    assert result["profile"] == {"error": "ZeroDivisionError: division by zero"} and "trl" in result
    assert "profile: failed, ZeroDivisionError" in bench.report(result)


def test_the_profiled_step_captures_no_cuda_graph(monkeypatch):
    """Issue 46: a capture under the profiler's CUPTI tracing can misreport or fail; the profile's steps decode
    eagerly, as its sampler table does, and with fewer new tokens (the events of a whole step took minutes)."""
    seen = []
    real = bench.grpo_step
    monkeypatch.setattr(bench, "grpo_step", lambda run, cfg, step: seen.append(cfg) or real(run, cfg, step))
    ours = bench.our_model(bench.SHAPES["tiny"], torch.device("cpu"), torch.float32)
    profile = bench.bench_profile(ours, bench.WORKLOADS["tiny"], torch.device("cpu"), torch.float32, beta=0.04,
                                  micro_batch_size=16, step_new_tokens=8)
    assert len(seen) == 2 and not any(cfg.cuda_graphs for cfg in seen) and profile["step_new_tokens"] == 8
    assert all(cfg.max_new_tokens == 8 for cfg in seen)


def test_missing_trl_is_reported_not_hidden():
    result = {"shape": "tiny", "dtype": "float32", "device": "cpu", "torch": "x", "beta": 0.04,
              "workload": bench.WORKLOADS["tiny"], "trl": None,
              "step": {"time_step": 1.0, "time_sample": 0.5, "time_reward": 0.1, "time_reference": 0.2,
                       "time_update": 0.2, "peak_memory_gib": 1.0, "steps_timed": 2, "response_length": 16.0}}
    assert "TRL: skipped, trl is not importable" in bench.report(result)


def test_the_trl_part_prints_its_row_beside_our_step(monkeypatch, capsys):
    """When TRL's step is done, bench prints it with our step's row and the ratios (each part prints as it ends)."""
    step = {"time_step": 1.0, "time_sample": 0.5, "time_reward": 0.1, "time_reference": 0.2, "time_update": 0.2,
            "peak_memory_gib": 1.0, "steps_timed": 2, "response_length": 16.0, "fast_paths": {}}
    monkeypatch.setattr(bench, "bench_step", lambda *args, **kwargs: step)
    monkeypatch.setattr(bench, "bench_trl", lambda *args: {"time_step": 3.0, "peak_memory_gib": 2.0,
                                                           "response_length": 15.0})
    bench.main(["--tiny", "--skip", "sampler,profile"])
    last = capsys.readouterr().out.split("tiny shapes")[-1]  # the table printed when the TRL part ended
    assert "| train.grpo_step |" in last and "| TRL GRPOTrainer |" in last and "TRL step time / ours 3.00x" in last


def test_the_roofline_counts_bytes_or_arithmetic_whichever_is_longer_prefill_included():
    """Issue 56: per phase the longer of bytes / bandwidth and operations / peak: a bandwidth-bound device gives the
    old bound (weights and the growing cache per decode step) plus the prefill's read; a compute-bound one counts 2 per
    weight per token and the attention's 4 x heads x head_dim x layers per query-key pair."""
    from model import ModelConfig, Transformer
    model = Transformer(ModelConfig(**bench.SHAPES["tiny"], max_seq_len=64))
    weights = model.num_params()  # tied: the embedding is the lm_head
    kv_per_token = 2 * 2 * 2 * 16 * 4  # k and v, 2 layers, 2 kv heads, head_dim 16, fp32
    # 3 new tokens for 4 rows of 10: the prefill writes 10 tokens' cache, 2 decode steps read 11 and 12
    slow_memory = (weights * 4 + 4 * 10 * kv_per_token + 2 * weights * 4 + 4 * (11 + 12) * kv_per_token) / 1e3
    assert bench.roofline_seconds(model, 4, 10, 3, 1e3, 1e30) == pytest.approx(slow_memory)
    pair = 4 * 2 * 4 * 16  # 4 x layers x heads x head_dim
    slow_arithmetic = (2 * weights * 40 + pair * 4 * 55 + 2 * (2 * weights * 4) + pair * 4 * (11 + 12)) / 1e6
    assert bench.roofline_seconds(model, 4, 10, 3, 1e30, 1e6) == pytest.approx(slow_arithmetic)


@pytest.mark.parametrize("rows", [dict(), dict(prompts=8, group=16)], ids=["tiny", "two-micro-batches"])
def test_trl_step_generates_the_same_batch_once(rows):
    """One TRL step consumes prompts x G fresh completions, as one grpo_step, also when it accumulates micro-batches
    (128 rows: 2 x 64, the full workload's way)."""
    for package in ("trl", "datasets", "pandas"):  # the test requirements install trl alone, without its dependencies
        pytest.importorskip(package, reason=f"needs {package} (pip install trl datasets): TRL's side of bench.py")
    work = {**bench.WORKLOADS["tiny"], **rows}
    trl = bench.bench_trl(bench.SHAPES["tiny"], work, *resolve_device("cpu"), beta=0.04, micro=bench.micro_batch(work))
    assert trl["completions_per_step"] == [work["prompts"] * work["group"]] * work["steps"]
    assert 0 < trl["response_length"] <= work["step_new"] and trl["time_step"] > 0 and trl["peak_memory_gib"] > 0


def test_the_gpu_check_rehearses_every_part_on_the_cpu(gpu_check):
    qwen_tokenizer_dir()  # its gsm8k_shapes part tokenizes with Qwen's tokenizer: skipped, naming the package, without
    out, codes, unpacked = gpu_check
    assert codes == {"bench_tiny": 0, "pytest_gpu": 0, "gsm8k_shapes": 0, "math_shapes": 0, "profile_tiny": 0,
                     "demo_cuda": 0}, codes
    summary = (out / "summary.md").read_text()
    assert "| train.grpo_step |" in summary and "configs/gsm8k.py shapes from scratch, 3 steps" in summary
    assert "configs/demo.py on this device: step 0" in summary and "## profile_tiny" in summary
    assert "tests/test_gpu.py" in (unpacked / "pytest_gpu.log").read_text()  # the GPU tests were collected
    assert json.loads((unpacked / "versions.json").read_text())["torch"] == torch.__version__
    assert (unpacked / "gsm8k_shapes" / "log.jsonl").is_file()
    assert "configs/math.py shapes from scratch, prompts of 99 tokens, 3 steps" in summary  # issue 58's new part
    assert json.loads((unpacked / "math_shapes.json").read_text())["estimate_gb"] > 0


def test_the_archive_leaves_out_what_a_gpu_machine_would_not_send_back(tmp_path, monkeypatch):
    """A file over LARGEST_ARCHIVED (a model file, say) stays out of the archive, and the summary names it."""
    (tmp_path / "work" / "run").mkdir(parents=True)
    (tmp_path / "work" / "run" / "log.jsonl").write_text("{}\n")
    (tmp_path / "work" / "run" / "model.safetensors").write_bytes(b"0" * 2000)
    monkeypatch.setattr(bench, "LARGEST_ARCHIVED", 1000)
    left_out = bench.archive(str(tmp_path / "work"), str(tmp_path / "out.tar.gz"))
    with tarfile.open(tmp_path / "out.tar.gz") as tar:
        assert tar.getnames() == ["run/log.jsonl"]
    assert left_out == ["run/model.safetensors"] and not (tmp_path / "out.tar.gz.tmp").exists()


def test_the_gpu_check_lists_the_parts_its_budget_leaves_instead_of_starting_them(tmp_path):
    """A device call is stopped at 600 s; a part that cannot fit is named for the next call, not cut off."""
    codes = bench.main(["--gpu_check", str(tmp_path), "--tiny", "--parts", "pytest_gpu,demo_cuda", "--budget_s", "61"])
    assert codes["pytest_gpu"] == 0 and codes["demo_cuda"].startswith("not run"), codes
    assert "next call: --parts demo_cuda" in (tmp_path / "summary.md").read_text()
    assert not (tmp_path / "demo_cuda").exists()


def test_bench_refuses_an_unknown_part_to_skip(capsys):
    with pytest.raises(SystemExit):
        bench.main(["--tiny", "--skip", "sampler,tlr"])
    assert "--skip: unknown ['tlr']" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [(["--parts", "bench_0.5b"], "--parts: unknown ['bench_0.5b']"),
                                           (["--tokenizer", "nowhere"], "no tokenizer.json there"),
                                           (["--budget_s", "0"], "--budget_s must be positive")])
def test_the_gpu_check_refuses_bad_arguments_before_any_work(tmp_path, capsys, argv, message):
    with pytest.raises(SystemExit):
        bench.main(["--gpu_check", str(tmp_path / "out"), "--tiny"] + argv)
    assert message in capsys.readouterr().err and not (tmp_path / "out").exists()


def test_the_roofline_knows_each_h100_card():
    """Issue 42: every "H100" was the SXM part's 3.35 TB/s; the PCIe card has 2.0 and the NVL 3.9 (and 756, 835 and
    989 TFLOP/s of dense bf16)."""
    assert bench.flops_of("NVIDIA H100 PCIe") == 756e12 and bench.flops_of("NVIDIA H100 NVL") == 835e12
    assert bench.flops_of("NVIDIA H100 80GB HBM3") == 989e12 and bench.flops_of("NVIDIA H200") == 989e12
    assert bench.bandwidth_of("NVIDIA H100 PCIe") == 2.0e12 and bench.bandwidth_of("NVIDIA H100 NVL") == 3.9e12
    assert bench.bandwidth_of("NVIDIA H100 80GB HBM3") == 3.35e12 and bench.bandwidth_of("NVIDIA H200") == 4.8e12
    assert bench.bandwidth_of("NVIDIA A100-SXM4-80GB") == 0.0 and bench.bandwidth_of("cpu") == 0.0


def test_the_step_benchmark_keeps_headroom_at_each_shape_and_both_sides_share_it():
    """Issue 42: the 0.5B step took 64 rows a micro-batch without checkpointing (~65 of 79 GiB, an estimate): 32 now,
    for our step and TRL's alike; 1.5B keeps configs/gsm8k.py's 16 rows with activation checkpointing."""
    assert bench.step_sizes("0.5b") == {"micro_batch_size": 32, "grad_checkpointing": False}
    assert bench.step_sizes("1.5b") == {"micro_batch_size": 16, "grad_checkpointing": True}
    assert bench.step_sizes("tiny") == {"micro_batch_size": bench.micro_batch(bench.WORKLOADS["tiny"]),
                                        "grad_checkpointing": False}


def test_the_lean_part_is_the_step_with_checkpointing_and_reports_its_memory_against_trls(monkeypatch, capsys):
    """Issue 56: the leanest setting (grad_checkpointing=True) is measured beside the fastest, on the same workload,
    and its peak is printed as a share of TRL's (the target: at most half)."""
    seen = []
    step = {"time_step": 1.0, "time_sample": 0.5, "time_reward": 0.1, "time_reference": 0.2, "time_update": 0.2,
            "peak_memory_gib": 1.0, "steps_timed": 2, "response_length": 16.0, "fast_paths": {}}
    monkeypatch.setattr(bench, "bench_step", lambda *args, **kwargs: seen.append(kwargs) or step)
    monkeypatch.setattr(bench, "bench_trl", lambda *args: None)
    result = bench.main(["--tiny", "--skip", "sampler,ppo,profile"])
    assert [kwargs.get("grad_checkpointing") for kwargs in seen] == [False, True] and result["lean"] == step
    shown = bench.report({**result, "device": "cuda", "trl": {"time_step": 4.0, "peak_memory_gib": 2.5,
                                                              "response_length": 15.0},
                          "lean": {**step, "time_step": 1.25, "peak_memory_gib": 1.0}})
    assert "| train.grpo_step, lean | 1.250 |" in shown and "TRL step time / ours 3.20x, our peak memory / TRL's 0.40x" in shown


def test_the_compile_count_counts_what_triton_compiles_not_what_its_cache_answers(tmp_path):
    """Issue 63: bench's count of Triton compiles, by Triton's compilation listener: a kernel compiled (for an H100,
    on the CPU: triton.compile needs no GPU) counts once; the same again, answered by Triton's cache, does not."""
    pytest.importorskip("triton", reason="needs triton (pip install triton, in requirements-test.txt)")
    import triton
    from triton import knobs
    from triton.backends.compiler import GPUTarget

    import kernels
    from test_kernels import specialisation
    args = (torch.zeros(2, 64), torch.zeros(2, 64), torch.zeros(64), torch.zeros(2, 64), torch.zeros(2, 64),
            torch.zeros(2), 64, 1e-6)
    _, source, options = specialisation(kernels._add_rms_norm_kernel, args, dict(HAS_Y=True, SAVE=False, BLOCK=64),
                                        90)
    with knobs.cache.scope():
        knobs.cache.dir = str(tmp_path)
        with bench.TritonCompiles() as compiles:
            for _ in range(2):
                triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options.__dict__)
    assert compiles.count == 1 and compiles.kernels == ["_add_rms_norm_kernel"]
    assert knobs.compilation.listener is None  # put back as it was
