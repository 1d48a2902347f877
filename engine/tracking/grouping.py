"""Which group each metric of a step's record belongs to in the trackers (verl's grouping).

The names stay those of metrics.jsonl, under a group: actor/policy_loss, reward/reward_mean,
timing/rollout, ... Names that already have a group (reward/math_answer, critic/value_loss,
rollout/mismatch_kl) keep it; a metric nobody grouped (a plug-in step's own) goes under actor/.
"""

from __future__ import annotations

from typing import Any, Mapping

_GROUPS: dict[str, tuple[str, ...]] = {
    "reward": ("reward_mean",),
    "val": ("validation_reward_mean",),
    "rollout": ("response_length_mean",),
    "perf": (
        "rollout_tokens_per_second",
        "rollout_prefix_cache_hit_ratio",
        "reshard_bytes",
        "offloaded_bytes",
        "switch_bytes",
        "switch_full_bytes",
        "adapter_bytes",
        "adapter_received_bytes",
        "train_tokens_per_second",
        "train_positions",
        "train_positions_per_token",
    ),
    "timing": (
        "step_seconds",
        "reshard_seconds",
        "switch_back_seconds",
        "switch_back_hidden_seconds",
        "switch_hidden_share",
        "reshard_share",
        "adapter_seconds",
    ),
}
GROUP_OF: dict[str, str] = {name: group for group, names in _GROUPS.items() for name in names}
NOT_SCALARS = ("step", "checkpoint")


def tracked_scalars(record: Mapping[str, Any]) -> dict[str, float]:
    """The record's numbers by their tracker names; phase_seconds becomes timing/<phase>."""
    out: dict[str, float] = {}
    for key, value in record.items():
        if key in NOT_SCALARS:
            continue
        if key == "phase_seconds" and isinstance(value, Mapping):
            out.update({f"timing/{phase}": float(seconds) for phase, seconds in value.items()})
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out[key if "/" in key else f"{GROUP_OF.get(key, 'actor')}/{key}"] = float(value)
    return out


def flat_params(config: Mapping[str, Any] | list[Any], prefix: str = "") -> dict[str, str]:
    """A nested config as dotted names and string values (lists by index), for a tracker's run parameters."""
    out: dict[str, str] = {}
    items = config.items() if isinstance(config, Mapping) else enumerate(config)
    for key, value in items:
        name = f"{prefix}{key}"
        if isinstance(value, (Mapping, list)) and value:
            out.update(flat_params(value, name + "."))
        else:
            out[name] = str(value)
    return out
