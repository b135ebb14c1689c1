"""The ray backend: sandbox sessions spread over a Ray cluster, each run by its node's host or Docker backend.

``open_executor("ray", node_backend="host", address=None, **node_options)``

Placement. Every node declares how many sandboxes it takes as the custom resource
``kodeagent_sandbox`` (``ray start --resources='{"kodeagent_sandbox": 8}'``; a cluster that declares
none is sized by its CPUs instead). A session reserves one unit in a placement group of a single
bundle; Ray's scheduler picks the node, and a session that finds the cluster full waits in Ray's queue
until a unit frees (up to `placement_timeout`). No scheduler of our own. A closed session's unit stays
with this process for `LINGER` seconds, so that the next session takes it at once instead of waiting for
Ray to learn from the node's next resource report that it is free.

Transport: one actor per node, sessions multiplexed on it (`ray.node.NodeAgent`), not an actor per
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
(the node holds async stubs that surface each call as an event; see `ray.node`), and results are the
node's `ExecutionResult` with the duration measured here.

Faults. The agents are created with ``max_restarts=0`` and ``max_task_retries=0``: Ray never runs a
call twice, so a snippet never runs twice. A node (or agent) lost during a run makes that run return
``state_lost`` with error type ``WorkerCrashed``; the session is dropped and the next run places a
fresh one, which Ray puts on a live node; a dead agent's name is free again, so the next session on
that node gets a new agent. No cluster reachable at open raises `BackendUnavailable` with the fix.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Self, TypeVar, cast

import anyio
from pydantic import BaseModel, ValidationError

from ...egress.policy import NetworkPolicy
from ...errors import ForkError, ProtocolError, WorkerStartError
from ...events import OutputEvent
from ...executor import COMMON_OPTIONS, DEFAULT_OUTPUT_LIMIT, KILL_TIMEOUT, Executor, ExecutorOptions
from ...models import ExecutionResult, ForkReport
from ...runtime import bounds
from ...runtime.protocol import (
    NodeAnswer,
    NodeDone,
    NodeError,
    NodeLost,
    NodeOpened,
    NodeRunEvent,
    NodeToolEvent,
    StreamOptions,
    ToolCall,
)
from ...session import OutputHandler, Session, SessionLost, ToolCaller, carry_values
from ...wire import check
from ..docker.settings import ContainerOptions
from ..host.executor import Isolation
from ..names import executor_class
from .cluster import (
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
from .node import RAISABLE

__all__ = ["SANDBOX_RESOURCE", "RayExecutor", "RaySession", "capacity", "connect", "describe"]


NODE_BACKENDS = ("host", "docker")
RUN_SLACK = 60.0
"""Seconds past the session's timeout before the parent gives up on a node that does not answer (the
node enforces the timeout itself; this only catches a node that went silent)."""
FORK_WAIT = 30.0
"""Seconds a fork waits at most for a unit on its parent's node (`placement_timeout` when shorter). Why
not `placement_timeout`: the parent's executor holds its lock meanwhile and gives up on a fork, and the
parent session with it, past its timeout plus RUN_SLACK and the handshake's 30 s; a fork refused for
capacity must end before that, with the parent intact."""


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


class RayOptions(ExecutorOptions, ContainerOptions, total=False):
    """Every option `RayExecutor` takes (all by keyword), typed for ``open_executor("ray", ...)``: the
    common ones, the executor's own, and the node backends' own (passed on to the node's backend,
    which refuses those it does not take: `HostOptions`' ``isolation``, `DockerOptions`' container
    options, ``pool``, ``pool_size``, ``preload``, ``workdir_at``)."""

    node_backend: Literal["host", "docker"]
    address: str | None
    placement_timeout: float
    init_options: Mapping[str, Any] | None
    isolation: Isolation
    pool: bool
    pool_size: int
    preload: Sequence[str | os.PathLike[str]]
    workdir_at: str | None


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
            "policy": self.policy,
            "timeout": self.timeout,
            "env": self.env,
            "workdir": self.workdir,
            "stateless": self.stateless,
            "output_limit": self.output_limit,
            "measure_usage": self.measure_usage,
            "track_artifacts": self.track_artifacts,
            **{name: value for name, value in options.items() if name not in COMMON_OPTIONS},
        }
        # refuses unknown or invalid options now, not at open
        executor_class(node_backend)(**self.node_options)

    def _forked_executor(self) -> Self:
        """The fork's executor: this one's options in dicts of its own (the node's options keep
        pointing at the child's env, not at the parent's)."""
        child = super()._forked_executor()
        child.init_options = dict(self.init_options)
        child.node_options = {**self.node_options, "env": child.env}
        return child

    @property
    def node_id(self) -> str | None:
        """The Ray node id of the session's node (None before open, after close, after a lost node)."""
        session = self.session
        return session.placement.node_id if isinstance(session, RaySession) else None

    async def _new_session(self) -> Session:
        """Connect to the cluster and place the session on a node. Raises `BackendUnavailable` when no
        cluster is reachable or it declares no capacity."""
        if not ray_module().is_initialized():
            await anyio.to_thread.run_sync(connect, self.address, self.init_options)
        return await self._place()

    async def _place(self) -> RaySession:
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
                answer = _from_node(
                    NodeOpened | NodeError,
                    await handle.open.remote(
                        session_id,
                        reservation.group.id.hex(),
                        self.node_backend,
                        # the policy as it is now: `set_network` may have changed it since the start
                        {**self.node_options, "policy": self.policy},
                        sorted(self.tools),
                    ),
                )
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
            session = RaySession(
                Placement(session_id, reservation, handle), answer["isolation"], self.placement_timeout
            )
            session.output_limit = self.output_limit
            session.network = self.policy.network_policy is not None  # else the node refused the open
            return session
        raise AssertionError("unreachable")


