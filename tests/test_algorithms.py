"""The algorithms against values computed by hand (worked out in the comments)."""

import math

import pytest
import torch

from kuberl.engine import algorithms as A


def close(actual, expected, tol=1e-5):
    assert torch.allclose(torch.as_tensor(actual, dtype=torch.float32), torch.tensor(expected, dtype=torch.float32), atol=tol), (actual, expected)


def test_aggregation_modes():
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    close(A.aggregate(loss, mask, "token_mean"), 10 / 4)  # (1+2+3+4) / 4 tokens
    close(A.aggregate(loss, mask, "seq_mean_token_sum"), (6 + 4) / 2)
    close(A.aggregate(loss, mask, "seq_mean_token_mean"), (2 + 4) / 2)
    with pytest.raises(ValueError, match="unknown loss aggregation"):
        A.aggregate(loss, mask, "sum")


def test_kl_estimators():
    # p = 0.5, q = 0.25: log p/q = ln 2
    logp, ref = torch.tensor([math.log(0.5)]), torch.tensor([math.log(0.25)])
    close(A.kl_estimate(logp, ref, "k1"), [math.log(2)])
    close(A.kl_estimate(logp, ref, "k2"), [0.5 * math.log(2) ** 2])
    close(A.kl_estimate(logp, ref, "k3"), [0.5 - 1 + math.log(2)])  # q/p - 1 - log(q/p)
    close(A.kl_estimate(ref, ref, "k3"), [0.0])


def test_last_token_rewards():
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0]])
    close(A.last_token_rewards(torch.tensor([1.0, 2.0, 3.0]), mask), [[0, 1, 0], [2, 0, 0], [0, 0, 0]])


def test_gae_monte_carlo_and_td():
    rewards = torch.tensor([[0.0, 0.0, 1.0]])
    values = torch.tensor([[0.5, 0.6, 0.7]])
    mask = torch.ones(1, 3)
    adv, ret = A.gae(rewards, values, mask, gamma=1.0, lam=1.0)
    close(adv, [[0.5, 0.4, 0.3]])  # return 1 everywhere, minus the value
    close(ret, [[1.0, 1.0, 1.0]])
    adv, _ = A.gae(rewards, values, mask, gamma=1.0, lam=0.0)
    close(adv, [[0.1, 0.1, 0.3]])  # one-step TD errors r + V' - V
    adv, _ = A.gae(rewards, torch.zeros(1, 3), mask, gamma=0.5, lam=0.5)
    close(adv, [[0.0625, 0.25, 1.0]])  # (gamma * lam)^k


def test_gae_ignores_padding():
    rewards = torch.tensor([[0.0, 1.0, 0.0]])
    values = torch.tensor([[0.5, 0.6, 9.0]])  # 9 sits on padding and must not leak in
    adv, ret = A.gae(rewards, values, torch.tensor([[1.0, 1.0, 0.0]]), gamma=1.0, lam=1.0)
    close(adv, [[0.5, 0.4, 0.0]])
    close(ret, [[1.0, 1.0, 0.0]])


def test_grpo_advantages():
    scores = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0])
    group = torch.tensor([0, 0, 0, 1, 1, 1])
    # group 0: mean 1/3, unbiased std sqrt(1/3)
    std = math.sqrt(1 / 3)
    close(A.grpo_advantages(scores, group), [(2 / 3) / std, -(1 / 3) / std, -(1 / 3) / std, 0, 0, 0], tol=1e-4)
    close(A.grpo_advantages(scores, group, normalize_by_std=False), [2 / 3, -1 / 3, -1 / 3, 0, 0, 0])


def test_rloo_advantages():
    scores = torch.tensor([1.0, 0.0, 0.0, 3.0, 1.0])
    group = torch.tensor([7, 7, 7, 2, 2])
    close(A.rloo_advantages(scores, group), [1.0, -0.5, -0.5, 2.0, -2.0])
    with pytest.raises(ValueError, match="at least 2"):
        A.rloo_advantages(torch.tensor([1.0]), torch.tensor([0]))


