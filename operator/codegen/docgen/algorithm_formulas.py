"""The formulas and notes of the algorithm reference (algorithms.py), written from engine/algorithms/*.py.

A built-in registered without a formula here fails the generator, so the page cannot leave one out.
Notation: r_i the reward of response i; G(i) the responses to its prompt (n of them); t a response
token; A_t its advantage; ρ_t = exp(log π_θ(t) - log π_old(t)) (log-ratio clamped to ±20); sg() stops
the gradient; ε_low, ε_high the loss's clipLow and clipHigh.
"""

from __future__ import annotations

_PPO = "Schulman et al., 2017, [Proximal Policy Optimization Algorithms](https://arxiv.org/abs/1707.06347)"
_GAE = (
    "Schulman et al., 2016, [High-Dimensional Continuous Control Using Generalized Advantage Estimation](https://arxiv.org/abs/1506.02438)"
)
_GRPO = "Shao et al., 2024, [DeepSeekMath](https://arxiv.org/abs/2402.03300) (GRPO)"
_DR_GRPO = "Liu et al., 2025, [Understanding R1-Zero-Like Training: A Critical Perspective](https://arxiv.org/abs/2503.20783) (Dr. GRPO)"
DAPO = "Yu et al., 2025, [DAPO: An Open-Source LLM Reinforcement Learning System at Scale](https://arxiv.org/abs/2503.14476)"
_COV = "Cui et al., 2025, [The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models](https://arxiv.org/abs/2505.22617)"
_DPPO = "2026, [Divergence-bounded policy optimisation (DPPO)](https://arxiv.org/abs/2602.04879)"
_OTB = "verl's optimal token baseline (the optimal baseline of each token position under the score function's variance)"

