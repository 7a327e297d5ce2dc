"""
Each loss switch of grpo.py beside TRL 1.16's GRPOTrainer on the same small batch. TRL's own code runs: its
_compute_loss, get_high_entropy_mask, get_off_policy_mask, and the two blocks of _generate_and_score_completions that
make the sampler correction's ratio and the advantages, read from the installed trl package's source and run on
plain tensors by a stand-in trainer that holds the settings (no model, no generation, no import of trl, whose import
needs pandas and datasets).

    pip install --no-deps trl==1.16.0
    python tools/trl_parity.py      # per switch: our loss, TRL's, the largest gradient difference, what differs

tests/test_trl_parity.py asserts the same table. Where TRL computes something else on purpose, CASES says what and
why, and the comparison is of the documented relation.
"""
import ast
import copy
import functools
import importlib.metadata
import importlib.util
import math
import os
import sys
import types
from collections import defaultdict

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from config import TrainConfig  # noqa: E402
from distributed import mix_weights  # noqa: E402
from grpo import (LossSettings, advantages_of, group_advantages, grpo_loss, loss_of, normalize_then_sum,  # noqa: E402
                  reward_scale)
from settings import fields_of  # noqa: E402
from rollout import Samples  # noqa: E402

TRL_VERSION = "1.16.0"


def trl_code() -> dict:
    """TRL's loss code from its installed files: {name: function}, and the two blocks of
    _generate_and_score_completions as compiled code ("sampler_ratio", "advantages"). A ModuleNotFoundError where trl
    is not installed."""
    spec = importlib.util.find_spec("trl")
    if spec is None:
        raise ModuleNotFoundError(f"needs trl: pip install --no-deps trl=={TRL_VERSION}")
    found = importlib.metadata.version("trl")
    if found != TRL_VERSION:
        raise ModuleNotFoundError(f"needs trl {TRL_VERSION} (found {found}): pip install --no-deps trl=={TRL_VERSION}")
    folder = os.path.join(spec.submodule_search_locations[0], "trainer")
    trees = {name: ast.parse(open(os.path.join(folder, name + ".py")).read()) for name in ("grpo_trainer", "utils")}
    code = {}
    namespace = {"torch": torch, "math": math}
    for node in trees["utils"].body:
        if isinstance(node, ast.FunctionDef) and node.name in ("nanstd", "nanmin", "nanmax"):
            exec(compile(ast.Module([node], []), "trl/trainer/utils.py", "exec"), namespace)
    trainer = next(n for n in trees["grpo_trainer"].body if isinstance(n, ast.ClassDef) and n.name == "GRPOTrainer")
    methods = {n.name: n for n in trainer.body if isinstance(n, ast.FunctionDef)}
    for name in ("_compute_loss", "get_high_entropy_mask", "get_off_policy_mask", "get_gamma_weights"):
        node = methods[name]
        node.decorator_list = []  # profiling, staticmethod, no_grad: the stand-in has none of them
        exec(compile(ast.Module([node], []), "trl/trainer/grpo_trainer.py", "exec"), namespace)
        code[name] = namespace[name]
    generate = methods["_generate_and_score_completions"]
    for name, test, result in (
            ("sampler_ratio", "self.use_vllm and self.vllm_importance_sampling_correction",
             "vllm_importance_sampling_ratio"),
            ("advantages", "self.multi_objective_aggregation == 'sum_then_normalize'", "advantages")):
        block = next(n for n in ast.walk(generate) if isinstance(n, ast.If) and ast.unparse(n.test) == test
                     and _assigns(n, result))
        code[name] = compile(ast.Module([block], []), "trl/trainer/grpo_trainer.py", "exec")
    callbacks = ast.parse(open(os.path.join(folder, "callbacks.py")).read())
    sync = next(n for n in ast.walk(callbacks) if isinstance(n, ast.FunctionDef) and n.name == "_sync_target_model")
    sync.decorator_list = []
    exec(compile(ast.Module([sync], []), "trl/trainer/callbacks.py", "exec"), namespace)
    code["sync_target_model"] = namespace["_sync_target_model"]
    code["namespace"] = namespace
    return code


def _assigns(node, name: str) -> bool:
    """Whether the code under node assigns the variable name."""
    return any(isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Store) for n in ast.walk(node))


