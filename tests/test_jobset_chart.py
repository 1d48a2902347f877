"""JobSet's own Helm chart, vendored in helm/kuberl/charts/jobset for `jobset.install=true`: the JobSet the tests
run, made by scripts/vendor-jobset-chart.sh from the Go module, license kept. (Rendering and installing it:
tests/cluster/test_helm.py.)"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from kuberl.operator.control.manager import JOBSET_INSTALL

REPO = Path(__file__).resolve().parent.parent
CHART = REPO / "helm" / "kuberl"
VENDORED = CHART / "charts" / "jobset"
SCRIPT = REPO / "scripts" / "vendor-jobset-chart.sh"


def jobset_version_of_the_tests() -> str:
    """The JobSet that the scheduling tests build and run (scripts/scheduling-binaries.sh)."""
    [version] = re.findall(r"^JOBSET_VERSION=(v[0-9.]+)", (REPO / "scripts" / "scheduling-binaries.sh").read_text(), flags=re.M)
    return version


def tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_the_vendored_chart_is_the_jobset_the_tests_run() -> None:
    version = jobset_version_of_the_tests()
    vendored = yaml.safe_load((VENDORED / "Chart.yaml").read_text())
    assert (vendored["name"], vendored["version"], vendored["appVersion"]) == ("jobset", version.removeprefix("v"), version)
    values = yaml.safe_load((VENDORED / "values.yaml").read_text())
    assert values["image"] == {
        "repository": "registry.k8s.io/jobset/jobset",
        "tag": version,
        "pullPolicy": "IfNotPresent",
        "pullSecrets": [],
    }
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["dependencies"] == [{"name": "jobset", "version": vendored["version"], "condition": "jobset.install"}]
    kuberl_values = yaml.safe_load((CHART / "values.yaml").read_text())["jobset"]
    assert kuberl_values["install"] is False and kuberl_values["minimumVersion"] == version
    assert f"/download/{version}/" in JOBSET_INSTALL  # the install command the operator and the README give


def test_the_vendored_chart_keeps_jobsets_license() -> None:
    assert (VENDORED / "LICENSE").read_text().lstrip().startswith("Apache License\n")
    unlicensed = [
        name
        for name, text in tree(VENDORED).items()
        if (name.endswith((".yaml", ".tpl")) and not name.startswith("crds/"))
        and b"Licensed under the Apache License, Version 2.0" not in text
    ]
    assert not unlicensed, unlicensed


def test_the_schema_takes_every_value_of_the_jobset_chart() -> None:
    """The JobSet chart's values are kuberl's jobset.* (a subchart's values are its name's key of the parent's)."""
    schema = json.loads((CHART / "values.schema.json").read_text())["properties"]["jobset"]["properties"]
    values = yaml.safe_load((VENDORED / "values.yaml").read_text())
    assert set(values) <= set(schema), set(values) - set(schema)
    assert set(values["image"]) <= set(schema["image"]["properties"])


@pytest.mark.skipif(shutil.which("go") is None, reason="go is not installed (the script takes the chart from the Go module)")
def test_the_vendored_chart_is_what_the_script_makes(tmp_path: Path) -> None:
    made = subprocess.run(["bash", str(SCRIPT), str(tmp_path / "jobset")], capture_output=True, text=True, timeout=600)
    assert made.returncode == 0, made.stderr
    expected, vendored = tree(tmp_path / "jobset"), tree(VENDORED)
    assert sorted(vendored) == sorted(expected)
    changed = [name for name in expected if vendored[name] != expected[name]]
    assert not changed, f"helm/kuberl/charts/jobset differs from what {SCRIPT.name} makes: {changed}; run it again"
