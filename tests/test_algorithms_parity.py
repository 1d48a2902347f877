"""Parity with verl's definitions (verl/trainer/ppo/core_algos.py): the aggregations, KL estimators and
advantage estimators on fixed inputs, against values computed here, in plain Python, from the published
definitions. The batch has padding, an empty response, a group of one and extreme log-ratios; where kuberl
differs on purpose (docs/reference/algorithms.md, "Where kuberl differs from verl"), the test says so.
Losses: tests/test_losses_parity.py."""

from __future__ import annotations

import math

import pytest
import torch

from kuberl.engine import algorithms as A

MASK = [[1, 1, 1, 1], [1, 1, 0, 0], [0, 0, 0, 0], [1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1]]  # row 2 empty, the rest padded
GROUP = [0, 0, 0, 1, 1, 2]  # group 2 is one sample
SCORES = [1.0, 0.0, 0.5, 2.0, -1.0, 3.0]
B, T = len(MASK), len(MASK[0])


def t(x) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.float32)


def near(actual: torch.Tensor, expected, tol: float = 1e-5) -> None:
    assert torch.allclose(actual.detach().float(), t(expected), atol=tol, rtol=tol), (actual, expected)


def lengths() -> list[int]:
    return [sum(row) for row in MASK]


def members(i: int) -> list[int]:
    return [j for j in range(B) if GROUP[j] == GROUP[i]]


def mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def std(xs: list[float]) -> float:  # unbiased, as torch.std
    m = mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def per_token(values: list[float]) -> list[list[float]]:
    return [[values[i] * MASK[i][k] for k in range(T)] for i in range(B)]


def whiten(x: list[list[float]]) -> list[list[float]]:
    flat = [x[i][k] for i in range(B) for k in range(T) if MASK[i][k]]
    m, s = mean(flat), std(flat)
    return [[(x[i][k] - m) / math.sqrt(s * s + 1e-8) * MASK[i][k] for k in range(T)] for i in range(B)]


def inputs(**more) -> A.AdvantageInputs:
    return A.AdvantageInputs(scores=t(SCORES), group=torch.tensor(GROUP), mask=t(MASK), **more)


# --- aggregation: verl's agg_loss on one rank ------------------------------------------------------------

LOSS = [[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 9.0, 9.0], [9.0, 9.0, 9.0, 9.0], [-1.0, 2.0, 0.5, 9.0], [7.0, 9.0, 9.0, 9.0], [0.0, 1.0, 0.0, 1.0]]


def ref_aggregate(mode: str, horizon: int | None = None) -> float:
    sums = [sum(LOSS[i][k] * MASK[i][k] for k in range(T)) for i in range(B)]
    nonempty = [i for i in range(B) if lengths()[i] > 0]
    if mode == "token_mean":
        return sum(sums) / sum(lengths())
    if mode == "token_sum":
        return sum(sums)
    if mode == "seq_mean_token_sum":
        return sum(sums[i] for i in nonempty) / len(nonempty)
    if mode == "seq_mean_token_mean":
        return sum(sums[i] / lengths()[i] for i in nonempty) / len(nonempty)
    return sum(sums) / len(nonempty) / (horizon or T)


@pytest.mark.parametrize("mode", ["token_mean", "token_sum", "seq_mean_token_sum", "seq_mean_token_mean", "seq_mean_token_sum_norm"])
def test_aggregation_is_verls_and_an_empty_row_weighs_nothing(mode: str) -> None:
    near(A.aggregate(t(LOSS), t(MASK), mode), ref_aggregate(mode))
    if mode == "seq_mean_token_sum_norm":  # verl's loss_scale_factor: a constant in place of the width
        near(A.aggregate(t(LOSS), t(MASK), mode, horizon=16), ref_aggregate(mode, 16))


# --- KL estimators: verl's kl_penalty -------------------------------------------------------------------------

LOGP = [-0.1, -2.0, -30.0, -0.5, -1.0]
REF = [-0.3, -1.0, -1.0, -25.0, -1.0]  # log-ratios 0.2, -1, -29 (extreme), 24.5 (extreme), 0


def ref_kl(name: str, lp: float, rf: float) -> float:
    x = lp - rf
    if name == "k1":
        return x
    if name == "abs":
        return abs(x)
    if name == "k2":
        return 0.5 * x * x
    neg = max(-20.0, min(20.0, rf - lp))
    return max(-10.0, min(10.0, math.exp(neg) - 1 - neg))


