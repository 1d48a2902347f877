"""`kuberl validate` on hostile input: every case ends in bounded time and memory with a clear error
naming the file, and never a traceback."""

from __future__ import annotations

import os
import resource
import subprocess
import threading
from pathlib import Path

import pytest

from kuberl.operator.validation.manifest import ManifestError, load_rljob_documents, read_documents
from kuberl.operator.validation.yaml_reader import MAX_DOCUMENTS, MAX_EXPANDED_BYTES, MAX_FILE_NODES, MAX_NODES

pytestmark = pytest.mark.timeout(30)


def _problem_of_file(path: Path) -> str:
    with pytest.raises(ManifestError) as caught:
        load_rljob_documents(path)
    [problem] = caught.value.problems
    return str(problem)


def _billion_laughs() -> str:
    """About 1 MB: ten levels of ten aliases each under a long string, 10^10 strings of 100 kB once expanded."""
    rows = [f'l0: &l0 "{"x" * 100_000}"'] + [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]" for i in range(1, 11)]
    return "\n".join(rows) + "\n"


def test_a_billion_laughs_file_is_refused_without_allocating_its_expansion(tmp_path: Path) -> None:
    path = tmp_path / "laughs.yaml"
    path.write_text(_billion_laughs())
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    message = _problem_of_file(path)
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert message.startswith(f"{path}:") and "refused" in message and "alias" in message, message
    assert grown_kib < 200 * 1024, f"reading it grew the process by {grown_kib} KiB"


def test_a_long_string_repeated_by_aliases_is_refused_by_its_expanded_bytes() -> None:
    # Few values (under MAX_NODES) but each a 1 MB string: small in memory, huge as JSON.
    text = f's: &s "{"y" * 1_000_000}"\nl: [{", ".join(["*s"] * 100)}]\n'
    with pytest.raises(ManifestError) as caught:
        read_documents(text, "f.yaml")
    assert f"more than {MAX_EXPANDED_BYTES // 2**20} MiB of text" in str(caught.value.problems[0])


def test_many_documents_each_under_the_bound_are_refused_by_the_files_total() -> None:
    per_document = "a: &a [" + ", ".join(["x"] * 300) + "]\nb: [" + ", ".join(["*a"] * 300) + "]\n"
    documents = MAX_FILE_NODES // (300 * 301) + 2
    assert 300 * 301 < MAX_NODES and documents < MAX_DOCUMENTS
    with pytest.raises(ManifestError) as caught:
        read_documents("---\n".join([per_document] * documents), "f.yaml")
    assert f"the file expands to more than {MAX_FILE_NODES} values" in str(caught.value.problems[0])


def test_more_documents_than_the_bound_are_refused() -> None:
    with pytest.raises(ManifestError) as caught:
        read_documents("a: 1\n---\n" * (MAX_DOCUMENTS + 1), "f.yaml")
    assert f"more than {MAX_DOCUMENTS} documents" in str(caught.value.problems[0])


def test_dev_zero_is_refused_as_not_a_regular_file() -> None:
    assert "/dev/zero: not a regular file" in _problem_of_file(Path("/dev/zero"))


def test_a_fifo_with_no_writer_is_refused_without_waiting(tmp_path: Path) -> None:
    fifo = tmp_path / "job.yaml"
    os.mkfifo(fifo)
    result: list[str] = []
    reader = threading.Thread(target=lambda: result.append(_problem_of_file(fifo)), daemon=True)
    reader.start()
    reader.join(5)
    assert not reader.is_alive(), "reading a FIFO blocked"
    assert result and f"{fifo}: not a regular file" in result[0]


def test_a_directory_read_as_a_file_is_a_clear_error(tmp_path: Path) -> None:
    assert "is a directory" in _problem_of_file(tmp_path)


def test_a_huge_regular_file_is_read_no_further_than_the_bound(tmp_path: Path) -> None:
    path = tmp_path / "huge.yaml"
    with open(path, "wb") as f:
        f.truncate(2**40)  # a sparse terabyte: reading it whole would never end
    assert "the API server's request limit" in _problem_of_file(path)


def test_a_file_that_is_not_utf8_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes(b"a: \xff\xfe\n")
    message = _problem_of_file(path)
    assert message.startswith(str(path)) and "cannot read" in message


@pytest.mark.parametrize("case", ["laughs", "dev-zero", "fifo", "bad-utf8"])
def test_validate_never_prints_a_traceback_on_hostile_files(kuberl_cli: str, tmp_path: Path, case: str) -> None:
    if case == "laughs":
        target = tmp_path / "laughs.yaml"
        target.write_text(_billion_laughs())
    elif case == "dev-zero":
        target = Path("/dev/zero")
    elif case == "fifo":
        target = tmp_path / "pipe.yaml"
        os.mkfifo(target)
    else:
        target = tmp_path / "bad.yaml"
        target.write_bytes(b"\xff" * 10)
    done = subprocess.run([kuberl_cli, "validate", "--local", str(target)], capture_output=True, text=True, timeout=20)
    assert done.returncode == 1, done
    assert "Traceback" not in done.stderr and f"error: {target}" in done.stderr, done.stderr