def test_reinforce_pp_advantages_whitened_returns():
    rewards = torch.tensor([[0.0, 1.0], [0.0, 0.0]])
    adv = A.reinforce_pp_advantages(rewards, torch.ones(2, 2), gamma=1.0)
    # returns [[1, 1], [0, 0]]: mean 0.5, unbiased std sqrt(1/3)
    z = 0.5 / math.sqrt(1 / 3)
    close(adv, [[z, z], [-z, -z]], tol=1e-4)
    adv = A.reinforce_pp_advantages(torch.tensor([[0.0, 2.0]]), torch.ones(1, 2), gamma=0.5)
    # returns [1, 2]: mean 1.5, std sqrt(0.5)
    close(adv, [[-0.5 / math.sqrt(0.5), 0.5 / math.sqrt(0.5)]], tol=1e-4)


def test_policy_loss_on_policy_is_minus_advantage():
    logp = torch.tensor([[-1.0, -2.0]])
    loss, stats = A.policy_loss(logp, logp, torch.tensor([[2.0, -1.0]]), torch.ones(1, 2), clip_low=0.2)
    close(loss, -0.5)
    close(stats["clip_fraction"], 0.0)


def test_policy_loss_clips_both_sides():
    old = torch.zeros(1, 2)
    logp = torch.tensor([[math.log(1.5), math.log(0.5)]])
    adv = torch.tensor([[2.0, -1.0]])
    # token 0: r = 1.5, A = 2: max(-3, -2.4) = -2.4; token 1: r = 0.5, A = -1: max(0.5, 0.8) = 0.8
    loss, stats = A.policy_loss(logp, old, adv, torch.ones(1, 2), clip_low=0.2)
    close(loss, (-2.4 + 0.8) / 2)
    close(stats["clip_fraction"], 1.0)
    # A wider upper bound (clip-higher) lets token 0 keep its ratio: max(-3, -3) = -3
    loss, _ = A.policy_loss(logp, old, adv, torch.ones(1, 2), clip_low=0.2, clip_high=0.6)
    close(loss, (-3.0 + 0.8) / 2)


def test_policy_loss_gradient_flows_only_unclipped():
    logp = torch.tensor([[math.log(1.5), 0.0]], requires_grad=True)
    loss, _ = A.policy_loss(logp, torch.zeros(1, 2), torch.tensor([[2.0, 2.0]]), torch.ones(1, 2), clip_low=0.2)
    loss.backward()
    # token 0 is clipped (no gradient); token 1: d/dlogp of -A r / 2 at r = 1 is -1
    close(logp.grad, [[0.0, -1.0]])


def test_value_loss_clipping():
    values, old, returns, mask = torch.tensor([[1.5]]), torch.tensor([[1.0]]), torch.tensor([[2.0]]), torch.ones(1, 1)
    # unclipped (1.5-2)^2 = 0.25, clipped value 1.2: (1.2-2)^2 = 0.64; the larger, halved
    close(A.value_loss(values, old, returns, mask, clip=0.2), 0.32)
    close(A.value_loss(values, old, returns, mask, clip=0.0), 0.125)


def test_entropy_of_uniform_and_point_mass():
    close(A.entropy_from_logits(torch.zeros(1, 4)), [math.log(4)])
    close(A.entropy_from_logits(torch.tensor([[100.0, 0.0, 0.0]])), [0.0])


def test_dpo_loss():
    chosen, rejected = torch.tensor([-1.0]), torch.tensor([-2.0])
    ref = torch.tensor([-1.5])
    # margin = 0.1 * (0.5) - 0.1 * (-0.5) = 0.1
    loss, stats = A.dpo_loss(chosen, rejected, ref, ref, beta=0.1)
    close(loss, math.log(1 + math.exp(-0.1)))
    close(stats["reward_accuracy"], 1.0)
    close(stats["reward_margin"], 0.1)
    loss, _ = A.dpo_loss(chosen, rejected, ref, ref, beta=0.1, label_smoothing=0.1)
    close(loss, 0.9 * math.log(1 + math.exp(-0.1)) + 0.1 * math.log(1 + math.exp(0.1)))


def test_masked_whiten_zero_mean_unit_std():
    x = torch.tensor([[1.0, 2.0, 3.0, 100.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    w = A.masked_whiten(x, mask)
    close(w, [[-1.0, 0.0, 1.0, 0.0]], tol=1e-4)  # std of 1, 2, 3 is 1
