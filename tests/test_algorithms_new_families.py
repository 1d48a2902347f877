"""The families added after verl's registries, on values worked out by hand in the comments: the optimal
token baseline and its TIR variant, GDPO, DPPO (TV and KL), DRO, the bypass mode, CISPO's lower bound,
REINFORCE++'s gamma, the token_sum aggregation and the loss scale factor, the abs and straight-through KLs."""

from __future__ import annotations

import math

import pytest
import torch

from kuberl.engine import algorithms as A
from kuberl.engine.training.loss_scale import UpdateTotals
from kuberl.engine.training.sequences import pack


def t(x) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.float32)


def otb_inputs(mask, scores, probs, squares, group) -> A.AdvantageInputs:
    return A.AdvantageInputs(
        scores=t(scores), group=torch.tensor(group), mask=t(mask), old_logprobs=torch.log(t(probs)), sum_pi_squared=t(squares)
    )


# Two responses to one prompt (lengths 2 and 3, scores 1 and 2) and one alone (score 3).
# w = 1 - 2 pi + S: row 0 [0.5, 0.8], row 1 [0.5, 0.5, 0.1]; W (cumulative): row 0 [0.5, 1.3], row 1 [0.5, 1.0, 1.1].
# Returns-to-go: row 0 [1, 1], row 1 [2, 2, 2]. B_t = sum_i G W / sum_i W over the rows present at t:
# B_0 = (0.5 + 1.0) / 1.0 = 1.5; B_1 = (1.3 + 2.0) / 2.3 = 33/23; B_2 = 2.2 / 1.1 = 2 (row 1 alone).
OTB = (
    [[1, 1, 0], [1, 1, 1], [1, 0, 0]],
    [1.0, 2.0, 3.0],
    [[0.5, 0.25, 0.5], [0.5, 0.5, 0.8], [0.9, 0.5, 0.5]],
    [[0.5, 0.3, 0.5], [0.5, 0.5, 0.7], [0.8, 0.5, 0.5]],
    [0, 0, 1],
)


def test_optimal_token_baseline_on_hand_computed_values() -> None:
    out = A.advantage_estimator("optimal_token_baseline").fn(otb_inputs(*OTB))
    b1 = 3.3 / 2.3
    expected = [[1 - 1.5, 1 - b1, 0.0], [2 - 1.5, 2 - b1, 0.0], [3.0, 0.0, 0.0]]  # a group of one: no baseline
    assert torch.allclose(out.advantages, t(expected), atol=1e-5)
    assert torch.allclose(out.returns, t([[1, 1, 0], [2, 2, 2], [3, 0, 0]]))
    # handleZeroTail: row 1 is the only one past length 2, so its third token has baseline 0 (advantage 2).
    tail = A.advantage_estimator("optimal_token_baseline").fn(otb_inputs(*OTB), handle_zero_tail=True).advantages
    assert float(tail[1, 2]) == pytest.approx(2.0) and torch.allclose(tail[:, :2], out.advantages[:, :2])
    # Uniform importance weights scale every W alike: the baselines do not move.
    weighted = (
        A.advantage_estimator("optimal_token_baseline")
        .fn(A.AdvantageInputs(**{**otb_inputs(*OTB).__dict__, "is_weights": torch.full((3, 3), 2.0)}))
        .advantages
    )
    assert torch.allclose(weighted, out.advantages, atol=1e-5)


def test_tir_optimal_token_baseline_aligns_each_responses_own_tokens() -> None:
    # Row 0's second position is a tool's output (masked): its tokens are positions 0 and 2. Aligned by own
    # tokens both rows have two, with the same W and returns as above: baselines 1.5 and 33/23 at positions 0, 1.
    mask, probs = [[1, 0, 1], [1, 1, 0], [0, 0, 0]], [[0.5, 0.9, 0.25], [0.5, 0.5, 0.9], [0.5, 0.5, 0.5]]
    squares = [[0.5, 0.9, 0.3], [0.5, 0.5, 0.9], [0.5, 0.5, 0.5]]
    out = A.advantage_estimator("tir_optimal_token_baseline").fn(otb_inputs(mask, [1.0, 2.0, 5.0], probs, squares, [0, 0, 1]))
    b1 = 3.3 / 2.3
    assert torch.allclose(out.advantages, t([[-0.5, 0.0, 1 - b1], [0.5, 2 - b1, 0.0], [0.0, 0.0, 0.0]]), atol=1e-5)
    # By position, OTB would compare row 0's second token with row 1's second: another baseline.
    by_position = A.advantage_estimator("optimal_token_baseline").fn(otb_inputs(mask, [1.0, 2.0, 5.0], probs, squares, [0, 0, 1]))
    assert not torch.allclose(by_position.advantages, out.advantages)


