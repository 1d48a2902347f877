"""The algorithms against values computed by hand (worked out in the comments)."""

import math
import typing

import pytest
import torch

from kuberl.engine import algorithms as A
from kuberl.engine.config.algorithm import AlgorithmName


def close(actual, expected, tol=1e-5):
    assert torch.allclose(torch.as_tensor(actual, dtype=torch.float32), torch.tensor(expected, dtype=torch.float32), atol=tol), (
        actual,
        expected,
    )


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
    loss, stats = A.policy_loss(A.LossInputs(logp, logp, torch.tensor([[2.0, -1.0]]), torch.ones(1, 2)), clip_low=0.2)
    close(loss, -0.5)
    close(stats["clip_fraction"], 0.0)


def test_policy_loss_clips_both_sides():
    old = torch.zeros(1, 2)
    logp = torch.tensor([[math.log(1.5), math.log(0.5)]])
    adv = torch.tensor([[2.0, -1.0]])
    # token 0: r = 1.5, A = 2: max(-3, -2.4) = -2.4; token 1: r = 0.5, A = -1: max(0.5, 0.8) = 0.8
    loss, stats = A.policy_loss(A.LossInputs(logp, old, adv, torch.ones(1, 2)), clip_low=0.2)
    close(loss, (-2.4 + 0.8) / 2)
    close(stats["clip_fraction"], 1.0)
    # A wider upper bound (clip-higher) lets token 0 keep its ratio: max(-3, -3) = -3
    loss, _ = A.policy_loss(A.LossInputs(logp, old, adv, torch.ones(1, 2)), clip_low=0.2, clip_high=0.6)
    close(loss, (-3.0 + 0.8) / 2)


def test_policy_loss_gradient_flows_only_unclipped():
    logp = torch.tensor([[math.log(1.5), 0.0]], requires_grad=True)
    loss, _ = A.policy_loss(A.LossInputs(logp, torch.zeros(1, 2), torch.tensor([[2.0, 2.0]]), torch.ones(1, 2)), clip_low=0.2)
    loss.backward()
    # token 0 is clipped (no gradient); token 1: d/dlogp of -A r / 2 at r = 1 is -1
    close(logp.grad, [[0.0, -1.0]])


def test_value_loss_clipping():
    values, old, returns, mask = torch.tensor([[1.5]]), torch.tensor([[1.0]]), torch.tensor([[2.0]]), torch.ones(1, 1)
    # unclipped (1.5-2)^2 = 0.25, clipped value 1.2: (1.2-2)^2 = 0.64; the larger, halved
    close(A.value_loss(values, old, returns, mask, clip=0.2)[0], 0.32)
    close(A.value_loss(values, old, returns, mask, clip=0.0)[0], 0.125)


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


# --- the registries --------------------------------------------------------------------------


def test_gae_estimator_whitens_over_the_batch_by_default():
    # Two one-token responses, values 0, gamma = lambda = 1: raw advantages are the scores 1 and 3;
    # whitened over the batch (unbiased std sqrt(2)): -1/sqrt(2), +1/sqrt(2).
    inputs = A.AdvantageInputs(scores=torch.tensor([1.0, 3.0]), group=torch.tensor([0, 1]), mask=torch.ones(2, 1), values=torch.zeros(2, 1))
    gae = A.advantage_estimator("gae")
    raw = gae.fn(inputs, gamma=1.0, lam=1.0, whiten=False)
    assert torch.allclose(raw.advantages, torch.tensor([[1.0], [3.0]]))
    assert torch.allclose(raw.returns, torch.tensor([[1.0], [3.0]]))  # value targets stay unwhitened
    white = gae.fn(inputs, gamma=1.0, lam=1.0)
    assert torch.allclose(white.advantages, torch.tensor([[-1.0], [1.0]]) / 2**0.5, atol=1e-5)
    assert torch.allclose(white.returns, raw.returns)