class Accelerator:
    """One process: gathers and reductions are the identity."""
    num_processes = 1
    process_index = 0
    sync_gradients = True

    def gather(self, x):
        return x

    def reduce(self, x, reduction="sum"):
        return x

    def gather_for_metrics(self, x):
        return x

    def pad_across_processes(self, x, dim=0, pad_index=0):
        return x


class Trainer:
    """What TRL's loss code reads of a GRPOTrainer, set from GRPOConfig-named settings (TRL's defaults otherwise);
    the model's log-probs and entropies are given."""

    def __init__(self, code, logp, entropy, **settings):
        args = dict(beta=0.0, loss_type="grpo", epsilon=0.2, epsilon_high=None, delta=None, importance_sampling_level="token",
                    top_entropy_quantile=1.0, off_policy_mask_threshold=None, use_bias_correction_kl=False,
                    sapo_temperature_pos=1.0, sapo_temperature_neg=1.05, entropy_coef=0.0, use_vllm=False,
                    vllm_importance_sampling_correction=False, vllm_importance_sampling_mode="sequence_mask",
                    vllm_importance_sampling_clip_max=3.0, vllm_importance_sampling_clip_min=None,
                    max_completion_length=logp.shape[1], scale_rewards="group", use_adaptive_entropy=False,
                    vespo_k_pos=2.0, vespo_lambda_pos=3.0, vespo_k_neg=3.0, vespo_lambda_neg=2.0,
                    multi_objective_aggregation="sum_then_normalize", entropy_target=0.2, entropy_coef_delta=0.005,
                    entropy_coef_min=0.0, entropy_coef_max=1.0)
        args.update(settings)
        self.args = types.SimpleNamespace(**args, steps_per_generation=1)
        for key, value in args.items():
            setattr(self, key, value)
        self.epsilon_low = args["epsilon"]
        self.epsilon_high = args["epsilon"] if args["epsilon_high"] is None else args["epsilon_high"]
        self.accelerator = Accelerator()
        self.model = types.SimpleNamespace(training=True)
        self._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
        self.current_gradient_accumulation_steps = 1
        self.aux_loss_enabled = False
        self._entropy_bonus_enabled = args["entropy_coef"] != 0.0 or args["use_adaptive_entropy"]
        self._last_world_entropy = float("inf")
        self._entropy_window_stats = None
        self.code, self.logp, self.entropy = code, logp, entropy
        self.get_high_entropy_mask = functools.partial(code["get_high_entropy_mask"], self)
        self.get_off_policy_mask = code["get_off_policy_mask"]  # a staticmethod in TRL
        self.get_gamma_weights = torch.no_grad()(code["get_gamma_weights"])  # a no-grad staticmethod in TRL

    def _get_per_token_logps_and_entropies(self, model, *args, **kwargs):
        return self.logp, self.entropy, None

    def sampler_ratio(self, old_logp, sampler_logp, mask):
        """TRL's vllm_importance_sampling_ratio, from its own block of _generate_and_score_completions."""
        scope = {**self.code["namespace"], "self": self, "completion_mask": mask, "tool_mask": None,
                 "old_per_token_logps": old_logp, "sampling_per_token_logps": sampler_logp}
        exec(self.code["sampler_ratio"], scope)
        return scope["vllm_importance_sampling_ratio"]

    def advantages(self, rewards, group_size, weights):
        """TRL's advantages of reward functions' rewards [B, K] weighted by weights [K], from its own block."""
        scope = {**self.code["namespace"], "self": self, "rewards_per_func": rewards, "num_generations": group_size,
                 "device": rewards.device, "unscorable_mask": torch.zeros(len(rewards), dtype=torch.bool)}
        self.reward_weights = weights
        self.reward_funcs = list(weights)
        exec(self.code["advantages"], scope)
        return scope["advantages"]

    def loss(self, inputs):
        return self.code["_compute_loss"](self, None, inputs)


