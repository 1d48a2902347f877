"""The sandbox pod's server (`kuberl sandbox-serve`) as a real process on loopback, called by the pod
backend as a trainer calls it: tools work through it; nothing a call starts outlives it; no call
reads another's files or the server's environment; bad and oversized requests are refused with a
message; a pod that cannot be reached, or that answers too much, becomes an error the model reads.

The server here runs with the plain process backend, where it is not its PID namespace's init
(it is a subreaper): what the after-call sweep and wipe do is then all that stands between calls."""

from __future__ import annotations

import http.client
import json
import os
import secrets
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from kuberl.engine.agents import isolation
from kuberl.engine.agents.python_tool import sandbox_failure
from kuberl.engine.agents.sandbox import Limits
from kuberl.engine.agents.sandbox_pod import PodBackend
from kuberl.engine.agents.sandbox_protocol import CALL_PATH, MAX_REQUEST_BYTES, SANDBOX_URL_ENV
from kuberl.engine.agents.tools import build_tools
from kuberl.engine.config.multi_turn import ToolSpec

from .sandbox_servers import Server, Servers, descendants, start_server

LIMITS = Limits(timeout=5.0)
SECRET = "server-s3cret-" + secrets.token_hex(6)


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Server:
    root = tmp_path_factory.mktemp("sandbox-server")
    s = start_server(root / "scratch", backend="process", cwd=root, env={**os.environ, "KUBERL_SERVER_SECRET": SECRET})
    yield s
    s.stop()


@pytest.fixture
def pod(server: Server) -> PodBackend:
    return PodBackend(server.url, queue_seconds=30.0, ready_seconds=30.0)


def _post(port: int, body: bytes, headers: dict[str, str] | None = None, path: str = CALL_PATH) -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.putrequest("POST", path)
        for k, v in (headers if headers is not None else {"Content-Length": str(len(body))}).items():
            conn.putheader(k, v)
        conn.endheaders()
        try:
            conn.send(body)
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused before it read the body: the answer is still there
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


CALCULATOR = '''
import ast, operator

OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def calc(expression: str) -> str:
    """Evaluates an arithmetic expression of integers with + - *."""
    def ev(node):
        if isinstance(node, ast.BinOp) and type(node.op) in OPS:
            return OPS[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        raise ValueError("not arithmetic")
    return str(ev(ast.parse(expression, mode="eval").body))
'''


def test_a_function_tool_runs_through_the_sandbox_pod(server: Server, tmp_path: Path, monkeypatch) -> None:
    """The trainer's whole path: KUBERL_SANDBOX_URL set, the pod backend chosen, the function's schema
    read and its calls run in the server; the function's file never leaves the trainer (its source does)."""
    tool_file = tmp_path / "calc.py"
    tool_file.write_text(CALCULATOR)
    monkeypatch.setenv(SANDBOX_URL_ENV, server.url)
    monkeypatch.setattr(isolation, "_probed", {})
    monkeypatch.setattr(isolation, "_active", None)
    [calc] = build_tools([ToolSpec(name="calc", path=str(tool_file), timeout_seconds=10)]).values()
    assert isolation._active is not None and isolation._active.name == "pod"
    assert calc.description == "Evaluates an arithmetic expression of integers with + - *."
    assert calc.parameters["required"] == ["expression"]
    assert calc.call({"expression": "12 + 30 * 2 - 5"}).text == "67"
    failed = calc.call({"expression": "__import__('os')"})
    assert failed.error and "not arithmetic" in failed.text
    [python] = build_tools([ToolSpec(name="python", timeout_seconds=10)]).values()
    assert python.call({"code": "print(sum(range(10)))"}).text == "45\n"


def test_a_daemon_left_behind_does_not_outlive_its_call(server: Server, pod: PodBackend) -> None:
    tag = "kuberl-daemon-" + secrets.token_hex(4)
    code = (
        "import os, subprocess, sys\n"
        f"subprocess.Popen(['/bin/sh', '-c', 'sleep 300 # {tag}-setsid'], start_new_session=True)\n"
        "if os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
        f"        os.execv('/bin/sh', ['sh', '-c', 'sleep 300 # {tag}-double-fork'])\n    os._exit(0)\n"
        "import time; time.sleep(0.5); print('left them running')"
    )
    outcome = pod.run({"mode": "python", "code": code, "audit_hook": False}, LIMITS)
    assert outcome.output == b"left them running\n", outcome
    survivors = [p for p in descendants(server.proc.pid)]
    running = [p for p in os.listdir("/proc") if p.isdigit() and tag.encode() in _cmdline(p)]
    assert survivors == [] and running == [], (survivors, running)


