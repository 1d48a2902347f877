"""A job's python tool runs in its sandbox pods on the real node, not in the trainer pod, with either backend.

The RLJob names the python tool and nothing else about sandboxes: the operator makes the J-sandbox
Deployment, Service and NetworkPolicy, the trainer pods get KUBERL_SANDBOX_URL, and every call goes
to a sandbox pod (`kuberl sandbox-serve`). The job does not set allowUnisolatedTools: the trainer
pods never run tool code. The tiny model writes no tool calls, so the job's environment (a plug-in
on the job's claim) calls the python tool every turn with a snippet that reports where it runs,
and writes each result to the job's output volume: every call must have run in a sandbox pod (its
PID 1 is the sandbox server, or bubblewrap's where the pod allows namespaces), with no
ServiceAccount folder and none of the trainer's variables.

Twice: with the default backend (the operator's Deployment) and with `sandbox.backend: agentSandbox`, where
the real kubernetes-sigs agent-sandbox controller (built from the Go module proxy, run on the host against
the node's plane as an admin installs it) makes the warm pool's Sandboxes and their pods from the operator's
SandboxTemplate, and the calls reach them through the same Service on the real node's network.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from .test_cluster_examples import host_claim, records, volumes, wait_for, wait_phase  # noqa: F401  (volumes: a fixture)

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent.parent


@pytest.fixture(scope="module")
def node_agent_sandbox(real_node, tmp_path_factory):
    """The agent-sandbox CRDs installed in the node's plane and its controller running, for this module."""
    from kuberl.operator.testing.agent_sandbox import agent_sandbox_root, start_agent_sandbox
    from kuberl.operator.testing.control_plane import ControlPlaneError

    try:
        root = agent_sandbox_root(REPO / "scripts" / "agent-sandbox-binaries.sh")
        started = start_agent_sandbox(real_node.plane, tmp_path_factory.mktemp("agent-sandbox"), root)
    except ControlPlaneError as exc:  # as for every binary of the suite (docs/testing.md): a failure, never a skip
        pytest.fail(f"the agent-sandbox controller did not build or start: {exc}", pytrace=False)
    yield started
    started.stop_checking_for_panics()


def ready_sandbox_pods(node, ns: str) -> list[dict]:
    pods = json.loads(node.plane.kubectl("get", "pods", "-n", ns, "-l", "kuberl.dev/sandbox=agent", "-o", "json").stdout)["items"]
    return [p for p in pods if any(c["type"] == "Ready" and c["status"] == "True" for c in p.get("status", {}).get("conditions", []))]


SNIPPET = (
    "import json, os\n"
    "pid1 = open('/proc/1/cmdline', 'rb').read().replace(bytes(1), b' ').decode()\n"
    "print(json.dumps({'host': os.uname().nodename, 'pid1': pid1, 'uid': os.getuid(),\n"
    "                  'serviceAccount': os.path.exists('/var/run/secrets/kubernetes.io/serviceaccount'),\n"
    "                  'env': sorted(k for k in os.environ if k.startswith(('KUBERL', 'KUBERNETES', 'MASTER', 'HF_')))}))\n"
)

ENVIRONMENT = (
    '''
import json
from kuberl.engine.agents import Environment, Observation, register_environment

SNIPPET = %r


class Where(Environment):
    """Every turn: the python tool says where it runs; the results go to /out/tool-results.jsonl."""

    def __init__(self, setup):
        self.setup = setup

    def step(self, text):
        result = self.setup.tools["python"].call({"code": SNIPPET})
        with open("/out/tool-results.jsonl", "a") as f:
            f.write(json.dumps({"text": result.text, "error": result.error}) + "\\n")
        return Observation([{"role": "tool", "name": "python", "content": result.text}], tool_calls=1,
                           tool_errors=int(result.error), tool_timeouts=int(result.timed_out))


@register_environment("where_tools_run", summary="calls the python tool every turn and records where it ran")
def where_tools_run(setup):
    return Where(setup)
'''
    % SNIPPET
)

