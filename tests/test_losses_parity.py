"""Parity of the policy losses with verl's definitions (verl/trainer/ppo/core_algos.py), on fixed inputs,
against values computed here in plain Python from the published definitions: padding holding junk, an
empty response, clipped tokens and log-ratios of ±25 (past the ±20 clamp). Differences on purpose are
listed in docs/reference/algorithms.md and asserted as such here."""

from __future__ import annotations

import math

import pytest
import torch

from kuberl.engine import algorithms as A

MASK = [[1, 1, 1, 1], [1, 1, 0, 0], [0, 0, 0, 0], [1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1]]
LOGP = [
    [-0.5, -1.2, -0.01, -2.0],
    [-0.3, -0.9, -7.0, -7.0],
    [-7.0, -7.0, -7.0, -7.0],
    [-26.0, -0.7, -0.2, -7.0],
    [-1.1, -7.0, -7.0, -7.0],
    [-0.05, -0.6, -0.4, -0.1],
]
DELTA = [
    [0.1, -0.3, 25.0, 0.0],
    [0.5, -0.05, 3.0, 3.0],
    [3.0, 3.0, 3.0, 3.0],
    [-25.0, 0.2, 1.0, 3.0],
    [0.3, 3.0, 3.0, 3.0],
    [0.0, -0.4, 0.25, 2.0],
]  # log p - log p_old; padding holds junk
OLD = [[lp - d for lp, d in zip(r1, r2)] for r1, r2 in zip(LOGP, DELTA)]
ADV = [
    [1.0, -1.0, 0.5, 2.0],
    [-2.0, 0.5, 9.0, 9.0],
    [9.0, 9.0, 9.0, 9.0],
    [-1.0, 1.5, -0.3, 9.0],
    [0.7, 9.0, 9.0, 9.0],
    [0.0, -1.2, 0.8, -0.6],
]  # the ±25 log-ratios are clipped where a loss clips, so that no token drowns the others
# Without the ±25 log-ratios: for the losses that do not clip, where one such token would be the whole loss.
MODERATE = [[lp - (0.4 if abs(d) > 20 else d) for lp, d in zip(r1, r2)] for r1, r2 in zip(LOGP, DELTA)]
B, T = len(MASK), len(MASK[0])
LENGTHS = [sum(row) for row in MASK]
NONEMPTY = [i for i in range(B) if LENGTHS[i]]


def t(x) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.float32)


def inputs(**more) -> A.LossInputs:
    fields = {"logprobs": t(LOGP).requires_grad_(), "old_logprobs": t(OLD), "advantages": t(ADV), "mask": t(MASK), **more}
    return A.LossInputs(**fields)


def ratio(i: int, k: int, old: list[list[float]] = OLD) -> float:
    return math.exp(max(-20.0, min(20.0, LOGP[i][k] - old[i][k])))


def agg(per_token, mode: str = "token_mean") -> float:
    """verl's agg_loss on one rank over a per-token function f(i, k)."""
    sums = [sum(per_token(i, k) for k in range(T) if MASK[i][k]) for i in range(B)]
    if mode == "token_mean":
        return sum(sums) / sum(LENGTHS)
    if mode == "token_sum":
        return sum(sums)
    if mode == "seq_mean_token_mean":
        return sum(sums[i] / LENGTHS[i] for i in NONEMPTY) / len(NONEMPTY)
    return sum(sums[i] for i in NONEMPTY) / len(NONEMPTY)  # seq_mean_token_sum


def check(name: str, expected: float, tol: float = 1e-4, old: list[list[float]] = OLD, **options) -> A.LossInputs:
    x = inputs(old_logprobs=t(old))
    loss, stats = A.policy_loss_entry(name).fn(x, **options)
    assert float(loss.detach()) == pytest.approx(expected, rel=tol, abs=tol), (name, options)
    assert all(math.isfinite(float(v)) for v in stats.values())
    return x


def ppo_token(i: int, k: int, lo: float = 0.2, hi: float = 0.2, c: float | None = None) -> float:
    r, a = ratio(i, k), ADV[i][k]
    loss = max(-a * r, -a * min(max(r, 1 - lo), 1 + hi))
    return min(loss, -c * a) if c is not None and a < 0 else loss