def test_gdpo_weighs_each_sources_normalised_reward() -> None:
    # One prompt, two samples. math [1, 0] -> GRPO (+-0.5 / 0.7071) = +-0.7071; format [0.2, 0.6] -> -+0.7071.
    # Weights 1 and 0.5: A = [0.7071 - 0.3536, -0.7071 + 0.3536] = +-0.3536, whitened over 2 tokens (std 0.5) -> +-0.7071.
    parts = {"math": t([1.0, 0.0]), "format": t([0.2, 0.6])}
    inputs = A.AdvantageInputs(
        scores=t([1.1, 0.3]),
        group=torch.tensor([0, 0]),
        mask=torch.ones(2, 1),
        reward_parts=parts,
        reward_weights={"math": 1.0, "format": 0.5},
    )
    assert torch.allclose(A.advantage_estimator("gdpo").fn(inputs).advantages, t([[0.7071], [-0.7071]]), atol=1e-3)
    # A weight of 2 on format reverses the sign: the weaker source is not drowned by the stronger's scale.
    flipped = A.AdvantageInputs(**{**inputs.__dict__, "reward_weights": {"math": 1.0, "format": 2.0}})
    assert float(A.advantage_estimator("gdpo").fn(flipped).advantages[0, 0]) < 0


def test_reinforce_pp_gamma_discounts_the_return() -> None:
    # One response of 3 tokens, score 1 on the last: returns [0.81, 0.9, 1]; whitened (mean 0.9033, std 0.0950).
    out = (
        A.advantage_estimator("reinforce_pp")
        .fn(A.AdvantageInputs(scores=t([1.0]), group=torch.tensor([0]), mask=torch.ones(1, 3)), gamma=0.9)
        .advantages
    )
    returns = [0.81, 0.9, 1.0]
    m = sum(returns) / 3
    s = math.sqrt(sum((r - m) ** 2 for r in returns) / 2)
    assert torch.allclose(out, t([[(r - m) / s for r in returns]]), atol=1e-4)


def loss_inputs(logp, old, adv, **more) -> A.LossInputs:
    return A.LossInputs(t(logp).requires_grad_(), t(old), t(adv), torch.ones(len(logp), len(logp[0])), **more)


def test_dppo_tv_drops_tokens_whose_probability_moved_too_far() -> None:
    # p_old 0.5 -> p 0.8 (+0.3 > 0.2) with A > 0: dropped; 0.5 -> 0.6 (+0.1): kept, loss -A·(0.6/0.5)·log 0.6.
    logp, old = [[math.log(0.8), math.log(0.6)]], [[math.log(0.5), math.log(0.5)]]
    loss, stats = A.policy_loss_entry("dppo_tv").fn(loss_inputs(logp, old, [[1.0, 1.0]]))
    assert float(loss.detach()) == pytest.approx(-1.2 * math.log(0.6) / 2) and float(stats["clip_fraction"]) == 0.5


def test_dppo_kl_bounds_only_a_move_in_the_advantages_direction() -> None:
    # p_old 0.5 -> p 0.8: binary KL 0.5 ln(0.5/0.8) + 0.5 ln(0.5/0.2) = 0.2231 > 0.2. With A > 0 the move is in its
    # direction: dropped. With A < 0 (p rose against it) kept: loss -(-1)·min(1.6, 20)·log 0.8.
    logp, old = [[math.log(0.8)]], [[math.log(0.5)]]
    dropped, _ = A.policy_loss_entry("dppo_kl").fn(loss_inputs(logp, old, [[1.0]]))
    kept, _ = A.policy_loss_entry("dppo_kl").fn(loss_inputs(logp, old, [[-1.0]]))
    assert float(dropped.detach()) == 0.0 and float(kept.detach()) == pytest.approx(1.6 * math.log(0.8))


