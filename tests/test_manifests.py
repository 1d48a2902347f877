"""Manifest validation: the examples pass, and every file of the bad corpus is refused at the right field."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from kuberl.operator.validation.cluster_rules import cluster_problems
from kuberl.operator.testing.corpus import for_local_run, rljob_files
from kuberl.operator.validation.manifest import ManifestError, load_rljob_documents, load_rljobs, parse_rljob, read_documents

REPO = Path(__file__).resolve().parent.parent
MANIFESTS = Path(__file__).parent / "manifests"
BAD = sorted((MANIFESTS / "bad").glob("*.yaml"))
GOOD = sorted((MANIFESTS / "good").glob("*.yaml"))
EXAMPLES = rljob_files(Path(__file__).parent.parent / "examples")


def load_for_target(path: Path, cluster: bool) -> list:
    """The RLJobs of a file checked as `kuberl validate` checks them (`--local` when not `cluster`), with the
    flags of its `# validate-args:` line (the chart's admission allow-lists, as `kuberl validate --allow-*`)."""
    from kuberl.operator.cli.commands import _admission_policy, build_parser

    found = re.search(r"^# validate-args: (.*)$", path.read_text(), flags=re.M)
    policy = _admission_policy(build_parser().parse_args(["validate", *(found.group(1).split() if found else []), str(path)]))
    documents = load_rljob_documents(path)
    problems = [p for source, job in documents for p in cluster_problems(job, source, policy=policy)] if cluster else []
    if problems:
        raise ManifestError(problems)
    return [job for _, job in documents]


def expectation(path: Path) -> dict[str, str]:
    """The `# expect-...:` header lines of a bad manifest."""
    found = dict(re.findall(r"^# (expect-[a-z]+|api-server): ?(.*)$", path.read_text(), flags=re.M))
    assert "expect-path" in found and "expect-message" in found, f"{path.name} lacks its expect-path/expect-message header"
    return found


def test_corpus_is_large_enough() -> None:
    assert len(BAD) >= 100 and len(GOOD) >= 17
    assert sum(not for_local_run(p) for p in GOOD) >= 3 and sum(not for_local_run(p) for p in EXAMPLES) >= 2


@pytest.mark.parametrize("path", EXAMPLES + GOOD, ids=lambda p: p.name)
def test_good_manifests_validate(path: Path) -> None:
    jobs = load_for_target(path, cluster=not for_local_run(path))
    found = re.search(r"^# expect-jobs: (\d+)$", path.read_text(), flags=re.M)
    assert len(jobs) == (int(found.group(1)) if found else 1)


@pytest.mark.parametrize("path", BAD, ids=lambda p: p.stem)
def test_bad_manifest_is_refused_at_its_field(path: Path) -> None:
    expected = expectation(path)
    cluster = expected.get("expect-target") == "cluster"
    if cluster:
        load_rljobs(path)  # valid as a manifest: only a cluster refuses it
    with pytest.raises(ManifestError) as caught:
        load_for_target(path, cluster)
    problems = caught.value.problems
    # Each file breaks one thing, so every problem reported is about the expected field.
    assert {p.path for p in problems} == {expected["expect-path"]}, [str(p) for p in problems]
    assert any(expected["expect-message"] in p.message for p in problems), [str(p) for p in problems]
    for problem in problems:
        assert problem.source.startswith(str(path))
        if "expect-document" in expected:
            which = expected["expect-document"]
            assert problem.source == f"{path} ({'document ' + which if which.isdigit() else which})"


def test_yaml_syntax_error_names_line_and_column(tmp_path: Path) -> None:
    bad = tmp_path / "job.yaml"
    bad.write_text("apiVersion: kuberl.dev/v1alpha1\nkind: RLJob\nspec: [1,\n")
    with pytest.raises(ManifestError) as caught:
        load_rljobs(bad)
    assert re.fullmatch(rf"{re.escape(str(bad))}:\d+:\d+", caught.value.problems[0].source)


def test_exponent_floats_are_numbers_and_timestamps_stay_strings() -> None:
    [document] = read_documents("lr: 1e-6\nwhen: 2026-01-02T03:04:05Z\nn: 12\n", "x.yaml")
    doc = document.content
    assert doc == {"lr": 1e-6, "when": "2026-01-02T03:04:05Z", "n": 12}


def test_other_kinds_are_skipped_but_a_file_without_rljob_is_an_error(tmp_path: Path) -> None:
    only_configmap = tmp_path / "cm.yaml"
    only_configmap.write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n")
    with pytest.raises(ManifestError, match="no RLJob found"):
        load_rljobs(only_configmap)


def test_missing_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ManifestError, match="cannot read"):
        load_rljobs(tmp_path / "absent.yaml")


