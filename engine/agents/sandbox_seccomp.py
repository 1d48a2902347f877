"""The seccomp filter of a sandboxed tool call, compiled by libseccomp (the C library, through ctypes:
its Python bindings are built for one interpreter and Debian's are not the trainer's).

The filter allows every system call but those that reach past the sandbox's namespaces or widen the
kernel's surface: tracing other processes, new namespaces (user namespaces are where most
unprivileged kernel exploits start), mounts, kernel modules and keyrings, BPF, perf and
userfaultfd, io_uring (whose operations no filter sees), and sockets other than Unix ones (the
network namespace has no route out; this makes even its loopback unusable). clone3 answers ENOSYS,
so that the C library falls back to clone, whose flags the filter can read. Calls of other
architectures' system-call tables (32-bit, x32) kill the process (libseccomp's default).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
from dataclasses import dataclass

ALLOW = 0x7FFF0000
AF_UNIX = 1
CLONE_NEWUSER = 0x10000000
TIOCSTI = 0x5412
CMP_NE, CMP_EQ, CMP_MASKED_EQ = 1, 4, 7

DENIED = (
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "kcmp",
    "pidfd_getfd",
    "unshare",
    "setns",
    "mount",
    "umount2",
    "pivot_root",
    "chroot",
    "move_mount",
    "open_tree",
    "fsopen",
    "fsmount",
    "fsconfig",
    "fspick",
    "mount_setattr",
    "init_module",
    "finit_module",
    "delete_module",
    "kexec_load",
    "kexec_file_load",
    "reboot",
    "swapon",
    "swapoff",
    "keyctl",
    "add_key",
    "request_key",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "fanotify_init",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "open_by_handle_at",
    "name_to_handle_at",
    "syslog",
    "acct",
    "quotactl",
    "iopl",
    "ioperm",
    "lookup_dcookie",
    "settimeofday",
    "clock_settime",
    "clock_adjtime",
    "adjtimex",
    "vhangup",
    "nfsservctl",
)
"""Refused with EPERM outright."""


class SeccompUnavailable(RuntimeError):
    """libseccomp is not installed (libseccomp2), or it refused the filter."""


class _ArgCmp(ctypes.Structure):
    _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int), ("datum_a", ctypes.c_uint64), ("datum_b", ctypes.c_uint64)]


@dataclass(frozen=True)
class Rule:
    syscall: str
    action: int
    args: tuple[tuple[int, int, int, int], ...] = ()
    """(argument index, comparison, value, second value) that must all hold for the rule to apply."""


def errno_action(code: int) -> int:
    return 0x00050000 | (code & 0xFFFF)


def rules() -> tuple[Rule, ...]:
    """The filter's rules (its default action is to allow)."""
    deny = errno_action(errno.EPERM)
    return tuple(Rule(name, deny) for name in DENIED) + (
        Rule("clone3", errno_action(errno.ENOSYS)),
        Rule("clone", deny, ((0, CMP_MASKED_EQ, CLONE_NEWUSER, CLONE_NEWUSER),)),
        Rule("socket", deny, ((0, CMP_NE, AF_UNIX, 0),)),
        Rule("ioctl", deny, ((1, CMP_EQ, TIOCSTI, 0),)),
    )


def _library() -> ctypes.CDLL:
    name = ctypes.util.find_library("seccomp") or "libseccomp.so.2"
    try:
        lib = ctypes.CDLL(name, use_errno=True)
    except OSError as exc:
        raise SeccompUnavailable(f"libseccomp is not installed ({exc}); install the libseccomp2 package") from None
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_rule_add_array.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint, ctypes.POINTER(_ArgCmp)]
    lib.seccomp_export_bpf.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    return lib


def compile_filter(filter_rules: tuple[Rule, ...] | None = None) -> bytes:
    """The filter as a BPF program (what bwrap's --seccomp reads from a descriptor)."""
    lib = _library()
    ctx = lib.seccomp_init(ALLOW)
    if not ctx:
        raise SeccompUnavailable("seccomp_init failed")
    try:
        for rule in rules() if filter_rules is None else filter_rules:
            number = lib.seccomp_syscall_resolve_name(rule.syscall.encode())
            if number < 0:
                continue  # not a system call of this architecture (e.g. iopl on arm64)
            cmps = (_ArgCmp * max(1, len(rule.args)))(*[_ArgCmp(*a) for a in rule.args])
            rc = lib.seccomp_rule_add_array(ctypes.c_void_p(ctx), rule.action, number, len(rule.args), cmps)
            if rc < 0:
                raise SeccompUnavailable(f"libseccomp refused the rule for {rule.syscall}: {os.strerror(-rc)}")
        out = os.memfd_create("kuberl-seccomp", os.MFD_CLOEXEC)
        try:
            rc = lib.seccomp_export_bpf(ctypes.c_void_p(ctx), out)
            if rc < 0:
                raise SeccompUnavailable(f"libseccomp could not export the filter: {os.strerror(-rc)}")
            os.lseek(out, 0, os.SEEK_SET)
            chunks = []
            while chunk := os.read(out, 65536):
                chunks.append(chunk)
            return b"".join(chunks)
        finally:
            os.close(out)
    finally:
        lib.seccomp_release(ctypes.c_void_p(ctx))
