"""The pod backend: each tool call goes to one of the job's sandbox pods (sandbox_server.py), outside
the trainer's pod, its process tree and its credentials.

The operator sets KUBERL_SANDBOX_URL on the trainer pods (http://<job>-sandbox.<namespace>.svc:<port>,
a headless Service); its name resolves to every ready sandbox pod. A call goes to one of them at
random, and to the next when that one is busy (503) or refuses the connection, until one takes it
or the queueing time is spent. The reply is read up to what the call's limits allow (a bigger one
is refused), within the call's timeout plus a margin. Whatever goes wrong becomes an Outcome with an
error in words, which the tool hands the model as its error message; the run goes on.
"""

from __future__ import annotations

import http.client
import json
import os
import random
import socket
import time
from typing import Any
from urllib.parse import urlsplit

from pydantic import ValidationError

from ..config.multi_turn import SANDBOX_QUEUE_ENV

from .sandbox import Launch, Limits, Outcome, SandboxBackend, register_sandbox_backend
from .sandbox_protocol import (
    CALL_PATH,
    MAX_REQUEST_BYTES,
    READY_PATH,
    SANDBOX_URL_ENV,
    CallReply,
    CallRequest,
    WireLimits,
    WireRequest,
    reply_limit,
)

MARGIN_SECONDS = 30.0
"""Past the call's own timeout: the server's sweep, the transfer, a busy node."""
CONNECT_SECONDS = 5.0
"""A pod that does not accept a connection within this is passed over (a stale address, a full node)."""
QUEUE_SECONDS = 300.0
"""How long a call waits for a free sandbox pod (all busy, or none ready yet), unless the job's
sandbox.queueSeconds says otherwise (SANDBOX_QUEUE_ENV, set by the operator)."""
READY_SECONDS = 600.0
"""How long the run's start waits for the sandbox pods to be ready (scheduling, the image's pull)."""


class SandboxUnreachable(OSError):
    """No sandbox pod took the call."""


