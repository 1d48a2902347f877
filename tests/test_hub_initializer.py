"""`kuberl initialize` with huggingface_hub's real client against a STAND-IN for the Hugging Face hub
(kuberl.operator.testing.hub_server: the real hub cannot be reached here), and what the trainer pods
then load offline from the cache it filled.

The initializer runs as a process of its own, as in its pod: the engine config in KUBERL_CONFIG, the
stand-in as HF_ENDPOINT, a fresh HF_HUB_CACHE, its report in KUBERL_TERMINATION_LOG. The stand-in's
request log says what the client asked for and which files it downloaded.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from kuberl.engine.config.initialization import (
    PERMANENT_FAILURE_EXIT_CODE,
    TERMINATION_MESSAGE_LIMIT,
    FetchedRepo,
    InitializationReport,
)
from kuberl.engine.config.model import WeightsSource
from kuberl.engine.config.topology import EngineConfig
from kuberl.engine.hub.cache import endpoint_cache_dir
from kuberl.operator.testing.hub_server import HubServer

REPO = "kuberl-test/tiny-llama"
TOKEN = "hf_standin_0f3a9c2e7b41d8"
WRONG_TOKEN = "hf_wrong_77c1e5aa90b3f2"
SECRET = {"name": "hub-token", "key": "token"}


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from kuberl.engine.models.tiny import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)


@pytest.fixture
def hub(tiny_model: Path) -> Iterator[HubServer]:
    with HubServer("127.0.0.1", token=TOKEN) as server:
        server.add_repo(REPO, tiny_model)
        yield server


def commit_of(hub: HubServer) -> str:
    commit = hub.commit(REPO)
    assert commit is not None
    return commit


def folder_files(folder: Path) -> dict[str, int]:
    return {p.relative_to(folder).as_posix(): p.stat().st_size for p in folder.rglob("*") if p.is_file()}


def engine_config(**model: object) -> EngineConfig:
    return EngineConfig.model_validate(
        {
            "job": "j",
            "worldSize": 1,
            "masterPort": 29500,
            "model": model,
            "data": {"train": {"path": "d.jsonl"}},
            "algorithm": {"name": "grpo"},
            "reward": {"rules": [{"name": "math_answer"}]},
            "trainer": {"totalSteps": 1},
            "roles": {"actor": {"ranks": 1, "rankOffset": 0, "procsPerPod": 1, "layout": {"dp": 1}}},
        }
    )


@dataclass
class Run:
    code: int
    stdout: str
    stderr: str
    report: InitializationReport
    seconds: float


def initialize(
    tmp_path: Path, endpoint: str, cache: Path, config: EngineConfig, *, token: str | None = TOKEN, env: dict[str, str] | None = None
) -> Run:
    """`kuberl initialize` in a process of its own, with the environment its pod gets."""
    config_file = tmp_path / "engine-config.json"
    config_file.write_text(config.model_dump_json(by_alias=True, exclude_none=True))
    termination_log = tmp_path / "termination-log"
    termination_log.unlink(missing_ok=True)
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_"))}
    environ.update(
        KUBERL_CONFIG=str(config_file),
        HF_ENDPOINT=endpoint,
        HF_HUB_CACHE=str(cache),
        HF_HOME=str(tmp_path / "hf-home"),
        KUBERL_TERMINATION_LOG=str(termination_log),
        **(env or {}),
    )
    if token is not None:
        environ["HF_TOKEN"] = token
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "kuberl.engine.hub.initializer"], env=environ, capture_output=True, text=True, timeout=120)
    seconds = time.monotonic() - started
    assert termination_log.is_file(), f"no report written\n{done.stdout}\n{done.stderr}"
    text = termination_log.read_text()
    assert len(text.encode()) <= TERMINATION_MESSAGE_LIMIT
    return Run(done.returncode, done.stdout, done.stderr, InitializationReport.model_validate_json(text), seconds)


def test_a_cache_is_filled_once_and_then_reused_against_a_hub_stand_in(tmp_path: Path, hub: HubServer, tiny_model: Path) -> None:
    cache = tmp_path / "cache"
    commit = commit_of(hub)
    files = folder_files(tiny_model)

    # First run, revision main: every file fetched exactly once.
    first = initialize(tmp_path, hub.url, cache, engine_config(hubId=REPO))
    assert first.code == 0, first.stderr
    assert hub.file_fetches(REPO) == {name: 1 for name in files}
    assert first.report == InitializationReport(
        repos=[
            FetchedRepo(
                field="model",
                repo=REPO,
                revision=None,
                commit=commit,
                files=len(files),
                bytes=sum(files.values()),
                fetched_bytes=sum(files.values()),
            )
        ]
    )
    assert first.stdout.count("\n") == 1 and f"{REPO}@{commit[:12]}" in first.stdout
    storage = endpoint_cache_dir(cache, hub.url) / "models--kuberl-test--tiny-llama"  # the stand-in's own folder
    assert (storage / "refs" / "main").read_text() == commit  # what the offline trainer pods resolve main with

    # Second run, same cache, a branch: the hub resolves main, and no file is fetched again.
    hub.clear_requests()
    second = initialize(tmp_path, hub.url, cache, engine_config(hubId=REPO, revision="main"))
    assert second.code == 0, second.stderr
    assert hub.file_fetches(REPO) == {}
    assert [(r.method, r.path.split("?")[0]) for r in hub.requests] == [("GET", f"/api/models/{REPO}/revision/main")]
    assert second.report.repos[0].fetched_bytes == 0 and second.report.repos[0].bytes == sum(files.values())

    # Third run, the commit itself, complete in the cache: the hub's file list to check it against, no file.
    hub.clear_requests()
    third = initialize(tmp_path, hub.url, cache, engine_config(hubId=REPO, revision=commit))
    assert third.code == 0, third.stderr
    assert [(r.method, r.path.split("?")[0]) for r in hub.requests] == [("GET", f"/api/models/{REPO}/revision/{commit}")]
    assert third.report.repos[0].model_dump() == {**first.report.repos[0].model_dump(), "revision": commit, "fetched_bytes": 0}

    # A snapshot that lost a file is not complete: the commit is fetched again, that file only.
    (storage / "snapshots" / commit / "config.json").unlink()
    blob = next(b for b in (storage / "blobs").iterdir() if b.read_bytes() == (tiny_model / "config.json").read_bytes())
    blob.unlink()
    hub.clear_requests()
    fourth = initialize(tmp_path, hub.url, cache, engine_config(hubId=REPO, revision=commit))
    assert fourth.code == 0, fourth.stderr
    assert hub.file_fetches(REPO) == {"config.json": 1}
    assert fourth.report.repos[0].fetched_bytes == files["config.json"]


@pytest.mark.parametrize(
    "token,reason,names",
    [
        (WRONG_TOKEN, "TokenRefused", ["model.hubId " + REPO, "model.tokenSecretRef (Secret hub-token, key token)", "401"]),
        (None, "RepositoryNotFound", ["model.hubId " + REPO, "without a token", "model.tokenSecretRef"]),
    ],
)
def test_a_refused_token_is_permanent_and_never_printed_against_a_hub_stand_in(
    tmp_path: Path, hub: HubServer, token: str | None, reason: str, names: list[str]
) -> None:
    run = initialize(tmp_path, hub.url, tmp_path / "cache", engine_config(hubId=REPO, tokenSecretRef=SECRET), token=token)
    assert run.code == PERMANENT_FAILURE_EXIT_CODE
    assert run.report.reason == reason and run.report.repos == []
    for name in names:
        assert name in (run.report.message or ""), run.report.message
    assert run.report.message in run.stdout
    report = run.report.to_json()
    for secret in (TOKEN, WRONG_TOKEN):
        assert secret not in run.stdout and secret not in run.stderr and secret not in report
    assert hub.file_fetches(REPO) == {}


@pytest.mark.parametrize(
    "source,reason,names",
    [
        ({"hubId": "kuberl-test/no-such-model"}, "RepositoryNotFound", ["model.hubId kuberl-test/no-such-model"]),
        ({"hubId": REPO, "revision": "no-such-branch"}, "RevisionNotFound", ["model.revision no-such-branch", REPO]),
        ({"hubId": REPO, "revision": "0" * 40}, "RevisionNotFound", ["model.revision " + "0" * 40]),
    ],
)
def test_a_missing_repository_or_revision_is_permanent_against_a_hub_stand_in(
    tmp_path: Path, hub: HubServer, source: dict, reason: str, names: list[str]
) -> None:
    run = initialize(tmp_path, hub.url, tmp_path / "cache", engine_config(**source))
    assert run.code == PERMANENT_FAILURE_EXIT_CODE, run.stderr
    assert run.report.reason == reason
    for name in names:
        assert name in (run.report.message or ""), run.report.message
    assert hub.file_fetches(REPO) == {}


@pytest.fixture
def small_volume(tmp_path: Path) -> Iterator[Callable[[int], Path | None]]:
    """A real tmpfs of a given size (we are root in CI); None where mounting is not permitted."""
    mounted: list[Path] = []

    def mount(size: int) -> Path | None:
        target = tmp_path / f"volume-{len(mounted)}"
        target.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(target)], capture_output=True, text=True)
        if done.returncode != 0:
            return None
        mounted.append(target)
        return target

    yield mount
    for target in mounted:
        subprocess.run(["umount", str(target)], check=True)


def test_a_cache_volume_too_small_fails_before_downloading_against_a_hub_stand_in(
    tmp_path: Path, hub: HubServer, small_volume, monkeypatch: pytest.MonkeyPatch
) -> None:
    volume = small_volume(64 * 1024)
    if volume is not None:  # a real 64 KiB tmpfs
        run = initialize(tmp_path, hub.url, volume / "hub", engine_config(hubId=REPO))
        code, report = run.code, run.report
    else:  # no mount permitted here: the same function in this process, told the volume has 64 KiB free
        import shutil
        from collections import namedtuple

        from kuberl.engine.hub.initializer import initialize as initialize_here
        from kuberl.engine.hub.settings import Hub

        usage = namedtuple("usage", "total used free")
        monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(64 * 1024, 0, 64 * 1024))
        report = initialize_here(engine_config(hubId=REPO), Hub(hub.url, tmp_path / "cache", TOKEN))
        code = PERMANENT_FAILURE_EXIT_CODE if report.reason == "CacheVolumeFull" else 1
    assert code == PERMANENT_FAILURE_EXIT_CODE
    assert report.reason == "CacheVolumeFull"
    assert "model.hubId " + REPO in (report.message or "") and "cache.size" in (report.message or "")
    assert hub.file_fetches(REPO) == {}, "it downloaded although the files could not fit"


def test_a_volume_that_fills_up_while_downloading_is_cache_volume_full_against_a_hub_stand_in(
    tmp_path: Path, hub: HubServer, small_volume, tiny_model: Path
) -> None:
    # Room for the files' bytes, so the check before downloading passes; but a tmpfs stores each file in
    # whole 4 KiB pages, so the files do not fit and a write fails with ENOSPC.
    total = sum(folder_files(tiny_model).values())
    volume = small_volume(-(-total // 4096) * 4096)
    if volume is None:
        pytest.skip("mounting a tmpfs is not permitted here: a volume cannot fill up for real")
    run = initialize(tmp_path, hub.url, volume / "hub", engine_config(hubId=REPO))
    assert run.code == PERMANENT_FAILURE_EXIT_CODE, run.stderr
    assert run.report.reason == "CacheVolumeFull"
    assert "ran out of space" in (run.report.message or "")
    assert not (endpoint_cache_dir(volume / "hub", hub.url) / "models--kuberl-test--tiny-llama" / "refs" / "main").exists()


def test_an_unreachable_hub_fails_after_bounded_retries(tmp_path: Path) -> None:
    from kuberl.operator.cli.ports import free_port

    endpoint = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    run = initialize(tmp_path, endpoint, tmp_path / "cache", engine_config(hubId=REPO), env={"KUBERL_HUB_RETRY_SECONDS": "3"})
    assert run.code == 1, run.stderr
    assert run.report.reason == "HubUnreachable"
    assert f"model.hubId {REPO}: cannot reach the hub at {endpoint}" in (run.report.message or "")
    assert "tried 2 times" in (run.report.message or "")
    assert run.seconds < 20


def test_trainer_pods_load_the_cached_snapshot_offline_against_a_hub_stand_in(
    tmp_path: Path, hub: HubServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    from transformers import AutoModelForCausalLM

    from kuberl.engine.models.resolve import ModelNotFound, model_folder

    cache = tmp_path / "cache"
    assert initialize(tmp_path, hub.url, cache, engine_config(hubId=REPO)).code == 0
    commit = commit_of(hub)
    hub.clear_requests()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_ENDPOINT", hub.url)  # as the operator sets it in trainer pods: the initializer's hub
    snapshot = endpoint_cache_dir(cache, hub.url) / "models--kuberl-test--tiny-llama" / "snapshots" / commit
    assert model_folder(WeightsSource(hub_id=REPO)) == snapshot
    assert model_folder(WeightsSource(hub_id=REPO, revision=commit)) == snapshot
    model = AutoModelForCausalLM.from_pretrained(model_folder(WeightsSource(hub_id=REPO, revision="main")))
    assert model.config.num_hidden_layers == 2

    empty = tmp_path / "empty-cache"
    monkeypatch.setenv("HF_HUB_CACHE", str(empty))
    with pytest.raises(ModelNotFound) as missing:
        model_folder(WeightsSource(hub_id=REPO), field="tokenizer")
    message = str(missing.value)
    for part in (f"tokenizer.hubId {REPO} (revision main)", f"HF_HUB_CACHE={empty}", "the initializer did not fetch it"):
        assert part in message, message


def test_the_report_fits_the_termination_message_whatever_the_message() -> None:
    from kuberl.engine.hub.report import fit_report as _fit

    repos = [
        FetchedRepo(
            field="reward.model", repo="o" * 256, revision="r" * 256, commit="c" * 40, files=10**6, bytes=10**12, fetched_bytes=10**12
        )
        for _ in range(3)
    ]
    report = InitializationReport(repos=repos, reason="DownloadFailed", message="é" * 1024)
    text = _fit(report)
    assert len(text.encode()) <= TERMINATION_MESSAGE_LIMIT
    assert InitializationReport.model_validate_json(text).message.startswith("éé")


def test_the_stand_in_runs_as_a_process_and_logs_requests(tmp_path: Path, tiny_model: Path) -> None:
    log = tmp_path / "requests.jsonl"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kuberl.operator.testing.hub_server",
            "--host",
            "127.0.0.1",
            "--repo",
            f"{REPO}={tiny_model}",
            "--token",
            TOKEN,
            "--log",
            str(log),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        commit = proc.stdout.readline().split()[1]
        url = proc.stdout.readline().split()[1]
        request = urllib.request.Request(f"{url}/api/models/{REPO}", headers={"Authorization": f"Bearer {TOKEN}"})
        with urllib.request.urlopen(request, timeout=10) as response:
            assert json.load(response)["sha"] == commit
    finally:
        proc.terminate()
        assert proc.wait(timeout=10) == 0
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert [(r["method"], r["path"], r["status"]) for r in records] == [("GET", f"/api/models/{REPO}", 200)]


# --- the cache's content, attacked ------------------------------------------------------------------


def _blob_of(snapshot: Path, name: str) -> Path:
    return (snapshot / name).resolve()


def test_a_poisoned_cache_file_is_detected_and_fetched_again_against_a_hub_stand_in(
    tmp_path: Path, hub: HubServer, tiny_model: Path
) -> None:
    cache = tmp_path / "cache"
    assert initialize(tmp_path, hub.url, cache, engine_config(hubId=REPO)).code == 0
    commit = commit_of(hub)
    snapshot = endpoint_cache_dir(cache, hub.url) / "models--kuberl-test--tiny-llama" / "snapshots" / commit
    # What a tenant sharing the claim plants: a small file (checked by git blob id), the weights (an LFS
    # file, checked by sha256), and a file the hub never listed.
    _blob_of(snapshot, "config.json").write_text('{"model_type": "llama", "auto_map": {"AutoModel": "evil.Model"}}')
    weights = _blob_of(snapshot, "model.safetensors")
    weights.write_bytes(weights.read_bytes()[:-4] + b"evil")
    (snapshot / "evil.py").write_text("import os; os.system('touch /tmp/pwned')\n")
    hub.clear_requests()

    run = initialize(tmp_path, hub.url, cache, engine_config(hubId=REPO, revision=commit))
    assert run.code == 0, run.stderr
    assert "2 cached files do not match the hub's hashes" in run.stderr and "evil.py" in run.stderr
    assert hub.file_fetches(REPO) == {"config.json": 1, "model.safetensors": 1}  # those two fetched again, only
    assert folder_files(snapshot) == folder_files(tiny_model)
    for name in folder_files(tiny_model):
        assert (snapshot / name).read_bytes() == (tiny_model / name).read_bytes(), name


def test_a_hub_that_serves_other_content_than_it_lists_is_refused_against_a_hub_stand_in(tmp_path: Path, tiny_model: Path) -> None:
    import shutil

    served = tmp_path / "served"
    shutil.copytree(tiny_model, served)
    with HubServer("127.0.0.1", token=TOKEN) as lying:
        lying.add_repo(REPO, served)  # listed with the hashes of this content ...
        config = served / "config.json"
        text = config.read_bytes()
        config.write_bytes(text[:-2] + (b"x" if text[-2:-1] != b"x" else b"y") + text[-1:])  # ... served with another
        run = initialize(tmp_path, lying.url, tmp_path / "cache", engine_config(hubId=REPO))
    assert run.code == PERMANENT_FAILURE_EXIT_CODE, run.stderr
    assert run.report.reason == "ContentMismatch"
    assert "config.json fetched again" in (run.report.message or "") and "still not what the hub lists" in (run.report.message or "")


def test_two_endpoints_never_share_files_against_hub_stand_ins(
    tmp_path: Path, hub: HubServer, tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One job points its initializer at a hub of its own serving the same repository id; another job,
    on the public (here: the first stand-in's) hub, shares the cache claim."""
    from kuberl.engine.models.resolve import ModelNotFound, model_folder
    from kuberl.engine.models.tiny import make_tiny_model

    cache = tmp_path / "cache"
    with HubServer("127.0.0.1", token=TOKEN) as planted:
        planted.add_repo(REPO, make_tiny_model(tmp_path / "planted-model", seed=1))
        assert initialize(tmp_path, planted.url, cache, engine_config(hubId=REPO)).code == 0

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    with pytest.raises(ModelNotFound):  # the planted snapshot and its refs/main are not this hub's
        model_folder(WeightsSource(hub_id=REPO))

    run = initialize(tmp_path, hub.url, cache, engine_config(hubId=REPO))
    assert run.code == 0, run.stderr
    assert hub.file_fetches(REPO) == {name: 1 for name in folder_files(tiny_model)}  # nothing taken from the other
    folder = model_folder(WeightsSource(hub_id=REPO))
    assert (folder / "model.safetensors").read_bytes() == (tiny_model / "model.safetensors").read_bytes()


