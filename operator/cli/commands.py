"""The `kuberl` command line."""

from __future__ import annotations

import argparse
import ipaddress
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from ..api.crd import crd_yaml
from ..validation.manifest import ManifestError, load_rljob_documents, manifest_files
from ..validation.problems import NoRLJob
from ..control.children import OperatorSettings

if TYPE_CHECKING:
    from ..validation.admission import AdmissionPolicy


def _cmd_crd(args: argparse.Namespace) -> int:
    sys.stdout.write(crd_yaml())
    return 0


def _admission_policy(args: argparse.Namespace) -> "AdmissionPolicy":
    from ..validation.admission import AdmissionPolicy

    return AdmissionPolicy(
        allowed_volume_sources=tuple(args.allow_volume_source),
        allowed_runtime_classes=tuple(args.allow_runtime_class),
        allow_control_plane_tolerations=args.allow_control_plane_tolerations,
        allowed_sandbox_egress=tuple(args.allow_sandbox_egress),
        allow_sandbox_dns=args.allow_sandbox_dns,
    )


def _add_admission_flags(parser: argparse.ArgumentParser, what: str) -> None:
    from ..validation.admission import (
        DEFAULT_VOLUME_SOURCES,
        VALUE_CONTROL_PLANE,
        VALUE_RUNTIME_CLASSES,
        VALUE_SANDBOX_DNS,
        VALUE_SANDBOX_EGRESS,
        VALUE_VOLUME_SOURCES,
        VOLUME_SOURCES,
    )

    parser.add_argument(
        "--allow-volume-source",
        action="append",
        default=[],
        choices=VOLUME_SOURCES,
        metavar="SOURCE",
        help=f"{what} this volume source beyond {', '.join(DEFAULT_VOLUME_SOURCES)} (repeatable; the chart's {VALUE_VOLUME_SOURCES})",
    )
    parser.add_argument(
        "--allow-runtime-class",
        action="append",
        default=[],
        metavar="NAME",
        help=f"{what} this RuntimeClass (repeatable; none by default; the chart's {VALUE_RUNTIME_CLASSES})",
    )
    parser.add_argument(
        "--allow-control-plane-tolerations",
        action="store_true",
        help=f"{what} tolerations of the control plane's taints (the chart's {VALUE_CONTROL_PLANE})",
    )
    parser.add_argument(
        "--allow-sandbox-egress",
        action="append",
        default=[],
        metavar="CIDR",
        type=_sandbox_cidr,
        help=f"{what} to let their tool sandbox pods reach this network, named as written (repeatable; none "
        f"by default; the chart's {VALUE_SANDBOX_EGRESS})",
    )
    parser.add_argument(
        "--allow-sandbox-dns",
        action="store_true",
        help=f"{what} to let their tool sandbox pods ask the cluster's DNS (the chart's {VALUE_SANDBOX_DNS})",
    )


