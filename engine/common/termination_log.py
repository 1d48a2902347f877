"""A container's termination message: what the kubelet copies into the pod's status when it ends."""

from __future__ import annotations

import logging
import os
from pathlib import Path

log = logging.getLogger("kuberl.engine")

DEFAULT_TERMINATION_LOG = "/dev/termination-log"
"""Where the kubelet mounts it (the container's terminationMessagePath)."""


def write_termination_message(text: str) -> None:
    """Write `text` where the kubelet reads it: KUBERL_TERMINATION_LOG, else /dev/termination-log where it exists
    (in a pod). Outside a pod nothing is written (never a new file under /dev)."""
    path = os.environ.get("KUBERL_TERMINATION_LOG")
    if not path:
        if not os.path.isfile(DEFAULT_TERMINATION_LOG):
            return
        path = DEFAULT_TERMINATION_LOG
    try:
        Path(path).write_text(text)
    except OSError as exc:  # the caller's own line for people says it all the same
        log.debug("cannot write the termination log %s: %s", path, exc)
