"""The job commands without a cluster: how they parse, what they print, which pod a rank or role selects.
Every command against a real control plane: tests/cluster/test_client.py; logs of real pods: tests/node/test_job_logs.py."""

from __future__ import annotations

import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from kuberl.client.logs import lines_of, merged, pod_ranks, select_pods
from kuberl.operator.cli.commands import build_parser
from kuberl.operator.cli.jobs import JOB_COMMANDS, age, duration, list_table, plugin_parser, seconds, status_text

from .rljob_objects import job


def test_durations_read_like_kubectl() -> None:
    assert [duration(s) for s in (None, 0, 59.4, 60, 90, 3599, 3600, 7260, 90000)] == [
        "unknown",
        "0s",
        "59s",
        "1m00s",
        "1m30s",
        "59m59s",
        "1h00m",
        "2h01m",
        "1d01h",
    ]
    now = datetime(2030, 1, 1, tzinfo=timezone.utc)
    assert [age((now - timedelta(seconds=s)).isoformat().replace("+00:00", "Z"), now) for s in (5, 125, 7300, 200000)] == [
        "5s",
        "2m",
        "2h",
        "2d",
    ]
    assert [seconds(t) for t in ("90", "90s", "1.5m", "2h")] == [90, 90, 90, 7200]
    with pytest.raises(Exception, match="is not a duration"):
        seconds("soon")


def test_every_job_command_is_in_kuberl_and_in_kubectl_rl() -> None:
    for parser, prefix in ((build_parser(), []), (plugin_parser(), [])):
        for command in JOB_COMMANDS:
            argv = prefix + [command] + ([] if command in ("list", "version") else ["x" if command != "submit" else "job.yaml"])
            args = parser.parse_args(argv + ["-n", "ns", "--context", "c", "--kubeconfig", "k"])
            assert (args.namespace, args.context, args.kubeconfig) == ("ns", "c", "k"), command
    # kubectl rl: the options before the command too, as kubectl passes `kubectl rl -n ns status x` on.
    args = plugin_parser().parse_args(["-n", "ns", "status", "x"])
    assert (args.namespace, args.name) == ("ns", "x")
    args = build_parser().parse_args(["logs", "j", "--rank", "3", "-f"])
    assert (args.rank, args.follow, args.role) == (3, True, None)
    args = build_parser().parse_args(["wait", "j", "--for", "Running", "--timeout", "10m"])
    assert (args.phase, args.timeout) == ("Running", 600)
    # The operator's own options are untouched by the job commands'.
    assert build_parser().parse_args(["operator", "--namespace", "a", "--namespace", "b"]).namespace == ["a", "b"]


def test_the_kubectl_plugin_is_an_executable_named_kubectl_rl() -> None:
    plugin = Path(sys.executable).parent / "kubectl-rl"
    out = subprocess.run([str(plugin), "--help"], capture_output=True, text=True, check=True, timeout=60).stdout
    assert out.startswith("usage: kubectl rl ") and all(c in out for c in JOB_COMMANDS)


def test_a_command_without_a_cluster_fails_in_one_line(tmp_path: Path) -> None:
    kuberl = Path(sys.executable).parent / "kuberl"
    result = subprocess.run([str(kuberl), "list", "--kubeconfig", str(tmp_path / "none")], capture_output=True, text=True, timeout=60)
    assert (result.returncode, result.stdout, result.stderr) == (1, "", f"error: no kubeconfig at {tmp_path / 'none'}\n")


def test_status_and_list_show_what_the_status_holds() -> None:
    running = job(
        phase="Running",
        step=10,
        totalSteps=40,
        progress=25,
        etaSeconds=754,
        restarts=1,
        preemptions=2,
        metrics={"rewardMean": 0.4375, "staleness": 1, "trainerIdleFraction": 0.125, "rolloutIdleFraction": 0.5},
        validationReward=0.5,
        validationStep=8,
        lastCheckpoint={"step": 8, "path": "/ckpt/step-00000008", "time": "2030-01-01T00:10:00Z"},
        roles={"actor": {"active": 2, "ready": 2}},
        conditions=[
            {
                "type": "Running",
                "status": "True",
                "reason": "AllRanksRunning",
                "message": "all 2 pods are running",
                "lastTransitionTime": "2030-01-01T00:01:00Z",
            }
        ],
    )
    text = status_text(running)
    for line in (
        "Phase:        Running",
        "Step:         10/40 (25%)",
        "Progress:     25%",
        "ETA:          12m34s",
        "Reward:       0.4375",
        "Staleness:    1 version(s) behind",
        "Idle:         trainers 12%, rollout fleet 50%",
        "Validation:   0.5 at step 8",
        "Restarts:     1",
        "Preemptions:  2",
        "Checkpoint:   step 8 at /ckpt/step-00000008, 2030-01-01T00:10:00+00:00",
        "  actor:      2 active, 2 ready, 0 succeeded, 0 failed",
    ):
        assert line in text.splitlines(), (line, text)
    assert text.splitlines()[-1].split(None, 3) == ["Running", "True", "AllRanksRunning", "all 2 pods are running"]
    assert list_table([running]).splitlines()[1].split()[:7] == ["demo", "Running", "10/40", "25%", "12m34s", "0.4375", "1"]
    # Before 3 timed steps the ETA is unknown, and says why; once the job has ended there is none.
    early = status_text(job(phase="Running", step=2, totalSteps=40, progress=5))
    assert "ETA:          unknown (fewer than 3 steps timed since the pods started)" in early
    assert "ETA:          -" in status_text(job(phase="Succeeded", step=40, totalSteps=40, progress=100, etaSeconds=0))
    assert "ETA:          -" in status_text(job(phase="Suspended", step=20, totalSteps=40, progress=50, etaSeconds=60))
    assert "Phase:        - (not yet reconciled)" in status_text(job())


