"""
GRPO on the smallest possible problem, a 10-armed bandit, against REINFORCE and REINFORCE with a baseline.

    python tools/bandit.py                               # table over 5 seeds for each landscape, writes bandit.png
    python tools/bandit.py --beta 0 --group_size 4 --mu 4

The policy is a softmax over 10 logits for the actions 1..10 (no states), started uniform; that initial policy is
the reference of the KL. Rewards are deterministic, each landscape's best action earns 1.0, tri(d) = max(0, 1-|d|):
    single  r(a) = tri((a - peak) / 4)                 peak = --peak (default 7): 0.25, 0.5, 0.75, 1.0, 0.75, ... at 4..10
    double  r(a) = max(0.7 tri((a - 3) / 2), tri((a - 8) / 2))
            local peak 0.35, 0.7, 0.35 at a = 2, 3, 4; global peak 0.5, 1.0, 0.5 at a = 7, 8, 9; 0 at 1, 5, 6, 10
    linear  r(a) = a / 10
Every step draws the same group_size actions from the current policy for every algorithm, then:
    grpo                advantages (r - group mean) / group std (grpo.group_advantages), loss grpo.grpo_loss:
                        clipped ratio and k3 KL to the reference; mu updates per batch, old log-probs taken once
                        before the first (the clip only bites when mu > 1)
    reinforce           advantage r (group_advantages baseline="none", scale="none"); grpo_loss with beta=0, one
                        update and old_logp=None has the gradient of -mean(r log pi(a)): plain policy gradient
    reinforce_baseline  advantage r - b_t, b_t = m_t / (1 - 0.9^t) with m_0 = 0, m_{t+1} = 0.9 m_t + 0.1 mean(r_t):
                        a discounted average of the batch means of steps 0..t-1 only (b_0 = 0, no past yet); the
                        bias correction keeps the early baselines from being dragged towards the start value 0
Adam by default: its per-parameter step size does not depend on the advantage scale, so one lr fits GRPO's
unit-std advantages and REINFORCE's raw rewards alike (--optimizer sgd to see the difference).
Reported metrics are exact sums over the 10 actions, not sample estimates.

    python tools/bandit.py --kl_table                    # where each KL estimator (grpo.KL_ESTIMATORS) leads GRPO

With a uniform reference, the policy that maximises E_pi[r] - beta KL(pi || pi_ref) is known in closed form,
pi*(a) proportional to pi_ref(a) exp(r(a) / beta); the one that maximises E_pi[r] - beta KL(pi_ref || pi) (the forward
KL, which k3's gradient follows) solves pi(a) = beta pi_ref(a) / (beta - r(a) + lambda), lambda making it sum to 1.
--kl_table trains GRPO with each estimator and unbiased advantages (RLOO, no std scaling: the expected gradient is
that of E_pi[r], so these optima are the stationary points) and prints how far the final policy lies from each.
"""
import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the library's modules, from tools/
from grpo import KL_ESTIMATORS, group_advantages, grpo_loss, kl_penalized_rewards  # noqa: E402

LANDSCAPES = ("single", "double", "linear")
ALGORITHMS = ("grpo", "reinforce", "reinforce_baseline")
OPTIMIZERS = ("adam", "sgd")
BASELINE_DECAY = 0.9
METRICS = ("expected_reward", "pi_best", "kl", "entropy")


def rewards_of(landscape: str, peak: int = 7) -> torch.Tensor:
    """Reward of each action 1..10 as a [10] float32 tensor (index 0 is action 1); the maximum is 1.0."""
    def tri(d):
        return (1 - d.abs()).clamp(min=0)
    actions = torch.arange(1, 11, dtype=torch.float32)
    if landscape == "single":
        if not 1 <= peak <= 10:
            raise ValueError(f"peak must be an action in 1..10, got {peak}")
        return tri((actions - peak) / 4)
    if landscape == "double":
        return torch.maximum(0.7 * tri((actions - 3) / 2), tri((actions - 8) / 2))
    if landscape == "linear":
        return actions / 10
    raise ValueError(f"unknown landscape {landscape!r}; choose one of {LANDSCAPES}")


def policy_metrics(logits, ref_logp, reward) -> torch.Tensor:
    """Exact E_pi[r], pi(best action), KL(pi || pi_ref), entropy (nats) of the policy softmax(logits [10]) -> [4]."""
    logp = torch.log_softmax(logits, dim=-1)
    p = logp.exp()
    return torch.stack([(p * reward).sum(), p[reward.argmax()], (p * (logp - ref_logp)).sum(), -(p * logp).sum()])


