"""The operator's side effects: read an RLJob's children, apply `decide`'s answer, repeat.

kopf watches RLJobs and the children carrying the kuberl.dev/job label (with reconnects and watch
timeouts); every event only enqueues the job's key. A work queue hands each key to one worker at a
time, so one job is never reconciled twice at once, and a burst of pod events costs one reconcile.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from kubernetes import client, dynamic
from kubernetes.client.rest import ApiException
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from kuberl.engine.config import PROGRESS_KEY

from .api import GROUP, PHASES, PLURAL, VERSION, RLJob
from .cluster_rules import cluster_problems
from .manifest import ManifestError, parse_rljob
from .children import LABEL_COMPONENT, LABEL_JOB, MANAGER, OperatorSettings, child_name
from .jobset import API_VERSION as JOBSET_API_VERSION
from .planner import plan
from .reconcile import TERMINAL, Decision, Observed, decide

log = logging.getLogger("kuberl.operator")

JOBSET_GROUP, JOBSET_VERSION = JOBSET_API_VERSION.split("/")
KUEUE_GROUP, KUEUE_VERSION = "kueue.x-k8s.io", "v1beta2"
KUEUE_JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
# What Decision.delete names ("kind/name").
CHILD_KINDS = {"jobset": "JobSet", "job": "Job"}
CHILD_API_VERSIONS = {"jobset": JOBSET_API_VERSION, "job": "batch/v1"}

# How soon to look at a job again after something it was writing went away under it.
GONE_RETRY_SECONDS = 0.5

Key = tuple[str, str]  # (namespace, name)


class OperatorMetrics:
    """The operator's Prometheus metrics, in a registry of their own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.rljobs = Gauge("kuberl_operator_rljobs", "RLJobs by phase", ["phase"], registry=self.registry)
        self.reconcile_seconds = Histogram(
            "kuberl_operator_reconcile_duration_seconds", "Time of one reconcile of one RLJob", registry=self.registry,
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
        )
        self.errors = Counter("kuberl_operator_reconcile_errors_total", "Reconciles that raised", registry=self.registry)
        self.restarts = Counter("kuberl_operator_gang_restarts_total", "Gang restarts started", registry=self.registry)
        self._phases: dict[Key, str] = {}

    def observe_phase(self, key: Key, phase: str | None) -> None:
        if phase is None:
            self._phases.pop(key, None)
        else:
            self._phases[key] = phase
        for name in PHASES:
            self.rljobs.labels(phase=name).set(sum(1 for p in self._phases.values() if p == name))


