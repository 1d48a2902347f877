"""The escape corpus: snippets a tool's code might run to get out of the sandbox, each with the check
that proves it did not (tests/agents/test_sandbox_escapes.py runs them).

A snippet names what it attacks by placeholders the test fills in: @MARKER@ (a path outside the
scratch folder it must not create), @ARENA@ (the folder of such paths, writable by anyone, so that
only the sandbox stops a write), @TRAINER@ (a trainer's file it must not change or read), @TOKEN@ (a
ServiceAccount-like token file the trainer holds open), @TRAINER_PID@ (the test's own process),
@VICTIM@ (another process of the trainer's user), @PORT@/@UDP@/@UNIX@/@ABSTRACT@ (a TCP, UDP, Unix
and abstract Unix socket the test listens on), @HOST_IP@ (an address of this machine), @TAG@ (a
word that names the processes it starts), @CHILD@ (sandbox_child.py), @VENV@ (the interpreter's
environment). Snippets never contain a secret: a check looks for the secret in what they printed.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Case:
    name: str
    code: str
    checks: tuple[str, ...]
    """What the test verifies after the call (test_sandbox_escapes.CHECKS): marker, trainer, secret,
    network, victim, signals, survivors, runtime, limited, refused."""


W = ("marker",)
T = ("trainer",)
S = ("secret",)
N = ("network",)
K = ("victim", "signals")
P = ("marker", "survivors")

CASES: tuple[Case, ...] = (
    # Writes outside the scratch folder, by every call that creates or changes a file.
    Case("open-w", "open(@MARKER@, 'w').write('x')", W),
    Case("open-a", "open(@MARKER@, 'a').write('x')", W),
    Case("open-x", "open(@MARKER@, 'x').write('x')", W),
    Case("open-rplus-trainer-file", "f = open(@TRAINER@, 'r+'); f.write('pwned'); f.close()", T),
    Case("os-open", "import os; os.write(os.open(@MARKER@, os.O_CREAT | os.O_WRONLY), b'x')", W),
    Case(
        "os-open-dir-fd",
        "import os; d = os.open(@ARENA@, os.O_RDONLY | os.O_DIRECTORY)\n"
        "os.write(os.open(os.path.basename(@MARKER@), os.O_CREAT | os.O_WRONLY, dir_fd=d), b'x')",
        W,
    ),
    Case(
        "opener",
        "import os; d = os.open(@ARENA@, os.O_RDONLY | os.O_DIRECTORY)\n"
        "open(os.path.basename(@MARKER@), 'w', opener=lambda p, f: os.open(p, f, dir_fd=d)).write('x')",
        W,
    ),
    Case("io-fileio", "import io; io.FileIO(@MARKER@, 'w').write(b'x')", W),
    Case("rename-second-path", "import os; open('f', 'w').write('x'); os.rename('f', @MARKER@)", W),
    Case("replace-second-path", "import os; open('f', 'w').write('x'); os.replace('f', @MARKER@)", W),
    Case("link-second-path", "import os; open('f', 'w').write('x'); os.link('f', @MARKER@)", W),
    Case("symlink-second-path", "import os; os.symlink('/etc/passwd', @MARKER@)", W),
    Case("mknod", "import os, stat; os.mknod(@MARKER@, stat.S_IFREG | 0o644)", W),
    Case("mkfifo", "import os; os.mkfifo(@MARKER@)", W),
    Case(
        "mknod-memory-device",
        "import os, stat\nos.mknod('mem', stat.S_IFCHR | 0o600, os.makedev(1, 1))\nprint('CREATED')\nopen('mem', 'rb').read(16)",
        ("refused",),
    ),
    Case("shutil-copy", "import shutil; open('f', 'w').write('x'); shutil.copy('f', @MARKER@)", W),
    Case("shutil-copytree", "import os, shutil; os.mkdir('d'); shutil.copytree('d', @MARKER@)", W),
    Case("shutil-move", "import shutil; open('f', 'w').write('x'); shutil.move('f', @MARKER@)", W),
    Case("pathlib-write-text", "import pathlib; pathlib.Path(@MARKER@).write_text('x')", W),
    Case("pathlib-touch", "import pathlib; pathlib.Path(@MARKER@).touch()", W),
    Case("tempfile-dir", "import tempfile; tempfile.NamedTemporaryFile(dir=@ARENA@, prefix='m-tempfile-dir', delete=False)", ("tempfile",)),
    Case("makedirs", "import os; os.makedirs(@MARKER@ + '/a/b')", W),
    Case("mkdir", "import os; os.mkdir(@MARKER@)", W),
    Case("hard-link-to-trainer-file", "import os; os.link(@TRAINER@, 'h'); open('h', 'w').write('pwned')", T),
    Case("truncate-trainer-file", "import os; os.truncate(@TRAINER@, 0)", T),
    Case("chmod-trainer-file", "import os; os.chmod(@TRAINER@, 0o777)", T),
    Case("remove-trainer-file", "import os; os.remove(@TRAINER@)", T),
    Case("rmtree-arena", "import shutil; shutil.rmtree(@ARENA@)", T),
    Case(
        "proc-self-fd",
        "import os; d = os.open(@ARENA@, os.O_RDONLY | os.O_DIRECTORY)\n"
        "open('/proc/self/fd/%d/%s' % (d, os.path.basename(@MARKER@)), 'w').write('x')",
        W,
    ),
    Case(
        "proc-ppid-cwd",
        "import os\nfor pid in (os.getppid(), @TRAINER_PID@):\n"
        "    try: open('/proc/%d/cwd/m-proc-ppid-cwd' % pid, 'w').write('x')\n    except OSError: pass",
        ("cwd",),
    ),
    Case("proc-trainer-root", "open('/proc/@TRAINER_PID@/root' + @MARKER@, 'w').write('x')", W),
    Case("dev-shm", "open('/dev/shm/m-dev-shm-@TAG@', 'w').write('x')", ("shm",)),
    Case(
        "chroot-breakout",
        "import os\nos.mkdir('j'); os.chroot('j')\nfor _ in range(64): os.chdir('..')\nos.chroot('.'); open(@MARKER@, 'w').write('x')",
        W,
    ),
    Case("setuid-root-then-write", "import os; os.setuid(0); open(@MARKER@, 'w').write('x')", W),
    # New processes, by every route: each tries to write the marker.
    Case("subprocess", "import subprocess; subprocess.run(['/bin/sh', '-c', 'echo x > ' + @MARKER@])", P),
    Case("os-fork", "import os, time\nif os.fork() == 0:\n    open(@MARKER@, 'w').write('x'); os._exit(0)\ntime.sleep(0.3)", P),
    Case("posix-spawn", "import os; pid = os.posix_spawn('/bin/sh', ['sh', '-c', 'echo x > ' + @MARKER@], {}); os.waitpid(pid, 0)", P),
    Case("os-system", "import os; os.system('echo x > ' + @MARKER@)", P),
    Case("os-execv", "import os; os.execv('/bin/sh', ['sh', '-c', 'echo x > ' + @MARKER@])", P),
    Case("pty-spawn", "import pty; pty.spawn(['/bin/sh', '-c', 'echo x > ' + @MARKER@])", P),
    Case(
        "multiprocessing",
        "import multiprocessing as mp\ndef w(): open(@MARKER@, 'w').write('x')\n"
        "p = mp.get_context('fork').Process(target=w); p.start(); p.join()",
        P,
    ),
    Case(
        "ctypes-fork",
        "import ctypes, os, time\nlibc = ctypes.CDLL(None)\nif libc.fork() == 0:\n"
        "    open(@MARKER@, 'w').write('x'); os._exit(0)\ntime.sleep(0.3)",
        P,
    ),
    Case(
        "ctypes-execve",
        "import ctypes\nlibc = ctypes.CDLL(None)\n"
        "argv = (ctypes.c_char_p * 4)(b'sh', b'-c', b'echo x > ' + @MARKER@.encode(), None)\n"
        "libc.execve(b'/bin/sh', argv, (ctypes.c_char_p * 1)(None))",
        P,
    ),
    Case(
        "posixsubprocess",
        "import _posixsubprocess, os\nr, w = os.pipe()\n"
        "pid = _posixsubprocess.fork_exec([b'/bin/sh', b'-c', b'echo x > ' + @MARKER@.encode()], [b'/bin/sh'], True, (w,), None, None,"
        " -1, -1, -1, -1, -1, -1, r, w, True, False, -1, None, None, None, -1, None, False)\nos.waitpid(pid, 0)",
        P,
    ),
    # The network, by every route: the test's sockets must receive nothing.
    Case("tcp-loopback", "import socket; socket.create_connection(('127.0.0.1', @PORT@), timeout=1).sendall(b'x')", N),
    Case("tcp-host-address", "import socket; socket.create_connection((@HOST_IP@, @PORT@), timeout=1).sendall(b'x')", N),
    Case("udp-loopback", "import socket; socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'x', ('127.0.0.1', @UDP@))", N),
    Case("urllib", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:@PORT@/', timeout=1)", N),
    Case("unix-socket", "import socket; s = socket.socket(socket.AF_UNIX); s.connect(@UNIX@); s.sendall(b'x')", N),
    Case("abstract-unix-socket", "import socket; s = socket.socket(socket.AF_UNIX); s.connect(@ABSTRACT@); s.sendall(b'x')", N),
    Case(
        "raw-socket",
        "import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)\nprint('CREATED')\n"
        "s.sendto(b'\\x08\\x00\\xf7\\xff\\x00\\x00\\x00\\x00', ('127.0.0.1', 0))",
        ("refused",),
    ),
    Case("packet-socket", "import socket; socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0x0300); print('CREATED')", ("refused",)),
    Case(
        "ctypes-socket",
        "import ctypes, socket, struct\nlibc = ctypes.CDLL(None, use_errno=True)\nfd = libc.socket(2, 1, 0)\n"
        "addr = struct.pack('!HH4s8x', 2, @PORT@, socket.inet_aton('127.0.0.1'))\naddr = struct.pack('=H', 2) + addr[2:]\n"
        "print('connect', libc.connect(fd, addr, len(addr)), libc.write(fd, b'x', 1))",
        N,
    ),
    Case("netlink-route", "import socket; socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0); print('CREATED')", ("refused",)),
    # Signals to the trainer and its other processes.
    Case("kill-ppid", "import os, signal; os.kill(os.getppid(), signal.SIGUSR1)", K),
    Case("kill-trainer-pid", "import os, signal; os.kill(@TRAINER_PID@, signal.SIGUSR1)", K),
    Case("kill-victim", "import os, signal; os.kill(@VICTIM@, signal.SIGKILL)", K),
    Case("kill-minus-one", "import os, signal; os.kill(-1, signal.SIGKILL)", K),
    Case("killpg-victim", "import os, signal; os.killpg(@VICTIM@, signal.SIGKILL)", K),
    Case("ctypes-kill", "import ctypes; print(ctypes.CDLL(None).kill(@VICTIM@, 9), ctypes.CDLL(None).kill(@TRAINER_PID@, 10))", K),
    Case("pidfd-send-signal", "import os, signal; signal.pidfd_send_signal(os.pidfd_open(@VICTIM@), signal.SIGKILL)", K),
    # The trainer's environment and credentials.
    Case("own-environment", "import os; print(dict(os.environ))", S),
    Case("proc-ppid-environ", "import os; print(open('/proc/%d/environ' % os.getppid(), 'rb').read())", S),
    Case("proc-1-environ", "print(open('/proc/1/environ', 'rb').read())", S),
    Case("proc-trainer-environ", "print(open('/proc/@TRAINER_PID@/environ', 'rb').read())", S),
    Case("proc-victim-environ", "print(open('/proc/@VICTIM@/environ', 'rb').read())", S),
    Case(
        "every-proc-environ",
        "import os\nfor p in os.listdir('/proc'):\n    try: print(open('/proc/%s/environ' % p, 'rb').read())\n    except OSError: pass",
        S,
    ),
    Case("token-file", "print(open(@TOKEN@).read())", S),
    Case("token-via-proc-root", "print(open('/proc/@TRAINER_PID@/root' + @TOKEN@).read())", S),
    Case(
        "token-via-trainer-fds",
        "import os\nfor fd in os.listdir('/proc/@TRAINER_PID@/fd'):\n"
        "    try: print(open('/proc/@TRAINER_PID@/fd/' + fd, 'rb').read(200))\n    except OSError: pass",
        S,
    ),
    Case(
        "inherited-descriptors",
        "import os\nfor fd in range(3, 256):\n    try: os.lseek(fd, 0, 0); print(os.read(fd, 4096))\n    except OSError: pass",
        S,
    ),
    Case(
        "trainer-memory",
        "import re\nmaps = open('/proc/@TRAINER_PID@/maps').read().splitlines()\nmem = open('/proc/@TRAINER_PID@/mem', 'rb')\n"
        "for line in maps:\n    a, b = (int(x, 16) for x in line.split()[0].split('-'))\n    mem.seek(a)\n"
        "    print(re.findall(rb'KUBERL_ESCAPE_SECRET=[^\\x00]*', mem.read(b - a)))",
        S,
    ),
    Case("read-trainer-file", "print(open(@TRAINER@).read())", ("trainer_read",)),
    Case("service-account-folder", "import os; print(os.listdir('/var/run/secrets/kubernetes.io/serviceaccount'))", ("no_folder",)),
    Case("trainer-cwd-listing", "import os; print(os.listdir('/proc/@TRAINER_PID@/cwd'))", ("trainer_cwd",)),
    # Resources: bounded by the limits, and the trainer's machine goes on.
    Case(
        "fork-bomb",
        "import os, sys\nbomb = 'import os\\nwhile True:\\n    try: os.fork()\\n    except OSError: pass'\n"
        "os.execv(sys.executable, [sys.executable, '-c', bomb, '@TAG@'])",
        ("victim", "survivors", "limited"),
    ),
    Case("memory", "x = bytearray(8 << 30); print('ALLOCATED')", ("refused",)),
    Case(
        "scratch-fill",
        "n = 0\nf = open('fill', 'wb')\ntry:\n    while True: f.write(b'x' * 65536); n += 65536\nexcept OSError: pass\nprint('WROTE', n)",
        ("scratch_bounded",),
    ),
    Case(
        "many-files-fill",
        "import os\nn = 0\ntry:\n    for i in range(100000):\n        open('f%d' % i, 'wb').write(b'x' * 60000); n += 60000\n"
        "except OSError: pass\nprint('WROTE', n)",
        ("scratch_bounded",),
    ),
    # Survivors: nothing the call started outlives it.
    Case(
        "daemon-double-fork-setsid",
        "import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
        "        os.execv('/bin/sh', ['sh', '-c', 'sleep 2; echo x > ' + @MARKER@ + '; sleep 300 # @TAG@'])\n    os._exit(0)\n",
        P,
    ),
    Case(
        "daemon-past-the-timeout",
        "import subprocess, time\nsubprocess.Popen(['/bin/sh', '-c', 'sleep 5; echo x > ' + @MARKER@ + '; sleep 300 # @TAG@'],"
        " start_new_session=True)\ntime.sleep(600)",
        P,
    ),
    # Tampering with the sandbox itself.
    Case(
        "clear-audit-hooks-then-write",
        "import ctypes, sys\n"
        "try: ctypes.pythonapi._PySys_ClearAuditHooks(ctypes.c_void_p(ctypes.pythonapi._PyThreadState_GetCurrent()))\n"
        "except Exception: pass\nopen(@MARKER@, 'w').write('x')",
        W,
    ),
    Case(
        "overwrite-sandbox-child", "open('/kuberl/sandbox_child.py', 'w').write('pwned')\nopen(@CHILD@, 'w').write('pwned')", ("runtime",)
    ),
    Case("write-into-venv", "import os, sys; open(os.path.join(sys.prefix, 'm-write-into-venv'), 'w').write('x')", ("runtime",)),
    Case("append-to-stdlib", "import os; open(os.__file__, 'a').write('pwned')", ("runtime",)),
    Case(
        "ptrace-victim",
        "import ctypes\nlibc = ctypes.CDLL(None)\nprint(libc.ptrace(16, @VICTIM@, 0, 0), libc.ptrace(8, @VICTIM@, 0, 0))",
        K,
    ),
    Case(
        "ptrace-trainer",
        "import ctypes\nlibc = ctypes.CDLL(None)\nprint(libc.ptrace(16, @TRAINER_PID@, 0, 0), libc.ptrace(8, @TRAINER_PID@, 0, 0))",
        K,
    ),
    Case("new-user-namespace", "import ctypes\nif ctypes.CDLL(None).unshare(0x10000000) == 0: print('CREATED')", ("refused",)),
    Case("new-network-namespace", "import ctypes\nif ctypes.CDLL(None).unshare(0x40000000) == 0: print('CREATED')", ("refused",)),
    Case(
        "new-user-namespace-ctypes-clone",
        "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "stack = ctypes.create_string_buffer(65536)\nf = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)(lambda _: 0)\n"
        "top = ctypes.c_void_p(ctypes.addressof(stack) + 65536)\n"
        "if libc.clone(f, top, 0x10000000 | 17, None) > 0: print('CREATED')",
        ("refused",),
    ),
    Case(
        "mount-proc-over-scratch",
        "import ctypes\nif ctypes.CDLL(None).mount(b'none', b'/tmp', b'tmpfs', 0, None) == 0: print('CREATED')",
        ("refused",),
    ),
    Case("write-hostname-sysctl", "open('/proc/sys/kernel/hostname', 'w').write('pwned')", ("hostname",)),
    Case("sysrq-trigger", "open('/proc/sysrq-trigger', 'w').write('h')\nprint('CREATED')", ("refused",)),
    Case(
        "kernel-keyring",
        "import ctypes\nlibc = ctypes.CDLL(None)\nif libc.syscall(248, b'user', b'kuberl', b'x', 1, -4) >= 0: print('CREATED')",
        ("refused",),
    ),
    Case("bpf", "import ctypes\nif ctypes.CDLL(None).syscall(321, 0, None, 0) >= 0: print('CREATED')", ("refused",)),
    Case(
        "io-uring",
        "import ctypes\np = ctypes.create_string_buffer(120)\nif ctypes.CDLL(None).syscall(425, 8, p) >= 0: print('CREATED')",
        ("refused",),
    ),
)
