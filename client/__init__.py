"""kuberl.client: RLJobs from Python, with the user's kubeconfig (what the `kuberl` job commands and `kubectl rl` use).

    from kuberl.client import RLJobClient

    jobs = RLJobClient(namespace="rl")
    job = jobs.submit("examples/grpo-cluster/rljob.yaml")
    status = jobs.wait(job.metadata.name, "Succeeded", timeout=3600)
    for line in jobs.logs(job.metadata.name, rank=0):
        print(line)

Objects are the API's own models (kuberl.operator.api.RLJob, RLJobStatus). The operator never imports this package.
"""

from .errors import (
    ClientError,
    ConfigError,
    CRDNotInstalledError,
    ForbiddenError,
    ImmutableFieldsError,
    InvalidJobError,
    NoKubeconfigError,
    NotFoundError,
    PhaseError,
    UnreachableError,
    WaitTimeoutError,
)
from .jobs import RLJobClient
from .operators import OperatorDeployment

__all__ = [
    "CRDNotInstalledError",
    "ClientError",
    "ConfigError",
    "ForbiddenError",
    "ImmutableFieldsError",
    "InvalidJobError",
    "NoKubeconfigError",
    "NotFoundError",
    "OperatorDeployment",
    "PhaseError",
    "RLJobClient",
    "UnreachableError",
    "WaitTimeoutError",
]