class Reconciler:
    """One reconcile of one RLJob against the API. Blocking (the kubernetes client is synchronous)."""

    def __init__(self, api_client: client.ApiClient, settings: OperatorSettings, metrics: OperatorMetrics):
        self.settings = settings
        self.metrics = metrics
        self.custom = client.CustomObjectsApi(api_client)
        self.core = client.CoreV1Api(api_client)
        self.batch = client.BatchV1Api(api_client)
        self.dynamic = dynamic.DynamicClient(api_client)

    def reconcile(self, key: Key) -> float | None:
        """Bring one RLJob one step closer to its desired state; returns when to look again."""
        namespace, name = key
        try:
            raw = self.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
        except ApiException as exc:
            if exc.status == 404:
                self.metrics.observe_phase(key, None)
                return None  # deleted: the garbage collector removes the children we own
            raise
        if raw["metadata"].get("deletionTimestamp"):
            return None
        try:
            job = parse_rljob(raw, f"{namespace}/{name}")
            # What the API server cannot check: every path the engine opens lies on a volume of its pods.
            problems = cluster_problems(job, f"{namespace}/{name}", self.settings.default_image)
            if problems:
                raise ManifestError(problems)
        except ManifestError as exc:
            self._refuse(raw, exc)
            return None
        observed = self._observe(namespace, name)
        decision = decide(job, observed, datetime.now(timezone.utc))
        if not self.apply_unless_gone(raw, job, decision):
            return GONE_RETRY_SECONDS
        self.metrics.observe_phase(key, decision.status.phase)
        return decision.requeue_after

    # --- reading ---------------------------------------------------------------------------

    def _observe(self, namespace: str, name: str) -> Observed:
        selector = f"{LABEL_JOB}={name}"
        jobsets = self.custom.list_namespaced_custom_object(JOBSET_GROUP, JOBSET_VERSION, namespace, "jobsets", label_selector=selector)
        jobs = self.batch.list_namespaced_job(namespace, label_selector=f"{selector},{LABEL_COMPONENT}", _preload_content=False)
        pods = self.core.list_namespaced_pod(namespace, label_selector=selector, _preload_content=False)
        progress = None
        try:
            cm = self.core.read_namespaced_config_map(child_name(name, "progress"), namespace)
            progress = (cm.data or {}).get(PROGRESS_KEY)
        except ApiException as exc:
            if exc.status != 404:
                raise
        workloads = [w for js in jobsets["items"] for w in self._workloads(namespace, js["metadata"]["uid"])]
        return Observed(jobsets=jobsets["items"], jobs=json.loads(jobs.data)["items"], pods=json.loads(pods.data)["items"],
                        workloads=workloads, progress=progress)

    def _workloads(self, namespace: str, jobset_uid: str) -> list[dict[str, Any]]:
        """Kueue's Workloads of a JobSet; none where Kueue is not installed."""
        try:
            found = self.custom.list_namespaced_custom_object(KUEUE_GROUP, KUEUE_VERSION, namespace, "workloads",
                                                              label_selector=f"{KUEUE_JOB_UID_LABEL}={jobset_uid}")
        except ApiException as exc:
            if exc.status == 404:
                return []
            raise
        return found["items"]

    # --- writing ---------------------------------------------------------------------------

    def apply_unless_gone(self, raw: dict[str, Any], job: RLJob, decision: Decision) -> bool:
        """Write the decision; False when something went away under the write (404), which is a
        race, not a failure: the RLJob was deleted after it was read and the garbage collector
        took a child being applied, or the namespace is gone. The caller looks again (a deleted
        job then ends at reconcile's first read)."""
        try:
            self._apply(raw, job, decision)
        except ApiException as exc:  # the dynamic client's errors are ApiExceptions too
            if exc.status != 404:
                raise
            meta = raw["metadata"]
            log.info("%s/%s: an object went away while applying (%s); looking again", meta["namespace"], meta["name"],
                     exc.reason)
            return False
        return True

    def _apply(self, raw: dict[str, Any], job: RLJob, decision: Decision) -> None:
        namespace, name, uid = raw["metadata"]["namespace"], raw["metadata"]["name"], raw["metadata"]["uid"]
        desired = plan(job, uid=uid, settings=self.settings, initialized=decision.status.initialization,
                       restarts_before=decision.status.restarts, preemptions_before=decision.status.preemptions)
        if decision.status.phase not in TERMINAL:
            for obj in desired.support:
                self._server_side_apply(obj)
        # The status goes first: it records a restart before any pod is deleted for it.
        old_restarts = (job.status.restarts if job.status else 0)
        if job.status != decision.status:
            self._write_status(raw, decision)
        if decision.status.restarts > old_restarts:
            self.metrics.restarts.inc()
        for child in decision.delete:
            self._delete(namespace, child)
        if decision.create_initializer and desired.initializer is not None:
            self._create(desired.initializer)
        if decision.create_jobset:
            self._create(desired.jobset)
        for kind, reason, message in decision.events:
            self._event(raw, kind, reason, message)
        if decision.delete_rljob:
            log.info("%s/%s: ttlSecondsAfterFinished passed, deleting the RLJob", namespace, name)
            self.custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)

    def _server_side_apply(self, obj: dict[str, Any]) -> None:
        resource = self.dynamic.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
        resource.server_side_apply(
            body=obj, name=obj["metadata"]["name"], namespace=obj["metadata"]["namespace"],
            field_manager=MANAGER, force_conflicts=True,
        )

    def _write_status(self, raw: dict[str, Any], decision: Decision) -> None:
        body = {
            # resourceVersion makes the write conditional: a concurrent change gives 409 and a retry.
            "metadata": {"resourceVersion": raw["metadata"]["resourceVersion"]},
            "status": decision.status.model_dump(mode="json", by_alias=True),
        }
        meta = raw["metadata"]
        self.custom.patch_namespaced_custom_object_status(GROUP, VERSION, meta["namespace"], PLURAL, meta["name"], body)
        log.info("%s/%s: %s: %s", meta["namespace"], meta["name"], decision.status.phase, decision.message)

    def _create(self, manifest: dict[str, Any]) -> None:
        # Created, never re-applied: a JobSet's and a Job's templates are immutable, and Kueue owns spec.suspend.
        resource = self.dynamic.resources.get(api_version=manifest["apiVersion"], kind=manifest["kind"])
        try:
            resource.create(body=manifest, namespace=manifest["metadata"]["namespace"])
        except ApiException as exc:
            if exc.status != 409:
                raise

    def _delete(self, namespace: str, child: str) -> None:
        kind, name = child.split("/", 1)
        resource = self.dynamic.resources.get(api_version=CHILD_API_VERSIONS[kind], kind=CHILD_KINDS[kind])
        try:
            # Foreground: the object stays until its pods are gone, so a new one never overlaps them.
            resource.delete(name=name, namespace=namespace, body={"propagationPolicy": "Foreground"})
        except ApiException as exc:
            if exc.status != 404:
                raise

    def _refuse(self, raw: dict[str, Any], exc: ManifestError) -> None:
        """A spec that slipped past the CRD: Failed, with the problems in the condition."""
        meta = raw["metadata"]
        message = "; ".join(f"{p.path}: {p.message}" if p.path else p.message for p in exc.problems)
        current = raw.get("status") or {}
        if current.get("phase") == "Failed" and any(c.get("reason") == "InvalidSpec" for c in current.get("conditions", [])):
            return
        now = datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")
        status = {
            "phase": "Failed",
            "conditions": [{"type": "Failed", "status": "True", "reason": "InvalidSpec", "message": message[:32000],
                            "lastTransitionTime": now}],
        }
        self.custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, meta["namespace"], PLURAL, meta["name"], {"status": status}
        )
        self._event(raw, "Warning", "InvalidSpec", message[:1000])
        log.warning("%s/%s: invalid spec: %s", meta["namespace"], meta["name"], message)

    def _event(self, raw: dict[str, Any], kind: str, reason: str, message: str) -> None:
        meta = raw["metadata"]
        now = datetime.now(timezone.utc)
        event = client.CoreV1Event(
            metadata=client.V1ObjectMeta(generate_name=f"{meta['name']}.", namespace=meta["namespace"]),
            involved_object=client.V1ObjectReference(
                api_version=raw["apiVersion"], kind=raw["kind"], name=meta["name"],
                namespace=meta["namespace"], uid=meta["uid"],
            ),
            reason=reason, message=message, type=kind, first_timestamp=now, last_timestamp=now, count=1,
            source=client.V1EventSource(component=MANAGER),
        )
        try:
            self.core.create_namespaced_event(meta["namespace"], event)
        except ApiException as exc:  # events are best effort
            log.debug("event not recorded: %s", exc.reason)


