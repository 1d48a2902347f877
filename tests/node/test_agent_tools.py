"""An HTTP tool served from a pod on the real node is called by a trainer pod of an RLJob there.

A pod of the trainer image serves POST /add (JSON in, JSON out) behind a Service; the RLJob's
multi-turn rollout names it by its Service's DNS name. The tiny model writes no tool calls of its
own, so the job's environment (a plug-in file on the job's claim) calls the tools every turn: the HTTP
tool, and the python tool in the sandbox of the trainer pod (non-root, read-only root filesystem;
the job turns its sandbox pods off).
The job succeeds with every call answered (no tool errors), and the server's log has the calls.
"""

from __future__ import annotations

import json
import uuid

import pytest

from .test_cluster_examples import host_claim, records, volumes, wait_for, wait_phase  # noqa: F401  (volumes: a fixture)

pytestmark = pytest.mark.slow

SERVER = """
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LOG = threading.Lock()  # one whole line per call: the calls' threads would interleave print's pieces

class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        reply = json.dumps({"sum": body["a"] + body["b"]}).encode()
        with LOG:
            sys.stdout.write("POST " + self.path + " " + json.dumps(body) + chr(10))
            sys.stdout.flush()
        self.send_response(200)
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args):
        pass

# Threads: the trainer's 16 trajectories call at once (a one-thread server's backlog of 5 drops connections).
ThreadingHTTPServer(("0.0.0.0", 8080), Handler).serve_forever()
"""

ENVIRONMENT = '''
import sys

from kuberl.engine.agents import Environment, Observation, register_environment


class CallTools(Environment):
    """Every turn: the HTTP tool adds the turn's count, the python tool prints it; done after maxTurns."""

    def __init__(self, setup):
        self.setup, self.turn = setup, 0

    def step(self, text):
        self.turn += 1
        results = [self.setup.tools["add"].call({"a": self.turn, "b": 40}),
                   self.setup.tools["python"].call({"code": "print(%d * 2)" % self.turn})]
        messages = [{"role": "tool", "name": name, "content": r.text} for name, r in zip(("add", "python"), results)]
        for name, r in zip(("add", "python"), results):
            if r.error:  # in the trainer's log, for the test to show
                print("tool error:", name, r.text[:300], file=sys.stderr, flush=True)
        return Observation(messages, tool_calls=2, tool_errors=sum(r.error for r in results),
                           tool_timeouts=sum(r.timed_out for r in results))


@register_environment("call_tools", summary="calls the job's add and python tools every turn")
def call_tools(setup):
    return CallTools(setup)
'''

