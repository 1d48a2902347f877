"""The operator's side effects: read an RLJob's children, apply `decide`'s answer, repeat.

kopf watches RLJobs; the children carrying the kuberl.dev/job label (JobSets, Jobs, pods, ConfigMaps)
are kept in a cache of our own (child_cache.py: per kind a list, then a watch from the list's
resourceVersion, in a thread). Every event only enqueues the job's key. A work queue (work_queue.py) hands each key
to one worker at a time, so one job is never reconciled twice at once, and a burst of pod events
costs one reconcile.

A reconcile's cost is its round trips to the API server, and 100 jobs starting at once make a few
thousand of them, which slow the API server for Kueue and JobSet too. So a reconcile reads the
RLJob itself from the API, and the children and Kueue's Workloads from the cache (child_reader.py; the state the
watches last reported, as controller-runtime's informers do; a change not yet seen there enqueues
the job again when it arrives, so what `decide` sees converges). It applies the support objects
(Service, ConfigMaps, ServiceAccount, Role, RoleBinding, the cache's claim, the NetworkPolicy) side by
side and only when needed (Reconciler._apply_support), and ignores the watch event of its own status write.
Whatever it is about to write it first looks up by name, and it writes none of it while any name is held
by an object the RLJob does not control (ownership.py; the job then shows NameConflict), nor while any kind
is not served by the cluster (the agent-sandbox CRDs of a job whose sandbox backend is agentSandbox; the job
then shows MissingAPI, reconcile/missing_api.py).
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from typing import Any, Callable, cast

from kubernetes import client, dynamic
from kubernetes.client.rest import ApiException
from kubernetes.dynamic.exceptions import ResourceNotFoundError
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from ..api import GROUP, PHASES, PLURAL, VERSION, RLJob
from .child_cache import ChildCache, Key
from .child_reader import ChildReader
from ..validation.cluster_rules import cluster_problems
from ..validation.manifest import ManifestError, parse_rljob
from .children import MANAGER, OperatorSettings
from .jobset import API_VERSION as JOBSET_API_VERSION
from .ownership import ObjectKey, name_conflicts
from .ownership import key as object_key
from .planner import plan
from .reconcile import TERMINAL, Decision, decide
from .reconcile.conflicts import with_name_conflicts
from .reconcile.missing_api import with_missing_apis
from .sandbox_address import AGENT_SANDBOX_EXTENSIONS_API_VERSION
from .reconcile.progress_bounds import PROGRESS_REFUSED, report_refusal

log = logging.getLogger("kuberl.operator")

# What Decision.delete names ("kind/name").
CHILD_KINDS = {"jobset": "JobSet", "job": "Job", "deployment": "Deployment", "sandboxwarmpool": "SandboxWarmPool"}
CHILD_API_VERSIONS = {
    "jobset": JOBSET_API_VERSION,
    "job": "batch/v1",
    "deployment": "apps/v1",
    "sandboxwarmpool": AGENT_SANDBOX_EXTENSIONS_API_VERSION,
}
SANDBOX_KINDS = ("deployment", "sandboxwarmpool")
CACHE_KINDS = {"JobSet": "jobsets", "Job": "jobs"}

# How soon to look at a job again after something it was writing went away under it.
GONE_RETRY_SECONDS = 0.5
# The support objects are applied again at least this often, even when nothing asks for it: that puts
# back one that was deleted or changed by hand (a deleted ConfigMap of a job is put back at once: its
# watch event makes the operator forget it applied it).
SUPPORT_RESYNC_SECONDS = 300.0
# Requests of one reconcile that run side by side (the reads of the children, the support objects).
IO_THREADS_PER_WORKER = 6


class OperatorMetrics:
    """The operator's Prometheus metrics, in a registry of their own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.rljobs = Gauge("kuberl_operator_rljobs", "RLJobs by phase", ["phase"], registry=self.registry)
        self.reconcile_seconds = Histogram(
            "kuberl_operator_reconcile_duration_seconds",
            "Time of one reconcile of one RLJob",
            registry=self.registry,
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
        )
        self.errors = Counter("kuberl_operator_reconcile_errors_total", "Reconciles that raised", registry=self.registry)
        self.restarts = Counter("kuberl_operator_gang_restarts_total", "Gang restarts started", registry=self.registry)
        # Per job, so that an alert names the job and its namespace (one series per live RLJob, gone with it).
        self.job_phase = Gauge(
            "kuberl_operator_rljob_phase", "1 for each RLJob's current phase", ["namespace", "rljob", "phase"], registry=self.registry
        )
        self.job_restarts = Gauge(
            "kuberl_operator_rljob_restarts",
            "Gang restarts of each RLJob (its status.restarts)",
            ["namespace", "rljob"],
            registry=self.registry,
        )
        self._phases: dict[Key, str] = {}

    def observe_phase(self, key: Key, phase: str | None, restarts: int = 0) -> None:
        """The job's phase and restarts, or None: the job is gone."""
        namespace, name = key
        old = self._phases.get(key)
        if old is not None and old != phase:
            self.job_phase.remove(namespace, name, old)
        if phase is None:
            self._phases.pop(key, None)
            if old is not None:
                self.job_restarts.remove(namespace, name)
        else:
            self._phases[key] = phase
            self.job_phase.labels(namespace=namespace, rljob=name, phase=phase).set(1)
            self.job_restarts.labels(namespace=namespace, rljob=name).set(restarts)
        for p in PHASES:
            self.rljobs.labels(phase=p).set(sum(1 for v in self._phases.values() if v == p))


