import math
import json
import os

import pytest
import torch

import records
import rollout
import train
from conftest import qwen_tokenizer_dir
from data import load_gsm8k, write_jsonl
from template import CharTokenizer
from grpo import loss_of
from update import (MicroBatch, add_logprobs, completion_logprobs, configure_optimizer, make_micro_batches, pack,
                    policy_gradient, set_rows)
from model import ModelConfig, Transformer
from sample import generate
from sft import sft_text
from train import TrainConfig, load_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GSM8K = os.path.join(ROOT, "data", "gsm8k")  # shipped with the repo (MIT, see its LICENSE_AND_SOURCE.txt)


@pytest.fixture(scope="module")
def tiny_qwen(tmp_path_factory):
    """A random 2-layer Qwen2 with the real Qwen2.5 vocabulary, saved as a Hugging Face directory."""
    from transformers import Qwen2Config, Qwen2ForCausalLM
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=151936, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                         tie_word_embeddings=True)
    path = str(tmp_path_factory.mktemp("tiny_qwen"))
    Qwen2ForCausalLM(config).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def tiny_qwen3(tmp_path_factory):
    """A random 2-layer Qwen3 (q/k norms, head_dim 16 with 4 heads of a 32-wide model) with the Qwen vocabulary."""
    from transformers import Qwen3Config, Qwen3ForCausalLM
    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=151936, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=1024,
                         tie_word_embeddings=True)
    path = str(tmp_path_factory.mktemp("tiny_qwen3"))
    Qwen3ForCausalLM(config).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def gsm8k_dir(tmp_path_factory):
    """A few real GSM8K rows in the train.py data layout (the whole train split would only cost tokenizing time)."""
    path = str(tmp_path_factory.mktemp("gsm8k"))
    write_jsonl(load_gsm8k(GSM8K, "train")[:12], os.path.join(path, "train.jsonl"))
    write_jsonl(load_gsm8k(GSM8K, "test")[:2], os.path.join(path, "test.jsonl"))
    return path


def tiny_run(model, data_dir, out_dir, **overrides) -> TrainConfig:
    return TrainConfig(**{**dict(
        model=model, tokenizer=qwen_tokenizer_dir(), data_dir=data_dir, out_dir=out_dir, group_size=2, prompts_per_step=2,
        max_new_tokens=6, micro_batch_size=3, mu=2, beta=0.04, lr=1e-3, warmup_steps=1, eval_every=2, eval_size=2,
        eval_batch_size=4, checkpoint_every=2, sample_every=1, device="cpu"), **overrides})


def read_log(out_dir):
    with open(os.path.join(out_dir, "log.jsonl")) as f:
        return [json.loads(line) for line in f]


def test_two_steps_resume_one_more_equals_three_steps(tiny_qwen, gsm8k_dir, tmp_path):
    out = str(tmp_path / "run")
    train.train(tiny_run(tiny_qwen, gsm8k_dir, out, max_steps=2))
    assert len(read_log(out)) == 2 and torch.load(os.path.join(out, "ckpt.pt"), weights_only=True)["step"] == 2
    train.train(tiny_run(tiny_qwen, gsm8k_dir, out, max_steps=3, resume=True))
    resumed = torch.load(os.path.join(out, "ckpt.pt"), weights_only=True)
    log = read_log(out)
    assert resumed["step"] == 3 and [r["step"] for r in log] == [1, 2, 3]
    assert {"reward", "reward_correctness", "reward_format", "accuracy", "response_length", "truncation_rate", "kl",
            "clip_frac_low", "entropy", "zero_std_frac", "grad_norm", "lr", "tokens_per_s", "time_update"} <= set(log[0])

    straight = str(tmp_path / "straight")
    train.train(tiny_run(tiny_qwen, gsm8k_dir, straight, max_steps=3))
    expected = torch.load(os.path.join(straight, "ckpt.pt"), weights_only=True)
    for name, tensor in expected["model"].items():
        assert torch.equal(tensor, resumed["model"][name]), name
    timing = ("tokens_per_s", "time_sample", "time_reward", "time_reference", "time_update")
    assert [{k: v for k, v in r.items() if k not in timing} for r in read_log(straight)] == \
           [{k: v for k, v in r.items() if k not in timing} for r in log]
    with open(os.path.join(out, "config.json")) as f:
        assert json.load(f)["max_steps"] == 3