@pytest.mark.parametrize("mode", ["token_mean", "token_sum", "seq_mean_token_sum", "seq_mean_token_mean"])
def test_ppo_clip_is_verls_vanilla(mode: str) -> None:
    check("ppo_clip", agg(ppo_token, mode), aggregation=mode)
    check("ppo_clip", agg(lambda i, k: ppo_token(i, k, 0.2, 0.28, 3.0), mode), clip_high=0.28, dual_clip=3.0, aggregation=mode)


def test_ppo_clip_gives_clipped_tokens_no_gradient() -> None:
    x = check("ppo_clip", agg(ppo_token))
    A.policy_loss_entry("ppo_clip").fn(x)[0].backward()
    for i in NONEMPTY:
        for k in range(T):
            if MASK[i][k] and ppo_token(i, k) != -ADV[i][k] * ratio(i, k):
                assert float(x.logprobs.grad[i, k]) == 0.0  # clipped: the constant side of the max


def test_importance_weights_weigh_each_tokens_loss_as_verls_rollout_weights() -> None:
    w = [[0.5 + 0.1 * (i + k) for k in range(T)] for i in range(B)]
    loss, _ = A.policy_loss_entry("ppo_clip").fn(inputs(is_weights=t(w)))
    assert float(loss.detach()) == pytest.approx(agg(lambda i, k: ppo_token(i, k) * w[i][k]), rel=1e-4)


def test_gspo_is_verls() -> None:
    def token(i: int, k: int, lo: float = 3e-4, hi: float = 4e-4) -> float:
        s = math.exp(min(sum(LOGP[i][j] - OLD[i][j] for j in range(T) if MASK[i][j]) / LENGTHS[i], 10.0))
        a = ADV[i][k]
        return max(-a * s, -a * min(max(s, 1 - lo), 1 + hi))

    check("gspo", agg(token, "seq_mean_token_mean"))
    # With algorithm.tis, each token's loss is weighed before the aggregation, as verl's rollout_is_weights.
    w = [[0.5 + 0.1 * (i + k) for k in range(T)] for i in range(B)]
    loss, _ = A.policy_loss_entry("gspo").fn(inputs(is_weights=t(w)))
    assert float(loss.detach()) == pytest.approx(agg(lambda i, k: token(i, k) * w[i][k], "seq_mean_token_mean"), rel=1e-4)


def test_the_gspo_preset_aggregates_by_response_whatever_loss_aggregation_says() -> None:
    from kuberl.engine.config.algorithm import AlgorithmSpec

    choice = A.choice_of(AlgorithmSpec.model_validate({"name": "gspo", "lossAggregation": "token_sum"}))
    assert choice.policy_loss == "gspo" and "aggregation" not in choice.policy_loss_options
    assert A.policy_loss_entry("gspo").options["aggregation"] == "seq_mean_token_mean"


def test_gspo_past_the_clamp_has_no_gradient_as_in_verl() -> None:
    logp = t([[12.0, 12.0]]).requires_grad_()  # sequence log-ratio 12 > 10, advantage negative: the unclipped side
    loss, _ = A.policy_loss_entry("gspo").fn(A.LossInputs(logp, t([[0.0, 0.0]]), t([[-1.0, -1.0]]), t([[1.0, 1.0]])))
    loss.backward()
    assert float(loss.detach()) == pytest.approx(math.exp(10.0)) and torch.count_nonzero(logp.grad) == 0


@pytest.mark.parametrize("clip_low", [None, 0.2])
def test_cispo_is_verls_with_its_lower_bound(clip_low: float | None) -> None:
    def weight(i: int, k: int) -> float:
        return min(max(ratio(i, k), -math.inf if clip_low is None else 1 - clip_low), 1 + 5.0)

    x = check("cispo", agg(lambda i, k: -weight(i, k) * ADV[i][k] * LOGP[i][k]), clip_low=clip_low)
    A.policy_loss_entry("cispo").fn(x, clip_low=clip_low)[0].backward()
    assert float(x.logprobs.grad[3, 0]) == pytest.approx(weight(3, 0) / sum(LENGTHS))  # -(-w · A) / N with A = -1


