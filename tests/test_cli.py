"""The `kuberl` command's help says what each command does and how it exits."""

from __future__ import annotations

import subprocess


def test_run_help_names_every_exit_status(kuberl_cli: str) -> None:
    out = subprocess.run([kuberl_cli, "run", "--help"], capture_output=True, text=True, check=True).stdout
    text = " ".join(out.split())
    for status in ("0 when every rank finished", "1 when one failed", "130 on Ctrl-C", "143 on SIGTERM"):
        assert status in text, text


def test_validate_help_names_the_local_target_and_directories(kuberl_cli: str) -> None:
    out = " ".join(subprocess.run([kuberl_cli, "validate", "--help"], capture_output=True, text=True, check=True).stdout.split())
    assert "--local" in out and "a directory of them" in out and "-R, --recursive" in out


def test_initialize_help_names_its_inputs_and_exit_statuses(kuberl_cli: str) -> None:
    out = " ".join(subprocess.run([kuberl_cli, "initialize", "--help"], capture_output=True, text=True, check=True).stdout.split())
    assert "HF_HUB_CACHE" in out and "3 when retrying cannot help" in out
