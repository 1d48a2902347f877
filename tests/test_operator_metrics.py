"""The operator's per-job series: one phase and one restart count per live RLJob, gone with the job, so an alert
names the job and its namespace and a deleted job leaves nothing behind."""

from __future__ import annotations

from kuberl.operator.control.controller import OperatorMetrics


def samples(metrics: OperatorMetrics, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {tuple(sorted(s.labels.items())): s.value for f in metrics.registry.collect() for s in f.samples if s.name == name}


def test_each_job_has_one_phase_series_and_its_restarts_until_it_is_gone() -> None:
    metrics = OperatorMetrics()
    metrics.observe_phase(("team-a", "grpo"), "Starting")
    metrics.observe_phase(("team-a", "grpo"), "Running", restarts=2)
    metrics.observe_phase(("team-b", "grpo"), "Failed")
    assert samples(metrics, "kuberl_operator_rljob_phase") == {
        (("namespace", "team-a"), ("phase", "Running"), ("rljob", "grpo")): 1.0,
        (("namespace", "team-b"), ("phase", "Failed"), ("rljob", "grpo")): 1.0,
    }
    assert samples(metrics, "kuberl_operator_rljob_restarts")[(("namespace", "team-a"), ("rljob", "grpo"))] == 2.0
    assert samples(metrics, "kuberl_operator_rljobs")[(("phase", "Running"),)] == 1.0

    metrics.observe_phase(("team-a", "grpo"), None)
    assert list(samples(metrics, "kuberl_operator_rljob_phase")) == [(("namespace", "team-b"), ("phase", "Failed"), ("rljob", "grpo"))]
    assert list(samples(metrics, "kuberl_operator_rljob_restarts")) == [(("namespace", "team-b"), ("rljob", "grpo"))]
    assert samples(metrics, "kuberl_operator_rljobs")[(("phase", "Running"),)] == 0.0
    metrics.observe_phase(("team-x", "never-seen"), None)  # a job deleted before its first reconcile
