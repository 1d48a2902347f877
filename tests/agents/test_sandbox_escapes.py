"""The escape corpus (escape_cases.py) against the bubblewrap sandbox: every case must show no escape,
with the kernel alone (the audit hook off) and with the hook on top, as the tools run it.

The corpus runs once per configuration, its calls a few at a time, in a module fixture; each case is
then its own test, judged on what the test can see from outside: files in a folder anyone may write,
the trainer's file, the test's own sockets, processes and signal handlers, and the secret it put
in its environment, a victim's environment and a token file it holds open. The cases whose checks
look at processes run one at a time, after the others. A control run shows that the checks see
escapes where there is no kernel boundary.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from kuberl.engine.agents.sandbox import CHILD, Limits, Outcome, SandboxBackend
from kuberl.engine.agents.sandbox_bwrap import BubblewrapBackend, runtime_paths
from kuberl.engine.agents.sandbox_process import ProcessBackend

from .bubblewrap import requires_bubblewrap
from .escape_cases import CASES, Case

TIMEOUT = 3.0
LIMITS = Limits(timeout=TIMEOUT, memory_mb=512, max_output_bytes=1 << 20, scratch_mb=16)
SEQUENTIAL = ("survivors",)
X86_ONLY = ("kernel-keyring", "bpf", "io-uring")
TRAINER_CONTENT = "the trainer's checkpoint\n"
CONFIGURATIONS = {"kernel": False, "kernel+hook": True}

pytestmark = requires_bubblewrap


def _sha(path: str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _host_ip() -> str:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("10.255.255.255", 1))  # picks the route's source address; sends nothing
            return s.getsockname()[0]
        except OSError:
            return "127.0.0.1"


@dataclass
class Listeners:
    tcp: socket.socket
    udp: socket.socket
    unix: socket.socket
    abstract: socket.socket

    def received(self) -> list[str]:
        """What reached the test's sockets (nothing must)."""
        got = []
        for name, sock in (("tcp", self.tcp), ("unix", self.unix), ("abstract", self.abstract)):
            try:
                conn, _ = sock.accept()
                got.append(f"a {name} connection")
                conn.close()
            except BlockingIOError:
                pass
        try:
            got.append(f"a udp datagram {self.udp.recv(100)!r}")
        except BlockingIOError:
            pass
        return got


@dataclass
class Arena:
    """What the corpus attacks, as the test sees it from outside."""

    root: Path
    secret: str
    victim: subprocess.Popen
    token_fd: int
    signals: list[int] = field(default_factory=list)
    listeners: dict[str, Listeners] = field(default_factory=dict)
    runtime: dict[str, str] = field(default_factory=dict)
    hostname: str = ""
    host_ip: str = "127.0.0.1"

    @property
    def trainer(self) -> Path:
        return self.root / "trainer.txt"

    @property
    def token(self) -> Path:
        return self.root / "token"

    def marker(self, case: Case, config: str) -> Path:
        return self.root / f"m-{case.name}-{config}"

    def tag(self, case: Case, config: str) -> str:
        return f"kuberl-escape-{case.name}-{config}-{self.secret[:6]}"

    def listen(self, key: str) -> Listeners:
        tcp = socket.socket()
        tcp.bind(("0.0.0.0", 0))
        tcp.listen(8)
        udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        udp.bind(("0.0.0.0", 0))
        unix = socket.socket(socket.AF_UNIX)
        unix.bind(str(self.root / f"s-{key}"))
        os.chmod(self.root / f"s-{key}", 0o777)
        unix.listen(8)
        abstract = socket.socket(socket.AF_UNIX)
        abstract.bind(f"\0kuberl-{key}-{self.secret[:6]}")
        abstract.listen(8)
        for s in (tcp, udp, unix, abstract):
            s.setblocking(False)
        self.listeners[key] = Listeners(tcp, udp, unix, abstract)
        return self.listeners[key]

    def snippet(self, case: Case, config: str) -> str:
        key = f"{case.name}-{config}"
        sockets = self.listen(key) if "network" in case.checks else self.listeners["unused"]
        values = {
            "@MARKER@": repr(str(self.marker(case, config))),
            "@ARENA@": repr(str(self.root)),
            "@TRAINER@": repr(str(self.trainer)),
            "@TOKEN@": repr(str(self.token)),
            "@TRAINER_PID@": str(os.getpid()),
            "@VICTIM@": str(self.victim.pid),
            "@PORT@": str(sockets.tcp.getsockname()[1]),
            "@UDP@": str(sockets.udp.getsockname()[1]),
            "@UNIX@": repr(sockets.unix.getsockname()),
            "@ABSTRACT@": repr(sockets.abstract.getsockname()),
            "@HOST_IP@": repr(self.host_ip),
            "@TAG@": self.tag(case, config),
            "@CHILD@": repr(str(CHILD)),
        }
        return re.sub("|".join(map(re.escape, values)), lambda m: values[m.group(0)], case.code)


