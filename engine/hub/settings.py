"""Where and how the initializer fetches: the hub's endpoint, the cache folder, the token, the retries."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ..common.hub_folders import DEFAULT_ENDPOINT, endpoint_cache_dir


COMMIT = re.compile(r"^[0-9a-f]{40}$")


# Transient failures (the hub unreachable or answering 5xx) are retried with doubling waits, within
# this many seconds per repository (KUBERL_HUB_RETRY_SECONDS); the pod's activeDeadlineSeconds bounds the rest.
DEFAULT_RETRY_SECONDS = 120.0


MAX_ATTEMPTS = 6


# HF_HUB_ETAG_TIMEOUT's default in huggingface_hub: it bounds its metadata requests.
DEFAULT_REQUEST_TIMEOUT = 10.0


@dataclass(frozen=True)
class Hub:
    """Where and how to fetch: the endpoint, the cache folder and the token (never logged)."""

    endpoint: str
    cache_dir: Path
    token: str | None
    retry_seconds: float = DEFAULT_RETRY_SECONDS

    def redact(self, text: str) -> str:
        # A token never reaches a message: huggingface_hub's errors do not carry it, and this makes sure.
        return text.replace(self.token, "***") if self.token and len(self.token) >= 8 else text


def hub_from_environ(environ: Mapping[str, str]) -> Hub:
    """The hub settings of this process, and huggingface_hub set up for a pod before its first import.

    huggingface_hub reads HF_ENDPOINT, its timeouts and HF_HUB_DISABLE_* once, when it is imported, so the
    defaults go into the environment first; the endpoint is also passed to every call, which works even if
    something imported huggingface_hub earlier.
    """
    # The user-agent header asks the hub for a registry of AI agents (telemetry, once a day) unless this is
    # set: a cluster job has no use for it, and on an air-gapped mirror it is a request that fails.
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # pod logs: one line per repository instead
    endpoint = (environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")
    cache = environ.get("HF_HUB_CACHE")
    if cache is None:
        from huggingface_hub import constants

        cache = constants.HF_HUB_CACHE
    retry = float(environ.get("KUBERL_HUB_RETRY_SECONDS") or DEFAULT_RETRY_SECONDS)
    # A token has no whitespace; a Secret made from a file often ends with a newline, which no header may carry.
    token = (environ.get("HF_TOKEN") or "").strip() or None

    return Hub(
        endpoint=endpoint, cache_dir=endpoint_cache_dir(Path(cache).expanduser().resolve(), endpoint), token=token, retry_seconds=retry
    )