def _cmd_validate(args: argparse.Namespace) -> int:
    from ..validation.admission import cluster_checks
    from ..validation.cluster_rules import cluster_problems

    files = manifest_files(args.files, recursive=args.recursive)
    if not files:
        print(f"error: no manifests (.yaml, .yml, .json) in {', '.join(args.files)}", file=sys.stderr)
        return 1
    named = {Path(name) for name in args.files if not Path(name).is_dir()}
    failed = skipped = 0
    for path in files:
        try:
            documents = load_rljob_documents(path)
            policy = _admission_policy(args)
            if args.local:
                from .local_checks import local_model_problems

                problems = [p for source, job in documents for p in local_model_problems(job, source, path.parent)]
            else:
                problems = [p for source, job in documents for p in cluster_problems(job, source, policy=policy)]
            if problems:
                raise ManifestError(problems)
        except NoRLJob as exc:
            if path in named:  # asked for by name: a file with no RLJob is a mistake
                failed += 1
                print(f"error: {exc.problems[0]}", file=sys.stderr)
            else:  # found in a folder, as `kubectl apply -f DIR` would: the job's claims, a kustomization, ...
                skipped += 1
                print(f"skipped: {path}: no RLJob ({', '.join(dict.fromkeys(exc.kinds)) or 'empty'})")
            continue
        except ManifestError as exc:
            failed += 1
            for problem in exc.problems:
                print(f"error: {problem}", file=sys.stderr)
            continue
        except Exception as exc:  # noqa: BLE001 - files come from anyone: a file's failure is a line, never a traceback
            failed += 1
            print(
                f"error: {path}: could not be validated ({type(exc).__name__}: {exc}); please report this file to the kuberl maintainers",
                file=sys.stderr,
            )
            continue
        for _, job in documents:
            print(f"ok: {path}: RLJob {job.metadata.name or job.metadata.generate_name} ({job.spec.algorithm.name})")
            if not args.local:
                for check in cluster_checks(job.spec):
                    print(f"  needs the cluster: the chart's admission policy checks {check}")
    if failed:
        print(f"{failed} of {len(files) - skipped} file(s) invalid", file=sys.stderr)
    elif skipped == len(files):
        print(f"error: no RLJob in {', '.join(args.files)}", file=sys.stderr)
        return 1
    return 1 if failed else 0


def _cmd_algorithms(args: argparse.Namespace) -> int:
    try:
        from kuberl.engine import algorithms as A  # torch: the engine's extra, not the operator's image
    except ImportError as exc:
        print(f"error: listing the algorithms needs the engine (pip install 'kuberl[engine]'): {exc}", file=sys.stderr)
        return 1
    import inspect

    from kuberl.engine.config.algorithm import option_manifest_name

    def options(entry: A.AdvantageEstimator | A.PolicyLoss) -> str:
        """As a manifest spells them (advantage.options, policyLoss.options): camelCase, GAE's lambda as lambda."""
        shown = [
            option_manifest_name(name) + ("" if default is inspect.Parameter.empty else f"={json.dumps(default)}")
            for name, default in entry.options.items()
        ]
        return ", ".join(shown) or "-"

    print("advantage estimators")
    for e in sorted(A.ADVANTAGES.values(), key=lambda e: e.name):
        needs = ", ".join(
            n
            for n, on in (
                ("critic", e.needs_critic),
                (f"samplesPerPrompt >= {e.min_samples}", e.min_samples > 1),
                ("a greedy rollout per prompt", e.needs_greedy),
                ("one more forward of the actor (squared probabilities)", e.needs_pi_squared),
            )
            if on
        )
        print(f"  {e.name:<26} {e.summary}\n  {'':<26} options: {options(e)}; needs: {needs or '-'}")
    print("policy losses")
    for loss in sorted(A.POLICY_LOSSES.values(), key=lambda e: e.name):
        traits = "".join(
            f"; {t}" for t, on in (("over preference pairs", loss.pairs), ("corrects the rollout itself", loss.corrects_rollout)) if on
        )
        print(f"  {loss.name:<26} {loss.summary}\n  {'':<26} options: {options(loss)}{traits}")
    from kuberl.engine.steps import STEPS

    print("step functions (algorithm.step)")
    for step in sorted(STEPS.values(), key=lambda e: e.name):
        print(f"  {step.name:<26} {step.summary}")
    print("presets (algorithm.name)")
    from kuberl.engine.config.algorithm import AlgorithmSpec

    for name in A.PRESETS:
        choice = A.choice_of(AlgorithmSpec(name=name))
        print(
            f"  {name:<26} {A.PRESETS[name].summary}\n  {'':<26} advantage {choice.advantage or '-'}, policy loss {choice.policy_loss}, "
            f"step {choice.step}"
        )
    return 0