def test_kl_in_the_reward_is_subtracted_from_token_rewards():
    mask = torch.ones(1, 2)
    inputs = A.AdvantageInputs(
        scores=torch.tensor([1.0]), group=torch.tensor([0]), mask=mask, values=torch.zeros(1, 2), kl_penalty=torch.tensor([[0.25, 0.5]])
    )
    out = A.advantage_estimator("gae").fn(inputs, gamma=1.0, lam=1.0, whiten=False)
    # rewards [-0.25, 1 - 0.5]; Monte Carlo returns-to-go [0.25, 0.5]
    assert torch.allclose(out.advantages, torch.tensor([[0.25, 0.5]]))


def test_group_estimators_through_the_registry_equal_their_functions():
    scores, group, mask = torch.tensor([1.0, 0.0, 2.0, 2.0]), torch.tensor([0, 0, 1, 1]), torch.ones(4, 3)
    inputs = A.AdvantageInputs(scores=scores, group=group, mask=mask)
    assert torch.equal(A.advantage_estimator("grpo").fn(inputs).advantages, A.grpo_advantages(scores, group)[:, None] * mask)
    assert torch.equal(A.advantage_estimator("rloo").fn(inputs).advantages, A.rloo_advantages(scores, group)[:, None] * mask)


def test_unknown_names_list_the_known_ones():
    with pytest.raises(
        KeyError,
        match="known: gae, gdpo, gpg, grpo, grpo_passk, opo, optimal_token_baseline, reinforce_pp, remax, rloo, tir_optimal_token_baseline",
    ):
        A.advantage_estimator("gea")
    with pytest.raises(
        KeyError, match="known: bypass, cispo, clip_cov, dpo, dppo_kl, dppo_tv, dro, gmpo, gpg, gspo, kl_cov, ppo_clip, sapo"
    ):
        A.policy_loss_entry("ppo")


def test_a_name_cannot_be_registered_twice():
    with pytest.raises(ValueError, match="registered twice"):
        A.register_advantage("grpo", summary="again")(lambda inputs: None)


@pytest.mark.parametrize("name", ["ppo", "grpo", "rloo", "reinforce_pp", "dapo", "gspo", "cispo", "dr_grpo"])
def test_presets_agree_with_the_api_on_what_an_algorithm_needs(name):
    # The API (torch-free, for the operator) states needs_critic and the group-baseline algorithms;
    # the registry's traits must say the same.
    from kuberl.engine.config.algorithm import GROUP_BASELINE_ALGORITHMS, AlgorithmSpec

    spec = AlgorithmSpec(name=name)
    estimator = A.advantage_estimator(A.choice_of(spec).advantage)
    assert estimator.needs_critic == spec.needs_critic
    assert (estimator.min_samples >= 2) == (name in GROUP_BASELINE_ALGORITHMS)
    assert set(A.choice_of(spec).advantage_options) <= set(estimator.options)
    A.policy_loss_entry(A.choice_of(spec).policy_loss)


def test_cli_lists_every_registered_entry(kuberl_cli):
    import subprocess

    out = subprocess.run([kuberl_cli, "algorithms"], capture_output=True, text=True, check=True).stdout
    from kuberl.engine.steps import STEPS

    for name in [*A.ADVANTAGES, *A.POLICY_LOSSES, *STEPS]:
        assert f"  {name} " in out
    # Option names as a manifest spells them: camelCase, and GAE's lambda as ppo.gae spells it.
    assert "lambda=0.95, whiten=true" in out and "clipLow=0.2" in out and "clip_low" not in out and "lam=" not in out
    assert "needs: critic" in out and "needs: a greedy rollout per prompt" in out
    assert "handleZeroTail=false" in out and 'lossType="ppo_clip", rolloutIs="token", isThreshold=2.0' in out and "is_threshold" not in out
    for preset in ("dapo", "gspo", "cispo", "dr_grpo"):
        assert f"  {preset} " in out


# --- the modern set, on hand-computed values ---------------------------------------------------


def test_opo_baseline_is_the_length_weighted_group_mean():
    # Group 0: lengths 1 and 3, scores 1 and 0 -> baseline (1*1 + 3*0)/4 = 0.25.
    mask = torch.tensor([[1.0, 0, 0], [1, 1, 1]])
    inputs = A.AdvantageInputs(scores=torch.tensor([1.0, 0.0]), group=torch.tensor([0, 0]), mask=mask)
    out = A.advantage_estimator("opo").fn(inputs).advantages
    assert torch.allclose(out, torch.tensor([[0.75, 0, 0], [-0.25, -0.25, -0.25]]))