def run(landscape: str, algorithm: str, seed: int = 0, steps: int = 200, group_size: int = 8, lr: float = 0.05,
        clip_eps: float = 0.2, beta: float = 0.04, mu: int = 1, optimizer: str = "adam", peak: int = 7,
        kl_estimator: str = "k3", adv_baseline: str = "mean", adv_scale: str = "std") -> dict:
    """Train one policy; returns float32 curves, index t = after t updates (0 = the uniform start):
    expected_reward, pi_best, kl, entropy [steps + 1]; policy [steps + 1, 10]; and per step [steps]: batch_reward
    (mean sampled reward) and baseline (what was subtracted: 0, the group mean, or the moving average b_t);
    reward [10], the landscape. grpo takes kl_estimator (grpo.KL_ESTIMATORS), adv_baseline and adv_scale
    (grpo.group_advantages); "k1_reward" subtracts beta * log pi(a) / pi_ref(a) from each reward instead.
    Deterministic per seed: sampling uses its own torch.Generator, the start is uniform."""
    reward = rewards_of(landscape, peak)
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {algorithm!r}; choose one of {ALGORITHMS}")
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {optimizer!r}; choose one of {OPTIMIZERS}")
    if algorithm == "grpo" and group_size < 2:
        raise ValueError(f"grpo needs group_size >= 2 (a group of one has no mean to compare with), got {group_size}")
    if group_size < 1 or steps < 1 or mu < 1:
        raise ValueError(f"group_size, steps and mu must be >= 1, got {group_size}, {steps}, {mu}")
    generator = torch.Generator().manual_seed(seed)
    logits = torch.zeros(10, requires_grad=True)
    ref_logp = torch.log_softmax(logits.detach(), dim=-1)
    opt = (torch.optim.Adam if optimizer == "adam" else torch.optim.SGD)([logits], lr=lr)
    mask = torch.ones(group_size, 1)  # one "token" per completion: the action
    moving_mean = 0.0
    metrics, policy, batch_reward, baselines = [policy_metrics(logits.detach(), ref_logp, reward)], [], [], []
    for step in range(steps):
        with torch.no_grad():
            old_logp_all = torch.log_softmax(logits, dim=-1)
            actions = torch.multinomial(old_logp_all.exp(), group_size, replacement=True, generator=generator)
        r = reward[actions]
        if algorithm == "grpo":
            penalized = kl_penalized_rewards(r, (old_logp_all - ref_logp)[actions], beta) \
                if kl_estimator == "k1_reward" else r
            advantages = group_advantages(penalized, group_size, baseline=adv_baseline, scale=adv_scale)
            baseline = r.mean().item()
        elif algorithm == "reinforce":
            advantages, baseline = group_advantages(r, group_size, baseline="none", scale="none"), 0.0
        else:
            baseline = moving_mean / (1 - BASELINE_DECAY ** step) if step else 0.0
            advantages = r - baseline
            moving_mean = BASELINE_DECAY * moving_mean + (1 - BASELINE_DECAY) * r.mean().item()
        old_logp = old_logp_all[actions].unsqueeze(1)
        for _ in range(mu if algorithm == "grpo" else 1):
            logp = torch.log_softmax(logits, dim=-1)[actions].unsqueeze(1)
            if algorithm == "grpo":
                loss, _ = grpo_loss(logp, old_logp, ref_logp[actions].unsqueeze(1), advantages, mask,
                                    clip_eps=clip_eps, beta=beta, kl_estimator=kl_estimator)
            else:
                loss, _ = grpo_loss(logp, None, None, advantages, mask, beta=0.0)
            opt.zero_grad()
            loss.backward()
            opt.step()
        policy.append(old_logp_all.exp())
        batch_reward.append(r.mean().item())
        baselines.append(baseline)
        metrics.append(policy_metrics(logits.detach(), ref_logp, reward))
    policy.append(torch.softmax(logits.detach(), dim=-1))
    curves = dict(zip(METRICS, torch.stack(metrics).T))
    return {**curves, "policy": torch.stack(policy), "batch_reward": torch.tensor(batch_reward),
            "baseline": torch.tensor(baselines), "reward": reward}