def batch(seed: int = 0, B: int = 6, T: int = 5) -> dict:
    """A small batch: ragged completion masks, log-probs under the policy, pi_old (mu > 1), the reference and the
    sampler, entropies, advantages of both signs, and two truncated completions."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([5, 3, 4, 2, 5, 1])[:B]
    mask = torch.arange(T) < lengths[:, None]
    logp = -torch.rand(B, T, generator=g) * 2 * mask
    return {"mask": mask, "logp": logp,
            "old_logp": (logp + 0.25 * torch.randn(B, T, generator=g)) * mask,
            "ref_logp": (logp + 0.4 * torch.randn(B, T, generator=g)) * mask,
            "sampler_logp": (logp + 0.3 * torch.randn(B, T, generator=g)) * mask,
            "entropy": torch.rand(B, T, generator=g) * 3 * mask,
            "advantages": torch.tensor([1.0, -0.5, 0.8, -1.2, -0.3, 0.6])[:B],
            "truncated": torch.tensor([True, False, False, False, True, False])[:B]}


# name -> (our grpo_loss settings, TRL's settings, what differs on purpose or None). The batch has mu > 1 (pi_old
# apart from the policy) unless the settings say "on_policy"; "truncated" masks the truncated completions.
CASES = {
    "GRPO (clip, seq_mean, k3)": (dict(beta=0.04), dict(beta=0.04), None),
    "k3_is": (dict(beta=0.04, kl_estimator="k3_is"), dict(beta=0.04, use_bias_correction_kl=True), None),
    "token_mean": (dict(beta=0.0, loss_agg="token_mean"), dict(loss_type="dapo"), None),
    "constant (Dr. GRPO)": (dict(beta=0.0, loss_agg="constant"), dict(loss_type="dr_grpo"), None),
    "clip_eps_high": (dict(beta=0.0, clip_eps_high=0.28), dict(epsilon_high=0.28), None),
    "sequence level (GSPO)": (dict(beta=0.0, importance_sampling_level="sequence", clip_eps=3e-4, clip_eps_high=4e-4),
                              dict(importance_sampling_level="sequence", epsilon=3e-4, epsilon_high=4e-4), None),
    "delta": (dict(beta=0.0, delta=1.3), dict(delta=1.3), None),
    "cispo": (dict(beta=0.0, policy_loss="cispo", clip_eps_high=0.2, loss_agg="token_mean"),
              dict(loss_type="cispo", epsilon_high=1.2),
              "TRL's epsilon_high is CISPO's cap itself (ScaleRL's 5.0); ours is 1 + clip_eps_high, the bound clip "
              "uses, so that clip_eps_high keeps one meaning: TRL's 1.2 is our 0.2"),
    "sapo": (dict(beta=0.0, policy_loss="sapo"), dict(loss_type="sapo"), None),
    "token_truncate": (dict(beta=0.0, importance_sampling_correction=True, importance_sampling_mode="token_truncate",
                            importance_sampling_clip_max=1.2, importance_sampling_clip_min=0.9),
                       dict(use_vllm=True, vllm_importance_sampling_correction=True,
                            vllm_importance_sampling_mode="token_truncate", vllm_importance_sampling_clip_max=1.2,
                            vllm_importance_sampling_clip_min=0.9), None),
    "token_mask": (dict(beta=0.0, importance_sampling_correction=True, importance_sampling_mode="token_mask",
                        importance_sampling_clip_max=1.2, importance_sampling_clip_min=0.9),
                   dict(use_vllm=True, vllm_importance_sampling_correction=True,
                        vllm_importance_sampling_mode="token_mask", vllm_importance_sampling_clip_max=1.2,
                        vllm_importance_sampling_clip_min=0.9), None),
    "sequence_truncate": (dict(beta=0.0, importance_sampling_correction=True, importance_sampling_mode="sequence_truncate",
                               importance_sampling_clip_max=1.5, importance_sampling_clip_min=0.5),
                          dict(use_vllm=True, vllm_importance_sampling_correction=True,
                               vllm_importance_sampling_mode="sequence_truncate", vllm_importance_sampling_clip_max=1.5,
                               vllm_importance_sampling_clip_min=0.5), None),
    "sequence_mask": (dict(beta=0.0, importance_sampling_correction=True, importance_sampling_mode="sequence_mask",
                           importance_sampling_clip_max=1.5, importance_sampling_clip_min=0.5),
                      dict(use_vllm=True, vllm_importance_sampling_correction=True,
                           vllm_importance_sampling_mode="sequence_mask", vllm_importance_sampling_clip_max=1.5,
                           vllm_importance_sampling_clip_min=0.5), None),
    "tis_cap": (dict(beta=0.0, tis_cap=1.1), dict(use_vllm=True, vllm_importance_sampling_correction=True,
                                                  vllm_importance_sampling_mode="token_truncate",
                                                  vllm_importance_sampling_clip_max=1.1), None),
    "off_policy_mask_threshold": (dict(beta=0.0, off_policy_mask_threshold=0.05),
                                  dict(off_policy_mask_threshold=0.05, use_vllm=True), None),
    "top_entropy_quantile": (dict(beta=0.04, top_entropy_quantile=0.4), dict(beta=0.04, top_entropy_quantile=0.4),
                             "none on one batch; TRL's quantile is over each micro-batch's tokens, ours over the "
                             "whole step's (chosen once, before the mu updates), so it does not depend on "
                             "micro_batch_size"),
    "entropy_coef": (dict(beta=0.0, entropy_coef=0.05), dict(entropy_coef=0.05),
                     "none on one batch; TRL averages each micro-batch's entropy and divides by the accumulation "
                     "steps, ours is the whole step's token mean"),
    "entropy_coef + top_entropy_quantile": (dict(beta=0.0, entropy_coef=0.05, top_entropy_quantile=0.5),
                                            dict(entropy_coef=0.05, top_entropy_quantile=0.5), None),
    "vespo": (dict(beta=0.0, policy_loss="vespo", loss_agg="token_mean"), dict(loss_type="vespo"), None),
    "vespo, other k and lambda": (dict(beta=0.04, policy_loss="vespo", loss_agg="token_mean", vespo_k_pos=1.0,
                                       vespo_lambda_pos=2.0, vespo_k_neg=4.0, vespo_lambda_neg=1.0),
                                  dict(beta=0.04, loss_type="vespo", vespo_k_pos=1.0, vespo_lambda_pos=2.0,
                                       vespo_k_neg=4.0, vespo_lambda_neg=1.0), None),
    "luspo": (dict(beta=0.0, importance_sampling_level="sequence", loss_agg="luspo"),
              dict(loss_type="luspo", importance_sampling_level="sequence"), None),
    "use_adaptive_entropy, first step": (dict(beta=0.0, use_adaptive_entropy=True, entropy_coef=0.05),
                                         dict(use_adaptive_entropy=True, entropy_coef=0.05),
                                         "none: no bonus before the first step's entropy is known, in both"),
    "use_adaptive_entropy, below target": (dict(beta=0.0, use_adaptive_entropy=True, entropy_coef=0.05,
                                                entropy_target=2.0, last_entropy=1.0),
                                           dict(use_adaptive_entropy=True, entropy_coef=0.05, entropy_target=2.0,
                                                last_entropy=1.0), None),
    "mask_truncated_completions, token_mean": (dict(beta=0.04, loss_agg="token_mean", truncated=True),
                                               dict(beta=0.04, loss_type="dapo", truncated=True), None),
    "mask_truncated_completions, seq_mean": (
        dict(beta=0.04, truncated=True), dict(beta=0.04, truncated=True),
        "TRL's loss_type='grpo' averages over every completion, a truncated one adding 0, so masking them also "
        "shrinks the step by the kept share; ours averages over the completions in the loss: TRL's = ours x kept / B"),
}


def ours(data: dict, settings: dict):
    """Our loss and its gradients (logp, entropy) on data: a TrainConfig of the settings, checked as a run's is, and
    its loss settings through grpo_loss (the run's loss_of, its Loss called on the batch's Terms)."""
    settings = dict(settings)
    truncated = settings.pop("truncated", False)
    last_entropy = settings.pop("last_entropy", None)
    cfg = TrainConfig(**settings, mask_truncated_completions=truncated)
    loss_settings = {f.name: getattr(cfg, f.name) for f in fields_of(LossSettings)
                     if f.name != "mask_truncated_completions"}  # grpo_loss takes it as loss_mask
    logp = data["logp"].clone().requires_grad_()
    entropy = data["entropy"].clone().requires_grad_()
    state = None
    if last_entropy is not None:  # the adaptive coefficient's state after an earlier step
        state = {"AdaptiveEntropy": {"coef": cfg.entropy_coef, "last_entropy": last_entropy}}
    loss, _ = grpo_loss(logp, data["old_logp"], data["ref_logp"], data["advantages"], data["mask"],
                        sampler_logp=data["sampler_logp"], entropy=entropy,
                        loss_mask=~data["truncated"][:, None] if truncated else None, loss_state=state,
                        **loss_settings)
    loss.backward()
    return loss.item(), logp.grad, entropy.grad


def trl_inputs(mask, advantages, old_logp=None, ref_logp=None, sampler_logp=None) -> dict:
    """The inputs TRL's _compute_loss reads of a batch whose completion mask is mask [B, T]."""
    return {"prompt_ids": torch.zeros(len(mask), 1, dtype=torch.long),
            "prompt_mask": torch.ones(len(mask), 1, dtype=torch.long),
            "completion_ids": torch.zeros(mask.shape, dtype=torch.long), "completion_mask": mask.long(),
            "advantages": advantages, "old_per_token_logps": old_logp, "ref_per_token_logps": ref_logp,
            "sampling_per_token_logps": sampler_logp, "num_items_in_batch": mask.sum()}


