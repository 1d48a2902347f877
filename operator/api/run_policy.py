"""What the operator does around the run: restarts, suspension, deadlines, clean-up, gang admission."""

from __future__ import annotations

from pydantic import Field

from kuberl.engine.config import Rule, SpecModel
from kuberl.engine.config.tracking import TrackingSpec

from .kube_grammar import DNSSubdomain


class SchedulingPolicy(SpecModel):
    """Admission through Kueue: every pod of the job is admitted together, or none is."""

    queue_name: DNSSubdomain | None = None
    """The Kueue LocalQueue (in the job's namespace) that admits the job: all of its pods, as one workload,
    or none of them. Leave out to run the job as soon as its pods can be scheduled."""
    workload_priority_class: DNSSubdomain | None = None
    """A Kueue WorkloadPriorityClass: the job's place in its queue, and which admitted jobs it may preempt."""
    priority_class_name: DNSSubdomain | None = None
    """The PriorityClass of every pod (the kube-scheduler's priority, and Kueue's when no workloadPriorityClass is set)."""
    multi_kueue: bool = False
    """The queue is a MultiKueue queue: the JobSet is managed by Kueue (spec.managedBy), which runs it on a worker
    cluster; this cluster's JobSet controller leaves it alone."""

    RULES = (
        Rule(
            message="multiKueue needs queueName: the queue's admission check sends the job to a worker cluster",
            check=lambda s: not s.multi_kueue or s.queue_name is not None,
            cel="!self.multiKueue || has(self.queueName)",
            field="multiKueue",
        ),
        Rule(
            message="workloadPriorityClass needs queueName: Kueue orders the jobs of its queues",
            check=lambda s: s.workload_priority_class is None or s.queue_name is not None,
            cel="!has(self.workloadPriorityClass) || has(self.queueName)",
            field="workloadPriorityClass",
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
