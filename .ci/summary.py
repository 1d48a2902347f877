"""CI's digest of pytest's JUnit report: the counts, then each failed or errored test with the head
of its message, then each skipped test with its reason. .ci/run prints it before the whole test
output, so that the first lines of a CI log say what failed; and with --counts after it, as the
closing lines (each failed test and its message's first line, then the counts), so that its last
lines say so too. The digest ends with the test modules that took longest: where CI's time goes."""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET

SHOWN = 20
SLOWEST = 10
MESSAGE_LINES = 4


def _lines(message: str) -> list[str]:
    """A failure message's lines that say something."""
    return [line for line in message.strip().splitlines() if line.strip()]


def _module(classname: str) -> str:
    """The test module of a JUnit classname (`tests.node.test_rljob` or `tests.x.test_y.TestClass`)."""
    parts = classname.split(".")
    for index, part in enumerate(parts):
        if part.startswith("test_"):
            return ".".join(parts[: index + 1])
    return classname


def main(report: str, counts_only: bool = False) -> int:
    try:
        root = ET.parse(report).getroot()
    except (OSError, ET.ParseError) as exc:
        print(f"[ci] no test report: {exc}")
        return 0
    failed, skipped, total = [], [], 0
    seconds: dict[str, float] = {}
    for case in root.iter("testcase"):
        total += 1
        module = _module(case.get("classname", ""))
        seconds[module] = seconds.get(module, 0.0) + float(case.get("time") or 0.0)
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        for kind in ("failure", "error"):
            if (found := case.find(kind)) is not None:
                failed.append((kind, name, found.get("message") or (found.text or "")))
        if (found := case.find("skipped")) is not None:
            skipped.append((name, found.get("message") or ""))
    counts = f"{total - len(failed) - len(skipped)} passed, {len(failed)} failed, {len(skipped)} skipped"
    if counts_only:
        for kind, name, message in failed[:SHOWN]:
            first = (_lines(message) or [""])[0]
            print(f"[ci] {kind.upper()} {name}: {first[:200]}")
        print(counts)
        return 0
    print(counts)
    for kind, name, message in failed[:SHOWN]:
        head = _lines(message)[:MESSAGE_LINES]
        print(f"[ci] {kind.upper()} {name}")
        for line in head:
            print(f"[ci]     {line[:300]}")
    if len(failed) > SHOWN:
        print(f"[ci] ... and {len(failed) - SHOWN} more failed (the whole output follows)")
    for name, reason in skipped:
        print(f"[ci] SKIPPED {name}: {reason[:300]}")
    print(f"[ci] the tests took {sum(seconds.values()):.0f} s; the slowest modules:")
    for module, spent in sorted(seconds.items(), key=lambda item: -item[1])[:SLOWEST]:
        print(f"[ci]   {spent:7.0f} s  {module}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[-1], counts_only="--counts" in sys.argv[1:-1]))