class RaySession(Session):
    """A session on a cluster node: the node's agent runs it with an executor of the node's backend,
    which enforces the timeout next to the worker (this side waits `RUN_SLACK` longer, as a backstop)."""

    timeout_backstop = RUN_SLACK
    output_limit = DEFAULT_OUTPUT_LIMIT
    """The executor's: the node's result is bounded by it again here (`carry_values`)."""
    network = False
    """Opened with network on: its egress gateway is on its node, built by the node's executor."""

    @property
    def network_on(self) -> bool:
        return self.network

    async def set_network(self, rules: NetworkPolicy | None) -> None:
        """The node's gateway takes the new rules (the node's executor keeps them for a session
        that replaces this one there)."""
        await self._node_call("set_network", None if rules is None else rules.model_dump(mode="json"))

    def __init__(self, placement: Placement, isolation: str, placement_timeout: float = FORK_WAIT) -> None:
        self.placement = placement
        self.isolation = isolation
        self.placement_timeout = placement_timeout
        self._ended = False

    async def fork(self) -> tuple[Session, ForkReport]:
        """Fork on the parent's node: reserve a unit there (the child holds its own capacity; a full
        node is waited for, up to `FORK_WAIT`, then refused), then the node's executor forks its session.

        A refusal (the node is full, its backend cannot fork, the node's executor refused or replaced
        its session, which its `ForkError` then says) is a `ForkError` with this session on its node;
        a lost node is `SessionLost`."""
        from ray.exceptions import RayError

        placement = self.placement
        if self._ended:
            raise ForkError("this session was closed on its node; there is nothing to fork")
        node = placement.node_id
        resource = placement.reservation.resource
        wait = min(self.placement_timeout, FORK_WAIT)
        try:
            reservation = take_reservation(resource, node) or await reserve(resource, wait, node)
        except WorkerStartError as exc:
            raise ForkError(
                f"the fork needs a unit of sandbox capacity on its parent's node {node[:12]}, and none "
                f"became free within {wait:g} s: close a session on that node, or fork later"
            ) from exc
        session_id = uuid.uuid4().hex
        try:
            answer = _from_node(
                NodeOpened | NodeError | NodeLost,
                await placement.agent.fork.remote(
                    placement.session_id, session_id, reservation.group.id.hex()
                ),
            )
        except RayError as exc:
            remove_group(reservation.group)
            self._forget_node(exc)
            raise SessionLost(f"the cluster node holding the session was lost ({_describe(exc)})") from exc
        except BaseException:
            # Cancelled or failed while the node may be forking: end the child there if it came to be
            # (bounded), and give its unit back; the executor drops this session too.
            with anyio.CancelScope(shield=True):
                await _release(Placement(session_id, reservation, placement.agent), timeout=5.0, keep=False)
            raise
        if answer["kind"] == "lost":
            remove_group(reservation.group)
            raise SessionLost(f"the cluster node holding the session was lost ({answer['message']})")
        if answer["kind"] == "error":
            keep_reservation(reservation)
            # The node's executor answered: its own session is intact, or it replaced it and says so.
            raise ForkError(f"the node could not fork the session ({answer['type']}: {answer['message']})")
        child = RaySession(
            Placement(session_id, reservation, placement.agent), answer["isolation"], self.placement_timeout
        )
        child.output_limit = self.output_limit
        return child, _model_from_node(ForkReport, answer.get("report") or {})

    async def run(
        self,
        code: str,
        call_tool: ToolCaller,
        on_output: OutputHandler | None = None,
        stream: StreamOptions | None = None,
    ) -> ExecutionResult:
        from ray.exceptions import RayError

        placement = self.placement
        try:
            if on_output is None:
                event = _from_node(
                    NodeRunEvent,
                    await placement.agent.run.remote(placement.session_id, code, None, self.run_timeout),
                )
                while event["kind"] == "tool":
                    event = await self._serve_tool(event, call_tool)
            else:
                event = await self._streamed_run(code, call_tool, on_output, stream)
        except RayError as exc:
            self._forget_node(exc)
            raise SessionLost(f"the cluster node running this session was lost ({_describe(exc)})") from exc
        if event["kind"] == "lost":
            raise SessionLost(f"the cluster node running this session was lost ({event['message']})")
        if event["kind"] == "error":
            raise RAISABLE.get(event["type"], WorkerStartError)(event["message"])
        if event["kind"] != "done":
            raise ProtocolError(f"unexpected event from the cluster node: {event['kind']!r}")
        # The node's values come in the codec's tagged form (its result as JSON): decoded once, here.
        return carry_values(_model_from_node(ExecutionResult, event["result"]), self.output_limit)

    async def _streamed_run(
        self, code: str, call_tool: ToolCaller, on_output: OutputHandler, stream: StreamOptions | None
    ) -> NodeDone | NodeError | NodeLost:
        """A run whose output events arrive among its tool calls: each tool is served in a task while
        the events go on (a run's output may come while a tool works); the last event is returned."""
        from ray.exceptions import RayError

        placement = self.placement
        failure: RayError | ProtocolError | None = None
        async with anyio.create_task_group() as group:
            try:
                event = _from_node(
                    NodeRunEvent,
                    await placement.agent.run.remote(placement.session_id, code, stream, self.run_timeout),
                )
                while event["kind"] in ("tool", "output"):
                    if event["kind"] == "output":
                        text = event["text"]
                        on_output(
                            OutputEvent(
                                stream=event["stream"],
                                text=text[: bounds.STREAM_MESSAGE_CHARS],
                                dropped=max(0, event["dropped"])
                                + max(0, len(text) - bounds.STREAM_MESSAGE_CHARS),
                            )
                        )
                    else:
                        group.start_soon(self._answer_tool, event, call_tool)
                    event = _from_node(
                        NodeRunEvent, await placement.agent.next_event.remote(placement.session_id)
                    )
            # Raised outside the group, so that the caller sees it, not a group of it.
            except (RayError, ProtocolError) as exc:
                failure = exc
            group.cancel_scope.cancel()
        if failure is not None:
            raise failure
        return cast("NodeDone | NodeError | NodeLost", event)

    async def _answer_tool(self, call: NodeToolEvent, call_tool: ToolCaller) -> None:
        from ray.exceptions import RayError

        placement = self.placement
        request: ToolCall = {
            "op": "tool_call",
            "id": call["id"],
            "name": call["name"],
            "args": call["args"],
            "kwargs": call["kwargs"],
        }
        reply = await call_tool(request)
        try:
            await placement.agent.answer.remote(placement.session_id, call["id"], reply)
        except RayError:
            pass  # the node is gone: `next_event` reports it

    async def _serve_tool(self, call: NodeToolEvent, call_tool: ToolCaller) -> NodeRunEvent:
        """Call the tool here while waiting for the run's next event: if the node's timeout ends the run
        first, the tool is abandoned (a blocking one in its thread), as on the local backends."""
        from ray.exceptions import RayError

        placement = self.placement
        failure: RayError | ProtocolError | None = None
        async with anyio.create_task_group() as group:
            group.start_soon(self._answer_tool, call, call_tool)
            try:
                event = _from_node(
                    NodeRunEvent, await placement.agent.next_event.remote(placement.session_id)
                )
            # Raised outside the group, so that the caller sees it, not a group of it.
            except (RayError, ProtocolError) as exc:
                failure = exc
            group.cancel_scope.cancel()
        if failure is not None:
            raise failure
        return event

    async def reset(self) -> None:
        await self._node_call("reset")

    async def define(self, variables: dict[str, Any]) -> str | None:
        try:
            await self._node_call("define", variables)
        except (TypeError, ValueError) as exc:  # the node's executor (or its runner) refused them
            return bounds.clipped(str(exc), bounds.ERROR_MESSAGE_LIMIT)
        return None

    async def upload(self, path: str, data: bytes) -> None:
        await self._node_call("upload", path, data)

    async def download(self, path: str, max_bytes: int) -> bytes:
        value = await self._node_call("download", path, max_bytes)
        if not isinstance(value, bytes):
            raise ProtocolError(
                f"the cluster node answered a download with {type(value).__name__}, not bytes"
            )
        if len(value) > max_bytes:  # the node was told the cap: more than it is not the protocol
            raise ProtocolError(
                f"the cluster node sent more of {path!r} than the {max_bytes:,} bytes asked for"
            )
        return value

    async def _node_call(self, method: str, *args: Any) -> Any:
        from ray.exceptions import RayError

        placement = self.placement
        try:
            answer = _from_node(
                NodeAnswer, await getattr(placement.agent, method).remote(placement.session_id, *args)
            )
        except RayError as exc:
            self._forget_node(exc)
            raise SessionLost(f"the cluster node holding the session was lost ({_describe(exc)})") from exc
        if answer["kind"] == "lost":
            raise SessionLost(f"the cluster node holding the session was lost ({answer['message']})")
        if answer["kind"] == "error":
            raise RAISABLE.get(answer["type"], WorkerStartError)(answer["message"])
        return answer["value"]

    def _forget_node(self, exc: BaseException) -> None:
        from ray.exceptions import RayActorError

        if isinstance(exc, RayActorError):  # the agent (or its node) died: its reservations with it
            forget_agent(self.placement.node_id)
            drop_reservations(self.placement.node_id)

    async def close(self) -> None:
        """Close the session on its node and keep its capacity for a while (see `LINGER`)."""
        if not self._ended:
            self._ended = True
            await _release(self.placement)

    async def discard(self) -> None:
        """Drop a session whose node failed, went silent or whose run was cancelled: close it there if
        the node answers soon, and give its capacity back to the cluster at once."""
        if not self._ended:
            self._ended = True
            with anyio.CancelScope(shield=True):
                await _release(self.placement, timeout=5.0, keep=False)


def _from_node(kind: Any, message: Any) -> Any:
    """A node agent's answer, checked against its declaration (`runtime/protocol.py`) before any field
    is used: the agent sits next to the sandbox, so what it sends is treated as the runner's is."""
    return check(kind, message, "the cluster node")


M = TypeVar("M", bound=BaseModel)


def _model_from_node(model: type[M], data: Any) -> M:
    """A result or report the node's executor made, as this side's model (`ProtocolError` if it is not one)."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ProtocolError(
            f"the cluster node sent a malformed {model.__name__}: {bounds.clipped(str(exc), 300)}"
        ) from None


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