def test_dro_penalises_the_squared_log_ratio() -> None:
    # log p -1, log p_old -1.5, A 2, beta 0.4: -(2·(-1) - 0.2·0.25) = 2.05; gradient -(A - beta·0.5) = -1.8.
    x = loss_inputs([[-1.0]], [[-1.5]], [[2.0]])
    loss, _ = A.policy_loss_entry("dro").fn(x, beta=0.4)
    loss.backward()
    assert float(loss.detach()) == pytest.approx(2.05) and float(x.logprobs.grad) == pytest.approx(-1.8)


def test_bypass_reinforce_weighs_by_the_truncated_ratio_to_the_rollout() -> None:
    # log p -1 against vLLM's -1.5 and -0.5: ratios e^0.5 = 1.6487 and e^-0.5 = 0.6065 (cap 2); A = 1:
    # loss = mean(-w · log p) = (1.6487 + 0.6065) / 2.
    x = loss_inputs([[-1.0, -1.0]], [[-9.0, -9.0]], [[1.0, 1.0]], rollout_logprobs=t([[-1.5, -0.5]]))
    loss, _ = A.policy_loss_entry("bypass").fn(x, loss_type="reinforce")
    assert float(loss.detach()) == pytest.approx((math.exp(0.5) + math.exp(-0.5)) / 2, rel=1e-5)
    with pytest.raises(ValueError, match="needs the rollout's log-probs"):
        A.policy_loss_entry("bypass").fn(loss_inputs([[-1.0]], [[-1.0]], [[1.0]]))


@pytest.mark.parametrize(
    "loss_type, aggregation, expected",
    [
        # log p -1 against vLLM's [-1.5, -0.2, -1.0]: ratios e^0.5 (kept), e^-0.8 = 0.449 (outside [0.5, 2]: rejected), 1 (kept).
        ("reinforce", "token_mean", 2 / 3),  # -A log p = 1 on the two kept tokens, over all three tokens
        ("reinforce", "seq_mean_token_mean", 1.0),  # the response's mean over its kept tokens
        ("ppo_clip", "token_mean", (-1.2 - 1.0) / 3),  # -min(r A, clip(r) A): e^0.5 clipped to 1.2, then 1
    ],
)
def test_bypass_token_rejection_drops_a_token_from_the_numerator_only(loss_type, aggregation, expected) -> None:
    x = loss_inputs([[-1.0, -1.0, -1.0]], [[-9.0] * 3], [[1.0] * 3], rollout_logprobs=t([[-1.5, -0.2, -1.0]]))
    loss, stats = A.policy_loss_entry("bypass").fn(
        x, loss_type=loss_type, rollout_is="none", rollout_rs="token_k1", rs_threshold=2.0, aggregation=aggregation
    )
    assert float(loss.detach()) == pytest.approx(expected, rel=1e-5)
    assert float(stats["rs_kept_fraction"]) == pytest.approx(2 / 3)


@pytest.mark.parametrize(
    "mode, threshold",
    [
        # Row 0: log-ratios [0.5, -0.5]; row 1: [2, 0].
        ("seq_mean_k3", 1.0),  # k3 means: (0.1487 + 0.1065) / 2 = 0.128 kept; (e^2 - 3 + 0) / 2 = 2.19 rejected
        ("seq_max_k2", 1.0),  # k2 maxima: 0.125 kept; 2.0 rejected
        ("seq_sum_k1", 2.0),  # k1 = -l summed: 0 kept; -2, past log 2 = 0.69, rejected
    ],
)
def test_bypass_sequence_rejection_drops_whole_responses(mode, threshold) -> None:
    x = loss_inputs([[-1.0, -1.0], [-1.0, -1.0]], [[-9.0] * 2] * 2, [[1.0] * 2] * 2, rollout_logprobs=t([[-1.5, -0.5], [-3.0, -1.0]]))
    loss, stats = A.policy_loss_entry("bypass").fn(
        x, loss_type="reinforce", rollout_is="none", rollout_rs=mode, rs_threshold=threshold, aggregation="seq_mean_token_mean"
    )
    # Row 0's mean of -A log p is 1, row 1 adds nothing, and both rows count: 1 / 2.
    assert float(loss.detach()) == pytest.approx(0.5, rel=1e-5) and float(stats["rs_kept_fraction"]) == 0.5


