"""Whether a job has sandbox pods, and where its trainers find them (sandbox_pods.py plans the pods;
pod_spec.py gives the trainers the address). Pure."""

from __future__ import annotations

from typing import Any

from kuberl.engine.config.multi_turn import SANDBOX_QUEUE_ENV, MultiTurnSpec

from ..api import RLJob
from .children import child_name

LABEL_SANDBOX = "kuberl.dev/sandbox"
"""On a job's sandbox pods: the job's name (they do not carry kuberl.dev/job: they are no rank of it)."""
SANDBOX_PORT = 8470
SANDBOX_URL_ENV = "KUBERL_SANDBOX_URL"
"""kuberl.engine.agents.sandbox_protocol's; repeated here, the operator imports only the engine's config."""
AGENT_SANDBOX = "agentSandbox"
"""rollout.multiTurn.sandbox.backend: the kubernetes-sigs agent-sandbox controller keeps the pods running."""
AGENT_SANDBOX_EXTENSIONS_API_VERSION = "extensions.agents.x-k8s.io/v1beta1"
"""SandboxTemplate and SandboxWarmPool, as agent-sandbox v1.0 serves them (its Sandbox is agents.x-k8s.io/v1beta1)."""


def multi_turn(job: RLJob) -> MultiTurnSpec | None:
    return job.spec.rollout.multi_turn if job.spec.rollout is not None else None


def wants_sandbox_pods(job: RLJob) -> bool:
    """Whether the job's tool calls run in sandbox pods: it has a tool that runs code, and its
    rollout.multiTurn.sandbox.pods is on (the default)."""
    spec = multi_turn(job)
    return spec is not None and spec.sandbox.pods and any(t.runs_code for t in spec.tools)


def sandbox_name(job_name: str) -> str:
    return child_name(job_name, "sandbox")


def sandbox_url(job_name: str, namespace: str) -> str:
    return f"http://{sandbox_name(job_name)}.{namespace}.svc:{SANDBOX_PORT}"


def sandbox_env(job: RLJob, namespace: str) -> list[dict[str, Any]]:
    """The trainer pods' variables that send their tool calls to the sandbox pods, and how long a call waits for
    a free one (none without them)."""
    if not wants_sandbox_pods(job):
        return []
    spec = multi_turn(job)
    assert spec is not None
    return [
        {"name": SANDBOX_URL_ENV, "value": sandbox_url(job.metadata.name or "", namespace)},
        {"name": SANDBOX_QUEUE_ENV, "value": str(spec.sandbox.queue_seconds)},
    ]
