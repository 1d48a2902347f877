"""Tools that are an HTTP endpoint (a Service in the cluster): the arguments are POSTed as a JSON
object, and the JSON reply is the result (a JSON string as its text, anything else as JSON).

No proxy is used (an in-cluster Service is reached directly). The reply is read up to the tool's
output limit; a refused connection, an HTTP error, a reply that is not JSON or is too long, and a
call past its timeout each become an error message.
"""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from ..config.multi_turn import ToolSpec
from .tools import Tool, ToolResult, register_tool_kind

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class HttpTool(Tool):
    def __init__(self, spec: ToolSpec):
        assert spec.url is not None
        self.name, self.timeout, self.url, self.limit = spec.name, spec.timeout_seconds, spec.url, spec.max_output_bytes
        self.description = spec.description or f"Calls the service at {spec.url}."
        self.parameters = spec.parameters or {"type": "object"}

    def call(self, arguments: dict[str, Any]) -> ToolResult:
        body = json.dumps(arguments).encode()
        request = urllib.request.Request(self.url, data=body, method="POST",
                                         headers={"Content-Type": "application/json", "Accept": "application/json"})
        start = time.monotonic()
        try:
            with _OPENER.open(request, timeout=self.timeout) as reply:
                raw = _read(reply, self.limit, start + self.timeout)
        except urllib.error.HTTPError as exc:
            return ToolResult.failure(f"{self.url} answered HTTP {exc.code}: {exc.read(200).decode('utf-8', 'replace')}")
        except (TimeoutError, socket.timeout):
            return ToolResult.failure(f"{self.url} did not answer within {self.timeout:g} s", timed_out=True)
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, (TimeoutError, socket.timeout)):
                return ToolResult.failure(f"{self.url} did not answer within {self.timeout:g} s", timed_out=True)
            return ToolResult.failure(f"cannot reach {self.url}: {exc.reason}")
        except (OSError, ValueError) as exc:
            return ToolResult.failure(f"calling {self.url} failed: {type(exc).__name__}: {exc}")
        if raw is None:
            return ToolResult.failure(f"{self.url} sent more than the limit of {self.limit} bytes")
        try:
            value = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            return ToolResult.failure(f"{self.url} did not answer with JSON")
        return ToolResult(value if isinstance(value, str) else json.dumps(value, ensure_ascii=False))


def _read(reply, limit: int, deadline: float) -> bytes | None:
    """The body up to `limit` bytes (None past it), giving up at `deadline` (a server that trickles)."""
    chunks, size = [], 0
    while True:
        if time.monotonic() > deadline:
            raise TimeoutError
        chunk = reply.read(min(65536, limit + 1 - size))
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        size += len(chunk)
        if size > limit:
            return None


@register_tool_kind("http", summary="an HTTP endpoint: JSON arguments POSTed, the JSON reply is the result")
def _http(spec: ToolSpec, base_dir: Path) -> Tool:
    return HttpTool(spec)