@dataclass
class WorkQueue:
    """Keys to reconcile, each due at a time; a key is never handed to two workers at once."""

    due: dict[Key, float] = field(default_factory=dict)
    busy: set[Key] = field(default_factory=set)
    dirty: set[Key] = field(default_factory=set)
    wakeup: asyncio.Event = field(default_factory=asyncio.Event)

    def add(self, key: Key, after: float = 0.0) -> None:
        if key in self.busy:
            if after == 0.0:
                self.dirty.add(key)  # run again as soon as the current pass ends
            else:
                self.due[key] = min(self.due.get(key, float("inf")), time.monotonic() + after)
            return
        self.due[key] = min(self.due.get(key, float("inf")), time.monotonic() + after)
        self.wakeup.set()

    async def get(self) -> Key:
        while True:
            now = time.monotonic()
            ready = [(t, k) for k, t in self.due.items() if t <= now and k not in self.busy]
            if ready:
                _, key = min(ready)
                del self.due[key]
                self.busy.add(key)
                return key
            waits = [t - now for k, t in self.due.items() if k not in self.busy]
            self.wakeup.clear()
            try:
                await asyncio.wait_for(self.wakeup.wait(), timeout=min(waits) if waits else None)
            except asyncio.TimeoutError:
                pass

    def done(self, key: Key) -> None:
        self.busy.discard(key)
        if key in self.dirty:
            self.dirty.discard(key)
            self.add(key)
        elif key in self.due:
            self.wakeup.set()


async def run_workers(queue: WorkQueue, reconciler: Reconciler, metrics: OperatorMetrics, workers: int) -> None:
    async def worker() -> None:
        failures: dict[Key, int] = {}
        while True:
            key = await queue.get()
            started = time.perf_counter()
            try:
                requeue = await asyncio.to_thread(reconciler.reconcile, key)
                failures.pop(key, None)
                if requeue is not None:
                    queue.add(key, after=requeue)
            except Exception as exc:  # noqa: BLE001 - one job's failure must not stop the operator
                metrics.errors.inc()
                count = failures[key] = failures.get(key, 0) + 1
                backoff = min(30.0, 0.5 * 2 ** (count - 1))
                if isinstance(exc, ApiException) and exc.status == 409:
                    log.debug("%s/%s: conflict, retrying", *key)
                    backoff = 0.1
                else:
                    log.exception("%s/%s: reconcile failed (retry in %.1f s)", *key, backoff)
                queue.add(key, after=backoff)
            finally:
                metrics.reconcile_seconds.observe(time.perf_counter() - started)
                queue.done(key)

    await asyncio.gather(*(worker() for _ in range(workers)))
