"""RLJobs on a test control plane: make them, read their status, wait for a phase, poke their kwok pods."""

from __future__ import annotations

import uuid
from typing import Any, Callable, cast

from kubernetes import client
from kubernetes.client.rest import ApiException

from ..api import GROUP, PLURAL, VERSION
from .control_plane import EXIT_ANNOTATION
from .waiting import eventually as _eventually


class _NotFound(Exception):
    pass


def eventually(check: Callable[[], Any], timeout: float = 60.0, what: str = "condition") -> Any:
    """Wait for `check`; an object that does not exist yet (404) counts as "not yet"."""

    def guarded():
        try:
            return check()
        except ApiException as exc:
            if exc.status != 404:
                raise
            raise _NotFound from exc

    return _eventually(guarded, timeout, what, ignore=(_NotFound,))


# --- helpers -----------------------------------------------------------------------------------


def new_namespace(plane, prefix: str) -> str:
    name = f"{prefix}-{uuid.uuid4().hex[:6]}"
    client.CoreV1Api(plane.api_client()).create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    return name


def small_job(name: str, **spec_changes: Any) -> dict[str, Any]:
    """A GRPO job with two actor pods on the cpu pool and a critic-free layout, its model and data on a volume."""
    spec = {
        "model": {"path": "/data/models/m"},
        "data": {"train": {"path": "/data/train.jsonl"}},
        "volumes": [{"name": "data", "emptyDir": {}}],
        "algorithm": {"name": "grpo"},
        "rollout": {"samplesPerPrompt": 4},
        "reward": {"rules": [{"name": "math_answer"}]},
        "roles": {
            "actor": {
                "replicas": 2,
                "nodeSelector": {"kuberl.dev/pool": "cpu"},
                "volumeMounts": [{"name": "data", "mountPath": "/data", "readOnly": True}],
            }
        },
        "trainer": {"totalSteps": 10, "promptsPerStep": 4},
        "runPolicy": {"backoffLimit": 3},
    }
    for key, value in spec_changes.items():
        spec[key] = value
    return {"apiVersion": "kuberl.dev/v1alpha1", "kind": "RLJob", "metadata": {"name": name}, "spec": spec}


def trainer_token(plane, namespace: str, job: str) -> str:
    """A token of the job's trainer ServiceAccount (`J-trainer`): what its controller rank writes progress with."""
    granted = (
        client.CoreV1Api(plane.api_client())
        .create_namespaced_service_account_token(
            f"{job}-trainer", namespace, client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(audiences=[]))
        )
        .status
    )
    assert granted is not None and granted.token is not None, "the API server answered a TokenRequest with no token"
    return granted.token


def create(plane, namespace: str, doc: dict[str, Any]) -> None:
    client.CustomObjectsApi(plane.api_client()).create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, doc)


def get(plane, namespace: str, name: str) -> dict[str, Any]:
    # The client types a custom object as object: it is the JSON object the API sent.
    return cast(
        dict[str, Any], client.CustomObjectsApi(plane.api_client()).get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    )


def status(plane, namespace: str, name: str) -> dict[str, Any]:
    return get(plane, namespace, name).get("status") or {}


def wait_phase(plane, namespace: str, name: str, phase: str, timeout: float = 60, **fields: Any) -> dict[str, Any]:
    def reached():
        s = status(plane, namespace, name)
        return s if s.get("phase") == phase and all(s.get(k) == v for k, v in fields.items()) else None

    return eventually(reached, timeout, f"{namespace}/{name} to reach {phase} {fields or ''}")


def pods(plane, namespace: str, selector: str) -> list[client.V1Pod]:
    return client.CoreV1Api(plane.api_client()).list_namespaced_pod(namespace, label_selector=selector).items


def live_pods(plane, namespace: str, job: str) -> list[client.V1Pod]:
    return [p for p in pods(plane, namespace, f"kuberl.dev/job={job}") if p.metadata and p.metadata.deletion_timestamp is None]


def jobsets(plane, namespace: str) -> list[dict[str, Any]]:
    """The namespace's JobSets (each RLJob's pods are one)."""
    return cast(
        dict[str, Any],
        client.CustomObjectsApi(plane.api_client()).list_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", namespace, "jobsets"),
    )["items"]


def fail_pod(plane, pod: client.V1Pod) -> None:
    meta = pod.metadata
    assert meta is not None and meta.name is not None and meta.namespace is not None, "a pod read from the API server"
    client.CoreV1Api(plane.api_client()).patch_namespaced_pod(
        meta.name, meta.namespace, {"metadata": {"annotations": {EXIT_ANNOTATION: "fail"}}}
    )
