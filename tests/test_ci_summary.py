""".ci/summary.py, the digest .ci/run prints before the test output: counts, failures with the head
of their messages, skips with their reasons; read from a JUnit report a real pytest run wrote."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SUMMARY = Path(__file__).resolve().parent.parent / ".ci" / "summary.py"

TESTS = """
import pytest

def test_passes():
    pass

def test_fails():
    assert 1 == 2, "one is not two"

@pytest.fixture
def full_disk():
    raise OSError(28, "No space left on device")

def test_errors_at_setup(full_disk):
    pass

@pytest.mark.skip(reason="needs a GPU")
def test_skipped():
    pass

class TestSlow:
    def test_sleeps(self):
        import time
        time.sleep(1.2)
"""


def test_the_digest_names_what_failed_and_why_and_what_was_skipped(tmp_path: Path) -> None:
    (tmp_path / "test_sample.py").write_text(TESTS)
    report = tmp_path / "junit.xml"
    subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path / "test_sample.py"), f"--junitxml={report}"],
        capture_output=True,
        cwd=tmp_path,
    )
    digest = subprocess.run([sys.executable, str(SUMMARY), str(report)], capture_output=True, text=True, check=True).stdout
    lines = digest.splitlines()
    assert lines[0] == "2 passed, 2 failed, 1 skipped"
    assert "[ci] FAILURE test_sample::test_fails" in lines and "[ci]     AssertionError: one is not two" in lines
    assert any(line.startswith("[ci] ERROR test_sample::test_errors_at_setup") for line in lines)
    assert any("No space left on device" in line for line in lines)
    assert "[ci] SKIPPED test_sample::test_skipped: needs a GPU" in lines
    # Where the time went: the module's tests summed, its class folded into it.
    slowest = lines.index(next(line for line in lines if line.startswith("[ci] the tests took")))
    seconds, module = lines[slowest + 1].removeprefix("[ci]").split()[::2]
    assert module == "test_sample" and int(seconds) >= 1
    counts = subprocess.run([sys.executable, str(SUMMARY), "--counts", str(report)], capture_output=True, text=True, check=True)
    assert counts.stdout.splitlines() == [
        "[ci] FAILURE test_sample::test_fails: AssertionError: one is not two",
        '[ci] ERROR test_sample::test_errors_at_setup: failed on setup with "OSError: [Errno 28] No space left on device"',
        "2 passed, 2 failed, 1 skipped",
    ]


def test_a_missing_report_is_said_not_raised(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(SUMMARY), str(tmp_path / "absent.xml")], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.startswith("[ci] no test report:")
