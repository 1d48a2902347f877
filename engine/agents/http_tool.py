"""Tools that are an HTTP endpoint (a Service in the cluster): the arguments are POSTed as a JSON
object, and the JSON reply is the result (a JSON string as its text, anything else as JSON).

No proxy is used (an in-cluster Service is reached directly). Where a call may connect is decided
in http_network.py: addresses are checked after name resolution and the socket goes to the checked
address; a redirect is followed only on the URL's own origin, at most MAX_REDIRECTS times. The reply
is read up to the tool's output limit; a refused connection or address, an HTTP error, a redirect
elsewhere, a reply that is not JSON or is too long, and a call past its timeout each become an error
message.
"""

from __future__ import annotations

import http.client
import json
import socket
import time
import urllib.parse
from pathlib import Path
from typing import Any

from ..config.multi_turn import ToolSpec
from .http_network import NetworkPolicy, checked_connection, policy_from_environment
from .tools import Tool, ToolResult, register_tool_kind

MAX_REDIRECTS = 3
_REDIRECTS = {301, 302, 303, 307, 308}


class _Failure(Exception):
    """A call that ends in an error message for the model."""


def _origin(url: urllib.parse.SplitResult) -> tuple[str, str, int]:
    return url.scheme, (url.hostname or "").lower(), url.port or (443 if url.scheme == "https" else 80)


class HttpTool(Tool):
    def __init__(self, spec: ToolSpec, network: NetworkPolicy | None = None):
        assert spec.url is not None
        self.name, self.timeout, self.url, self.limit = spec.name, spec.timeout_seconds, spec.url, spec.max_output_bytes
        self.description = spec.description or f"Calls the service at {spec.url}."
        self.parameters = spec.parameters or {"type": "object"}
        self.network = network if network is not None else policy_from_environment()

    def call(self, arguments: dict[str, Any]) -> ToolResult:
        body = json.dumps(arguments).encode()
        start = time.monotonic()
        try:
            status, raw = self._post(body, start + self.timeout)
        except _Failure as exc:
            return ToolResult.failure(str(exc))
        except (TimeoutError, socket.timeout):
            return ToolResult.failure(f"{self.url} did not answer within {self.timeout:g} s", timed_out=True)
        except OSError as exc:
            return ToolResult.failure(f"cannot reach {self.url}: {exc}")
        except (http.client.HTTPException, ValueError) as exc:
            return ToolResult.failure(f"calling {self.url} failed: {type(exc).__name__}: {exc}")
        if status >= 400:
            return ToolResult.failure(f"{self.url} answered HTTP {status}: {(raw or b'')[:200].decode('utf-8', 'replace')}")
        if raw is None:
            return ToolResult.failure(f"{self.url} sent more than the limit of {self.limit} bytes")
        try:
            value = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            return ToolResult.failure(f"{self.url} did not answer with JSON")
        return ToolResult(value if isinstance(value, str) else json.dumps(value, ensure_ascii=False))

    def _post(self, body: bytes, deadline: float) -> tuple[int, bytes | None]:
        """The final status and body (None past the limit), following same-origin redirects only."""
        url, method = urllib.parse.urlsplit(self.url), "POST"
        for _ in range(MAX_REDIRECTS + 1):
            connection = self._connection(url, deadline)
            try:
                path = urllib.parse.urlunsplit(("", "", url.path or "/", url.query, ""))
                headers = {"Accept": "application/json", "Host": url.netloc.rsplit("@", 1)[-1]}
                if method == "POST":
                    headers["Content-Type"] = "application/json"
                connection.request(method, path, body=body if method == "POST" else None, headers=headers)
                reply = connection.getresponse()
                if reply.status not in _REDIRECTS:
                    return reply.status, _read(reply, self.limit, deadline)
                location = reply.getheader("Location")
            finally:
                connection.close()
            if not location:
                raise _Failure(f"{self.url} answered HTTP {reply.status} without a Location")
            target = urllib.parse.urlsplit(urllib.parse.urljoin(urllib.parse.urlunsplit(url), location))
            if _origin(target) != _origin(url):
                raise _Failure(
                    f"{self.url} redirected to another origin ({target.scheme}://{target.netloc}); "
                    "tools follow redirects on their own origin only: give the tool's final URL"
                )
            # As browsers and urllib do: 301/302/303 turn a POST into a GET, 307/308 keep it.
            url, method = target, ("POST" if reply.status in (307, 308) else "GET") if method == "POST" else method
        raise _Failure(f"{self.url} redirected more than {MAX_REDIRECTS} times")

    def _connection(self, url: urllib.parse.SplitResult, deadline: float) -> http.client.HTTPConnection:
        if url.scheme not in ("http", "https") or not url.hostname:
            raise _Failure(f"{urllib.parse.urlunsplit(url)} is not an http:// or https:// URL")
        kind = http.client.HTTPSConnection if url.scheme == "https" else http.client.HTTPConnection
        connection = kind(url.hostname, _origin(url)[2], timeout=max(0.001, deadline - time.monotonic()))
        # Resolve once, check, connect to it. typeshed does not declare this hook (set in HTTPConnection.__init__).
        connection._create_connection = checked_connection(self.network)  # type: ignore[attr-defined]
        return connection


def _read(reply, limit: int, deadline: float) -> bytes | None:
    """The body up to `limit` bytes (None past it), giving up at `deadline` (a server that trickles)."""
    chunks: list[bytes] = []
    size = 0
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
