"""The sandbox's tests need bubblewrap (`make test` installs it). Where it is installed they run, and fail with
the probe's words if it does not work there: a broken sandbox must not pass as a skipped one."""

import shutil

import pytest

requires_bubblewrap = pytest.mark.skipif(
    shutil.which("bwrap") is None, reason="bubblewrap is not installed: apt-get install bubblewrap (make test does)"
)