def _network_peer(text: str) -> dict:
    """--metrics-peer: a NetworkPolicy peer as JSON; anything else is refused with what a peer looks like."""
    try:
        peer = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not JSON ({exc}); give a NetworkPolicy peer such as "
            '\'{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}\''
        )
    if (
        not isinstance(peer, dict)
        or not peer
        or set(peer) - {"namespaceSelector", "podSelector"}
        or not all(isinstance(v, dict) for v in peer.values())
    ):
        raise argparse.ArgumentTypeError(
            f"{text!r}: a peer is an object with namespaceSelector and/or podSelector, each a "
            "label selector (matchLabels, matchExpressions)"
        )
    return peer


def _sandbox_cidr(text: str) -> str:
    """--allow-sandbox-egress: a network as a job's egress must name it (no host bits set)."""
    try:
        ipaddress.ip_network(text, strict=True)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not a network ({exc}); give a CIDR such as 203.0.113.0/24")
    return text


def _network(text: str) -> "ipaddress.IPv4Network | ipaddress.IPv6Network":
    """--tool-network: a CIDR such as 10.0.0.0/8 (a bare address is one host)."""
    try:
        return ipaddress.ip_network(text, strict=False)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not a network ({exc}); give a CIDR such as 10.96.0.0/12")


def _cmd_operator(args: argparse.Namespace) -> int:
    from ..control.manager import ConfigurationError, MissingPrerequisite, OperatorOptions, Unreachable, run  # kopf loads only here

    try:
        run(
            OperatorOptions(
                kubeconfig=args.kubeconfig,
                context=args.context,
                namespaces=tuple(args.namespace),
                metrics_port=args.metrics_port,
                health_port=args.health_port,
                workers=args.workers,
                settings=OperatorSettings(
                    default_image=args.default_image,
                    hub_endpoint=args.hub_endpoint,
                    admission=_admission_policy(args),
                    network_policy=args.network_policy,
                    metrics_peers=tuple(args.metrics_peer),
                    tool_networks=tuple(str(n) for n in args.tool_network),
                ),
            )
        )
    except (MissingPrerequisite, ConfigurationError) as exc:  # restarting cannot help: 3
        print(f"kuberl operator: {exc}", file=sys.stderr)
        return 3
    except Unreachable as exc:  # it may answer later: 1, and the pod's restart tries again
        print(f"kuberl operator: {exc}", file=sys.stderr)
        return 1
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    from .local_run import run_local

    try:
        return run_local(
            Path(args.file),
            run_dir=Path(args.out) if args.out else None,
            metrics_port=args.metrics_port,
            threads=args.threads,
            timeout_s=args.timeout,
        )
    except ManifestError as exc:
        for problem in exc.problems:
            print(f"error: {problem}", file=sys.stderr)
        return 1
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


def _cmd_smoke(args: argparse.Namespace) -> int:
    from .smoke import smoke

    return smoke(ranks=args.ranks, keep=args.keep)


def _cmd_worker(args: argparse.Namespace) -> int:
    if args.check:
        from kuberl.engine.runtime.install_check import main as check_main

        return check_main()
    from kuberl.engine.runtime.worker import main as worker_main

    return worker_main()


def _cmd_gpu_check(args: argparse.Namespace) -> int:
    from kuberl.engine.runtime.gpu_check import run

    return run(args)


def _cmd_sandbox_serve(args: argparse.Namespace) -> int:
    from kuberl.engine.agents.sandbox_server import serve

    return serve(args.port, host=args.host, scratch=args.scratch, wipe_also=tuple(args.wipe), backend=args.backend)


