"""A new policy loss for kuberl, with no change to kuberl: PPO's surrogate with the ratio squashed by tanh.

algorithm:
  name: grpo
  plugins: [{path: examples/plugins/soft_clip.py}]
  policyLoss: {name: soft_clip, options: {width: 0.2}}
"""

import torch

from kuberl.engine.algorithms import LossInputs, masked_mean, register_policy_loss


@register_policy_loss("soft_clip", summary="-A times the ratio squashed by tanh into 1 +- width")
def soft_clip(inputs: LossInputs, width: float = 0.2, aggregation: str = "token_mean") -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    ratio = torch.exp(torch.clamp(inputs.logprobs - inputs.old_logprobs, -20.0, 20.0))
    soft = 1.0 + width * torch.tanh((ratio - 1.0) / width)
    loss = -inputs.advantages * soft
    return inputs.aggregate(loss, aggregation), {"approx_kl": masked_mean(inputs.old_logprobs - inputs.logprobs, inputs.mask).detach()}