def test_threads_pins_torchs_cpu_threads(tiny_qwen, gsm8k_dir, tmp_path):
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        train.setup(tiny_run(tiny_qwen, gsm8k_dir, str(tmp_path / "default")))  # 0: torch's own setting is left alone
        assert torch.get_num_threads() == 2
        train.setup(tiny_run(tiny_qwen, gsm8k_dir, str(tmp_path / "one"), threads=1))
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_config_file_and_overrides(tmp_path):
    path = tmp_path / "cfg.py"
    path.write_text("import math\nlr = 3e-4\n_private = 1\nmax_steps = 2 ** 3\n")
    cfg = load_config([str(path), "--beta=0", "--grad_checkpointing", "--clip_eps_high=None",
                       "--reward_weights={'correctness': 1.0}", "--adam_betas=(0.9, 0.95)"])
    assert (cfg.lr, cfg.max_steps, cfg.beta, cfg.grad_checkpointing, cfg.clip_eps_high) == (3e-4, 8, 0.0, True, None)
    assert cfg.reward_weights == {"correctness": 1.0} and cfg.adam_betas == (0.9, 0.95)
    assert load_config(["--resume=false"]).resume is False


def test_config_errors_name_the_key(tmp_path):
    path = tmp_path / "cfg.py"
    path.write_text("lrr = 1e-3\n")
    with pytest.raises(ValueError, match=r"unknown config key 'lrr' \(.*cfg.py\); did you mean 'lr'\?"):
        load_config([str(path)])
    with pytest.raises(ValueError, match="unknown config key 'group_sise' .*did you mean 'group_size'"):
        load_config(["--group_sise=4"])
    with pytest.raises(ValueError, match="config key 'lr' expects float, got 'fast'"):
        load_config(["--lr=fast"])
    with pytest.raises(ValueError, match="config key 'max_steps' expects int, got 1.5"):
        load_config(["--max_steps=1.5"])
    with pytest.raises(ValueError, match="config key 'resume' expects bool, got 'maybe'"):
        load_config(["--resume=maybe"])
    with pytest.raises(ValueError, match="config: loss_agg must be one of"):
        load_config(["--loss_agg=sum"])


def test_missing_data_file_says_how_to_download(tiny_qwen, tmp_path):
    with pytest.raises(FileNotFoundError, match=r"nowhere[/\\]train.jsonl not found .*python data.py gsm8k --out"):
        train.train(tiny_run(tiny_qwen, str(tmp_path / "nowhere"), str(tmp_path / "out")))


def test_prompt_longer_than_context_names_the_lengths(gsm8k_dir, tmp_path):
    cfg = TrainConfig(model="scratch", model_args=dict(dim=16, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=8,
                                                       ffn_dim=32, max_seq_len=64),
                      tokenizer=qwen_tokenizer_dir(), data_dir=gsm8k_dir, out_dir=str(tmp_path), device="cpu")
    with pytest.raises(ValueError, match=r"prompt #\d+ is \d+ tokens; .* longer than the model's context of 64"):
        train.train(cfg)


def tiny_model(seed=0):
    torch.manual_seed(seed)
    return Transformer(ModelConfig(vocab_size=len(CharTokenizer()), dim=32, n_layers=2, n_heads=4, n_kv_heads=2,
                                   head_dim=8, ffn_dim=64, max_seq_len=128))


def random_rows(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(3, 60, (int(torch.randint(2, 9, (), generator=g)),), generator=g).tolist()
               for _ in range(n)]
    completions = [torch.randint(3, 60, (int(torch.randint(1, 7, (), generator=g)),), generator=g).tolist()
                   for _ in range(n)]
    return prompts, completions