def test_gpg_and_dro_are_verls() -> None:
    check("gpg", agg(lambda i, k: -ADV[i][k] * LOGP[i][k]))
    beta = 0.3  # DRO's log-ratio is not clamped (a quadratic needs no exp)
    check("dro", agg(lambda i, k: -(LOGP[i][k] * ADV[i][k] - 0.5 * beta * (LOGP[i][k] - OLD[i][k]) ** 2)), beta=beta)


def test_sapo_is_verls_with_its_fixed_aggregation_the_default() -> None:
    def token(i: int, k: int) -> float:
        a, tau = ADV[i][k], 1.0 if ADV[i][k] > 0 else 1.05
        return -(4 / tau) / (1 + math.exp(-tau * (ratio(i, k) - 1))) * a

    check("sapo", agg(token, "seq_mean_token_mean"))
    check("sapo", agg(token, "token_mean"), aggregation="token_mean")  # honoured here; verl ignores it


def test_gmpo_is_verls_geo_mean() -> None:
    per_row = []
    for i in range(B):
        total, adv = 0.0, 0.0
        for k in range(T):
            if MASK[i][k]:
                lr, a = max(-20.0, min(20.0, LOGP[i][k] - OLD[i][k])), ADV[i][k]
                sign = (a > 0) - (a < 0)
                total += sign * min(sign * lr, sign * max(-0.4, min(0.4, lr)))
                adv += a
        n = LENGTHS[i] + 1e-8
        per_row.append(-(adv / n) * math.exp(total / n))
    check("gmpo", sum(per_row) / B)


def dppo(i: int, k: int, kind: str, lo: float = 0.2, hi: float = 0.2, cap: float = 20.0) -> float:
    p, po, a = math.exp(LOGP[i][k]), math.exp(OLD[i][k]), ADV[i][k]
    if kind == "tv":
        keep = p - po <= hi if a > 0 else p - po >= -lo
    else:
        d = po * (OLD[i][k] - LOGP[i][k]) + (1 - po) * math.log((1 - po + 1e-8) / (1 - p + 1e-8))
        keep = (d <= hi or p <= po) if a > 0 else (d <= lo or p >= po)
    return -a * min(ratio(i, k), cap) * LOGP[i][k] if keep else 0.0


@pytest.mark.parametrize("kind", ["tv", "kl"])
def test_dppo_is_verls(kind: str) -> None:
    check(f"dppo_{kind}", agg(lambda i, k: dppo(i, k, kind)))
    check(f"dppo_{kind}", agg(lambda i, k: dppo(i, k, kind, 0.05, 0.1, 3.0)), clip_low=0.05, clip_high=0.1, truncation=3.0)
    assert any(dppo(i, k, kind) == 0.0 and ADV[i][k] != 0 for i in NONEMPTY for k in range(T) if MASK[i][k])  # some dropped


def cov_terms() -> dict[tuple[int, int], float]:
    tokens = [(i, k) for i in range(B) for k in range(T) if MASK[i][k]]
    ma = sum(ADV[i][k] for i, k in tokens) / len(tokens)
    ml = sum(LOGP[i][k] for i, k in tokens) / len(tokens)
    return {(i, k): (ADV[i][k] - ma) * (LOGP[i][k] - ml) for i, k in tokens}


def test_clip_cov_is_verls_and_never_spends_its_budget_on_clipped_tokens() -> None:
    cov, low, high = cov_terms(), 0.0, 50.0
    clipped = {key for key in cov if ppo_token(*key) != -ADV[key[0]][key[1]] * ratio(*key)}
    eligible = {key for key, c in cov.items() if low < c < high and key not in clipped}
    assert clipped and eligible and any(low < cov[key] < high for key in clipped)  # today's code could choose those
    fraction = len(eligible) / len(cov) + 1e-6  # a budget of all eligible tokens: verl's random draw takes them all too
    check("clip_cov", agg(lambda i, k: 0.0 if (i, k) in eligible else ppo_token(i, k)), fraction=fraction, cov_low=low, cov_high=high)


def test_kl_cov_counts_its_budget_over_response_tokens_not_padding() -> None:
    cov = cov_terms()
    k = max(1, int(0.25 * len(cov)))  # verl: max(1, int(fraction * valid tokens)) = 3 here; over all B·T positions it was 6
    held = sorted(cov, key=cov.get, reverse=True)[:k]
    check(
        "kl_cov",
        agg(lambda i, j: -ADV[i][j] * ratio(i, j, MODERATE) + (abs(LOGP[i][j] - MODERATE[i][j]) if (i, j) in held else 0.0)),
        old=MODERATE,
        fraction=0.25,
    )