def test_gpg_scales_by_batch_over_informative_samples():
    # Group 0 differs (1, 0): centred +-0.5; group 1 is all 1: no signal. B = 4, B_valid = 2 -> x2.
    inputs = A.AdvantageInputs(scores=torch.tensor([1.0, 0.0, 1.0, 1.0]), group=torch.tensor([0, 0, 1, 1]), mask=torch.ones(4, 1))
    out = A.advantage_estimator("gpg").fn(inputs).advantages[:, 0]
    assert torch.allclose(out, torch.tensor([1.0, -1.0, 0.0, 0.0]))


def test_dual_clip_caps_the_loss_of_negative_advantages():
    logp, old = torch.log(torch.tensor([[5.0]])), torch.zeros(1, 1)  # ratio 5
    mask, adv = torch.ones(1, 1), torch.tensor([[-1.0]])
    plain, _ = A.policy_loss(A.LossInputs(logp, old, adv, mask), clip_low=0.2)
    capped, _ = A.policy_loss(A.LossInputs(logp, old, adv, mask), clip_low=0.2, dual_clip=3.0)
    assert float(plain) == pytest.approx(5.0) and float(capped) == pytest.approx(3.0)
    with pytest.raises(ValueError, match="dual_clip must be > 1"):  # at or below 1 it would cut the clipped objective itself
        A.policy_loss(A.LossInputs(logp, old, adv, mask), dual_clip=1.0)


def test_gspo_uses_the_sequence_ratio_for_every_token():
    # Token log-ratios 0.2 and -0.1: sequence ratio exp(0.05), shared by both tokens.
    old = torch.zeros(1, 2)
    logp = torch.tensor([[0.2, -0.1]], requires_grad=True)
    loss, stats = A.POLICY_LOSSES["gspo"].fn(A.LossInputs(logp, old, torch.ones(1, 2), torch.ones(1, 2)), clip_low=1.0, clip_high=1.0)
    assert float(loss.detach()) == pytest.approx(-math.exp(0.05), rel=1e-6)
    loss.backward()
    # d/dlogp_t of -mean_t(sg(s) exp(logp_t - sg(logp_t))) = -s / 2 for each token.
    assert torch.allclose(logp.grad, torch.full((1, 2), -math.exp(0.05) / 2))


def test_gspo_clips_the_sequence_ratio():
    logp = torch.tensor([[0.5, 0.5]], requires_grad=True)  # s = e^0.5, far past 1 + 4e-4
    loss, stats = A.POLICY_LOSSES["gspo"].fn(A.LossInputs(logp, torch.zeros(1, 2), torch.ones(1, 2), torch.ones(1, 2)))
    assert float(loss.detach()) == pytest.approx(-(1 + 4e-4)) and float(stats["clip_fraction"]) == 1.0
    loss.backward()
    assert torch.count_nonzero(logp.grad) == 0


def test_cispo_detaches_a_clipped_weight_and_keeps_every_gradient():
    old = torch.zeros(1, 2)
    logp = torch.tensor([[math.log(2.0), math.log(10.0)]], requires_grad=True)  # ratios 2 and 10
    loss, stats = A.POLICY_LOSSES["cispo"].fn(A.LossInputs(logp, old, torch.ones(1, 2), torch.ones(1, 2)), clip_high=4.0)
    # weights 2 and min(10, 5) = 5; loss = -mean(w * logp)
    assert float(loss.detach()) == pytest.approx(-(2 * math.log(2.0) + 5 * math.log(10.0)) / 2)
    loss.backward()
    assert torch.allclose(logp.grad, torch.tensor([[-1.0, -2.5]]))
    assert float(stats["clip_fraction"]) == 0.5