def test_mask_comes_from_lengths_and_keeps_a_stop_token_equal_to_pad():
    pad = 7  # Qwen: the pad token is also the end-of-text token
    ids, attention, mask, width = pack([[1, 2, 3], [4]], [[5, pad], [6, 8, pad]], pad)
    assert width == 3 and ids.tolist() == [[1, 2, 3, 5, pad, pad], [pad, pad, 4, 6, 8, pad]]
    assert mask.tolist() == [[True, True, False], [True, True, True]]
    assert attention.tolist() == [[True, True, True, True, True, False], [False, False, True, True, True, True]]


def test_logprobs_match_the_sampler_and_chunking():
    model = tiny_model().eval()
    prompts, _ = random_rows(5)
    rollout = generate(model, prompts, 8, temperature=0.7, seed=3)
    lengths = rollout.lengths.tolist()
    completions = [rollout.tokens[i, :lengths[i]].tolist() for i in range(5)]
    batch = MicroBatch(*pack(prompts, completions, 0), rows=list(range(5)), advantages=torch.zeros(5))
    with torch.no_grad():
        logp, _ = completion_logprobs(model, batch, 0.7, chunk=3)
        whole, _ = completion_logprobs(model, batch, 0.7, chunk=10_000)
    expected = torch.zeros_like(logp)
    for i in range(5):
        expected[i, :lengths[i]] = rollout.logprobs[i, :lengths[i]]
    assert torch.allclose(logp, expected, atol=1e-4)
    assert torch.allclose(logp, whole, atol=1e-6)


def test_micro_batched_gradients_and_stats_equal_the_full_batch():
    prompts, completions = random_rows(8, seed=1)
    advantages = torch.randn(8)
    no_autocast = torch.autocast("cpu", enabled=False)
    for loss_agg in ("seq_mean", "token_mean"):
        grads, stats = [], []
        for size in (8, 3):
            model = tiny_model()
            reference = tiny_model(seed=1)
            batches = make_micro_batches(prompts, completions, size, 0, "cpu")
            set_rows(batches, "advantages", advantages)
            cfg = TrainConfig(loss_agg=loss_agg, beta=0.1, logprob_chunk=4)
            add_logprobs(reference, batches, "ref_logp", cfg.temperature, cfg.logprob_chunk, no_autocast)
            stats.append(policy_gradient(model, batches, loss_of(cfg), cfg, no_autocast))
            grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
        assert torch.allclose(grads[0], grads[1], atol=1e-6), loss_agg
        assert stats[0].keys() == stats[1].keys() >= {"loss", "kl", "entropy", "ratio_mean", "clip_frac_low"}
        for key in stats[0]:  # summed over micro-batches, the stats are the whole batch's
            assert torch.allclose(stats[0][key], stats[1][key], atol=1e-6), (loss_agg, key)
        assert stats[0]["ratio_mean"].item() == pytest.approx(1.0) and stats[0]["kl"].item() > 0


def test_sft_text_keeps_reasoning_and_tags_the_answer():
    row = {"solution": "She has 3 * 4 = <<3*4=12>>12 eggs.\nSo 12 + 1 = <<12+1=13>>13.\n#### 13", "gold": "13"}
    assert sft_text(row) == "She has 3 * 4 = 12 eggs.\nSo 12 + 1 = 13.</think> <answer>13</answer>"


def test_grpo_updates_raise_the_reward_on_a_toy_task():
    """The loop's pieces wired as in grpo_step (sample G, score, group advantages, micro-batched update) must make
    a rewarded behaviour more likely: here reward 1 when the 2-token completion starts with an even token id."""
    from grpo import group_advantages
    model = tiny_model()
    prompts, _ = random_rows(6, seed=2)
    cfg = TrainConfig(beta=0.0, logprob_chunk=64)
    optimizer = configure_optimizer(model, 1e-2)
    even = torch.arange(len(CharTokenizer())) % 2 == 0

    def p_even():
        with torch.no_grad():
            last = [model(torch.tensor([p]))[0, -1].softmax(-1) for p in prompts]
        return torch.stack([probs[even].sum() for probs in last]).mean().item()

    before = p_even()
    for step in range(12):
        batch_prompts = [p for p in prompts for _ in range(8)]
        rollout = generate(model, batch_prompts, 2, temperature=1.0, seed=step)
        completions = rollout.tokens.tolist()
        rewards = torch.tensor([float(c[0] % 2 == 0) for c in completions])
        batches = make_micro_batches(batch_prompts, completions, 16, 0, "cpu")
        set_rows(batches, "advantages", group_advantages(rewards, 8))
        policy_gradient(model, batches, loss_of(cfg), cfg, torch.autocast("cpu", enabled=False))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    assert 0.3 < before < 0.7 and p_even() > before + 0.2, (before, p_even())