class Reconciler:
    """One reconcile of one RLJob against the API. Blocking (the kubernetes client is synchronous)."""

    def __init__(
        self,
        api_client: client.ApiClient,
        settings: OperatorSettings,
        metrics: OperatorMetrics,
        workers: int = 4,
        children: ChildCache | None = None,
    ):
        """`children`: where to read the children from; None: from the API, at every reconcile."""
        self.settings = settings
        self.children = children
        self.metrics = metrics
        self.custom = client.CustomObjectsApi(api_client)
        self.core = client.CoreV1Api(api_client)
        self.dynamic = dynamic.DynamicClient(api_client)
        # Only requests run here, never a task that waits on another: no pool can starve itself.
        self._io = ThreadPoolExecutor(max_workers=max(1, workers) * IO_THREADS_PER_WORKER, thread_name_prefix="kuberl-io")
        self.reader = ChildReader(api_client, self._io, children)
        self._support: dict[Key, tuple[str, str, float]] = {}
        """Per job: (RLJob uid, digest of the support objects, monotonic time) of their last apply by this process."""
        self._support_lock = threading.Lock()
        self._status_written: dict[Key, str] = {}
        """Per job: the resourceVersion of the RLJob that this process's last status write made."""
        self._refusals: dict[Key, tuple[str, frozenset[str]]] = {}
        """Per job: (RLJob uid, the progress refusals this process has recorded as events)."""
        self._resources: dict[tuple[str, str], Any] = {}
        self._resources_lock = threading.Lock()

    def forget_support(self, key: Key) -> None:
        """The next reconcile of `key` applies its support objects again (one of them was deleted)."""
        with self._support_lock:
            self._support.pop(key, None)

    def wrote(self, key: Key, resource_version: str | None) -> bool:
        """Whether this version of the RLJob is the one our own last status write made: its watch event
        then brings nothing the reconcile that wrote it did not know (any other change is a new version)."""
        return resource_version is not None and self._status_written.get(key) == resource_version

    def _forget(self, key: Key) -> None:
        self.forget_support(key)
        self._status_written.pop(key, None)
        self._refusals.pop(key, None)

    def reconcile(self, key: Key) -> float | None:
        """Bring one RLJob one step closer to its desired state; returns when to look again."""
        namespace, name = key
        try:
            # The client types a custom object as object: it is the JSON object the API sent.
            raw = cast(dict[str, Any], self.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name))
        except ApiException as exc:
            if exc.status == 404:
                self.metrics.observe_phase(key, None)
                self._forget(key)
                return None  # deleted: the garbage collector removes the children we own
            raise
        if raw["metadata"].get("deletionTimestamp"):
            self._forget(key)
            return None
        try:
            job = parse_rljob(raw, f"{namespace}/{name}")
            # What the API server's schema cannot check: every path the engine opens lies on a volume of its pods,
            # and the chart's allow-lists (its admission policy checks them too, where it is installed).
            problems = cluster_problems(job, f"{namespace}/{name}", self.settings.default_image, self.settings.admission)
            if problems:
                raise ManifestError(problems)
        except ManifestError as exc:
            self._refuse(raw, exc)
            self.metrics.observe_phase(key, "Failed")
            return None
        observed = self.reader.observe(job, namespace, name)
        decision = decide(job, observed, datetime.now(timezone.utc))
        applied = self.apply_unless_gone(raw, job, decision)
        if applied is None:
            return GONE_RETRY_SECONDS
        decision = applied
        self.metrics.observe_phase(key, decision.status.phase, decision.status.restarts)
        return decision.requeue_after

    # --- writing ---------------------------------------------------------------------------

    def apply_unless_gone(self, raw: dict[str, Any], job: RLJob, decision: Decision) -> Decision | None:
        """Write the decision; returns what was written (the decision, less what a NameConflict held back).
        None when something went away under the write (404), which is a race, not a failure: the RLJob was deleted after it was read and the garbage collector
        took a child being applied, or the namespace is gone. The caller looks again (a deleted
        job then ends at reconcile's first read)."""
        try:
            return self._apply(raw, job, decision)
        except ApiException as exc:  # the dynamic client's errors are ApiExceptions too
            if exc.status != 404:
                raise
            meta = raw["metadata"]
            try:
                said = json.loads(exc.body or "").get("message") or exc.reason
            except (TypeError, ValueError, AttributeError):
                said = exc.reason
            log.info("%s/%s: an object went away while applying (%s); looking again", meta["namespace"], meta["name"], said)
        return None

    def _apply(self, raw: dict[str, Any], job: RLJob, decision: Decision) -> Decision:
        namespace, name, uid = raw["metadata"]["namespace"], raw["metadata"]["name"], raw["metadata"]["uid"]
        desired = plan(
            job,
            uid=uid,
            settings=self.settings,
            initialized=decision.status.initialization,
            restarts_before=decision.status.restarts,
            preemptions_before=decision.status.preemptions,
        )
        # The support objects first (side by side): the pods need the ServiceAccount and ConfigMaps; the
        # RoleBinding (only the trainer's right to write its progress) follows its Role, beside the children
        # being made. The status beside the support objects when the decision deletes a child (it records a
        # restart before any pod is deleted for it) or makes none, and after the children it makes (a status
        # saying Initializing or Pending has its initializer or JobSet there).
        key = (namespace, name)
        due = None
        if decision.status.phase not in TERMINAL:
            due = self._support_due(key, uid, desired.support, force=decision.create_jobset or decision.create_initializer)
        else:
            self.forget_support(key)
        # Nothing is written over an object this RLJob does not control: every name about to be written is
        # looked up first (only when something is to be written: not at every reconcile).
        writing = [
            *(desired.support if due else []),
            *([desired.jobset] if decision.create_jobset else []),
            *([desired.initializer] if decision.create_initializer and desired.initializer is not None else []),
        ]
        # A kind this cluster does not serve (the agent-sandbox CRDs, for backend agentSandbox): nothing is written.
        missing = self._unserved(writing)
        decision = with_missing_apis(decision, missing, datetime.now(timezone.utc)) if writing else decision
        if missing:
            due, writing = None, []
        found = self._look_up(namespace, writing) if writing else {}
        if writing:
            conflicts = name_conflicts(writing, found, uid)
            decision = with_name_conflicts(decision, conflicts, datetime.now(timezone.utc))
            if conflicts:
                due = None
        write_status = job.status != decision.status
        late = not decision.delete and (decision.create_jobset or (decision.create_initializer and desired.initializer is not None))
        status = self._io.submit(self._write_status, raw, decision) if write_status and not late else None
        support_done: Callable[[], None] | None = None
        try:
            if due is not None:
                support_done = self._apply_support(key, uid, desired.support, found, due)
        finally:
            if status is not None:
                status.result()
        old_restarts = job.status.restarts if job.status else 0
        if decision.status.restarts > old_restarts:
            self.metrics.restarts.inc()
        try:
            for child in decision.delete:
                self._delete(namespace, child)
            if decision.create_initializer and desired.initializer is not None:
                self._create(desired.initializer)
            if decision.create_jobset:
                self._create(desired.jobset)
        finally:
            if support_done is not None:
                support_done()
        if write_status and late:
            self._write_status(raw, decision)
        for kind, reason, message in decision.events:
            self._event(raw, kind, reason, message)
        self._report_refusal(key, uid, raw, decision.progress_refused)
        if decision.delete_rljob:
            log.info("%s/%s: ttlSecondsAfterFinished passed, deleting the RLJob", namespace, name)
            self.custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
        return decision

    def _report_refusal(self, key: Key, uid: str, raw: dict[str, Any], refused: str | None) -> None:
        """A Warning event for a refused progress report, once per distinct refusal of this RLJob."""
        last = self._refusals.get(key)
        seen = last[1] if last is not None and last[0] == uid else frozenset()
        after = report_refusal(seen, refused)
        if after is not None and refused is not None:
            self._refusals[key] = (uid, after)
            self._event(raw, "Warning", PROGRESS_REFUSED, refused)

    def _support_due(self, key: Key, uid: str, support: list[dict[str, Any]], force: bool) -> tuple[str, float] | None:
        """(digest, time) when the support objects are to be applied: unless this process applied the very same
        ones for this RLJob less than SUPPORT_RESYNC_SECONDS ago; always before a child is made. Level-based
        still: what is compared is the desired objects, and a new process (a restart, an upgrade) remembers
        nothing, so it applies every job's once."""
        digest = hashlib.sha256(json.dumps(support, sort_keys=True).encode()).hexdigest()
        now = time.monotonic()
        with self._support_lock:
            last = self._support.get(key)
        if not force and last is not None and last[:2] == (uid, digest) and now - last[2] < SUPPORT_RESYNC_SECONDS:
            return None
        return digest, now

    def _apply_support(
        self, key: Key, uid: str, support: list[dict[str, Any]], found: dict[ObjectKey, dict[str, Any] | None], due: tuple[str, float]
    ) -> Callable[[], None]:
        """Write the support objects side by side: create those absent, server-side apply those this RLJob
        controls (`found`: what each name held when looked up; name_conflicts has ruled out the rest).

        Returns once all but the RoleBindings are written: the API server checks that whoever binds a Role
        holds its rights (unless it may `bind`) and answers 404 while the Role is not there, so they go after
        the rest, while the caller goes on. Its answer, called, waits for them (and raises their failure)."""
        first = [self._io.submit(self._write_child, obj, found.get(object_key(obj))) for obj in support if obj["kind"] != "RoleBinding"]
        written = all([writing.result() for writing in first])  # the first failure (a 404 included) is the reconcile's
        bindings = [self._io.submit(self._write_child, obj, found.get(object_key(obj))) for obj in support if obj["kind"] == "RoleBinding"]

        def done() -> None:
            if all([writing.result() for writing in bindings]) and written:  # else: a name taken since: look again
                with self._support_lock:
                    self._support[key] = (uid, *due)

        return done

    def _unserved(self, objects: list[dict[str, Any]]) -> list[tuple[str, str]]:
        """(apiVersion, kind) of each of the objects' kinds that the API does not serve, in their order."""
        missing: list[tuple[str, str]] = []
        for kind in dict.fromkeys((obj["apiVersion"], obj["kind"]) for obj in objects):
            try:
                self._resource(*kind)
            except ResourceNotFoundError:
                missing.append(kind)
        return missing

    def _look_up(self, namespace: str, objects: list[dict[str, Any]]) -> dict[ObjectKey, dict[str, Any] | None]:
        """What the API holds under each object's kind and name (None: nothing), read side by side."""

        def get(obj: dict[str, Any]) -> dict[str, Any] | None:
            resource = self._resource(obj["apiVersion"], obj["kind"])
            try:
                return resource.get(name=obj["metadata"]["name"], namespace=namespace).to_dict()
            except ApiException as exc:
                if exc.status != 404:
                    raise
                return None

        reads = {object_key(obj): self._io.submit(get, obj) for obj in objects}
        return {k: r.result() for k, r in reads.items()}

    def _write_child(self, obj: dict[str, Any], existing: dict[str, Any] | None) -> bool:
        """Create `obj` when its name was free (a 409 then means someone took it since: the next look-up sees
        whose it is), else server-side apply it, conditional on the uid looked up: an object deleted and made
        again by someone else in between is refused (409), never written over. False: it was not written."""
        resource = self._resource(obj["apiVersion"], obj["kind"])
        namespace = obj["metadata"]["namespace"]
        if existing is None:
            try:
                resource.create(body=obj, namespace=namespace, field_manager=MANAGER)
            except ApiException as exc:
                if exc.status != 409:
                    raise
                return False
            return True
        body = {**obj, "metadata": {**obj["metadata"], "uid": existing["metadata"]["uid"]}}
        resource.server_side_apply(
            body=body, name=obj["metadata"]["name"], namespace=namespace, field_manager=MANAGER, force_conflicts=True
        )
        return True

    def _resource(self, api_version: str, kind: str) -> Any:
        """The dynamic client's resource, looked up once: its discovery cache is not safe to fill from
        several threads at once."""
        found = self._resources.get((api_version, kind))
        if found is None:
            with self._resources_lock:
                found = self._resources.get((api_version, kind))
                if found is None:
                    found = self._resources[(api_version, kind)] = self.dynamic.resources.get(api_version=api_version, kind=kind)
        return found

    def _write_status(self, raw: dict[str, Any], decision: Decision) -> None:
        body = {
            # resourceVersion makes the write conditional: a concurrent change gives 409 and a retry.
            "metadata": {"resourceVersion": raw["metadata"]["resourceVersion"]},
            "status": decision.status.model_dump(mode="json", by_alias=True),
        }
        meta = raw["metadata"]
        written = cast(
            dict[str, Any],
            self.custom.patch_namespaced_custom_object_status(  # typed object by the client
                GROUP, VERSION, meta["namespace"], PLURAL, meta["name"], body
            ),
        )
        self._status_written[(meta["namespace"], meta["name"])] = written["metadata"]["resourceVersion"]
        log.info("%s/%s: %s: %s", meta["namespace"], meta["name"], decision.status.phase, decision.message)

    def _create(self, manifest: dict[str, Any]) -> None:
        # Created, never re-applied: a JobSet's and a Job's templates are immutable, and Kueue owns spec.suspend.
        resource = self._resource(manifest["apiVersion"], manifest["kind"])
        try:
            created = resource.create(body=manifest, namespace=manifest["metadata"]["namespace"])
        except ApiException as exc:
            if exc.status != 409:
                raise
            return
        if self.children is not None:  # until its watch event comes, the next reconcile must not make it again
            self.children.created(CACHE_KINDS[manifest["kind"]], created.to_dict())

    def _delete(self, namespace: str, child: str) -> None:
        kind, name = child.split("/", 1)
        try:
            resource = self._resource(CHILD_API_VERSIONS[kind], CHILD_KINDS[kind])
        except ResourceNotFoundError:  # a kind not served (the agent-sandbox CRDs): none of it exists
            return
        try:
            # Foreground: the object stays until its pods are gone, so a new one never overlaps them. Not for the
            # sandbox pods' owner: its pods may overlap, and a job resumed at once must be able to make it again.
            policy = "Background" if kind in SANDBOX_KINDS else "Foreground"
            resource.delete(name=name, namespace=namespace, body={"propagationPolicy": policy})
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
            "conditions": [
                {"type": "Failed", "status": "True", "reason": "InvalidSpec", "message": message[:32000], "lastTransitionTime": now}
            ],
        }
        self.custom.patch_namespaced_custom_object_status(GROUP, VERSION, meta["namespace"], PLURAL, meta["name"], {"status": status})
        self._event(raw, "Warning", "InvalidSpec", message[:1000])
        log.warning("%s/%s: invalid spec: %s", meta["namespace"], meta["name"], message)

    def _event(self, raw: dict[str, Any], kind: str, reason: str, message: str) -> None:
        meta = raw["metadata"]
        now = datetime.now(timezone.utc)
        event = client.CoreV1Event(
            metadata=client.V1ObjectMeta(generate_name=f"{meta['name']}.", namespace=meta["namespace"]),
            involved_object=client.V1ObjectReference(
                api_version=raw["apiVersion"],
                kind=raw["kind"],
                name=meta["name"],
                namespace=meta["namespace"],
                uid=meta["uid"],
            ),
            reason=reason,
            message=message,
            type=kind,
            first_timestamp=now,
            last_timestamp=now,
            count=1,
            source=client.V1EventSource(component=MANAGER),
        )
        try:
            self.core.create_namespaced_event(meta["namespace"], event)
        except ApiException as exc:  # events are best effort
            log.debug("event not recorded: %s", exc.reason)
