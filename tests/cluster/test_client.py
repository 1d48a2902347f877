"""kuberl.client and the job commands (`kuberl submit|list|status|logs|wait|suspend|resume|delete`, `kubectl rl`) against
the real control plane, with the operator running: every client call and every command, --namespace and --context,
RBAC's refusal and a cluster without the CRD, each in one line; and a running job's progress, ETA and validation
reward in `kubectl get rlj` and `kubectl rl status`, as the engine reported them.

kwok's pods have no log (the API server answers 404 for pods/log), so `logs` here shows which pod a rank or role
selects; the lines themselves, `-f` included, come from a real pod in tests/node/test_job_logs.py.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from kuberl.client import (
    CRDNotInstalledError,
    ForbiddenError,
    ImmutableFieldsError,
    InvalidJobError,
    NotFoundError,
    PhaseError,
    RLJobClient,
    WaitTimeoutError,
)
from kuberl.operator.api import RLJob
from kuberl.operator.cli.jobs import duration
from kuberl.operator.validation.manifest import parse_rljob
from kuberl.operator.testing.rljobs import eventually, fail_pod, live_pods, new_namespace, small_job, status, wait_phase

REPO = Path(__file__).resolve().parent.parent.parent
VENV_BIN = Path(sys.executable).parent


def run(*args: str, env: dict[str, str] | None = None, timeout: float = 120, input: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(a) for a in args], capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})}, input=input
    )


def kuberl(kubeconfig: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return run(VENV_BIN / "kuberl", *args, "--kubeconfig", kubeconfig, timeout=timeout)


def service_account_kubeconfig(plane, namespace: str, name: str, path: Path) -> Path:
    """A kubeconfig of a new ServiceAccount of `namespace`: a user with only the rights a test then grants it."""
    core = client.CoreV1Api(plane.api_client())
    core.create_namespaced_service_account(namespace, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name=name)))
    token = core.create_namespaced_service_account_token(
        name, namespace, client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(audiences=[]))
    ).status.token
    return plane.kubeconfig_for_token(token, path)


def one_line_error(result: subprocess.CompletedProcess) -> str:
    """A failed command: exit 1, nothing on stdout, one line on stderr and no traceback."""
    assert result.returncode == 1, (result.returncode, result.stdout, result.stderr)
    assert result.stdout == "" and "Traceback" not in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and result.stderr.startswith("error: "), result.stderr
    return result.stderr.strip()


@pytest.fixture(scope="module")
def kubeconfig(control_plane, tmp_path_factory) -> Path:
    """The admin's kubeconfig (context kuberl-test, namespace default), copied: the tests add contexts to it."""
    path = tmp_path_factory.mktemp("client") / "kubeconfig"
    path.write_text(control_plane.kubeconfig.read_text())
    path.chmod(0o600)
    return path


@pytest.fixture(scope="module")
def ns(control_plane, rljob_crd) -> str:
    return new_namespace(control_plane, "client")


def write_job(path: Path, doc: dict) -> Path:
    path.write_text(yaml.safe_dump(doc))
    return path


# --- the Python client ----------------------------------------------------------------------------


