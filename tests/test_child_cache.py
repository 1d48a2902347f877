"""The operator's informers without a cluster: how a Workload finds its job, and a kind the cluster does
not serve (Kueue not installed). The informers against a real API server: tests/cluster/test_operator.py
and tests/cluster/test_kueue.py."""

from __future__ import annotations

import time

from kubernetes.client.rest import ApiException

from kuberl.operator.child_cache import Informer, _owning_jobset_key


def test_a_workload_belongs_to_the_job_its_jobset_is_named_after() -> None:
    workload = {"metadata": {"namespace": "team-a", "name": "jobset-ppo-1a2b3",
                             "ownerReferences": [{"kind": "JobSet", "name": "ppo", "uid": "u1"}]}}
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
    informer = Informer("workloads", _not_served(calls), lambda *change: changes.append(change),
                        key_of=_owning_jobset_key, selector=None, optional=True)
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
