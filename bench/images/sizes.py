"""The images' sizes and layer split, and the GPU image's `kuberl worker --check`, into bench/results/images.json.

    .venv/bin/python bench/images/sizes.py

Runs scripts/images.sh (which builds what its inputs' hashes do not find cached), then reads each image's
layers from buildah's storage (uncompressed sizes, as a node stores them) with the Dockerfile step that made
each, and runs the GPU image's install check on this machine. Not a race against a baseline: what a cluster
pulls, and which change makes a node pull what again (the dependency layers change only with the lock).
"""

from __future__ import annotations

import json
import os
import re
import platform
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent
CACHE = Path(os.environ.get("KUBERL_CACHE", Path.home() / ".cache" / "kuberl")) / "images"
IMAGES = {"OPERATOR": "operator", "TRAINER": "cpu trainer", "GPU_TRAINER": "gpu trainer"}


def buildah(*args: str) -> str:
    return subprocess.run(
        ["buildah", "--root", str(CACHE / "storage"), "--runroot", str(CACHE / "run"), "--storage-driver", "overlay", *args],
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    ).stdout


def step_name(created_by: str) -> str:
    """A Dockerfile step as buildah records it, shortened to what a reader recognises."""
    text = created_by.replace("/bin/sh -c #(nop) ", "").replace("/bin/sh -c ", "RUN ").strip()
    text = re.sub(r"^\|\d+ (\S+=\S* )*", "", text)  # the build arguments a RUN saw
    text = re.sub(r"(COPY (?:file|dir|multi)):[0-9a-f]{64}", r"\1", text)
    text = re.sub(r"\s+", " ", text)
    return text if len(text) <= 90 else text[:87] + "..."


def layers(ref: str) -> list[dict]:
    info = json.loads(buildah("inspect", "--type", "image", ref))
    manifest = info["Manifest"] if isinstance(info["Manifest"], dict) else json.loads(info["Manifest"])
    sizes = [layer["size"] for layer in manifest["layers"]]
    steps = [step_name(h.get("created_by", "")) for h in info["History"] if not h.get("empty_layer")]
    if len(steps) != len(sizes):  # the base's own history is not ours to split
        steps = ["(base)"] * (len(sizes) - len(steps)) + steps
    steps[0] = "the base (Debian 12, Python 3.11)"
    for i, step in enumerate(steps):
        group = re.search(r"install-locked\.sh \S+ (\w+)", step)
        if group:
            steps[i] = f"the dependencies: {group.group(1)} (trainer_image/install-locked.sh)"
    return [{"step": s, "bytes": b} for s, b in zip(steps, sizes)]


def main() -> int:
    built = subprocess.run(["bash", str(REPO / "scripts" / "images.sh")], capture_output=True, text=True, timeout=7200)
    if built.returncode != 0:
        print(built.stderr[-4000:], file=sys.stderr)
        return 1
    refs = dict(line.split("=", 1) for line in built.stdout.splitlines() if "=" in line)
    images = {}
    for key, name in IMAGES.items():
        ref = refs[f"{key}_IMAGE"]
        split = layers(ref)
        images[name] = {"bytes": sum(layer["bytes"] for layer in split), "layers": split}
    container = buildah("from", "--quiet", "--pull-never", refs["GPU_TRAINER_IMAGE"]).strip()
    try:
        check = subprocess.run(
            [
                "buildah",
                "--root",
                str(CACHE / "storage"),
                "--runroot",
                str(CACHE / "run"),
                "--storage-driver",
                "overlay",
                "run",
                "--isolation",
                "chroot",
                "--user",
                "10001:10001",
                container,
                "--",
                "kuberl",
                "worker",
                "--check",
            ],
            capture_output=True,
            text=True,
            timeout=600,
        )
    finally:
        buildah("rm", container)
    result = {
        "benchmark": "images",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "images": images,
        "gpu_image_check": {"exit_status": check.returncode, "lines": check.stdout.splitlines()},
    }
    out = REPO / "bench" / "results" / "images.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    for name, image in images.items():
        print(f"{name}: {image['bytes'] / 1e9:.2f} GB in {len(image['layers'])} layers")
    print("\n".join(result["gpu_image_check"]["lines"]))
    return 0 if check.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