def theirs(code: dict, data: dict, settings: dict):
    """TRL's loss and its gradients on data, by its own code."""
    settings = dict(settings)
    truncated = settings.pop("truncated", False)
    mask = data["mask"] & ~data["truncated"][:, None] if truncated else data["mask"]
    logp = data["logp"].clone().requires_grad_()
    entropy = data["entropy"].clone().requires_grad_()
    last_entropy = settings.pop("last_entropy", None)
    trainer = Trainer(code, logp, entropy, **settings)
    if last_entropy is not None:
        trainer._last_world_entropy = last_entropy
    inputs = trl_inputs(mask, data["advantages"], data["old_logp"], data["ref_logp"], data["sampler_logp"])
    if trainer.vllm_importance_sampling_correction:
        inputs["importance_sampling_ratio"] = trainer.sampler_ratio(data["old_logp"], data["sampler_logp"], mask.long())
    loss = trainer.loss(inputs)
    loss.backward()
    return loss.item(), logp.grad, entropy.grad


def compare(code: dict, name: str, data: dict | None = None) -> dict:
    """One case of CASES: {"ours", "trl", "expected_trl" (ours, or the documented relation's value), "grad_diff"
    (the largest difference of the gradients, ours mapped by that relation)}."""
    data = data or batch()
    mine, trl, _ = CASES[name]
    loss, grad, entropy_grad = ours(data, mine)
    their_loss, their_grad, their_entropy_grad = theirs(code, data, trl)
    scale = 1.0
    if name == "mask_truncated_completions, seq_mean":
        scale = float((~data["truncated"]).sum()) / len(data["truncated"])
    diff = (grad * scale - their_grad).abs().max().item()
    if their_entropy_grad is not None or entropy_grad is not None:
        zero = torch.zeros_like(data["entropy"])
        diff = max(diff, ((entropy_grad if entropy_grad is not None else zero) * scale
                          - (their_entropy_grad if their_entropy_grad is not None else zero)).abs().max().item())
    return {"ours": loss, "trl": their_loss, "expected_trl": loss * scale, "grad_diff": diff}


