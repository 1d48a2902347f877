"""Manifest paths and revisions that would reach outside where they are checked: `..` in a local path,
a NUL, a revision that is not a git ref; and the "is it under this volume" test on normalised paths."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from kuberl.engine.config.model import ModelSpec
from kuberl.operator.api.pods import under
from kuberl.operator.validation.cluster_rules import cluster_problems
from kuberl.operator.validation.manifest import parse_rljob


@pytest.mark.parametrize(
    ("path", "root", "inside"),
    [
        ("/data/x", "/data", True),
        ("/data", "/data", True),
        ("/data/./x", "/data", True),
        ("/data//x", "/data", True),
        ("/data/x", "/data/", True),
        ("/datax", "/data", False),
        ("/data/../proc/self/environ", "/data", False),  # a string prefix says yes; the path is /proc/self/environ
        ("/data/x/../../etc", "/data", False),
        ("/data/x/..", "/data", True),  # /data itself
        ("../data/x", "../data", False),  # climbs above its start: under nothing
        ("/data/x\0", "/data", False),
        ("/proc", "/", True),
    ],
)
def test_under_compares_normalised_paths(path: str, root: str, inside: bool) -> None:
    assert under(path, root) is inside


@pytest.mark.parametrize("revision", ["main", "v1.0", "refs/pr/1", "release/2.x", "a" * 40, "0123456789abcdef0123456789abcdef01234567"])
def test_revisions_in_gits_ref_grammar_pass(revision: str) -> None:
    assert ModelSpec(hub_id="org/model", revision=revision).revision == revision


@pytest.mark.parametrize(
    "revision",
    [
        "../..",
        "..",
        "a..b",
        "/main",
        "main/",
        "a//b",
        ".hidden",
        "refs/.x",
        "main.lock",
        "x.lock/y",
        "main.",
        "@",
        "a@{1}",
        "a b",
        "a:b",
        "a~1",
        "a^",
        "a?",
        "a*",
        "a[",
        "a\\b",
        "a\x00b",
        "a\tb",
        "a\x7f",
    ],
)
def test_revisions_outside_gits_ref_grammar_are_refused(revision: str) -> None:
    from kuberl.operator.validation.manifest import ManifestError

    with pytest.raises(ValidationError):
        ModelSpec(hub_id="org/model", revision=revision)
    with pytest.raises(ManifestError) as caught:
        parse_rljob(_job(model={"hubId": "org/m", "revision": revision}), "j.yaml")
    [problem] = caught.value.problems
    assert problem.path == "spec.model.revision" and "git" in problem.message, problem


def _job(**spec) -> dict:
    base = {
        "model": {"path": "/models/m"},
        "data": {"train": {"path": "/data/train.jsonl"}},
        "algorithm": {"name": "grpo"},
        "rollout": {"samplesPerPrompt": 2},
        "reward": {"rules": [{"name": "math_answer"}]},
        "roles": {"actor": {"replicas": 1}},
        "trainer": {"totalSteps": 1, "promptsPerStep": 1},
    }
    return {"apiVersion": "kuberl.dev/v1alpha1", "kind": "RLJob", "metadata": {"name": "j"}, "spec": {**base, **spec}}


def test_a_climbing_path_never_passes_the_cluster_check_of_its_mount() -> None:
    """The attack: /data is mounted, and /data/../proc/self/environ "is under /data" as strings."""
    volumes = [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]
    mounts = [{"name": "data", "mountPath": "/data"}]
    job = _job(volumes=volumes, roles={"actor": {"replicas": 1, "volumeMounts": mounts}}, model={"hubId": "org/m"}, cache={"size": "1Gi"})
    assert not [p for p in cluster_problems(parse_rljob(job, "j.yaml"), "j.yaml") if p.path == "spec.data.train.path"]
    job["spec"]["data"]["train"]["path"] = "/data/../proc/self/environ"
    from kuberl.operator.validation.manifest import ManifestError

    with pytest.raises(ManifestError) as caught:
        parse_rljob(job, "j.yaml")
    [problem] = caught.value.problems
    assert problem.path == "spec.data.train.path" and "must not contain .. segments" in problem.message


@pytest.mark.parametrize("path", ["../x.jsonl", "data/../../x", "/a/..", "..", "\0", "/data/x\0y"])
def test_local_paths_with_dot_dot_or_nul_are_refused(path: str) -> None:
    from kuberl.operator.validation.manifest import ManifestError

    with pytest.raises(ManifestError) as caught:
        parse_rljob(_job(data={"train": {"path": path}}), "j.yaml")
    assert [p.path for p in caught.value.problems] == ["spec.data.train.path"]


@pytest.mark.parametrize("path", ["data/train.jsonl", "./data/train.jsonl", "/data/x..y.jsonl", "/data/..x/y.jsonl", "/data/.../y.jsonl"])
def test_local_paths_that_only_look_like_climbing_pass(path: str) -> None:
    assert parse_rljob(_job(data={"train": {"path": path}}), "j.yaml").spec.data.train.path == path