def _processes_with(word: str) -> list[str]:
    found = []
    for pid in os.listdir("/proc"):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
        except OSError:
            continue
        if word in cmdline:
            found.append(f"{pid}: {cmdline[:120]}")
    return found


def _tracer(pid: int) -> int:
    return int(re.search(r"TracerPid:\s+(\d+)", Path(f"/proc/{pid}/status").read_text()).group(1))


def escapes(check: str, arena: Arena, case: Case, config: str, outcome: Outcome) -> list[str]:
    """What escaped by `check`'s measure (empty: nothing)."""
    printed = outcome.output.decode("utf-8", "replace") + json.dumps(outcome.reply)
    found: list[str] = []
    if check == "marker" and os.path.lexists(arena.marker(case, config)):
        found.append(f"{arena.marker(case, config)} was created")
    if check == "tempfile":
        found += [f"{p} was created" for p in arena.root.iterdir() if p.name.startswith("m-tempfile-dir")]
    if check == "trainer":
        if not arena.trainer.exists() or arena.trainer.read_text() != TRAINER_CONTENT:
            found.append("the trainer's file changed or went")
        elif arena.trainer.stat().st_mode & 0o777 != 0o644:
            found.append("the trainer's file's mode changed")
    if check == "cwd" and os.path.lexists(arena.root / "m-proc-ppid-cwd"):
        found.append("a file appeared in the trainer's working folder")
    if check == "shm" and os.path.lexists(f"/dev/shm/m-dev-shm-{arena.tag(case, config)}"):
        found.append("a file appeared in the host's /dev/shm")
    if check == "secret" and arena.secret in printed:
        found.append("the secret was read")
    if check == "trainer_read" and TRAINER_CONTENT.strip() in printed:
        found.append("the trainer's file was read")
    if check == "trainer_cwd" and "trainer.txt" in printed:
        found.append("the trainer's working folder was listed")
    if check == "no_folder" and "FileNotFoundError" not in printed:
        found.append(f"the ServiceAccount folder is visible: {printed[:200]}")
    if check == "network":
        found += arena.listeners[f"{case.name}-{config}"].received()
    if check == "victim":
        if arena.victim.poll() is not None:
            found.append("the victim process was killed")
        elif _tracer(arena.victim.pid) != 0:
            found.append("the victim process is traced")
    if check == "signals" and arena.signals:
        found.append(f"the trainer received signals {arena.signals}")
    if check == "survivors":
        found += [f"survivor {p}" for p in _processes_with(arena.tag(case, config))]
    if check == "runtime":
        now = {path: _sha(path) for path in arena.runtime}
        found += [f"{path} changed" for path in arena.runtime if now[path] != arena.runtime[path]]
        if os.path.lexists(os.path.join(sys.prefix, "m-write-into-venv")):
            found.append("a file appeared in the virtual environment")
    if check == "refused" and ("CREATED" in printed or "ALLOCATED" in printed):
        found.append(f"the kernel allowed it: {printed[:200]}")
    if check == "limited" and outcome.seconds > TIMEOUT + 3:
        found.append(f"the call took {outcome.seconds:.1f} s")
    if check == "scratch_bounded":
        wrote = re.search(r"WROTE (\d+)", printed)
        if wrote is None or int(wrote.group(1)) > LIMITS.scratch_mb << 20:
            found.append(f"the scratch folder took more than {LIMITS.scratch_mb} MiB: {printed[:200]}")
    if check == "hostname" and socket.gethostname() != arena.hostname:
        found.append("the host's name changed")
    return found


@pytest.fixture(scope="module")
def arena():
    root = Path(tempfile.mkdtemp(prefix="kuberl-escapes-"))
    root.chmod(0o777)  # anyone may write here: only the sandbox stops a write
    secret = "s3cret-" + secrets.token_hex(8)
    (root / "trainer.txt").write_text(TRAINER_CONTENT)
    (root / "trainer.txt").chmod(0o644)
    (root / "token").write_text(f"token {secret}\n")
    (root / "token").chmod(0o644)
    token_fd = os.open(root / "token", os.O_RDONLY)  # the trainer holds its token open, as a client would
    victim = subprocess.Popen(["sleep", "600"], start_new_session=True, env={**os.environ, "KUBERL_ESCAPE_SECRET": secret})
    a = Arena(
        root,
        secret,
        victim,
        token_fd,
        hostname=socket.gethostname(),
        host_ip=_host_ip(),
        runtime={str(CHILD): _sha(str(CHILD)), os.__file__: _sha(os.__file__)},
    )
    a.listen("unused")  # the sockets of the cases that attack no socket
    handled = (signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP, signal.SIGTERM)
    saved = {s: signal.signal(s, lambda number, frame: a.signals.append(number)) for s in handled}
    os.environ["KUBERL_ESCAPE_SECRET"] = secret
    cwd = os.getcwd()
    os.chdir(root)
    try:
        yield a
    finally:
        os.chdir(cwd)
        del os.environ["KUBERL_ESCAPE_SECRET"]
        for s, handler in saved.items():
            signal.signal(s, handler)
        victim.kill()
        victim.wait()
        os.close(token_fd)
        for listeners in a.listeners.values():
            for s in (listeners.tcp, listeners.udp, listeners.unix, listeners.abstract):
                s.close()
        shutil.rmtree(root, ignore_errors=True)
        for p in Path("/dev/shm").glob(f"m-dev-shm-kuberl-escape-*{secret[:6]}"):
            p.unlink()


