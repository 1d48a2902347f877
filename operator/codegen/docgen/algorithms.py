"""The algorithm reference page: the engine's registries (what `kuberl algorithms` prints), with formulas.

The names, summaries, options and needs come from kuberl.engine.algorithms' ADVANTAGES and POLICY_LOSSES,
kuberl.engine.steps' STEPS and the presets (kuberl.engine.algorithms.presets); the formulas
(algorithm_formulas.py) are written from the code in engine/algorithms/*.py. A built-in registered
without a formula there fails the generator, so the page cannot leave one out.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import typing
from pathlib import Path

from .algorithm_formulas import ADVANTAGE_FORMULAS, AGGREGATIONS, DAPO, KL_ESTIMATORS, LOSS_FORMULAS, STEP_NOTES, VERL_DIFFERENCES
from .markdown import cell, code, header, table


def _options(entry) -> str:
    from kuberl.engine.config.algorithm import option_manifest_name

    shown = [
        f"{code(option_manifest_name(n))} = {code(d) if d is not inspect.Parameter.empty else 'required'}" for n, d in entry.options.items()
    ]
    return ", ".join(shown) or "none"


def _cli_output() -> str:
    from ...cli.commands import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        main(["algorithms"])
    return out.getvalue()


def _formula(name: str, formulas: dict[str, tuple[str, str]], what: str) -> tuple[str, str]:
    if name not in formulas:
        raise KeyError(
            f"{what} {name!r} is registered but kuberl.operator.codegen.docgen.algorithm_formulas has no formula for it: add one"
        )
    return formulas[name]


def _entry(name: str, summary: str, formula: str, reference: str, facts: list[str]) -> str:
    return (
        f"### {name}\n\n{summary[0].upper() + summary[1:]}.\n\n"
        + "".join(f"- {f}\n" for f in facts)
        + f"\n```text\n{formula}\n```\n\nReference: {reference}.\n\n"
    )


def _presets() -> str:
    from kuberl.engine.algorithms.presets import PRESETS, choice_of
    from kuberl.engine.config.algorithm import AlgorithmSpec, option_manifest_name

    def shown(name: str, options: dict) -> str:
        given = {option_manifest_name(k): v for k, v in options.items() if v is not None}
        return f"`{name}`" + (" (" + ", ".join(f"{k}: {code(v)}" for k, v in given.items()) + ")" if given else "") if name else "-"

    rows = []
    for preset in PRESETS.values():
        c = choice_of(AlgorithmSpec(name=preset.name))
        traits = ", ".join(
            t for t, on in (("preference pairs, no rollout", preset.pairs), ("a reference policy", preset.needs_reference)) if on
        )
        rows.append(
            [
                f"`{preset.name}`",
                shown(c.advantage, c.advantage_options),
                shown(c.policy_loss, c.policy_loss_options),
                f"`{c.step}`",
                f"`algorithm.{option_manifest_name(preset.name)}`" if preset.options is not None else "-",
                traits or "-",
            ]
        )
    return table(["algorithm.name", "advantage estimator", "policy loss", "step", "block", "needs"], rows)


def page(repo: Path) -> str:
    from kuberl.engine.algorithms import ADVANTAGES, POLICY_LOSSES
    from kuberl.engine.steps import STEPS

    out = [
        header("the engine's registries (kuberl.engine.algorithms, kuberl.engine.steps) and this generator's formulas"),
        "# Algorithm reference\n\n",
        "`spec.algorithm.name` is a preset: it picks an advantage estimator, a policy loss and a step function, "
        "each registered by name. `algorithm.advantage`, `algorithm.policyLoss` and `algorithm.step` replace one of them "
        "by name, with its options under their manifest (camelCase) names; a file of `algorithm.plugins` registers more "
        "(see [A new algorithm in one file](../tutorials/new-algorithm.md)).\n\n"
        "```yaml\nalgorithm:\n  name: grpo                       # the preset: still decides the defaults of everything else\n"
        "  advantage: {name: opo}\n  policyLoss: {name: gspo, options: {clipLow: 3.0e-4, clipHigh: 4.0e-4}}\n"
        "  step: {name: dynamic_sampling}\n```\n\n",
        "## Presets\n\nThe options shown are those a preset passes with the algorithm section's defaults "
        "(`clipRatio` 0.2, `lossAggregation` token_mean; the per-algorithm blocks `ppo.gae`, `grpo`, `reinforcePp`).\n\n",
        _presets(),
        "\n",
        "## What `kuberl algorithms` prints\n\n```text\n$ kuberl algorithms\n",
        _cli_output(),
        "```\n\n",
        "## Advantage estimators\n\n",
        "Notation: r_i is the reward of response i, G(i) the n responses to its prompt, t a response token, "
        "|o_i| the response's length. A per-response advantage is given to each of its tokens.\n\n",
    ]
    for name, e in sorted(ADVANTAGES.items()):
        formula, reference = _formula(name, ADVANTAGE_FORMULAS, "advantage estimator")
        needs = [
            n
            for n, on in (
                ("a critic (`roles.critic`)", e.needs_critic),
                (f"`rollout.samplesPerPrompt` ≥ {e.min_samples}", e.min_samples > 1),
                ("a greedy rollout per prompt", e.needs_greedy),
            )
            if on
        ]
        out.append(_entry(name, e.summary, formula, reference, [f"Options: {_options(e)}", f"Needs: {', '.join(needs) or 'nothing more'}"]))
    out.append(
        "## Policy losses\n\nρ_t = exp(log π_θ(t) - log π_old(t)) is the probability ratio of a sampled token (the "
        "log-ratio clamped to ±20), sg() stops the gradient, ε_low and ε_high are the loss's `clipLow` and `clipHigh`. "
        "L_t is a token's loss; `aggregation` makes one number of them (below).\n\n"
    )
    for name, loss in sorted(POLICY_LOSSES.items()):
        formula, reference = _formula(name, LOSS_FORMULAS, "policy loss")
        out.append(_entry(name, loss.summary, formula, reference, [f"Options: {_options(loss)}"]))
    out.append("## Step functions\n\n")
    rows = [
        [f"`{s.name}`", cell(s.summary), cell(STEP_NOTES.get(s.name, "")), "yes" if s.on_policy else "no"]
        for s in sorted(STEPS.values(), key=lambda s: s.name)
    ]
    out.append(table(["algorithm.step", "summary", "what it does", "generates"], rows) + "\n")
    from kuberl.engine.algorithms.tensors import Aggregation, KLEstimator

    out.append(
        "## Loss aggregation\n\n`algorithm.lossAggregation` (and a loss's `aggregation` option), over a mini-batch of B "
        "responses. Whatever the micro-batches, the update is the whole mini-batch's: each micro-batch's loss is "
        "scaled by its share of the mini-batch's tokens (or responses).\n\n"
    )
    out.append(
        table(
            ["aggregation", "one number from the token losses L_{i,t}"],
            [[f"`{a}`", cell(AGGREGATIONS[a])] for a in typing.get_args(Aggregation)],
        )
        + "\n"
    )
    out.append(
        "## KL to the reference policy\n\n`algorithm.klCoef` > 0 adds klCoef · KL to the loss (or, with "
        "`klInReward`, subtracts it from each token's reward); `algorithm.klEstimator` estimates it per token from "
        "x = log π_θ(t) - log π_ref(t) (Schulman, 2020, [Approximating KL Divergence](http://joschu.net/blog/kl-approx.html)):\n\n"
    )
    out.append(
        table(["klEstimator", "per-token estimate"], [[f"`{k}`", cell(KL_ESTIMATORS[k])] for k in typing.get_args(KLEstimator)]) + "\n"
    )
    out.append(
        "## The rest of an update\n\n```text\n"
        "actor:         L = L_policy + klCoef · agg(KL_t) - entropyCoef · agg(H_t)      (engine/algorithms/terms.py)\n"
        "               (agg: lossAggregation; the KL term is in the reward instead with klInReward)\n"
        "critic (ppo):  L_V = valueLossCoef · 0.5 · agg(max((V - R)², (V_old + clip(V - V_old, -valueClip, valueClip) - R)²))\n"
        "               (critic/vf_clipfrac: the share of the tokens where the clipped term is the larger; 0 with valueClip 0)\n"
        "tis:           L_t ← L_t · min(π_old(t) / π_rollout(t), cap)    (π_old recomputed by the trainer, π_rollout vLLM's;\n"
        "               each token's policy loss, as verl weighs it; gmpo takes the weights' geometric mean per response)\n"
        "dapo overlong: reward += -overlongPenalty · clamp(|o| - (maxNewTokens - overlongBuffer), 0, overlongBuffer) / overlongBuffer\n"
        "dpo:           the policy loss dpo (above), with β = dpo.beta, ε = dpo.labelSmoothing\n```\n\n"
        f"References: the overlong penalty and dynamic sampling, {DAPO}; truncated importance sampling, Yao et al., 2025.\n\n"
    )
    out.append(
        "## Where kuberl differs from verl\n\nEvery registered function follows verl's function of the same name "
        "(verl/trainer/ppo/core_algos.py; PPO's clip is verl's `vanilla`, GMPO verl's `geo_mean`, REINFORCE++ "
        "`reinforce_plus_plus` and `reinforce_plus_plus_baseline`), and tests/test_algorithms_parity.py and "
        "tests/test_losses_parity.py check each against values computed in the test from the published definition, except where this list says otherwise:\n\n"
    )
    out.append(table(["function", "difference"], [[cell(f), cell(d)] for f, d in VERL_DIFFERENCES]) + "\n")
    return "".join(out)
