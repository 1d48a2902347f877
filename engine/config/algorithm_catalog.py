"""The registered advantage estimators and policy losses: names, traits and options, without torch.

Generated from kuberl.engine.algorithms' registries. Do not edit: run
`.venv/bin/python -m kuberl.engine.algorithms.catalog > engine/config/algorithm_catalog.py`.
Options are by their manifest (camelCase) names, with their defaults (None: required or unset).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class CatalogEntry:
    summary: str
    options: dict[str, Any]
    needs_critic: bool = False
    min_samples: int = 1
    needs_greedy: bool = False


ADVANTAGES: dict[str, CatalogEntry] = {
    'gae': CatalogEntry('generalised advantage estimation with a learned critic (PPO)', {'gamma': 1.0, 'lambda': 0.95, 'whiten': True}, needs_critic=True, min_samples=1, needs_greedy=False),
    'gpg': CatalogEntry("score minus its group's mean, scaled by batch / informative samples (GPG)", {}, needs_critic=False, min_samples=2, needs_greedy=False),
    'grpo': CatalogEntry("score minus its group's mean, over the group's std (or not: Dr. GRPO)", {'normalizeByStd': True}, needs_critic=False, min_samples=2, needs_greedy=False),
    'grpo_passk': CatalogEntry('only the best sample of a group learns, by its margin over the second best (pass@k)', {'normalizeByStd': True}, needs_critic=False, min_samples=2, needs_greedy=False),
    'opo': CatalogEntry("score minus its group's length-weighted mean score (OPO's optimal baseline)", {}, needs_critic=False, min_samples=2, needs_greedy=False),
    'reinforce_pp': CatalogEntry('return-to-go whitened over the batch, after an optional group baseline (REINFORCE++)', {'baseline': None}, needs_critic=False, min_samples=1, needs_greedy=False),
    'remax': CatalogEntry('return minus the reward of a greedy response to the same prompt (ReMax)', {}, needs_critic=False, min_samples=1, needs_greedy=True),
    'rloo': CatalogEntry('score minus the mean of the other samples of its prompt', {}, needs_critic=False, min_samples=2, needs_greedy=False),
}

POLICY_LOSSES: dict[str, CatalogEntry] = {
    'cispo': CatalogEntry('REINFORCE with the clipped importance weight detached (CISPO)', {'clipHigh': 5.0, 'aggregation': 'token_mean'}),
    'clip_cov': CatalogEntry('PPO clip, plus no gradient for the few tokens of largest log-prob/advantage covariance (Clip-Cov)', {'clipLow': 0.2, 'clipHigh': None, 'fraction': 0.0002, 'covLow': 1.0, 'covHigh': 5.0, 'aggregation': 'token_mean'}),
    'gmpo': CatalogEntry('the geometric mean of the token ratios, clipped per token in log space (GMPO)', {'clipLow': 0.4, 'clipHigh': 0.4}),
    'gpg': CatalogEntry('the plain policy gradient, -A log p, no ratio and no clipping (GPG)', {'aggregation': 'token_mean'}),
    'gspo': CatalogEntry('PPO clipping of the sequence-level (geometric-mean) ratio (GSPO)', {'clipLow': 0.0003, 'clipHigh': 0.0004, 'aggregation': 'seq_mean_token_mean'}),
    'kl_cov': CatalogEntry('the unclipped surrogate, plus a KL penalty on the few tokens of largest covariance (KL-Cov)', {'fraction': 0.002, 'klCoef': 1.0, 'aggregation': 'token_mean'}),
    'ppo_clip': CatalogEntry("PPO's clipped surrogate; clipHigh > clipLow is DAPO's clip-higher; dualClip bounds negative advantages", {'clipLow': 0.2, 'clipHigh': None, 'aggregation': 'token_mean', 'dualClip': None}),
    'sapo': CatalogEntry('a smooth sigmoid gate of the ratio instead of a hard clip, sharper for negative advantages (SAPO)', {'tauPos': 1.0, 'tauNeg': 1.05, 'aggregation': 'token_mean'}),
}

STEPS: dict[str, CatalogEntry] = {
    'dpo': CatalogEntry("DPO on the data's chosen/rejected pairs against the reference policy", {}),
    'dynamic_sampling': CatalogEntry('DAPO: keep only groups whose rewards differ, drawing more prompts to fill the step', {}),
    'on_policy': CatalogEntry('generate, score, reference/critic forward, advantages, update (PPO, GRPO, RLOO, REINFORCE++, ...)', {}),
}