@pytest.mark.parametrize("name", ["k1", "k2", "k3", "abs"])
def test_kl_estimators_are_verls(name: str) -> None:
    near(A.kl_estimate(t(LOGP), t(REF), name), [ref_kl(name, lp, rf) for lp, rf in zip(LOGP, REF)], tol=1e-4)


def test_k3_is_clamped_to_ten_as_verl_does() -> None:
    # log-ratio -29: exp(20) - 1 - 20 without the clamp of the result (today's code gave far above 10).
    assert float(A.kl_estimate(t([-30.0]), t([-1.0]), "k3")[0]) == 10.0
    assert float(A.kl_estimate(t([-1.0]), t([-3.0]), "k3")[0]) == pytest.approx(math.exp(-2) - 1 + 2)


@pytest.mark.parametrize("name", ["k1+", "k3+", "abs+"])
def test_straight_through_estimators_have_their_value_and_k2s_gradient(name: str) -> None:
    logp = t(LOGP).requires_grad_()
    value = A.kl_estimate(logp, t(REF), name)
    near(value, [ref_kl(name[:-1], lp, rf) for lp, rf in zip(LOGP, REF)], tol=1e-4)
    value.sum().backward()
    near(logp.grad, [lp - rf for lp, rf in zip(LOGP, REF)])  # d/dx of x^2 / 2


# --- advantage estimators -------------------------------------------------------------------------------------


@pytest.mark.parametrize("normalize", [True, False])
def test_grpo_is_verls_and_a_group_of_one_gets_zero(normalize: bool) -> None:
    expected = []
    for i in range(B):
        g = [SCORES[j] for j in members(i)]
        if len(g) == 1:
            expected.append(0.0)  # verl: the raw score over 1 + eps; refused by min_samples = 2
        else:
            expected.append((SCORES[i] - mean(g)) / (std(g) + 1e-6) if normalize else SCORES[i] - mean(g))
    near(A.advantage_estimator("grpo").fn(inputs(), normalize_by_std=normalize).advantages, per_token(expected), tol=1e-4)


def test_rloo_is_verls_and_refuses_a_group_of_one() -> None:
    with pytest.raises(ValueError, match="at least 2"):
        A.advantage_estimator("rloo").fn(inputs())
    two = A.AdvantageInputs(scores=t(SCORES[:5]), group=torch.tensor(GROUP[:5]), mask=t(MASK[:5]))
    expected = [SCORES[i] - mean([SCORES[j] for j in members(i) if j != i]) for i in range(5)]
    near(A.advantage_estimator("rloo").fn(two).advantages, per_token(expected + [0.0])[:5])


def ref_returns(scores: list[float], gamma: float, kl: list[list[float]] | None = None) -> list[list[float]]:
    out = []
    for i in range(B):
        rewards = [0.0] * T
        if lengths()[i]:
            rewards[lengths()[i] - 1] = scores[i]
        rewards = [r - (kl[i][k] if kl else 0.0) for k, r in enumerate(rewards)]
        row, running = [0.0] * T, 0.0
        for k in reversed(range(T)):
            if MASK[i][k]:
                running = rewards[k] + gamma * running
                row[k] = running
        out.append(row)
    return out


@pytest.mark.parametrize("gamma", [1.0, 0.9])
def test_reinforce_pp_is_verls_whitened_return(gamma: float) -> None:
    out = A.advantage_estimator("reinforce_pp").fn(inputs(), baseline=False, gamma=gamma).advantages
    near(out, whiten(ref_returns(SCORES, gamma)), tol=1e-4)


def test_reinforce_pp_baseline_is_verls_and_a_group_of_one_keeps_its_score() -> None:
    centred = [SCORES[i] - (mean([SCORES[j] for j in members(i)]) if len(members(i)) > 1 else 0.0) for i in range(B)]
    near(A.advantage_estimator("reinforce_pp").fn(inputs(), baseline=True).advantages, whiten(per_token(centred)), tol=1e-4)


def test_remax_is_verls() -> None:
    greedy = [0.5, 0.5, 0.5, 1.0, 1.0, 2.0]
    expected = [[r - greedy[i] * MASK[i][k] for k, r in enumerate(row)] for i, row in enumerate(ref_returns(SCORES, 1.0))]
    near(A.advantage_estimator("remax").fn(inputs(greedy_scores=t(greedy))).advantages, expected)