def test_eval_cli_rescores_a_checkpoint_to_the_logged_pass_at_1(tiny_qwen, gsm8k_dir, tmp_path):
    import eval as eval_cli
    out = str(tmp_path / "run")
    train.train(tiny_run(tiny_qwen, gsm8k_dir, out, max_steps=1, eval_every=1))
    with open(os.path.join(out, "eval.jsonl")) as f:
        logged = [json.loads(line) for line in f][-1]
    summary = eval_cli.main(["--model", os.path.join(out, "ckpt.pt"), "--data", os.path.join(out, "heldout.jsonl")])
    assert logged["step"] == 1 and summary["pass@1"] == logged["pass@1"]
    assert summary["response_length"] == logged["response_length"]  # same prompts, template and max_new_tokens
    with open(os.path.join(out, "ckpt_eval", "completions.jsonl")) as f:
        assert len(f.readlines()) == 2


def test_grpo_step_called_directly_updates_the_policy_and_reports_whole_batch_means(tmp_path, monkeypatch):
    from test_guards import reward_first_token_parity, tiny
    reward_first_token_parity(monkeypatch)
    cfg = tiny(tmp_path, group_size=4, prompts_per_step=3, beta=0.1)
    run = train.setup(cfg)
    before = {k: v.clone() for k, v in run.policy.state_dict().items()}
    samples, stats = train.grpo_step(run, cfg, step=1)
    assert any(not torch.equal(before[k], v) for k, v in run.policy.state_dict().items())
    assert all(torch.equal(before[k], v) for k, v in run.reference.state_dict().items())  # the reference stays put
    assert run.stream.cursor == 3 and samples.problems[0] == run.stream.order[0] and len(samples.texts) == 12
    record = records.step_record(1, samples, stats, cfg, run.template)  # what the loop logs of it
    shown = records.shown_samples(run.problems, 1, samples, cfg.group_size)
    assert len(shown) == 2 and shown[0]["gold"] == run.problems[run.stream.order[0]]["gold"]
    assert record["step"] == 1 and record["kl"] == pytest.approx(0.0, abs=1e-6)  # policy == reference when sampled
    assert record["ratio_mean"] == pytest.approx(1.0) and record["clip_frac_low"] == 0.0  # mu=1: on-policy
    assert 0 < record["entropy"] < math.log(len(run.tokenizer)) and record["grad_norm"] > 0
    assert 1 <= record["response_length"] <= cfg.max_new_tokens and record["lr"] == cfg.lr  # warmup_steps=1


def test_eval_py_scores_a_checkpoint_as_its_runs_evaluation_did(tmp_path, monkeypatch):
    """Issue 42: eval.py computes as train.py's held-out evaluation for the same checkpoint and settings: the same
    attention backends (set_attention_backends on its device), the checkpoint's batch size (padding changes the
    sums), LoRA adapters merged as the run's sampler merges them; so every completion, and pass@1, is the same."""
    import eval as eval_cli
    from test_guards import tiny
    out = tmp_path / "run"
    train.train(tiny(out, max_steps=1, eval_every=1, eval_size=6, synthetic_eval_size=6, eval_batch_size=4,
                     lora_rank=2, lr=0.05, max_new_tokens=16))
    with open(out / "eval.jsonl") as f:
        logged = [json.loads(line) for line in f][-1]
    backends, calls, real_generate = [], [], rollout.generate

    def generate(model, prompts, *args, **kwargs):
        merged = [m.merged_weight is not None for m in model.modules() if hasattr(m, "merged_weight")]
        calls.append((len(prompts), merged and all(merged)))
        return real_generate(model, prompts, *args, **kwargs)
    monkeypatch.setattr(eval_cli, "set_attention_backends", backends.append)
    monkeypatch.setattr(rollout, "generate", generate)
    summary = eval_cli.main(["--model", str(out / "ckpt.pt"), "--data", str(out / "heldout.jsonl")])
    assert backends == [torch.device("cpu")] and logged["step"] == 1
    assert calls == [(4, True), (2, True)]  # the run's eval_batch_size, on merged LoRA weights
    assert summary["pass@1"] == logged["pass@1"] and summary["response_length"] == logged["response_length"]
    with open(out / "eval_00001.jsonl") as f, open(out / "ckpt_eval" / "completions.jsonl") as g:
        assert [json.loads(line)["completion"] for line in f] == [json.loads(line)["completion"] for line in g]


