"""The line between the controller and a role on ranks of its own: commands one way, replies the other.

The controller (global rank 0) sends a command ("logprobs", "values", "train", "score", "save",
"stopping", "stop") with its payload over the role's gloo link (role_worlds.ObjectLink); the role's
first rank answers, after every rank of the role has done its part (runtime/role_worker.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .role_worlds import ObjectLink


class RoleLink:
    """The line between the controller and one role's ranks."""

    # On the link, the controller is rank 0 and the role's first rank is rank 1.
    CONTROLLER, ROLE = 0, 1

    def __init__(self, role: str, link: ObjectLink):
        self.role, self.link = role, link
        self.pending = 0

    # controller side
    def send(self, command: str, payload: Any = None) -> None:
        self.link.broadcast((command, payload), root=self.CONTROLLER)
        if command != "stop":
            self.pending += 1

    def result(self) -> Any:
        """The reply to the oldest command still unanswered."""
        assert self.pending > 0, f"no command to {self.role} is waiting for its reply"
        self.pending -= 1
        reply = self.link.broadcast(None, root=self.ROLE)
        if isinstance(reply, RoleFailure):
            raise RuntimeError(f"role {self.role}: {reply.message}")
        return reply

    def call(self, command: str, payload: Any = None) -> Any:
        self.send(command, payload)
        return self.result()

    # role side
    def receive(self) -> tuple[str, Any]:
        return self.link.broadcast(None, root=self.CONTROLLER)

    def reply(self, value: Any) -> None:
        self.link.broadcast(value, root=self.ROLE)


@dataclass(frozen=True)
class RoleFailure:
    """What a role replies when a command failed on its first rank (the controller raises it)."""

    message: str


def serve_commands(link: RoleLink, handlers: Any) -> bool:
    """The serving end of a role's link: answer each command with `handlers`' method `_<command>` until "stop".
    True when the job completed, False when it stopped early. A command that fails is answered with a
    RoleFailure (the controller raises it with the role named), then raised here: this rank ends like any
    failed rank."""
    while True:
        command, payload = link.receive()
        if command == "stop":
            return bool((payload or {}).get("completed", True))
        try:
            handler = getattr(handlers, f"_{command}", None)
            if handler is None:
                raise ValueError(f"no such command on role {link.role}")
            result = handler(payload)
        except Exception as exc:
            link.reply(RoleFailure(f"{command} failed: {type(exc).__name__}: {exc}"))
            raise
        link.reply(result)


class RemoteRewardModel:
    """The controller's stand-in for a reward model on ranks of its own (what the Rewarder calls)."""

    def __init__(self, link: RoleLink):
        self.link = link

    def score_batch(self, prompts, responses) -> list[float]:
        return self.link.call("score", {"prompts": list(prompts), "responses": list(responses)})