def reverse_kl_optimum(reward: torch.Tensor, beta: float) -> torch.Tensor:
    """argmax_pi E_pi[r] - beta KL(pi || uniform) = softmax(r / beta)."""
    return torch.softmax(reward.double() / beta, -1).float()


def forward_kl_optimum(reward: torch.Tensor, beta: float) -> torch.Tensor:
    """argmax_pi E_pi[r] - beta KL(uniform || pi): pi(a) = beta / 10 / (beta - r(a) + lam), lam found by bisection
    so that it sums to 1 (the sum falls as lam grows, from infinity at lam = max(r) - beta)."""
    r, ref = reward.double(), 0.1
    low, high = (r.max() - beta).item(), r.max().item() + beta
    for _ in range(200):
        lam = (low + high) / 2
        low, high = (lam, high) if (beta * ref / (beta - r + lam)).sum() > 1 else (low, lam)
    p = beta * ref / (beta - r + lam)
    return (p / p.sum()).float()


def kl_table(landscapes, betas, seeds: int, steps: int = 1000, group_size: int = 16, lr: float = 0.02) -> list[str]:
    """Markdown rows: for each landscape, beta and KL estimator, the final GRPO policy's total variation distance
    and exact KL to pi* (the reverse-KL optimum) and its distance to the forward-KL optimum, mean ± std over seeds."""
    rows = ["| landscape | beta | kl_estimator | TV(pi, pi*) | KL(pi ‖ pi*) | TV(pi, forward-KL optimum) |",
            "|---|---|---|---|---|---|"]
    for landscape in landscapes:
        reward = rewards_of(landscape)
        for beta in betas:
            best, forward = reverse_kl_optimum(reward, beta), forward_kl_optimum(reward, beta)
            for estimator in KL_ESTIMATORS:
                finals = [run(landscape, "grpo", seed, steps=steps, group_size=group_size, lr=lr, beta=beta,
                              kl_estimator=estimator, adv_baseline="rloo", adv_scale="none")["policy"][-1]
                          for seed in range(seeds)]
                cells = [torch.tensor([0.5 * (p - best).abs().sum() for p in finals]),
                         torch.tensor([(p * (p / best).log()).sum().clamp(min=0) for p in finals]),  # >= 0 exactly
                         torch.tensor([0.5 * (p - forward).abs().sum() for p in finals])]
                rows.append(f"| {landscape} | {beta} | {estimator} | " + " | ".join(
                    f"{c.mean():.4f} ± {c.std() if seeds > 1 else 0:.4f}" for c in cells) + " |")
            rows.append(f"| {landscape} | {beta} | (pi* itself) | 0 | 0 | {0.5 * (best - forward).abs().sum():.4f} |")
    return rows


def steps_to_reach(curve: torch.Tensor, target: float) -> int | None:
    """First t with curve[t] >= target, or None if it never gets there."""
    hits = (curve >= target).nonzero()
    return int(hits[0]) if len(hits) else None


def summary_row(runs: list[dict], threshold: float = 0.9) -> list[str]:
    """Final metrics as 'mean ± std over seeds', how many seeds end with the best action as the policy's mode,
    and the steps to reach E_pi[r] >= threshold as 'min..max' over seeds ('never')."""
    cells = []
    for name in METRICS:
        finals = torch.stack([c[name][-1] for c in runs])
        std = finals.std().item() if len(runs) > 1 else 0.0
        cells.append(f"{finals.mean().item():.3f} ± {std:.3f}")
    cells.append(f"{sum(int(c['policy'][-1].argmax() == c['reward'].argmax()) for c in runs)}/{len(runs)}")
    hits = [steps_to_reach(c["expected_reward"], threshold) for c in runs]
    reached = sorted(h for h in hits if h is not None)
    if not reached:
        cells.append("never")
    else:
        last = str(reached[-1]) if len(reached) == len(hits) else f"never ({len(reached)}/{len(hits)} reached)"
        cells.append(f"{reached[0]}..{last}")
    return cells


