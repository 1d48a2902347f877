"""The algorithm reference page: the engine's registries (what `kuberl algorithms` prints), with formulas.

The names, summaries, options and needs come from kuberl.engine.algorithms' ADVANTAGES and POLICY_LOSSES,
kuberl.engine.steps' STEPS and the presets (kuberl.engine.algorithms.presets); the formulas below are
written from the code in engine/algorithms/*.py. A built-in registered without a formula here fails
the generator, so the page cannot leave one out.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import typing
from pathlib import Path

from .markdown import cell, code, header, table

_PPO = "Schulman et al., 2017, [Proximal Policy Optimization Algorithms](https://arxiv.org/abs/1707.06347)"
_GAE = ("Schulman et al., 2016, [High-Dimensional Continuous Control Using Generalized Advantage Estimation]"
        "(https://arxiv.org/abs/1506.02438)")
_GRPO = "Shao et al., 2024, [DeepSeekMath](https://arxiv.org/abs/2402.03300) (GRPO)"
_DR_GRPO = "Liu et al., 2025, [Understanding R1-Zero-Like Training: A Critical Perspective](https://arxiv.org/abs/2503.20783) (Dr. GRPO)"
_DAPO = "Yu et al., 2025, [DAPO: An Open-Source LLM Reinforcement Learning System at Scale](https://arxiv.org/abs/2503.14476)"
_COV = "Cui et al., 2025, The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models"

# name -> (formula, reference). Notation: r_i the reward of response i; G(i) the responses to its prompt (n of
# them); t a response token; A_t its advantage; ρ_t = exp(log π_θ(t) - log π_old(t)) (log-ratio clamped to ±20);
# sg() stops the gradient; ε_low, ε_high the loss's clipLow and clipHigh.
ADVANTAGE_FORMULAS = {
    "gae": ("reward_t = r_i on the last token, 0 before it (minus klCoef·KL_t with klInReward)\n"
            "δ_t = reward_t + γ·V_{t+1} - V_t        (V after the last token = 0)\n"
            "A_t = Σ_k (γλ)^k · δ_{t+k}\n"
            "R_t = A_t + V_t                         (the critic's targets)\n"
            "whiten: A ← (A - mean(A)) / std(A) over the batch's response tokens", _GAE),
    "grpo": ("A_i = (r_i - mean_{G(i)} r) / (std_{G(i)} r + 1e-6)     (std unbiased)\n"
             "normalizeByStd: false →  A_i = r_i - mean_{G(i)} r", f"{_GRPO}; without the std: {_DR_GRPO}"),
    "rloo": ("A_i = r_i - (1 / (n - 1)) · Σ_{j ∈ G(i), j ≠ i} r_j",
             "Ahmadian et al., 2024, [Back to Basics: Revisiting REINFORCE Style Optimization for Learning from Human "
             "Feedback in LLMs](https://arxiv.org/abs/2402.14740)"),
    "reinforce_pp": ("s_i = r_i - mean_{G(i)} r   with the baseline,  s_i = r_i   without\n"
                     "(baseline unset: used when prompts have several samples)\n"
                     "token rewards: s_i on the last token, minus klCoef·KL_t with klInReward\n"
                     "A_t = whiten(Σ_{k ≥ t} reward_k) over the batch's response tokens",
                     "Hu, 2025, [REINFORCE++](https://arxiv.org/abs/2501.03262)"),
    "opo": ("b = Σ_{j ∈ G(i)} |o_j| · r_j / Σ_{j ∈ G(i)} |o_j|       (|o_j| the response's length)\n"
            "A_i = r_i - b", "On-Policy RL with Optimal reward baseline (OPO), 2025"),
    "gpg": ("A_i = (r_i - mean_{G(i)} r) · B / B_valid\n"
            "B the batch's responses, B_valid those in groups whose rewards differ",
            "Chu et al., 2025, GPG: A Simple and Strong Reinforcement Learning Baseline for Model Reasoning"),
    "remax": ("A_t = Σ_{k ≥ t} reward_k - r_greedy      (token rewards as for gae)\n"
              "r_greedy: the reward of one greedy response to the same prompt, generated and scored in the step",
              "Li et al., 2023, [ReMax](https://arxiv.org/abs/2310.10505)"),
    "grpo_passk": ("in each group, only the best response b (the first on ties) learns:\n"
                   "A_b = (r_(1) - r_(2)) / (std_{G} r + 1e-6)     (the best minus the second best; no std with "
                   "normalizeByStd: false)\nA_i = 0 for every other response", "Thrampoulidis et al., 2025 (GRPO for pass@k)"),
}
LOSS_FORMULAS = {
    "ppo_clip": ("L_t = max(-A_t·ρ_t, -A_t·clip(ρ_t, 1 - ε_low, 1 + ε_high))      (ε_high = ε_low when clipHigh is unset)\n"
                 "dualClip c:  where A_t < 0,  L_t = min(L_t, -c·A_t)",
                 f"{_PPO}; clip-higher: {_DAPO}; dual clip: Ye et al., 2020"),
    "gspo": ("s_i = exp(mean_t (log π_θ(t) - log π_old(t)))      (the sequence's geometric-mean ratio)\n"
             "per token: s_{i,t} = sg(s_i) · exp(log π_θ(t) - sg(log π_θ(t)))     (value s_i, gradient s_i·∇log π_θ(t))\n"
             "L_t = max(-A_t·s_{i,t}, -A_t·clip(s_{i,t}, 1 - ε_low, 1 + ε_high))",
             "Zheng et al., 2025, [Group Sequence Policy Optimization](https://arxiv.org/abs/2507.18071)"),
    "cispo": ("L_t = -sg(min(ρ_t, 1 + ε_high)) · A_t · log π_θ(t)",
              "MiniMax, 2025, [MiniMax-M1](https://arxiv.org/abs/2506.13585) (CISPO)"),
    "gpg": ("L_t = -A_t · log π_θ(t)", "Chu et al., 2025, GPG: A Simple and Strong Reinforcement Learning Baseline for Model Reasoning"),
    "sapo": ("L_t = -f(ρ_t) · A_t,   f(ρ) = (4/τ) · sigmoid(τ·(ρ - 1)),   τ = tauPos if A_t > 0 else tauNeg",
             "Qwen, 2025, Soft Adaptive Policy Optimization (SAPO)"),
    "clip_cov": ("L_t as ppo_clip;  c_t = (A_t - mean A) · (log π_θ(t) - mean log π_θ) over the batch's tokens\n"
                 "of the tokens with covLow ≤ c_t ≤ covHigh, the ⌈fraction·N⌉ of largest c_t get no gradient\n"
                 "(N = B·T, the batch's token positions)\n"
                 "(the paper draws them at random; kuberl takes the largest, so that a step is reproducible)", _COV),
    "kl_cov": ("L_t = -A_t·ρ_t,  plus klCoef·|log π_θ(t) - log π_old(t)| on the ⌈fraction·N⌉ tokens of largest c_t\n"
               "(c_t as in clip_cov)", _COV),
    "gmpo": ("ℓ_t = log ρ_t,  ℓ'_t = clip(ℓ_t, -ε_low, ε_high),  p_t = sign(A)·min(sign(A)·ℓ_t, sign(A)·ℓ'_t)\n"
             "L = mean_i [ -(Σ_t A_t / |o_i|) · exp(Σ_t p_t / |o_i|) ]       (its own aggregation)",
             "Zhao et al., 2025, Geometric-Mean Policy Optimization (GMPO)"),
}
STEP_NOTES = {
    "on_policy": "generate, score, reference and critic forward (and recomputed old log-probs), advantages, update; "
                 "with an estimator that needs a greedy rollout (remax) it also generates and scores one greedy response per prompt",
    "dynamic_sampling": "drops the groups whose samples all got the same reward and draws more prompts until the step has "
                        "promptsPerStep informative groups or algorithm.dapo.maxDraws batches were drawn (metrics "
                        "dynamic_sampling/draws, prompts_drawn, groups_kept)",
    "dpo": "no rollout: each step takes promptsPerStep preference pairs and minimises the DPO loss against the reference policy",
}
AGGREGATIONS = {
    "token_mean": "Σ_{i,t} L_{i,t} / Σ_i |o_i|  (every token weighs the same)",
    "seq_mean_token_sum": "(1/B) · Σ_i Σ_t L_{i,t}",
    "seq_mean_token_mean": "(1/B) · Σ_i (Σ_t L_{i,t} / |o_i|)  (every response weighs the same)",
    "seq_mean_token_sum_norm": "Σ_{i,t} L_{i,t} / (B · T),  T = rollout.maxNewTokens (a constant: Dr. GRPO)",
}
KL_ESTIMATORS = {"k1": "x", "k2": "x² / 2", "k3": "exp(-x) - 1 + x  (x clamped to ±20)"}


def _options(entry) -> str:
    from kuberl.engine.config.algorithm import option_manifest_name

    shown = [f"{code(option_manifest_name(n))} = {code(d) if d is not inspect.Parameter.empty else 'required'}"
             for n, d in entry.options.items()]
    return ", ".join(shown) or "none"


def _cli_output() -> str:
    from ..cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        main(["algorithms"])
    return out.getvalue()


def _formula(name: str, formulas: dict[str, tuple[str, str]], what: str) -> tuple[str, str]:
    if name not in formulas:
        raise KeyError(f"{what} {name!r} is registered but kuberl.operator.docgen_algorithms has no formula for it: add one")
    return formulas[name]


def _entry(name: str, summary: str, formula: str, reference: str, facts: list[str]) -> str:
    return (f"### {name}\n\n{summary[0].upper() + summary[1:]}.\n\n" + "".join(f"- {f}\n" for f in facts)
            + f"\n```text\n{formula}\n```\n\nReference: {reference}.\n\n")


def _presets() -> str:
    from kuberl.engine.algorithms.presets import choice_of
    from kuberl.engine.config.algorithm import AlgorithmName, AlgorithmSpec, option_manifest_name

    def shown(name: str, options: dict) -> str:
        given = {option_manifest_name(k): v for k, v in options.items() if v is not None}
        return f"`{name}`" + (" (" + ", ".join(f"{k}: {code(v)}" for k, v in given.items()) + ")" if given else "") if name else "-"

    rows = []
    for preset in typing.get_args(AlgorithmName):
        c = choice_of(AlgorithmSpec(name=preset))
        rows.append([f"`{preset}`", shown(c.advantage, c.advantage_options),
                     shown(c.policy_loss, c.policy_loss_options) if c.policy_loss else "DPO's loss (preference pairs)", f"`{c.step}`"])
    return table(["algorithm.name", "advantage estimator", "policy loss", "step"], rows)


def page(repo: Path) -> str:
    from kuberl.engine.algorithms import ADVANTAGES, POLICY_LOSSES
    from kuberl.engine.steps import STEPS

    out = [header("the engine's registries (kuberl.engine.algorithms, kuberl.engine.steps) and this generator's formulas"),
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
           _presets(), "\n",
           "## What `kuberl algorithms` prints\n\n```text\n$ kuberl algorithms\n", _cli_output(), "```\n\n",
           "## Advantage estimators\n\n",
           "Notation: r_i is the reward of response i, G(i) the n responses to its prompt, t a response token, "
           "|o_i| the response's length. A per-response advantage is given to each of its tokens.\n\n"]
    for name, e in sorted(ADVANTAGES.items()):
        formula, reference = _formula(name, ADVANTAGE_FORMULAS, "advantage estimator")
        needs = [n for n, on in (("a critic (`roles.critic`)", e.needs_critic), (f"`rollout.samplesPerPrompt` ≥ {e.min_samples}",
                 e.min_samples > 1), ("a greedy rollout per prompt", e.needs_greedy)) if on]
        out.append(_entry(name, e.summary, formula, reference, [f"Options: {_options(e)}", f"Needs: {', '.join(needs) or 'nothing more'}"]))
    out.append("## Policy losses\n\nρ_t = exp(log π_θ(t) - log π_old(t)) is the probability ratio of a sampled token (the "
               "log-ratio clamped to ±20), sg() stops the gradient, ε_low and ε_high are the loss's `clipLow` and `clipHigh`. "
               "L_t is a token's loss; `aggregation` makes one number of them (below).\n\n")
    for name, loss in sorted(POLICY_LOSSES.items()):
        formula, reference = _formula(name, LOSS_FORMULAS, "policy loss")
        out.append(_entry(name, loss.summary, formula, reference, [f"Options: {_options(loss)}"]))
    out.append("## Step functions\n\n")
    rows = [[f"`{s.name}`", cell(s.summary), cell(STEP_NOTES.get(s.name, "")), "yes" if s.on_policy else "no"] for s in sorted(STEPS.values(), key=lambda s: s.name)]
    out.append(table(["algorithm.step", "summary", "what it does", "generates"], rows) + "\n")
    from kuberl.engine.algorithms.tensors import Aggregation, KLEstimator

    out.append("## Loss aggregation\n\n`algorithm.lossAggregation` (and a loss's `aggregation` option), over a mini-batch of B "
               "responses. Whatever the micro-batches, the update is the whole mini-batch's: each micro-batch's loss is "
               "scaled by its share of the mini-batch's tokens (or responses).\n\n")
    out.append(table(["aggregation", "one number from the token losses L_{i,t}"],
                     [[f"`{a}`", cell(AGGREGATIONS[a])] for a in typing.get_args(Aggregation)]) + "\n")
    out.append("## KL to the reference policy\n\n`algorithm.klCoef` > 0 adds klCoef · KL to the loss (or, with "
               "`klInReward`, subtracts it from each token's reward); `algorithm.klEstimator` estimates it per token from "
               "x = log π_θ(t) - log π_ref(t) (Schulman, 2020, [Approximating KL Divergence](http://joschu.net/blog/kl-approx.html)):\n\n")
    out.append(table(["klEstimator", "per-token estimate"], [[f"`{k}`", cell(KL_ESTIMATORS[k])] for k in typing.get_args(KLEstimator)]) + "\n")
    out.append("## The rest of an update\n\n```text\n"
               "actor:         L = L_policy + klCoef · agg(KL_t) - entropyCoef · agg(H_t)\n"
               "               (agg: lossAggregation; the KL term is in the reward instead with klInReward)\n"
               "critic (ppo):  L_V = valueLossCoef · 0.5 · agg(max((V - R)², (V_old + clip(V - V_old, -valueClip, valueClip) - R)²))\n"
               "tis:           A_t ← A_t · min(π_old(t) / π_rollout(t), cap)    (π_old recomputed by the trainer, π_rollout vLLM's)\n"
               "dapo overlong: reward += -overlongPenalty · clamp(|o| - (maxNewTokens - overlongBuffer), 0, overlongBuffer) / overlongBuffer\n"
               "dpo:           m = β·[(log π_θ(y_w) - log π_ref(y_w)) - (log π_θ(y_l) - log π_ref(y_l))]\n"
               "               L = -(1 - ε)·log σ(m) - ε·log σ(-m)      (β = dpo.beta, ε = dpo.labelSmoothing)\n```\n\n"
               "References: DPO, Rafailov et al., 2023, [Direct Preference Optimization](https://arxiv.org/abs/2305.18290); "
               f"the overlong penalty and dynamic sampling, {_DAPO}; truncated importance sampling, Yao et al., 2025.\n")
    return "".join(out)