def _cmdline(pid: str) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def test_a_call_cannot_read_what_the_last_one_left(server: Server, pod: PodBackend) -> None:
    word = secrets.token_hex(8)
    first = (
        f"import os\nopen('mine', 'w').write({word!r})\n"
        f"up = os.path.dirname(os.getcwd()); open(os.path.join(up, 'planted'), 'w').write({word!r})\n"
        "os.makedirs('locked/deeper'); open('locked/deeper/f', 'w').write(" + repr(word) + ")\n"
        "os.chmod('locked/deeper', 0); os.chmod('locked', 0)\nprint(os.getcwd())"
    )
    wrote = pod.run({"mode": "python", "code": first, "audit_hook": False}, LIMITS)
    assert wrote.reply.get("ok"), wrote
    where = wrote.output.decode().strip()
    second = (
        f"import os\nfor root, dirs, files in os.walk({str(server.scratch)!r}):\n"
        "    for f in files:\n        print(open(os.path.join(root, f)).read())\n"
        f"print(sorted(os.listdir({str(server.scratch)!r})))\n"
        f"print(os.path.exists({where!r}))"
    )
    read = pod.run({"mode": "python", "code": second, "audit_hook": False}, LIMITS).output.decode()
    assert word not in read and read.strip().endswith("False"), read
    assert word not in "".join(p.read_text(errors="replace") for p in server.scratch.rglob("*") if p.is_file())


def test_the_server_is_undumpable_and_reaps_orphans() -> None:
    code = (
        "import ctypes; from kuberl.engine.agents.sandbox_sweep import guard_server; guard_server()\n"
        "libc = ctypes.CDLL(None); v = ctypes.c_int(-1)\n"
        "print(libc.prctl(3, 0, 0, 0, 0), libc.prctl(37, ctypes.byref(v), 0, 0, 0), v.value)"
    )  # GET_DUMPABLE, GET_CHILD_SUBREAPER
    said = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert said == ["0", "0", "1"], said


@pytest.mark.skipif(
    os.geteuid() == 0,
    reason="as root the call's process holds CAP_SYS_PTRACE, which reads any process's "
    "environment; in a sandbox pod the server and its calls run as uid 10001 without capabilities",
)
def test_a_call_cannot_read_the_servers_environment(server: Server, pod: PodBackend) -> None:
    """The server is undumpable: a call of its own user cannot read its /proc environ or memory."""
    code = (
        f"import os\nfor what in ('environ', 'mem'):\n    try: print(open('/proc/{server.proc.pid}/' + what, 'rb').read(65536))\n"
        "    except OSError as e: print('refused', what, e.errno)"
    )
    said = pod.run({"mode": "python", "code": code, "audit_hook": False}, LIMITS).output.decode()
    assert SECRET not in said and said.count("refused") == 2, said


def test_bad_requests_are_refused_with_a_message(server: Server) -> None:
    status, said = _post(server.port, b"x", headers={"Content-Length": str(MAX_REQUEST_BYTES + 1)})
    assert status == 413 and str(MAX_REQUEST_BYTES) in said["error"]
    status, said = _post(server.port, b"{not json")
    assert status == 400 and "not a call" in said["error"]
    body = json.dumps({"request": {"mode": "shell", "code": "ls"}, "limits": {"timeout": 1}}).encode()
    status, said = _post(server.port, body)
    assert status == 400 and "request.mode" in said["error"]
    body = json.dumps({"request": {"mode": "python", "code": "1", "reply_fd": 1}, "limits": {"timeout": 1}}).encode()
    status, said = _post(server.port, body)
    assert status == 400 and "reply_fd" in said["error"]
    body = json.dumps({"request": {"mode": "python", "code": "1"}, "limits": {"timeout": 100000}}).encode()
    status, said = _post(server.port, body)
    assert status == 400 and "limits.timeout" in said["error"]
    status, said = _post(server.port, b"{}", path="/v1/other")
    assert status == 404
    # The server still serves.
    assert PodBackend(server.url).run({"mode": "python", "code": "print(1)"}, LIMITS).output == b"1\n"


