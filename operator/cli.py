"""The `kuberl` command line."""

from __future__ import annotations

import argparse
import sys
from importlib.metadata import version
from pathlib import Path

from .api import API_VERSION
from .crd import crd_yaml
from .manifest import ManifestError, load_rljobs
from .planner import OperatorSettings


def _cmd_version(args: argparse.Namespace) -> int:
    print(f"kuberl {version('kuberl')} (API {API_VERSION})")
    return 0


def _cmd_crd(args: argparse.Namespace) -> int:
    sys.stdout.write(crd_yaml())
    return 0


def _cmd_validate(args: argparse.Namespace) -> int:
    failed = 0
    for name in args.files:
        try:
            jobs = load_rljobs(Path(name))
        except ManifestError as exc:
            failed += 1
            for problem in exc.problems:
                print(f"error: {problem}", file=sys.stderr)
            continue
        for job in jobs:
            print(f"ok: {name}: RLJob {job.metadata.name or job.metadata.generate_name} ({job.spec.algorithm.name})")
    if failed:
        print(f"{failed} of {len(args.files)} file(s) invalid", file=sys.stderr)
    return 1 if failed else 0


def _cmd_operator(args: argparse.Namespace) -> int:
    from .main import OperatorOptions, run  # kopf and the client load only for this command

    run(OperatorOptions(
        kubeconfig=args.kubeconfig,
        namespaces=tuple(args.namespace),
        metrics_port=args.metrics_port,
        health_port=args.health_port,
        workers=args.workers,
        settings=OperatorSettings(default_image=args.default_image),
    ))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kuberl", description="RL post-training of LLMs on Kubernetes.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    sub.add_parser("version", help="print the version").set_defaults(func=_cmd_version)
    sub.add_parser("crd", help="print the RLJob CustomResourceDefinition (YAML)").set_defaults(func=_cmd_crd)
    validate = sub.add_parser(
        "validate",
        help="check RLJob manifests against the API's schema and rules",
        description="Check RLJob manifests. Documents of other kinds in the same files are skipped. "
        "Exit status 1 when any file has an error.",
    )
    validate.add_argument("files", nargs="+", metavar="FILE")
    validate.set_defaults(func=_cmd_validate)

    op = sub.add_parser(
        "operator",
        help="run the RLJob operator",
        description="Run the RLJob operator: in a pod it uses its ServiceAccount, elsewhere --kubeconfig.",
    )
    op.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster ServiceAccount)")
    op.add_argument("--namespace", action="append", default=[], help="watch only this namespace (repeatable)")
    op.add_argument("--metrics-port", type=int, default=8000, help="Prometheus /metrics port (default 8000)")
    op.add_argument("--health-port", type=int, default=8080, help="liveness and readiness /healthz port (default 8080)")
    op.add_argument("--workers", type=int, default=4, help="RLJobs reconciled at once (default 4)")
    op.add_argument("--default-image", default=OperatorSettings().default_image, help="trainer image for RLJobs that name none")
    op.set_defaults(func=_cmd_operator)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
