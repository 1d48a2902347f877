"""A timeout on every request of huggingface_hub's shared HTTP client."""

from __future__ import annotations

import os
from typing import Any

from .settings import DEFAULT_REQUEST_TIMEOUT


def bound_request_timeouts() -> None:
    """Give every request of huggingface_hub a timeout.

    Its metadata and download requests have one (HF_HUB_ETAG_TIMEOUT, HF_HUB_DOWNLOAD_TIMEOUT), but some
    API calls (the file listing that snapshot_download makes) pass none, and a hub that accepts the
    connection and never answers would hold the pod until its deadline. So the shared client gets a
    request hook that fills in whatever timeout a request lacks.
    """
    import httpx2
    import huggingface_hub

    template = huggingface_hub.get_session()
    if any(getattr(h, "__name__", "") == _fill_timeouts.__name__ for h in template.event_hooks["request"]):
        return
    hooks = {"request": [*template.event_hooks["request"], _fill_timeouts], "response": template.event_hooks["response"]}
    follow = template.follow_redirects
    huggingface_hub.set_client_factory(lambda: httpx2.Client(event_hooks=hooks, follow_redirects=follow, timeout=None))


def _fill_timeouts(request: Any) -> None:
    timeouts = dict(request.extensions.get("timeout") or {})
    if any(timeouts.get(k) is None for k in ("connect", "read", "write", "pool")):
        limit = request_timeout()
        for k in ("connect", "read", "write", "pool"):
            if timeouts.get(k) is None:
                timeouts[k] = limit
        request.extensions = {**request.extensions, "timeout": timeouts}


def request_timeout() -> float:
    return float(os.environ.get("HF_HUB_ETAG_TIMEOUT") or DEFAULT_REQUEST_TIMEOUT)
