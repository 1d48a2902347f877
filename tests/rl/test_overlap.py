"""Background work in the step loop: its time, and how much of it the caller did not wait for."""

from __future__ import annotations

import threading
import time

import pytest

from kuberl.engine.common.overlap import Background


def test_work_done_before_join_was_hidden_whole() -> None:
    back = Background(lambda: time.sleep(0.05))
    while back.thread.is_alive():  # the caller busy with other work meanwhile
        time.sleep(0.01)
    seconds, hidden = back.join()
    assert seconds >= 0.05 and hidden == seconds


def test_work_the_caller_waits_for_is_not_hidden() -> None:
    release = threading.Event()
    back = Background(release.wait)
    threading.Timer(1.0, release.set).start()  # the work ends 1 s after the caller starts waiting
    seconds, hidden = back.join()
    # hidden: the moments between starting the work and calling join; 0.5 s of slack for a busy machine.
    assert seconds >= 1.0 and 0.0 <= hidden < seconds / 2


def test_an_error_in_the_background_reaches_the_caller() -> None:
    def fail() -> None:
        raise RuntimeError("vLLM could not sleep")

    back = Background(fail)
    with pytest.raises(RuntimeError, match="vLLM could not sleep"):
        back.join()