def test_the_client_submits_reads_waits_suspends_resumes_and_deletes(control_plane, operator, kubeconfig, ns, tmp_path) -> None:
    jobs = RLJobClient(kubeconfig=kubeconfig, namespace=ns)
    assert (jobs.namespace, jobs.context) == (ns, "kuberl-test")

    # submit takes a path, a dict or an RLJob model, and returns the typed job the server stored.
    from_path = jobs.submit(write_job(tmp_path / "a.yaml", small_job("from-path")))
    from_dict = jobs.submit(small_job("from-dict"))
    from_model = jobs.submit(parse_rljob(small_job("from-model"), "test"))
    for job in (from_path, from_dict, from_model):
        assert isinstance(job, RLJob) and job.metadata.namespace == ns and job.metadata.uid
    assert [j.metadata.name for j in jobs.list()] == ["from-dict", "from-model", "from-path"]

    # wait returns the status once the phase is reached; get has it too, typed.
    running = jobs.wait("from-path", "Running", timeout=60)
    assert running.phase == "Running" and running.roles["actor"].ready == 2
    assert jobs.get("from-path").status.phase == "Running"
    with pytest.raises(WaitTimeoutError, match=r"from-path is not Succeeded after 0.5 s: it is Running"):
        jobs.wait("from-path", "Succeeded", timeout=0.5)

    # Submitting again: the same job changes nothing; a new runPolicy is an update; anything else is refused, by name.
    assert jobs.submit(small_job("from-path")).metadata.resource_version == jobs.get("from-path").metadata.resource_version
    updated = jobs.submit(small_job("from-path", runPolicy={"backoffLimit": 5}))
    assert updated.spec.run_policy.backoff_limit == 5 and jobs.get("from-path").spec.run_policy.backoff_limit == 5
    changed = small_job("from-path", trainer={"totalSteps": 99, "promptsPerStep": 4}, runPolicy={"backoffLimit": 6})
    with pytest.raises(
        ImmutableFieldsError,
        match=r"^spec\.trainer cannot change on the live RLJob .*/from-path \(only "
        r"spec\.runPolicy can\): delete it first",
    ):
        jobs.submit(changed)
    assert jobs.get("from-path").spec.run_policy.backoff_limit == 5  # nothing of it was sent

    # suspend and resume are runPolicy.suspend: the pods go, and come back.
    assert jobs.suspend("from-path").spec.run_policy.suspend is True
    assert jobs.wait("from-path", "Suspended", timeout=60).phase == "Suspended"
    eventually(lambda: not live_pods(control_plane, ns, "from-path"), 60, "the suspended job's pods to go")
    assert jobs.resume("from-path").spec.run_policy.suspend is False
    assert jobs.wait("from-path", "Running", timeout=60).roles["actor"].ready == 2

    # A job that ends in another phase than the one waited for: a clear error with the reason.
    jobs.submit(small_job("doomed", runPolicy={"backoffLimit": 0}))
    jobs.wait("doomed", "Running", timeout=60)
    fail_pod(control_plane, live_pods(control_plane, ns, "doomed")[0])
    with pytest.raises(PhaseError, match=r"doomed ended Failed, not Succeeded: BackoffLimitExceeded"):
        jobs.wait("doomed", "Succeeded", timeout=60)

    for name in ("from-path", "from-dict", "from-model", "doomed"):
        jobs.delete(name)
    with pytest.raises(NotFoundError, match=f"^RLJob from-path not found in namespace {ns}$"):
        jobs.get("from-path")
    with pytest.raises(NotFoundError):
        jobs.delete("from-path")
    assert jobs.list() == []


def test_submit_validates_before_sending(control_plane, rljob_crd, kubeconfig, ns, tmp_path) -> None:
    jobs = RLJobClient(kubeconfig=kubeconfig, namespace=ns)
    with pytest.raises(InvalidJobError) as caught:  # the API's rules (the parser)
        jobs.submit(small_job("bad", rollout={"samplesPerPrompt": 0}))
    assert "spec.rollout.samplesPerPrompt" in str(caught.value)
    with pytest.raises(InvalidJobError, match=r"spec.model.path: /elsewhere/m is under no volumeMount"):  # the cluster's
        jobs.submit(small_job("bad", model={"path": "/elsewhere/m"}))
    other = new_namespace(control_plane, "client-other")
    with pytest.raises(InvalidJobError, match=f"metadata.namespace is {other}, but the namespace asked for is {ns}"):
        jobs.submit({**small_job("bad"), "metadata": {"name": "bad", "namespace": other}})
    with pytest.raises(NotFoundError, match="namespace no-such-namespace not found"):
        RLJobClient(kubeconfig=kubeconfig, namespace="no-such-namespace").submit(small_job("bad"))
    assert jobs.list() == []


def test_logs_picks_the_pod_of_a_rank_or_a_role(control_plane, operator, kubeconfig, ns) -> None:
    jobs = RLJobClient(kubeconfig=kubeconfig, namespace=ns)
    jobs.submit(small_job("talker"))
    jobs.wait("talker", "Running", timeout=60)
    # Rank 0 is the actor's first pod (replicated job "actor"), rank 1 its second ("actor-peers").
    by_host = {p.spec.hostname: p.metadata.name for p in live_pods(control_plane, ns, "talker")}
    pods = {"0": by_host["talker-actor-0-0"], "1": by_host["talker-actor-peers-0-0"]}
    # kwok's kubelet serves no log: the error names the pod that rank 1 (the second actor pod) maps to.
    with pytest.raises(NotFoundError, match=f"^no log of pod {pods['1']} in namespace {ns}: "):
        list(jobs.logs("talker", rank=1))
    with pytest.raises(NotFoundError, match=f"^no log of pod {pods['0']} "):
        list(jobs.logs("talker", role="actor", rank=0))
    with pytest.raises(NotFoundError, match=r"talker has no pod running rank 7 \(its ranks: 0-1\): it is Running"):
        list(jobs.logs("talker", rank=7))
    with pytest.raises(NotFoundError, match=r"talker has no pods of role critic \(its roles with pods: actor\)"):
        list(jobs.logs("talker", role="critic"))
    with pytest.raises(NotFoundError, match="^RLJob nobody not found"):
        list(jobs.logs("nobody"))
    jobs.delete("talker")


