"""The node itself: a real kubelet on containerd runs pods in containers that reach the API server
through the `kubernetes` Service and resolve Service names through cluster DNS."""

from __future__ import annotations

import json
import textwrap
import time
import uuid

import pytest

pytestmark = pytest.mark.slow

RESTRICTED = {
    "runAsNonRoot": True,
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}


def namespace(node, prefix: str) -> str:
    name = f"{prefix}-{uuid.uuid4().hex[:6]}"
    node.plane.kubectl("create", "namespace", name)
    # The namespace's default ServiceAccount comes from the controller-manager, a moment later.
    deadline = time.monotonic() + 30
    while node.plane.kubectl("get", "serviceaccount", "default", "-n", name, check=False).returncode != 0:
        assert time.monotonic() < deadline, "no default ServiceAccount"
        time.sleep(0.3)
    return name


def wait_for_phase(node, ns: str, pod: str, phases: tuple[str, ...], timeout: float = 180) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        out = node.plane.kubectl("get", "pod", pod, "-n", ns, "-o", "json", check=False)
        if out.returncode == 0:
            obj = json.loads(out.stdout)
            if obj.get("status", {}).get("phase") in phases:
                return obj
        if time.monotonic() > deadline:
            events = node.plane.kubectl("get", "events", "-n", ns, check=False).stdout
            raise AssertionError(
                f"pod {ns}/{pod} not {phases} in {timeout} s:\n{out.stdout[-2000:]}\n{events[-3000:]}\nkubelet:\n{node.log('kubelet')}"
            )
        time.sleep(1)


def test_the_node_is_a_kubelet_on_containerd(real_node) -> None:
    info = json.loads(real_node.plane.kubectl("get", "node", real_node.name, "-o", "json").stdout)["status"]["nodeInfo"]
    assert info["containerRuntimeVersion"].startswith("containerd://2."), info
    assert info["kubeletVersion"] == "v1.37.2"
    assert info["operatingSystem"] == "linux"


def test_the_kept_image_store_holds_only_this_trees_images(real_node, built_images) -> None:
    # Every reference (the kubelet adds ids and digests of its own) points at an image of this tree:
    # the store kept between runs does not grow with each rebuild.
    digests = real_node.image_digests()
    wanted = {digests[built_images[f"{k}_IMAGE"]] for k in ("PAUSE", "OPERATOR", "TRAINER")}
    assert set(digests.values()) == wanted, digests


def test_a_pod_reaches_the_api_server_and_resolves_service_names(real_node, built_images) -> None:
    ns = namespace(real_node, "probe")
    script = textwrap.dedent(f"""
        import json, socket, ssl, time, urllib.request
        sa = "/var/run/secrets/kubernetes.io/serviceaccount"
        assert socket.gethostbyname("kubernetes.default.svc.cluster.local") == "10.96.0.1"
        me = socket.gethostbyname(socket.gethostname())
        for _ in range(60):  # the pod's own record appears once its EndpointSlice does
            try:
                found = socket.gethostbyname("probe-0.probe.{ns}.svc")
                break
            except socket.gaierror:
                time.sleep(0.5)
        assert found == me, "headless Service name"
        request = urllib.request.Request("https://kubernetes.default.svc/version",
                                         headers={{"Authorization": "Bearer " + open(sa + "/token").read()}})
        context = ssl.create_default_context(cafile=sa + "/ca.crt")
        version = json.load(urllib.request.urlopen(request, context=context, timeout=10))
        print("api server", version["gitVersion"], "from", me)
    """)
    docs = [
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "probe", "namespace": ns},
            "spec": {
                "clusterIP": "None",
                "selector": {"app": "probe"},
                "publishNotReadyAddresses": True,
                "ports": [{"name": "x", "port": 80}],
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "probe-0", "namespace": ns, "labels": {"app": "probe"}},
            "spec": {
                "hostname": "probe-0",
                "subdomain": "probe",
                "restartPolicy": "Never",
                "securityContext": {"runAsUser": 10001, "runAsGroup": 10001},
                "containers": [
                    {
                        "name": "probe",
                        "image": built_images["OPERATOR_IMAGE"],
                        "imagePullPolicy": "Never",
                        "command": ["python", "-c", script],
                        "securityContext": RESTRICTED,
                    }
                ],
            },
        },
    ]
    real_node.plane.kubectl("apply", "-f", "-", input="\n---\n".join(json.dumps(d) for d in docs))
    pod = wait_for_phase(real_node, ns, "probe-0", ("Succeeded", "Failed"))
    logs = real_node.plane.kubectl("logs", "probe-0", "-n", ns).stdout
    assert pod["status"]["phase"] == "Succeeded", logs
    assert "api server v1.37.2 from 10.244.0." in logs
    real_node.plane.kubectl("delete", "namespace", ns, "--wait=false")