def plot(results: dict, path: str) -> None:
    """Top row: E_pi[r] per landscape (mean over seeds, band min..max); bottom row: final policies (seed mean)."""
    import matplotlib
    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt
    landscapes = list(dict.fromkeys(k[0] for k in results))
    fig, axes = plt.subplots(2, len(landscapes), figsize=(4.2 * len(landscapes), 6.4), squeeze=False)
    for col, landscape in enumerate(landscapes):
        top, bottom = axes[0, col], axes[1, col]
        for i, algorithm in enumerate(ALGORITHMS):
            runs = results[landscape, algorithm]
            curves = torch.stack([c["expected_reward"] for c in runs])
            line, = top.plot(curves.mean(0), label=algorithm)
            top.fill_between(range(curves.shape[1]), curves.amin(0), curves.amax(0), alpha=0.2, color=line.get_color())
            final = torch.stack([c["policy"][-1] for c in runs]).mean(0)
            bottom.bar(torch.arange(1, 11) + (i - 1) * 0.27, final, width=0.27, label=algorithm)
        reward = results[landscape, ALGORITHMS[0]][0]["reward"]
        bottom.plot(range(1, 11), reward, "k.--", label="reward r(a)")
        top.set(title=f"{landscape}: E_pi[r]", xlabel="step", ylim=(0, 1.02))
        bottom.set(title=f"{landscape}: final pi(a)", xlabel="action a", xticks=range(1, 11), ylim=(0, 1.02))
    axes[0, 0].legend(fontsize=8, loc="lower right")
    axes[1, 0].legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def main():
    parser = argparse.ArgumentParser(description="GRPO vs REINFORCE vs REINFORCE with a baseline on a 10-armed bandit")
    parser.add_argument("--landscapes", nargs="+", choices=LANDSCAPES, default=list(LANDSCAPES))
    parser.add_argument("--peak", type=int, default=7, help="centre of the single peak, an action in 1..10")
    parser.add_argument("--group_size", type=int, default=8, help="actions sampled per step, every algorithm")
    parser.add_argument("--clip_eps", type=float, default=0.2)
    parser.add_argument("--beta", type=float, default=0.04, help="KL weight (grpo only)")
    parser.add_argument("--mu", type=int, default=1, help="grpo updates per sampled group")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--optimizer", choices=OPTIMIZERS, default="adam")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--seeds", type=int, default=5, help="runs per cell, seeds 0..N-1")
    parser.add_argument("--kl_estimator", choices=KL_ESTIMATORS, default="k3", help="grpo's KL term (grpo.py)")
    parser.add_argument("--kl_table", action="store_true", help="each KL estimator's distance to the optimum "
                        "(--betas, --seeds, --landscapes; 1000 steps, G 16, lr 0.02, RLOO advantages)")
    parser.add_argument("--betas", type=float, nargs="+", default=[0.3, 1.0], help="--kl_table's KL weights")
    parser.add_argument("--out", default="bandit.png")
    args = parser.parse_args()
    if args.seeds < 1:
        parser.error(f"--seeds must be >= 1, got {args.seeds}")
    if args.kl_table:
        start, table_run = time.time(), {"steps": 1000, "group_size": 16, "lr": 0.02}  # its own, as --help says
        print(f"GRPO, {args.seeds} seeds x {table_run['steps']} steps, G {table_run['group_size']}, Adam lr "
              f"{table_run['lr']}, RLOO advantages (no std scaling); the final policy; mean ± std over seeds")
        print("\n".join(kl_table(args.landscapes, args.betas, args.seeds, **table_run)))
        print(f"{time.time() - start:.1f} s")
        return
    hyper = {k: getattr(args, k) for k in ("steps", "group_size", "lr", "clip_eps", "beta", "mu", "optimizer", "peak",
                                           "kl_estimator")}
    start = time.time()
    results = {(landscape, algorithm): [run(landscape, algorithm, seed, **hyper) for seed in range(args.seeds)]
               for landscape in args.landscapes for algorithm in ALGORITHMS}
    print(f"{args.seeds} seeds x {args.steps} steps, {hyper}; mean ± std over seeds, steps to E_pi[r] >= 0.9 as "
          f"min..max over seeds")
    print("| landscape | algorithm | E_pi[r] | pi(best) | KL(pi ‖ pi_ref) | entropy | mode = best | steps to 0.9 |")
    print("|---|---|---|---|---|---|---|---|")
    for (landscape, algorithm), runs in results.items():
        print(f"| {landscape} | {algorithm} | " + " | ".join(summary_row(runs)) + " |")
    try:
        plot(results, args.out)
        print(f"wrote {args.out}")
    except ImportError:
        print("matplotlib is not installed: no figure (pip install matplotlib)")
    print(f"{time.time() - start:.1f} s")


if __name__ == "__main__":
    main()