def pod(name: str, role: str, index: int, offset: int, per_pod: int = 1, attempt: int = 0, **labels: str) -> dict:
    return {
        "metadata": {
            "name": name,
            "labels": {"kuberl.dev/role": role, "jobset.sigs.k8s.io/restart-attempt": str(attempt), **labels},
            "annotations": {"batch.kubernetes.io/job-completion-index": str(index)},
        },
        "spec": {
            "containers": [
                {
                    "name": "trainer",
                    "env": [
                        {"name": "KUBERL_ROLE_RANK_OFFSET", "value": str(offset)},
                        {"name": "KUBERL_PROCS_PER_POD", "value": str(per_pod)},
                    ],
                }
            ]
        },
    }


def test_a_rank_maps_to_the_pod_of_its_completion_index() -> None:
    # 2 actor pods of 4 ranks each (ranks 0-7), then 1 critic pod of 2 ranks (8-9).
    pods = [
        pod("j-critic-0-0", "critic", 0, 8, 2),
        pod("j-actor-0-1", "actor", 1, 0, 4),
        pod("j-actor-0-0", "actor", 0, 0, 4),
        {
            "metadata": {"name": "j-initializer", "labels": {"kuberl.dev/component": "initializer"}},
            "spec": {"containers": [{"name": "fetch"}]},
        },
    ]
    assert pod_ranks(pods[1]) == range(4, 8) and pod_ranks(pods[0]) == range(8, 10)
    names = lambda chosen: [p["metadata"]["name"] for p in chosen]  # noqa: E731
    assert names(select_pods(pods, None, 5)) == ["j-actor-0-1"]
    assert names(select_pods(pods, None, 9)) == ["j-critic-0-0"]
    assert names(select_pods(pods, "actor", 9)) == []
    assert names(select_pods(pods, None, None)) == ["j-actor-0-0", "j-actor-0-1", "j-critic-0-0"]  # rank order, no initializer
    assert names(select_pods(pods, "initializer", None)) == ["j-initializer"]
    # After a gang restart only the newest attempt's pods count.
    restarted = pods[:3] + [pod("j-actor-0-0-new", "actor", 0, 0, 4, attempt=1)]
    assert names(select_pods(restarted, "actor", 0)) == ["j-actor-0-0-new"]


class Response:
    """What urllib3 streams: chunks that split lines anywhere."""

    def __init__(self, chunks: list[bytes]):
        self.chunks, self.released = chunks, False

    def stream(self, amt: int, decode_content: bool = True):
        yield from self.chunks

    def release_conn(self) -> None:
        self.released = True


def test_log_lines_are_cut_at_newlines_wherever_chunks_end() -> None:
    response = Response([b"step 1: re", b"ward 0.5\nst", "ep 2: é\n".encode(), b"done"])
    assert list(lines_of(response)) == ["step 1: reward 0.5", "step 2: é", "done"] and response.released


def test_several_pods_logs_are_merged_with_their_names() -> None:
    lines = list(merged([("a", lambda: iter(["1", "2"])), ("b", lambda: iter(["3"]))]))
    assert sorted(lines) == ["[a] 1", "[a] 2", "[b] 3"] and lines.index("[a] 1") < lines.index("[a] 2")

    def broken():
        yield "first"
        raise RuntimeError("stream cut")

    with pytest.raises(RuntimeError, match="stream cut"):
        list(merged([("a", broken)]))


def test_an_api_server_that_does_not_answer_is_one_line(tmp_path: Path) -> None:
    from kuberl.client import RLJobClient, UnreachableError
    from kuberl.operator.cli.ports import free_port
    from kuberl.operator.testing.credentials import write_kubeconfig

    ca = tmp_path / "ca.crt"
    ca.write_text("")
    server = f"https://127.0.0.1:{free_port()}"  # nothing listens there
    config = write_kubeconfig(tmp_path / "kubeconfig", server, ca, "token", user="someone")
    with pytest.raises(UnreachableError, match=f"^cannot reach the API server at {server}: "):
        RLJobClient(kubeconfig=config).list()
    kuberl = Path(sys.executable).parent / "kuberl"
    result = subprocess.run([str(kuberl), "status", "x", "--kubeconfig", str(config)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and result.stderr.startswith(f"error: cannot reach the API server at {server}: ")
    assert len(result.stderr.splitlines()) == 1
