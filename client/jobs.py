"""RLJobClient: RLJobs through the Kubernetes API with the user's kubeconfig."""

from __future__ import annotations

import builtins
import functools
import json
import os
import time
from pathlib import Path
from typing import Any, BinaryIO, Iterator

from kuberl.operator.api import GROUP, KIND, PHASES, PLURAL, VERSION, RLJob, RLJobStatus
from kuberl.operator.api.spec import IMMUTABLE_FIELDS
from kuberl.operator.control.children import LABEL_JOB
from kuberl.operator.validation.manifest import ManifestError, parse_rljob

from . import logs as L
from .errors import (
    ClientError,
    ConfigError,
    CRDNotInstalledError,
    ImmutableFieldsError,
    NoKubeconfigError,
    InvalidJobError,
    NotFoundError,
    PhaseError,
    UnreachableError,
    WaitTimeoutError,
    api_status,
    forbidden,
    problems_error,
)
from .operators import OPERATOR_SELECTOR, OperatorDeployment

TERMINAL = ("Succeeded", "Failed")
REQUEST_TIMEOUT = 10.0
"""Seconds for a request that only informs (`version`): a cluster that does not answer must not hang it."""
IN_CLUSTER_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


class RLJobClient:
    """Submit, read, wait for, follow and stop RLJobs, as the user of a kubeconfig.

    `context`: a context of the kubeconfig (default: its current one); `namespace`: where the jobs are
    (default: the context's namespace, else "default"); `kubeconfig`: the file (default: $KUBECONFIG, then
    ~/.kube/config; inside a pod with neither, the pod's ServiceAccount). Every method raises a ClientError
    subclass with a one-line message: CRDNotInstalledError, ForbiddenError, NotFoundError, InvalidJobError, ...
    """

    def __init__(self, context: str | None = None, namespace: str | None = None, kubeconfig: str | os.PathLike | None = None):
        from kubernetes import client, config

        self._explicit_namespace = namespace is not None
        # An empty $KUBECONFIG is unset, as for kubectl (the kubernetes package would read a file named "").
        default = Path("~/.kube/config").expanduser()
        path = str(kubeconfig) if kubeconfig is not None else os.environ.get("KUBECONFIG") or None
        in_cluster = path is None and context is None and not default.exists() and os.environ.get("KUBERNETES_SERVICE_HOST")
        try:
            if in_cluster:
                configuration = client.Configuration()
                config.load_incluster_config(client_configuration=configuration)
                self.api_client = client.ApiClient(configuration)
                default_namespace = IN_CLUSTER_NAMESPACE.read_text().strip() if IN_CLUSTER_NAMESPACE.exists() else "default"
                self.context = None
            else:
                if path is None and not default.exists():
                    raise NoKubeconfigError(f"no kubeconfig: {default} does not exist; pass --kubeconfig (kubeconfig=) or set KUBECONFIG")
                if kubeconfig is not None and not Path(kubeconfig).is_file():
                    raise ConfigError(f"no kubeconfig at {path}")
                path = path or str(default)
                contexts, current = config.list_kube_config_contexts(config_file=path)
                chosen = current if context is None else next((c for c in contexts if c["name"] == context), None)
                if chosen is None:
                    names = ", ".join(c["name"] for c in contexts) or "none"
                    raise ConfigError(f"no context {context!r} in the kubeconfig {path}; its contexts: {names}")
                self.api_client = config.new_client_from_config(config_file=path, context=chosen["name"], persist_config=False)
                default_namespace = (chosen.get("context") or {}).get("namespace") or "default"
                self.context = chosen["name"]
        except ClientError:
            raise
        except (config.ConfigException, OSError, ValueError, TypeError, KeyError) as exc:
            where = path or default
            raise ConfigError(f"cannot use the kubeconfig {where}: {exc}") from None
        self.namespace = namespace or default_namespace
        self.server = self.api_client.configuration.host
        self.custom = client.CustomObjectsApi(self.api_client)
        self.core = client.CoreV1Api(self.api_client)

    def close(self) -> None:
        self.api_client.close()

    def __enter__(self) -> "RLJobClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- the calls ------------------------------------------------------------------------------

    def submit(self, job_or_path: RLJob | dict[str, Any] | str | os.PathLike | BinaryIO) -> RLJob:
        """`job_or_path`: a model, a dict, a manifest's path, or an open binary stream of one (stdin: sys.stdin.buffer).
        Validate (the API's rules, then the cluster's: every path on a volume of its pods) and create the RLJob;
        when one of that name exists, update it. Only spec.runPolicy can change on a live job (suspend, backoffLimit,
        deadlines): any other change raises ImmutableFieldsError, naming the fields, before anything is sent."""
        from kuberl.operator.validation.cluster_rules import cluster_problems

        job, raw, source = self._parse(job_or_path)
        try:
            # The allow-lists (volume sources, RuntimeClasses, ...) are the cluster's chart's to apply: its admission
            # policy refuses what it does not allow, naming the field.
            problems = cluster_problems(job, source, policy=None)
        except ValueError as exc:
            raise InvalidJobError(f"{source}: {exc}") from None
        if problems:
            raise problems_error(problems)
        namespace = self._namespace_of(job, source)
        # What a user sets; a job read back from the cluster also carries uid, resourceVersion, status, ...
        meta = {k: v for k, v in (raw.get("metadata") or {}).items() if k in ("name", "generateName", "labels", "annotations")}
        raw = {**{k: v for k, v in raw.items() if k != "status"}, "metadata": {**meta, "namespace": namespace}}
        name = job.metadata.name
        try:
            created = self._call(
                "create", namespace, lambda: self.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, raw)
            )
            return self._parse_live(created)
        except _Exists:
            pass
        assert name is not None  # a job named by generateName alone never exists already
        live = self.get(name, namespace=namespace)
        # Both sides through the model, so that defaults the API server filled in compare equal to fields left out.
        before, after = live.spec.to_manifest(), job.spec.to_manifest()
        changed = [f"spec.{f}" for f in IMMUTABLE_FIELDS if before.get(f) != after.get(f)]
        if changed:
            raise ImmutableFieldsError(
                f"{', '.join(changed)} cannot change on the live RLJob {namespace}/{name} (only spec.runPolicy can): "
                f"delete it first (kuberl delete {name}) or submit the job under another name"
            )
        wanted = job.spec.run_policy.to_manifest()
        if live.spec.run_policy.to_manifest() == wanted:
            return live  # nothing to change
        patch = [{"op": "add", "path": "/spec/runPolicy", "value": wanted}]  # add replaces a member that exists
        return self._parse_live(
            self._call(
                "patch",
                namespace,
                lambda: self.custom.patch_namespaced_custom_object(
                    GROUP, VERSION, namespace, PLURAL, name, patch, _content_type="application/json-patch+json"
                ),
                name=name,
            )
        )

    def get(self, name: str, namespace: str | None = None) -> RLJob:
        """The RLJob with its status, as the typed API model."""
        return self._parse_live(self.get_object(name, namespace))

    def get_object(self, name: str, namespace: str | None = None) -> dict[str, Any]:
        """The RLJob exactly as the API server returns it (what `status -o yaml` prints): also a job whose fields this
        version of kuberl cannot read."""
        namespace = namespace or self.namespace
        return self._call(
            "get", namespace, lambda: self.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name), name=name
        )

    def list(self, all_namespaces: bool = False) -> list[RLJob]:
        """The namespace's RLJobs (with `all_namespaces`, every namespace's), by namespace and name."""
        return [self._parse_live(item) for item in self.list_objects(all_namespaces)["items"]]

    def list_objects(self, all_namespaces: bool = False) -> dict[str, Any]:
        """The RLJobList exactly as the API server returns it, its items by namespace and name."""
        if all_namespaces:
            found = self._call("list", None, lambda: self.custom.list_cluster_custom_object(GROUP, VERSION, PLURAL))
        else:
            found = self._call(
                "list", self.namespace, lambda: self.custom.list_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL)
            )
        found["items"] = sorted(found.get("items") or [], key=lambda o: (o["metadata"].get("namespace", ""), o["metadata"]["name"]))
        return found

    def operators(self, namespace: str | None = None) -> builtins.list[OperatorDeployment]:  # list: the method above
        """The kuberl operators the chart installed (its Deployments, found by their labels) in `namespace`, else in
        every namespace (ForbiddenError when the user may not list Deployments there)."""
        from kubernetes import client

        apps = client.AppsV1Api(self.api_client)
        found = self._call(
            "list",
            namespace,
            lambda: (
                apps.list_namespaced_deployment(namespace, label_selector=OPERATOR_SELECTOR, _request_timeout=REQUEST_TIMEOUT)
                if namespace
                else apps.list_deployment_for_all_namespaces(label_selector=OPERATOR_SELECTOR, _request_timeout=REQUEST_TIMEOUT)
            ),
            resource="deployments",
        )
        return sorted(map(OperatorDeployment.of, found.items), key=lambda d: (d.namespace, d.name))

    def wait(self, name: str, phase: str = "Succeeded", timeout: float | None = None, poll: float = 1.0) -> RLJobStatus:
        """Wait until the job is in `phase` and return its status. Raises PhaseError when it ends (Succeeded or
        Failed) in another phase, WaitTimeoutError after `timeout` seconds (None: no limit)."""
        if phase not in PHASES:
            raise ClientError(f"{phase!r} is not a phase of an RLJob; the phases: {', '.join(PHASES)}")
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            status = self.get(name).status or RLJobStatus()
            if status.phase == phase:
                return status
            if status.phase in TERMINAL:
                why = _current_condition(status)
                raise PhaseError(f"{self.namespace}/{name} ended {status.phase}, not {phase}" + (f": {why}" if why else ""))
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeoutError(
                    f"{self.namespace}/{name} is not {phase} after {timeout:g} s: it is {status.phase or 'not yet reconciled'}"
                )
            time.sleep(poll if deadline is None else max(0.0, min(poll, deadline - time.monotonic())))

    def logs(
        self, name: str, role: str | None = None, rank: int | None = None, follow: bool = False, tail: int | None = None
    ) -> Iterator[str]:
        """The log lines of the job's pods: of the pod that runs `rank` (a rank of the job's world), else of every
        pod of `role` ("actor", "critic", "ref", "reward", "rollout", or "initializer"), else of every trainer pod; lines of
        several pods are prefixed with "[POD] ". With `follow`, the lines keep coming until the pods end (and a job
        whose pods do not exist yet is waited for)."""
        job = self.get(name)  # a clear NotFoundError for a job that does not exist
        roles = [*job.spec.roles.pods(), *(["initializer"] if job.spec.hub_fields() else [])]
        if role is not None and role not in roles:
            raise NotFoundError(f"{self.namespace}/{name} has no pods of role {role} (its roles with pods: {', '.join(roles)})")
        while True:
            pods = json.loads(
                self._call(
                    "list",
                    self.namespace,
                    lambda: self.core.list_namespaced_pod(self.namespace, label_selector=f"{LABEL_JOB}={name}", _preload_content=False),
                    resource="pods",
                ).data
            )["items"]
            chosen = L.select_pods(pods, role, rank)
            phase = job.status.phase if job.status else None
            if chosen or not follow or phase in TERMINAL or (rank is not None and L.select_pods(pods, role, None)):
                break
            time.sleep(1.0)  # following a job whose pods do not exist yet (queued, initializing): wait for them
            job = self.get(name)
        if not chosen:
            what = " ".join(filter(None, [f"of role {role}" if role else "", f"running rank {rank}" if rank is not None else ""]))
            ranks = sorted(r for p in L.select_pods(pods, role, None) for r in L.pod_ranks(p))
            known = f" (its ranks: {ranks[0]}-{ranks[-1]})" if rank is not None and ranks else ""
            state = job.status.phase if job.status and job.status.phase else "not yet reconciled"
            raise NotFoundError(f"{self.namespace}/{name} has no pod{' ' + what if what else ''}{known}: it is {state}")
        if len(chosen) == 1:
            return self._pod_log(chosen[0], follow, tail)
        return L.merged([(L.pod_name(p), functools.partial(self._pod_log, p, follow, tail)) for p in chosen])

    def suspend(self, name: str) -> RLJob:
        """runPolicy.suspend: the pods stop at a step boundary with a checkpoint and go; resume continues from it."""
        return self._set_suspend(name, True)

    def resume(self, name: str) -> RLJob:
        return self._set_suspend(name, False)

    def delete(self, name: str) -> None:
        """Delete the RLJob; the garbage collector removes its pods and other children (checkpoints on claims stay)."""
        self._call(
            "delete",
            self.namespace,
            lambda: self.custom.delete_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, name),
            name=name,
        )

    # --- helpers --------------------------------------------------------------------------------

    def _set_suspend(self, name: str, suspend: bool) -> RLJob:
        body = {"spec": {"runPolicy": {"suspend": suspend}}}
        return self._parse_live(
            self._call(
                "patch",
                self.namespace,
                lambda: self.custom.patch_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, name, body),
                name=name,
            )
        )

    def _pod_log(self, pod: dict[str, Any], follow: bool, tail: int | None) -> Iterator[str]:
        name, container = L.pod_name(pod), L.container_of(pod)
        while True:
            try:
                response = self.core.read_namespaced_pod_log(
                    name, self.namespace, container=container, follow=follow, tail_lines=tail, _preload_content=False
                )
                break
            except Exception as exc:
                status = getattr(exc, "status", None)
                message = api_status(getattr(exc, "body", None)).get("message", "")
                if status == 400 and "waiting to start" in message and follow:
                    time.sleep(1.0)  # the container is being created: its log begins when it starts
                    continue
                if status == 400 and message:
                    raise ClientError(f"no log of pod {name} yet: {message}") from None
                self._raise(exc, "get", self.namespace, resource="pods/log", name=name)
        return L.lines_of(response)

    def _parse(self, job_or_path: RLJob | dict[str, Any] | str | os.PathLike | BinaryIO) -> tuple[RLJob, dict[str, Any], str]:
        """(the model, the object to send, where it came from)."""
        from kuberl.operator.validation.manifest import is_rljob_document, read_documents, read_manifest, rljob_documents_from_text

        try:
            if isinstance(job_or_path, RLJob):
                return job_or_path, job_or_path.to_manifest(), "the RLJob"
            if isinstance(job_or_path, dict):
                source = "the RLJob " + str(job_or_path.get("metadata", {}).get("name", ""))
                return parse_rljob(job_or_path, source.strip()), job_or_path, source.strip()
            # Read once, within the reader's bounds: a stream (stdin) cannot be read twice, a file may change between reads.
            if isinstance(job_or_path, (str, os.PathLike)):
                path, text = str(job_or_path), read_manifest(Path(job_or_path))
            else:
                path = str(getattr(job_or_path, "name", "the stream"))
                text = read_manifest(job_or_path, path)
            documents = rljob_documents_from_text(text, path)
            if len(documents) != 1:
                raise InvalidJobError(f"{path} holds {len(documents)} RLJobs: submit one at a time (one per file)")
            raw = [d.content for d in read_documents(text, path) if is_rljob_document(d.content)]
            source, job = documents[0]
            return job, raw[0], source
        except ManifestError as exc:
            raise problems_error(exc.problems) from None

    def _namespace_of(self, job: RLJob, source: str) -> str:
        named = job.metadata.namespace
        if named and self._explicit_namespace and named != self.namespace:
            raise InvalidJobError(
                f"{source}: metadata.namespace is {named}, but the namespace asked for is {self.namespace}: "
                "drop one of them, or make them agree"
            )
        return named or self.namespace

    def parse_live(self, raw: dict[str, Any]) -> RLJob:
        """An RLJob as the API server returned it; InvalidJobError when this version of kuberl cannot read it."""
        return self._parse_live(raw)

    def _parse_live(self, raw: dict[str, Any]) -> RLJob:
        meta = raw.get("metadata", {})
        try:
            return parse_rljob(raw, f"{meta.get('namespace')}/{meta.get('name')}")
        except ManifestError as exc:  # a job this version of kuberl cannot read (another API version's fields)
            raise problems_error(exc.problems) from None

    def _call(self, verb: str, namespace: str | None, request, name: str | None = None, resource: str = PLURAL):
        try:
            return request()
        except Exception as exc:
            if (
                verb == "create"
                and getattr(exc, "status", None) == 409
                and api_status(getattr(exc, "body", None)).get("reason") == "AlreadyExists"
            ):
                raise _Exists() from None
            self._raise(exc, verb, namespace, resource=resource, name=name)

    def _raise(self, exc: Exception, verb: str, namespace: str | None, resource: str = PLURAL, name: str | None = None):
        """Turn what the kubernetes client raised into a ClientError with one line of explanation."""
        status = getattr(exc, "status", None)
        if status is None:
            import urllib3

            if isinstance(exc, (urllib3.exceptions.HTTPError, OSError)):
                reason = getattr(exc, "reason", None) or exc
                raise UnreachableError(f"cannot reach the API server at {self.server}: {reason}") from None
            raise exc
        body = getattr(exc, "body", None)
        answer = api_status(body)
        message = answer.get("message") or (body.strip() if isinstance(body, str) else "") or str(getattr(exc, "reason", ""))
        if status == 401:
            raise ClientError(
                f"the API server at {self.server} does not accept your credentials (401): log in again or check the kubeconfig's user"
            ) from None
        if status == 403:
            raise forbidden(body, verb, resource, namespace) from None
        if status == 404:
            details = answer.get("details") or {}
            if resource == PLURAL and not answer:
                # Not a Status but the mux's "404 page not found": the server has no rljobs resource at all.
                raise CRDNotInstalledError(
                    f"the {KIND} CRD is not installed in the cluster at {self.server}: helm install "
                    "the chart (helm/kuberl), or kubectl apply --server-side -f crds/"
                ) from None
            if details.get("kind") == "namespaces":
                raise NotFoundError(f"namespace {details.get('name', namespace)} not found") from None
            if resource == "pods/log":  # the pod exists (it was just listed): its node does not serve the log
                raise NotFoundError(f"no log of pod {name} in namespace {namespace}: {message}") from None
            what = "RLJob" if resource == PLURAL else "pod" if resource.startswith("pods") else resource
            raise NotFoundError(f"{what} {name or details.get('name', '')} not found in namespace {namespace}") from None
        if status == 422 or status == 400:
            causes = [f"{c.get('field', '')}: {c.get('message', '')}".lstrip(": ") for c in (answer.get("details") or {}).get("causes", [])]
            raise InvalidJobError(f"the API server refused the RLJob: {message}", causes or [message]) from None
        if status == 409:
            raise ClientError(f"{namespace}/{name} changed while it was being updated: try again ({message})") from None
        where = f"in namespace {namespace}" if namespace else "across all namespaces"
        raise ClientError(f"the API server answered {status} to {verb} {resource} {where}: {message}") from None


class _Exists(Exception):
    """Create found an RLJob of that name."""


def _current_condition(status: RLJobStatus) -> str:
    for condition in status.conditions:
        if condition.type == status.phase and condition.status == "True":
            return f"{condition.reason}: {condition.message}" if condition.message else condition.reason
    return ""
