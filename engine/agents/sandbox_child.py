"""The sandboxed side of a tool call: run as a script of its own (`python -I -B sandbox_child.py`),
standard library only, before any user code runs in it.

It reads one JSON request on stdin, limits itself (address space, CPU seconds, file size, open
files, processes, no core dumps) and installs an audit hook (PEP 578) that refuses sockets, new
processes, ctypes and writes outside its scratch directory. Under bubblewrap the kernel is the wall
(sandbox_bwrap.py) and the hook is defence in depth; in a plain child process (the "process"
backend) it also leaves the network where the kernel allows it and drops root for nobody, and the
hook is all there is. Then it runs the user's function or
snippet and writes one JSON reply to the descriptor the request names. What the code prints goes to stdout/stderr, which the
parent points at a file it reads back a bounded prefix of.

Modes: function (call `function` of the file's `source`, named `path`, with the JSON `arguments`;
the reply is its text; the parent reads the file, the child may not see it), python (exec `code`; the printed output is the result), describe (the function's
JSON schema, from its signature and docstring).
"""

import ctypes  # before the audit hook: importing it later would be refused (it opens libc)
import inspect
import json
import os
import resource
import sys
import traceback
import types

CLONE_NEWNET = 0x40000000
CLONE_NEWUSER = 0x10000000
NOBODY = 65534
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC


def limit(request):
    """Limits the user's code cannot raise (it holds no capability in the first user namespace)."""
    memory = int(request["memory_mb"]) << 20
    cpu = int(request["cpu_seconds"])
    fsize = int(request["file_bytes"])
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if request["isolation"] != "process":
        # Counted per user of the call's own user namespace; a plain child shares the trainer's user,
        # whose threads would count too.
        resource.setrlimit(resource.RLIMIT_NPROC, (int(request["processes"]),) * 2)


def leave_network():
    """A network namespace of its own (only loopback, down); root may make one, others through a user namespace."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWNET) == 0:
        return "namespace"
    if libc.unshare(CLONE_NEWUSER | CLONE_NEWNET) == 0:
        return "user-namespace"
    return "audit-hook"


def _others_can_read(path):
    """Whether a user other than the owner can read `path` and reach it through every folder above."""
    path = os.path.realpath(path)
    while True:
        try:
            if os.stat(path).st_mode & 0o005 != 0o005:
                return False
        except OSError:
            return True  # not there: nothing to read
        parent = os.path.dirname(path)
        if parent == path:
            return True
        path = parent


def drop_root(scratch):
    """Root becomes nobody, where the interpreter's own files are readable by others (a Python
    installed under /root is not: there the tool stays root, in its namespace and under the hook)."""
    if os.getuid() != 0:
        return "not root"
    if not all(_others_can_read(p) for p in sys.path if p and os.path.isdir(p)):
        return "root (the interpreter is readable by root only)"
    os.chown(scratch, NOBODY, NOBODY)
    os.setgroups([])
    os.setgid(NOBODY)
    os.setuid(NOBODY)
    return "nobody"


def install_audit_hook(scratch):
    scratch = os.path.realpath(scratch)
    refused_prefixes = (
        "socket.",
        "subprocess.",
        "ctypes.",
        "os.exec",
        "os.posix_spawn",
        "os.spawn",
        "os.fork",
        "os.system",
        "os.kill",
        "os.killpg",
        "pty.",
        "sys.addaudithook",
        "_posixsubprocess.",
    )
    path_events = (
        "os.remove",
        "os.rename",
        "os.rmdir",
        "os.mkdir",
        "os.chmod",
        "os.chown",
        "os.symlink",
        "os.link",
        "os.truncate",
        "os.utime",
        "shutil.rmtree",
        "shutil.move",
        "shutil.copyfile",
    )

    def inside(path):
        if isinstance(path, int):
            return True  # an open descriptor: nothing new is reached by name
        try:
            real = os.path.realpath(os.fsdecode(path))
        except Exception:
            return False
        return real == scratch or real.startswith(scratch + os.sep)

    def hook(event, args):
        if event.startswith(refused_prefixes):
            raise PermissionError(f"the tool sandbox refuses {event} (no network, no new processes)")
        if event == "open" and args:
            mode, flags = args[1], args[2] if len(args) > 2 and isinstance(args[2], int) else 0
            writes = any(c in mode for c in "wax+") if isinstance(mode, str) else bool(flags & WRITE_FLAGS)
            if writes and not inside(args[0]):
                raise PermissionError(f"the tool sandbox writes only in its scratch directory, not {args[0]}")
        elif event in path_events and args and not inside(args[0]):
            raise PermissionError(f"the tool sandbox refuses {event} outside its scratch directory")

    sys.addaudithook(hook)


def describe(fn, name):
    """A JSON schema of `fn`'s keyword arguments from its annotations and docstring."""
    types_ = {
        str: "string",
        int: "integer",
        float: "number",
        bool: "boolean",
        list: "array",
        dict: "object",
        "str": "string",
        "int": "integer",
        "float": "number",
        "bool": "boolean",
        "list": "array",
        "dict": "object",
    }
    properties, required = {}, []
    for param in inspect.signature(fn).parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        kind = types_.get(param.annotation)
        properties[param.name] = {"type": kind} if kind else {}
        if param.default is inspect.Parameter.empty:
            required.append(param.name)
    doc = inspect.getdoc(fn) or f"The function {name}."
    return {"description": doc.strip().split("\n\n")[0], "parameters": {"type": "object", "properties": properties, "required": required}}


