"""The children of every RLJob as the API last reported them: per kind a list, then a watch from the list's
resourceVersion, in a thread (an informer, as controller-runtime has them). The reconciler reads the
children from here instead of listing them at every reconcile; every change enqueues its job's key.
Kueue's Workloads too, where Kueue is installed: a Workload belongs to the JobSet that owns it, and a
job's JobSet has the job's name."""

from __future__ import annotations

import functools
import json
import logging
import threading
import time
from typing import Any, Callable

from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from kuberl.engine.config import PROGRESS_KEY

from .children import LABEL_JOB, child_name
from .jobset import API_VERSION as JOBSET_API_VERSION

log = logging.getLogger("kuberl.operator")

JOBSET_GROUP, JOBSET_VERSION = JOBSET_API_VERSION.split("/")
KUEUE_GROUP, KUEUE_VERSION = "kueue.x-k8s.io", "v1beta2"
# A watch of the children ends after this long and starts again where it was (a dead connection
# cannot stall the cache for longer); one that failed is listed again after a growing pause.
WATCH_SECONDS = 300
RELIST_BACKOFF_SECONDS = (0.5, 30.0)

Key = tuple[str, str]  # (namespace, name)


GONE_SECONDS = 600.0
"""How long the last state of a deleted object worth remembering is kept (a failed pod: its last words)."""
GONE_PER_JOB = 16


def _failed_pod(obj: dict[str, Any]) -> bool:
    return (obj.get("status") or {}).get("phase") == "Failed"


def _failed_job(obj: dict[str, Any]) -> bool:
    return any(c.get("type") == "Failed" and c.get("status") == "True" for c in (obj.get("status") or {}).get("conditions") or [])


class _Expired(Exception):
    """The watch's resourceVersion is too old (410 Gone): list again."""


def _job_key(obj: dict[str, Any]) -> Key | None:
    meta = obj.get("metadata") or {}
    job = (meta.get("labels") or {}).get(LABEL_JOB)
    return (meta.get("namespace", ""), job) if job else None


def _owning_jobset_key(obj: dict[str, Any]) -> Key | None:
    """A Workload's key: its JobSet's namespace and name (the name of the RLJob, when the JobSet is ours)."""
    meta = obj.get("metadata") or {}
    owner = next((o for o in meta.get("ownerReferences") or [] if o.get("kind") == "JobSet"), None)
    return (meta.get("namespace", ""), owner["name"]) if owner and owner.get("name") else None


def _lean(obj: dict[str, Any]) -> dict[str, Any]:
    """What the cache keeps of an object: all but its managedFields (often the larger part, and never read)."""
    meta = obj.get("metadata")
    if meta and "managedFields" in meta:
        obj = {**obj, "metadata": {k: v for k, v in meta.items() if k != "managedFields"}}
    return obj


def _lean_configmap(obj: dict[str, Any]) -> dict[str, Any]:
    """Of a job's ConfigMap only the progress report is read: the engine config is the operator's own."""
    meta = obj.get("metadata") or {}
    job = (meta.get("labels") or {}).get(LABEL_JOB, "")
    data = obj.get("data") or {}
    keep = {PROGRESS_KEY: data[PROGRESS_KEY]} if meta.get("name") == child_name(job, "progress") and PROGRESS_KEY in data else {}
    return {"metadata": {k: meta[k] for k in ("name", "namespace", "labels", "uid", "resourceVersion") if k in meta}, "data": keep}


