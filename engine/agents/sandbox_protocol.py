"""The JSON protocol between a trainer and a sandbox pod (`kuberl sandbox-serve`): one tool call per
request, the same request sandbox_child.py takes and the same outcome fields the local runner gives.

    POST /v1/call   {"request": {mode, code | source, path, function, arguments, audit_hook},
                     "limits": {timeout, memoryMb, maxOutputBytes, processes, scratchMb}}
              200   {"reply": {...}, "output": <base64>, "printed": N, "returncode": N | null,
                     "timedOut": bool, "seconds": S, "backend": "bubblewrap" | "process"}
              4xx   {"error": "<what is wrong with the request>"}; 503 {"error": "busy"}: one call at a time
    GET  /ready     200 {"ready": true, "backend": ...}

Both sides bound what they read: the server a request to MAX_REQUEST_BYTES, the client a reply to
what the call's output limit allows (reply_limit). Typed here once, for both ends.
"""

from __future__ import annotations

import base64
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

from .sandbox import Limits, Outcome

SANDBOX_URL_ENV = "KUBERL_SANDBOX_URL"
"""Set by the operator on trainer pods of a job with sandbox pods: http://<job>-sandbox.<namespace>.svc:<port>."""
DEFAULT_PORT = 8470
CALL_PATH = "/v1/call"
READY_PATH = "/ready"
MAX_REQUEST_BYTES = 4 << 20
"""A function file's source travels with each call: 4 MiB holds any reasonable tool."""
MAX_TIMEOUT = 600.0
MAX_MEMORY_MB = 65536
MAX_OUTPUT_BYTES = 1 << 20
MAX_PROCESSES = 256
MAX_SCRATCH_MB = 4096


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", alias_generator=to_camel, populate_by_name=True)


class WireLimits(_Model):
    timeout: float = Field(gt=0, le=MAX_TIMEOUT)
    memory_mb: int = Field(default=512, ge=16, le=MAX_MEMORY_MB)
    max_output_bytes: int = Field(default=16384, ge=1, le=MAX_OUTPUT_BYTES)
    processes: int = Field(default=32, ge=1, le=MAX_PROCESSES)
    scratch_mb: int = Field(default=64, ge=1, le=MAX_SCRATCH_MB)

    def limits(self) -> Limits:
        return Limits(self.timeout, self.memory_mb, self.max_output_bytes, self.processes, self.scratch_mb)

    @classmethod
    def of(cls, limits: Limits) -> "WireLimits":
        return cls(
            timeout=limits.timeout,
            memory_mb=limits.memory_mb,
            max_output_bytes=limits.max_output_bytes,
            processes=limits.processes,
            scratch_mb=limits.scratch_mb,
        )


class WireRequest(_Model):
    """What a call may ask of sandbox_child.py; everything else it is given (its scratch, its reply
    descriptor, the limits) the server sets."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)  # sandbox_child.py's own (snake_case) keys

    mode: Literal["python", "function", "describe"]
    code: str | None = None
    source: str | None = None
    path: str | None = Field(default=None, max_length=4096)
    function: str | None = Field(default=None, max_length=256)
    arguments: dict[str, Any] | None = None
    audit_hook: bool = True

    @model_validator(mode="after")
    def _complete(self) -> "WireRequest":
        need = ("code",) if self.mode == "python" else ("source", "path", "function")
        missing = [k for k in need if getattr(self, k) is None]
        if missing:
            raise ValueError(f"mode {self.mode} needs {', '.join(missing)}")
        if self.mode == "function" and self.arguments is None:
            self.arguments = {}
        return self

    def child_request(self) -> dict[str, Any]:
        return self.model_dump(exclude_none=True)


class CallRequest(_Model):
    request: WireRequest
    limits: WireLimits


class CallReply(_Model):
    reply: dict[str, Any]
    output: str
    """base64 of the first maxOutputBytes + 1 bytes printed."""
    printed: int
    returncode: int | None
    timed_out: bool
    seconds: float
    backend: str

    @classmethod
    def of(cls, outcome: Outcome, backend: str) -> "CallReply":
        return cls(
            reply=outcome.reply,
            output=base64.b64encode(outcome.output).decode(),
            printed=outcome.printed,
            returncode=outcome.returncode,
            timed_out=outcome.timed_out,
            seconds=outcome.seconds,
            backend=backend,
        )

    def outcome(self, limits: Limits) -> Outcome:
        output = base64.b64decode(self.output.encode(), validate=True)[: limits.max_output_bytes + 1]
        return Outcome(self.reply, output, self.printed, self.returncode, self.timed_out, self.seconds)


def reply_limit(limits: Limits) -> int:
    """The most bytes a well-formed reply to a call under `limits` can take: its output in base64, its
    JSON reply (a text result is at most file_bytes, escaped up to 6 bytes per byte) and the frame."""
    return 4 * (limits.max_output_bytes + 1) // 3 + 8 + 6 * limits.file_bytes + 65536