# the advantages' eps: TRL divides by std + 1e-4 (a constant, no setting), this repo by std + 1e-6 (verl's); a group
# whose rewards differ by 1e-5 gets advantages of about +-0.62 here, +-0.047 in TRL's; at std >= 0.1 the two differ
# by under 0.1%
TRL_EPS, OUR_EPS = 1e-4, 1e-6


def samples(rewards: dict, weights: dict):
    """A rollout.Samples of reward components {name: [B]} (weighted as a run weighs them), one token each."""
    n = len(next(iter(rewards.values())))
    total = [sum(weights[k] * rewards[k][i] for k in weights) for i in range(n)]
    return Samples(prompts=[[0]] * n, completions=[[0]] * n, texts=[""] * n, stopped=[True] * n, logprobs=None,
                   rewards=total, components={k: list(v) for k, v in rewards.items()}, seconds_sampling=0.0,
                   seconds_scoring=0.0)


REWARDS = {"correctness": [1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0], "format": [1.0, 1.0, 0.5, 1.0, 0.0, 1.0, 0.5, 1.0]}


def advantages_table(code: dict) -> dict:
    """Each advantage setting (scale_rewards "group", "batch", "none"; multi_objective_aggregation
    "normalize_then_sum", GDPO) through advantages_of as a run calls it (a TrainConfig, a Samples of two reward
    functions in groups of 4), beside TRL's own advantages: {name: (ours, TRL's, ours with TRL's eps)}; the eps
    is the one difference (TRL_EPS, OUR_EPS)."""
    weights = {"correctness": 1.0, "format": 0.5}
    rows = {}
    for settings, trl in ((dict(), dict(scale_rewards="group")), (dict(scale_rewards="batch"), dict(scale_rewards="batch")),
                          (dict(scale_rewards="none"), dict(scale_rewards="none")),
                          (dict(multi_objective_aggregation="normalize_then_sum"),
                           dict(multi_objective_aggregation="normalize_then_sum"))):
        cfg = TrainConfig(group_size=4, reward_weights=weights, beta=0.0, **settings)
        mine, _ = advantages_of(samples(REWARDS, weights), None, cfg)
        trainer = Trainer(code, torch.zeros(1, 1), None, **trl)
        theirs = trainer.advantages(torch.tensor(list(REWARDS.values())).T, 4, torch.tensor(list(weights.values())))
        if cfg.multi_objective_aggregation == "normalize_then_sum":
            at_their_eps = normalize_then_sum({k: torch.tensor(v) for k, v in REWARDS.items()}, weights, 4,
                                              eps=TRL_EPS)[0]
        else:
            at_their_eps = group_advantages(torch.tensor(samples(REWARDS, weights).rewards), 4, scale=reward_scale(cfg),
                                            eps=TRL_EPS)
        rows[next(iter(trl.values()))] = (mine, theirs, at_their_eps)
    return rows