def test_gae_is_verls_on_response_tokens() -> None:
    values = [[0.1 * (i + k) for k in range(T)] for i in range(B)]
    gamma, lam = 0.9, 0.8
    expected = []
    for i in range(B):
        rewards = [0.0] * T
        if lengths()[i]:
            rewards[lengths()[i] - 1] = SCORES[i]
        row, running, next_value = [0.0] * T, 0.0, 0.0
        for k in reversed(range(T)):
            if MASK[i][k]:
                running = rewards[k] + gamma * next_value - values[i][k] + gamma * lam * running
                next_value = values[i][k]
                row[k] = running
        expected.append(row)
    out = A.advantage_estimator("gae").fn(inputs(values=t(values)), gamma=gamma, lam=lam, whiten=False)
    near(out.advantages, expected)
    near(out.returns, [[(expected[i][k] + values[i][k]) * MASK[i][k] for k in range(T)] for i in range(B)])
    near(A.advantage_estimator("gae").fn(inputs(values=t(values)), gamma=gamma, lam=lam).advantages, whiten(expected), tol=1e-4)


def test_opo_is_verls_and_a_group_of_one_gets_zero() -> None:
    expected = []
    for i in range(B):
        g = members(i)
        baseline = sum(lengths()[j] * SCORES[j] for j in g) / sum(lengths()[j] for j in g)
        expected.append(0.0 if len(g) == 1 else SCORES[i] - baseline)  # verl: baseline 0 for a group of one
    near(A.advantage_estimator("opo").fn(inputs()).advantages, per_token(expected))


def test_gpg_scales_by_informative_samples_where_verl_counts_nonzero_rewards() -> None:
    scores = [1.0, 0.0, 1.0, 1.0, 1.0, 0.0]  # 0/1 rewards: group 1 all correct, group 2 one sample
    informative = [i for i in range(B) if len(members(i)) > 1 and std([scores[j] for j in members(i)]) > 0]
    ours = [(scores[i] - mean([scores[j] for j in members(i)])) * B / len(informative) for i in range(B)]
    out = A.advantage_estimator("gpg").fn(A.AdvantageInputs(scores=t(scores), group=torch.tensor(GROUP), mask=t(MASK))).advantages
    near(out, per_token([0.0 if len(members(i)) == 1 else a for i, a in enumerate(ours)]), tol=1e-4)
    # The documented difference: verl divides by the responses with a nonzero reward (4 here), not the informative 3.
    assert B / sum(1 for s in scores if s != 0) != B / len(informative)


@pytest.mark.parametrize("normalize", [True, False])
def test_grpo_passk_is_verls(normalize: bool) -> None:
    expected = [0.0] * B
    for g in set(GROUP):
        rows = [j for j in range(B) if GROUP[j] == g]
        if len(rows) < 2:
            continue  # verl refuses a group of one; kuberl gives it 0
        best = max(rows, key=lambda j: SCORES[j])
        second = sorted((SCORES[j] for j in rows), reverse=True)[1]
        margin = SCORES[best] - second
        expected[best] = margin / (std([SCORES[j] for j in rows]) + 1e-6) if normalize else margin
    near(A.advantage_estimator("grpo_passk").fn(inputs(), normalize_by_std=normalize).advantages, per_token(expected), tol=1e-4)


def ref_gdpo(parts: dict[str, list[float]], weights: dict[str, float], normalize: bool = True) -> list[list[float]]:
    """verl's compute_gdpo_outcome_advantage: each source through verl's GRPO (a group of one has mean 0
    and std 1, so its sample keeps its raw score), their weighted sum, masked_whiten over the tokens."""
    total = [0.0] * B
    for name, v in parts.items():
        for i in range(B):
            g = [v[j] for j in members(i)]
            mu, sigma = (0.0, 1.0) if len(g) == 1 else (mean(g), std(g))
            total[i] += weights.get(name, 1.0) * ((v[i] - mu) / (sigma + 1e-6) if normalize else v[i] - mu)
    return whiten(per_token(total))


def zero_singletons(x: list[list[float]]) -> list[list[float]]:
    """kuberl's one difference: a group of one gets advantage 0, set after verl's whitening."""
    return [[0.0 if len(members(i)) == 1 else x[i][k] for k in range(T)] for i in range(B)]