def run_corpus(
    arena: Arena, backend: SandboxBackend, config: str, hook: bool, cases: tuple[Case, ...]
) -> dict[str, tuple[Outcome, list[str]]]:
    """Each case's outcome and what escaped, by case name."""

    def one(case: Case) -> tuple[Outcome, list[str]]:
        outcome = backend.run({"mode": "python", "code": arena.snippet(case, config), "audit_hook": hook}, LIMITS)
        if "trainer" in case.checks:
            return outcome, []  # judged once all ran (other cases read the same file)
        return outcome, [e for check in case.checks for e in escapes(check, arena, case, config, outcome)]

    concurrent = [c for c in cases if not set(c.checks) & set(SEQUENTIAL)]
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = dict(zip((c.name for c in concurrent), pool.map(one, concurrent)))
    for case in cases:
        if case.name not in results:
            results[case.name] = one(case)
    for case in cases:  # now that nothing runs: the trainer's file, and every marker once more
        outcome, found = results[case.name]
        late = [
            e
            for check in case.checks
            for e in escapes(check, arena, case, config, outcome)
            if check in ("trainer", "marker", "cwd", "shm", "tempfile", "victim", "signals")
        ]
        results[case.name] = (outcome, found + [e for e in late if e not in found])
    return results


@pytest.fixture(scope="module")
def corpus(arena: Arena) -> dict[str, dict[str, tuple[Outcome, list[str]]]]:
    backend = BubblewrapBackend()
    cases = tuple(c for c in CASES if platform.machine() == "x86_64" or c.name not in X86_ONLY)
    return {config: run_corpus(arena, backend, config, hook, cases) for config, hook in CONFIGURATIONS.items()}


def test_the_corpus_is_large_and_named_once() -> None:
    names = [c.name for c in CASES]
    assert len(names) >= 60 and len(set(names)) == len(names)


@pytest.mark.parametrize("config", list(CONFIGURATIONS))
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_no_escape(corpus: dict[str, dict[str, tuple[Outcome, list[str]]]], case: Case, config: str) -> None:
    if case.name not in corpus[config]:
        pytest.skip(f"{case.name} uses x86-64 system-call numbers")
    outcome, found = corpus[config][case.name]
    assert not found, f"{case.name} escaped ({config}): {found}; it printed {outcome.output[:500]!r}"


def test_the_trainer_survives_the_whole_corpus(corpus, arena: Arena) -> None:
    assert arena.victim.poll() is None and not arena.signals
    ok = BubblewrapBackend().run({"mode": "python", "code": "print(6 * 7)"}, LIMITS)  # the machine still runs calls
    assert ok.output == b"42\n" and ok.reply.get("ok")


CONTROL = ("open-w", "token-file", "read-trainer-file", "os-open-dir-fd")


def test_the_checks_see_escapes_without_a_kernel_boundary(arena: Arena) -> None:
    """The same checks against a plain child process with the hook off: the writes and reads
    succeed and the checks say so (the corpus's checks can fail)."""
    cases = tuple(c for c in CASES if c.name in CONTROL)
    results = run_corpus(arena, ProcessBackend(), "control", False, cases)
    escaped = {name for name, (_, found) in results.items() if found}
    assert escaped == set(CONTROL), {name: (o.output[:300], f) for name, (o, f) in results.items()}


def test_a_calls_scratch_folder_is_its_own(arena: Arena) -> None:
    """Two calls at once: the second sees none of the first's files, by path or through /proc."""
    backend = BubblewrapBackend()
    word = secrets.token_hex(8)
    writer = f"import time; open('/tmp/mine', 'w').write({word!r}); time.sleep(2.5)"
    reader = (
        "import glob, os, time\ntime.sleep(0.8)\nfor p in ['/tmp/mine'] + glob.glob('/proc/*/root/tmp/mine') + "
        "glob.glob('/proc/*/cwd/mine'):\n    try: print(open(p).read())\n    except OSError: pass\nprint(sorted(os.listdir('/tmp')))"
    )
    with ThreadPoolExecutor(max_workers=2) as pool:
        first = pool.submit(backend.run, {"mode": "python", "code": writer, "audit_hook": False}, LIMITS)
        second = pool.submit(backend.run, {"mode": "python", "code": reader, "audit_hook": False}, LIMITS)
        read = second.result().output.decode()
        first.result()
    # The scratch holds nothing but the mount points of a runtime that lies under /tmp (a checkout there).
    mount_points = sorted({path.split("/")[2] for path in runtime_paths() if path.startswith("/tmp/")})
    assert word not in read and str(mount_points) in read and "mine" not in read, read
