"""`scripts/dist.sh` (`make dist`) and what it makes, used as a user would: the checksums verify, the
sdist builds the same wheel, and the wheel installed into a new virtual environment runs `kuberl`.
The images are left out (DIST_IMAGES=0): their build and import are the real-node tier's."""

from __future__ import annotations

import os
import subprocess
import sysconfig
import tomllib
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
WHEEL = f"kuberl-{VERSION}-py3-none-any.whl"
SDIST = f"kuberl-{VERSION}.tar.gz"
CHART = f"kuberl-{VERSION}.tgz"
# The uv that scripts/setup.sh installs; its cache (~/.cache/uv) already holds every wheel the lock names.
UV = Path(os.environ.get("KUBERL_CACHE", Path.home() / ".cache" / "kuberl")) / "tools" / "uv-0.13.8" / "bin" / "uv"

# Not marked slow: about 11 s on 2 cores (four setuptools builds, a new venv, the install from
# uv's warm cache), under the suite's ~20 s mark for slow.


def clean_env() -> dict[str, str]:
    # Nothing of the test's own interpreter (the repository's .venv) may leak into the new one.
    drop = {"VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "CONDA_PREFIX"}
    return {k: v for k, v in os.environ.items() if k not in drop} | {"UV_PYTHON_DOWNLOADS": "never"}


def run(argv: list, timeout: float = 300, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=timeout, **kwargs)


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not UV.is_file():
        pytest.fail(f"uv is missing at {UV}: run scripts/setup.sh", pytrace=False)
    out = tmp_path_factory.mktemp("dist")
    result = run(["bash", REPO / "scripts" / "dist.sh", out], timeout=900, env=os.environ | {"DIST_IMAGES": "0", "UV": str(UV)})
    assert result.returncode == 0, result.stderr[-4000:]
    assert f"kuberl {VERSION} in {out}" in result.stdout
    return out


@pytest.fixture(scope="module")
def installed(dist: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A new venv (not the repository's) with only the wheel and its dependencies, pinned by the lock."""
    venv = tmp_path_factory.mktemp("venv") / "env"
    cwd = venv.parent  # not the repository: uv would otherwise look at its .venv
    created = run([UV, "venv", "--quiet", "--python", "3.11", venv], cwd=cwd, env=clean_env())
    assert created.returncode == 0, created.stderr
    installed = run(
        [
            UV,
            "pip",
            "install",
            "--quiet",
            "--python",
            venv / "bin" / "python",
            "--constraint",
            REPO / "requirements" / "cpu.lock",
            dist / WHEEL,
        ],
        cwd=cwd,
        env=clean_env(),
        timeout=600,
    )
    assert installed.returncode == 0, installed.stderr
    return venv


def test_dist_makes_the_package_and_the_chart_with_checksums_that_verify(dist: Path) -> None:
    assert sorted(p.name for p in dist.iterdir()) == sorted(["SHA256SUMS", WHEEL, SDIST, CHART])
    check = run(["sha256sum", "--strict", "-c", "SHA256SUMS"], cwd=dist)
    assert check.returncode == 0, check.stdout + check.stderr
    assert sorted(check.stdout.splitlines()) == sorted(f"{name}: OK" for name in (WHEEL, SDIST, CHART))


def test_wheel_holds_the_kuberl_package_only(dist: Path) -> None:
    names = zipfile.ZipFile(dist / WHEEL).namelist()
    # No top-level `operator` (it would shadow Python's operator module) nor `engine`.
    assert {name.split("/")[0] for name in names} == {"kuberl", f"kuberl-{VERSION}.dist-info"}
    assert zipfile.ZipFile(dist / WHEEL).read(f"kuberl-{VERSION}.dist-info/top_level.txt").decode().split() == ["kuberl"]
    # Every file of operator/, engine/ and client/ that dist.sh built from (the files git tracks or
    # would track), as kuberl/operator/..., kuberl/engine/... and kuberl/client/...: a module or data
    # file the build config misses fails here ...
    tree = run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "operator", "engine", "client"], cwd=REPO).stdout.split()
    # ... but the tests' harness (operator/testing/): no test support ships.
    want = {f"kuberl/{path}" for path in tree if (REPO / path).is_file() and not path.startswith("operator/testing/")}
    assert {name for name in names if name.startswith("kuberl/")} == want
    assert not [name for name in names if name.startswith("kuberl/operator/testing")]


def test_sdist_builds_the_wheel_that_dist_ships(dist: Path, tmp_path: Path) -> None:
    # What pip does with the sdist where no wheel fits: a wheel built from it must be the shipped one,
    # file for file (RECORD lists each file with its hash).
    result = run(
        [UV, "build", "--quiet", "--wheel", "--build-constraint", REPO / "requirements" / "cpu.lock", "--out-dir", tmp_path, dist / SDIST],
        cwd=tmp_path,
        env=clean_env(),
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    record = f"kuberl-{VERSION}.dist-info/RECORD"
    shipped, rebuilt = zipfile.ZipFile(dist / WHEEL), zipfile.ZipFile(tmp_path / WHEEL)
    assert sorted(rebuilt.namelist()) == sorted(shipped.namelist())
    assert sorted(rebuilt.read(record).decode().splitlines()) == sorted(shipped.read(record).decode().splitlines())


def test_installed_kuberl_prints_its_version(installed: Path) -> None:
    result = run([installed / "bin" / "kuberl", "version"], cwd=installed.parent, env=clean_env())
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"kuberl {VERSION} (API kuberl.dev/v1alpha1)\n"


def test_installed_kuberl_validates_the_example(installed: Path) -> None:
    example = REPO / "examples" / "grpo-smollm2-arith.yaml"
    local = run([installed / "bin" / "kuberl", "validate", "--local", example], cwd=installed.parent, env=clean_env())
    assert local.returncode == 0, local.stderr
    assert local.stdout == f"ok: {example}: RLJob grpo-smollm2-arith (grpo)\n"
    # For a cluster the same file is wrong (relative paths): the installed rules run, not a stub.
    cluster = run([installed / "bin" / "kuberl", "validate", example], cwd=installed.parent, env=clean_env())
    assert cluster.returncode == 1 and "is not an absolute path" in cluster.stderr, cluster.stderr


def test_installed_kuberl_prints_the_generated_crd(installed: Path) -> None:
    result = run([installed / "bin" / "kuberl", "crd"], cwd=installed.parent, env=clean_env())
    assert result.returncode == 0, result.stderr
    assert result.stdout == (REPO / "crds" / "kuberl.dev_rljobs.yaml").read_text()


def test_installed_venv_imports_the_stdlib_operator_and_kuberl_from_itself(installed: Path) -> None:
    code = (
        "import operator, sys, sysconfig, kuberl.operator\n"
        "print(operator.__file__, sysconfig.get_paths()['stdlib'], sysconfig.get_paths()['purelib'], kuberl.operator.__file__, sys.prefix)"
    )
    result = run([installed / "bin" / "python", "-c", code], cwd=installed.parent, env=clean_env())
    assert result.returncode == 0, result.stderr
    operator_file, stdlib, purelib, kuberl_file, prefix = map(Path, result.stdout.split())
    assert Path(prefix) == installed
    assert operator_file.parent == stdlib  # Python's own operator.py, not the package's
    assert kuberl_file == Path(purelib) / "kuberl" / "operator" / "__init__.py"  # the installed copy, not the repository
    assert not (Path(purelib) / "operator").exists() and not (Path(purelib) / "engine").exists()
    assert Path(sysconfig.get_paths()["purelib"]) != Path(purelib)  # and not the repository's .venv
