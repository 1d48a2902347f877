"""The bubblewrap backend: each tool call behind a kernel boundary.

bwrap gives the call new user, PID, network, IPC, UTS and cgroup namespaces; no capabilities; no
further user namespaces; a session of its own (no TIOCSTI into the trainer's terminal); a cleared
environment; a root of its own that holds only read-only binds of what the interpreter needs (/usr
and the /lib, /bin links, a few /etc files, the interpreter's prefix and the virtual environment,
sandbox_child.py), a fresh /proc of its PID namespace, a minimal /dev, and a private tmpfs as /tmp,
its scratch folder, that no other call sees. Nothing else of the trainer's is there: not its
working folder, checkpoints or caches, not /var/run/secrets or /etc/kuberl. A seccomp filter
(sandbox_seccomp.py) refuses the system calls that reach past the namespaces. When the call ends,
or bwrap is killed at its timeout, the PID namespace's init ends and the kernel kills every process
left in it.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
import uuid
from functools import lru_cache
from pathlib import Path
from typing import Any

from .sandbox import CHILD, Launch, Limits, SandboxBackend, register_sandbox_backend
from .sandbox_seccomp import SeccompUnavailable, compile_filter

SANDBOX_UID = 65534
CHILD_INSIDE = "/kuberl/sandbox_child.py"
SCRATCH = "/tmp"
ETC_FILES = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "nsswitch.conf", "alternatives")
"""/etc entries the interpreter and the C library may read; passwd and group are written for the sandbox."""
TOP_LEVEL = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
PASSWD = f"nobody:x:{SANDBOX_UID}:{SANDBOX_UID}:nobody:{SCRATCH}:/usr/sbin/nologin\n".encode()
GROUP = f"nogroup:x:{SANDBOX_UID}:\n".encode()


def environment() -> dict[str, str]:
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": SCRATCH,
        "TMPDIR": SCRATCH,
        "LANG": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONIOENCODING": "utf-8",
        "PYTHONHASHSEED": "0",
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }


def runtime_paths() -> list[str]:
    """The folders outside /usr the interpreter runs from: its installation and the virtual
    environment (each bound read-only at the path the interpreter knows it by)."""
    paths: list[str] = []
    for p in (sys.base_prefix, sys.prefix, os.path.dirname(os.path.realpath(sys.executable))):
        if not p.startswith("/usr/") and p != "/usr" and p not in paths and not any(p.startswith(q + "/") for q in paths):
            paths.append(p)
    return paths


def bwrap_argv(bwrap: str, *, seccomp_fd: int | None, passwd_fd: int, group_fd: int, limits: Limits, root: Path = Path("/")) -> list[str]:
    """The bwrap command line of one call (before the child's own command). `root` is where the host's
    top-level folders are looked at (a test may point it elsewhere)."""
    argv = [
        bwrap,
        "--unshare-all",
        "--unshare-user",
        "--disable-userns",
        "--die-with-parent",
        "--new-session",
        "--cap-drop",
        "ALL",
        "--uid",
        str(SANDBOX_UID),
        "--gid",
        str(SANDBOX_UID),
        "--hostname",
        "sandbox",
        "--clearenv",
    ]
    for key, value in environment().items():
        argv += ["--setenv", key, value]
    argv += ["--ro-bind", "/usr", "/usr"]
    for name in TOP_LEVEL:
        host = root / name
        if host.is_symlink():
            argv += ["--symlink", os.readlink(host), f"/{name}"]
        elif host.is_dir():
            argv += ["--ro-bind", str(host), f"/{name}"]
    for name in ETC_FILES:
        argv += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
    argv += ["--ro-bind-data", str(passwd_fd), "/etc/passwd", "--ro-bind-data", str(group_fd), "/etc/group"]
    # The scratch before the runtime: bwrap mounts in order, so a virtual environment under /tmp (a CI
    # checkout there) is bound over the scratch, not hidden beneath it.
    argv += ["--size", str(limits.scratch_mb << 20), "--tmpfs", SCRATCH]
    for path in runtime_paths():
        argv += ["--ro-bind", os.path.realpath(path), path]
    argv += [
        "--ro-bind",
        str(CHILD),
        CHILD_INSIDE,
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--size",
        str(1 << 20),
        "--tmpfs",
        "/dev/shm",
        "--remount-ro",
        "/dev",
        "--remount-ro",
        "/",
        "--chdir",
        SCRATCH,
    ]
    if seccomp_fd is not None:
        argv += ["--seccomp", str(seccomp_fd)]
    return argv


@lru_cache(maxsize=1)
def _filter() -> bytes | None:
    try:
        return compile_filter()
    except SeccompUnavailable:
        return None


def _data_fd(data: bytes, name: str) -> int:
    """A descriptor bwrap reads `data` from (a memory file at offset 0)."""
    fd = os.memfd_create(name, 0)
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


PIDS_HIERARCHIES = ("/sys/fs/cgroup/pids", "/sys/fs/cgroup")


def pids_cgroup(limit: int, hierarchies: tuple[str, ...] = PIDS_HIERARCHIES) -> str | None:
    """A fresh pids cgroup of at most `limit` processes, or None where none can be made.

    Only for a trainer that runs as root: the kernel does not apply RLIMIT_NPROC to the first user
    namespace's root, and bwrap started by root maps the sandbox's user to root outside (a
    non-root trainer, as in the trainer image, gets RLIMIT_NPROC, counted in the call's own user
    namespace)."""
    for base in hierarchies:
        v2 = not os.path.exists(os.path.join(base, "tasks"))
        try:
            if v2 and "pids" not in Path(base, "cgroup.subtree_control").read_text().split():
                continue
            path = os.path.join(base, f"kuberl-tool-{uuid.uuid4().hex[:12]}")
            os.mkdir(path)
        except OSError:
            continue
        try:
            Path(path, "pids.max").write_text(str(limit))
            return path
        except OSError:
            os.rmdir(path)
    return None


def remove_cgroup(path: str) -> None:
    """Remove a call's cgroup once the PID namespace's teardown has emptied it."""
    for _ in range(50):
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.02)


class BubblewrapBackend(SandboxBackend):
    name = "bubblewrap"
    isolated = True

    def __init__(self, bwrap: str | None = None):
        self.bwrap = bwrap or shutil.which("bwrap") or "bwrap"

    def probe(self) -> str | None:
        if shutil.which(self.bwrap) is None:
            return f"{self.bwrap} is not installed (the bubblewrap package: apt-get install bubblewrap)"
        return super().probe()

    @property
    def seccomp(self) -> bool:
        return _filter() is not None

    @property
    def description(self) -> str:
        seccomp = "a seccomp filter" if self.seccomp else "no seccomp filter (libseccomp2 is not installed)"
        return (
            "bubblewrap: new user, PID, network, IPC, UTS and cgroup namespaces, no capabilities, read-only "
            f"runtime, a private tmpfs scratch; {seccomp}; limits on memory, CPU time, processes, file size "
            "and open files"
        )

    def launch(self, request: dict[str, Any], limits: Limits, scratch: str) -> Launch:
        bpf = _filter()
        status_read, status_write = os.pipe()
        os.set_inheritable(status_write, False)
        fds = [_data_fd(PASSWD, "passwd"), _data_fd(GROUP, "group"), status_write]
        if bpf is not None:
            fds.append(_data_fd(bpf, "seccomp"))

        def close() -> None:
            for fd in fds:
                os.close(fd)

        argv = bwrap_argv(self.bwrap, seccomp_fd=fds[3] if bpf is not None else None, passwd_fd=fds[0], group_fd=fds[1], limits=limits) + [
            "--json-status-fd",
            str(status_write),
        ]
        argv += ["--", sys.executable, "-I", "-B", CHILD_INSIDE]
        cgroup = pids_cgroup(limits.processes + 2) if os.geteuid() == 0 else None  # + bwrap and its init
        if cgroup is not None:  # the shell joins the cgroup, then becomes bwrap: nothing runs outside it
            argv = ["/bin/sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', cgroup, *argv]
        return Launch(
            argv,
            cwd="/",
            env=environment(),
            scratch=SCRATCH,
            pass_fds=tuple(fds),
            cleanup=close,
            finish=(lambda: remove_cgroup(cgroup)) if cgroup is not None else (lambda: None),
            status_fd=status_read,
        )


@register_sandbox_backend("bubblewrap")
def _bubblewrap() -> SandboxBackend:
    return BubblewrapBackend()
