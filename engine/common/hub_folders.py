"""Where one hub endpoint's files lie in the hub cache: shared by the initializer that fills the cache
(hub/) and the trainer that reads it offline (models/), so that both name the same folder."""

from __future__ import annotations

import hashlib
import re
import urllib.parse
from pathlib import Path

DEFAULT_ENDPOINT = "https://huggingface.co"


def endpoint_cache_dir(root: Path, endpoint: str) -> Path:
    """The cache folder of one hub endpoint: the cache root for the public hub, a folder of its own under
    endpoints/ for any other. A job that points its initializer at a hub of its choosing then fills only
    that hub's folder, and a job that asks the public hub for the same repository and commit never reads it."""
    endpoint = endpoint.rstrip("/")
    if endpoint == DEFAULT_ENDPOINT:
        return root
    host = re.sub(r"[^A-Za-z0-9.-]", "_", urllib.parse.urlsplit(endpoint).netloc)[:64] or "endpoint"
    return root / "endpoints" / f"{host}-{hashlib.sha256(endpoint.encode()).hexdigest()[:16]}"
