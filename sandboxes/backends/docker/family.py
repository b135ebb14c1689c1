"""Forked sessions in one container (`fork()`): the family of sessions sharing it, the ``docker exec``
relays that carry a fork's channel (`runtime/forkrelay.py`), and how a member leaves (the last removes
the container; any other ends only its own processes)."""

from __future__ import annotations

import concurrent.futures
import itertools
import socket
import threading
from collections.abc import Callable
from typing import Any

from ...errors import ForkError
from ...worker import ForkPlan
from .daemon import RESOURCES, client, remove_container
from .settings import HELPER_COMMAND


class Family:
    """The sessions sharing one container: its first session and the forks made in it (`fork()`).

    Members are plain tokens (a finalizer may leave on a worker's behalf). Only the last member to
    leave removes the container (or, in a shared container, calls `finish` with its stream: the
    session host then ends and cleans the family's uid); the others end their own runner's
    processes (`forkrelay.py`)."""

    _tokens = itertools.count(1)

    def __init__(self, container_id: str, finish: Callable[[socket.socket], None] | None = None) -> None:
        self.container_id = container_id
        self.members: set[int] = set()
        self.lock = threading.Lock()
        self.finish = finish

    def join(self) -> int:
        with self.lock:
            token = next(self._tokens)
            self.members.add(token)
            return token

    def leave(self, token: int) -> bool:
        """Remove `token`; True when nobody is left (the caller then removes the container)."""
        with self.lock:
            self.members.discard(token)
            return not self.members


def drop_relay(plan: ForkPlan) -> None:
    """Close the relay of a fork given up (it then ends; the runner removed the directory itself)."""
    relay = plan.state.pop("relay", None)
    if relay is not None:
        end_relay_stream(relay)


def end_relay_stream(attach: Any) -> None:
    """End a relay's attach stream now: the relay reads end-of-file and exits.

    Closing the socket alone is not enough: the SDK's file object over it (`attach`) holds another
    reference, so the descriptor stayed open until garbage collection found it, and a dropped spare
    relay lived on past its session's close. A shutdown acts at once, whoever holds the descriptor."""
    raw: socket.socket = getattr(attach, "_sock", attach)
    try:
        raw.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    for closing in (attach, raw):
        try:
            closing.close()
        except OSError:
            pass


def listen_answer(plan: ForkPlan) -> tuple[str, str, int]:
    """The socket path, secret and runner pid of a ``listen`` fork's answer, checked (`ForkError`)."""
    path, secret, pid = plan.answer.get("path"), plan.answer.get("secret"), plan.answer.get("pid")
    if (
        not isinstance(path, str)
        or not isinstance(secret, str)
        or isinstance(pid, bool)
        or not isinstance(pid, int)
        or not 1 < pid < 1 << 22  # Linux's PID_MAX_LIMIT; 1 is the container's init
        or any(c in path for c in "\n ")  # one line "PATH SECRET" for the relay
        or not secret.isalnum()
    ):
        raise ForkError(f"the runner's fork_channel answer is malformed: {str(plan.answer)[:200]}")
    return path, secret, pid


def start_relay(container_id: str, user: str, path: str, secret: str) -> Any:
    """A fresh relay for a fork, told where to connect (blocking): its attach socket."""
    attach = start_exec_relay(container_id, user)
    raw: socket.socket = getattr(attach, "_sock", attach)
    try:
        raw.sendall(f"{path} {secret}\n".encode())
    except OSError as exc:
        raw.close()
        raise ForkError("the fork's relay closed its stream at once") from exc
    return attach


def start_exec_relay(container_id: str, user: str) -> Any:
    """``forkrelay.py relay`` in the container, as the session's user: its attach socket (blocking).
    It waits for its first line (where to connect) on that stream."""
    import docker.errors

    api = client().api
    try:
        created = api.exec_create(
            container_id, [*HELPER_COMMAND, "relay"], stdin=True, stdout=True, stderr=True, user=user
        )
        return api.exec_start(created["Id"], socket=True)
    except docker.errors.APIError as exc:
        raise ForkError(f"Docker could not start the fork's relay: {exc.explanation or exc}") from exc


def close_relay(future: concurrent.futures.Future[Any]) -> None:
    """Done-callback for a spare relay no longer wanted: end its stream once it has started."""
    try:
        attach = future.result()
    except Exception:
        return
    end_relay_stream(attach)


def run_helper(container_id: str, user: str, args: tuple[str, ...]) -> None:
    """Run ``forkrelay.py ARGS`` in the container as `user` and wait for it (blocking). Never raises."""
    try:
        api = client().api
        created = api.exec_create(container_id, [*HELPER_COMMAND, *args], stdout=True, stderr=True, user=user)
        api.exec_start(created["Id"])  # returns once the helper has exited
    except Exception:  # the container is gone already, or the daemon is down
        pass


def leave(family: Family, member: int, user: str, sock: socket.socket, ending: tuple[str, ...]) -> None:
    """One session of `family` ends (blocking): the last removes the container, any other its own
    processes (`ending`: the helper's arguments), then its stream closes."""
    if family.leave(member):
        if family.finish is not None:
            family.finish(sock)
        else:
            remove_container(family.container_id, sock)
        return
    run_helper(family.container_id, user, ending)
    try:
        sock.close()
    except OSError:
        pass


def leave_later(family: Family, member: int, user: str, sock: socket.socket, ending: tuple[str, ...]) -> None:
    """Finalizer of a family member nobody closed: `leave` in the background."""
    try:
        RESOURCES.submit("background", leave, family, member, user, sock, ending)
    except RuntimeError:  # interpreter shutting down
        leave(family, member, user, sock, ending)
