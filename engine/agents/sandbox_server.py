"""The server of a sandbox pod (`kuberl sandbox-serve`): tool calls of the job's trainers, one at a time.

Each call runs with the best backend the pod allows: bubblewrap where its probe works (user
namespaces allowed, e.g. under gVisor), else a plain child process; in a sandbox pod the pod itself
is the boundary (no token, no secrets, none of the trainer's environment or volumes, no egress), so
the plain process needs no allowUnisolatedTools there. After every call the server kills every other
process of its tree (sandbox_sweep.py) and empties the scratch folders: nothing a call started
survives it, and no call reads another's files. A call that arrives while one runs is answered 503
(busy); the client tries another replica. The protocol is sandbox_protocol.py's.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import tempfile
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from . import sandbox_bwrap as _bwrap  # noqa: F401  (registers the backends)
from . import sandbox_process as _process  # noqa: F401
from .sandbox import SANDBOX_BACKENDS, SandboxBackend
from .sandbox_protocol import CALL_PATH, MAX_REQUEST_BYTES, READY_PATH, CallReply, CallRequest
from .sandbox_sweep import guard_server, sweep, wipe

log = logging.getLogger("kuberl.sandbox")
READ_SECONDS = 30.0
"""How long a client may take to send its request."""


def best_backend(choice: str = "auto") -> SandboxBackend:
    """bubblewrap where it works here, else the plain process (`choice` may force either)."""
    if choice != "auto":
        return SANDBOX_BACKENDS[choice]()
    bwrap = SANDBOX_BACKENDS["bubblewrap"]()
    problem = bwrap.probe()
    if problem is None:
        return bwrap
    log.info("bubblewrap does not work in this pod (%s): each call runs in a plain process; the pod is its boundary", problem)
    return SANDBOX_BACKENDS["process"]()


def described(backend: SandboxBackend) -> str:
    """The backend as the server runs it. The plain process's own description is the trainer's view (no
    boundary between the tools and the trainer); in a sandbox pod the pod is that boundary."""
    if backend.isolated:
        return backend.description
    return (
        "a plain child process per call (limits on memory, CPU time, file size and open files, and the audit hook "
        "unless a call turns it off); this sandbox pod is the boundary: no token, no secrets, none of the trainer's "
        "environment or volumes, no egress but what the job allows"
    )


@dataclass
class Sandbox:
    """The calls' side of the server: one call at a time, then nothing of it left."""

    backend: SandboxBackend
    scratch: Path
    """The calls' scratch root (the pod's emptyDir): every call's folders are made here."""
    wipe_also: tuple[Path, ...] = ()
    """Other folders a call can write and the next could read (/dev/shm in a pod)."""
    whole_namespace: bool = False
    """The server is its PID namespace's init: every other process there is a call's."""

    def __post_init__(self) -> None:
        self.lock = threading.Lock()
        self.scratch.mkdir(parents=True, exist_ok=True)
        tempfile.tempdir = str(self.scratch)  # run_child's folders (the call's scratch and its output files)

    def clean(self) -> None:
        left = sweep(self.whole_namespace)
        if left:
            log.error("processes %s survived SIGKILL", left)
        for folder in (self.scratch, *self.wipe_also):
            wipe(folder)

    def call(self, call: CallRequest) -> CallReply:
        """Run one call; the caller holds `lock`."""
        try:
            limits = call.limits.limits()
            outcome = self.backend.run(call.request.child_request(), limits)
            return CallReply.of(outcome, self.backend.name)
        finally:
            self.clean()


def _handler(sandbox: Sandbox) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        timeout = READ_SECONDS
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002  (no tool output in the logs)
            log.debug("%s %s", self.address_string(), format % args)

        def _send(self, status: int, body: dict[str, Any] | str) -> None:
            data = (body if isinstance(body, str) else json.dumps(body)).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            if status >= 400:
                self.send_header("Connection", "close")
                self.close_connection = True
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802
            if self.path != READY_PATH:
                return self._send(404, {"error": f"no such path {self.path[:100]!r}: GET {READY_PATH}, POST {CALL_PATH}"})
            self._send(200, {"ready": True, "backend": sandbox.backend.name, "busy": sandbox.lock.locked()})

        def do_POST(self) -> None:  # noqa: N802
            if self.path != CALL_PATH:
                return self._send(404, {"error": f"no such path {self.path[:100]!r}: POST {CALL_PATH}"})
            length = self.headers.get("Content-Length")
            if length is None or not length.isdigit():
                return self._send(411, {"error": "a call needs a Content-Length header (no chunked requests)"})
            if int(length) > MAX_REQUEST_BYTES:
                return self._send(413, {"error": f"the request has {length} bytes, more than the limit of {MAX_REQUEST_BYTES}"})
            try:
                raw = self.rfile.read(int(length))
                call = CallRequest.model_validate_json(raw)
            except ValidationError as exc:
                problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}" for e in exc.errors()[:8])
                return self._send(400, {"error": f"not a call: {problems}"[:2000]})
            except OSError as exc:
                return self._send(400, {"error": f"the request could not be read: {exc}"})
            if not sandbox.lock.acquire(blocking=False):
                return self._send(503, {"error": "busy: this sandbox pod runs one call at a time"})
            try:
                reply = sandbox.call(call)
            finally:
                sandbox.lock.release()
            self._send(200, reply.model_dump_json(by_alias=True))

    return Handler


def make_server(sandbox: Sandbox, host: str, port: int) -> ThreadingHTTPServer:
    server = ThreadingHTTPServer((host, port), _handler(sandbox))
    server.daemon_threads = True
    return server


def serve(port: int, host: str = "0.0.0.0", scratch: str | None = None, wipe_also: tuple[str, ...] = (), backend: str = "auto") -> int:
    """The pod's command: probe, clean what an earlier container of this pod left, then serve until SIGTERM."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    guard_server()
    root = Path(scratch or os.environ.get("TMPDIR") or "/tmp")
    chosen = best_backend(backend)
    sandbox = Sandbox(chosen, root, tuple(Path(p) for p in wipe_also), whole_namespace=os.getpid() == 1)
    sandbox.clean()
    server = make_server(sandbox, host, port)

    def stop(signum: int, frame: object) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)  # as PID 1, a signal without a handler would be ignored
    log.info("serving tool calls on %s:%d with %s: %s", host, port, chosen.name, described(chosen))
    print(f"kuberl sandbox: serving on {host}:{server.server_address[1]}", flush=True)
    try:
        server.serve_forever(poll_interval=0.2)
    except SystemExit:
        pass
    finally:
        server.server_close()
    return 0
