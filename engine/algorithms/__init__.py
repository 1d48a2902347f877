"""RL algorithms as pure tensor functions, behind registries.

tensors: the helpers every algorithm shares; inputs: the records the functions read; advantages,
group_baselines, token_baselines: the registered estimators; policy_losses, covariance_losses,
trust_region_losses, rollout_correction, preference: the registered losses; terms: the KL and
entropy terms and the TIS weights; registry: the registries and their records; presets: what
`algorithm.name` selects, one file each. Nothing here touches a model, a process group or a global
other than the registries: every function is its own unit test.
"""

from . import advantages as _advantages  # noqa: F401  (registers the built-in estimators)
from . import covariance_losses as _covariance_losses  # noqa: F401  (registers the built-in losses)
from . import group_baselines as _group_baselines  # noqa: F401
from . import policy_losses as _policy_losses  # noqa: F401
from . import preference as _preference  # noqa: F401
from . import rollout_correction as _rollout_correction  # noqa: F401
from . import token_baselines as _token_baselines  # noqa: F401
from . import trust_region_losses as _trust_region_losses  # noqa: F401
from .advantages import gae, grpo_advantages, reinforce_pp_advantages, rloo_advantages, token_rewards
from .policy_losses import policy_loss, value_loss
from .preference import dpo_loss
from .presets import PRESETS, AlgorithmChoice, Preset, choice_of, clip_options, estimator_of, preset_entry, register_preset
from .registry import (
    ADVANTAGES,
    POLICY_LOSSES,
    AdvantageEstimator,
    AdvantageInputs,
    Advantages,
    LossInputs,
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
from .terms import Term, entropy_term, kl_term, tis_weights

__all__ = [
    "ADVANTAGES",
    "AdvantageEstimator",
    "AdvantageInputs",
    "Advantages",
    "Aggregation",
    "AlgorithmChoice",
    "KLEstimator",
    "LossInputs",
    "POLICY_LOSSES",
    "PRESETS",
    "PolicyLoss",
    "Preset",
    "Term",
    "advantage_estimator",
    "aggregate",
    "broadcast_to_tokens",
    "choice_of",
    "clip_options",
    "dpo_loss",
    "entropy_from_logits",
    "entropy_term",
    "estimator_of",
    "gae",
    "group_mean",
    "grpo_advantages",
    "kl_estimate",
    "kl_term",
    "last_token_rewards",
    "masked_mean",
    "masked_sum",
    "masked_whiten",
    "policy_loss",
    "policy_loss_entry",
    "preset_entry",
    "register_advantage",
    "register_policy_loss",
    "register_preset",
    "reinforce_pp_advantages",
    "rloo_advantages",
    "tis_weights",
    "token_rewards",
    "value_loss",
]
