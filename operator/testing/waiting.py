"""Small helpers for tests and benchmarks that drive real processes and a real API server."""

from __future__ import annotations

import time
from typing import Any, Callable


def eventually(
    check: Callable[[], Any], timeout: float = 60.0, what: str = "condition", ignore: tuple[type[BaseException], ...] = ()
) -> Any:
    """Call `check` until it returns something truthy (returned), or fail after `timeout` seconds.

    Exceptions of the `ignore` types count as "not yet".
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            result = check()
        except ignore:
            result = None
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.3)
