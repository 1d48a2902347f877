"""Metrics end to end: a real Prometheus (Debian's package) scrapes a running `kuberl run` and the
operator; promtool checks both endpoints and the chart's alert rules; every metric the dashboard
or an alert names exists in our exporters."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

from kuberl.operator.testing.operator_process import OperatorProcess
from kuberl.operator.cli.ports import free_port
from kuberl.operator.testing.waiting import eventually

REPO = Path(__file__).resolve().parent.parent.parent
CHART = REPO / "helm" / "kuberl"
METRIC = re.compile(r"\b(kuberl_[a-z_]+)\b")


@pytest.fixture(scope="module")
def prometheus_bin() -> Path:
    result = subprocess.run(["bash", str(REPO / "scripts" / "prometheus.sh")], capture_output=True, text=True, timeout=600)
    if result.returncode != 0:
        pytest.fail(f"Debian's prometheus package could not be fetched: {result.stderr}", pytrace=False)
    return Path(result.stdout.strip().splitlines()[-1])


def exported_names() -> set[str]:
    """Every sample name our two exporters can emit."""
    from kuberl.engine.runtime.metrics import RunMetrics
    from kuberl.operator.control.controller import OperatorMetrics

    names: set[str] = set()
    for registry in (RunMetrics("x", None, None).registry, OperatorMetrics().registry):
        for family in registry.collect():
            names.add(family.name)
            names.update(sample.name for sample in family.samples)
            if family.type == "counter":
                names.add(family.name + "_total")
            if family.type == "histogram":
                names.update(family.name + s for s in ("_bucket", "_sum", "_count"))
    return names


def alert_rules(kube_binaries_dir: Path, *values: str) -> dict:
    out = subprocess.run(
        [
            str(kube_binaries_dir / "helm"),
            "template",
            "k",
            str(CHART),
            "--kube-version",
            "1.37.2",
            "--set",
            ",".join(["prometheusRule.enabled=true,image.repository=unused,trainerImage=unused", *values]),
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    [rule] = [d for d in yaml.safe_load_all(out) if d and d["kind"] == "PrometheusRule"]
    return rule["spec"]


def test_every_metric_the_dashboard_and_alerts_name_is_exported(kube_binaries_dir: Path) -> None:
    dashboard = json.loads((CHART / "files" / "dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    exprs += [dashboard["templating"]["list"][1]["query"]]
    exprs += [r["expr"] for g in alert_rules(kube_binaries_dir)["groups"] for r in g["rules"]]
    named = {m for e in exprs for m in METRIC.findall(e)}
    assert len(named) >= 12
    missing = named - exported_names()
    assert not missing, f"named by the dashboard or alerts but not exported: {sorted(missing)}"


def test_promtool_checks_the_alert_rules(prometheus_bin: Path, kube_binaries_dir: Path, tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump(alert_rules(kube_binaries_dir)))
    result = subprocess.run([str(prometheus_bin / "promtool"), "check", "rules", str(rules)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "4 rules found" in result.stdout


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return r.read().decode()


def query(port: int, expr: str) -> list:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())["data"]["result"]


RUNBOOKS = "https://docs.example.com/kuberl/monitoring/"


def test_each_alert_fires_naming_the_job_its_namespace_and_its_runbook(
    prometheus_bin: Path, kube_binaries_dir: Path, tmp_path: Path
) -> None:
    """promtool's rule unit tests: series as the operator and a scraped controller rank export them, and the alerts
    that must come of them, labels and annotations exactly."""
    rules = alert_rules(kube_binaries_dir, f"prometheusRule.runbookBaseURL={RUNBOOKS}")
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rules))

    def alert(name: str, namespace: str, job: str, summary: str, description: str, **labels: str) -> dict:
        return {
            "exp_labels": {"severity": labels.pop("severity", "warning"), "namespace": namespace, "rljob": job, **labels},
            "exp_annotations": {"summary": summary, "description": description, "runbook_url": f"{RUNBOOKS}#{name.lower()}"},
        }

    described = {r["alert"]: r["annotations"]["description"] for g in rules["groups"] for r in g["rules"]}
    cases = [
        (
            "KuberlJobFailed",
            5,
            [
                alert(
                    "KuberlJobFailed",
                    "team-a",
                    "broken",
                    "RLJob team-a/broken failed",
                    "kubectl rl status broken -n team-a: its Failed condition says why.",
                    phase="Failed",
                )
            ],
        ),
        (
            "KuberlGangRestartsRising",
            20,
            [
                alert(
                    "KuberlGangRestartsRising",
                    "team-a",
                    "flaky",
                    "RLJob team-a/flaky: 5 gang restarts in the last hour",
                    described["KuberlGangRestartsRising"],
                )
            ],
        ),
        (
            "KuberlNoStepProgress",
            30,
            [
                alert(
                    "KuberlNoStepProgress",
                    "team-b",
                    "stuck",
                    "RLJob team-b/stuck has not finished a step in 15 minutes",
                    described["KuberlNoStepProgress"],
                )
            ],
        ),
        (
            "KuberlReshardShareHigh",
            15,
            [
                alert(
                    "KuberlReshardShareHigh",
                    "team-b",
                    "slow-switch",
                    "RLJob team-b/slow-switch spends 25% of its steps switching weights",
                    described["KuberlReshardShareHigh"],
                    severity="info",
                )
            ],
        ),
    ]
    test = {
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    {"series": 'kuberl_operator_rljob_phase{namespace="team-a",rljob="broken",phase="Failed"}', "values": "1x30"},
                    {"series": 'kuberl_operator_rljob_phase{namespace="team-a",rljob="fine",phase="Running"}', "values": "1x30"},
                    {"series": 'kuberl_operator_rljob_restarts{namespace="team-a",rljob="flaky"}', "values": "0x10 1 2 3 4 5 5 5 5 5"},
                    {"series": 'kuberl_operator_rljob_restarts{namespace="team-a",rljob="fine"}', "values": "1x30"},
                    {"series": 'kuberl_step{namespace="team-b",rljob="stuck"}', "values": "1 2 3 4x40"},
                    {"series": 'kuberl_step{namespace="team-b",rljob="moving"}', "values": "1+1x40"},
                    {"series": 'kuberl_phase_seconds{namespace="team-b",rljob="slow-switch",phase="reshard"}', "values": "1x30"},
                    {"series": 'kuberl_phase_seconds{namespace="team-b",rljob="slow-switch",phase="generate"}', "values": "3x30"},
                ],
                "alert_rule_test": [
                    {"eval_time": f"{minutes}m", "alertname": name, "exp_alerts": expected} for name, minutes, expected in cases
                ],
            }
        ],
    }
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(test))
    result = subprocess.run(
        [str(prometheus_bin / "promtool"), "test", "rules", str(tmp_path / "test.yaml")], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert {name for name, _, _ in cases} == set(described)  # every alert is tested


def test_every_alert_has_a_runbook_in_the_docs(kube_binaries_dir: Path) -> None:
    page = (REPO / "docs" / "monitoring.md").read_text()
    for group in alert_rules(kube_binaries_dir)["groups"]:
        for rule in group["rules"]:
            assert f"\n### {rule['alert']}\n" in page, f"docs/monitoring.md has no runbook for {rule['alert']}"
            assert "runbook_url" not in rule["annotations"]  # only where the chart is told where the docs are


def test_prometheus_scrapes_a_run_and_the_operator(prometheus_bin: Path, control_plane, rljob_crd, tmp_path: Path) -> None:
    from kuberl.engine.models.tiny import make_tiny_model

    model = make_tiny_model(tmp_path / "model")
    run_port, prom_port = free_port(), free_port()
    job = tmp_path / "job.yaml"
    job.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kuberl.dev/v1alpha1",
                "kind": "RLJob",
                "metadata": {"name": "scraped"},
                "spec": {
                    "model": {"path": str(model)},
                    "data": {"train": {"generator": {"name": "arithmetic", "count": 64, "maxOperand": 9}}, "maxPromptLength": 96},
                    "algorithm": {"name": "grpo"},
                    "rollout": {"samplesPerPrompt": 2, "maxNewTokens": 4, "kvCacheBytes": 32 << 20},
                    "reward": {"rules": [{"name": "math_answer"}, {"name": "length_penalty", "args": {"max_chars": 2}}]},
                    "roles": {"actor": {"replicas": 1}},
                    "trainer": {"totalSteps": 400, "promptsPerStep": 2, "checkpoint": {"path": str(tmp_path / "ckpt"), "interval": 1000}},
                    "monitoring": {"metricsPort": run_port},
                },
            }
        )
    )
    kuberl = Path(sys.executable).parent / "kuberl"
    run = subprocess.Popen(
        [str(kuberl), "run", str(job), "--out", str(tmp_path / "run")], stdout=subprocess.DEVNULL, stderr=open(tmp_path / "run.log", "w")
    )
    operator = OperatorProcess(control_plane.kubeconfig, tmp_path / "operator.log")
    prometheus = None
    try:
        operator.start()

        def stepping() -> bool:
            assert run.poll() is None, (tmp_path / "run.log").read_text()[-3000:]
            try:
                return "kuberl_step{" in scrape(run_port) and (tmp_path / "run" / "metrics.jsonl").exists()
            except OSError:
                return False

        eventually(stepping, 300, "the run's metrics endpoint with a finished step")
        for port in (run_port, operator.metrics_port):
            check = subprocess.run(
                [str(prometheus_bin / "promtool"), "check", "metrics"], input=scrape(port), capture_output=True, text=True, timeout=60
            )
            assert check.returncode == 0, f"port {port}: {check.stdout}{check.stderr}"

        config = tmp_path / "prometheus.yml"
        config.write_text(
            yaml.safe_dump(
                {
                    "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                    "scrape_configs": [
                        {"job_name": "kuberl-run", "static_configs": [{"targets": [f"127.0.0.1:{run_port}"]}]},
                        {"job_name": "kuberl-operator", "static_configs": [{"targets": [f"127.0.0.1:{operator.metrics_port}"]}]},
                    ],
                }
            )
        )
        prometheus = subprocess.Popen(
            [
                str(prometheus_bin / "prometheus"),
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{prom_port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=open(tmp_path / "prometheus.log", "w"),
        )

        def scraped(expr: str):
            def check():
                assert prometheus.poll() is None, (tmp_path / "prometheus.log").read_text()[-3000:]
                try:
                    return query(prom_port, expr)
                except OSError:
                    return None

            return eventually(check, 60, f"Prometheus to return {expr}")

        [step] = scraped('kuberl_step{rljob="scraped"}')
        assert float(step["value"][1]) >= 1
        [reward] = scraped('kuberl_reward_mean{rljob="scraped"}')
        assert reward["value"][1] not in ("NaN", "")
        assert scraped("kuberl_operator_reconcile_errors_total")
    finally:
        if prometheus is not None:
            prometheus.terminate()
            prometheus.wait(20)
        run.terminate()
        run.wait(30)
        operator.stop()
