"""What a reconcile observes of an RLJob: its JobSets, initializer Jobs, pods, progress and Kueue's
Workloads, from the operator's cache (child_cache.py) or, without one, from the API side by side.

Both paths return the same Observed: the children carrying the job's label, and the Workloads that
Kueue made for those JobSets (matched by owner uid, reconcile.reading.owned_by)."""

from __future__ import annotations

import json
from concurrent.futures import Executor
from typing import Any, Callable, cast

from kubernetes import client
from kubernetes.client.rest import ApiException

from kuberl.engine.config import PROGRESS_KEY

from ..api import RLJob
from .child_cache import KUEUE_GROUP, KUEUE_VERSION, ChildCache
from .children import LABEL_COMPONENT, LABEL_JOB, child_name
from .initializer_job import needs_initializer
from .jobset import API_VERSION as JOBSET_API_VERSION
from .reconcile import Observed
from .reconcile.reading import owned_by

JOBSET_GROUP, JOBSET_VERSION = JOBSET_API_VERSION.split("/")
# Kueue's label on a job's Workload: the uid of the job (our JobSet). A server-side filter only: what
# counts is the owner reference (owned_by), as for the cache.
KUEUE_JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"


class ChildReader:
    """Reads one RLJob's children for a reconcile. Blocking (the kubernetes client is synchronous)."""

    def __init__(self, api_client: client.ApiClient, io: Executor, children: ChildCache | None = None):
        """`io`: where the API reads run side by side; `children`: the cache, or None to read from the API."""
        self.children = children
        self._io = io
        self.custom = client.CustomObjectsApi(api_client)
        self.core = client.CoreV1Api(api_client)
        self.batch = client.BatchV1Api(api_client)

    def observe(self, job: RLJob, namespace: str, name: str) -> Observed:
        if self.children is not None:
            key = (namespace, name)
            found = self.children.objects("jobsets", key)
            every_job = self.children.objects("jobs", key)
            jobs = [j for j in every_job if LABEL_COMPONENT in j["metadata"].get("labels", {})]
            trainer_jobs = [
                j for j in every_job + self.children.gone("jobs", key) if LABEL_COMPONENT not in j["metadata"].get("labels", {})
            ]
            return Observed(
                jobsets=found,
                jobs=jobs,
                trainer_jobs=trainer_jobs,
                pods=self.children.objects("pods", key),
                gone_pods=self.children.gone("pods", key),
                workloads=owned_by(self.children.objects("workloads", key), found),
                progress=self.children.progress(key),
            )
        selector = f"{LABEL_JOB}={name}"
        jobsets = self._io.submit(
            self.custom.list_namespaced_custom_object, JOBSET_GROUP, JOBSET_VERSION, namespace, "jobsets", label_selector=selector
        )
        pods = self._io.submit(self._list_raw, self.core.list_namespaced_pod, namespace, selector)
        progress = self._io.submit(self._progress, namespace, name)
        # The only batch Jobs of a job are its initializer's; whether it has one is fixed at creation (only
        # runPolicy may change).
        initializer_jobs = (
            self._io.submit(self._list_raw, self.batch.list_namespaced_job, namespace, f"{selector},{LABEL_COMPONENT}")
            if needs_initializer(job)
            else None
        )
        own_jobs = self._io.submit(self._list_raw, self.batch.list_namespaced_job, namespace, f"{selector},!{LABEL_COMPONENT}")
        # The client types a custom object (a list here) as object: it is the JSON object the API sent.
        found = cast(dict[str, Any], jobsets.result())["items"]
        workloads = [w for js in found for w in self._workloads(namespace, js["metadata"]["uid"])]
        return Observed(
            jobsets=found,
            jobs=initializer_jobs.result() if initializer_jobs is not None else [],
            trainer_jobs=own_jobs.result(),
            pods=pods.result(),
            workloads=owned_by(workloads, found),
            progress=progress.result(),
        )

    @staticmethod
    def _list_raw(call: Callable[..., Any], namespace: str, selector: str) -> list[dict[str, Any]]:
        """A list's items as plain dicts, as the API sends them (not the client's models: cheaper, and what decide reads)."""
        return json.loads(call(namespace, label_selector=selector, _preload_content=False).data)["items"]

    def _progress(self, namespace: str, name: str) -> str | None:
        try:
            cm = self.core.read_namespaced_config_map(child_name(name, "progress"), namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise
            return None
        return (cm.data or {}).get(PROGRESS_KEY)

    def _workloads(self, namespace: str, jobset_uid: str) -> list[dict[str, Any]]:
        """Kueue's Workloads labelled for a JobSet; none where Kueue is not installed."""
        try:
            found = self.custom.list_namespaced_custom_object(
                KUEUE_GROUP, KUEUE_VERSION, namespace, "workloads", label_selector=f"{KUEUE_JOB_UID_LABEL}={jobset_uid}"
            )
        except ApiException as exc:
            if exc.status == 404:
                return []
            raise
        return cast(dict[str, Any], found)["items"]  # a custom object list, typed object by the client
