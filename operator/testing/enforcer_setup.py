"""What both NetworkPolicy enforcers of the real-node tests need: a binary built once from the Go module proxy,
and a ServiceAccount with the rights it lists and a token for it."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from kubernetes import client

BUILD_TIMEOUT = 1800


class EnforcerError(RuntimeError):
    """An enforcer could not be built or started; the message has the command's output."""


def go_binary(module: str, version: str, package: str, out: Path) -> Path:
    """`out`, built once from `package` of module@version (minutes on 2 cores); renamed into place whole."""
    if out.exists():
        return out
    env = {**os.environ, "CGO_ENABLED": "0", "GOFLAGS": "-mod=mod"}
    found = subprocess.run(["go", "mod", "download", "-json", f"{module}@{version}"], capture_output=True, text=True, timeout=600, env=env)
    if found.returncode != 0:
        raise EnforcerError(f"go mod download {module}@{version} failed: {found.stdout[-2000:]}{found.stderr[-2000:]}")
    source = Path(json.loads(found.stdout)["Dir"])
    out.parent.mkdir(parents=True, exist_ok=True)
    part = out.with_suffix(".part")
    built = subprocess.run(
        ["go", "build", "-o", str(part), package], cwd=source, capture_output=True, text=True, timeout=BUILD_TIMEOUT, env=env
    )
    if built.returncode != 0:
        raise EnforcerError(f"building {module}@{version} failed: {built.stderr[-3000:]}")
    part.rename(out)
    return out


def service_account_token(plane, name: str, namespace: str, rules: list[dict]) -> str:
    """A token of ServiceAccount namespace/name, bound cluster-wide to a ClusterRole of `rules` (made if absent)."""
    admin = plane.api_client()
    core, rbac = client.CoreV1Api(admin), client.RbacAuthorizationV1Api(admin)
    for create in (
        # The client takes a body as a dict too; its types name only the model classes.
        lambda: core.create_namespaced_service_account(namespace, {"metadata": {"name": name}}),  # type: ignore[arg-type]
        lambda: rbac.create_cluster_role({"metadata": {"name": name}, "rules": rules}),  # type: ignore[arg-type]
        lambda: rbac.create_cluster_role_binding(
            {
                "metadata": {"name": name},  # type: ignore[arg-type]
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
                "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
            }
        ),
    ):
        try:
            create()
        except client.ApiException as exc:
            if exc.status != 409:
                raise
    granted = core.create_namespaced_service_account_token(
        name,
        namespace,
        client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=7200)),
    ).status
    assert granted is not None and granted.token is not None, "the API server answered a TokenRequest with no token"
    return granted.token