# --- the commands ---------------------------------------------------------------------------------


def test_every_command(control_plane, operator, kubeconfig, ns, tmp_path) -> None:
    manifest = write_job(tmp_path / "job.yaml", small_job("cli-job", trainer={"totalSteps": 10, "promptsPerStep": 4}))
    submitted = kuberl(kubeconfig, "submit", manifest, "-n", ns)
    assert (submitted.returncode, submitted.stdout, submitted.stderr) == (0, "cli-job\n", "")
    waited = kuberl(kubeconfig, "wait", "cli-job", "--for", "Running", "--timeout", "60", "-n", ns)
    assert (waited.returncode, waited.stdout) == (0, "cli-job Running\n"), waited.stderr

    listed = kuberl(kubeconfig, "list", "-n", ns)
    header, row = listed.stdout.splitlines()
    assert header.split() == ["NAME", "PHASE", "STEP", "PROGRESS", "ETA", "REWARD", "RESTARTS", "AGE"]
    assert row.split()[:7] == ["cli-job", "Running", "-", "-", "unknown", "-", "0"], row

    shown = kuberl(kubeconfig, "status", "cli-job", "-n", ns)
    assert shown.returncode == 0, shown.stderr
    fields = dict(line.split(":", 1) for line in shown.stdout.splitlines() if line and not line.startswith(" "))
    assert fields["Name"].strip() == "cli-job" and fields["Phase"].strip() == "Running"
    assert fields["Restarts"].strip() == "0" and fields["Preemptions"].strip() == "0" and fields["Checkpoint"].strip() == "-"
    assert "  actor:      2 active, 2 ready, 0 succeeded, 0 failed" in shown.stdout
    assert any(line.split()[:3] == ["Running", "True", "AllRanksRunning"] for line in shown.stdout.splitlines()), shown.stdout

    # logs: the rank's pod is found; kwok has no log to give (tests/node shows the lines).
    logs = kuberl(kubeconfig, "logs", "cli-job", "--rank", "0", "-n", ns)
    assert one_line_error(logs).startswith("error: no log of pod cli-job-actor-0-0-")

    assert kuberl(kubeconfig, "suspend", "cli-job", "-n", ns).stdout.startswith("cli-job suspended")
    assert kuberl(kubeconfig, "wait", "cli-job", "--for", "Suspended", "--timeout", "1m", "-n", ns).returncode == 0
    assert kuberl(kubeconfig, "resume", "cli-job", "-n", ns).stdout.startswith("cli-job resumed")
    assert kuberl(kubeconfig, "wait", "cli-job", "--for", "Running", "--timeout", "60", "-n", ns).returncode == 0

    # Errors: one line each, exit 1.
    assert (
        one_line_error(kuberl(kubeconfig, "wait", "cli-job", "--timeout", "1", "-n", ns))
        == f"error: {ns}/cli-job is not Succeeded after 1 s: it is Running"
    )
    assert one_line_error(kuberl(kubeconfig, "wait", "cli-job", "--for", "Done", "-n", ns)).startswith(
        "error: 'Done' is not a phase of an RLJob; the phases: Pending, "
    )
    changed = write_job(tmp_path / "changed.yaml", small_job("cli-job", trainer={"totalSteps": 20, "promptsPerStep": 4}))
    assert one_line_error(kuberl(kubeconfig, "submit", changed, "-n", ns)).startswith(
        f"error: spec.trainer cannot change on the live RLJob {ns}/cli-job (only spec.runPolicy can)"
    )
    assert (
        one_line_error(kuberl(kubeconfig, "status", "nothing-here", "-n", ns)) == f"error: RLJob nothing-here not found in namespace {ns}"
    )
    invalid = kuberl(kubeconfig, "submit", write_job(tmp_path / "bad.yaml", small_job("bad", rollout={"samplesPerPrompt": 0})), "-n", ns)
    assert invalid.returncode == 1 and "spec.rollout.samplesPerPrompt" in invalid.stderr and "Traceback" not in invalid.stderr

    deleted = kuberl(kubeconfig, "delete", "cli-job", "-n", ns)
    assert (deleted.returncode, deleted.stdout) == (0, "cli-job deleted\n")
    assert one_line_error(kuberl(kubeconfig, "delete", "cli-job", "-n", ns)) == f"error: RLJob cli-job not found in namespace {ns}"
    empty = kuberl(kubeconfig, "list", "-n", ns)
    assert (empty.returncode, empty.stdout, empty.stderr) == (0, "", f"No RLJobs in namespace {ns}.\n")


