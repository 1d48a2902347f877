"""The job commands: `kuberl submit|list|status|logs|wait|suspend|resume|delete|version`, and the same as `kubectl rl ...`.

Thin: each command is one kuberl.client call and its printing. argparse, like the rest of `kuberl`: a dozen commands
with a few options each do not need a new dependency (click/typer are not in the operator image), and the job
commands then parse, print help and fail exactly like the other subcommands. An error is one line on stderr and
exit status 1, never a traceback (KUBERL_DEBUG=1 shows it).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Callable

from .output import OUTPUTS, WIDE_HEADER, as_list, dump, wide_columns, wide_lines

if TYPE_CHECKING:  # kuberl.client loads only when a job command runs: the operator itself never imports it
    from kuberl.client import RLJobClient
    from kuberl.operator.api import MetricsSnapshot, RLJob

JOB_COMMANDS = ("submit", "list", "status", "logs", "wait", "suspend", "resume", "delete", "version")


# --- formatting --------------------------------------------------------------------------------------


def duration(seconds: float | None) -> str:
    """90 -> "1m30s", 7260 -> "2h01m", None -> "unknown"."""
    if seconds is None:
        return "unknown"
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def age(created: str | None, now: datetime | None = None) -> str:
    """kubectl's AGE of an RFC 3339 creation time, coarsely: "45s", "12m", "3h", "2d"."""
    if not created:
        return "-"
    then = datetime.fromisoformat(created.replace("Z", "+00:00"))
    s = max(0, int(((now or datetime.now(timezone.utc)) - then).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size:
            return f"{s // size}{unit}"
    return f"{s}s"


def steps(job: RLJob) -> str:
    s = job.status
    if s is None or s.step is None:
        return "-"
    return f"{s.step}/{s.total_steps}" if s.total_steps is not None else str(s.step)


def number(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def idle(metrics: MetricsSnapshot) -> str:
    """The trainers' and the rollout fleet's idle shares of the last step, where reported (separate placement)."""
    shares = (("trainers", metrics.trainer_idle_fraction), ("rollout fleet", metrics.rollout_idle_fraction))
    return ", ".join(f"{who} {100 * share:.0f}%" for who, share in shares if share is not None)


def eta(job: RLJob) -> str:
    """The status's ETA while the job trains (or is restarting); "-" while it waits, is suspended or has ended."""
    s = job.status
    if s is None or s.phase not in ("Starting", "Running", "Restarting"):
        return "-"
    return duration(s.eta_seconds)


def table(rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("   ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows)


def list_table(jobs: list[RLJob], namespaces: bool = False, wide: bool = False) -> str:
    """`namespaces`: a NAMESPACE column first (list -A); `wide`: kubectl's -o wide, more columns after AGE."""
    rows = [["NAMESPACE"] * namespaces + ["NAME", "PHASE", "STEP", "PROGRESS", "ETA", "REWARD", "RESTARTS", "AGE"] + WIDE_HEADER * wide]
    for job in jobs:
        s = job.status
        rows.append(
            [job.metadata.namespace or ""] * namespaces
            + [
                job.metadata.name or "",
                (s and s.phase) or "-",
                steps(job),
                f"{s.progress}%" if s and s.progress is not None else "-",
                eta(job),
                number(s.metrics.reward_mean if s and s.metrics else None),
                str(s.restarts if s else 0),
                age(job.metadata.creation_timestamp),
            ]
            + (wide_columns(job) if wide else [])
        )
    return table(rows)


def status_text(job: RLJob, wide: bool = False) -> str:
    """`wide`: also the algorithm, the model, when the job was created, started and completed, and when each
    condition last changed."""
    s = job.status
    more = wide_lines(job) if wide else []
    if s is None:
        return "\n".join(
            f"{key + ':':<14}{value}"
            for key, value in [
                ("Name", job.metadata.name or ""),
                ("Namespace", job.metadata.namespace or ""),
                *more,
                ("Phase", "- (not yet reconciled)"),
            ]
        )
    progress = f" ({s.progress}%)" if s.progress is not None else ""
    validation = f"{number(s.validation_reward)} at step {s.validation_step}" if s.validation_reward is not None else "-"
    checkpoint = "-"
    if s.last_checkpoint is not None:
        when = f", {s.last_checkpoint.time.isoformat(timespec='seconds')}" if s.last_checkpoint.time else ""
        checkpoint = f"step {s.last_checkpoint.step} at {s.last_checkpoint.path}{when}"
    lines = [
        ("Name", job.metadata.name or ""),
        ("Namespace", job.metadata.namespace or ""),
        *more,
        ("Phase", s.phase or "-"),
        ("Step", steps(job) + progress),
        ("Progress", f"{s.progress}%" if s.progress is not None else "-"),
        ("ETA", eta(job) + (" (fewer than 3 steps timed since the pods started)" if eta(job) == "unknown" and s.step is not None else "")),
        ("Reward", number(s.metrics.reward_mean if s.metrics else None)),
        *([("Staleness", f"{s.metrics.staleness} version(s) behind")] if s.metrics and s.metrics.staleness is not None else []),
        *([("Idle", idle(s.metrics))] if s.metrics and idle(s.metrics) else []),
        ("Validation", validation),
        ("Restarts", str(s.restarts)),
        ("Preemptions", str(s.preemptions)),
        ("Checkpoint", checkpoint),
    ]
    out = [f"{key + ':':<14}{value}" for key, value in lines]
    out.append("Pods:" + ("" if s.roles else "         -"))
    for role, c in s.roles.items():
        out.append(f"  {role + ':':<12}{c.active} active, {c.ready} ready, {c.succeeded} succeeded, {c.failed} failed")
    out.append("Conditions:" + ("" if s.conditions else "   -"))
    if s.conditions:
        rows = [["TYPE", "STATUS", "REASON"] + ["LAST TRANSITION"] * wide + ["MESSAGE"]] + [
            [c.type, c.status, c.reason] + [c.last_transition_time.isoformat(timespec="seconds")] * wide + [c.message] for c in s.conditions
        ]
        out += ["  " + line for line in table(rows).splitlines()]
    return "\n".join(out)


def seconds(text: str) -> float:
    """--timeout: seconds, or with a unit like kubectl's (90, 90s, 30m, 2h)."""
    found = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*", text)
    if not found:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration: give seconds (600) or 30s, 10m, 2h")
    return float(found[1]) * {"": 1, "s": 1, "m": 60, "h": 3600}[found[2]]


# --- the commands ------------------------------------------------------------------------------------


def _client(args: argparse.Namespace) -> RLJobClient:
    from kuberl.client import RLJobClient

    return RLJobClient(
        context=getattr(args, "context", None), namespace=getattr(args, "namespace", None), kubeconfig=getattr(args, "kubeconfig", None)
    )


def _submit(args: argparse.Namespace) -> int:
    from kuberl.client import ClientError

    if (args.file is None) == (args.filename is None):
        raise ClientError("name the manifest once: kuberl submit FILE, or -f FILE (-f - reads it from stdin)")
    file = args.file if args.file is not None else args.filename
    # stdin's bytes, read within the same bounds as a file's (kuberl.operator.validation.yaml_reader).
    job = _client(args).submit(sys.stdin.buffer if file == "-" else file)
    print(job.metadata.name)
    return 0


def _list(args: argparse.Namespace) -> int:
    client = _client(args)
    everywhere = args.all_namespaces
    if args.output in ("yaml", "json"):
        print(dump(as_list(client.list_objects(all_namespaces=everywhere)["items"]), args.output))
        return 0
    from kuberl.client import InvalidJobError

    jobs, unreadable = [], []
    for raw in client.list_objects(all_namespaces=everywhere)["items"]:
        try:  # one job this version cannot read (another version's fields, a spec the CRD let by) hides no other
            jobs.append(client.parse_live(raw))
        except InvalidJobError:
            unreadable.append(f"{raw['metadata'].get('namespace')}/{raw['metadata'].get('name')}")
    if jobs:
        print(list_table(jobs, namespaces=everywhere, wide=args.output == "wide"))
    elif not unreadable:
        where = "any namespace" if everywhere else f"namespace {client.namespace}"
        print(f"No RLJobs in {where}.", file=sys.stderr)
    for name in unreadable:
        print(f"warning: RLJob {name} cannot be read by this kuberl; -o yaml shows it as the API server has it", file=sys.stderr)
    return 0


def _status(args: argparse.Namespace) -> int:
    client = _client(args)
    if args.output in ("yaml", "json"):
        print(dump(client.get_object(args.name), args.output))
    else:
        print(status_text(client.get(args.name), wide=args.output == "wide"))
    return 0


def _version(args: argparse.Namespace) -> int:
    """The client's version, then the operator's when a cluster is configured (see kuberl.client.operators)."""
    from importlib.metadata import version

    from kuberl.client import ForbiddenError, NoKubeconfigError
    from kuberl.client.operators import CHART_NAMESPACE, OPERATOR_SELECTOR
    from kuberl.operator.api import API_VERSION

    print(f"kuberl {version('kuberl')} (API {API_VERSION})", flush=True)
    if args.client_only:
        return 0
    try:
        client = _client(args)
    except NoKubeconfigError:
        return 0  # no cluster configured at all: the client's version is all there is
    where = getattr(args, "namespace", None)
    try:
        found = client.operators(where)
    except ForbiddenError:
        if where is not None:
            raise
        where = CHART_NAMESPACE  # a user who may not list Deployments everywhere: where the install docs put the chart
        try:
            found = client.operators(where)
        except ForbiddenError as exc:
            print(f"operator: unknown ({exc})")
            return 0
    if not found:
        print(
            f"operator: not found (no Deployment labelled {OPERATOR_SELECTOR} in "
            f"{'any namespace' if where is None else 'namespace ' + where})"
        )
    for deployment in found:
        print(deployment.line())
    return 0


def previous_attempt(job: RLJob, role: str | None = None) -> list[str]:
    """How the job's last failed attempt ended, as the operator kept it: the pod blamed for it and its last words
    (the rank's report, or the tail of its log); [] when no attempt has failed (of that role)."""
    failures = [f for f in (job.status.failures if job.status else []) if role is None or f.role == role]
    if not failures:
        return []
    last = failures[-1]
    code = "" if last.exit_code is None else f", exit code {last.exit_code}"
    who = f"pod {last.pod}" if last.pod else "a pod that is gone"
    lines = [f"attempt {last.attempt} ended: {who} (role {last.role}{code}, {last.reason})"]
    return lines + [f"[{last.pod or last.role}] {line}" for line in last.message.splitlines()]


def _logs(args: argparse.Namespace) -> int:
    if args.previous:
        if args.follow or args.rank is not None:
            print("error: --previous shows the failed pod of the last failed attempt: no --follow or --rank with it", file=sys.stderr)
            return 1
        lines = previous_attempt(_client(args).get(args.name), args.role)
        if not lines:
            print(f"error: {args.name} has no failed attempt{' of role ' + args.role if args.role else ''} to show", file=sys.stderr)
            return 1
        print("\n".join([lines[0], *(lines[1:][-args.tail :] if args.tail else lines[1:])]))
        return 0
    for line in _client(args).logs(args.name, role=args.role, rank=args.rank, follow=args.follow, tail=args.tail):
        print(line, flush=args.follow)
    return 0


def _wait(args: argparse.Namespace) -> int:
    status = _client(args).wait(args.name, args.phase, timeout=args.timeout)
    done = f" at step {status.step}/{status.total_steps}" if status.step is not None and status.total_steps else ""
    print(f"{args.name} {status.phase}{done}")
    return 0


def _suspend(args: argparse.Namespace) -> int:
    _client(args).suspend(args.name)
    print(f"{args.name} suspended: its pods stop at a step boundary with a checkpoint")
    return 0


def _resume(args: argparse.Namespace) -> int:
    _client(args).resume(args.name)
    print(f"{args.name} resumed: it continues from its last checkpoint")
    return 0


def _delete(args: argparse.Namespace) -> int:
    _client(args).delete(args.name)
    print(f"{args.name} deleted")
    return 0


def guarded(command: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """One line on stderr and exit 1 on any error; 130 on Ctrl-C (e.g. ending `logs -f`)."""

    def run(args: argparse.Namespace) -> int:
        from kuberl.client import ClientError, InvalidJobError

        try:
            return command(args)
        except KeyboardInterrupt:
            return 130
        except BrokenPipeError:  # `kuberl logs ... | head`
            sys.stderr.close()
            return 0
        except InvalidJobError as exc:
            for problem in exc.problems:
                print(f"error: {problem}", file=sys.stderr)
            return 1
        except ClientError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        except Exception as exc:
            if os.environ.get("KUBERL_DEBUG"):
                raise
            print(f"error: {type(exc).__name__}: {exc} (KUBERL_DEBUG=1 shows where)".replace("\n", " "), file=sys.stderr)
            return 1

    run.__name__ = command.__name__
    return run


def cluster_options(suppress: bool) -> argparse.ArgumentParser:
    """--namespace/-n, --context, --kubeconfig; `suppress`: leave them unset when not given (a subcommand's copy must
    not overwrite what was given before the subcommand)."""
    default = argparse.SUPPRESS if suppress else None
    options = argparse.ArgumentParser(add_help=False)
    group = options.add_argument_group("cluster")
    group.add_argument("-n", "--namespace", default=default, help="the namespace (default: the context's, else default)")
    group.add_argument("--context", default=default, help="the kubeconfig context (default: its current one)")
    group.add_argument("--kubeconfig", default=default, help="the kubeconfig file (default: $KUBECONFIG, then ~/.kube/config)")
    return options


def add_job_commands(sub: argparse._SubParsersAction) -> None:
    """Register the job commands as subcommands of `sub` (the `kuberl` parser's, or `kubectl rl`'s)."""
    common = [cluster_options(suppress=True)]

    def command(name: str, func: Callable, help: str, description: str | None = None) -> argparse.ArgumentParser:
        parser = sub.add_parser(name, help=help, description=description or help, parents=common)
        parser.set_defaults(func=guarded(func))
        return parser

    p = command(
        "submit",
        _submit,
        "validate an RLJob manifest and create it (or update its runPolicy); prints its name",
        "Validate an RLJob manifest as `kuberl validate` does (the API's rules and the cluster's), then create the "
        "job, or update it when one of that name exists: only spec.runPolicy (suspend, backoffLimit, deadlines) can "
        "change on a live job. Prints the job's name.",
    )
    p.add_argument("file", metavar="FILE", nargs="?", help="a manifest holding one RLJob (.yaml, .yml, .json); - for stdin")
    p.add_argument("-f", "--filename", metavar="FILE", help="the manifest, as kubectl names it; -f - reads it from stdin")
    p = command("list", _list, "the namespace's RLJobs: phase, step, progress, ETA, reward, restarts, age")
    p.add_argument("-A", "--all-namespaces", action="store_true", help="every namespace's RLJobs, with a NAMESPACE column")
    output(p, "wide: also preemptions, algorithm and the reason of the current condition")
    p = command("status", _status, "one RLJob's phase, progress, ETA, rewards, checkpoint, conditions and pods")
    p.add_argument("name", metavar="NAME")
    output(p, "wide: also the algorithm, the model, when it was created, started and completed, and when each condition changed")
    p = command("logs", _logs, "the log of a job's pods: one rank's, one role's, or all (prefixed with the pod's name)")
    p.add_argument("name", metavar="NAME")
    p.add_argument("--role", help="actor, critic, ref, reward, rollout, or initializer (default: every trainer pod)")
    p.add_argument("--rank", type=int, help="the pod that runs this rank of the job's world (rank 0: the controller)")
    p.add_argument("-f", "--follow", action="store_true", help="keep printing lines as they come, until the pods end")
    p.add_argument("--tail", type=int, metavar="LINES", help="only the last LINES lines of each pod")
    p.add_argument(
        "-p",
        "--previous",
        action="store_true",
        help="how the last failed attempt ended: the pod whose failure restarted (or ended) the job, and its last "
        "words as the operator kept them (the rank's report, or its log's tail), after its pods are gone",
    )
    p = command(
        "wait",
        _wait,
        "wait until an RLJob reaches a phase",
        "Wait until the RLJob reaches PHASE. Exit status 1 when it ends (Succeeded or Failed) in another phase, "
        "or when --timeout passes first.",
    )
    p.add_argument("name", metavar="NAME")
    p.add_argument("--for", dest="phase", default="Succeeded", metavar="PHASE", help="the phase (default: Succeeded)")
    p.add_argument("--timeout", type=seconds, metavar="SECONDS", help="give up after this long (90, 30m, 2h; default: no limit)")
    for name, func, text in (
        ("suspend", _suspend, "suspend an RLJob: its pods stop at a step boundary with a checkpoint"),
        ("resume", _resume, "resume a suspended RLJob from its last checkpoint"),
        ("delete", _delete, "delete an RLJob and its pods (checkpoints on claims stay)"),
    ):
        command(name, func, text).add_argument("name", metavar="NAME")
    p = command(
        "version",
        _version,
        "the client's version and, when a cluster is configured, its kuberl operator's",
        "Print the version of this kuberl and of the API it speaks; then, when a kubeconfig (or a pod's "
        "ServiceAccount) names a cluster, the kuberl operator the chart installed there: the chart's "
        "app.kubernetes.io/version label of the operator's Deployment and the image it runs, looked for in every "
        "namespace (in the namespace given with -n; in kuberl-system when you may not list Deployments "
        "everywhere). `operator: not found` when there is none.",
    )
    p.add_argument("--client", dest="client_only", action="store_true", help="only the client's version: ask no cluster")


def output(parser: argparse.ArgumentParser, wide: str) -> None:
    parser.add_argument(
        "-o", "--output", choices=OUTPUTS, metavar="FORMAT", help=f"yaml or json: the RLJob objects as the API server returns them; {wide}"
    )


def plugin_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kubectl rl",
        parents=[cluster_options(suppress=False)],
        description="RLJobs (kuberl.dev) from kubectl: the job commands of `kuberl`. Put kubectl-rl on PATH and run `kubectl rl`.",
    )
    add_job_commands(parser.add_subparsers(dest="command", required=True, metavar="COMMAND"))
    return parser


def plugin_main(argv: list[str] | None = None) -> int:
    """`kubectl-rl`: kubectl runs it for `kubectl rl ARGS` with ARGS as they were typed."""
    args = plugin_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(plugin_main())
