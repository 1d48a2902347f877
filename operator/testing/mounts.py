"""Mounts left under a folder (a node's volumes and overlay snapshots, buildah's storage) that keep
rmtree from deleting it."""

from __future__ import annotations

import subprocess
from pathlib import Path


def unmount_under(folder: Path) -> None:
    """Lazily unmount every mount point at or below `folder`, innermost first."""
    prefix = str(folder.resolve())
    with open("/proc/self/mounts") as mounts:
        points = [line.split()[1].replace("\\040", " ") for line in mounts]
    for point in sorted((p for p in points if p == prefix or p.startswith(prefix + "/")), key=len, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True, timeout=60)