def test_namespace_and_context_choose_where(control_plane, operator, kubeconfig, tmp_path) -> None:
    """--namespace wins; else the --context's namespace; else the current context's."""
    ours = new_namespace(control_plane, "client-ctx")
    config = yaml.safe_load(kubeconfig.read_text())
    second = tmp_path / "kubeconfig"
    config["contexts"].append({"name": "second", "context": {**config["contexts"][0]["context"], "namespace": ours}})
    second.write_text(yaml.safe_dump(config))
    assert RLJobClient(kubeconfig=second).namespace == "default"
    assert RLJobClient(kubeconfig=second, context="second").namespace == ours
    assert RLJobClient(kubeconfig=second, context="second", namespace="elsewhere").namespace == "elsewhere"

    submitted = run(
        VENV_BIN / "kuberl",
        "submit",
        write_job(tmp_path / "j.yaml", small_job("in-context")),
        "--kubeconfig",
        second,
        "--context",
        "second",
    )
    assert (submitted.returncode, submitted.stdout) == (0, "in-context\n"), submitted.stderr
    assert status(control_plane, ours, "in-context") is not None
    in_context = run(VENV_BIN / "kuberl", "list", "--kubeconfig", second, "--context", "second")
    assert [line.split()[0] for line in in_context.stdout.splitlines()[1:]] == ["in-context"]
    in_default = run(VENV_BIN / "kuberl", "list", "--kubeconfig", second)
    assert "in-context" not in in_default.stdout
    by_flag = run(VENV_BIN / "kuberl", "status", "in-context", "--kubeconfig", second, "-n", ours)
    assert by_flag.returncode == 0 and f"Namespace:    {ours}" in by_flag.stdout
    # kubectl rl takes the options before the command too (kubectl passes them as typed).
    before = run(VENV_BIN / "kubectl-rl", "--kubeconfig", second, "--context", "second", "status", "in-context")
    assert before.returncode == 0 and "Name:         in-context" in before.stdout, before.stderr
    assert (
        one_line_error(run(VENV_BIN / "kuberl", "list", "--kubeconfig", second, "--context", "third"))
        == f"error: no context 'third' in the kubeconfig {second}; its contexts: kuberl-test, second"
    )
    RLJobClient(kubeconfig=second, context="second").delete("in-context")


def test_a_user_rbac_refuses_gets_one_line(control_plane, rljob_crd, ns, tmp_path) -> None:
    config = service_account_kubeconfig(control_plane, ns, "outsider", tmp_path / "outsider.kubeconfig")
    refused = f"your user may not list rljobs in namespace {ns} (user system:serviceaccount:{ns}:outsider)"
    with pytest.raises(ForbiddenError, match=f"^{re.escape(refused)}: ask your cluster admin"):
        RLJobClient(kubeconfig=config, namespace=ns).list()
    with pytest.raises(ForbiddenError, match=f"your user may not create rljobs in namespace {ns}"):
        RLJobClient(kubeconfig=config, namespace=ns).submit(small_job("not-mine"))
    line = one_line_error(run(VENV_BIN / "kuberl", "list", "--kubeconfig", config, "-n", ns))
    assert line.startswith(f"error: {refused}")
    line = one_line_error(run(VENV_BIN / "kuberl", "status", "x", "--kubeconfig", config, "-n", ns))
    assert line.startswith(f"error: your user may not get rljobs in namespace {ns}")


