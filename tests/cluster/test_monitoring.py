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
from kuberl.operator.ports import free_port
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
    from kuberl.operator.controller import OperatorMetrics

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


def alert_rules(kube_binaries_dir: Path) -> dict:
    out = subprocess.run([str(kube_binaries_dir / "helm"), "template", "k", str(CHART), "--kube-version", "1.37.2",
                          "--set", "prometheusRule.enabled=true,image.repository=unused,trainerImage=unused"], capture_output=True, text=True, check=True, timeout=60).stdout
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


def test_prometheus_scrapes_a_run_and_the_operator(prometheus_bin: Path, control_plane, rljob_crd, tmp_path: Path) -> None:
    from kuberl.engine.models.tiny import make_tiny_model

    model = make_tiny_model(tmp_path / "model")
    run_port, prom_port = free_port(), free_port()
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump({
        "apiVersion": "kuberl.dev/v1alpha1", "kind": "RLJob", "metadata": {"name": "scraped"},
        "spec": {"model": {"path": str(model)},
                 "data": {"train": {"generator": {"name": "arithmetic", "count": 64, "maxOperand": 9}}, "maxPromptLength": 96},
                 "algorithm": {"name": "grpo"},
                 "rollout": {"samplesPerPrompt": 2, "maxNewTokens": 4, "kvCacheBytes": 32 << 20},
                 "reward": {"rules": [{"name": "math_answer"}, {"name": "length_penalty", "args": {"max_chars": 2}}]},
                 "roles": {"actor": {"replicas": 1}},
                 "trainer": {"totalSteps": 400, "promptsPerStep": 2, "checkpoint": {"path": str(tmp_path / "ckpt"), "interval": 1000}},
                 "monitoring": {"metricsPort": run_port}}}))
    kuberl = Path(sys.executable).parent / "kuberl"
    run = subprocess.Popen([str(kuberl), "run", str(job), "--out", str(tmp_path / "run")],
                           stdout=subprocess.DEVNULL, stderr=open(tmp_path / "run.log", "w"))
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
            check = subprocess.run([str(prometheus_bin / "promtool"), "check", "metrics"], input=scrape(port),
                                   capture_output=True, text=True, timeout=60)
            assert check.returncode == 0, f"port {port}: {check.stdout}{check.stderr}"

        config = tmp_path / "prometheus.yml"
        config.write_text(yaml.safe_dump({"global": {"scrape_interval": "1s", "evaluation_interval": "1s"}, "scrape_configs": [
            {"job_name": "kuberl-run", "static_configs": [{"targets": [f"127.0.0.1:{run_port}"]}]},
            {"job_name": "kuberl-operator", "static_configs": [{"targets": [f"127.0.0.1:{operator.metrics_port}"]}]},
        ]}))
        prometheus = subprocess.Popen(
            [str(prometheus_bin / "prometheus"), f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{prom_port}"],
            stdout=subprocess.DEVNULL, stderr=open(tmp_path / "prometheus.log", "w"))

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
