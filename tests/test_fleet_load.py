"""The rollout fleet's load (rollout.placement: separate): each replica's account of its time, and the
step's idle shares and per-replica rates computed from the accounts (pure)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kuberl.engine.rollout.fleet_load import ReplicaClock, ReplicaLoad, fleet_load_metrics, trainer_idle_fraction


class FakeClock:
    """Time that moves only when the test says so."""

    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_a_replica_counts_its_waits_as_idle_and_its_commands_as_busy() -> None:
    now = FakeClock()
    clock = ReplicaClock(replica=1, now=now)
    now.t += 3.0  # waits for the first command
    with clock.command():  # weights: 2 s
        now.t += 2.0
    now.t += 1.0  # waits
    with clock.command():  # generate: 4 s, then the reply
        now.t += 4.0
        clock.generated(tokens=80, seconds=4.0)
        load = clock.take()
        now.t += 0.5  # the gather and the reply: the next account's
    assert load == ReplicaLoad(replica=1, tokens=80, generate_seconds=4.0, busy_seconds=6.0, idle_seconds=4.0)
    now.t += 2.0
    with clock.command():
        assert clock.take() == ReplicaLoad(replica=1, tokens=0, generate_seconds=0.0, busy_seconds=0.5, idle_seconds=2.0)


def test_the_step_reports_the_idle_share_and_each_replicas_rate() -> None:
    loads = [
        ReplicaLoad(0, tokens=100, generate_seconds=2.0, busy_seconds=3.0, idle_seconds=1.0),
        ReplicaLoad(1, tokens=60, generate_seconds=2.0, busy_seconds=2.0, idle_seconds=2.0),
        ReplicaLoad(0, tokens=100, generate_seconds=2.0, busy_seconds=2.0, idle_seconds=0.0),  # a second batch
    ]
    assert fleet_load_metrics(loads) == {
        "rollout_replica/0/tokens_per_second": 50.0,
        "rollout_replica/1/tokens_per_second": 30.0,
        "rollout_replica_tokens_per_second_min": 30.0,
        "rollout_idle_fraction": pytest.approx(3.0 / 10.0),
    }


def test_no_accounts_report_nothing_and_a_replica_that_never_generated_has_no_rate() -> None:
    assert fleet_load_metrics([]) == {}
    out = fleet_load_metrics([ReplicaLoad(0, tokens=0, generate_seconds=0.0, busy_seconds=0.0, idle_seconds=5.0)])
    assert out == {"rollout_idle_fraction": 1.0}


seconds = st.floats(min_value=0, max_value=1e6, allow_nan=False)


@given(st.lists(st.builds(ReplicaLoad, st.integers(0, 7), st.integers(0, 10**9), seconds, seconds, seconds), max_size=20))
def test_the_idle_share_is_a_share(loads: list[ReplicaLoad]) -> None:
    share = fleet_load_metrics(loads).get("rollout_idle_fraction")
    assert share is None or 0.0 <= share <= 1.0


@pytest.mark.parametrize("waited, step, expected", [(3.0, 10.0, 0.3), (0.0, 10.0, 0.0), (12.0, 10.0, 1.0), (1.0, 0.0, 0.0)])
def test_the_trainers_idle_share_is_their_wait_over_the_step(waited: float, step: float, expected: float) -> None:
    assert trainer_idle_fraction(waited, step) == pytest.approx(expected)
