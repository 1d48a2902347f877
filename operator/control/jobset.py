"""The JobSet of an RLJob: every pod of every role, as one object that Kueue admits whole.

One replicated job per role with pods of its own (pod_spec.replicated_job), and the actor's first pod,
which holds the controller rank, in one of its own ("actor"; the actor's other pods are
"actor-peers"): only that pod gets the ServiceAccount token and the tracking secrets. JobSet gives the pods
stable hostnames under the job's headless Service (rank 0 is `<job>-actor-0-0.<job>`), restarts every
Job of the gang when one fails (failurePolicy: a rank cannot survive a lost peer; each restart
resumes from the last checkpoint) unless a rank said a restart cannot help (then it fails the whole
JobSet at once), and succeeds when the actor's Job completes (the other roles end
when the controller rank tells them to). Kueue, when the job names a LocalQueue, admits the JobSet as
one Workload with a PodSet per role: all of the job's pods, or none.

Why JobSet rather than Kueue's pod groups: the pods keep their indexed Jobs (completion index =
rank), JobSet's restart keeps the Workload admitted (a gang restart does not send the job back to the
queue), and Kueue, Kubeflow Trainer and MultiKueue all integrate it natively.
"""

from __future__ import annotations

from typing import Any

from kuberl.engine.config import EngineConfig

from ..api import RLJob
from .children import KUEUE_PRIORITY_LABEL, KUEUE_QUEUE_LABEL, PREEMPTIONS_BEFORE, RESTARTS_BEFORE, OperatorSettings, Owner
from .pod_spec import pod_groups, replicated_job

API_VERSION = "jobset.x-k8s.io/v1alpha2"
KIND = "JobSet"
CRD = "jobsets.jobset.x-k8s.io"
MULTIKUEUE_MANAGER = "kueue.x-k8s.io/multikueue"
NOT_RETRYABLE_RULE = "NotRetryable"  # JobSet's webhook: a letter, then letters, digits, _ , : (no hyphen)
JOB_REASON_POD_FAILURE_POLICY = "PodFailurePolicy"
"""The reason of a Job's Failed condition when a podFailurePolicy rule failed it."""


def jobset(
    job: RLJob, config: EngineConfig, settings: OperatorSettings, owner: Owner, *, restarts_before: int = 0, preemptions_before: int = 0
) -> dict[str, Any]:
    """The job's JobSet. `restarts_before`/`preemptions_before`: the RLJob's counts when it is made (a
    suspended job's JobSet is deleted and made again): its gang restarts count on from there."""
    spec = job.spec
    scheduling = spec.run_policy.scheduling
    meta = owner.meta(owner.name)
    groups = pod_groups(job, config)
    meta["annotations"] = {RESTARTS_BEFORE: str(restarts_before), PREEMPTIONS_BEFORE: str(preemptions_before)}
    body: dict[str, Any] = {
        # Our own headless Service (planner.py) has this name, selects every pod and serves the metrics
        # port: JobSet finds it and does not make another.
        "network": {"subdomain": owner.name, "enableDNSHostnames": True, "publishNotReadyAddresses": True},
        "failurePolicy": {
            "maxRestarts": max(0, spec.run_policy.backoff_limit - restarts_before),
            "restartStrategy": "Recreate",
            # A Job failed by its podFailurePolicy (a rank exited NOT_RETRYABLE_EXIT_CODE): the whole job fails now.
            "rules": [{"name": NOT_RETRYABLE_RULE, "action": "FailJobSet", "onJobFailureReasons": [JOB_REASON_POD_FAILURE_POLICY]}],
        },
        # Done when every actor pod is: the other roles end when the controller rank tells them to.
        "successPolicy": {"operator": "All", "targetReplicatedJobs": [g.name for g in groups if g.role == "actor"]},
        "replicatedJobs": [replicated_job(job, group, config, settings, owner) for group in groups],
    }
    if scheduling.queue_name:
        meta["labels"][KUEUE_QUEUE_LABEL] = scheduling.queue_name
        if scheduling.workload_priority_class:
            meta["labels"][KUEUE_PRIORITY_LABEL] = scheduling.workload_priority_class
        # Created suspended: no pod exists until Kueue admits the whole JobSet (its webhook would
        # suspend it too; saying so here keeps a job from starting where that webhook is missing).
        body["suspend"] = True
        if scheduling.multi_kueue:
            body["managedBy"] = MULTIKUEUE_MANAGER
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": meta, "spec": body}