def adaptive_coefficients(code: dict, steps: int = 4) -> tuple[list, list]:
    """use_adaptive_entropy over `steps` optimizer steps whose entropies fall (3.0, 2.0, 1.0, ...) against a target of
    2.5: our AdaptiveEntropy part, called and stepped as a run's update does, beside TRL's controller in its own
    _compute_loss. -> (our coefficients after each step, TRL's)."""
    data = batch()
    cfg = TrainConfig(beta=0.0, use_adaptive_entropy=True, entropy_coef=0.05, entropy_target=2.5,
                      entropy_coef_delta=0.01)
    loss = loss_of(cfg)
    trainer = Trainer(code, data["logp"], None, use_adaptive_entropy=True, entropy_coef=0.05, entropy_target=2.5,
                      entropy_coef_delta=0.01)
    mine, theirs = [], []
    for step in range(steps):
        entropy = data["mask"] * (3.0 - step)
        terms = types.SimpleNamespace(entropy=entropy, policy_mask=data["mask"], logp=data["logp"])
        loss.bonuses[0](terms, types.SimpleNamespace(policy_tokens=data["mask"].sum()))
        mine.append(loss.after_step()["entropy_coef"])
        trainer.entropy = entropy
        trainer.loss(trl_inputs(data["mask"], data["advantages"]))
        theirs.append(trainer.entropy_coef)
    return mine, theirs


def reference_sync(code: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """sync_ref_model: our distributed.mix_weights beside TRL's SyncRefModelCallback._sync_target_model on a small
    model pair, alpha 0.6 (ref_model_mixup_alpha's default). -> (our reference's weights, TRL's)."""
    g = torch.Generator().manual_seed(0)
    policy, reference = (torch.nn.Linear(4, 3) for _ in range(2))
    with torch.no_grad():
        for p in list(policy.parameters()) + list(reference.parameters()):
            p.copy_(torch.randn(p.shape, generator=g))
    theirs = copy.deepcopy(reference)
    mix_weights(reference, policy, 0.6)
    code["sync_target_model"](policy, theirs, 0.6)
    return torch.cat([p.flatten() for p in reference.parameters()]), torch.cat([p.flatten() for p in theirs.parameters()])


def main():
    code = trl_code()
    print(f"TRL {TRL_VERSION}'s loss code beside grpo.py's, on tools/trl_parity.batch():\n")
    print(f"{'switch':42s} {'ours':>10s} {'TRL':>10s} {'max |grad diff|':>16s}  what differs on purpose")
    for name, (_, _, note) in CASES.items():
        row = compare(code, name)
        print(f"{name:42s} {row['ours']:10.6f} {row['trl']:10.6f} {row['grad_diff']:16.2e}  {note or ''}")
    print(f"\nadvantages through advantages_of (a TrainConfig; eps {OUR_EPS}, TRL's {TRL_EPS}):")
    for name, (mine, trl, at_their_eps) in advantages_table(code).items():
        print(f"  {name:18s} max |ours - TRL's| = {(mine - trl).abs().max().item():.2e}, at TRL's eps "
              f"{(at_their_eps - trl).abs().max().item():.2e}")
    mine, trl = adaptive_coefficients(code)
    print(f"\nuse_adaptive_entropy, the coefficient after each step: ours {mine}, TRL's {trl}")
    mine, trl = reference_sync(code)
    print(f"sync_ref_model, the reference after one sync: max |ours - TRL's| = {(mine - trl).abs().max().item():.2e}")


if __name__ == "__main__":
    main()
