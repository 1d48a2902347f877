"""Manifest validation: the examples pass, and every file of the bad corpus is refused at the right field."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from kuberl.operator.manifest import ManifestError, read_documents, load_rljobs, parse_rljob

MANIFESTS = Path(__file__).parent / "manifests"
BAD = sorted((MANIFESTS / "bad").glob("*.yaml"))
GOOD = sorted((MANIFESTS / "good").glob("*.yaml"))
EXAMPLES = sorted((Path(__file__).parent.parent / "examples").glob("*.yaml"))


def expectation(path: Path) -> dict[str, str]:
    """The `# expect-...:` header lines of a bad manifest."""
    found = dict(re.findall(r"^# (expect-[a-z]+|api-server): ?(.*)$", path.read_text(), flags=re.M))
    assert "expect-path" in found and "expect-message" in found, f"{path.name} lacks its expect-path/expect-message header"
    return found


def test_corpus_is_large_enough() -> None:
    assert len(BAD) >= 100 and len(GOOD) >= 17


@pytest.mark.parametrize("path", EXAMPLES + GOOD, ids=lambda p: p.name)
def test_good_manifests_validate(path: Path) -> None:
    jobs = load_rljobs(path)
    found = re.search(r"^# expect-jobs: (\d+)$", path.read_text(), flags=re.M)
    assert len(jobs) == (int(found.group(1)) if found else 1)


@pytest.mark.parametrize("path", BAD, ids=lambda p: p.stem)
def test_bad_manifest_is_refused_at_its_field(path: Path) -> None:
    expected = expectation(path)
    with pytest.raises(ManifestError) as caught:
        load_rljobs(path)
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
    ok = subprocess.run([kuberl_cli, "validate", *map(str, EXAMPLES)], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.count("ok: ") == len(EXAMPLES)

    bad_file = MANIFESTS / "bad" / "ppo-without-critic.yaml"
    bad = subprocess.run([kuberl_cli, "validate", str(EXAMPLES[0]), str(bad_file)], capture_output=True, text=True)
    assert bad.returncode == 1
    assert f"error: {bad_file}: spec.roles.critic: ppo needs roles.critic" in bad.stderr
    assert "1 of 2 file(s) invalid" in bad.stderr
