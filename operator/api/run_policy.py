"""What the operator does around the run: restarts, suspension, deadlines, clean-up, gang admission."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from kuberl.engine.config import Rule, SpecModel
from kuberl.engine.config.base import pattern
from kuberl.engine.config.tracking import TrackingSpec

from .kube_grammar import DNSSubdomain


class SchedulingPolicy(SpecModel):
    """Gang admission: all of a job's pods start together or none do."""

    gang_scheduler: Literal["none", "kueue", "volcano"] = "none"
    """none: the default scheduler; kueue: admitted through a LocalQueue; volcano: a PodGroup with minMember."""
    queue_name: str | None = Field(default=None, min_length=1, max_length=63, pattern=pattern(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", "a queue name: lower-case letters, digits and '-', starting and ending with a letter or digit"))
    """kueue: the LocalQueue; volcano: the Volcano queue (optional)."""
    priority_class_name: DNSSubdomain | None = None
    """The PriorityClass of every pod."""

    RULES = (
        Rule(
            message="gangScheduler kueue needs queueName",
            check=lambda s: s.gang_scheduler != "kueue" or s.queue_name is not None,
            cel="self.gangScheduler != 'kueue' || has(self.queueName)",
            field="queueName",
        ),
        Rule(
            message="queueName needs gangScheduler kueue or volcano",
            check=lambda s: s.queue_name is None or s.gang_scheduler != "none",
            cel="!has(self.queueName) || self.gangScheduler != 'none'",
            field="queueName",
        ),
    )


class RunPolicy(SpecModel):
    """Restarts, suspension, deadline and clean-up."""

    backoff_limit: int = Field(default=3, ge=0, le=1000)
    """Gang restarts allowed before the job is Failed; each restart resumes from the last checkpoint."""
    suspend: bool = False
    """true removes the pods and keeps the checkpoints; false resumes."""
    active_deadline_seconds: int | None = Field(default=None, ge=1)
    """Fail the job (DeadlineExceeded) when it has run this long."""
    ttl_seconds_after_finished: int | None = Field(default=None, ge=0)
    """Delete the finished RLJob after this many seconds."""
    termination_grace_period_seconds: int = Field(default=300, ge=1, le=86400)
    """How long a trainer pod has after SIGTERM (deletion, eviction, preemption, a node drain) to finish
    its step and write a checkpoint before it is killed; more than one step plus one checkpoint.
    `kuberl run` gives its ranks as long after Ctrl-C."""
    scheduling: SchedulingPolicy = SchedulingPolicy()


class MonitoringSpec(SpecModel):
    """Metrics of the job's controller rank, for Prometheus, and experiment trackers."""

    enabled: bool = True
    """Serve Prometheus metrics from the controller rank (and add the metrics port to the Service)."""
    metrics_port: int = Field(default=9400, ge=1024, le=65535)
    """The port of the /metrics endpoint."""
    tracking: list[TrackingSpec] = Field(default=[], max_length=3)
    """TensorBoard, MLflow and W&B, each at most once; the controller rank writes to each."""

    RULES = (
        Rule(
            message="each tracking backend may appear once",
            check=lambda s: len({t.backend for t in s.tracking}) == len(s.tracking),
            cel="self.tracking.all(a, self.tracking.exists_one(b, b.backend == a.backend))",
            field="tracking",
        ),
    )
