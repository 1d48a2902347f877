"""A hostile progress report, written with the trainer's own token to the job's progress ConfigMap, is
refused whole and leaves a trace: one Warning event ProgressRefused on the RLJob that names the bound
it broke without the value, however often the refused report is rewritten; a different refusal makes a
second event. The status keeps the last good numbers."""

from __future__ import annotations

import json
import time

from kubernetes import client
from kubernetes.client.rest import ApiException

from kuberl.operator.testing.rljobs import create, eventually, new_namespace, small_job, status, trainer_token, wait_phase

MARK = 987654321987654  # the hostile value: it must not reach the event


def test_a_refused_progress_report_makes_one_warning_event(control_plane, operator) -> None:
    plane = control_plane
    ns = new_namespace(plane, "refused")
    create(plane, ns, small_job("reporting"))
    wait_phase(plane, ns, "reporting", "Running")
    core = client.CoreV1Api(plane.api_client())
    token = trainer_token(plane, ns, "reporting")
    as_trainer = client.CoreV1Api(plane.api_client(token=token))

    def write(report: dict) -> bool:  # the RoleBinding may take a moment to reach the authorizer
        try:
            as_trainer.patch_namespaced_config_map("reporting-progress", ns, {"data": {"progress.json": json.dumps(report)}})
            return True
        except ApiException as exc:
            assert exc.status == 403
            return False

    def refusals() -> list[client.CoreV1Event]:
        return [
            e for e in core.list_namespaced_event(ns, field_selector="involvedObject.name=reporting").items if e.reason == "ProgressRefused"
        ]

    eventually(lambda: write({"step": 3, "totalSteps": 10}), 20, "the trainer's Role to apply")
    eventually(lambda: status(plane, ns, "reporting").get("step") == 3, 30, "the good step in the status")
    for i in range(3):  # the same refusal, rewritten (each write wakes a reconcile)
        write({"step": MARK + i, "totalSteps": 10})
        time.sleep(1.0)
    [event] = eventually(lambda: refusals() or None, 30, "the ProgressRefused event")
    time.sleep(3.0)
    assert len(refusals()) == 1
    assert event.type == "Warning" and "step is outside" in event.message and str(MARK)[:6] not in event.message
    assert status(plane, ns, "reporting").get("step") == 3  # the last good numbers
    write({"step": 4, "totalSteps": 10, "kl": "x" * 100})  # another refusal: another event
    eventually(lambda: len(refusals()) == 2 or None, 30, "the second refusal's event")
    assert any("kl" in e.message for e in refusals())