class Informer:
    """One kind of the jobs' children in one scope (a namespace, or all), as the API has it: a list, then a
    watch from that list's resourceVersion, again when the watch ends, a new list when it expired or
    failed. In a thread of its own. The objects are kept by job (their kuberl.dev/job label), and every
    change calls on_change(key, event type, object) in that thread ("LISTED" for a change a new list
    showed)."""

    def __init__(
        self,
        name: str,
        call: Callable[..., Any],
        on_change: Callable[[Key, str, dict], None],
        lean: Callable[[dict], dict] = _lean,
        key_of: Callable[[dict], Key | None] = _job_key,
        selector: str | None = LABEL_JOB,
        optional: bool = False,
        keep_gone: Callable[[dict], bool] | None = None,
    ):
        """`key_of`: the job an object belongs to (None: not a job's); `selector`: the label selector of the
        list and watch; `optional`: the kind's API may be missing (a CRD not installed): then the informer
        is synced with nothing, and lists again now and then; `keep_gone`: which deleted objects to remember, as the
        watch last saw them, for GONE_SECONDS (a gang restart deletes the failed pod that a reconcile has not yet
        read)."""
        self.name = name
        self._call = call
        self._on_change = on_change
        self._lean = lean
        self._key_of = key_of
        self._selector = selector
        self._optional = optional
        self._objects: dict[Key, dict[str, dict[str, Any]]] = {}
        self._keep_gone = keep_gone
        self._gone: dict[Key, dict[str, tuple[float, dict[str, Any]]]] = {}
        self._lock = threading.Lock()
        self.synced = threading.Event()
        """Set once the first list is in."""
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"kuberl-watch-{name}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()

    def objects(self, key: Key) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._objects.get(key, {}).values())

    def gone(self, key: Key) -> list[dict[str, Any]]:
        """The remembered deleted objects of a job, newest last."""
        now = time.monotonic()
        with self._lock:
            kept = {n: (t, o) for n, (t, o) in self._gone.get(key, {}).items() if now - t < GONE_SECONDS}
            if kept:
                self._gone[key] = kept
            else:
                self._gone.pop(key, None)
            return [o for _, o in sorted(kept.values(), key=lambda item: item[0])]

    def add_if_missing(self, obj: dict[str, Any]) -> None:
        """An object we have just created, until the watch reports it (never over what the watch said)."""
        key = self._key_of(obj)
        if key is not None:
            with self._lock:
                self._objects.setdefault(key, {}).setdefault(obj["metadata"]["name"], self._lean(obj))

    def _run(self) -> None:
        pause = RELIST_BACKOFF_SECONDS[0]
        while not self._stopped.is_set():
            try:
                version = self._list()
                pause = RELIST_BACKOFF_SECONDS[0]
                while not self._stopped.is_set():
                    version = self._watch(version)
            except _Expired:
                log.debug("the watch of %s expired; listing again", self.name)
            except Exception as exc:  # noqa: BLE001 - the cache must outlive any failure: list again
                if self._stopped.is_set():
                    return
                if self._optional and isinstance(exc, ApiException) and exc.status == 404:
                    self._absent()
                    self._stopped.wait(RELIST_BACKOFF_SECONDS[1])
                    continue
                log.warning("watching %s failed (%s); listing again in %.1f s", self.name, exc, pause)
                self._stopped.wait(pause)
                pause = min(RELIST_BACKOFF_SECONDS[1], pause * 2)

    def _absent(self) -> None:
        """The kind is not served (its CRD is not installed): nothing of it exists."""
        with self._lock:
            old, self._objects = self._objects, {}
        if not self.synced.is_set():
            log.info("%s: not served by this cluster; looking again every %.0f s", self.name, RELIST_BACKOFF_SECONDS[1])
        self.synced.set()
        for key in old:
            self._on_change(key, "LISTED", {})

    def _selected(self) -> dict[str, str]:
        return {"label_selector": self._selector} if self._selector else {}

    def _list(self) -> str:
        body = json.loads(self._call(**self._selected(), _preload_content=False).data)
        fresh: dict[Key, dict[str, dict[str, Any]]] = {}
        for obj in body.get("items") or []:
            key = self._key_of(obj)
            if key is not None:
                fresh.setdefault(key, {})[obj["metadata"]["name"]] = self._lean(obj)
        with self._lock:
            old, self._objects = self._objects, fresh
        self.synced.set()
        for key in set(old) | set(fresh):
            if old.get(key) != fresh.get(key):
                self._on_change(key, "LISTED", {})
        return body["metadata"]["resourceVersion"]

    def _watch(self, version: str) -> str:
        response = self._call(
            **self._selected(),
            watch=True,
            resource_version=version,
            allow_watch_bookmarks=True,
            timeout_seconds=WATCH_SECONDS,
            _preload_content=False,
            _request_timeout=WATCH_SECONDS + 30,
        )
        try:
            for line in watch.watch.iter_resp_lines(response):
                if self._stopped.is_set():
                    break
                if not line.strip():
                    continue
                event = json.loads(line)
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        raise _Expired()
                    raise ApiException(status=obj.get("code"), reason=obj.get("message"))
                version = obj.get("metadata", {}).get("resourceVersion") or version
                key = self._key_of(obj)
                if kind == "BOOKMARK" or key is None:
                    continue
                name = obj["metadata"]["name"]
                with self._lock:
                    if kind == "DELETED":
                        objects = self._objects.get(key, {})
                        objects.pop(name, None)
                        if not objects:
                            self._objects.pop(key, None)
                        if self._keep_gone is not None and self._keep_gone(obj):
                            gone = self._gone.setdefault(key, {})
                            gone[name] = (time.monotonic(), self._lean(obj))
                            for oldest in sorted(gone, key=lambda n: gone[n][0])[:-GONE_PER_JOB]:
                                del gone[oldest]
                    else:
                        self._objects.setdefault(key, {})[name] = self._lean(obj)
                self._on_change(key, kind, obj)
        finally:
            response.close()
            response.release_conn()
        return version


