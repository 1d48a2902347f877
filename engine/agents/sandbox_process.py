"""The unisolated backend: a plain child process of the trainer, for machines where bubblewrap
cannot run (a pod whose runtime refuses user namespaces), used only when the job sets
rollout.multiTurn.allowUnisolatedTools.

The child limits itself, leaves the network where the kernel lets it, drops root where it can and
installs an audit hook (sandbox_child.py), but there is no kernel boundary: code that gets past the
hook (ctypes, a descriptor's path, a route that raises no audit event) acts with the trainer's user,
can read what the trainer can read and reach what the trainer can reach. Only for tools you trust.
"""

from __future__ import annotations

import sys
from typing import Any

from .sandbox import CHILD, Launch, Limits, SandboxBackend, register_sandbox_backend


def environment(scratch: str) -> dict[str, str]:
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": scratch,
        "TMPDIR": scratch,
        "LANG": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONIOENCODING": "utf-8",
        "PYTHONHASHSEED": "0",
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }


class ProcessBackend(SandboxBackend):
    name = "process"
    isolated = False
    description = (
        "an unisolated child process (allowUnisolatedTools): limits on memory, CPU time, file size and open "
        "files, and an audit hook only; no kernel boundary between the tools and the trainer"
    )

    def launch(self, request: dict[str, Any], limits: Limits, scratch: str) -> Launch:
        return Launch([sys.executable, "-I", "-B", str(CHILD)], cwd=scratch, env=environment(scratch), scratch=scratch)


@register_sandbox_backend("process")
def _process() -> SandboxBackend:
    return ProcessBackend()
