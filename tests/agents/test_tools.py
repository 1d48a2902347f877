"""Tools: the calculator's exact arithmetic, the sandbox's limits, HTTP endpoints, and a turn of
misbehaving tools that ends in error messages within the timeout while the rollout goes on."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from kuberl.engine.agents import BUILTIN_TOOLS, PARSERS, TOOL_KINDS, build_tools
from kuberl.engine.agents.calculator import evaluate, format_number
from kuberl.engine.config import multi_turn as api
from kuberl.engine.config.multi_turn import MultiTurnSpec, ToolSpec

TOOLS = '''
import os, time

def add(a: int, b: int) -> str:
    """Adds two integers.

    Returns the sum as text."""
    return str(a + b)

def hang(x: str = "") -> str:
    while True:
        pass

def sleep() -> str:
    time.sleep(600)

def crash() -> str:
    os.abort()

def huge() -> str:
    return "x" * (10 << 20)

def chatty() -> str:
    while True:
        print("y" * 65536)

def number() -> str:
    return 42

def environment() -> str:
    return ",".join(sorted(os.environ))

def connect() -> str:
    import urllib.request
    return urllib.request.urlopen("http://127.0.0.1:%d/" % PORT).read().decode()

def write_outside() -> str:
    open(TARGET, "w").write("x")
    return "written"

def write_inside() -> str:
    open("scratch.txt", "w").write("x")
    return open("scratch.txt").read() + os.getcwd()

def memory() -> str:
    return str(len(bytearray(4 << 30)))
'''


@pytest.fixture(scope="module")
def server():
    """An HTTP endpoint: POST /add {a, b} -> {"sum": a+b}; /slow sleeps; /text is not JSON; /big is 1 MB; /fail is a 500."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):  # quiet
            pass

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
            if self.path == "/slow":
                time.sleep(30)
            status, reply = 200, json.dumps({"sum": body.get("a", 0) + body.get("b", 0)}).encode()
            if self.path == "/text":
                reply = b"not json"
            elif self.path == "/big":
                reply = json.dumps("z" * (1 << 20)).encode()
            elif self.path == "/fail":
                status, reply = 500, b"boom"
            elif self.path == "/string":
                reply = json.dumps("forty-two").encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


@pytest.fixture
def loopback_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    """These servers listen on 127.0.0.1, which HTTP tools refuse unless the allow-list names it."""
    monkeypatch.setenv("KUBERL_TOOL_ALLOWED_NETWORKS", "127.0.0.0/8")


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens there once the socket closes


@pytest.fixture
def tool_file(tmp_path: Path, server: str) -> Path:
    path = tmp_path / "tools.py"
    path.write_text(f"PORT = {server.rsplit(':', 1)[1]}\nTARGET = {str(tmp_path / 'outside.txt')!r}\n" + TOOLS)
    return path


def test_the_registries_match_the_api() -> None:
    assert set(BUILTIN_TOOLS) == set(api.BUILTIN_TOOLS)
    assert set(TOOL_KINDS) == {"builtin", "function", "http"} and "hermes" in PARSERS


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("12 + 30 + 7", "49"),
        ("0.1 + 0.2", "0.3"),
        ("1/3 + 1/6", "0.5"),
        ("1/3", "1/3"),
        ("2**100", str(2**100)),
        ("-(3 - 10) * 2", "14"),
        ("7 // 2", "3"),
        ("7 % 3", "1"),
        ("2^-2", "0.25"),
        ("1,000 + 1", "1001"),
        ("3 × 4 ÷ 6", "2"),
    ],
)
def test_calculator_is_exact(expression: str, value: str) -> None:
    assert format_number(evaluate(expression)) == value


@pytest.mark.parametrize(
    ("expression", "error"),
    [
        ("__import__('os').system('true')", "not Call"),
        ("x + 1", "not Name"),
        ("(1).real", "not Attribute"),
        ("9**9**9", "exponents are limited"),
        ("2**1000 * 2**1000 * 2**1000 * 2**1000 * 2**1000", "too large"),
        ("1/0", "division by zero"),
        ("1 +", "cannot parse"),
        ("2 ** 0.5", "whole-number exponents"),
        ("[1]", "not List"),
        ("1" * 600, "longer than"),
    ],
)
def test_calculator_refuses_everything_but_arithmetic(expression: str, error: str) -> None:
    [calculator] = build_tools([ToolSpec(name="calculator")]).values()
    result = calculator.call({"expression": expression})
    assert result.error and error in result.text, result.text


