"""The metrics page: every Prometheus metric kuberl exports, read from the exporters' own registries.

The engine's (kuberl.engine.runtime.metrics.RunMetrics) and the operator's (OperatorMetrics) registries
are built without serving anything, and their metric families are listed as Prometheus would scrape
them: name, type, labels and help. The chart's alerts and dashboard panels that use each are read
from helm/kuberl/files.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from .markdown import cell, code, header, table


def _families(registry) -> list[tuple[str, str, list[str], str]]:
    """(exposed name, type, labels, help) of each family in a prometheus_client registry."""
    out = []
    for family in registry.collect():
        labels = sorted({k for s in family.samples for k in s.labels if k != "le"})
        name = family.name + ("_total" if family.type == "counter" else "")
        out.append((name, family.type, labels, family.documentation))
    return sorted(out)


def _engine() -> list[tuple[str, str, list[str], str]]:
    from kuberl.engine.runtime.metrics import RunMetrics

    metrics = RunMetrics("job", port=None, jsonl=None)
    metrics.record({"rollout_replica/0/tokens_per_second": 1.0})  # a labelled family shows its labels once it has a child
    return _families(metrics.registry)


def _operator() -> list[tuple[str, str, list[str], str]]:
    from ...api import PHASES
    from ...control.controller import OperatorMetrics

    metrics = OperatorMetrics()
    metrics.observe_phase(("namespace", "job"), PHASES[0])  # a labelled family shows its labels once it has a child
    return _families(metrics.registry)


def _uses(repo: Path) -> dict[str, list[str]]:
    """Which alerts and dashboard panels of the chart name each metric."""
    files = repo / "helm" / "kuberl" / "files"
    uses: dict[str, list[str]] = {}

    def use(name: str, entry: str) -> None:
        if entry not in uses.setdefault(name.removesuffix("_bucket"), []):
            uses[name.removesuffix("_bucket")].append(entry)

    text = (files / "alerts.yaml").read_text()
    # The alerts file is a Helm template: its {{ ... }} parts are not YAML (a line of nothing else renders to nothing here).
    text = re.sub(r"^[ \t]*\{\{-.*?\}\}[ \t]*\n", "", text, flags=re.M)
    rules = yaml.safe_load(re.sub(r"\{\{.*?\}\}", "0", text))
    for group in rules["groups"]:
        for rule in group["rules"]:
            for name in re.findall(r"kuberl_[a-z_]+", rule["expr"]):
                use(name, f"alert {rule['alert']}")
    dashboard = json.loads((files / "dashboard.json").read_text())
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            for name in re.findall(r"kuberl_[a-z_]+", target.get("expr", "")):
                use(name, f"panel “{panel['title']}”")
    return uses


def _rows(families, uses: dict[str, list[str]]) -> list[list[str]]:
    return [
        [
            f'<span id="{name}"></span>`{name}`',
            kind,
            ", ".join(code(lb) for lb in labels) or "-",
            cell(help_),
            cell("; ".join(uses.get(name, []))) or "-",
        ]
        for name, kind, labels, help_ in families
    ]


def page(repo: Path) -> str:
    from kuberl.engine.runtime.metrics import PHASES

    uses = _uses(repo)
    head = ["metric", "type", "labels", "help", "used by the chart"]
    return "".join(
        [
            header("the exporters' registries (kuberl.engine.runtime.metrics, kuberl.operator.control.controller) and helm/kuberl/files"),
            "# Metrics\n\n",
            "Every Prometheus metric kuberl exports, as a scrape shows it. How to collect them, the dashboard and the "
            "alerts are on [Monitoring](../monitoring.md).\n\n",
            "## The job's controller rank\n\n",
            "Rank 0 of every job (the actor's pod 0 on a cluster, `kuberl run`'s first rank on one machine) serves these on "
            "`:<spec.monitoring.metricsPort>/metrics` (default 9400), each labelled with the job's name (`rljob`). The same "
            "numbers, and more, are in the run's `metrics.jsonl`, one record per step.\n\n",
            table(head, _rows(_engine(), uses)),
            "\n",
            "`kuberl_phase_seconds` has one series per phase of a step: " + ", ".join(code(p) for p in PHASES) + ".\n\n",
            "## The operator\n\n",
            "The operator serves these on `:8000/metrics` (the chart's `metrics.port`); `:8080/healthz` answers its "
            "liveness and readiness probes.\n\n",
            table(head, _rows(_operator(), uses)),
        ]
    )