# The tiny model's tokenizer is one token per character: a chat template that names the tools
# briefly keeps the prompt within its 512 positions (and is one of a model's own that describes tools).
TEMPLATE = (
    "{% if tools %}<|im_start|>system\ntools:{% for t in tools %} {{ t['function']['name'] }}{% endfor %}<|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def tool_errors(node, ns: str) -> list[str]:
    """The errors the job's environment printed, from its trainer pods' logs."""
    pods = json.loads(node.plane.kubectl("get", "pods", "-n", ns, "-o", "json").stdout)["items"]
    logs = "".join(node.plane.kubectl("logs", p["metadata"]["name"], "-n", ns, check=False).stdout for p in pods)
    return [line for line in logs.splitlines() if "tool error:" in line]


def test_an_http_tool_in_a_pod_is_called_by_a_trainer_pod(real_node, operator_release, built_images, volumes) -> None:
    from kuberl.engine.models.tiny import make_tiny_model

    node, ns = real_node, f"agent-{uuid.uuid4().hex[:6]}"
    node.plane.kubectl("create", "namespace", ns)
    image = built_images["TRAINER_IMAGE"]
    server = [
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "calc", "namespace": ns, "labels": {"app": "calc"}},
            "spec": {
                "containers": [
                    {
                        "name": "calc",
                        "image": image,
                        "imagePullPolicy": "Never",
                        "command": ["python", "-c", SERVER],
                        "ports": [{"containerPort": 8080}],
                        "readinessProbe": {"tcpSocket": {"port": 8080}, "periodSeconds": 1},
                    }
                ]
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "calc", "namespace": ns},
            "spec": {"selector": {"app": "calc"}, "ports": [{"port": 8080, "targetPort": 8080}]},
        },
    ]
    node.plane.kubectl("apply", "-f", "-", input="\n---\n".join(json.dumps(d) for d in server))
    wait_for(
        node,
        ns,
        lambda: node.plane.kubectl("get", "pod", "calc", "-n", ns, "-o", "jsonpath={.status.containerStatuses[0].ready}").stdout == "true",
        300,
        "the tool's pod ready",
    )

    files = volumes / ns / "files"
    make_tiny_model(files / "model", seed=0)
    (files / "data").mkdir(parents=True)
    (files / "data" / "train.jsonl").write_text(
        "".join(json.dumps({"prompt": f"What is {a} + {b}?", "answer": str(a + b)}) + "\n" for a in range(4) for b in range(4))
    )
    (files / "plugins").mkdir()
    (files / "plugins" / "call_tools.py").write_text(ENVIRONMENT)
    host_claim(node, ns, "rl-files", files, create_claim=True, read_only=True)
    out = host_claim(node, ns, "rl-out", volumes / ns / "out", create_claim=True)
    url = f"http://calc.{ns}.svc.cluster.local:8080/add"
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
            "algorithm": {"name": "grpo", "plugins": [{"path": "/data/plugins/call_tools.py"}]},
            "rollout": {
                "samplesPerPrompt": 4,
                "maxNewTokens": 6,
                "kvCacheBytes": 64 << 20,
                # The python tool in the trainer pod itself (sandbox.pods: false; test_sandbox_pods.py runs it in
                # sandbox pods). The pod runs under the runtime's default seccomp profile, which refuses the user
                # namespaces bubblewrap needs: the python tool runs unisolated, as the job allows.
                "multiTurn": {
                    "environment": "call_tools",
                    "maxTurns": 2,
                    "maxTotalTokens": 200,
                    "allowUnisolatedTools": True,
                    "sandbox": {"pods": False},
                    "tools": [
                        {
                            "name": "add",
                            "url": url,
                            "timeoutSeconds": 10,
                            "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}},
                        },
                        {"name": "python", "timeoutSeconds": 10},
                    ],
                },
            },
            "reward": {"rules": [{"name": "math_answer"}]},
            "roles": {"actor": {"replicas": 1, "volumeMounts": [{"name": "files", "mountPath": "/data", "readOnly": True}]}},
            "trainer": {
                "totalSteps": 2,
                "promptsPerStep": 4,
                "microBatchSize": 4,
                "seed": 3,
                "optimizer": {"lr": 1e-4},
                "checkpoint": {"path": "/out", "claimName": "rl-out", "interval": 2},
                "exportPath": "/out/final",
            },
            "monitoring": {"enabled": False},
        },
    }
    node.plane.kubectl("apply", "-f", "-", input=json.dumps(job))
    s = wait_phase(node, ns, "agent", "Succeeded")
    assert s["step"] == 2
    steps = records(out / "metrics.jsonl")
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        # 16 trajectories a step, each of its 2 turns answered by both tools, every call answered.
        assert r["multi_turn/tool_calls"] == 16 * 2 * 2, r
        assert r["multi_turn/tool_errors"] == 0 and r["multi_turn/tool_timeouts"] == 0, (r, tool_errors(node, ns))
        assert r["multi_turn/turns_mean"] == 2
    calls = [line for line in node.plane.kubectl("logs", "calc", "-n", ns).stdout.splitlines() if line.startswith("POST /add")]
    assert len(calls) == 2 * 16 * 2, calls[:5]
    # The trainer says once how its tools' calls were isolated inside the pod's security context.
    pods = [p["metadata"]["name"] for p in json.loads(node.plane.kubectl("get", "pods", "-n", ns, "-o", "json").stdout)["items"]]
    logs = "".join(node.plane.kubectl("logs", name, "-n", ns, check=False).stdout for name in pods if name != "calc")
    sandbox = [line for line in logs.splitlines() if "tool calls run " in line]
    print("\n".join(sandbox))
    assert sandbox and all("under bubblewrap" in line or "UNISOLATED" in line for line in sandbox), logs[-3000:]
    node.plane.kubectl("delete", "namespace", ns, "--wait=false", check=False)
