"""kubectl's habits in the job commands, without a cluster: `list -A`, `-o yaml|json|wide`, `submit -f FILE` and `-f -`,
`version`, and `kuberl operator`'s kubeconfig (KUBECONFIG, --context, one line when it is missing or broken).
The same against the real API server: tests/cluster/test_client.py."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from kuberl.client.operators import OperatorDeployment, image_tag
from kuberl.operator.cli.commands import build_parser
from kuberl.operator.cli.jobs import list_table, plugin_parser, status_text
from kuberl.operator.cli.output import as_list, dump, reason
from kuberl.operator.validation.manifest import ManifestError, read_documents, read_manifest
from kuberl.operator.testing.rljobs import small_job
from kuberl.operator.validation.yaml_reader import MAX_FILE_BYTES

from .rljob_objects import job

BIN = Path(sys.executable).parent


def run(*argv: str | Path, stdin: str = "", env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(a) for a in argv], input=stdin, capture_output=True, text=True, timeout=60, env={**os.environ, **(env or {})}
    )


def one_line(result: subprocess.CompletedProcess, status: int = 1) -> str:
    assert result.returncode == status and "Traceback" not in result.stderr, (result.returncode, result.stderr)
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    return result.stderr.strip()


@pytest.fixture
def unreachable(tmp_path: Path) -> tuple[Path, str]:
    """A kubeconfig of a server where nothing listens: a command that gets as far as a request says so."""
    from kuberl.operator.cli.ports import free_port
    from kuberl.operator.testing.credentials import write_kubeconfig

    (tmp_path / "ca.crt").write_text("")
    server = f"https://127.0.0.1:{free_port()}"
    return write_kubeconfig(tmp_path / "kubeconfig", server, tmp_path / "ca.crt", "token", user="someone"), server


def test_the_new_flags_parse_in_kuberl_and_kubectl_rl() -> None:
    for parser in (build_parser(), plugin_parser()):
        args = parser.parse_args(["list", "-A", "-o", "wide"])
        assert (args.all_namespaces, args.output) == (True, "wide")
        assert parser.parse_args(["status", "x", "--output", "yaml"]).output == "yaml"
        assert parser.parse_args(["status", "x", "--output", "json"]).output == "json"
        args = parser.parse_args(["submit", "-f", "-"])
        assert (args.file, args.filename) == (None, "-")
        assert parser.parse_args(["submit", "job.yaml"]).file == "job.yaml"
        assert parser.parse_args(["version", "--client"]).client_only is True
    with pytest.raises(SystemExit):
        build_parser().parse_args(["list", "-o", "name"])


def test_list_all_namespaces_and_wide() -> None:
    a = job(
        phase="Running",
        step=3,
        totalSteps=40,
        restarts=1,
        preemptions=2,
        conditions=[{"type": "Running", "status": "True", "reason": "AllRanksRunning", "lastTransitionTime": "2030-01-01T00:01:00Z"}],
    )
    b = job(phase="Queued")
    b.metadata.namespace, b.metadata.name = "team-b", "other"
    header, first, second = list_table([a, b], namespaces=True, wide=True).splitlines()
    assert header.split() == [
        "NAMESPACE",
        "NAME",
        "PHASE",
        "STEP",
        "PROGRESS",
        "ETA",
        "REWARD",
        "RESTARTS",
        "AGE",
        "PREEMPTIONS",
        "ALGORITHM",
        "REASON",
    ]
    assert first.split()[:4] == ["rl", "demo", "Running", "3/40"] and first.split()[-3:] == ["2", "grpo", "AllRanksRunning"]
    assert second.split()[:3] == ["team-b", "other", "Queued"] and second.split()[-3:] == ["0", "grpo", "-"]
    assert list_table([a]).splitlines()[0].split()[0] == "NAME"  # the default is as it was


def test_the_reason_is_the_current_conditions() -> None:
    conditions = [
        {"type": "Running", "status": "False", "reason": "GangRestart", "lastTransitionTime": "2030-01-01T00:03:00Z"},
        {"type": "Restarting", "status": "True", "reason": "PodFailed", "lastTransitionTime": "2030-01-01T00:02:00Z"},
        {"type": "Initialized", "status": "True", "reason": "Fetched", "lastTransitionTime": "2030-01-01T00:04:00Z"},
    ]
    assert reason(job(phase="Restarting", conditions=conditions)) == "PodFailed"  # the phase's own, not the newest
    assert reason(job(phase="Starting", conditions=conditions)) == "Fetched"  # else the newest that holds
    assert reason(job()) == "-"


def test_status_wide_adds_the_algorithm_model_times_and_transitions() -> None:
    text = status_text(
        job(
            phase="Running",
            startTime="2030-01-01T00:00:30Z",
            conditions=[
                {
                    "type": "Running",
                    "status": "True",
                    "reason": "AllRanksRunning",
                    "message": "all 2 pods are running",
                    "lastTransitionTime": "2030-01-01T00:01:00Z",
                }
            ],
        ),
        wide=True,
    )
    for line in (
        "Algorithm:    grpo",
        "Model:        /m",
        "Created:      2030-01-01T00:00:00Z",
        "Started:      2030-01-01T00:00:30+00:00",
        "Completed:    -",
    ):
        assert line in text.splitlines(), (line, text)
    assert text.splitlines()[-2].split() == ["TYPE", "STATUS", "REASON", "LAST", "TRANSITION", "MESSAGE"]
    assert "2030-01-01T00:01:00+00:00" in text.splitlines()[-1]
    assert "Algorithm:    grpo" in status_text(job(), wide=True) and "Algorithm" not in status_text(job())


def test_yaml_and_json_are_the_api_objects_as_kubectl_prints_them() -> None:
    live = {
        "apiVersion": "kuberl.dev/v1alpha1",
        "kind": "RLJob",
        "spec": {"future": {"field": 1}},
        "metadata": {"name": "a", "namespace": "rl", "managedFields": [{"manager": "kubectl"}]},
        "status": {"phase": "Running"},
    }
    printed = yaml.safe_load(dump(live, "yaml"))
    assert printed["metadata"] == {"name": "a", "namespace": "rl"} and printed["spec"] == {"future": {"field": 1}}
    assert json.loads(dump(live, "json")) == printed
    text = dump(as_list([live, {**live, "metadata": {"name": "b", "namespace": "rl"}}]), "yaml")
    listed = yaml.safe_load(text)
    assert (listed["apiVersion"], listed["kind"], [i["metadata"]["name"] for i in listed["items"]]) == ("v1", "List", ["a", "b"])
    assert text.splitlines()[0] == "apiVersion: v1"  # sorted keys, as kubectl prints
    # What list -o yaml prints, kuberl reads back item by item (kubectl apply -f of it too).
    assert [d.content["metadata"]["name"] for d in read_documents(text, "list.yaml")] == ["a", "b"]


def test_a_manifest_from_a_stream_is_read_within_the_file_bound() -> None:
    class Endless(io.RawIOBase):
        name, asked = "<stdin>", 0

        def readable(self) -> bool:
            return True

        def readinto(self, buffer) -> int:
            self.asked += len(buffer)
            buffer[:] = b"#" * len(buffer)
            return len(buffer)

    endless = Endless()
    with pytest.raises(ManifestError, match=r"^<stdin>: larger than 3 MiB"):
        read_manifest(io.BufferedReader(endless))
    assert endless.asked <= MAX_FILE_BYTES + 1 + io.DEFAULT_BUFFER_SIZE
    assert read_manifest(io.BytesIO(b"kind: x\n"), "stdin") == "kind: x\n"
    with pytest.raises(ManifestError, match=r"^stdin: cannot read: 'utf-8' codec"):
        read_manifest(io.BytesIO(b"\xff\xfe"), "stdin")


def test_submit_reads_stdin_and_errors_are_one_line(unreachable: tuple[Path, str]) -> None:
    kubeconfig, server = unreachable
    kuberl = BIN / "kuberl"
    # A good manifest on stdin gets as far as the API server; a bad one is refused naming stdin, before any request.
    good = yaml.safe_dump(small_job("from-stdin"))
    assert one_line(run(kuberl, "submit", "-f", "-", "--kubeconfig", kubeconfig, stdin=good)).startswith(
        f"error: cannot reach the API server at {server}"
    )
    assert one_line(run(BIN / "kubectl-rl", "submit", "-", "--kubeconfig", kubeconfig, stdin=good)).startswith(
        "error: cannot reach the API server"
    )
    bad = yaml.safe_dump(small_job("bad", rollout={"samplesPerPrompt": 0}))
    assert "spec.rollout.samplesPerPrompt" in one_line(run(kuberl, "submit", "-f", "-", "--kubeconfig", kubeconfig, stdin=bad))
    assert one_line(run(kuberl, "submit", "-f", "-", "--kubeconfig", kubeconfig, stdin="")).startswith("error: <stdin>: no RLJob")
    assert (
        one_line(run(kuberl, "submit", "a.yaml", "-f", "b.yaml", "--kubeconfig", kubeconfig))
        == "error: name the manifest once: kuberl submit FILE, or -f FILE (-f - reads it from stdin)"
    )


def test_version_names_the_client_and_asks_a_configured_cluster(unreachable: tuple[Path, str], tmp_path: Path) -> None:
    from importlib.metadata import version

    client_line = f"kuberl {version('kuberl')} (API kuberl.dev/v1alpha1)\n"
    alone = run(BIN / "kuberl", "version", "--client", "--kubeconfig", unreachable[0])
    assert (alone.returncode, alone.stdout, alone.stderr) == (0, client_line, "")
    # No kubeconfig anywhere: nothing to ask, the client's line only.
    nowhere = run(BIN / "kubectl-rl", "version", env={"HOME": str(tmp_path), "KUBECONFIG": ""})
    assert (nowhere.returncode, nowhere.stdout, nowhere.stderr) == (0, client_line, "")
    # A cluster that does not answer: the client's line, then the error, as kubectl version does.
    failed = run(BIN / "kuberl", "version", "--kubeconfig", unreachable[0])
    assert failed.stdout == client_line and one_line(failed).startswith("error: cannot reach the API server")


def test_the_operator_is_its_deployments_version_label_and_image() -> None:
    assert [image_tag(i) for i in ("r:5000/kuberl-operator:0.2.0", "kuberl-operator", "r/k@sha256:ab", "r/k:1.0@sha256:ab", None)] == [
        "0.2.0",
        None,
        None,
        "1.0",
        None,
    ]
    deployment = client.V1Deployment(
        metadata=client.V1ObjectMeta(name="kuberl", namespace="kuberl-system", labels={"app.kubernetes.io/version": "0.1.0"}),
        spec=client.V1DeploymentSpec(
            replicas=1,
            selector=client.V1LabelSelector(),
            template=client.V1PodTemplateSpec(
                spec=client.V1PodSpec(containers=[client.V1Container(name="operator", image="r/kuberl-operator:0.1.1")])
            ),
        ),
        status=client.V1DeploymentStatus(ready_replicas=1),
    )
    found = OperatorDeployment.of(deployment)
    assert found.line() == "operator: 0.1.0 (Deployment kuberl-system/kuberl, image r/kuberl-operator:0.1.1, 1/1 ready)"
    deployment.metadata.labels, deployment.status = {}, None
    assert (
        OperatorDeployment.of(deployment).line().startswith("operator: 0.1.1 (") and "0/1 ready" in OperatorDeployment.of(deployment).line()
    )


def kubeconfig_with(path: Path, *contexts: tuple[str, str]) -> Path:
    """A kubeconfig whose contexts (name, server) each have a cluster of their own; the first is current."""
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": contexts[0][0],
                "clusters": [{"name": n, "cluster": {"server": s}} for n, s in contexts],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": n, "context": {"cluster": n, "user": "u"}} for n, _ in contexts],
            }
        )
    )
    return path


def test_the_operator_finds_its_cluster_as_controllers_do(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kuberl.operator.control.manager import ConfigurationError, load_client_configuration

    first = kubeconfig_with(tmp_path / "first", ("one", "https://one.invalid:6443"))
    second = kubeconfig_with(tmp_path / "second", ("two", "https://two.invalid:6443"), ("three", "https://three.invalid:6443"))
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", f"{tmp_path / 'missing'}{os.pathsep}{second}")  # a list, as kubectl reads it
    assert load_client_configuration(None).host == "https://two.invalid:6443"
    assert load_client_configuration(None, "three").host == "https://three.invalid:6443"
    assert load_client_configuration(str(first)).host == "https://one.invalid:6443"  # the flag wins
    with pytest.raises(ConfigurationError, match=r"^no context 'four' in the kubeconfig .*; its contexts: two, three$"):
        load_client_configuration(None, "four")
    monkeypatch.delenv("KUBECONFIG")
    with pytest.raises(ConfigurationError, match=r"^no kubeconfig: pass --kubeconfig or set KUBECONFIG"):
        load_client_configuration(None)
    (tmp_path / ".kube").mkdir()
    (tmp_path / ".kube" / "config").write_text(first.read_text())
    assert load_client_configuration(None).host == "https://one.invalid:6443"  # last: ~/.kube/config


def test_kuberl_operator_fails_in_one_line_on_a_missing_or_broken_kubeconfig(tmp_path: Path) -> None:
    kuberl = BIN / "kuberl"
    env = {"HOME": str(tmp_path), "KUBERNETES_SERVICE_HOST": ""}
    assert (
        one_line(run(kuberl, "operator", env={**env, "KUBECONFIG": str(tmp_path / "none")}), 3)
        == f"kuberl operator: no kubeconfig at {tmp_path / 'none'}"
    )
    (tmp_path / "broken").write_text("clusters: [\n")
    assert one_line(run(kuberl, "operator", "--kubeconfig", tmp_path / "broken", env=env), 3).startswith(
        f"kuberl operator: cannot use the kubeconfig {tmp_path / 'broken'}: "
    )
    good = kubeconfig_with(tmp_path / "good", ("one", "https://one.invalid:6443"))
    assert (
        one_line(run(kuberl, "operator", "--context", "two", env={**env, "KUBECONFIG": str(good)}), 3)
        == f"kuberl operator: no context 'two' in the kubeconfig {good}; its contexts: one"
    )
    assert one_line(run(kuberl, "operator", env={**env, "KUBECONFIG": ""}), 3).startswith("kuberl operator: no kubeconfig: ")


def test_logs_previous_shows_how_the_last_failed_attempt_ended() -> None:
    from kuberl.operator.api import RLJobStatus
    from kuberl.operator.api.status import AttemptFailure
    from kuberl.operator.cli.jobs import previous_attempt
    from kuberl.operator.validation.manifest import load_rljobs

    job = load_rljobs(Path(__file__).parent.parent / "examples" / "dpo.yaml")[0]
    assert previous_attempt(job) == []
    job.status = RLJobStatus(
        failures=[
            AttemptFailure(attempt=0, pod="dpo-actor-0-1-a", role="actor", exit_code=137, reason="OOMKilled", message=""),
            AttemptFailure(
                attempt=1, pod="dpo-critic-0-0-b", role="critic", exit_code=1, reason="Error", message="step 12\nRuntimeError: boom"
            ),
        ]
    )
    assert previous_attempt(job) == [
        "attempt 1 ended: pod dpo-critic-0-0-b (role critic, exit code 1, Error)",
        "[dpo-critic-0-0-b] step 12",
        "[dpo-critic-0-0-b] RuntimeError: boom",
    ]
    assert previous_attempt(job, role="actor") == ["attempt 0 ended: pod dpo-actor-0-1-a (role actor, exit code 137, OOMKilled)"]
    assert previous_attempt(job, role="ref") == []