def test_the_role_the_docs_give_a_user_is_enough(control_plane, operator, ns, tmp_path) -> None:
    """docs/cli.md's Role, bound to a ServiceAccount: every call works (logs is allowed; kwok only has none to give)."""
    page = (Path(__file__).resolve().parents[2] / "docs" / "cli.md").read_text()
    [role] = [yaml.safe_load(b) for b in re.findall(r"```yaml\n(.*?)```", page, flags=re.S) if "kind: Role" in b]
    role["metadata"]["namespace"] = ns
    rbac = client.RbacAuthorizationV1Api(control_plane.api_client())
    rbac.create_namespaced_role(ns, role)
    rbac.create_namespaced_role_binding(
        ns,
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "member"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role["metadata"]["name"]},
            "subjects": [{"kind": "ServiceAccount", "name": "member", "namespace": ns}],
        },
    )
    member = RLJobClient(kubeconfig=service_account_kubeconfig(control_plane, ns, "member", tmp_path / "member.kubeconfig"), namespace=ns)

    def allowed() -> bool:  # the binding may take a moment to reach the authorizer
        try:
            member.list()
            return True
        except ForbiddenError:
            return False

    eventually(allowed, 20, "the RoleBinding to reach the authorizer")
    member.submit(small_job("members"))
    member.submit(small_job("members", runPolicy={"backoffLimit": 4}))
    assert member.wait("members", "Running", timeout=60).phase == "Running"
    assert [j.metadata.name for j in member.list()] == ["members"]
    with pytest.raises(NotFoundError, match="^no log of pod members-actor-0-0-"):
        list(member.logs("members", rank=0))
    member.suspend("members")
    member.resume("members")
    member.delete("members")


@pytest.fixture(scope="module")
def plane_without_crd(kube_binaries_dir, tmp_path_factory):
    """A control plane of its own (about 10 s to start, no nodes): the CRD is cluster-wide, so only a cluster
    that never had it shows what a user of one sees."""
    from kuberl.operator.testing.control_plane import start_control_plane

    plane = start_control_plane(kube_binaries_dir, tmp_path_factory.mktemp("no-crd"), pools=())
    yield plane
    plane.stop()


def test_a_cluster_without_the_crd_gets_one_line(plane_without_crd, tmp_path) -> None:
    plane = plane_without_crd
    message = f"the RLJob CRD is not installed in the cluster at {plane.server}: helm install the chart"
    jobs = RLJobClient(kubeconfig=plane.kubeconfig)
    for call in (jobs.list, lambda: jobs.get("x"), lambda: jobs.submit(small_job("x")), lambda: jobs.delete("x")):
        with pytest.raises(CRDNotInstalledError, match=f"^{re.escape(message)}"):
            call()
    for command in (("list",), ("status", "x"), ("submit", str(write_job(tmp_path / "x.yaml", small_job("x"))))):
        assert one_line_error(kuberl(plane.kubeconfig, *command)).startswith(f"error: {message}")


# --- progress, ETA and validation reward: what the engine reported, where a user looks ----------------


