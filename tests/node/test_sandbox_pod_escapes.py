"""The escape corpus (tests/agents/escape_cases.py) run by a real trainer against its job's sandbox pods on the
real node, with the job's NetworkPolicies enforced: zero escapes.

The RLJob names the python tool; the operator makes the sandbox pods (the trainer image's `kuberl
sandbox-serve`) and the policies; the namespace enforces Pod Security `restricted`. The job's environment
plug-in (on the job's claim) is the attacker's driver inside the trainer pod: on its first turn it sends every
case of the corpus through the job's own python tool, with the placeholders naming the trainer pod's things
(its address and listening sockets, its process and a victim process holding the secret, its ServiceAccount
token, a file in its checkpoint folder), and judges from the trainer's side what reached them. The secret is
in the trainer's environment through the RLJob's `env`. The test then judges from outside: the job succeeds
in one attempt (a signal the trainer does not handle would have ended it), and in each sandbox pod nothing of
a call is left (no file outside the image, no process but the server's, no restart, the runtime's files
unchanged). What each check means is test_sandbox_escapes.py's; the checks of the host's own files and
folders there (the trainer's working folder, the host's /dev/shm and name) become the sandbox pods' here.
"""

from __future__ import annotations

import json
import secrets
import uuid
from dataclasses import asdict
from datetime import datetime

import pytest

from ..agents.escape_cases import CASES

from .test_cluster_examples import host_claim, records, status, volumes, wait_for  # noqa: F401  (volumes: a fixture)
from .test_sandbox_pods import TEMPLATE

pytestmark = pytest.mark.slow