def test_gpg_loss_is_the_plain_policy_gradient():
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    loss, _ = A.POLICY_LOSSES["gpg"].fn(A.LossInputs(logp, logp.detach(), torch.tensor([[2.0, 2.0]]), torch.ones(1, 2)))
    assert float(loss.detach()) == pytest.approx(3.0)
    loss.backward()
    assert torch.allclose(logp.grad, torch.tensor([[-1.0, -1.0]]))


def test_the_apis_catalog_is_generated_from_the_registries(repo):
    from kuberl.engine.runtime import catalog

    on_disk = (repo / "engine" / "config" / "algorithm_catalog.py").read_text()
    assert on_disk == catalog.generate(), (
        "engine/config/algorithm_catalog.py is stale: run .venv/bin/python -m kuberl.engine.runtime.catalog > engine/config/algorithm_catalog.py"
    )


def test_explicit_choices_replace_the_presets_with_snake_case_options():
    from kuberl.engine.config.algorithm import AlgorithmSpec

    spec = AlgorithmSpec.model_validate(
        {"name": "grpo", "advantage": {"name": "opo"}, "policyLoss": {"name": "gspo", "options": {"clipHigh": 0.28}}}, by_name=False
    )
    choice = A.choice_of(spec)
    assert (choice.advantage, choice.advantage_options) == ("opo", {})
    assert (choice.policy_loss, choice.policy_loss_options) == ("gspo", {"clip_high": 0.28})
    assert spec.min_samples == 2 and not spec.needs_critic


@pytest.mark.parametrize("name", typing.get_args(AlgorithmName))
def test_every_preset_samples_exactly_when_its_step_does(name: str) -> None:
    """The config's answer (what the engine builds vLLM for, the logits' temperature) and the step
    registry's (what the step does) agree for every preset."""
    from kuberl.engine.config.algorithm import AlgorithmSpec
    from kuberl.engine.steps import STEPS

    spec = AlgorithmSpec(name=name, **({"klCoef": 0.0} if name == "dpo" else {}))
    assert spec.on_policy == STEPS[A.choice_of(spec).step].on_policy == (name != "dpo")


def test_reinforce_pp_baseline_follows_the_samples_per_prompt_by_default():
    """With one sample per prompt there is no group to take a mean of, so by default no baseline is taken (plain
    REINFORCE++); with several, the group mean is subtracted (REINFORCE++-baseline), as an explicit baseline=True."""
    estimator = A.advantage_estimator("reinforce_pp")
    mask = torch.ones(4, 3)
    singles = A.AdvantageInputs(scores=torch.tensor([1.0, 0.0, 2.0, 5.0]), group=torch.arange(4), mask=mask)
    plain = estimator.fn(singles).advantages
    assert plain.abs().sum() > 0
    assert torch.equal(plain, estimator.fn(singles, baseline=False).advantages)
    # A group of one keeps its score under the baseline, as in verl's REINFORCE++-baseline: never all zeros.
    assert torch.equal(estimator.fn(singles, baseline=True).advantages, plain)
    groups = A.AdvantageInputs(scores=torch.tensor([1.0, 0.0, 2.0, 5.0]), group=torch.tensor([0, 0, 1, 1]), mask=mask)
    assert torch.equal(estimator.fn(groups).advantages, estimator.fn(groups, baseline=True).advantages)
    assert not torch.equal(estimator.fn(groups).advantages, estimator.fn(groups, baseline=False).advantages)


def test_the_api_texts_name_every_built_in_preset_and_step_function() -> None:
    # The lists in the RLJob reference (and `kubectl explain`) are written by hand in these docstrings; the
    # generated catalog is what the engine registers: a built-in added without its name here fails.
    import re

    from kuberl.engine.config import algorithm_catalog
    from kuberl.engine.config.algorithm import AlgorithmSpec, StepChoice

    for model, registered in ((AlgorithmSpec, algorithm_catalog.PRESETS), (StepChoice, algorithm_catalog.STEPS)):
        text = model.model_fields["name"].description or ""
        named = set(re.findall(r"\b[a-z][a-z0-9_]*\b", text))
        assert set(registered) <= named, (model.__name__, set(registered) - named)
    steps_doc = StepChoice.__doc__ or ""
    assert all(name in steps_doc for name in algorithm_catalog.STEPS)