def test_set_attention_backends_turns_cudnn_attention_off_on_cuda_only(monkeypatch):
    from model import set_attention_backends
    calls = []
    monkeypatch.setattr(torch.backends.cuda, "enable_cudnn_sdp", calls.append)
    set_attention_backends(torch.device("cpu"))
    set_attention_backends(torch.device("cuda", 0))
    assert calls == [False]


def test_a_qwen3_checkpoint_trains_with_lora_on_every_target_and_exports_as_qwen3(tiny_qwen3, gsm8k_dir, tmp_path,
                                                                                   monkeypatch):
    """Issue 43: a Qwen3 directory loads, trains (LoRA on every projection, the KL's reference its base), resumes, and
    its hf/ export is a Qwen3 checkpoint that transformers loads with the run's logits."""
    from transformers import AutoModelForCausalLM
    from checkpoint import model_from_checkpoint, read_checkpoint
    from model import LORA_TARGETS
    from test_guards import reward_first_token_parity
    reward_first_token_parity(monkeypatch)  # a random model earns no real reward: a signal for the adapters
    out = str(tmp_path / "run")
    lora = dict(lora_rank=4, lora_targets=LORA_TARGETS, lr=1e-2, group_size=4, micro_batch_size=4)
    train.train(tiny_run(tiny_qwen3, gsm8k_dir, out, max_steps=1, **lora))
    train.train(tiny_run(tiny_qwen3, gsm8k_dir, out, max_steps=2, resume=True, **lora))
    assert [r["step"] for r in read_log(out)] == [1, 2] and all(r["kl"] is not None for r in read_log(out))
    policy = model_from_checkpoint(read_checkpoint(os.path.join(out, "ckpt.pt"))).eval()
    assert policy.config.qk_norm and any(m.lora_B.abs().sum() > 0 for m in policy.modules() if hasattr(m, "lora_B"))
    exported = AutoModelForCausalLM.from_pretrained(os.path.join(out, "hf"), dtype=torch.float32).eval()
    assert type(exported).__name__ == "Qwen3ForCausalLM" and exported.config.head_dim == 16
    ids = torch.randint(0, 151936, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(exported(input_ids=ids).logits, policy(ids), atol=1e-4, rtol=0)


def test_the_step_record_says_which_gpu_fast_paths_decoded_its_rollout(tmp_path, monkeypatch, capsys):
    """Issue 46: a fallback shows where people look, in log.jsonl, not only in one line of stderr. The CPU made a
    fast-path device: CUDA graphs cannot even set up (no CUDA), so every step records cuda_graphs_ran 0, and the one
    line says what failed; on the CPU proper no such key is logged (the demos' logs stay as they were)."""
    import sample
    from test_guards import tiny
    train.train(tiny(tmp_path / "cpu"))
    with open(tmp_path / "cpu" / "log.jsonl") as f:
        assert not any("cuda_graphs_ran" in json.loads(line) for line in f)
    monkeypatch.setattr(sample, "FAST_PATH_DEVICES", ("cuda", "cpu"))
    train.train(tiny(tmp_path / "fast", fused_sampling=False))
    with open(tmp_path / "fast" / "log.jsonl") as f:
        records = [json.loads(line) for line in f]
    assert [r["cuda_graphs_ran"] for r in records] == [0, 0] and not any("fused_sampling_ran" in r for r in records)
    assert "sample.py: CUDA graphs failed to set up" in capsys.readouterr().err