TOOL_TIMEOUT_S = 5
# Where the pod alone (the audit hook off) is not bubblewrap, and docs/security.md says so: these checks of the
# corpus are bubblewrap's promises, not the pod's.
POD_ONLY_GAPS = {
    "netlink-route refused": "a pod has a network namespace of its own: a netlink socket there shows only the pod's "
    "interfaces and, with no capability, changes nothing",
}
# Left out of the pod-only run (none: the fork bomb, once left out, now ends with its call; the node's
# podPidsLimit bounds it and the server, its namespace's init, ends it with one kill(-1)).
POD_ONLY_SKIPPED: dict[str, str] = {}
# The driver, in the trainer's process. Its checks are the trainer's view of test_sandbox_escapes.escapes().
DRIVER = r'''
import hashlib, json, os, re, signal, socket, subprocess, threading, time
from kuberl.engine.agents import Environment, Observation, register_environment
from kuberl.engine.agents.sandbox import CHILD, Limits
from kuberl.engine.agents.sandbox_pod import PodBackend

CASES = json.loads(%(cases)r)
POD_ONLY_GAPS = json.loads(%(gaps)r)
POD_ONLY_SKIPPED = json.loads(%(skipped)r)
POD_VIEW = %(pod_view)r
TOOL_TIMEOUT_S = %(timeout)d
OUT = "/out/escapes.jsonl"
SECRET = os.environ["ESCAPE_SECRET"]
TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"
TRAINER_FILE = "/out/trainer.txt"
TRAINER_CONTENT = "the trainer's checkpoint\n"
_lock = threading.Lock()
_ran = []


def _listeners(key):
    tcp = socket.socket(); tcp.bind(("0.0.0.0", 0)); tcp.listen(8)
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); udp.bind(("0.0.0.0", 0))
    unix = socket.socket(socket.AF_UNIX); unix.bind("/tmp/s-" + key); unix.listen(8)
    abstract = socket.socket(socket.AF_UNIX); abstract.bind("\0kuberl-" + key); abstract.listen(8)
    for s in (tcp, udp, unix, abstract):
        s.setblocking(False)
    return tcp, udp, unix, abstract


def _received(sockets):
    tcp, udp, unix, abstract = sockets
    got = []
    for name, s in (("tcp", tcp), ("unix", unix), ("abstract", abstract)):
        try:
            c, _ = s.accept(); c.close(); got.append("a %%s connection" %% name)
        except BlockingIOError:
            pass
    try:
        got.append("a udp datagram %%r" %% udp.recv(100))
    except BlockingIOError:
        pass
    return got


def _tracer(pid):
    return int(re.search(r"TracerPid:\s+(\d+)", open("/proc/%%d/status" %% pid).read()).group(1))


class Said:
    """A call's result as the checks read it, from the job's tool or from the pod backend."""
    def __init__(self, text, error, timed_out):
        self.text, self.error, self.timed_out = text, error, timed_out


def through_the_tool(tool):
    return lambda code: tool.call({"code": code})


def through_the_pods(hook):
    """The job's sandbox pods as the tool reaches them, with the audit hook as asked: off, the pod is the only wall."""
    backend, limits = PodBackend(), Limits(timeout=TOOL_TIMEOUT_S, memory_mb=512, max_output_bytes=1 << 16)
    def call(code):
        o = backend.run({"mode": "python", "code": code, "audit_hook": hook}, limits)
        return Said(o.output.decode("utf-8", "replace"), bool(o.error) or not o.reply.get("ok", False), bool(o.timed_out))
    return call


def run_corpus(call, config):
    with open(TRAINER_FILE, "w") as f:
        f.write(TRAINER_CONTENT)
    os.chmod(TRAINER_FILE, 0o644)
    token = open(TOKEN).read().strip() if os.path.exists(TOKEN) else None
    token_fd = os.open(TOKEN, os.O_RDONLY) if token else None  # held open, as the trainer's client does
    victim = subprocess.Popen(["sleep", "3600"], start_new_session=True)
    host_ip = socket.gethostbyname(socket.gethostname())
    results = []
    for case in CASES:
        if config == "pod-only" and case["name"] in POD_ONLY_SKIPPED:
            continue
        key = case["name"][:40] + "-" + config + "-" + SECRET[-6:]
        sockets = _listeners(key)
        values = {
            "@MARKER@": repr("/tmp/m-" + case["name"]), "@ARENA@": repr("/tmp"), "@TRAINER@": repr(TRAINER_FILE),
            "@TOKEN@": repr(TOKEN), "@TRAINER_PID@": str(os.getpid()), "@VICTIM@": str(victim.pid),
            "@PORT@": str(sockets[0].getsockname()[1]), "@UDP@": str(sockets[1].getsockname()[1]),
            "@UNIX@": repr(sockets[2].getsockname()), "@ABSTRACT@": repr(sockets[3].getsockname()),
            "@HOST_IP@": repr(host_ip), "@TAG@": "kuberl-escape-" + case["name"], "@CHILD@": repr(str(CHILD)),
        }
        code = re.sub("|".join(map(re.escape, values)), lambda m: values[m.group(0)], case["code"])
        # The trainer's address stands in for loopback: in its own pod, a sandbox's 127.0.0.1 is its own.
        code = code.replace("'127.0.0.1'", repr(host_ip))
        started = time.monotonic()
        result = call(code)
        seconds = time.monotonic() - started
        time.sleep(0.2)  # a datagram in flight
        printed = result.text
        found = []
        checks = [c for c in case["checks"] if config != "pod-only" or case["name"] + " " + c not in POD_ONLY_GAPS]
        if "secret" in checks and (SECRET in printed or (token and token in printed)):
            found.append("the secret or the token was read")
        if "network" in checks:
            found += _received(sockets)
        if "victim" in checks:
            if victim.poll() is not None:
                found.append("the victim process was killed")
            elif _tracer(victim.pid) != 0:
                found.append("the victim process is traced")
        if "trainer" in checks:
            if not os.path.exists(TRAINER_FILE) or open(TRAINER_FILE).read() != TRAINER_CONTENT:
                found.append("the trainer's file changed or went")
            elif os.stat(TRAINER_FILE).st_mode & 0o777 != 0o644:
                found.append("the trainer's file's mode changed")
        if "trainer_read" in checks and TRAINER_CONTENT.strip() in printed:
            found.append("the trainer's file was read")
        if "trainer_cwd" in checks and "trainer.txt" in printed:
            found.append("the trainer's folder was listed")
        if "no_folder" in checks and "FileNotFoundError" not in printed:
            found.append("the ServiceAccount folder is visible: " + printed[:200])
        if "refused" in checks and ("CREATED" in printed or "ALLOCATED" in printed):
            found.append("the kernel allowed it: " + printed[:200])
        if "limited" in checks and seconds > TOOL_TIMEOUT_S + 30:
            found.append("the call took %%.1f s" %% seconds)
        if "scratch_bounded" in checks:
            wrote = re.search(r"WROTE (\d+)", printed)
            if wrote is not None and int(wrote.group(1)) > 1 << 30:
                found.append("the scratch took more than the pod's volume: " + printed[:200])
        for s in sockets:
            s.close()
        os.unlink("/tmp/s-" + key)
        results.append({"config": config, "name": case["name"], "found": found, "error": result.error, "timed_out": result.timed_out,
                        "seconds": round(seconds, 2), "printed": printed[:300]})
    alive = victim.poll() is None and _tracer(victim.pid) == 0
    victim.kill()
    if token_fd is not None:
        os.close(token_fd)
    return results, {"victim_alive": alive, "token_mounted": token is not None,
                     "trainer_file_intact": open(TRAINER_FILE).read() == TRAINER_CONTENT}


def pod_views(call, pods=2, seconds=120):
    """Each sandbox pod's view (POD_VIEW) by pod name; calls land on a pod at random, a busy one passed over."""
    views = {}
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            view = json.loads(call(POD_VIEW).text)
        except ValueError:
            continue
        views[view["hostname"]] = view
        if len(views) == pods:
            break
    return views


def run_everything(tool):
    started = time.time()
    results, configs = [], {}
    for config, call in (("tool", through_the_tool(tool)), ("pod-only", through_the_pods(hook=False))):
        done, configs[config] = run_corpus(call, config)
        results += done
    pods = pod_views(through_the_pods(hook=False))
    runtime = {p: hashlib.sha256(open(p, "rb").read()).hexdigest() for p in (str(CHILD), os.__file__)}
    with open(OUT, "w") as f:
        for r in results:
            f.write(json.dumps(r) + "\n")
    with open("/out/trainer-view.json", "w") as f:
        json.dump({"configs": configs, "runtime": runtime, "pods": pods, "started": started}, f)


class Driver(Environment):
    def __init__(self, setup):
        self.setup = setup

    def step(self, text):
        with _lock:
            if not _ran:
                _ran.append(True)
                run_everything(self.setup.tools["python"])
        return Observation([{"role": "tool", "name": "python", "content": "done"}], tool_calls=1, tool_errors=0, tool_timeouts=0)


@register_environment("escape_corpus", summary="runs the escape corpus through the job's python tool, once")
def escape_corpus(setup):
    return Driver(setup)
'''

