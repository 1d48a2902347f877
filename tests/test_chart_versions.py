"""The Kubernetes and JobSet versions the README asks for are the ones the chart and the operator hold to."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from kuberl.operator.control.manager import JOBSET_INSTALL

REPO = Path(__file__).resolve().parent.parent


def test_the_readme_asks_for_the_kubernetes_the_chart_accepts() -> None:
    chart = yaml.safe_load((REPO / "helm" / "kuberl" / "Chart.yaml").read_text())
    minimum = re.fullmatch(r">=(\d+\.\d+)\.0-0", chart["kubeVersion"])
    assert minimum is not None, chart["kubeVersion"]
    readme = (REPO / "README.md").read_text()
    assert f"You need a Kubernetes cluster ({minimum.group(1)} or later)" in readme


def test_the_readme_installs_the_jobset_the_operator_asks_for() -> None:
    # The operator's start-up refusal (main.check_prerequisites) and the README give the same command.
    assert JOBSET_INSTALL in (REPO / "README.md").read_text()


def test_the_charts_notes_show_the_columns_kubectl_prints() -> None:
    crd = yaml.safe_load((REPO / "crds" / "kuberl.dev_rljobs.yaml").read_text())
    columns = [c["name"].upper() for c in crd["spec"]["versions"][0]["additionalPrinterColumns"] if not c.get("priority")]
    notes = (REPO / "helm" / "kuberl" / "templates" / "NOTES.txt").read_text()
    [line] = [ln for ln in notes.splitlines() if "kubectl get rlj -A" in ln]
    assert line.split("#", 1)[1].split() == ["NAMESPACE", "NAME", *columns]