def _cmd_initialize(args: argparse.Namespace) -> int:
    from kuberl.engine.hub.initializer import main as initialize_main  # huggingface_hub: the trainer image's

    return initialize_main()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kuberl", description="RL post-training of LLMs on Kubernetes.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    sub.add_parser("crd", help="print the RLJob CustomResourceDefinition (YAML)").set_defaults(func=_cmd_crd)
    sub.add_parser(
        "algorithms",
        help="list the registered advantage estimators, policy losses and presets, with their options",
    ).set_defaults(func=_cmd_algorithms)
    validate = sub.add_parser(
        "validate",
        help="check RLJob manifests against the API's schema and rules",
        description="Check RLJob manifests as the API server and the operator will: the schema, the rules across "
        "fields, that every file the engine opens lies on a volume the pods mount, and the chart's admission defaults "
        "(volume sources, RuntimeClasses, unconfined profiles, control-plane tolerations; the --allow-* flags mirror the "
        "chart's admission values). What needs the cluster (that you may get each Secret the job names, and create pods "
        "when it names a ServiceAccount) is checked by the chart's admission policy when you apply it; validate lists "
        "those checks under each valid job. Documents of other kinds in the same files are skipped. Exit status 1 when "
        "any file has an error.",
    )
    validate.add_argument("files", nargs="+", metavar="FILE", help="a manifest, or a directory of them (.yaml, .yml, .json)")
    validate.add_argument("-R", "--recursive", action="store_true", help="read directories' subdirectories too")
    validate.add_argument(
        "--local",
        action="store_true",
        help="check for `kuberl run` on this machine: local paths are read where they are, no volumes needed; "
        "a model folder that is here is checked against the engine's families and the job's layouts",
    )
    _add_admission_flags(validate, "accept")
    validate.set_defaults(func=_cmd_validate)

    run = sub.add_parser(
        "run",
        help="run an RLJob manifest on this machine (one process per rank, no cluster)",
        description="Run one RLJob on this machine: every rank is a local process with the environment a pod would get. "
        "Exit status 0 when every rank finished, 1 when one failed (the reason is printed), 130 on Ctrl-C (SIGINT) "
        "and 143 on SIGTERM, after every rank has stopped at its next step boundary with a checkpoint.",
    )
    run.add_argument("file", metavar="FILE", help="the RLJob manifest")
    run.add_argument("--out", help="run folder for logs, metrics.jsonl and the reward curve (default: runs/<job name>)")
    run.add_argument("--metrics-port", type=int, help="Prometheus port of rank 0 (default: the job's; 0 disables)")
    run.add_argument("--threads", type=int, help="CPU threads per rank (default: cores / ranks)")
    run.add_argument(
        "--timeout",
        type=int,
        metavar="SECONDS",
        help="how long a rank waits for a silent peer in a collective before the run fails (default: the job's "
        "trainer.collectiveTimeoutSeconds, 600)",
    )
    run.set_defaults(func=_cmd_run)
    smoke = sub.add_parser(
        "smoke",
        help="one RL step of a tiny model over local ranks with the hybrid engine on: does everything work?",
    )
    smoke.add_argument("--ranks", type=int, default=2, choices=(2, 4), help="local ranks (default 2)")
    smoke.add_argument("--keep", action="store_true", help="keep the model, logs and metrics it wrote")
    smoke.set_defaults(func=_cmd_smoke)
    worker = sub.add_parser(
        "worker",
        help="run one rank of a job (the pod command; reads KUBERL_CONFIG, RANK, WORLD_SIZE, MASTER_ADDR, ...)",
    )
    worker.add_argument(
        "--check",
        action="store_true",
        help="run no job: check that every GPU code path is installed (torch's CUDA build, cuDNN, NCCL, "
        "megatron-core, vLLM's CUDA build and every kernel library) and say whether a GPU is present; "
        "exit status 1 when a part is missing",
    )
    worker.set_defaults(func=_cmd_worker)
    gpu_check = sub.add_parser(
        "gpu-check",
        help="check the engine's GPU path on this node's GPU (vLLM sampling, a packed training step, the "
        "weight switch, vLLM's sleep and wake, the optimizer's offload); prints a JSON report, exit status 1 on a failed check",
    )
    from kuberl.engine.runtime.gpu_check import add_arguments as gpu_check_arguments

    gpu_check_arguments(gpu_check)
    gpu_check.set_defaults(func=_cmd_gpu_check)
    sandbox = sub.add_parser(
        "sandbox-serve",
        help="serve a job's tool calls, one at a time, over HTTP (the sandbox pod's command)",
        description="Run the python and function tool calls of a job's trainers, one at a time, each with the best "
        "isolation this pod allows (bubblewrap, else a plain process: the pod is the boundary); after each call every "
        "other process of this server's tree is killed and the scratch folders are emptied.",
    )
    sandbox.add_argument("--port", type=int, required=True, help="the port to serve on (0: any free one)")
    sandbox.add_argument("--host", default="0.0.0.0", help="the address to listen on (default 0.0.0.0)")
    sandbox.add_argument("--scratch", help="the calls' scratch root, emptied after each call (default $TMPDIR or /tmp)")
    sandbox.add_argument(
        "--wipe", action="append", default=[], help="another folder emptied after each call (repeatable; a pod's /dev/shm)"
    )
    sandbox.add_argument(
        "--backend",
        default="auto",
        choices=("auto", "bubblewrap", "process"),
        help="auto (default): bubblewrap where it works here, else a plain process",
    )
    sandbox.set_defaults(func=_cmd_sandbox_serve)

    sub.add_parser(
        "initialize",
        help="fetch the hub repositories a job names into the cache volume (the initializer pod's command; reads "
        "KUBERL_CONFIG, HF_HUB_CACHE, HF_TOKEN, HF_ENDPOINT)",
        description="Fetch every hub repository of the job (model, tokenizer, reward model) into HF_HUB_CACHE, once. "
        "Exit status 0 when all are there, 3 when retrying cannot help (no such repository or revision, a refused "
        "token, a full volume), 1 otherwise. The report goes to /dev/termination-log for the operator.",
    ).set_defaults(func=_cmd_initialize)

    op = sub.add_parser(
        "operator",
        help="run the RLJob operator",
        description="Run the RLJob operator. It finds its cluster as controllers do: --kubeconfig, else $KUBECONFIG, "
        "else the pod's ServiceAccount, else ~/.kube/config. Exit status 3 when it cannot start and restarting cannot help "
        "(no usable kubeconfig, no such context, credentials refused, JobSet not installed), 1 when the API server does "
        "not answer.",
    )
    op.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, else the pod's ServiceAccount, else ~/.kube/config)")
    op.add_argument("--context", help="the kubeconfig's context (default: its current one)")
    op.add_argument("--namespace", action="append", default=[], help="watch only this namespace (repeatable)")
    op.add_argument("--metrics-port", type=int, default=8000, help="Prometheus /metrics port (default 8000)")
    op.add_argument("--health-port", type=int, default=8080, help="liveness and readiness /healthz port (default 8080)")
    op.add_argument("--workers", type=int, default=4, help="RLJobs reconciled at once (default 4)")
    op.add_argument("--default-image", help="trainer image for RLJobs that name none (without it, such a job is refused)")
    op.add_argument("--hub-endpoint", help="HF_ENDPOINT of the initializers: a Hugging Face hub mirror or proxy (default: the public hub)")
    op.add_argument(
        "--no-network-policy",
        dest="network_policy",
        action="store_false",
        help="give jobs no NetworkPolicy (default: one per job, ingress only from its own trainer pods)",
    )
    op.add_argument(
        "--metrics-peer",
        type=_network_peer,
        action="append",
        default=[],
        metavar="JSON",
        help="a NetworkPolicy peer (JSON with namespaceSelector and/or podSelector) that may reach a job's "
        "metrics port: your Prometheus (repeatable)",
    )
    op.add_argument(
        "--tool-network",
        type=_network,
        action="append",
        default=[],
        metavar="CIDR",
        help="a network that HTTP tools may reach although it is loopback, link-local, the node or the API "
        "server (repeatable; default: none)",
    )
    _add_admission_flags(op, "allow RLJobs")
    op.set_defaults(func=_cmd_operator)

    from .jobs import add_job_commands  # submit, list, status, logs, wait, suspend, resume, delete, version

    add_job_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
