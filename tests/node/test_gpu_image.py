"""The GPU trainer image, built here by scripts/images.sh (requirements/gpu.lock on the local Debian base: CUDA
wheels from PyPI, no CUDA base image), smoke-tested on this GPU-less machine: inside it, as its own user,
`kuberl worker --check` finds every GPU code path (torch's CUDA build, cuDNN, NCCL, megatron-core, vLLM's CUDA
build and every kernel library, the driver's own libraries aside) and says that no GPU is present. What runs on
a GPU (NCCL, vLLM's GPU executor, sleep mode) is `kuberl gpu-check`'s, in the image too, run where a GPU is lent."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

CACHE = Path(os.environ.get("KUBERL_CACHE", Path.home() / ".cache" / "kuberl")) / "images"


def buildah(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["buildah", "--root", str(CACHE / "storage"), "--runroot", str(CACHE / "run"), "--storage-driver", "overlay", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_the_gpu_image_has_every_gpu_code_path_and_says_no_gpu_is_here(built_images: dict[str, str]) -> None:
    ref = built_images.get("GPU_TRAINER_IMAGE")
    if ref is None:
        pytest.fail("scripts/images.sh built no GPU trainer image (KUBERL_GPU_IMAGE=0?)", pytrace=False)
    made = buildah("from", "--quiet", "--pull-never", ref)
    assert made.returncode == 0, made.stderr
    container = made.stdout.strip()
    try:
        # The image's own user and entrypoint's command: what a pod would run (chroot isolation shares the host's
        # network; the check opens no connection).
        run = buildah("run", "--isolation", "chroot", "--user", "10001:10001", container, "--", "kuberl", "worker", "--check")
        # The GPU path's own check ships in the image too: here, with no GPU, it says so and fails.
        gpu_check = buildah("run", "--isolation", "chroot", "--user", "10001:10001", container, "--", "kuberl", "gpu-check")
    finally:
        buildah("rm", container)
    lines = run.stdout.splitlines()
    assert run.returncode == 0, run.stdout + run.stderr[-3000:]
    status = {line[5:].split(":", 1)[0]: line[:3].strip() for line in lines if line[3:5] == "  "}
    for part in ("torch", "cuDNN", "NCCL", "megatron.core", "vllm", "torch kernels", "vllm kernels", "flashinfer kernels"):
        assert status.get(part) == "ok", f"{part}: {run.stdout}"
    assert any(line.startswith("ok   torch: 2.13.0") and "CUDA 13" in line for line in lines), run.stdout
    assert any(line.startswith("ok   vllm: vllm ") and "CUDA build" in line for line in lines), run.stdout
    assert "---  no GPU present (no NVIDIA driver is mounted)" in run.stdout
    assert lines[-1] == "every GPU code path is installed"
    assert gpu_check.returncode == 1 and '"error": "no CUDA device' in gpu_check.stdout, gpu_check.stdout + gpu_check.stderr[-3000:]