def test_a_function_tool_runs_in_the_sandbox(tool_file: Path, tmp_path: Path) -> None:
    tools = build_tools(
        [
            ToolSpec(name="add", path=str(tool_file)),
            ToolSpec(name="environment", path=str(tool_file)),
            ToolSpec(name="write_inside", path=str(tool_file)),
        ]
    )
    # The schema comes from the signature and the docstring, read in the sandbox.
    assert tools["add"].schema()["function"] == {
        "name": "add",
        "description": "Adds two integers.",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]},
    }
    assert tools["add"].call({"a": 2, "b": 40}).text == "42"
    assert tools["add"].call({"a": 2}).error  # a missing argument is an error message, not an exception
    os.environ["KUBERL_TEST_SECRET"] = "s3cret"
    try:
        names = tools["environment"].call({}).text.split(",")
    finally:
        del os.environ["KUBERL_TEST_SECRET"]
    assert "KUBERL_TEST_SECRET" not in names and "PATH" in names  # none of the trainer's environment
    text = tools["write_inside"].call({}).text
    assert text == "x/tmp"  # a scratch folder of its own (a private tmpfs, gone after the call)


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("hang", "did not finish within its 2 s"),
        ("sleep", "did not finish within its 2 s"),
        ("crash", "killed by SIGABRT"),
        ("huge", "returned 10485760 bytes, more than its limit of 16384"),
        ("chatty", "printed more than its limit"),
        ("number", "returned int, not text"),
        ("connect", "refuses socket"),
        ("write_outside", "No such file or directory"),  # the trainer's folders are not in the sandbox
        ("memory", "MemoryError"),
    ],
)
def test_a_misbehaving_function_is_an_error_message_within_its_timeout(tool_file: Path, tmp_path: Path, name: str, message: str) -> None:
    target = tmp_path / "outside.txt"
    [tool] = build_tools([ToolSpec(name=name, path=str(tool_file), timeout_seconds=2)]).values()
    started = time.monotonic()
    result = tool.call({})
    assert time.monotonic() - started < 2 + 3
    assert result.error and result.text.startswith("Error: ") and message in result.text, result.text
    assert len(result.text) < 600
    assert result.timed_out == (name in ("hang", "sleep"))
    assert not target.exists()


def test_the_python_tool(tmp_path: Path) -> None:
    [python] = build_tools([ToolSpec(name="python", timeout_seconds=5)]).values()
    assert python.call({"code": "print(sum(range(10)))"}).text == "45\n"
    assert python.call({"code": "x = 1"}).text.startswith("(no output")
    failed = python.call({"code": "1/0"})
    assert failed.error and "ZeroDivisionError" in failed.text
    assert "refuses socket" in python.call({"code": "import socket; socket.create_connection(('127.0.0.1', 1))"}).text
    assert "refuses subprocess" in python.call({"code": "import subprocess; subprocess.run(['true'])"}).text
    assert python.call({"code": "while True: pass"}).timed_out
    assert python.call({"nope": 1}).error


def test_http_tools(server: str, loopback_allowed: None) -> None:
    spec = lambda path, **kw: ToolSpec(name=path.strip("/") or "root", url=server + path, timeout_seconds=2, **kw)  # noqa: E731
    tools = build_tools(
        [
            spec("/add"),
            spec("/string"),
            spec("/slow"),
            spec("/text"),
            spec("/big"),
            spec("/fail"),
            ToolSpec(name="refused", url=f"http://127.0.0.1:{closed_port()}/", timeout_seconds=2),
        ]
    )
    assert json.loads(tools["add"].call({"a": 1, "b": 2}).text) == {"sum": 3}
    assert tools["string"].call({}).text == "forty-two"
    started = time.monotonic()
    slow = tools["slow"].call({})
    assert slow.timed_out and time.monotonic() - started < 5
    assert "did not answer with JSON" in tools["text"].call({}).text
    assert "more than the limit of 16384 bytes" in tools["big"].call({}).text
    assert "HTTP 500: boom" in tools["fail"].call({}).text
    refused = tools["refused"].call({})
    assert refused.error and "cannot reach" in refused.text and "refused" in refused.text.lower()


def test_a_turn_of_failing_tools_ends_in_error_messages_and_the_rollout_goes_on(
    tool_tokenizer_for_tools, tool_file: Path, loopback_allowed: None
) -> None:
    """A hanging tool, a crashing one, one that returns 10 MB and an HTTP tool that refuses
    connections, all called in one turn: each answer is an error message, the four run at once
    (the turn takes about one timeout), and the policy's next turn is generated."""
    from .test_chat_masks import loop

    from kuberl.engine.data import Example
    from kuberl.engine.rollout.vllm_backend import Sampling

    tok = tool_tokenizer_for_tools
    # Only `hang` is about the timeout: the others get room to fail their own way on a loaded machine (the
    # 10 MB string alone took over 3 s there), and the turn still ends with its slowest call.
    specs = [
        ToolSpec(name="hang", path=str(tool_file), timeout_seconds=3),
        ToolSpec(name="crash", path=str(tool_file), timeout_seconds=6),
        ToolSpec(name="huge", path=str(tool_file), timeout_seconds=6),
        ToolSpec(name="service", url=f"http://127.0.0.1:{closed_port()}/", timeout_seconds=3),
    ]
    calls = "".join(f'<tool_call>{{"name": "{s.name}", "arguments": {{}}}}</tool_call>' for s in specs)
    reply = lambda prompt, s: "I could not compute it." if "<tool_response>" in prompt else calls  # noqa: E731
    rollout, _ = loop(tok, reply, MultiTurnSpec(tools=specs, max_tool_calls_per_turn=4))
    started = time.monotonic()
    _, [t] = rollout.generate([Example("What is 1 + 1?", "2")], Sampling(max_new_tokens=200), seed=0)
    assert time.monotonic() - started < 3 + 4
    results = [m["content"] for m in t.messages if m["role"] == "tool"]
    assert len(results) == 4 and all(r.startswith("Error: ") for r in results), results
    assert "did not finish within its 3 s" in results[0] and "SIGABRT" in results[1]
    assert "10485760 bytes" in results[2] and "cannot reach" in results[3]
    assert (t.turns, t.tool_calls, t.tool_errors, t.tool_timeouts) == (2, 4, 4, 1)
    assert t.response == "I could not compute it."
    assert all(len(r) < 600 for r in results)  # bounded: nothing a tool printed reaches the conversation unbounded
