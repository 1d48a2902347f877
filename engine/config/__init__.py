"""The engine's configuration: pure pydantic models, importable without torch.

These sections are shared with the control plane: the RLJob's spec embeds them, and the operator
renders them into the config each pod's engine reads.
"""

from .algorithm import AlgorithmName, AlgorithmSpec
from .algorithm_catalog import DAPOSpec, DPOSpec, GAESpec, GRPOSpec, PPOSpec, ReinforcePPSpec
from .base import RULE_ERROR_TYPE, LocalPath, Rule, SpecModel
from .data import DataSpec, DatasetSource, GeneratorSpec
from .layout import ActorLayout, ParallelLayout
from .lora import LoRASpec
from .model import ModelSpec, SecretKeyRef, TokenizerSpec, WeightsSource
from .progress import PROGRESS_KEY, CheckpointStatus, ProgressReport
from .reward import PythonReward, RewardRule, RewardSpec
from .rollout import RolloutSpec
from .topology import EngineConfig, EngineRoleName, RoleTopology
from .trainer import CheckpointSpec, OptimizerSpec, TrainerSpec

__all__ = [
    "ActorLayout",
    "AlgorithmName",
    "AlgorithmSpec",
    "CheckpointSpec",
    "CheckpointStatus",
    "DAPOSpec",
    "DPOSpec",
    "DataSpec",
    "DatasetSource",
    "EngineConfig",
    "EngineRoleName",
    "GAESpec",
    "GRPOSpec",
    "LoRASpec",
    "LocalPath",
    "GeneratorSpec",
    "ModelSpec",
    "OptimizerSpec",
    "PPOSpec",
    "PROGRESS_KEY",
    "ParallelLayout",
    "ProgressReport",
    "PythonReward",
    "RULE_ERROR_TYPE",
    "ReinforcePPSpec",
    "RewardRule",
    "RewardSpec",
    "RoleTopology",
    "RolloutSpec",
    "Rule",
    "SecretKeyRef",
    "SpecModel",
    "TokenizerSpec",
    "TrainerSpec",
    "WeightsSource",
]
