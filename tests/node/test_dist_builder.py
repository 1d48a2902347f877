"""`make dist` with a builder of the user's own (BUILDER) and a helm on PATH, without the tests' toolchain:
the Dockerfiles build as they are, the image archive it writes verifies and runs `kuberl`.

The builder here is buildah in Dockerfile mode (`buildah build`, what `podman build` runs), in a storage of
its own, so nothing of scripts/images.sh's cache is used. The base is the local Debian 12 base that
images.sh makes, loaded from an archive as a user's pulled `python:3.11-slim` would be (no registry is
reachable here). Only the operator image: the CPU trainer's build is the same Dockerfile mechanism with
6.5 GB more of wheels, which the real-node tier builds already."""

from __future__ import annotations

import os
import subprocess
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent.parent
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
CACHE = Path(os.environ.get("KUBERL_CACHE", Path.home() / ".cache" / "kuberl"))
pytestmark = pytest.mark.slow


def run(argv: list, timeout: float = 600, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=timeout, **kwargs)


def test_dist_builds_the_operator_image_with_a_plain_builder(built_images: dict[str, str], tmp_path: Path) -> None:
    cached = ["buildah", "--root", CACHE / "images" / "storage", "--runroot", CACHE / "images" / "run", "--storage-driver", "overlay"]
    listed = run([*cached, "images", "--format", "{{.Name}}:{{.Tag}}"]).stdout.split()
    [base] = [ref for ref in listed if ref.startswith("localhost/kuberl-base:")]
    assert run([*cached, "push", "--quiet", base, f"docker-archive:{tmp_path / 'base.tar'}:{base}"]).returncode == 0
    own = f"--root {tmp_path / 'storage'} --runroot {tmp_path / 'run'} --storage-driver overlay"
    pulled = run(["buildah", *own.split(), "pull", "--quiet", f"docker-archive:{tmp_path / 'base.tar'}"])
    assert pulled.returncode == 0, pulled.stderr

    helm_dir = tmp_path / "bin"
    helm_dir.mkdir()
    kube_bin = Path(run(["bash", REPO / "scripts" / "kube-binaries.sh"], timeout=3600).stdout.strip().splitlines()[-1])
    (helm_dir / "helm").symlink_to(kube_bin / "helm")
    # No Go on PATH: the tests' helm build (kube-binaries.sh) would fail; helm comes from PATH instead.
    path = ":".join([str(helm_dir)] + [d for d in os.environ["PATH"].split(":") if "go" not in d])
    ca = os.environ.get("PIP_CERT") or os.environ.get("SSL_CERT_FILE")
    # Behind this machine's TLS-inspecting proxy, pip in the build needs its CA (a user without one leaves it out).
    build_flags = f"--volume {ca}:/tmp/build-ca.crt:ro --build-arg PIP_CERT=/tmp/build-ca.crt" if ca else ""
    # This machine has no OCI runtime for buildah (the node's runc is the node's): chroot, as images.sh builds.
    build_flags += " --isolation chroot --network host"
    out = tmp_path / "dist"
    made = run(
        ["bash", REPO / "scripts" / "dist.sh", out],
        timeout=1800,
        env=os.environ
        | {
            "PATH": path,
            "BUILDER": "buildah",
            "BUILDER_FLAGS": own,
            "BUILD_FLAGS": build_flags,
            "DIST_BASE_IMAGE": base,
            "DIST_IMAGES": "operator",
            "DIST_PYTHON": "0",
        },
    )
    assert made.returncode == 0, made.stderr[-4000:]
    assert "[images]" not in made.stderr and "kube-binaries" not in made.stderr  # none of the tests' toolchain
    archive = f"kuberl-operator-{VERSION}.tar"
    assert sorted(p.name for p in out.iterdir()) == sorted([archive, f"kuberl-{VERSION}.tgz", "SHA256SUMS"])
    assert run(["sha256sum", "-c", "SHA256SUMS"], cwd=out).returncode == 0

    # The archive, loaded into a third storage, runs the operator image's entrypoint.
    fresh = ["buildah", "--root", tmp_path / "fresh", "--runroot", tmp_path / "fresh-run", "--storage-driver", "overlay"]
    ctr = run([*fresh, "from", "--quiet", f"docker-archive:{out / archive}"])
    assert ctr.returncode == 0, ctr.stderr
    ran = run([*fresh, "run", "--isolation", "chroot", ctr.stdout.strip(), "--", "kuberl", "version", "--client"])
    assert ran.returncode == 0 and VERSION in ran.stdout, (ran.stdout, ran.stderr)
    bad = run(
        ["bash", REPO / "scripts" / "dist.sh", tmp_path / "bad"], env=os.environ | {"BUILDER": "kaniko", "DIST_PYTHON": "0", "PATH": path}
    )
    assert bad.returncode == 1 and "BUILDER is 'kaniko': docker, podman or buildah" in bad.stderr
