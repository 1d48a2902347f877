"""Which pods hold a job's role or rank, and their logs as lines (followed, from several pods at once)."""

from __future__ import annotations

import queue
import threading
import time
from typing import Any, Callable, Iterator

from kuberl.operator.control.children import INITIALIZER, JOBSET_RESTART_LABEL, LABEL_COMPONENT, LABEL_ROLE

INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
CONTAINER = "trainer"
ROLE_ORDER = ("actor", "critic", "ref", "reward", "rollout")  # the order of the ranks in the job's world


def pod_name(pod: dict[str, Any]) -> str:
    return pod["metadata"]["name"]


def pod_role(pod: dict[str, Any]) -> str | None:
    labels = pod["metadata"].get("labels", {})
    if labels.get(LABEL_COMPONENT) == INITIALIZER:
        return INITIALIZER
    return labels.get(LABEL_ROLE)


def _env(pod: dict[str, Any], name: str) -> str | None:
    for container in pod.get("spec", {}).get("containers", []):
        for var in container.get("env", []):
            if var.get("name") == name and "value" in var:
                return var["value"]
    return None


def pod_ranks(pod: dict[str, Any]) -> range:
    """The ranks a trainer pod runs: its first is KUBERL_ROLE_RANK_OFFSET + completion index * KUBERL_PROCS_PER_POD."""
    offset, per_pod = _env(pod, "KUBERL_ROLE_RANK_OFFSET"), _env(pod, "KUBERL_PROCS_PER_POD")
    index = pod["metadata"].get("annotations", {}).get(INDEX_ANNOTATION)
    if offset is None or per_pod is None or index is None or not (offset + per_pod + index).isdigit():
        return range(0)
    first = int(offset) + int(index) * int(per_pod)
    return range(first, first + int(per_pod))


def _attempt(pod: dict[str, Any]) -> int:
    value = pod["metadata"].get("labels", {}).get(JOBSET_RESTART_LABEL, "0")
    return int(value) if value.isdigit() else 0


def select_pods(pods: list[dict[str, Any]], role: str | None, rank: int | None) -> list[dict[str, Any]]:
    """The pods of the newest gang attempt with `role` (all the job's trainer pods when None; "initializer" for the
    initializer's), holding `rank` when given, in rank order."""
    if role is None:
        chosen = [p for p in pods if pod_role(p) not in (None, INITIALIZER)]
    else:
        chosen = [p for p in pods if pod_role(p) == role]
    if chosen and role != INITIALIZER:
        newest = max(map(_attempt, chosen))
        chosen = [p for p in chosen if _attempt(p) == newest]
    if rank is not None:
        chosen = [p for p in chosen if rank in pod_ranks(p)]
    order = {r: i for i, r in enumerate(ROLE_ORDER)}
    return sorted(chosen, key=lambda p: (order.get(pod_role(p) or "", len(order)), p_first(p), pod_name(p)))


def p_first(pod: dict[str, Any]) -> int:
    ranks = pod_ranks(pod)
    return ranks.start if ranks else -1


def container_of(pod: dict[str, Any]) -> str | None:
    names = [c["name"] for c in pod.get("spec", {}).get("containers", [])]
    return CONTAINER if CONTAINER in names else (names[0] if names else None)


def lines_of(response: Any) -> Iterator[str]:
    """The lines of a streamed HTTP response (urllib3), decoded, without their newlines; the last one even unterminated."""
    pending = b""
    try:
        for chunk in response.stream(4096, decode_content=True):
            pending += chunk
            *complete, pending = pending.split(b"\n")
            for line in complete:
                yield line.decode("utf-8", errors="replace")
        if pending:
            yield pending.decode("utf-8", errors="replace")
    finally:
        response.release_conn()


def merged(streams: list[tuple[str, Callable[[], Iterator[str]]]]) -> Iterator[str]:
    """Lines of several pods' logs as they come, each prefixed with its pod's name; ends when every stream has.
    An error in one stream is raised here, after the lines before it."""
    lines: queue.Queue = queue.Queue(maxsize=1000)
    done = object()

    def pump(prefix: str, open_stream: Callable[[], Iterator[str]]) -> None:
        try:
            for line in open_stream():
                lines.put(f"[{prefix}] {line}")
        except BaseException as exc:  # handed to the reader
            lines.put(exc)
        finally:
            lines.put(done)

    threads = [threading.Thread(target=pump, args=s, daemon=True) for s in streams]
    for thread in threads:
        thread.start()
    running = len(threads)
    while running:
        item = lines.get()
        if item is done:
            running -= 1
        elif isinstance(item, BaseException):
            raise item
        else:
            yield item


def wait_until(check: Callable[[], bool], poll: float, deadline: float | None) -> bool:
    while not check():
        if deadline is not None and time.monotonic() >= deadline:
            return False
        time.sleep(poll)
    return True