def load_function(source, path, function):
    module = types.ModuleType("kuberl_tool")
    module.__file__ = path
    exec(compile(source, path, "exec"), module.__dict__)
    fn = getattr(module, function, None)
    if not callable(fn):
        raise LookupError(f"{path} has no function {function!r}")
    return fn


def serve(request, reply):
    mode = request["mode"]
    os.chdir(request["scratch"])
    limit(request)
    if request["isolation"] == "process":  # no kernel boundary around this process: do what a process can
        reply["isolation"] = leave_network()
        reply["user"] = drop_root(request["scratch"])
    else:
        reply["isolation"], reply["user"] = request["isolation"], str(os.getuid())
    if request.get("audit_hook", True):  # defence in depth (the kernel is the wall under bubblewrap)
        install_audit_hook(request["scratch"])
    if mode == "python":
        try:
            exec(compile(request["code"], "<tool>", "exec"), {"__name__": "__main__"})
            reply["ok"] = True
        except BaseException:
            kind, value, tb = sys.exc_info()
            traceback.print_exception(kind, value, tb.tb_next if tb is not None else None)  # from the snippet's frame on
            reply["ok"] = False
        return
    fn = load_function(request["source"], request["path"], request["function"])
    if mode == "describe":
        reply["schema"] = describe(fn, request["function"])
        return
    value = fn(**request["arguments"])
    if not isinstance(value, str):
        reply["error"] = f"the tool returned {type(value).__name__}, not text"
        return
    size = len(value.encode("utf-8", "replace"))
    if size > int(request["max_output_bytes"]):
        reply["error"] = f"the tool returned {size} bytes, more than its limit of {request['max_output_bytes']}"
        return
    reply["text"] = value


def main():
    request = json.loads(sys.stdin.read())
    out = os.fdopen(int(request["reply_fd"]), "w", encoding="utf-8")
    reply = {}
    try:
        serve(request, reply)
    except BaseException as exc:  # the user's code failed: say what, briefly
        reply["error"] = f"{type(exc).__name__}: {str(exc)[:500]}"
    sys.stdout.flush()
    sys.stderr.flush()
    out.write(json.dumps(reply, ensure_ascii=False))
    out.flush()
    os._exit(0)  # no atexit handlers or finalizers of the user's code


if __name__ == "__main__":
    main()
