"""Progress, ETA and validation reward: computed by the controller rank, carried by ProgressReport, shown in the status."""

from __future__ import annotations

import pytest

from kuberl.engine.config import ProgressReport
from kuberl.engine.runtime.progress import ETA_MIN_STEPS, ProgressTracker, eta_seconds, progress_report
from kuberl.operator.api import RLJobStatus
from kuberl.operator.api.status import progress_percent
from kuberl.operator.control.reconcile.reading import apply_progress

# --- the ETA: a pure function of the recent step times and the steps left -----------------------------


def test_eta_is_the_mean_of_the_recent_step_times_times_the_steps_left() -> None:
    assert eta_seconds([2.0, 4.0, 3.0], steps_left=10) == pytest.approx(30.0)  # mean 3 s x 10
    assert eta_seconds([1.0, 1.0, 1.0, 5.0], steps_left=2) == pytest.approx(4.0)  # mean 2 s x 2
    assert eta_seconds([0.5, 0.25, 0.75], steps_left=1) == pytest.approx(0.5)


def test_eta_uses_only_the_last_window_steps() -> None:
    # A slow first step (warm-up) falls out of a window of 3: mean of 2, 2, 2.
    assert eta_seconds([100.0, 2.0, 2.0, 2.0], steps_left=5, window=3) == pytest.approx(10.0)
    # The default window is 10: the 11 times 50, then ten of 1 s, give 1 s a step.
    assert eta_seconds([50.0] + [1.0] * 10, steps_left=7) == pytest.approx(7.0)


def test_eta_is_unknown_before_enough_steps_and_zero_at_the_end() -> None:
    assert ETA_MIN_STEPS == 3
    assert eta_seconds([], steps_left=10) is None
    assert eta_seconds([2.0, 2.0], steps_left=10) is None
    assert eta_seconds([2.0, 2.0], steps_left=10, min_steps=2) == pytest.approx(20.0)
    assert eta_seconds([], steps_left=0) == 0.0  # nothing left: done, whatever was timed
    assert eta_seconds([2.0, float("nan"), 2.0, 2.0], steps_left=1) == pytest.approx(2.0)  # a non-finite time is skipped


def test_the_tracker_reports_eta_and_keeps_the_latest_validation() -> None:
    tracker = ProgressTracker(total_steps=10)
    reports = [
        tracker.report({"step": 1, "step_seconds": 4.0, "reward_mean": 0.1}, None),
        tracker.report({"step": 2, "step_seconds": 2.0, "validation_reward_mean": 0.25}, None),
        tracker.report({"step": 3, "step_seconds": 3.0}, None),
        tracker.report({"step": 4, "step_seconds": 3.0}, None),
    ]
    assert [r.eta_seconds for r in reports] == [None, None, pytest.approx(3.0 * 7), pytest.approx(3.0 * 6)]
    assert [(r.validation_step, r.validation_reward_mean) for r in reports] == [(None, None), (2, 0.25), (2, 0.25), (2, 0.25)]


def test_progress_is_a_rounded_down_percent_within_0_and_100() -> None:
    assert progress_percent(7, 10) == 70
    assert progress_percent(1, 3) == 33
    assert progress_percent(2, 3) == 66
    assert progress_percent(10, 10) == 100
    assert progress_percent(12, 10) == 100
    assert progress_percent(0, 10) == 0
    assert progress_percent(None, 10) is None and progress_percent(3, None) is None and progress_percent(0, 0) is None


# --- across the boundary: what the engine writes is what the operator shows ----------------------------


def test_the_operator_shows_the_progress_eta_and_validation_the_engine_reports() -> None:
    tracker = ProgressTracker(total_steps=30)
    for step, seconds in ((1, 6.0), (2, 5.0), (3, 4.0)):
        text = tracker.report(
            {"step": step, "step_seconds": seconds, "reward_mean": 0.5, **({"validation_reward_mean": 0.4375} if step == 2 else {})}, None
        ).to_json()
    status = RLJobStatus()
    apply_progress(status, text)  # what the operator does with the ConfigMap's text
    assert (status.step, status.total_steps, status.progress) == (3, 30, 10)
    assert status.eta_seconds == round(5.0 * 27) == 135
    assert (status.validation_reward, status.validation_step) == (0.4375, 2)
    # ... and what the status then shows through the API: camelCase, as the CRD declares it.
    shown = status.to_manifest()
    assert (shown["progress"], shown["etaSeconds"], shown["validationReward"], shown["validationStep"]) == (10, 135, 0.4375, 2)

    # A restarted controller rank has timed no step yet: the ETA goes back to unknown, the validation stays.
    apply_progress(status, progress_report({"step": 4, "step_seconds": 4.0}, total_steps=30, last_checkpoint=None).to_json())
    assert (status.step, status.progress, status.eta_seconds) == (4, 13, None)
    assert (status.validation_reward, status.validation_step) == (0.4375, 2)
    assert "etaSeconds" not in status.to_manifest()


def test_the_operator_shows_how_stale_the_last_batch_was_and_refuses_a_wild_value() -> None:
    # Separate placement: the step's record says how many versions behind its batch was.
    status = RLJobStatus()
    apply_progress(status, progress_report({"step": 3, "staleness": 1.0}, total_steps=30, last_checkpoint=None).to_json())
    assert status.metrics is not None and status.metrics.staleness == 1
    assert status.to_manifest()["metrics"]["staleness"] == 1
    # Colocated: no staleness in the record, none in the report or the status.
    apply_progress(status, progress_report({"step": 4}, total_steps=30, last_checkpoint=None).to_json())
    assert status.metrics is not None and status.metrics.staleness is None
    refused = apply_progress(status, '{"step": 5, "staleness": 10000000000}')
    assert refused is not None and "staleness is outside" in refused and status.step == 4


def test_the_operator_shows_the_idle_shares_of_trainers_and_fleet_and_refuses_a_share_above_one() -> None:
    status = RLJobStatus()
    record = {"step": 3, "trainer_idle_fraction": 0.25, "rollout_idle_fraction": 0.5}
    apply_progress(status, progress_report(record, total_steps=30, last_checkpoint=None).to_json())
    assert status.metrics is not None
    assert (status.metrics.trainer_idle_fraction, status.metrics.rollout_idle_fraction) == (0.25, 0.5)
    assert status.to_manifest()["metrics"]["trainerIdleFraction"] == 0.25
    # A record's share that is no share is left out of the report, not sent.
    wild = progress_report({"step": 4, "trainer_idle_fraction": 3.0}, total_steps=30, last_checkpoint=None)
    assert wild.trainer_idle_fraction is None
    refused = apply_progress(status, '{"step": 5, "rolloutIdleFraction": 1.5}')
    assert refused is not None and status.step == 3


def test_a_report_without_the_new_fields_still_parses() -> None:
    """A trainer image older than the operator writes no ETA or validation: the report still applies."""
    status = RLJobStatus()
    apply_progress(status, '{"step": 5, "totalSteps": 20, "rewardMean": 0.5}')
    assert (status.step, status.progress, status.eta_seconds, status.validation_reward) == (5, 25, None, None)
    assert ProgressReport.model_validate_json('{"step": 1, "etaSeconds": 12.5}').eta_seconds == 12.5