# What is left in a sandbox pod, seen from a call in it (an exec'd process is killed by the server's sweep): files in
# the places a call can write (the scratch volume but its own folder, /dev/shm, a marker in /, the venv), processes
# a call of the corpus started, the pod's name and the runtime's files' digests.
POD_VIEW = r"""
import hashlib, json, os, sys
from kuberl.engine.agents.sandbox import CHILD
# This call's own folders: its scratch (TMPDIR) and the one the server passes its request and output through.
io = [os.path.join("/tmp", d) for d in os.listdir("/tmp") if d.startswith("kuberl-tool-io-")]
mine = [os.environ.get("TMPDIR", "")] + (io if len(io) == 1 else [])
left = []
for top in ("/tmp", "/dev/shm"):
    for root, dirs, files in os.walk(top):
        left += [p for p in (os.path.join(root, n) for n in dirs + files) if not p.startswith(tuple(mine))]
left += [os.path.join("/", n) for n in os.listdir("/") if n.startswith("m-")]
left += [p for p in [os.path.join(sys.prefix, "m-write-into-venv")] if os.path.lexists(p)]
procs = []
for pid in os.listdir("/proc"):
    if pid.isdigit() and int(pid) != os.getpid():
        try:
            procs.append(open("/proc/%s/cmdline" % pid, "rb").read().replace(bytes(1), b" ").decode("utf-8", "replace"))
        except OSError:
            pass
print(json.dumps({"left": left, "survivors": [p for p in procs if "kuberl-escape-" in p],
                  "hostname": open("/proc/sys/kernel/hostname").read().strip(),
                  "runtime": {p: hashlib.sha256(open(p, "rb").read()).hexdigest() for p in (str(CHILD), os.__file__)}}))
"""