def test_progress_eta_and_validation_show_in_kubectl_get_and_kubectl_rl_status(
    control_plane, operator, kubeconfig, ns, kube_binaries_dir
) -> None:
    from kuberl.engine.runtime.progress import ProgressTracker

    jobs = RLJobClient(kubeconfig=kubeconfig, namespace=ns)
    jobs.submit(small_job("reporter", trainer={"totalSteps": 40, "promptsPerStep": 4}))
    jobs.wait("reporter", "Running", timeout=60)
    # The controller rank's reports, made by the engine's own code, written where it writes them.
    tracker = ProgressTracker(total_steps=40)
    for step, seconds in ((1, 9.0), (2, 7.5), (3, 7.0), (4, 6.5)):
        report = tracker.report(
            {"step": step, "step_seconds": seconds, "reward_mean": 0.375, **({"validation_reward_mean": 0.4375} if step == 2 else {})}, None
        )
    assert (report.eta_seconds, report.validation_step) == (pytest.approx(36 * 7.5), 2)
    client.CoreV1Api(control_plane.api_client()).patch_namespaced_config_map(
        "reporter-progress", ns, {"data": {"progress.json": report.to_json()}}
    )
    s = eventually(lambda: (x := status(control_plane, ns, "reporter")).get("step") == 4 and x, 30, "the report in the status")
    progress, eta = 100 * 4 // 40, round(report.eta_seconds)
    assert (s["progress"], s["etaSeconds"], s["validationReward"], s["validationStep"]) == (progress, eta, 0.4375, 2)

    # kubectl get: NAME PHASE STEP REWARD PROGRESS ETA AGE.
    header, row = control_plane.kubectl("get", "rlj", "reporter", "-n", ns).stdout.splitlines()
    assert header.split()[:6] == ["NAME", "PHASE", "STEP", "REWARD", "PROGRESS", "ETA"]
    assert row.split()[:6] == ["reporter", "Running", "4", "0.375", str(progress), str(eta)]

    # kubectl rl status, found by kubectl's own plugin lookup on PATH.
    env = {"PATH": f"{VENV_BIN}:{kube_binaries_dir}:{os.environ['PATH']}", "KUBECONFIG": str(kubeconfig)}
    listed = run(kube_binaries_dir / "kubectl", "plugin", "list", env=env)
    assert str(VENV_BIN / "kubectl-rl") in listed.stdout, listed.stdout + listed.stderr
    shown = run(kube_binaries_dir / "kubectl", "rl", "status", "reporter", "-n", ns, env=env)
    assert shown.returncode == 0, shown.stderr
    fields = {k: v.strip() for k, v in (line.split(":", 1) for line in shown.stdout.splitlines() if line and not line.startswith(" "))}
    assert fields["Step"] == f"4/40 ({progress}%)" and fields["Progress"] == f"{progress}%"
    assert fields["ETA"] == duration(eta) == "4m30s"
    assert fields["Reward"] == "0.375" and fields["Validation"] == "0.4375 at step 2"
    table = run(kube_binaries_dir / "kubectl", "rl", "list", "-n", ns, env=env).stdout.splitlines()
    assert table[1].split()[:6] == ["reporter", "Running", "4/40", f"{progress}%", "4m30s", "0.375"]
    jobs.delete("reporter")


# --- kubectl's habits: -A, -o yaml|json|wide, submit -f -, version, and `kuberl operator`'s kubeconfig ------------


def test_all_namespaces_and_the_output_formats(control_plane, operator, kubeconfig, ns, tmp_path) -> None:
    other = new_namespace(control_plane, "client-all")
    from_stdin = run(
        VENV_BIN / "kuberl", "submit", "-f", "-", "-n", ns, "--kubeconfig", kubeconfig, input=yaml.safe_dump(small_job("piped"))
    )
    assert (from_stdin.returncode, from_stdin.stdout) == (0, "piped\n"), from_stdin.stderr
    from_flag = run(
        VENV_BIN / "kubectl-rl",
        "submit",
        "-f",
        write_job(tmp_path / "j.yaml", small_job("flagged")),
        "-n",
        other,
        "--kubeconfig",
        kubeconfig,
    )
    assert (from_flag.returncode, from_flag.stdout) == (0, "flagged\n"), from_flag.stderr
    jobs = RLJobClient(kubeconfig=kubeconfig, namespace=ns)
    jobs.wait("piped", "Running", timeout=60)

    # -A: every namespace's jobs, NAMESPACE first; other tests' jobs may be listed too.
    listed = kuberl(kubeconfig, "list", "-A")
    assert listed.returncode == 0, listed.stderr
    header, *rows = listed.stdout.splitlines()
    assert header.split()[:3] == ["NAMESPACE", "NAME", "PHASE"]
    assert {(ns, "piped"), (other, "flagged")} <= {tuple(r.split()[:2]) for r in rows}, rows
    header, *rows = kuberl(kubeconfig, "list", "-n", ns, "-o", "wide").stdout.splitlines()
    assert header.split()[-4:] == ["AGE", "PREEMPTIONS", "ALGORITHM", "REASON"]
    assert [r.split()[-3:] for r in rows] == [["0", "grpo", "AllRanksRunning"]], rows

    # yaml and json: the objects as the API server returns them.
    stored = client.CustomObjectsApi(control_plane.api_client()).get_namespaced_custom_object(
        "kuberl.dev", "v1alpha1", ns, "rljobs", "piped"
    )
    listed = yaml.safe_load(kuberl(kubeconfig, "list", "-n", ns, "-o", "yaml").stdout)
    assert (listed["kind"], [i["metadata"]["uid"] for i in listed["items"]]) == ("List", [stored["metadata"]["uid"]])
    shown = json.loads(kuberl(kubeconfig, "status", "piped", "-n", ns, "-o", "json").stdout)
    assert shown["spec"] == stored["spec"] and shown["metadata"]["uid"] == stored["metadata"]["uid"]
    assert shown["status"]["phase"] == "Running" and "managedFields" not in shown["metadata"]
    everywhere = json.loads(kuberl(kubeconfig, "list", "-A", "-o", "json").stdout)
    assert {(ns, "piped"), (other, "flagged")} <= {(i["metadata"]["namespace"], i["metadata"]["name"]) for i in everywhere["items"]}
    wide = kuberl(kubeconfig, "status", "piped", "-n", ns, "-o", "wide").stdout
    assert "Algorithm:    grpo" in wide and "LAST TRANSITION" in wide
    jobs.delete("piped")
    RLJobClient(kubeconfig=kubeconfig, namespace=other).delete("flagged")


