"""`kuberl operator`: kopf watches RLJobs, our cache watches their children, our work queue reconciles."""

from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kopf
import urllib3
import yaml
from kubernetes import client, config
from kubernetes.client.rest import ApiException
from prometheus_client import start_http_server

from ..api import GROUP, PLURAL, VERSION
from .child_cache import ChildCache, Key
from .controller import IO_THREADS_PER_WORKER, OperatorMetrics, Reconciler
from .work_queue import WorkQueue, run_workers
from .children import OperatorSettings
from .jobset import CRD as JOBSET_CRD

log = logging.getLogger("kuberl.operator")


@dataclass(frozen=True)
class OperatorOptions:
    kubeconfig: str | None = None
    """None: $KUBECONFIG, else the pod's ServiceAccount, else ~/.kube/config (load_client_configuration)."""
    context: str | None = None
    """A context of the kubeconfig; None: its current one."""
    namespaces: tuple[str, ...] = ()
    """Empty: every namespace."""
    metrics_port: int = 8000
    health_port: int = 8080
    workers: int = 4
    settings: OperatorSettings = OperatorSettings()


class ConfigurationError(RuntimeError):
    """No usable cluster configuration (a missing or broken kubeconfig, no such context); the message is one line."""


class Unreachable(RuntimeError):
    """The API server did not answer at start; the message is one line."""


def load_client_configuration(kubeconfig: str | None, context: str | None = None) -> client.Configuration:
    """The cluster to work with, found as controller-runtime finds it: `kubeconfig`, then $KUBECONFIG (a list of
    files, as kubectl reads it), then the pod's ServiceAccount, then ~/.kube/config. ConfigurationError otherwise."""
    configuration = client.Configuration()
    path = kubeconfig or os.environ.get("KUBECONFIG") or None
    in_pod = bool(os.environ.get("KUBERNETES_SERVICE_HOST"))
    if path is None and not (in_pod and context is None):
        home = Path("~/.kube/config").expanduser()
        if not home.is_file():
            raise ConfigurationError(
                f"no kubeconfig: pass --kubeconfig or set KUBECONFIG ({home} does not exist)"
                + ("" if in_pod else ", or run in a pod with a ServiceAccount")
            )
        path = str(home)
    try:
        if path is None:
            config.load_incluster_config(client_configuration=configuration)
            return configuration
        files = [f for f in path.split(os.pathsep) if f]
        if not any(Path(f).is_file() for f in files):
            raise ConfigurationError(f"no kubeconfig at {path}")
        if context is not None:
            names = [c["name"] for c in config.list_kube_config_contexts(config_file=path)[0]]
            if context not in names:
                raise ConfigurationError(f"no context {context!r} in the kubeconfig {path}; its contexts: {', '.join(names) or 'none'}")
        config.load_kube_config(config_file=path, context=context, client_configuration=configuration, persist_config=False)
    except ConfigurationError:
        raise
    except (config.ConfigException, OSError, ValueError, TypeError, KeyError, AttributeError, yaml.YAMLError) as exc:
        where = f"the kubeconfig {path}" if path else "the pod's ServiceAccount"
        raise ConfigurationError(" ".join(f"cannot use {where}: {exc}".split())) from None
    return configuration


def bearer_token(configuration: client.Configuration) -> str | None:
    """The bearer token the kubernetes client would send, for kopf's own HTTP client.

    In a pod, `load_incluster_config` stores "bearer <token>" (lower case) and re-reads the rotated
    ServiceAccount token through a refresh hook, which `get_api_key_with_prefix` runs; a kubeconfig
    stores "Bearer <token>"; a hand-made configuration may keep the prefix apart.
    """
    for key in ("authorization", "BearerToken"):
        raw = (configuration.get_api_key_with_prefix(key) or "").strip()
        if raw:
            scheme, _, rest = raw.partition(" ")
            return rest.strip() if scheme.lower() == "bearer" and rest else raw
    return None


# A change of a child enqueues its job this much later: the events of a burst (a JobSet's pods being
# made, scheduled, started) then cost one reconcile, not one each. An RLJob's own changes go at once.
CHILD_EVENT_DELAY_SECONDS = 1.0


