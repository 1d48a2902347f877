"""The operator's informers without a cluster: how a Workload finds its job, and a kind the cluster does
not serve (Kueue not installed). The informers against a real API server: tests/cluster/test_operator.py
and tests/cluster/test_kueue.py."""

from __future__ import annotations

import time

from kubernetes.client.rest import ApiException

from kuberl.operator.control.child_cache import Informer, _owning_jobset_key


def test_a_workload_belongs_to_the_job_its_jobset_is_named_after() -> None:
    workload = {
        "metadata": {"namespace": "team-a", "name": "jobset-ppo-1a2b3", "ownerReferences": [{"kind": "JobSet", "name": "ppo", "uid": "u1"}]}
    }
    assert _owning_jobset_key(workload) == ("team-a", "ppo")
    assert _owning_jobset_key({"metadata": {"namespace": "team-a", "ownerReferences": [{"kind": "Job", "name": "x"}]}}) is None


def _not_served(calls: list[dict]):
    def call(**kwargs):
        calls.append(kwargs)
        raise ApiException(status=404, reason="Not Found")

    return call


def test_an_optional_kind_the_cluster_does_not_serve_is_synced_with_nothing() -> None:
    calls: list[dict] = []
    changes: list = []
    informer = Informer(
        "workloads", _not_served(calls), lambda *change: changes.append(change), key_of=_owning_jobset_key, selector=None, optional=True
    )
    informer.start()
    try:
        assert informer.synced.wait(5), "reconciles would wait for this list forever"
        assert informer.objects(("team-a", "ppo")) == [] and changes == []
        assert calls and "label_selector" not in calls[0]  # every Workload: they carry no label of ours
    finally:
        informer.stop()


def test_a_required_kind_that_is_not_served_is_never_synced() -> None:
    calls: list[dict] = []
    informer = Informer("jobsets", _not_served(calls), lambda *change: None)
    informer.start()
    try:
        time.sleep(1.0)
        assert not informer.synced.is_set() and len(calls) >= 2  # listed again, after a pause
        assert calls[0]["label_selector"] == "kuberl.dev/job"
    finally:
        informer.stop()


class _Response:
    """What the kubernetes client hands back with _preload_content=False: a list's body, or a watch's lines."""

    def __init__(self, data: bytes = b"", lines: tuple[dict, ...] = ()):
        self.data, self._lines = data, lines

    def stream(self, amt=None, decode_content=False):
        import json

        for line in self._lines:
            yield (json.dumps(line) + "\n").encode()

    def close(self) -> None:
        pass

    def release_conn(self) -> None:
        pass


def _pod(name: str, phase: str) -> dict:
    return {
        "metadata": {"namespace": "team-a", "name": name, "resourceVersion": "2", "labels": {"kuberl.dev/job": "ppo"}},
        "status": {"phase": phase, "containerStatuses": [{"name": "trainer", "state": {"terminated": {"exitCode": 1, "message": "boom"}}}]},
    }


def test_a_deleted_failed_pod_is_remembered_as_last_seen_and_a_healthy_one_is_not() -> None:
    """A gang restart deletes the failed pod at once: the reconcile that reads how the attempt ended finds it."""
    from kuberl.operator.control.child_cache import _failed_pod

    watches: list[int] = []

    def call(**kwargs):
        if not kwargs.get("watch"):
            return _Response(data=b'{"items": [], "metadata": {"resourceVersion": "1"}}')
        watches.append(1)
        if len(watches) > 1:
            time.sleep(0.2)
            return _Response()
        return _Response(
            lines=(
                {"type": "ADDED", "object": _pod("ppo-actor-0-0", "Running")},
                {"type": "ADDED", "object": _pod("ppo-actor-0-1", "Running")},
                {"type": "DELETED", "object": _pod("ppo-actor-0-1", "Failed")},
                {"type": "DELETED", "object": _pod("ppo-actor-0-0", "Running")},
            )
        )

    informer = Informer("pods", call, lambda *change: None, keep_gone=_failed_pod)
    informer.start()
    try:
        deadline = time.monotonic() + 5
        while len(watches) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        key = ("team-a", "ppo")
        assert informer.objects(key) == []  # nothing live: both deleted
        [gone] = informer.gone(key)
        assert (
            gone["metadata"]["name"] == "ppo-actor-0-1"
            and gone["status"]["containerStatuses"][0]["state"]["terminated"]["message"] == "boom"
        )
    finally:
        informer.stop()