class PodBackend(SandboxBackend):
    name = "pod"
    isolated = True

    def __init__(self, url: str | None = None, queue_seconds: float | None = None, ready_seconds: float = READY_SECONDS):
        self.url = url or os.environ.get(SANDBOX_URL_ENV, "")
        parts = urlsplit(self.url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"{SANDBOX_URL_ENV}={self.url!r}: the sandbox pods' address is http://<host>:<port>")
        if queue_seconds is None:
            queue_seconds = _queue_seconds(os.environ.get(SANDBOX_QUEUE_ENV))
        self.host, self.port = parts.hostname, parts.port or 80
        self.queue_seconds, self.ready_seconds = queue_seconds, ready_seconds

    @property
    def description(self) -> str:
        return (
            f"the job's sandbox pods ({self.url}): each call in a pod with no ServiceAccount token, no secrets, none of "
            "the trainer's environment or volumes and no egress; every process of a call killed and its scratch "
            "emptied after it"
        )

    def launch(self, request: dict[str, Any], limits: Limits, scratch: str) -> Launch:
        raise NotImplementedError("the pod backend runs calls in sandbox pods, not here")

    def addresses(self) -> list[tuple[str, int]]:
        """The sandbox pods' (address, port), in a random order (the Service is headless: one per ready pod)."""
        found = list(dict.fromkeys(str(info[4][0]) for info in socket.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM)))
        random.shuffle(found)
        return [(address, self.port) for address in found]

    def run(self, request: dict[str, Any], limits: Limits) -> Outcome:
        try:
            body = CallRequest(request=WireRequest.model_validate(request), limits=WireLimits.of(limits))
        except ValidationError as exc:
            return Outcome(error=f"the call cannot be sent to a sandbox pod: {exc.errors()[0]['msg']}")
        data = body.model_dump_json(by_alias=True).encode()
        if len(data) > MAX_REQUEST_BYTES:
            return Outcome(error=f"the call's request has {len(data)} bytes, more than a sandbox pod takes ({MAX_REQUEST_BYTES})")
        deadline = time.monotonic() + self.queue_seconds
        why = "no sandbox pod is ready"
        pause = 0.05
        while True:
            try:
                addresses = self.addresses()
            except OSError as exc:
                addresses, why = [], f"{self.host} does not resolve ({exc}): no sandbox pod is ready"
            for address, port in addresses:
                try:
                    return self._call(address, port, data, limits)
                except SandboxUnreachable as exc:
                    why = str(exc)
            if time.monotonic() + pause > deadline:
                return Outcome(
                    error=f"no sandbox pod took the call within {self.queue_seconds:g} s ({why}); the job's sandbox pods are at {self.url}"
                )
            time.sleep(pause)
            pause = min(pause * 2, 2.0)

    def _call(self, address: str, port: int, data: bytes, limits: Limits) -> Outcome:
        """One try at one pod: SandboxUnreachable when it did not take the call (try another); else the outcome."""
        conn = http.client.HTTPConnection(address, port, timeout=CONNECT_SECONDS)
        try:
            try:
                conn.connect()
            except OSError as exc:
                raise SandboxUnreachable(f"{address}:{port} refused the connection: {exc}") from None
            assert conn.sock is not None
            conn.sock.settimeout(limits.timeout + MARGIN_SECONDS)
            try:
                conn.request("POST", CALL_PATH, body=data, headers={"Content-Type": "application/json"})
            except OSError as exc:  # it went before the request was in: nothing ran
                raise SandboxUnreachable(f"{address}:{port} dropped the connection: {exc}") from None
            try:
                response = conn.getresponse()
                status, length = response.status, response.getheader("Content-Length")
                bound = reply_limit(limits)
                if length is None or not length.isdigit() or int(length) > bound:
                    return Outcome(
                        error=f"the sandbox pod {address} sent a reply of {length or 'unknown'} bytes (at most {bound} are read): refused"
                    )
                raw = response.read(int(length))
            except TimeoutError:
                return Outcome(
                    error=f"the sandbox pod {address} did not answer within the call's {limits.timeout:g} s "
                    f"and a {MARGIN_SECONDS:g} s margin",
                    timed_out=True,
                )
            except (OSError, http.client.HTTPException) as exc:  # the pod went during the call (its tool was OOM-killed, ...)
                return Outcome(error=f"the sandbox pod {address} dropped the call: {type(exc).__name__}: {exc}")
        finally:
            conn.close()
        if status == 503:
            raise SandboxUnreachable(f"{address} is busy")
        if status != 200:
            return Outcome(error=f"the sandbox pod {address} refused the call ({status}): {_message(raw)}")
        try:
            return CallReply.model_validate_json(raw).outcome(limits)
        except (ValidationError, ValueError) as exc:
            return Outcome(error=f"the sandbox pod {address} sent a reply that is not a call's outcome: {str(exc)[:200]}")

    def ready(self) -> str | None:
        """None once some sandbox pod answers its readiness endpoint; else why not (after ready_seconds)."""
        deadline = time.monotonic() + self.ready_seconds
        why = "no sandbox pod is ready"
        while True:
            try:
                for address, port in self.addresses():
                    conn = http.client.HTTPConnection(address, port, timeout=10)
                    try:
                        conn.request("GET", READY_PATH)
                        if conn.getresponse().status == 200:
                            return None
                    except (OSError, http.client.HTTPException) as exc:
                        why = f"{address}:{port}: {exc}"
                    finally:
                        conn.close()
            except OSError as exc:
                why = f"{self.host} does not resolve ({exc}): no sandbox pod is ready"
            if time.monotonic() > deadline:
                return f"{why} (waited {self.ready_seconds:g} s)"
            time.sleep(1.0)

    def probe(self) -> str | None:
        return self.ready() or super().probe()


def _queue_seconds(text: str | None) -> float:
    """The wait for a free pod that the operator set (sandbox.queueSeconds), else QUEUE_SECONDS."""
    if text is None:
        return QUEUE_SECONDS
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not 0 < seconds <= 3600:
        raise ValueError(f"{SANDBOX_QUEUE_ENV}={text!r}: the wait for a free sandbox pod is a number of seconds in (0, 3600]")
    return seconds


def _message(raw: bytes) -> str:
    try:
        said = json.loads(raw).get("error", "")
    except (ValueError, AttributeError):
        said = raw[:200].decode("utf-8", "replace")
    return str(said)[:500]


@register_sandbox_backend("pod")
def _pod() -> SandboxBackend:
    return PodBackend()
