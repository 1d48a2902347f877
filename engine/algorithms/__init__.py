"""RL algorithms as pure tensor functions, behind registries.

tensors: the helpers every algorithm shares; advantages and policy_losses: the registered
estimators and losses; preference: DPO; registry: the registries and their records; presets:
what `algorithm.name` selects. Nothing here touches a model, a process group or a global other
than the registries: every function is its own unit test.
"""

from . import advantages as _advantages  # noqa: F401  (registers the built-in estimators)
from . import policy_losses as _policy_losses  # noqa: F401  (registers the built-in losses)
from .advantages import gae, grpo_advantages, reinforce_pp_advantages, rloo_advantages, token_rewards
from .policy_losses import policy_loss, value_loss
from .preference import dpo_loss
from .presets import AlgorithmChoice, choice_of, estimator_of
from .registry import (
    ADVANTAGES,
    POLICY_LOSSES,
    AdvantageEstimator,
    AdvantageInputs,
    Advantages,
    PolicyLoss,
    advantage_estimator,
    policy_loss_entry,
    register_advantage,
    register_policy_loss,
)
from .tensors import (
    Aggregation,
    KLEstimator,
    aggregate,
    broadcast_to_tokens,
    entropy_from_logits,
    group_mean,
    kl_estimate,
    last_token_rewards,
    masked_mean,
    masked_sum,
    masked_whiten,
)

__all__ = [
    "ADVANTAGES", "AdvantageEstimator", "AdvantageInputs", "Advantages", "Aggregation", "AlgorithmChoice", "KLEstimator",
    "POLICY_LOSSES", "PolicyLoss", "advantage_estimator", "aggregate", "broadcast_to_tokens", "choice_of", "dpo_loss",
    "entropy_from_logits", "estimator_of", "gae", "group_mean", "grpo_advantages", "kl_estimate", "last_token_rewards", "masked_mean",
    "masked_sum", "masked_whiten", "policy_loss", "policy_loss_entry", "register_advantage", "register_policy_loss",
    "reinforce_pp_advantages", "rloo_advantages", "token_rewards", "value_loss",
]
