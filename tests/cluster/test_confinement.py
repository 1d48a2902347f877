"""The operator confined, on a real control plane: it writes no object it does not control, and every job
gets its NetworkPolicy (the operator runs with the chart's rules, tests/cluster/conftest.py)."""

from __future__ import annotations

import pytest
from kubernetes import client

from kuberl.operator.testing.rljobs import create, eventually, get, jobsets, live_pods, new_namespace, small_job, wait_phase


def _condition(plane, ns: str, name: str, kind: str) -> dict | None:
    conditions = (get(plane, ns, name).get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == kind), None)


def test_a_child_name_held_by_another_object_is_left_untouched_and_the_job_says_name_conflict(control_plane, operator) -> None:
    plane = control_plane
    ns = new_namespace(plane, "clash")
    core = client.CoreV1Api(plane.api_client())
    # Another tenant's objects that happen to have the names the job's Service and engine config would take.
    theirs_cm = core.create_namespaced_config_map(ns, {"metadata": {"name": "clash-config"}, "data": {"owner": "someone else"}})
    theirs_svc = core.create_namespaced_service(
        ns, {"metadata": {"name": "clash"}, "spec": {"selector": {"app": "theirs"}, "ports": [{"port": 80}]}}
    )
    create(plane, ns, small_job("clash"))

    held = eventually(
        lambda: (c := _condition(plane, ns, "clash", "NameConflict")) and c["status"] == "True" and c, 60, "the NameConflict condition"
    )
    assert "ConfigMap/clash-config exists and is not controlled by this RLJob" in held["message"]
    assert "Service/clash exists and is not controlled by this RLJob" in held["message"]
    assert get(plane, ns, "clash")["status"]["phase"] == "Pending"
    # Left untouched: same data, same resourceVersion, no owner; and nothing of the job was made.
    cm, svc = core.read_namespaced_config_map("clash-config", ns), core.read_namespaced_service("clash", ns)
    assert cm.data == {"owner": "someone else"} and cm.metadata.resource_version == theirs_cm.metadata.resource_version
    assert svc.metadata.resource_version == theirs_svc.metadata.resource_version and svc.spec.selector == {"app": "theirs"}
    assert not cm.metadata.owner_references and not svc.metadata.owner_references
    assert jobsets(plane, ns) == [] and not live_pods(plane, ns, "clash")
    assert [m.metadata.name for m in core.list_namespaced_config_map(ns, label_selector="kuberl.dev/job=clash").items] == []

    # The owner takes them away: the job goes on, and the condition says the names are free.
    core.delete_namespaced_config_map("clash-config", ns)
    core.delete_namespaced_service("clash", ns)
    wait_phase(plane, ns, "clash", "Running", timeout=90)
    assert _condition(plane, ns, "clash", "NameConflict")["status"] == "False"
    mine = core.read_namespaced_config_map("clash-config", ns)
    assert mine.metadata.owner_references[0].uid == get(plane, ns, "clash")["metadata"]["uid"]


def test_every_job_has_a_network_policy_over_its_pods(control_plane, operator) -> None:
    plane = control_plane
    ns = new_namespace(plane, "netpol")
    create(plane, ns, small_job("fenced"))
    wait_phase(plane, ns, "fenced", "Running")
    policy = client.NetworkingV1Api(plane.api_client()).read_namespaced_network_policy("fenced", ns)
    assert policy.metadata.owner_references[0].uid == get(plane, ns, "fenced")["metadata"]["uid"]
    assert policy.spec.policy_types == ["Ingress"]
    selected = (
        client.CoreV1Api(plane.api_client())
        .list_namespaced_pod(ns, label_selector=",".join(f"{k}={v}" for k, v in policy.spec.pod_selector.match_labels.items()))
        .items
    )
    trainers = live_pods(plane, ns, "fenced")
    assert len(trainers) == 2 and {p.metadata.name for p in trainers} <= {p.metadata.name for p in selected}
    [peer] = policy.spec.ingress[0]._from
    [expression] = peer.pod_selector.match_expressions
    assert peer.namespace_selector is None and peer.pod_selector.match_labels == {"kuberl.dev/job": "fenced"}
    assert (expression.key, expression.operator, expression.values) == ("kuberl.dev/role", "In", ["actor"])
    assert all(p.metadata.labels["kuberl.dev/role"] == "actor" for p in trainers)
    # The token: mounted only in the controller rank's pod (it writes progress), the one labelled so.
    mounted = sorted((p.metadata.labels.get("kuberl.dev/controller", ""), p.spec.automount_service_account_token) for p in trainers)
    assert mounted == [("", False), ("true", True)], mounted


def test_a_name_taken_between_look_up_and_write_is_not_written_over(control_plane, operator) -> None:
    """The write after the look-up is conditional: created only if still absent, applied only to the uid looked up."""
    from kuberl.operator.control.children import OperatorSettings
    from kuberl.operator.control.controller import OperatorMetrics, Reconciler
    from kuberl.operator.validation.manifest import parse_rljob
    from kuberl.operator.control.planner import plan
    from kuberl.operator.testing.operator_process import TEST_TRAINER_IMAGE

    plane = control_plane
    ns = new_namespace(plane, "race")
    core = client.CoreV1Api(plane.api_client())
    create(plane, ns, small_job("racy", runPolicy={"suspend": True}))
    raw = get(plane, ns, "racy")
    desired = plan(parse_rljob(raw, "racy"), uid=raw["metadata"]["uid"], settings=OperatorSettings(default_image=TEST_TRAINER_IMAGE))
    config = next(o for o in desired.support if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "racy-config")
    eventually(lambda: core.read_namespaced_config_map("racy-config", ns), 60, "the operator's ConfigMap")
    core.delete_namespaced_config_map("racy-config", ns)  # the operator made it: gone, and taken by someone else
    theirs = core.create_namespaced_config_map(ns, {"metadata": {"name": "racy-config"}, "data": {"owner": "someone else"}})
    reconciler = Reconciler(plane.api_client(), OperatorSettings(default_image=TEST_TRAINER_IMAGE), OperatorMetrics())
    # Looked up as absent, then taken: the create is refused (409), nothing is written.
    assert reconciler._write_child(config, None) is False
    # Looked up as the job's own (an older uid), then replaced: the apply is refused by the uid it carries.
    with pytest.raises(client.ApiException) as refused:
        reconciler._write_child(config, {"metadata": {"uid": "the-uid-of-the-job-s-own-configmap"}})
    assert refused.value.status in (409, 422)
    after = core.read_namespaced_config_map("racy-config", ns)
    assert after.data == {"owner": "someone else"} and after.metadata.resource_version == theirs.metadata.resource_version