@pytest.mark.parametrize("normalize", [True, False])
def test_gdpo_normalises_each_source_apart_then_whitens(normalize: bool) -> None:
    parts = {"math": [1.0, 0.0, 1.0, 1.0, 0.0, 1.0], "format": [0.2, 0.4, 0.4, 0.1, 0.3, 0.5]}
    weights = {"math": 1.0, "format": 0.5}
    gdpo = A.advantage_estimator("gdpo").fn
    out = gdpo(inputs(reward_parts={k: t(v) for k, v in parts.items()}, reward_weights=weights), normalize_by_std=normalize).advantages
    expected = zero_singletons(ref_gdpo(parts, weights, normalize))
    near(out, expected, tol=1e-4)
    # One source: verl's GRPO whitened over the batch.
    near(gdpo(inputs(), normalize_by_std=normalize).advantages, zero_singletons(ref_gdpo({"reward": SCORES}, {}, normalize)), tol=1e-4)


def test_gdpo_singleton_enters_the_whitening_with_verls_value() -> None:
    """The group of one (row 5) is zeroed after the whitening, not before: zeroing it before would
    change the whitening's mean and std, and so every other sample's advantage."""
    parts = {"math": [1.0, 0.0, 1.0, 1.0, 0.0, 4.0]}
    out = A.advantage_estimator("gdpo").fn(inputs(reward_parts={"math": t(parts["math"])}, reward_weights={})).advantages
    after = zero_singletons(ref_gdpo(parts, {}))
    before = zero_singletons(ref_gdpo({"math": [v if len(members(i)) > 1 else 0.0 for i, v in enumerate(parts["math"])]}, {}))
    assert max(abs(a - b) for ra, rb in zip(after, before) for a, b in zip(ra, rb)) > 0.1  # the example tells them apart
    near(out, after, tol=1e-5)


PROBS = [
    [0.5, 0.2, 0.9, 0.4],
    [0.3, 0.6, 0.5, 0.5],
    [0.5, 0.5, 0.5, 0.5],
    [0.8, 0.1, 0.7, 0.5],
    [0.6, 0.5, 0.5, 0.5],
    [0.25, 0.5, 0.75, 0.9],
]
SQUARES = [
    [0.4, 0.3, 0.85, 0.3],
    [0.2, 0.5, 0.4, 0.4],
    [0.3, 0.3, 0.3, 0.3],
    [0.7, 0.05, 0.6, 0.4],
    [0.45, 0.3, 0.3, 0.3],
    [0.2, 0.35, 0.6, 0.82],
]


@pytest.mark.parametrize("tail", [False, True])
def test_optimal_token_baseline_is_verls(tail: bool) -> None:
    returns = ref_returns(SCORES, 1.0)
    weights = []
    for i in range(B):
        row, total = [], 0.0
        for k in range(T):
            total += (1 - 2 * PROBS[i][k] + SQUARES[i][k]) * MASK[i][k]
            row.append(total)
        weights.append(row)
    expected = [[0.0] * T for _ in range(B)]
    for i in range(B):
        rows = members(i)
        for k in range(T):
            if not MASK[i][k]:
                continue
            baseline = 0.0
            if len(rows) > 1:
                num = sum(returns[j][k] * weights[j][k] * MASK[j][k] for j in rows)
                baseline = num / (sum(weights[j][k] * MASK[j][k] for j in rows) + 1e-8)
                ordered = sorted(lengths()[j] for j in rows)
                longest = [j for j in rows if lengths()[j] == ordered[-1]]
                if tail and len(longest) == 1 and longest[0] == i and ordered[-1] > ordered[-2] and k >= ordered[-2]:
                    baseline = 0.0
            expected[i][k] = returns[i][k] - baseline
    out = A.advantage_estimator("optimal_token_baseline").fn(
        inputs(old_logprobs=torch.log(t(PROBS)), sum_pi_squared=t(SQUARES)), handle_zero_tail=tail
    )
    near(out.advantages, expected, tol=1e-4)
    # Contiguous responses: the TIR variant aligns them alike (it takes the empty response out of its group).
    tir = A.advantage_estimator("tir_optimal_token_baseline").fn(
        inputs(old_logprobs=torch.log(t(PROBS)), sum_pi_squared=t(SQUARES)), handle_zero_tail=tail
    )
    near(tir.advantages, expected, tol=1e-4)