TEMPLATE = (
    "{% if tools %}<|im_start|>system\ntools:{% for t in tools %} {{ t['function']['name'] }}{% endfor %}<|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.mark.parametrize("backend", ["pods", "agentSandbox"])
def test_the_python_tool_runs_in_the_jobs_sandbox_pods(real_node, operator_release, built_images, volumes, backend, request) -> None:
    from kuberl.engine.models.tiny import make_tiny_model

    if backend == "agentSandbox":
        request.getfixturevalue("node_agent_sandbox")
    node, ns = real_node, f"sandbox-{uuid.uuid4().hex[:6]}"
    node.plane.kubectl("create", "namespace", ns)
    # As docs/security.md asks of an admin: every pod of the job, the sandbox pods too, passes Pod Security's restricted level.
    node.plane.kubectl("label", "namespace", ns, "pod-security.kubernetes.io/enforce=restricted")
    image = built_images["TRAINER_IMAGE"]
    files = volumes / ns / "files"
    make_tiny_model(files / "model", seed=0)
    (files / "data").mkdir(parents=True)
    (files / "data" / "train.jsonl").write_text(
        "".join(json.dumps({"prompt": f"What is {a} + {b}?", "answer": str(a + b)}) + "\n" for a in range(4) for b in range(4))
    )
    (files / "plugins").mkdir()
    (files / "plugins" / "where_tools_run.py").write_text(ENVIRONMENT)
    host_claim(node, ns, "rl-files", files, create_claim=True, read_only=True)
    out = host_claim(node, ns, "rl-out", volumes / ns / "out", create_claim=True)
    job = {
        "apiVersion": "kuberl.dev/v1alpha1",
        "kind": "RLJob",
        "metadata": {"name": "agent", "namespace": ns},
        "spec": {
            "image": image,
            "imagePullPolicy": "Never",
            "volumes": [{"name": "files", "persistentVolumeClaim": {"claimName": "rl-files", "readOnly": True}}],
            "model": {"path": "/data/model", "dtype": "float32"},
            "tokenizer": {"chatTemplate": TEMPLATE},
            "data": {"train": {"path": "/data/data/train.jsonl"}, "maxPromptLength": 200},
            "algorithm": {"name": "grpo", "plugins": [{"path": "/data/plugins/where_tools_run.py"}]},
            "rollout": {
                "samplesPerPrompt": 4,
                "maxNewTokens": 6,
                "kvCacheBytes": 64 << 20,
                "multiTurn": {
                    "environment": "where_tools_run",
                    "maxTurns": 2,
                    "maxTotalTokens": 300,
                    # Only the backend: the defaults (2 pods of 500m CPU and 1Gi) are what a job gets.
                    "sandbox": {"backend": backend},
                    "tools": [{"name": "python", "timeoutSeconds": 20}],
                },
            },
            "reward": {"rules": [{"name": "math_answer"}]},
            "roles": {"actor": {"replicas": 1, "volumeMounts": [{"name": "files", "mountPath": "/data", "readOnly": True}]}},
            "trainer": {
                "totalSteps": 1,
                "promptsPerStep": 4,
                "microBatchSize": 4,
                "seed": 3,
                "optimizer": {"lr": 1e-4},
                "checkpoint": {"path": "/out", "claimName": "rl-out", "interval": 1},
                "exportPath": "/out/final",
            },
            "monitoring": {"enabled": False},
        },
    }
    node.plane.kubectl("apply", "-f", "-", input=json.dumps(job))
    wait_for(node, ns, lambda: len(ready_sandbox_pods(node, ns)) == 2, 300, "the sandbox pods ready")
    s = wait_phase(node, ns, "agent", "Succeeded")
    assert s["step"] == 1
    [step] = records(out / "metrics.jsonl")
    assert step["multi_turn/tool_calls"] == 16 * 2 and step["multi_turn/tool_errors"] == 0, step

    # What the sandbox pods are: no token, no trainer variables, only the scratch volume.
    pods = json.loads(node.plane.kubectl("get", "pods", "-n", ns, "-l", "kuberl.dev/sandbox=agent", "-o", "json").stdout)["items"]
    assert len(pods) == 2
    # Who made them: the operator's Deployment (through its ReplicaSet), or agent-sandbox's Sandboxes.
    assert {p["metadata"]["ownerReferences"][0]["kind"] for p in pods} == {"ReplicaSet" if backend == "pods" else "Sandbox"}
    for pod in pods:
        spec = pod["spec"]
        assert spec["automountServiceAccountToken"] is False
        assert [v["name"] for v in spec["volumes"]] == ["kuberl-scratch"]
        [container] = spec["containers"]
        assert {e["name"] for e in container.get("env", [])} == {"HOME", "TMPDIR"}
        assert [m["mountPath"] for m in container["volumeMounts"]] == ["/tmp"]
    hosts = {p["metadata"]["name"] for p in pods}

    # Where each call ran: a sandbox pod, never the trainer's.
    results = [json.loads(line) for line in (out / "tool-results.jsonl").read_text().splitlines()]
    assert len(results) == 16 * 2 and not any(r["error"] for r in results), results[:3]
    for r in results:
        seen = json.loads(r["text"])
        assert "sandbox-serve" in seen["pid1"] or "bwrap" in seen["pid1"] or seen["host"] == "sandbox", seen
        assert seen["host"] in hosts | {"sandbox"}, seen
        assert seen["serviceAccount"] is False and seen["env"] == [], seen
    logs = "".join(
        node.plane.kubectl("logs", p["metadata"]["name"], "-n", ns, check=False).stdout
        for p in json.loads(node.plane.kubectl("get", "pods", "-n", ns, "-l", "kuberl.dev/job=agent", "-o", "json").stdout)["items"]
    )
    assert "tool calls run in the job's sandbox pods" in logs, logs[-3000:]
    node.plane.kubectl("delete", "namespace", ns, "--wait=false", check=False)