@pytest.mark.parametrize("level", ["token", "sequence", "none"])
def test_bypass_reinforce_is_verls(level: str) -> None:
    rollout = OLD  # the rollout's log-probs stand for the old policy's

    def weight(i: int, k: int) -> float:
        if level == "none":
            return 1.0
        lr = LOGP[i][k] - rollout[i][k] if level == "token" else sum(LOGP[i][j] - rollout[i][j] for j in range(T) if MASK[i][j])
        return min(math.exp(max(-20.0, min(20.0, lr))), 2.0)

    x = inputs(rollout_logprobs=t(rollout), old_logprobs=t(LOGP))  # the recomputed old log-probs are not used
    loss, _ = A.policy_loss_entry("bypass").fn(x, loss_type="reinforce", rollout_is=level)
    assert float(loss.detach()) == pytest.approx(agg(lambda i, k: -ADV[i][k] * LOGP[i][k] * weight(i, k)), rel=1e-4)


def test_bypass_ppo_clip_is_ppo_against_the_rollout() -> None:
    loss, _ = A.policy_loss_entry("bypass").fn(inputs(rollout_logprobs=t(OLD), old_logprobs=t(LOGP)))
    assert float(loss.detach()) == pytest.approx(agg(ppo_token), rel=1e-4)


@pytest.mark.parametrize("mode", ["token_mean", "token_sum", "seq_mean_token_sum", "seq_mean_token_mean"])
def test_bypass_ppo_clip_has_verls_dual_clip(mode: str) -> None:
    """verl's bypass mode hands ppo_clip to its vanilla loss, dual clip (clip_ratio_c) included:
    where A < 0 the token's loss is at most -c·A."""
    x = inputs(rollout_logprobs=t(OLD), old_logprobs=t(LOGP))
    loss, stats = A.policy_loss_entry("bypass").fn(x, clip_high=0.28, dual_clip=3.0, aggregation=mode)
    expected = agg(lambda i, k: ppo_token(i, k, 0.2, 0.28, 3.0), mode)
    assert expected != pytest.approx(agg(lambda i, k: ppo_token(i, k, 0.2, 0.28), mode), rel=1e-3)  # the cap bites here
    assert float(loss.detach()) == pytest.approx(expected, rel=1e-4)
    # verl's pg_clipfrac_lower: the tokens with A < 0 whose clipped loss was above -c·A, over the tokens.
    capped = [ADV[i][k] < 0 and ppo_token(i, k, 0.2, 0.28) > -3.0 * ADV[i][k] for i in range(B) for k in range(T) if MASK[i][k]]
    assert float(stats["clip_fraction_lower"]) == pytest.approx(sum(capped) / len(capped))
    with pytest.raises(ValueError, match="dual_clip must be > 1"):
        A.policy_loss_entry("bypass").fn(x, dual_clip=1.0)


def test_dpo_over_row_pairs_is_the_published_loss() -> None:
    ref = [[lp - 0.1 * (i + 1) for lp in row] for i, row in enumerate(LOGP)]
    seq = [sum(LOGP[i][k] for k in range(T) if MASK[i][k]) for i in range(B)]
    rseq = [sum(ref[i][k] for k in range(T) if MASK[i][k]) for i in range(B)]
    margins = [0.1 * ((seq[2 * p] - rseq[2 * p]) - (seq[2 * p + 1] - rseq[2 * p + 1])) for p in range(B // 2)]
    expected = sum(-0.9 * math.log(1 / (1 + math.exp(-m))) - 0.1 * math.log(1 / (1 + math.exp(m))) for m in margins) / len(margins)
    loss, stats = A.policy_loss_entry("dpo").fn(inputs(ref_logprobs=t(ref)), beta=0.1, label_smoothing=0.1)
    assert float(loss.detach()) == pytest.approx(expected, rel=1e-5) and float(stats["reward_margin"]) == pytest.approx(
        sum(margins) / 3, rel=1e-5
    )
