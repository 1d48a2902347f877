"""The modern set on hand-computed values: ReMax, GRPO pass@k, SAPO, Clip-Cov, KL-Cov, GMPO, Dr. GRPO's
aggregation, DAPO's shaping and filtering, the presets, and the step's records."""

from __future__ import annotations

import math

import pytest
import torch

from kuberl.engine import algorithms as A
from kuberl.engine.algorithms.shaping import informative_groups, overlong_penalty
from kuberl.engine.config.algorithm import AlgorithmSpec


def test_seq_mean_token_sum_norm_divides_by_responses_times_width():
    loss = torch.tensor([[1.0, 2.0, 9.0], [3.0, 9.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    # (1 + 2 + 3) / (2 responses * width 3), whatever the lengths.
    assert A.aggregate(loss, mask, "seq_mean_token_sum_norm").item() == pytest.approx(1.0)


def test_remax_subtracts_the_greedy_responses_reward():
    inputs = A.AdvantageInputs(
        scores=torch.tensor([1.0, 0.0]),
        group=torch.tensor([0, 1]),
        mask=torch.tensor([[1.0, 1.0], [1.0, 0.0]]),
        greedy_scores=torch.tensor([0.5, 0.5]),
    )
    out = A.advantage_estimator("remax").fn(inputs).advantages
    assert torch.allclose(out, torch.tensor([[0.5, 0.5], [-0.5, 0.0]]))
    assert A.advantage_estimator("remax").needs_greedy


def test_remax_return_includes_the_kl_penalty_still_to_come():
    # Token rewards [-0.1, 1 - 0.1]: returns-to-go [0.8, 0.9]; minus greedy 0.5.
    inputs = A.AdvantageInputs(
        scores=torch.tensor([1.0]),
        group=torch.tensor([0]),
        mask=torch.ones(1, 2),
        kl_penalty=torch.tensor([[0.1, 0.1]]),
        greedy_scores=torch.tensor([0.5]),
    )
    assert torch.allclose(A.advantage_estimator("remax").fn(inputs).advantages, torch.tensor([[0.3, 0.4]]))


def test_grpo_passk_credits_only_the_best_sample_by_its_margin():
    scores = torch.tensor([1.0, 0.5, 0.0, 2.0, 2.0])
    inputs = A.AdvantageInputs(scores=scores, group=torch.tensor([0, 0, 0, 1, 1]), mask=torch.ones(5, 1))
    raw = A.advantage_estimator("grpo_passk").fn(inputs, normalize_by_std=False).advantages[:, 0]
    assert torch.allclose(raw, torch.tensor([0.5, 0.0, 0.0, 0.0, 0.0]))  # a tie for best has no margin
    normed = A.advantage_estimator("grpo_passk").fn(inputs).advantages[:, 0]
    # Group 0's std (unbiased) is 0.5: margin 0.5 / 0.5 = 1.
    assert normed[0].item() == pytest.approx(1.0, rel=1e-4) and normed[1:].abs().sum() == 0


@pytest.mark.parametrize("advantage,tau,value", [(1.0, 1.0, -2.0), (-1.0, 1.05, 2.0 / 1.05)])
def test_sapo_gate_on_policy_gives_the_plain_policy_gradient(advantage, tau, value):
    # On policy r = 1: gate 4/tau * sigmoid(0) = 2/tau, and its slope in log p is 4/tau * 1/4 * tau = 1.
    logp = torch.tensor([[-1.0]], requires_grad=True)
    loss, _ = A.policy_loss_entry("sapo").fn(A.LossInputs(logp, torch.tensor([[-1.0]]), torch.tensor([[advantage]]), torch.ones(1, 1)))
    loss.backward()
    assert loss.item() == pytest.approx(value)
    assert logp.grad.item() == pytest.approx(-advantage)


def test_sapo_fades_the_gradient_far_from_the_old_policy():
    logp = torch.tensor([[0.0, 1.0]], requires_grad=True)  # ratios 1 and e against old log p 0
    loss, _ = A.policy_loss_entry("sapo").fn(
        A.LossInputs(logp, torch.zeros(1, 2), torch.ones(1, 2), torch.ones(1, 2)), aggregation="seq_mean_token_sum"
    )
    loss.backward()
    r = math.e
    sig = 1 / (1 + math.exp(-(r - 1)))
    # The unclipped surrogate -A r has gradient -r here; SAPO weighs it by 4 sigmoid (1 - sigmoid) = 0.51.
    assert logp.grad[0, 1].item() == pytest.approx(-4 * sig * (1 - sig) * r)
    assert abs(logp.grad[0, 1].item()) < 0.52 * r


def _cov_batch():
    # Advantages centred [3, 0, -3]; log-probs [2, 0, -1] centred [5/3, -1/3, -4/3]: covariance terms [5, 0, 4].
    return torch.tensor([[2.0, 0.0, -1.0]], requires_grad=True), torch.tensor([[3.0, 0.0, -3.0]]), torch.ones(1, 3)


def test_clip_cov_freezes_the_tokens_of_largest_covariance_within_bounds():
    logp, adv, mask = _cov_batch()
    loss, stats = A.policy_loss_entry("clip_cov").fn(A.LossInputs(logp, logp.detach(), adv, mask), fraction=1 / 3, cov_high=5.5)
    loss.backward()
    # One token (a third) is frozen: the largest term strictly inside (1, 5.5), token 0. Token 2 keeps -A/3 = 1.
    assert torch.allclose(logp.grad, torch.tensor([[0.0, 0.0, 1.0]]))
    assert loss.item() == pytest.approx(1.0)  # the frozen token's loss is 0, as verl's weight of 0 makes it
    assert stats["cov_frozen_fraction"].item() == pytest.approx(1 / 3)


def test_clip_cov_bounds_exclude_outliers():
    logp, adv, mask = _cov_batch()
    loss, stats = A.policy_loss_entry("clip_cov").fn(A.LossInputs(logp, logp.detach(), adv, mask), fraction=1 / 3, cov_high=4.5)
    loss.backward()
    assert torch.allclose(logp.grad, torch.tensor([[-1.0, 0.0, 0.0]]))  # token 0 (5) is above the bound; token 2 frozen


def test_kl_cov_penalises_the_tokens_of_largest_covariance():
    logp, adv, mask = _cov_batch()
    old = logp.detach() - 0.5  # every ratio is e^0.5
    loss, stats = A.policy_loss_entry("kl_cov").fn(A.LossInputs(logp, old, adv, mask), fraction=1 / 3, kl_coef=1.0)
    loss.backward()
    e = math.exp(0.5)
    assert loss.item() == pytest.approx((-3 * e + 0.5 + 0 + 3 * e) / 3)
    assert torch.allclose(logp.grad, torch.tensor([[(-3 * e + 1) / 3, 0.0, e]]), atol=1e-6)
    assert stats["cov_penalised_fraction"].item() == pytest.approx(1 / 3)


@pytest.mark.parametrize(
    "advantage,log_ratios,expected",
    [
        (1.0, [0.1, 0.6], -math.exp((0.1 + 0.4) / 2)),  # A > 0: 0.6 is clipped to 0.4
        (-1.0, [-0.1, -0.6], math.exp((-0.1 - 0.4) / 2)),  # A < 0: -0.6 is clipped to -0.4
        (-1.0, [0.1, 0.6], math.exp((0.1 + 0.6) / 2)),  # A < 0 and rising: not clipped (pessimistic)
    ],
)
def test_gmpo_is_the_clipped_geometric_mean_ratio(advantage, log_ratios, expected):
    old = torch.zeros(1, 2)
    loss, _ = A.policy_loss_entry("gmpo").fn(A.LossInputs(torch.tensor([log_ratios]), old, torch.full((1, 2), advantage), torch.ones(1, 2)))
    assert loss.item() == pytest.approx(expected)


def test_overlong_penalty_ramps_over_the_buffer():
    lengths = torch.tensor([5, 6, 8, 10])
    assert torch.allclose(overlong_penalty(lengths, max_tokens=10, buffer=4), torch.tensor([0.0, 0.0, -0.5, -1.0]))
    assert torch.allclose(overlong_penalty(lengths, max_tokens=10, buffer=4, factor=0.5), torch.tensor([0.0, 0.0, -0.25, -0.5]))
    assert overlong_penalty(lengths, max_tokens=10, buffer=0).abs().sum() == 0


def test_informative_groups_drops_equal_rewards_and_single_samples():
    scores = torch.tensor([1.0, 1.0, 0.0, 1.0, 2.0, 2.0, 3.0])
    assert informative_groups(scores, torch.tensor([0, 0, 1, 1, 2, 2, 3])) == [1]


@pytest.mark.parametrize(
    "name,advantage,options,loss,loss_options,step",
    [
        ("dapo", "grpo", {}, "ppo_clip", {"clip_low": 0.2, "clip_high": 0.28, "aggregation": "token_mean"}, "dynamic_sampling"),
        (
            "dr_grpo",
            "grpo",
            {"normalize_by_std": False},
            "ppo_clip",
            {"clip_low": 0.2, "clip_high": None, "aggregation": "seq_mean_token_sum_norm"},
            "on_policy",
        ),
        ("gspo", "grpo", {}, "gspo", {}, "on_policy"),
        ("cispo", "grpo", {}, "cispo", {}, "on_policy"),
        ("dpo", "", {}, "dpo", {"beta": 0.1, "label_smoothing": 0.0}, "dpo"),
    ],
)
def test_presets_fill_estimator_loss_and_step(name, advantage, options, loss, loss_options, step):
    choice = A.choice_of(AlgorithmSpec(name=name))
    assert (choice.advantage, choice.advantage_options, choice.policy_loss, choice.policy_loss_options, choice.step) == (
        advantage,
        options,
        loss,
        loss_options,
        step,
    )


def test_dapo_keeps_an_explicit_clip_high_and_a_step_can_be_named():
    spec = AlgorithmSpec.model_validate({"name": "dapo", "clipRatioHigh": 0.3, "step": {"name": "on_policy"}})
    choice = A.choice_of(spec)
    assert choice.policy_loss_options["clip_high"] == 0.3 and choice.step == "on_policy"


def test_rollout_records_select_and_concatenate_groups():
    from kuberl.engine.data import Example
    from kuberl.engine.rollout.vllm_backend import Completion
    from kuberl.engine.steps.records import Rollout, Scores

    examples = [Example(prompt=f"p{i}", answer=str(i)) for i in range(3)]
    rollout = Rollout(examples, [[1], [2], [3]], [Completion(i // 2, [10 + i], [-0.1], True) for i in range(6)])
    kept = rollout.groups([0, 2])
    assert [e.prompt for e in kept.examples] == ["p0", "p2"]
    assert [(c.prompt_index, c.token_ids) for c in kept.completions] == [(0, [10]), (0, [11]), (1, [14]), (1, [15])]
    both = kept + rollout.groups([1])
    assert both.group.tolist() == [0, 0, 1, 1, 2, 2] and both.prompts == [[1], [3], [2]]
    merged = Scores(torch.tensor([1.0, 0.0]), {"math": 0.5}) + Scores(torch.tensor([1.0, 1.0, 1.0, 1.0]), {"math": 1.0})
    assert merged.values.tolist() == [1.0, 0.0, 1.0, 1.0, 1.0, 1.0] and merged.parts["math"] == pytest.approx(5 / 6)


def test_update_plan_lists_every_update_of_a_step_in_order():
    from kuberl.engine.training.sequences import MiniBatch, update_plan

    plan = update_plan(rows=10, mini_batch_size=4, epochs=2, lr_of_update=lambda i: 0.1 * (i + 1))
    assert [(u.start, u.end) for u in plan] == [(0, 4), (4, 8), (8, 10)] * 2
    assert [u.lr for u in plan] == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.5, 0.6])
    assert update_plan(rows=3, mini_batch_size=None, epochs=1, lr_of_update=lambda i: 1.0) == [MiniBatch(0, 3, 1.0)]