def build_registry(
    queue: WorkQueue, configuration: client.Configuration, options: OperatorOptions, reconciler: Reconciler, metrics: OperatorMetrics
) -> kopf.OperatorRegistry:
    """kopf's handlers, in a registry of their own (no module-level state)."""
    registry = kopf.OperatorRegistry()

    @kopf.on.startup(registry=registry)
    async def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        # Watches end and reconnect regularly, so a silently dead connection cannot stall us.
        settings.watching.server_timeout = 300
        settings.watching.client_timeout = 330
        settings.watching.connect_timeout = 30
        settings.networking.request_timeout = 60
        settings.posting.level = logging.WARNING
        loop = asyncio.get_running_loop()
        children = reconciler.children
        if children is not None:

            def child_changed(kind: str, key: Key, event: str, _obj: dict) -> None:  # in an informer's thread
                if kind == "configmaps" and event in ("DELETED", "LISTED"):
                    reconciler.forget_support(key)  # one of the job's support objects may be gone: put it back
                if kind == "workloads" and not children.objects("jobsets", key):
                    return  # the Workload of a JobSet that is not an RLJob's
                if not loop.is_closed():  # closed: the operator is stopping
                    loop.call_soon_threadsafe(queue.add, key, CHILD_EVENT_DELAY_SECONDS)

            children.start(child_changed)
        loop.create_task(start_workers())

    async def start_workers() -> None:
        children = reconciler.children
        if children is not None:
            # No reconcile before the cache holds what exists: it would see a job's children as missing.
            while not await asyncio.to_thread(children.wait_synced, 30.0):
                log.warning("still listing the jobs' children; reconciles wait for the lists")
            log.info("the jobs' children are listed and watched; reconciling")
        await run_workers(queue, reconciler, metrics, options.workers)

    @kopf.on.login(registry=registry)
    def login(**_: Any) -> kopf.ConnectionInfo:
        token = bearer_token(configuration)
        return kopf.ConnectionInfo(
            server=configuration.host,
            ca_path=configuration.ssl_ca_cert,
            insecure=not configuration.verify_ssl,
            scheme="Bearer" if token else None,
            token=token,
            certificate_path=configuration.cert_file,
            private_key_path=configuration.key_file,
        )

    # The handler is a coroutine: it runs on the event loop, as the work queue must (a plain function
    # would run in kopf's thread pool, and an asyncio.Event is not to be set from another thread).
    @kopf.on.event(GROUP, VERSION, PLURAL, registry=registry)
    async def rljob_changed(namespace: str | None, name: str, meta: Any, type: str | None, **_: Any) -> None:
        assert namespace is not None  # an RLJob is namespaced
        key = (namespace, name)
        # Our own status write coming back: the reconcile that made it has done what it calls for.
        if type == "MODIFIED" and reconciler.wrote(key, meta.get("resourceVersion")):
            return
        queue.add(key)

    return registry


class MissingPrerequisite(RuntimeError):
    """The cluster lacks something the operator cannot work without; the message says how to add it."""


JOBSET_INSTALL = "kubectl apply --server-side -f https://github.com/kubernetes-sigs/jobset/releases/download/v0.12.0/manifests.yaml"


def check_prerequisites(configuration: client.Configuration) -> None:
    """JobSet runs every RLJob's pods: without its CRD, no job could start. Say so once, at start."""
    api = client.ApiextensionsV1Api(client.ApiClient(configuration))
    # urllib3 warns of each retry; at start, the one line below says it all.
    retries = logging.getLogger("urllib3.connectionpool")
    level = retries.level
    retries.setLevel(logging.ERROR)
    try:
        # A timeout: a server that never answers must end the start with a line, not hang it.
        api.read_custom_resource_definition(JOBSET_CRD, _request_timeout=30)
    except ApiException as exc:
        if exc.status == 404:
            raise MissingPrerequisite(
                f"JobSet is not installed in this cluster (no CRD {JOBSET_CRD}): kuberl runs each RLJob "
                f"as a JobSet. Install JobSet v0.12 or later first: {JOBSET_INSTALL}"
            ) from None
        if exc.status == 401:
            raise ConfigurationError(f"the API server at {configuration.host} does not accept the operator's credentials (401)") from None
        raise
    except (urllib3.exceptions.HTTPError, OSError) as exc:
        raise Unreachable(f"cannot reach the API server at {configuration.host}: {getattr(exc, 'reason', None) or exc}") from None
    finally:
        retries.setLevel(level)


def run(options: OperatorOptions) -> None:
    """Run until interrupted."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # kopf logs every handler call at INFO; ours only enqueue, so only their failures are news.
    logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    configuration = load_client_configuration(options.kubeconfig, options.context)
    check_prerequisites(configuration)
    metrics = OperatorMetrics()
    start_http_server(options.metrics_port, registry=metrics.registry)
    # Each worker's reconcile may have IO_THREADS_PER_WORKER requests in flight: a connection for each,
    # or urllib3 drops the extras and the next requests pay for a new TLS handshake.
    configuration.connection_pool_maxsize = max(configuration.connection_pool_maxsize or 0, options.workers * IO_THREADS_PER_WORKER + 2)
    # The cache's watches hold connections of their own, in a client of their own.
    children = ChildCache(client.ApiClient(configuration), options.namespaces)
    reconciler = Reconciler(client.ApiClient(configuration), options.settings, metrics, workers=options.workers, children=children)
    queue = WorkQueue()
    registry = build_registry(queue, configuration, options, reconciler, metrics)
    log.info(
        "kuberl operator: watching %s; metrics on :%d, health on :%d",
        ", ".join(options.namespaces) or "all namespaces",
        options.metrics_port,
        options.health_port,
    )
    kopf.run(
        registry=registry,
        standalone=True,
        clusterwide=not options.namespaces,
        namespaces=list(options.namespaces),
        liveness_endpoint=f"http://0.0.0.0:{options.health_port}/healthz",
    )