def test_rule_errors_carry_the_values_at_fault() -> None:
    doc = read_documents((MANIFESTS / "bad" / "layout-does-not-match-ranks.yaml").read_text(), "x")[0].content
    with pytest.raises(ManifestError) as caught:
        parse_rljob(doc, "x")
    assert "tp*pp*dp = 4, ranks = 2" in caught.value.problems[0].message


def test_cli_validate_exit_status(kuberl_cli: str) -> None:
    local = [str(p) for p in EXAMPLES if for_local_run(p)]
    cluster = [str(p) for p in EXAMPLES if not for_local_run(p)]
    for args, files in ((["--local"], local), ([], cluster)):
        ok = subprocess.run([kuberl_cli, "validate", *args, *files], capture_output=True, text=True)
        assert ok.returncode == 0, ok.stderr
        assert ok.stdout.count("ok: ") == len(files)

    bad_file = MANIFESTS / "bad" / "ppo-without-critic.yaml"
    bad = subprocess.run([kuberl_cli, "validate", cluster[0], str(bad_file)], capture_output=True, text=True)
    assert bad.returncode == 1
    assert f"error: {bad_file}: spec.roles.critic: ppo needs roles.critic" in bad.stderr
    assert "1 of 2 file(s) invalid" in bad.stderr


def test_cli_validate_reads_a_directory_as_kubectl_does(kuberl_cli: str, tmp_path: Path) -> None:
    """`kuberl validate DIR` reads DIR's .yaml, .yml and .json files (with -R its subdirectories'), as `kubectl apply -f` does."""
    (tmp_path / "nested").mkdir()
    base = (MANIFESTS / "good" / "cluster-base.yaml").read_text()
    (tmp_path / "a.yaml").write_text(base)
    (tmp_path / "b.yml").write_text(base.replace("name: base", "name: second"))
    (tmp_path / "notes.txt").write_text("not a manifest")
    (tmp_path / "nested" / "c.yaml").write_text((MANIFESTS / "bad" / "ppo-without-critic.yaml").read_text())
    flat = subprocess.run([kuberl_cli, "validate", str(tmp_path)], capture_output=True, text=True)
    assert flat.returncode == 0 and flat.stdout.count("ok: ") == 2, flat.stderr
    deep = subprocess.run([kuberl_cli, "validate", "-R", str(tmp_path)], capture_output=True, text=True)
    assert deep.returncode == 1 and "nested/c.yaml: spec.roles.critic" in deep.stderr and "1 of 3 file(s) invalid" in deep.stderr
    empty = tmp_path / "nested" / "empty"
    empty.mkdir()
    none = subprocess.run([kuberl_cli, "validate", str(empty)], capture_output=True, text=True)
    assert none.returncode == 1 and "no manifests" in none.stderr and "Traceback" not in none.stderr


