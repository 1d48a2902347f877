"""Rewards: rule functions by name (rules.py), a user's Python function and a reward model, summed with
weights (rewarder.py)."""

from .rewarder import Rewarder, RewardError, RewardModel, WeightedReward, load_python_reward
from .rules import RULES, RewardFn, format_match, last_number, length_penalty, math_answer

__all__ = [
    "RULES",
    "RewardError",
    "RewardFn",
    "RewardModel",
    "Rewarder",
    "WeightedReward",
    "format_match",
    "last_number",
    "length_penalty",
    "load_python_reward",
    "math_answer",
]