def test_the_corpus_run_by_a_trainer_against_its_sandbox_pods_escapes_nowhere(
    real_node, network_policy_enforcer, operator_release, built_images, volumes
) -> None:
    from kuberl.engine.models.tiny import make_tiny_model

    node, ns = real_node, f"escapes-{uuid.uuid4().hex[:6]}"
    node.plane.kubectl("create", "namespace", ns)
    node.plane.kubectl("label", "namespace", ns, "pod-security.kubernetes.io/enforce=restricted")
    secret = "s3cret-" + secrets.token_hex(8)
    files = volumes / ns / "files"
    make_tiny_model(files / "model", seed=0)
    (files / "data").mkdir(parents=True)
    (files / "data" / "train.jsonl").write_text(
        "".join(json.dumps({"prompt": f"What is {a} + 1?", "answer": str(a + 1)}) + "\n" for a in range(2))
    )
    (files / "plugins").mkdir()
    (files / "plugins" / "escape_corpus.py").write_text(
        DRIVER
        % {
            "cases": json.dumps([asdict(c) for c in CASES]),
            "timeout": TOOL_TIMEOUT_S,
            "pod_view": POD_VIEW,
            "gaps": json.dumps(POD_ONLY_GAPS),
            "skipped": json.dumps(POD_ONLY_SKIPPED),
        }
    )
    host_claim(node, ns, "rl-files", files, create_claim=True, read_only=True)
    out = host_claim(node, ns, "rl-out", volumes / ns / "out", create_claim=True)
    job = {
        "apiVersion": "kuberl.dev/v1alpha1",
        "kind": "RLJob",
        "metadata": {"name": "attacked", "namespace": ns},
        "spec": {
            "image": built_images["TRAINER_IMAGE"],
            "imagePullPolicy": "Never",
            "volumes": [{"name": "files", "persistentVolumeClaim": {"claimName": "rl-files", "readOnly": True}}],
            "model": {"path": "/data/model", "dtype": "float32"},
            "tokenizer": {"chatTemplate": TEMPLATE},
            "data": {"train": {"path": "/data/data/train.jsonl"}, "maxPromptLength": 200},
            "algorithm": {"name": "grpo", "plugins": [{"path": "/data/plugins/escape_corpus.py"}]},
            "rollout": {
                "samplesPerPrompt": 2,
                "maxNewTokens": 4,
                "kvCacheBytes": 64 << 20,
                "multiTurn": {
                    "environment": "escape_corpus",
                    "maxTurns": 1,
                    "maxTotalTokens": 300,
                    "tools": [{"name": "python", "timeoutSeconds": TOOL_TIMEOUT_S}],
                },
            },
            "reward": {"rules": [{"name": "math_answer"}]},
            "roles": {
                "actor": {
                    "replicas": 1,
                    "env": [{"name": "ESCAPE_SECRET", "value": secret}],
                    "volumeMounts": [{"name": "files", "mountPath": "/data", "readOnly": True}],
                }
            },
            "trainer": {
                "totalSteps": 1,
                "promptsPerStep": 2,
                "microBatchSize": 4,
                "seed": 3,
                "optimizer": {"lr": 1e-4},
                "checkpoint": {"path": "/out", "claimName": "rl-out", "interval": 1},
            },
            "monitoring": {"enabled": False},
        },
    }
    node.plane.kubectl("apply", "-f", "-", input=json.dumps(job))
    s = wait_for(
        node, ns, lambda: (st := status(node, ns, "attacked")).get("phase") in ("Succeeded", "Failed") and st, 1500, f"{ns}/attacked to end"
    )
    assert s["phase"] == "Succeeded", s
    # One attempt: a call that had signalled or killed the trainer (SIGUSR1's default ends it) would have restarted it.
    assert s["step"] == 1 and s.get("restarts", 0) == 0, s

    results = records(out / "escapes.jsonl")
    configs = ("tool", "pod-only")
    assert [(r["config"], r["name"]) for r in results] == [
        (k, c.name) for k in configs for c in CASES if k == "tool" or c.name not in POD_ONLY_SKIPPED
    ]
    escaped = {(r["config"], r["name"]): (r["found"], r["printed"]) for r in results if r["found"]}
    assert not escaped, escaped
    view = json.loads((out / "trainer-view.json").read_text())
    for config in configs:  # the bait was there all along
        assert view["configs"][config] == {"victim_alive": True, "token_mounted": True, "trainer_file_intact": True}, view
    # With the hook off the pod is the only wall: a write into the pod's scratch volume, which the hook refuses,
    # succeeds there (and is gone before the next call: the views below), and the kernel still refuses root.
    unhooked = {r["name"]: r for r in results if r["config"] == "pod-only"}
    hooked = {r["name"]: r for r in results if r["config"] == "tool"}
    assert hooked["open-w"]["error"] and not unhooked["open-w"]["error"], (hooked["open-w"], unhooked["open-w"])
    assert "PermissionError" in unhooked["setuid-root-then-write"]["printed"], unhooked["setuid-root-then-write"]

    pods = {
        p["metadata"]["name"]: p
        for p in json.loads(node.plane.kubectl("get", "pods", "-n", ns, "-l", "kuberl.dev/sandbox=attacked", "-o", "json").stdout)["items"]
    }
    # A pod whose scratch volume a call filled is evicted and replaced (docs/security.md): a pod the views did not
    # reach must be such a replacement, made after the corpus began.
    assert view["pods"] and set(view["pods"]) <= set(pods), (sorted(pods), sorted(view["pods"]))
    for name in set(pods) - set(view["pods"]):
        made = datetime.fromisoformat(pods[name]["metadata"]["creationTimestamp"].replace("Z", "+00:00")).timestamp()
        evicted = pods[name]["status"].get("reason") == "Evicted"
        assert made > view["started"] or evicted, (name, "was there before the corpus and no call reached it", pods[name]["status"])
    for name, seen in view["pods"].items():
        assert all(c["restartCount"] == 0 for c in pods[name]["status"]["containerStatuses"]), (name, pods[name]["status"])
        assert seen["left"] == [] and seen["survivors"] == [], (name, seen)
        assert seen["runtime"] == view["runtime"], (name, seen["runtime"], view["runtime"])
    node.plane.kubectl("delete", "namespace", ns, "--wait=false", check=False)
