"""The ray backend: sandbox sessions spread over a Ray cluster, each run by its node's host or Docker backend.

``open_executor("ray", node_backend="host", address=None, **node_options)``

Placement. Every node declares how many sandboxes it takes as the custom resource
``kodeagent_sandbox`` (``ray start --resources='{"kodeagent_sandbox": 8}'``; a cluster that declares
none is sized by its CPUs instead). A session reserves one unit in a placement group of a single
bundle; Ray's scheduler picks the node, and a session that finds the cluster full waits in Ray's queue
until a unit frees (up to `placement_timeout`). No scheduler of our own. A closed session's unit stays
with this process for `LINGER` seconds, so that the next session takes it at once instead of waiting for
Ray to learn from the node's next resource report that it is free.

Transport: one actor per node, sessions multiplexed on it (`raynode.NodeAgent`), not an actor per
session. Measured here on a local 3-node cluster: creating an actor costs 0.8-1.9 s (a new worker
process that then imports `sandboxes`), and each such process would start its own fork server and its
own warm pool, so every session would be a cold one; a placement group of one bundle costs about 4 ms
and a call to a running actor about 0.5-1.5 ms. So the node's agent is created once (named per node,
detached, so later drivers find it warm), holds the node's warm pools, and a session costs a placement
group plus one call. A plain call answered with the next event was also cheaper than a Ray streaming
generator (1.6 ms against 3 ms per round trip on the loaded machine), so a run is one call when the code
calls no tools, and one more per tool call.

Shape: the parent delegates whole runs to an executor of the node's backend living in the agent, rather
than tunnelling the runner's channel through a `Worker` subclass. The node-local executor then keeps
every backend-specific hook (Docker's init message and pool refill, the host's isolation levels), checks
liveness next to the worker without a cluster round trip, and enforces the timeout next to the worker,
so a slow network never stretches it. The parent keeps what must stay with the caller: tools run here
(the node holds async stubs that surface each call as an event; see `raynode`), and results are the
node's `ExecutionResult` with the duration measured here.

Faults. The agents are created with ``max_restarts=0`` and ``max_task_retries=0``: Ray never runs a
call twice, so a snippet never runs twice. A node (or agent) lost during a run makes that run return
``state_lost`` with error type ``WorkerCrashed``; the session is dropped and the next run places a
fresh one, which Ray puts on a live node; a dead agent's name is free again, so the next session on
that node gets a new agent. No cluster reachable at open raises `BackendUnavailable` with the fix.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, cast

import anyio

from ..errors import SandboxFileError, WorkerStartError
from ..executor import COMMON_OPTIONS, KILL_TIMEOUT, Executor, ExecutorOptions
from ..models import ExecutionError, ExecutionResult
from ..worker import Worker
from . import executor_class
from .raycluster import (
    SANDBOX_RESOURCE,
    Reservation,
    agent,
    capacity,
    check_job,
    connect,
    describe,
    drop_reservations,
    forget_agent,
    keep_reservation,
    ray_module,
    remove_group,
    reserve,
    sandbox_resource,
    take_reservation,
)
from .raynode import RAISABLE

__all__ = ["SANDBOX_RESOURCE", "RayExecutor", "capacity", "connect", "describe"]


NODE_BACKENDS = ("host", "docker")
RUN_SLACK = 60.0
"""Seconds past the session's timeout before the parent gives up on a node that does not answer (the
node enforces the timeout itself; this only catches a node that went silent)."""


# ---------------------------------------------------------------------- the executor


@dataclass
class Placement:
    """Where a session lives: its placement group (which holds the capacity), node and agent."""

    session_id: str
    reservation: Reservation
    agent: Any

    @property
    def node_id(self) -> str:
        return self.reservation.node_id


class RayExecutor(Executor):
    """Runs each session on a Ray cluster node, through that node's host or Docker backend.

    Args:
        node_backend: ``"host"`` or ``"docker"``: the backend that runs the session on its node.
        address: the cluster to join (``"HOST:PORT"``, ``"ray://HOST:PORT"``); None joins a running
            cluster of this machine if there is one, else starts a local one sized by its CPUs.
            A process already connected to Ray (``ray.init`` was called) keeps its connection.
        placement_timeout: seconds a session waits for free capacity on the cluster at open.
        init_options: extra keyword arguments of ``ray.init`` when this process connects.
        (and the common `ExecutorOptions`, passed on to the node's backend, whose own options are
        accepted too: ``isolation``, ``image``, ...; tools run here, in the parent)
    """

    backend = "ray"

    def __init__(
        self,
        *,
        node_backend: Literal["host", "docker"] = "host",
        address: str | None = None,
        placement_timeout: float = 300.0,
        init_options: Mapping[str, Any] | None = None,
        **options: Any,
    ) -> None:
        # The common `ExecutorOptions` are this executor's own (and passed on to the node's backend);
        # every other option belongs to the node's backend (`isolation`, `image`, ...).
        common = {name: value for name, value in options.items() if name in COMMON_OPTIONS}
        super().__init__(**cast(ExecutorOptions, common))
        if node_backend not in NODE_BACKENDS:
            raise ValueError(f"node_backend must be one of {', '.join(NODE_BACKENDS)}, not {node_backend!r}")
        self.node_backend = node_backend
        self.address = address
        self.placement_timeout = float(placement_timeout)
        self.init_options = dict(init_options or {})
        self.node_options: dict[str, Any] = {
            "policy": self.policy, "timeout": self.timeout, "env": self.env, "workdir": self.workdir,
            "stateless": self.stateless, "output_limit": self.output_limit,
            **{name: value for name, value in options.items() if name not in COMMON_OPTIONS},
        }  # fmt: skip
        # refuses unknown or invalid options now, not at open
        executor_class(node_backend)(**self.node_options)
        self._placement: Placement | None = None

    async def _start_worker(self) -> Worker:  # pragma: no cover - sessions are opened by `_place`
        raise NotImplementedError("the ray backend delegates whole sessions to its nodes")

    @property
    def node_id(self) -> str | None:
        """The Ray node id of the session's node (None before open, after close, after a lost node)."""
        return self._placement.node_id if self._placement else None

    # ----------------------------------------------------------------- lifecycle

    async def _open_session(self) -> None:
        """Connect to the cluster and place the session on a node. Raises `BackendUnavailable` when no
        cluster is reachable or it declares no capacity."""
        if not ray_module().is_initialized():
            await anyio.to_thread.run_sync(connect, self.address, self.init_options)
        await self._place()

    async def _close_session(self) -> None:
        """Close the session on its node and free its capacity."""
        placement, self._placement = self._placement, None
        if placement is not None:
            await _release(placement)

    async def _place(self) -> None:
        """Reserve a unit of capacity (Ray picks the node; or this process's idle reservation is reused),
        then open the session on that node's agent."""
        from ray.exceptions import RayActorError, RayError

        check_job()
        resource = sandbox_resource()
        for attempt in (1, 2, 3):
            reservation = take_reservation(resource) or await reserve(resource, self.placement_timeout)
            handle = agent(reservation.node_id)
            session_id = uuid.uuid4().hex
            try:
                answer = await handle.open.remote(session_id, reservation.group.id.hex(), self.node_backend,
                                                  self.node_options, sorted(self.tools))  # fmt: skip
            except RayActorError as exc:
                # The agent (or its node) died: forget it and its node's reservations; try once more.
                forget_agent(reservation.node_id)
                drop_reservations(reservation.node_id)
                remove_group(reservation.group)
                if attempt == 3:
                    raise WorkerStartError(
                        f"the Ray cluster could not start a session: {_describe(exc)}"
                    ) from exc
                continue
            except RayError as exc:
                remove_group(reservation.group)
                raise WorkerStartError(
                    f"the Ray cluster could not start a session: {_describe(exc)}"
                ) from exc
            except BaseException:
                remove_group(reservation.group)
                raise
            if answer["kind"] == "error":
                keep_reservation(reservation)
                raise RAISABLE.get(answer["type"], WorkerStartError)(answer["message"])
            self._placement = Placement(session_id, reservation, handle)
            self._isolation = answer["isolation"]
            return

    async def _lose(self, placement: Placement, exc: BaseException | None = None) -> None:
        """Drop a session whose node failed or went silent; the next run places a new one."""
        from ray.exceptions import RayActorError

        if self._placement is placement:
            self._placement = None
        if isinstance(exc, RayActorError):
            forget_agent(placement.node_id)
            drop_reservations(placement.node_id)
        with anyio.CancelScope(shield=True):
            await _release(placement, timeout=5.0, keep=False)

    # ----------------------------------------------------------------- running code

    async def _discard_worker(self) -> None:
        # A run cancelled mid-way: the session's state is unknown, so it is replaced.
        if self._placement is not None:
            await self._lose(self._placement)
        self._state_lost_pending = True

    async def _run_locked(self, code: str | bytes) -> ExecutionResult:
        from ray.exceptions import RayError

        if self._placement is None:
            await self._place()
        state_lost, self._state_lost_pending = self._state_lost_pending, False
        placement = self._placement
        assert placement is not None
        limit = self.timeout + RUN_SLACK
        try:
            with anyio.fail_after(limit):
                event = await placement.agent.run.remote(placement.session_id, code)
                while event["kind"] == "tool":
                    event = await self._serve_tool(placement, event)
        except TimeoutError:
            await self._lose(placement)
            return ExecutionResult(timed_out=True, state_lost=True, error=ExecutionError(
                type="Timeout", message=f"the cluster node did not answer within {limit:g} s; the session was "
                "dropped and the next run starts a fresh one; variables from earlier runs are lost"))  # fmt: skip
        except RayError as exc:
            await self._lose(placement, exc)
            return _node_lost(_describe(exc))
        if event["kind"] == "lost":
            await self._lose(placement)
            return _node_lost(event["message"])
        if event["kind"] == "error":
            raise RAISABLE.get(event["type"], WorkerStartError)(event["message"])
        result = ExecutionResult.model_validate(event["result"])
        result.state_lost = result.state_lost or state_lost
        return result

    async def _serve_tool(self, placement: Placement, call: dict[str, Any]) -> dict[str, Any]:
        """Call the tool here while waiting for the run's next event: if the node's timeout ends the run
        first, the tool is abandoned (a blocking one in its thread), as on the local backends."""
        from ray.exceptions import RayError

        async def answer() -> None:
            reply = await self._call_tool(call)
            try:
                await placement.agent.answer.remote(placement.session_id, call["id"], reply)
            except RayError:
                pass  # the node is gone: `next_event` below reports it

        failure: RayError | None = None
        async with anyio.create_task_group() as group:
            group.start_soon(answer)
            try:
                event: dict[str, Any] = await placement.agent.next_event.remote(placement.session_id)
            except RayError as exc:  # raised outside the group, so the caller sees it, not a group of it
                failure = exc
            group.cancel_scope.cancel()
        if failure is not None:
            raise failure
        return event

    # ----------------------------------------------------------------- state and files

    async def reset(self) -> None:
        """Forget every variable of the session (the working directory's files stay)."""
        self._check_usable()
        async with self._lock:
            if self._placement is None:
                await self._place()
            else:
                await self._node_call("reset")
            self._state_lost_pending = False

    async def upload(self, path: str, data: bytes | str) -> None:
        """Write a file into the session's working directory on its node (`path` is relative to it)."""
        self._check_usable()
        payload = data.encode() if isinstance(data, str) else bytes(data)
        async with self._lock:
            await self._node_call("upload", path, payload)

    async def download(self, path: str) -> bytes:
        """Read a file from the session's working directory on its node (`path` is relative to it)."""
        self._check_usable()
        async with self._lock:
            value: bytes = await self._node_call("download", path)
            return value

    async def _node_call(self, method: str, *args: Any) -> Any:
        from ray.exceptions import RayError

        if self._placement is None:
            await self._place()
        placement = self._placement
        assert placement is not None
        try:
            with anyio.fail_after(self.timeout + RUN_SLACK):
                answer = await getattr(placement.agent, method).remote(placement.session_id, *args)
        except (RayError, TimeoutError) as exc:
            await self._lose(placement, exc)
            answer = {"kind": "lost", "message": _describe(exc) if isinstance(exc, RayError) else "no answer"}
        if answer["kind"] == "lost":
            self._state_lost_pending = True
            if method == "reset":
                return None
            raise SandboxFileError(f"the cluster node holding the session was lost ({answer['message']}); "
                                   "the next run starts a fresh session on a live node")  # fmt: skip
        if answer["kind"] == "error":
            raise RAISABLE.get(answer["type"], WorkerStartError)(answer["message"])
        return answer["value"]


def _node_lost(detail: str) -> ExecutionResult:
    return ExecutionResult(state_lost=True, error=ExecutionError(
        type="WorkerCrashed", message=f"the cluster node running this session was lost during the run ({detail}); "
        "the next run starts a fresh session on a live node; variables from earlier runs are lost"))  # fmt: skip


def _describe(exc: BaseException) -> str:
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {first[:300]}" if first else type(exc).__name__


async def _release(placement: Placement, timeout: float = KILL_TIMEOUT, keep: bool = True) -> None:
    """Close the session on its node (bounded); keep its reservation for a while if that went well, else
    give it back to the cluster at once."""
    closed = False
    try:
        with anyio.move_on_after(timeout):
            await placement.agent.close.remote(placement.session_id)
            closed = True
    except Exception:  # the node is gone: nothing left to close there
        pass
    if closed and keep:
        keep_reservation(placement.reservation)
    else:
        remove_group(placement.reservation.group)