ADVANTAGE_FORMULAS = {
    "gae": (
        "reward_t = r_i on the last token, 0 before it (minus klCoef·KL_t with klInReward)\n"
        "δ_t = reward_t + γ·V_{t+1} - V_t        (V after the last token = 0; masked positions are skipped)\n"
        "A_t = Σ_k (γλ)^k · δ_{t+k}\n"
        "R_t = A_t + V_t                         (the critic's targets)\n"
        "whiten: A ← (A - mean(A)) / std(A) over the batch's response tokens",
        _GAE,
    ),
    "grpo": (
        "A_i = (r_i - mean_{G(i)} r) / (std_{G(i)} r + 1e-6)     (std unbiased)\nnormalizeByStd: false →  A_i = r_i - mean_{G(i)} r",
        f"{_GRPO}; without the std: {_DR_GRPO}",
    ),
    "rloo": (
        "A_i = r_i - (1 / (n - 1)) · Σ_{j ∈ G(i), j ≠ i} r_j",
        "Ahmadian et al., 2024, [Back to Basics: Revisiting REINFORCE Style Optimization for Learning from Human "
        "Feedback in LLMs](https://arxiv.org/abs/2402.14740)",
    ),
    "reinforce_pp": (
        "s_i = r_i - mean_{G(i)} r   with the baseline (a group of one keeps r_i),  s_i = r_i   without\n"
        "(baseline unset: used when prompts have several samples)\n"
        "token rewards: s_i on the last token, minus klCoef·KL_t with klInReward\n"
        "A_t = whiten(Σ_{k ≥ t} γ^(k-t) · reward_k) over the batch's response tokens",
        "Hu, 2025, [REINFORCE++](https://arxiv.org/abs/2501.03262)",
    ),
    "opo": (
        "b = Σ_{j ∈ G(i)} |o_j| · r_j / Σ_{j ∈ G(i)} |o_j|       (|o_j| the response's length)\nA_i = r_i - b",
        "Hao et al., 2025, [On-Policy RL with Optimal Reward Baseline](https://arxiv.org/abs/2505.23585) (OPO)",
    ),
    "gpg": (
        "A_i = (r_i - mean_{G(i)} r) · B / B_valid\nB the batch's responses, B_valid those in groups whose rewards differ",
        "Chu et al., 2025, [GPG: A Simple and Strong Reinforcement Learning Baseline for Model Reasoning](https://arxiv.org/abs/2504.02546)",
    ),
    "remax": (
        "A_t = Σ_{k ≥ t} reward_k - r_greedy      (token rewards as for gae)\n"
        "r_greedy: the reward of one greedy response to the same prompt, generated and scored in the step",
        "Li et al., 2023, [ReMax](https://arxiv.org/abs/2310.10505)",
    ),
    "grpo_passk": (
        "in each group, only the best response b (the first on ties) learns:\n"
        "A_b = (r_(1) - r_(2)) / (std_{G} r + 1e-6)     (the best minus the second best; no std with "
        "normalizeByStd: false)\nA_i = 0 for every other response",
        "Thrampoulidis et al., 2025 (GRPO for pass@k)",
    ),
    "gdpo": (
        "for each reward source k (each rule, the python file, the model), with r_{i,k} its own reward:\n"
        "A_{i,k} = (r_{i,k} - mean_{G(i)} r_k) / (std_{G(i)} r_k + 1e-6)\n"
        "A = whiten(Σ_k w_k · A_{·,k}) over the batch's response tokens      (w_k the source's weight)\n"
        "a group of one: A_{i,k} = r_{i,k} / (1 + 1e-6) in the sum (verl's GRPO), then A_i = 0 after the whitening",
        "2026, [GDPO: Group reward-Decoupled Normalization Policy Optimization](https://arxiv.org/abs/2601.05242)",
    ),
    "optimal_token_baseline": (
        "G_t = Σ_{k ≥ t} reward_k;  w_t = 1 - 2·π_old(t) + Σ_v π_old(v | ·)²   (× tis weight² with tis)\n"
        "W_t = Σ_{j ≤ t} w_j\n"
        "B_t = Σ_{i ∈ G} G_{i,t}·W_{i,t} / (Σ_{i ∈ G} W_{i,t} + 1e-8)     (over the group, per position t)\n"
        "A_t = G_t - B_t        (a group of one: B = 0; handleZeroTail: B = 0 past the second-longest response)",
        _OTB,
    ),
    "tir_optimal_token_baseline": (
        "as optimal_token_baseline, with position t the t-th token of each response's own (its mask's)\n"
        "tokens, so that tool outputs inside a multi-turn response do not shift the alignment;\n"
        "handleZeroTail on by default",
        _OTB + ", tool-integrated reasoning variant",
    ),
}
LOSS_FORMULAS = {
    "ppo_clip": (
        "L_t = max(-A_t·ρ_t, -A_t·clip(ρ_t, 1 - ε_low, 1 + ε_high))      (ε_high = ε_low when clipHigh is unset)\n"
        "dualClip c > 1:  where A_t < 0,  L_t = min(L_t, -c·A_t)",
        f"{_PPO}; clip-higher: {DAPO}; dual clip: Ye et al., 2020",
    ),
    "gspo": (
        "log s_i = mean_t (log π_θ(t) - log π_old(t))      (the sequence's geometric-mean ratio)\n"
        "per token: log s_{i,t} = min(sg(log s_i) + log π_θ(t) - sg(log π_θ(t)), 10)     (value s_i, gradient s_i·∇log π_θ(t))\n"
        "L_t = max(-A_t·s_{i,t}, -A_t·clip(s_{i,t}, 1 - ε_low, 1 + ε_high))      (× the tis weight, with algorithm.tis)\n"
        "L = (1/B)·Σ_i (Σ_t L_t / |o_i|)      (aggregation seq_mean_token_mean, its default: each response weighs the same;\n"
        "                                       algorithm.lossAggregation does not change it, only the KL and entropy terms')",
        "Zheng et al., 2025, [Group Sequence Policy Optimization](https://arxiv.org/abs/2507.18071)",
    ),
    "cispo": (
        "L_t = -sg(clip(ρ_t, 1 - ε_low, 1 + ε_high)) · A_t · log π_θ(t)      (no lower bound when clipLow is unset)",
        "MiniMax, 2025, [MiniMax-M1](https://arxiv.org/abs/2506.13585) (CISPO)",
    ),
    "gpg": ("L_t = -A_t · log π_θ(t)", "Chu et al., 2025, [GPG](https://arxiv.org/abs/2504.02546)"),
    "sapo": (
        "L_t = -f(ρ_t) · A_t,   f(ρ) = (4/τ) · sigmoid(τ·(ρ - 1)),   τ = tauPos if A_t > 0 else tauNeg",
        "Qwen, 2025, [Soft Adaptive Policy Optimization](https://arxiv.org/abs/2511.20347) (SAPO)",
    ),
    "clip_cov": (
        "L_t as ppo_clip;  c_t = (A_t - mean A) · (log π_θ(t) - mean log π_θ) over the micro-batch's tokens\n"
        "of the tokens PPO did not clip with covLow < c_t < covHigh, the k of largest c_t get L_t = 0\n"
        "(k = max(1, ⌊fraction · response tokens⌋); verl draws them at random, kuberl takes the largest)",
        _COV,
    ),
    "kl_cov": ("L_t = -A_t·ρ_t,  plus klCoef·|log π_θ(t) - log π_old(t)| on the k tokens of largest c_t\n(c_t and k as in clip_cov)", _COV),
    "gmpo": (
        "ℓ_t = log ρ_t,  ℓ'_t = clip(ℓ_t, -ε_low, ε_high),  p_t = sign(A)·min(sign(A)·ℓ_t, sign(A)·ℓ'_t)\n"
        "L = mean_i [ -(Σ_t A_t / |o_i|) · exp(Σ_t p_t / |o_i|) ]       (its own aggregation)",
        "Zhao et al., 2025, [Geometric-Mean Policy Optimization](https://arxiv.org/abs/2507.20673) (GMPO)",
    ),
    "dro": (
        "L_t = -(A_t · log π_θ(t) - β/2 · (log π_θ(t) - log π_old(t))²)",
        "Richemond et al., 2024, [Offline Regularised Reinforcement Learning for LLM Alignment](https://arxiv.org/abs/2405.19107) (DRO)",
    ),
    "dppo_tv": (
        "p = π_θ(t), p_old = π_old(t);  kept where A_t > 0 and p - p_old ≤ ε_high, or A_t ≤ 0 and p - p_old ≥ -ε_low\n"
        "L_t = -A_t · sg(min(ρ_t, truncation)) · log π_θ(t)   on kept tokens, 0 on the others\n"
        "(clipLow/clipHigh are bounds on the probability's move, not ratio ranges)",
        _DPPO,
    ),
    "dppo_kl": (
        "D_t = p_old·log(p_old / p) + (1 - p_old)·log((1 - p_old + 1e-8) / (1 - p + 1e-8))     (binary KL)\n"
        "kept where A_t > 0 and (D_t ≤ ε_high or p ≤ p_old), or A_t ≤ 0 and (D_t ≤ ε_low or p ≥ p_old)\n"
        "L_t as in dppo_tv",
        _DPPO,
    ),
    "bypass": (
        "vLLM's log-probs stand for the old policy's: r_t = exp(log π_θ(t) - log π_rollout(t))\n"
        "lossType ppoClip:   L_t as ppo_clip with r_t, dualClip included (no further weight)\n"
        "lossType reinforce: L_t = -A_t · w_t · log π_θ(t),  w_t = sg(min(ρ, isThreshold)),\n"
        "                    ρ = r_t (rolloutIs: token), exp(Σ_t log r_t) of the response (sequence), 1 (none);\n"
        "                    isBatchNormalize: w / mean(w) over the micro-batch's tokens (token) or responses (sequence)\n"
        "rolloutRs (both):   l_t = clamp(log r_t, ±20); k1 = -l_t, k2 = l_t²/2, k3 = exp(l_t) - 1 - l_t;\n"
        "                    token_kN judges each token, seq_sum_kN / seq_mean_kN / seq_max_kN a response's sum / mean / max;\n"
        "                    kept: |k1| ≤ log rsThreshold, k2 or k3 ≤ rsThreshold; a rejected token leaves the numerator,\n"
        "                    not the token and response counts",
        "verl's rollout correction, bypass mode (Yao et al., 2025, truncated importance sampling)",
    ),
    "dpo": (
        "s(y) = Σ_t log π(y_t): rows come in pairs, chosen y_w then rejected y_l\n"
        "m = β·[(s_θ(y_w) - s_ref(y_w)) - (s_θ(y_l) - s_ref(y_l))]\n"
        "L = mean over pairs of -(1 - ε)·log σ(m) - ε·log σ(-m)      (ε = labelSmoothing)",
        "Rafailov et al., 2023, [Direct Preference Optimization](https://arxiv.org/abs/2305.18290)",
    ),
}
STEP_NOTES = {
    "on_policy": "generate, score, reference and critic forward (and recomputed old log-probs), advantages, update; "
    "with an estimator that needs a greedy rollout (remax) it also generates and scores one greedy response per "
    "prompt, and with one that reads the squared probabilities (the optimal token baselines) it runs one more forward",
    "dynamic_sampling": "drops the groups whose samples all got the same reward and draws more prompts until the step has "
    "promptsPerStep informative groups or algorithm.dapo.maxDraws batches were drawn (metrics "
    "dynamic_sampling/draws, prompts_drawn, groups_kept)",
    "dpo": "no rollout: each step takes promptsPerStep preference pairs, the reference's log-probs of them, and updates "
    "the actor with the job's loss over pairs",
}
AGGREGATIONS = {
    "token_mean": "Σ_{i,t} L_{i,t} / Σ_i |o_i|  (every token weighs the same)",
    "token_sum": "Σ_{i,t} L_{i,t}  (no divisor)",
    "seq_mean_token_sum": "(1/B) · Σ_i Σ_t L_{i,t}",
    "seq_mean_token_mean": "(1/B) · Σ_i (Σ_t L_{i,t} / |o_i|)  (every response weighs the same)",
    "seq_mean_token_sum_norm": "Σ_{i,t} L_{i,t} / (B · T),  T = algorithm.lossScaleFactor, by default rollout.maxNewTokens (a constant: Dr. GRPO)",
}
KL_ESTIMATORS = {
    "k1": "x",
    "k2": "x² / 2",
    "k3": "clamp(exp(-x) - 1 + x, -10, 10)  (x clamped to ±20)",
    "abs": "|x|",
    "k1+": "k1's value, k2's gradient (straight-through)",
    "k3+": "k3's value, k2's gradient (straight-through)",
    "abs+": "abs's value, k2's gradient (straight-through)",
}
# Where a registered function differs from verl's function of the same name, on purpose (each docstring says so too).
VERL_DIFFERENCES = [
    (
        "grpo, opo, gpg, grpo_passk, rloo",
        "A group of one sample gets advantage 0 (rloo refuses it, grpo_passk skips it); verl takes "
        "its mean as 0 and gives it its raw score. A job whose estimator needs a group is refused with one sample per prompt, "
        "so no job trains on those zeros.",
    ),
    (
        "gpg",
        "The scale is B / B_valid, B_valid the responses in groups whose rewards differ (the paper's B / (B - M)); verl "
        "divides by the responses with a nonzero reward.",
    ),
    (
        "sapo, gspo",
        "Their loss is aggregated by their own `aggregation` option, seq_mean_token_mean unless set, which verl "
        "always uses for them; `algorithm.lossAggregation` does not change it (the gspo preset passes no options), and an "
        "explicit `aggregation` option is honoured here, where verl ignores it.",
    ),
    (
        "clip_cov",
        "Of the eligible tokens, the ones of largest covariance are frozen (reproducible without a random stream); "
        "verl draws them at random.",
    ),
    (
        "clip_cov, kl_cov, gmpo",
        "The log-ratio is clamped to ±20 before its exp, as in the other losses (verl's do not clamp it): they differ only past that.",
    ),
    (
        "ppo_clip, bypass",
        "dualClip is off unless set; verl applies a dual clip of 3 by default (clip_ratio_c), in the bypass mode's ppo_clip too.",
    ),
    ("kl_cov", "The default fraction is 2e-3 (the paper's runs); verl's default is 2e-4."),
    (
        "gdpo",
        "The reward sources are the job's (each rule, the python file, the model), weighted by their weights in "
        "`reward`; verl names them in gdpo_reward_keys, weighted 1 unless gdpo_reward_weights says otherwise. A group of one "
        "enters the whitening with verl's value (its raw scores), so every other sample's advantage is verl's; after the "
        "whitening its own advantage is 0, where verl keeps its whitened value.",
    ),
    (
        "bypass",
        "One rolloutRs mode per job (verl ANDs a comma-separated list); a k1 mode keeps the ratio within "
        '[1/rsThreshold, rsThreshold] (verl\'s asymmetric "L_U" form and its IcePop weights are not offered); '
        "isBatchNormalize takes the mean over the rank's micro-batch, where verl all-reduces it over every rank.",
    ),
]
