"""The RLJob API (kuberl.dev/v1alpha1), defined once as pydantic models.

The CRD in crds/ is generated from these models (kuberl.operator.api.crd); the engine's sections come
from kuberl.engine.config and are embedded unchanged.
"""

from .resource import (
    API_VERSION,
    CATEGORIES,
    GROUP,
    KIND,
    PLURAL,
    SHORT_NAMES,
    SINGULAR,
    VERSION,
    ObjectMeta,
    RLJob,
)
from .roles import (
    GPU_RESOURCE,
    ROLE_NAMES,
    ActorSpec,
    PodGroupSpec,
    ResourceRequirements,
    RoleName,
    Roles,
    RoleSpec,
    Toleration,
)
from .run_policy import MonitoringSpec, RunPolicy, SchedulingPolicy
from .spec import MASTER_PORT, RLJobSpec
from .status import PHASES, CheckpointStatus, Condition, InitializationStatus, MetricsSnapshot, Phase, RLJobStatus, RoleStatus

__all__ = [
    "API_VERSION",
    "ActorSpec",
    "CATEGORIES",
    "CheckpointStatus",
    "Condition",
    "GPU_RESOURCE",
    "GROUP",
    "KIND",
    "MASTER_PORT",
    "InitializationStatus",
    "MetricsSnapshot",
    "MonitoringSpec",
    "ObjectMeta",
    "PHASES",
    "PLURAL",
    "Phase",
    "PodGroupSpec",
    "RLJob",
    "RLJobSpec",
    "RLJobStatus",
    "ROLE_NAMES",
    "ResourceRequirements",
    "RoleName",
    "RoleSpec",
    "RoleStatus",
    "Roles",
    "RunPolicy",
    "SHORT_NAMES",
    "SINGULAR",
    "SchedulingPolicy",
    "Toleration",
    "VERSION",
]