class ChildCache:
    """The children of every RLJob (JobSets, Jobs, pods, ConfigMaps with the kuberl.dev/job label) and Kueue's
    Workloads, from informers over all namespaces or over each watched one. Reconciles start once every
    list is in."""

    KINDS = ("jobsets", "jobs", "pods", "configmaps", "workloads")

    def __init__(self, api_client: client.ApiClient, namespaces: tuple[str, ...] = ()):
        self.namespaces = namespaces
        custom, core, batch = client.CustomObjectsApi(api_client), client.CoreV1Api(api_client), client.BatchV1Api(api_client)
        self._calls: dict[str, list[Callable[..., Any]]]
        if namespaces:
            self._calls = {
                "jobsets": [
                    functools.partial(custom.list_namespaced_custom_object, JOBSET_GROUP, JOBSET_VERSION, ns, "jobsets")
                    for ns in namespaces
                ],
                "jobs": [functools.partial(batch.list_namespaced_job, ns) for ns in namespaces],
                "pods": [functools.partial(core.list_namespaced_pod, ns) for ns in namespaces],
                "configmaps": [functools.partial(core.list_namespaced_config_map, ns) for ns in namespaces],
                "workloads": [
                    functools.partial(custom.list_namespaced_custom_object, KUEUE_GROUP, KUEUE_VERSION, ns, "workloads")
                    for ns in namespaces
                ],
            }
        else:
            self._calls = {
                "jobsets": [functools.partial(custom.list_cluster_custom_object, JOBSET_GROUP, JOBSET_VERSION, "jobsets")],
                "jobs": [batch.list_job_for_all_namespaces],
                "pods": [core.list_pod_for_all_namespaces],
                "configmaps": [core.list_config_map_for_all_namespaces],
                "workloads": [functools.partial(custom.list_cluster_custom_object, KUEUE_GROUP, KUEUE_VERSION, "workloads")],
            }
        self._informers: dict[str, list[Informer]] = {}

    def start(self, on_change: Callable[[str, Key, str, dict], None]) -> None:
        """Start watching; on_change(kind, key, event type, object) runs in the informers' threads."""
        for kind in self.KINDS:
            options: dict[str, Any] = {"lean": _lean_configmap if kind == "configmaps" else _lean}
            if kind == "workloads":
                # Not labelled by us: every Workload, kept by its JobSet (Kueue may not be installed at all).
                options.update(key_of=_owning_jobset_key, selector=None, optional=True)
            elif kind == "pods":
                options.update(keep_gone=_failed_pod)
            elif kind == "jobs":
                options.update(keep_gone=_failed_job)
            self._informers[kind] = [
                Informer(f"{kind}" + (f"/{ns}" if self.namespaces else ""), call, functools.partial(on_change, kind), **options)
                for ns, call in zip(self.namespaces or ("",), self._calls[kind])
            ]
        for informers in self._informers.values():
            for informer in informers:
                informer.start()

    def wait_synced(self, timeout: float | None = None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        for informers in self._informers.values():
            for informer in informers:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                if not informer.synced.wait(left):
                    return False
        return True

    def stop(self) -> None:
        for informers in self._informers.values():
            for informer in informers:
                informer.stop()

    def objects(self, kind: str, key: Key) -> list[dict[str, Any]]:
        return [o for informer in self._informers.get(kind, []) for o in informer.objects(key)]

    def gone(self, kind: str, key: Key) -> list[dict[str, Any]]:
        """Deleted objects of `kind` remembered for a while (failed pods and Jobs), as the watch last saw them."""
        return [o for informer in self._informers.get(kind, []) for o in informer.gone(key)]

    def created(self, kind: str, obj: dict[str, Any]) -> None:
        for informer in self._informers.get(kind, []):
            if not self.namespaces or informer.name == f"{kind}/{obj['metadata'].get('namespace')}":
                informer.add_if_missing(obj)

    def progress(self, key: Key) -> str | None:
        name = child_name(key[1], "progress")
        return next((cm["data"].get(PROGRESS_KEY) for cm in self.objects("configmaps", key) if cm["metadata"]["name"] == name), None)
