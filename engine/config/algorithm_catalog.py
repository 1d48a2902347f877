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


ADVANTAGES: dict[str, CatalogEntry] = {
    'gae': CatalogEntry('generalised advantage estimation with a learned critic (PPO)', {'gamma': 1.0, 'lam': 0.95, 'whiten': True}, needs_critic=True, min_samples=1),
    'gpg': CatalogEntry("score minus its group's mean, scaled by batch / informative samples (GPG)", {}, needs_critic=False, min_samples=2),
    'grpo': CatalogEntry("score minus its group's mean, over the group's std (or not: Dr. GRPO)", {'normalizeByStd': True}, needs_critic=False, min_samples=2),
    'opo': CatalogEntry("score minus its group's length-weighted mean score (OPO's optimal baseline)", {}, needs_critic=False, min_samples=2),
    'reinforce_pp': CatalogEntry('return-to-go whitened over the batch, after an optional group baseline (REINFORCE++)', {'baseline': True}, needs_critic=False, min_samples=1),
    'rloo': CatalogEntry('score minus the mean of the other samples of its prompt', {}, needs_critic=False, min_samples=2),
}

POLICY_LOSSES: dict[str, CatalogEntry] = {
    'cispo': CatalogEntry('REINFORCE with the clipped importance weight detached (CISPO)', {'clipHigh': 5.0, 'aggregation': 'token_mean'}),
    'gpg': CatalogEntry('the plain policy gradient, -A log p, no ratio and no clipping (GPG)', {'aggregation': 'token_mean'}),
    'gspo': CatalogEntry('PPO clipping of the sequence-level (geometric-mean) ratio (GSPO)', {'clipLow': 0.0003, 'clipHigh': 0.0004, 'aggregation': 'seq_mean_token_mean'}),
    'ppo_clip': CatalogEntry("PPO's clipped surrogate; clip_high > clip_low is DAPO's clip-higher; dual_clip bounds negative advantages", {'clipLow': 0.2, 'clipHigh': None, 'aggregation': 'token_mean', 'dualClip': None}),
}