@pytest.mark.parametrize(
    "level, logp, rollout",
    [
        # token: ratios e^0.5 and e^-0.5; sequence: e^(0.2 + 0.2) and e^(-0.3 - 0.3), one per response. Either way
        # the two weights stand in the ratio e : 1, and normalised to mean 1 they are 2 / (1 + e^-1) and 2 / (1 + e).
        ("token", [[-1.0, -1.0]], [[-1.5, -0.5]]),
        ("sequence", [[-1.0, -1.0], [-1.0, -1.0]], [[-1.2, -1.2], [-0.7, -0.7]]),
    ],
)
def test_bypass_batch_normalisation_gives_the_weights_mean_one(level, logp, rollout) -> None:
    adv = [[1.0, 0.0]] if level == "token" else [[1.0, 1.0], [0.0, 0.0]]
    x = loss_inputs(logp, [[-9.0] * 2] * len(logp), adv, rollout_logprobs=t(rollout))
    fn = A.policy_loss_entry("bypass").fn
    loss, stats = fn(x, loss_type="reinforce", rollout_is=level, is_batch_normalize=True)
    # Only the first weight meets an advantage: token_mean of -A log p w = w_0 · (its tokens) / (all tokens).
    assert float(loss.detach()) == pytest.approx(1 / (1 + math.exp(-1)), rel=1e-5)
    assert float(stats["is_weight_mean"]) == pytest.approx(1.0, rel=1e-5)
    plain, _ = fn(x, loss_type="reinforce", rollout_is=level)
    assert float(plain.detach()) == pytest.approx(math.exp(0.5 if level == "token" else 0.4) / 2, rel=1e-5)


def test_bypass_k1_rejection_needs_a_window_around_one() -> None:
    x = loss_inputs([[-1.0]], [[-1.0]], [[1.0]], rollout_logprobs=t([[-1.0]]))
    with pytest.raises(ValueError, match=r"rsThreshold must be above 1 for rolloutRs token_k1"):
        A.policy_loss_entry("bypass").fn(x, rollout_rs="token_k1", rs_threshold=0.5)


def test_cispo_lower_bound_holds_the_weight_up() -> None:
    # ratio e^-1 = 0.3679 < 1 - 0.5: the weight is 0.5; without a lower bound it stays 0.3679.
    x = loss_inputs([[-2.0]], [[-1.0]], [[1.0]])
    bounded, stats = A.policy_loss_entry("cispo").fn(x, clip_low=0.5)
    free, _ = A.policy_loss_entry("cispo").fn(x)
    assert float(bounded.detach()) == pytest.approx(1.0) and float(free.detach()) == pytest.approx(2 * math.exp(-1))
    assert float(stats["clip_fraction"]) == 1.0


def test_token_sum_and_the_loss_scale_factor() -> None:
    loss, mask = t([[1.0, 2.0, 4.0], [3.0, 0.0, 0.0]]), t([[1, 1, 0], [1, 0, 0]])
    assert float(A.aggregate(loss, mask, "token_sum")) == pytest.approx(6.0)  # 1 + 2 + 3
    assert float(A.aggregate(loss, mask, "seq_mean_token_sum_norm", horizon=10)) == pytest.approx(6.0 / (2 * 10))
    # A micro-batch's token sum is its part of the mini-batch's sum as it is: the scale only undoes the two means.
    mb = pack([[1], [1]], [[5, 6], [7]], 0)
    totals = UpdateTotals(tokens=10.0, sequences=5, micro_batches=3, dp=2, rows=5)
    assert totals.scale(mb, "token_sum") == 6.0 and totals.scale(mb, "token_mean") == pytest.approx(3 / 10 * 6)


def test_abs_and_straight_through_kl() -> None:
    logp = t([-1.0, -3.0]).requires_grad_()
    ref = t([-2.0, -1.0])  # log-ratios 1 and -2
    assert torch.allclose(A.kl_estimate(logp, ref, "abs"), t([1.0, 2.0]))
    k3 = A.kl_estimate(logp, ref, "k3+")
    assert torch.allclose(k3, t([math.exp(-1) - 1 + 1, math.exp(2) - 1 - 2]), atol=1e-5)
    k3.sum().backward()
    assert torch.allclose(logp.grad, t([1.0, -2.0]))  # k2's gradient: the log-ratio itself