def test_a_user_who_may_not_list_everywhere_gets_one_line(control_plane, rljob_crd, ns, tmp_path) -> None:
    config = service_account_kubeconfig(control_plane, ns, "local", tmp_path / "local.kubeconfig")
    assert one_line_error(kuberl(config, "list", "-A")) == (
        "error: your user may not list rljobs across all namespaces (user "
        f"system:serviceaccount:{ns}:local): ask your cluster admin for a ClusterRole that grants it, or name a namespace (-n)"
    )
    # version: the Deployments of kuberl-system are not the user's to list either: said, not an error.
    shown = kuberl(config, "version")
    assert shown.returncode == 0 and shown.stdout.splitlines()[1].startswith(
        "operator: unknown (your user may not list deployments in namespace kuberl-system"
    ), shown.stdout


def test_version_names_the_operator_the_chart_installed(control_plane, rljob_crd, kubeconfig) -> None:
    from importlib.metadata import version

    where = new_namespace(control_plane, "client-version")
    absent = kuberl(kubeconfig, "version", "-n", where)
    assert (absent.returncode, absent.stdout.splitlines()) == (
        0,
        [
            f"kuberl {version('kuberl')} (API kuberl.dev/v1alpha1)",
            f"operator: not found (no Deployment labelled app.kubernetes.io/name=kuberl,app.kubernetes.io/component=operator in "
            f"namespace {where})",
        ],
    ), absent.stderr
    # The labels and image of helm/kuberl/templates/deployment.yaml (no replicas: nothing needs to run).
    labels = {"app.kubernetes.io/name": "kuberl", "app.kubernetes.io/component": "operator", "app.kubernetes.io/version": "0.1.0"}
    client.AppsV1Api(control_plane.api_client()).create_namespaced_deployment(
        where,
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "kuberl", "labels": labels},
            "spec": {
                "replicas": 0,
                "selector": {"matchLabels": {"app": "op"}},
                "template": {
                    "metadata": {"labels": {"app": "op"}},
                    "spec": {"containers": [{"name": "operator", "image": "registry.invalid/kuberl-operator:0.1.0"}]},
                },
            },
        },
    )
    line = f"operator: 0.1.0 (Deployment {where}/kuberl, image registry.invalid/kuberl-operator:0.1.0, 0/0 ready)"
    assert kuberl(kubeconfig, "version", "-n", where).stdout.splitlines()[1:] == [line]
    assert line in run(VENV_BIN / "kubectl-rl", "version", "--kubeconfig", kubeconfig).stdout.splitlines()  # every namespace