@pytest.mark.parametrize("example", ["grpo-cluster", "ppo-cluster"])
def test_cli_validate_skips_an_example_folders_claims_and_kustomization_saying_so(kuberl_cli: str, example: str) -> None:
    folder = REPO / "examples" / example
    result = subprocess.run([kuberl_cli, "validate", str(folder)], capture_output=True, text=True)
    assert result.returncode == 0 and result.stdout.count("ok: ") == 1, result.stderr
    assert f"skipped: {folder}/storage.yaml: no RLJob (PersistentVolumeClaim)" in result.stdout
    # Named on its own, a file with no RLJob is still a mistake; a folder of nothing but other kinds too.
    named = subprocess.run([kuberl_cli, "validate", str(folder / "storage.yaml")], capture_output=True, text=True)
    assert named.returncode == 1 and "no RLJob found" in named.stderr
    queues = subprocess.run([kuberl_cli, "validate", str(REPO / "examples" / "kueue")], capture_output=True, text=True)
    assert queues.returncode == 1 and "skipped: " in queues.stdout and "error: no RLJob in" in queues.stderr


def test_cluster_rules_name_the_field_the_path_and_the_fix(kuberl_cli: str) -> None:
    path = MANIFESTS / "bad" / "cluster-data-not-mounted.yaml"
    refused = subprocess.run([kuberl_cli, "validate", str(path)], capture_output=True, text=True)
    assert refused.returncode == 1
    assert (
        f"error: {path}: spec.data.train.path: /datasets/train.jsonl is under no volumeMount of roles.actor, "
        "and those pods read it: mount the volume that holds it: add it to spec.volumes"
    ) in refused.stderr
    assert "spec.roles.actor.volumeMounts (e.g. mountPath: /datasets)" in refused.stderr
    # The same file is fine for `kuberl run`, which reads this machine's /datasets.
    assert subprocess.run([kuberl_cli, "validate", "--local", str(path)], capture_output=True).returncode == 0


def test_an_object_from_the_api_server_is_bounded_like_a_file() -> None:
    """The operator parses what the API server returns (not a file): a free-form value nested 5,000 deep is
    refused with the reader's bound, never a RecursionError."""
    deep: dict = {}
    node = deep
    for _ in range(5000):
        node["a"] = {}
        node = node["a"]
    doc = read_documents((MANIFESTS / "good" / "grpo-base.yaml").read_text(), "x")[0].content
    doc["spec"]["reward"]["rules"][0]["args"] = deep
    with pytest.raises(ManifestError) as caught:
        parse_rljob(doc, "ns/job")
    assert [str(p) for p in caught.value.problems] == ["ns/job: nested more than 100 levels deep; an RLJob nests about 10"]


@pytest.mark.parametrize("hub_id", ["..", "../x", "org/..", "a--b", "org/model.git", ".hidden", "a/b/c", "x" * 97])
def test_hub_ids_follow_the_hubs_grammar(hub_id: str) -> None:
    doc = read_documents((MANIFESTS / "good" / "cluster-hub-cache-claim.yaml").read_text(), "x")[0].content
    doc["spec"]["model"]["hubId"] = hub_id
    with pytest.raises(ManifestError) as caught:
        parse_rljob(doc, "x")
    assert {p.path for p in caught.value.problems} == {"spec.model.hubId"}
    assert "hub repository id" in caught.value.problems[0].message


def test_a_pattern_mismatch_is_explained_in_words() -> None:
    doc = read_documents((MANIFESTS / "good" / "grpo-base.yaml").read_text(), "x")[0].content
    doc["metadata"]["name"] = "Bad_Name"
    doc["spec"]["data"]["promptField"] = "1st"
    with pytest.raises(ManifestError) as caught:
        parse_rljob(doc, "x")
    messages = {p.path: p.message for p in caught.value.problems}
    assert messages["metadata.name"].startswith("must be a DNS-1035 label: lower-case letters") and "^" not in messages["metadata.name"]
    assert messages["spec.data.promptField"].startswith("must be a field name") and '(got "1st")' in messages["spec.data.promptField"]