def test_an_oversized_request_from_the_backend_is_an_error_not_a_crash(pod: PodBackend) -> None:
    outcome = pod.run({"mode": "python", "code": "x = '" + "a" * (MAX_REQUEST_BYTES + 10) + "'"}, LIMITS)
    failure = sandbox_failure(outcome, LIMITS)
    assert failure is not None and failure.error and f"more than a sandbox pod takes ({MAX_REQUEST_BYTES})" in failure.text


def test_one_call_at_a_time_the_next_waits_for_a_free_pod(server: Server, pod: PodBackend) -> None:
    with ThreadPoolExecutor(max_workers=2) as pool:
        slow = pool.submit(pod.run, {"mode": "python", "code": "import time; time.sleep(1.5); print('slow')"}, LIMITS)
        time.sleep(0.5)
        status, said = _post(
            server.port, json.dumps({"request": {"mode": "python", "code": "print(2)"}, "limits": {"timeout": 5}}).encode()
        )
        assert status == 503 and "busy" in said["error"]
        queued = pool.submit(pod.run, {"mode": "python", "code": "print('after')"}, LIMITS)
        assert slow.result().output == b"slow\n" and queued.result().output == b"after\n"


def test_an_unreachable_sandbox_is_a_clear_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once it closes
    backend = PodBackend(f"http://127.0.0.1:{port}", queue_seconds=0.5, ready_seconds=0.5)
    failure = sandbox_failure(backend.run({"mode": "python", "code": "print(1)"}, LIMITS), LIMITS)
    assert failure is not None and failure.text.startswith("Error: no sandbox pod took the call")
    assert f"127.0.0.1:{port}" in failure.text
    refused = isolation.decide_remote(backend.url, backend.probe())
    assert refused.backend is None and "kubectl get pods -l kuberl.dev/sandbox=" in refused.message


def test_a_reply_larger_than_the_call_allows_is_not_read() -> None:
    """A sandbox pod that answers with more than the call's output could hold is refused, unread."""

    class Flood(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Length", str(1 << 30))
            self.end_headers()
            self.wfile.write(b"{" + b" " * 65536)

        def log_message(self, *args) -> None:
            pass

    flood = HTTPServer(("127.0.0.1", 0), Flood)
    threading.Thread(target=flood.serve_forever, daemon=True).start()
    try:
        outcome = PodBackend(f"http://127.0.0.1:{flood.server_address[1]}").run({"mode": "python", "code": "1"}, LIMITS)
    finally:
        flood.shutdown()
    assert outcome.error is not None and "1073741824 bytes" in outcome.error and "refused" in outcome.error


def test_a_second_server_shares_the_calls(tmp_path: Path, server: Server) -> None:
    other = start_server(tmp_path / "scratch", backend="process")
    try:
        both = Servers([server, other])
        code = "import os, time; time.sleep(0.6); print(os.getppid())"
        with ThreadPoolExecutor(max_workers=2) as pool:
            outcomes = list(pool.map(lambda _: both.run({"mode": "python", "code": code, "audit_hook": False}, LIMITS), range(2)))
        assert {o.output.strip() for o in outcomes} == {str(server.proc.pid).encode(), str(other.proc.pid).encode()}
    finally:
        other.stop()


def test_a_pod_lost_during_a_call_is_an_error_the_model_reads(tmp_path: Path) -> None:
    doomed = start_server(tmp_path / "scratch", backend="process")
    try:
        backend = PodBackend(doomed.url, queue_seconds=5.0)
        with ThreadPoolExecutor(max_workers=1) as pool:
            call = pool.submit(backend.run, {"mode": "python", "code": "import time; time.sleep(2); print('late')"}, LIMITS)
            time.sleep(0.8)
            doomed.proc.kill()  # as a node that goes, or the pod's OOM kill
            failure = sandbox_failure(call.result(), LIMITS)
    finally:
        doomed.stop()
    assert failure is not None and failure.text.startswith("Error: the sandbox pod 127.0.0.1 dropped the call"), failure