def test_the_operator_takes_kubeconfig_and_context(control_plane, rljob_crd, kubeconfig, tmp_path) -> None:
    """$KUBECONFIG, and --context over a current context that points nowhere; a bad one is one line."""
    import urllib.request

    from kuberl.operator.cli.ports import free_port
    from kuberl.operator.testing.operator_process import TEST_TRAINER_IMAGE

    config = yaml.safe_load(kubeconfig.read_text())
    good = config["contexts"][0]["context"]
    config["clusters"].append({"name": "nowhere", "cluster": {"server": f"https://127.0.0.1:{free_port()}"}})
    config["contexts"] = [{"name": "nowhere", "context": {**good, "cluster": "nowhere"}}, {"name": "real", "context": good}]
    config["current-context"] = "nowhere"
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    env = {"KUBECONFIG": str(path)}
    refused = run(VENV_BIN / "kuberl", "operator", "--context", "neither", env=env)
    assert (refused.returncode, refused.stderr) == (
        3,
        f"kuberl operator: no context 'neither' in the kubeconfig {path}; its contexts: nowhere, real\n",
    )
    unreachable = run(VENV_BIN / "kuberl", "operator", env=env)
    assert unreachable.returncode == 1 and unreachable.stderr.startswith(
        "kuberl operator: cannot reach the API server at https://127.0.0.1:"
    )
    assert len(unreachable.stderr.splitlines()) == 1, unreachable.stderr

    health = free_port()
    log = tmp_path / "operator.log"
    proc = subprocess.Popen(
        [
            str(VENV_BIN / "kuberl"),
            "operator",
            "--context",
            "real",
            "--namespace",
            new_namespace(control_plane, "op-ctx"),
            "--metrics-port",
            str(free_port()),
            "--health-port",
            str(health),
            "--default-image",
            TEST_TRAINER_IMAGE,
        ],
        env={**os.environ, **env},
        stdout=open(log, "ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )

    def healthy() -> bool:
        assert proc.poll() is None, log.read_text()[-3000:]
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{health}/healthz", timeout=2) as answer:
                return answer.status == 200
        except OSError:
            return False

    try:
        eventually(healthy, 30, "the operator of context real to be healthy")
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(15)


def test_logs_previous_shows_the_failed_pod_of_the_last_attempt_after_it_is_gone(control_plane, operator, kubeconfig, ns) -> None:
    from kuberl.operator.testing.control_plane import EXIT_ANNOTATION

    create_job = client.CustomObjectsApi(control_plane.api_client())
    doc = small_job("previous", runPolicy={"backoffLimit": 2})
    create_job.create_namespaced_custom_object("kuberl.dev", "v1alpha1", ns, "rljobs", doc)
    wait_phase(control_plane, ns, "previous", "Running")
    never = one_line_error(kuberl(kubeconfig, "logs", "previous", "--previous", "-n", ns))
    assert "has no failed attempt" in never
    [_, victim] = sorted(live_pods(control_plane, ns, "previous"), key=lambda p: p.metadata.name)
    client.CoreV1Api(control_plane.api_client()).patch_namespaced_pod(
        victim.metadata.name,
        ns,
        {
            "metadata": {
                "annotations": {EXIT_ANNOTATION: "fail", "kuberl.dev/kwok-message": "step 4 done\nRuntimeError: Connection closed by peer"}
            }
        },
    )
    wait_phase(control_plane, ns, "previous", "Running", 90, restarts=1)
    eventually(lambda: all(p.metadata.uid != victim.metadata.uid for p in live_pods(control_plane, ns, "previous")), 60, "the pod to go")
    shown = kuberl(kubeconfig, "logs", "previous", "--previous", "-n", ns)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines() == [
        f"attempt 0 ended: pod {victim.metadata.name} (role actor, exit code 1, Error)",
        f"[{victim.metadata.name}] step 4 done",
        f"[{victim.metadata.name}] RuntimeError: Connection closed by peer",
    ]


def test_list_shows_every_job_it_can_read_and_warns_of_one_it_cannot(control_plane, operator, kubeconfig, tmp_path) -> None:
    """A job the API server took but this kuberl refuses (here: an option no estimator has; on a real cluster, another
    version's fields) hides no other job from `list`."""
    from kuberl.operator.validation.manifest import read_documents

    ns = new_namespace(control_plane, "client-unreadable")
    bad = REPO / "tests" / "manifests" / "bad" / "advantage-option-unknown.yaml"
    doc = read_documents(bad.read_text(), str(bad))[0].content
    doc["metadata"] = {"name": "unreadable"}
    api = client.CustomObjectsApi(control_plane.api_client())
    api.create_namespaced_custom_object("kuberl.dev", "v1alpha1", ns, "rljobs", doc)
    api.create_namespaced_custom_object("kuberl.dev", "v1alpha1", ns, "rljobs", small_job("readable"))
    listed = kuberl(kubeconfig, "list", "-n", ns)
    assert listed.returncode == 0, listed.stderr
    assert [line.split()[0] for line in listed.stdout.splitlines()] == ["NAME", "readable"]
    assert f"warning: RLJob {ns}/unreadable cannot be read by this kuberl" in listed.stderr
