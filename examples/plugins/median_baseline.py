"""A new advantage estimator for kuberl, with no change to kuberl: score minus its group's median.

algorithm:
  name: grpo
  plugins: [{path: examples/plugins/median_baseline.py}]
  advantage: {name: median_baseline, options: {scale: 1.0}}
"""

import torch

from kuberl.engine.algorithms import AdvantageInputs, Advantages, broadcast_to_tokens, register_advantage


@register_advantage("median_baseline", min_samples=2, summary="score minus the median score of its prompt's samples")
def median_baseline(inputs: AdvantageInputs, scale: float = 1.0) -> Advantages:
    baseline = torch.empty_like(inputs.scores)
    for group in inputs.group.unique():
        members = inputs.group == group
        baseline[members] = inputs.scores[members].median()
    return Advantages(broadcast_to_tokens(scale * (inputs.scores - baseline), inputs.mask))
