"""The initializer's Job: one pod that downloads the job's hub repositories into the cache volume.

It runs once per RLJob, before the first attempt's trainer pods, and not again on a gang restart:
the operator records its report in the RLJob's status and the trainer pods read the cache offline.
A failure that retrying cannot mend (no such repository, a refused token, a full volume) exits with
PERMANENT_FAILURE_EXIT_CODE and fails the Job at once; anything else is retried a few times.
"""

from __future__ import annotations

from typing import Any

from kuberl.engine.config.initialization import PERMANENT_FAILURE_EXIT_CODE

from ..api import RLJob
from ..api.initializer import InitializerSpec
from ..api.pods import CACHE_DIR, CONFIG_DIR
from .children import CONFIG_FILE, INITIALIZER, LABEL_COMPONENT, LABEL_JOB, OperatorSettings, Owner, child_name
from .pod_spec import (
    CACHE_VOLUME,
    CONFIG_VOLUME,
    CONTAINER_SECURITY,
    POD_SECURITY,
    TMP_VOLUME,
    cache_claim,
    cache_volume,
    config_volume,
    hub_endpoint_env,
    hub_env,
    trainer_image,
)

CONTAINER = "initializer"
# Enough for a download client; a user may ask for more (spec.initializer.resources).
DEFAULT_RESOURCES = {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"memory": "4Gi"}}
RETRIES = 3


def needs_initializer(job: RLJob) -> bool:
    return job.spec.cache is not None and bool(job.spec.hub_fields())


def initializer_job(job: RLJob, settings: OperatorSettings, owner: Owner) -> dict[str, Any]:
    spec = job.spec
    claim = cache_claim(job)
    assert claim is not None, "initializer_job() needs spec.cache"
    init = spec.initializer or InitializerSpec()
    env: list[dict[str, Any]] = [
        {"name": "KUBERL_JOB", "value": owner.name},
        {"name": "KUBERL_CONFIG", "value": f"{CONFIG_DIR}/{CONFIG_FILE}"},
        {"name": "HOME", "value": "/tmp"},
        *hub_env(offline=False),
    ]
    token = spec.model.token_secret_ref
    if token is not None:
        # By reference: the token's value never appears in the Job, the ConfigMap or the status.
        env.append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": token.name, "key": token.key}}})
    own = [e.to_manifest() for e in init.env or []]
    if not any(e["name"] == "HF_ENDPOINT" for e in own):
        env += hub_endpoint_env(job, settings)  # the trainer pods get the same (pod_spec.py)
    env += own
    resources = init.resources.to_manifest() if init.resources else DEFAULT_RESOURCES
    container = {
        "name": CONTAINER,
        "image": trainer_image(job, settings),
        "imagePullPolicy": spec.image_pull_policy or settings.image_pull_policy,
        "command": ["kuberl", "initialize"],
        "env": env,
        "resources": resources,
        "volumeMounts": [
            {"name": CONFIG_VOLUME, "mountPath": CONFIG_DIR, "readOnly": True},
            {"name": TMP_VOLUME, "mountPath": "/tmp"},
            {"name": CACHE_VOLUME, "mountPath": CACHE_DIR},
        ],
        # The report goes to /dev/termination-log; if the container dies before writing it, its log's tail.
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": CONTAINER_SECURITY,
    }
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,  # it talks to the hub, never to the API server
        "securityContext": POD_SECURITY,
        "containers": [container],
        "volumes": [config_volume(owner.name), {"name": TMP_VOLUME, "emptyDir": {}}, cache_volume(claim)],
    }
    if spec.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": s.name} for s in spec.image_pull_secrets]
    labels = {LABEL_COMPONENT: INITIALIZER}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": owner.meta(child_name(owner.name, INITIALIZER), **labels),
        "spec": {
            "backoffLimit": RETRIES,
            "activeDeadlineSeconds": init.active_deadline_seconds,
            "podFailurePolicy": {
                "rules": [
                    {
                        "action": "FailJob",
                        "onExitCodes": {"containerName": CONTAINER, "operator": "In", "values": [PERMANENT_FAILURE_EXIT_CODE]},
                    },
                    # An evicted or preempted pod is not the download's fault: it does not count as a retry.
                    {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]},
                ]
            },
            "template": {"metadata": {"labels": {LABEL_JOB: owner.name, **labels}}, "spec": pod_spec},
        },
    }