def test_a_complete_commit_is_verified_from_the_cache_while_the_hub_is_down_against_a_hub_stand_in(
    tmp_path: Path, tiny_model: Path
) -> None:
    cache = tmp_path / "cache"
    with HubServer("127.0.0.1", token=TOKEN) as server:
        server.add_repo(REPO, tiny_model)
        endpoint, commit = server.url, commit_of(server)
        assert initialize(tmp_path, endpoint, cache, engine_config(hubId=REPO)).code == 0
    down = {"KUBERL_HUB_RETRY_SECONDS": "1"}
    run = initialize(tmp_path, endpoint, cache, engine_config(hubId=REPO, revision=commit), env=down)
    assert run.code == 0, run.stderr
    assert "matches the file list recorded when it was downloaded" in run.stderr and run.report.repos[0].fetched_bytes == 0

    snapshot = endpoint_cache_dir(cache, endpoint) / "models--kuberl-test--tiny-llama" / "snapshots" / commit
    _blob_of(snapshot, "config.json").write_text("{}")  # poisoned while the hub cannot vouch for a new copy
    run = initialize(tmp_path, endpoint, cache, engine_config(hubId=REPO, revision=commit), env=down)
    assert run.code == 1 and run.report.reason == "HubUnreachable", run.stderr


def test_an_unsupported_model_is_refused_once_fetched_before_any_trainer_starts_against_a_hub_stand_in(
    tmp_path: Path, tiny_model: Path
) -> None:
    import json
    import shutil

    gemma = tmp_path / "gemma"
    shutil.copytree(tiny_model, gemma)
    config = json.loads((gemma / "config.json").read_text())
    (gemma / "config.json").write_text(json.dumps({**config, "model_type": "gemma2"}))
    with HubServer("127.0.0.1", token=TOKEN) as server:
        server.add_repo("kuberl-test/gemma", gemma)
        server.add_repo(REPO, tiny_model)
        run = initialize(tmp_path, server.url, tmp_path / "cache", engine_config(hubId="kuberl-test/gemma", tokenSecretRef=SECRET))
        assert run.code == PERMANENT_FAILURE_EXIT_CODE, run.stderr
        assert run.report.reason == "UnsupportedModel" and "model.hubId kuberl-test/gemma" in (run.report.message or "")
        said = run.report.message or ""
        assert "'gemma2'" in said and "(supported: " in said and all(f in said for f in ("llama", "qwen2", "qwen3", "mistral"))
        # A supported model that the job's layout cannot split: named with the role and the layout.
        wide = engine_config(hubId=REPO, tokenSecretRef=SECRET).model_dump(by_alias=True, exclude_none=True)
        wide["roles"]["actor"]["layout"] = {"tp": 64, "dp": 1}
        wide["worldSize"], wide["roles"]["actor"]["ranks"] = 64, 64
        split = initialize(tmp_path, server.url, tmp_path / "cache", EngineConfig.model_validate(wide))
        assert split.code == PERMANENT_FAILURE_EXIT_CODE and split.report.reason == "UnsupportedModel", split.report
        assert "roles.actor.layout: tp=64 must divide" in (split.report.message or "")
        assert [r.repo for r in split.report.repos] == [REPO]  # fetched, and kept in the cache for a fixed job
