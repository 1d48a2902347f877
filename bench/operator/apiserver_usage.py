"""What a side of bench/operator asked of the API server: its requests by verb and resource, with the
time the API server spent serving them (its own apiserver_request_total and
apiserver_request_duration_seconds, read from /metrics before and after), and optionally a Go CPU
profile of the API server over the side (pprof; the plane must be started with profiling)."""

from __future__ import annotations

import ssl
import threading
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families


@dataclass(frozen=True)
class Requests:
    """Requests of one kind (e.g. PATCH rljobs/status) and the seconds the API server took over them."""

    count: float
    seconds: float


def _get(plane, path: str, timeout: float) -> bytes:
    context = ssl.create_default_context(cafile=str(plane.ca_file))
    request = urllib.request.Request(plane.server + path, headers={"Authorization": f"Bearer {plane.admin_token}"})
    with urllib.request.urlopen(request, context=context, timeout=timeout) as response:
        return response.read()


def request_totals(plane) -> dict[str, Requests]:
    """Per "VERB resource[/subresource]": requests served so far and their total latency."""
    counts: dict[str, float] = {}
    seconds: dict[str, float] = {}
    for family in text_string_to_metric_families(_get(plane, "/metrics", 30).decode()):
        if family.name not in ("apiserver_request", "apiserver_request_duration_seconds"):
            continue
        for sample in family.samples:
            labels = sample.labels
            if labels.get("verb") == "WATCH" or not labels.get("resource"):
                continue
            kind = f"{labels['verb']} {labels['resource']}" + (f"/{labels['subresource']}" if labels.get("subresource") else "")
            if sample.name == "apiserver_request_total":
                counts[kind] = counts.get(kind, 0.0) + sample.value
            elif sample.name == "apiserver_request_duration_seconds_sum":
                seconds[kind] = seconds.get(kind, 0.0) + sample.value
    return {kind: Requests(count, seconds.get(kind, 0.0)) for kind, count in counts.items()}


def requests_between(before: dict[str, Requests], after: dict[str, Requests], top: int = 15) -> dict[str, dict[str, float]]:
    """The kinds of request made between two readings, most time-consuming first."""
    made = {
        kind: Requests(r.count - before.get(kind, Requests(0, 0)).count, r.seconds - before.get(kind, Requests(0, 0)).seconds)
        for kind, r in after.items()
    }
    ranked = sorted(((k, r) for k, r in made.items() if r.count > 0), key=lambda kr: -kr[1].seconds)
    return {kind: {"count": int(r.count), "seconds": round(r.seconds, 2)} for kind, r in ranked[:top]}


def profile_in_background(plane, seconds: int, out: Path) -> threading.Thread:
    """A CPU profile of the API server over the next `seconds`, written to `out` (`go tool pprof -top out`)."""

    def fetch() -> None:
        out.write_bytes(_get(plane, f"/debug/pprof/profile?seconds={seconds}", seconds + 60))

    thread = threading.Thread(target=fetch, daemon=True)
    thread.start()
    return thread
