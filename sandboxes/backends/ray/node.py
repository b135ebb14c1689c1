"""The node side of the ray backend: one `NodeAgent` actor per cluster node, hosting that node's sessions.

Each session here is an ordinary executor of the node's own backend (`HostExecutor` or
`DockerExecutor`) living in this long-lived process, so the node's warm pools, its fork server and
its Docker client serve every session placed on the node. The agent adds nothing to what a run means:
the node-local executor checks the policy, talks to the runner, enforces the timeout next to the
worker and builds the result; the agent only carries requests in and results out. A network-on
session's egress gateway is the node's too (the node is a host): the node's executor builds it, so
the rules hold on the node that runs the code, and its connection report rides on the result.

Tools cross the cluster: the node-local executor is given an async stub per tool name. When the code
calls a tool the stub puts a ``tool`` event on the session's queue and waits; the parent receives the
event (as the answer of `run` or `next_event`), calls the real function in its own process, and
answers through `answer`. Tool values cross as JSON-ready data, never as code.

A streamed run's output crosses the same way: the node-local executor's output callbacks put
``output`` events on the queue (at most `OUTPUT_EVENTS` waiting; past them dropped and counted, the
count riding on the next one), and the parent takes them with `next_event` as they come.

Nothing here imports ray: the parent wraps this class with ``ray.remote`` (see `ray.py`), so that the
agent's own options (node affinity, no restarts, no task retries) are decided in one place.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

from ... import errors
from ...events import OutputEvent
from ...executor import Executor
from ...runtime import values
from ...runtime.protocol import (
    NodeAnswer,
    NodeError,
    NodeLost,
    NodeOpened,
    NodeOutput,
    NodeRunEvent,
    StreamOptions,
    ToolResult,
)
from ...toolbridge import RelayedToolError
from ..names import executor_class

OUTPUT_EVENTS = 256
"""Output events of a streamed run waiting for the parent at most; past them output is dropped and counted."""
NODE_CAPACITY_RESOURCE = "kodeagent_sandbox"
"""The custom resource by which a node declares its sandbox units (`cluster.SANDBOX_RESOURCE`)."""
REAP_INTERVAL = 10.0
"""Seconds between checks for sessions whose owner is gone (its placement group was removed)."""

RAISABLE = {
    name: getattr(errors, name)
    for name in (
        "BackendUnavailable",
        "EgressUnavailable",
        "ExecutorBusy",
        "ExecutorClosed",
        "FileTooLarge",
        "ForkError",
        "WorkerStartError",
        "ProtocolError",
        "SandboxFileError",
    )
} | {"TypeError": TypeError, "ValueError": ValueError}
"""Exceptions a node-side call reports by name for the parent to raise again as the same class."""


class _Session:
    """One session on this node: its executor, and the queue of events the parent collects."""

    def __init__(self, placement_group: str) -> None:
        self.placement_group = placement_group
        self.executor: Executor | None = None
        self.events: asyncio.Queue[NodeRunEvent] = asyncio.Queue()
        self.pending: dict[int, asyncio.Future[ToolResult]] = {}
        self.task: asyncio.Task[None] | None = None
        self.ids = itertools.count(1)
        self.outputs = 0  # output events waiting in `events`
        self.dropped = {"stdout": 0, "stderr": 0}

    def output(self, event: OutputEvent) -> None:
        """The node-local executor's output callback: queue the event for the parent, never waiting."""
        if self.outputs >= OUTPUT_EVENTS:
            self.dropped[event.stream] += len(event.text) + event.dropped
            return
        dropped, self.dropped[event.stream] = event.dropped + self.dropped[event.stream], 0
        self.outputs += 1
        message: NodeOutput = {
            "kind": "output",
            "stream": event.stream,
            "text": event.text,
            "dropped": dropped,
        }
        self.events.put_nowait(message)

    def flush_dropped(self) -> None:
        for stream, count in self.dropped.items():
            if count:
                self.outputs += 1
                self.events.put_nowait({"kind": "output", "stream": stream, "text": "", "dropped": count})  # type: ignore[typeddict-item]
        self.dropped = {"stdout": 0, "stderr": 0}

    async def next(self) -> NodeRunEvent:
        event = await self.events.get()
        if event["kind"] == "output":
            self.outputs -= 1
        return event

    def stub(self, name: str) -> Any:
        """The tool function the node-local executor calls: it asks the parent and waits for its answer."""

        async def call_in_parent(*args: Any, **kwargs: Any) -> Any:
            call_id = next(self.ids)
            answer: asyncio.Future[ToolResult] = asyncio.get_running_loop().create_future()
            self.pending[call_id] = answer
            # In the codec's tagged form, as the runner sends them: the driver decodes them as it
            # decodes a runner's (the node's executor decoded them from its runner).
            self.events.put_nowait(
                {
                    "kind": "tool",
                    "id": call_id,
                    "name": name,
                    "args": values.encode(list(args)),
                    "kwargs": values.encode(kwargs),
                }
            )
            try:
                reply = await answer
            finally:
                self.pending.pop(call_id, None)
            error = reply.get("error")
            if error:
                # Passed on under the parent's name, so the runner raises the same class with the
                # same message as on a local backend.
                raise RelayedToolError(str(error.get("type") or "ToolError"), str(error.get("message", "")))
            return values.decode(
                reply.get("value")
            )  # the driver's own encoding: encoded again for the runner

        call_in_parent.__name__ = name
        return call_in_parent


_LOST: NodeLost = {"kind": "lost", "message": "this node no longer holds the session"}


def _failure(exc: BaseException) -> NodeError:
    name = type(exc).__name__
    return {"kind": "error", "type": name if name in RAISABLE else "WorkerStartError", "message": str(exc)}


class NodeAgent:
    """Hosts the sandbox sessions placed on one node. Every method is a coroutine on the actor's loop.

    Calls answer with plain data: an event dict (``tool``, ``done``, ``error``, ``lost``) or a value.
    """

    def __init__(self) -> None:
        self.sessions: dict[str, _Session] = {}
        self._forking: dict[str, bool] = {}
        """Sessions being forked, by their new id: True once the parent closed one before it was made."""
        self._reaper: asyncio.Task[None] | None = None
        self._sized = False

    async def info(self) -> dict[str, Any]:
        import os

        return {"pid": os.getpid(), "sessions": len(self.sessions)}

    async def pools(self) -> dict[str, Any]:
        """The node's host pools: how they are sized now (`host.demand.PoolSizes`: the cores and
        caps they follow, the opens in flight and their recent peak, the pool size and spawners) and
        their idle workers (``ready``, ``started``; ``ready_largest``, ``started_largest``: in the
        fullest key)."""
        from ..host.executor import POOLS

        await self._size_pools()
        return POOLS.sizes()

    async def _size_pools(self) -> None:
        """Size the node's host pools (this process's) by the node as the cluster declares it: its
        CPUs (the machine's when it declares none), and at most as many idle workers as its sandbox
        units, the sessions it can hold at once. Outside a Ray worker, by this machine (the default)."""
        if self._sized:
            return
        self._sized = True
        try:
            import ray
        except ImportError:
            return
        if not ray.is_initialized():
            return
        from ..host.executor import POOLS

        node_id = ray.get_runtime_context().get_node_id()
        try:
            nodes = await asyncio.to_thread(ray.nodes)
        except Exception:  # the GCS is briefly unreachable: sized by this machine, asked again next time
            self._sized = False
            return
        declared: dict[str, float] = next(
            (n.get("Resources", {}) for n in nodes if n.get("NodeID") == node_id), {}
        )
        cpus, units = declared.get("CPU"), declared.get(NODE_CAPACITY_RESOURCE)
        POOLS.demand.configure(
            cores=int(cpus) if cpus and cpus >= 1 else None,
            capacity=int(units) if units and units >= 1 else None,
            fixed=POOLS.demand.fixed,
        )

    async def open(
        self,
        session_id: str,
        placement_group: str,
        backend: str,
        options: dict[str, Any],
        tool_names: list[str],
    ) -> NodeOpened | NodeError:
        """Open a session of the node's `backend`; answers ``{"kind": "opened", "isolation": ...}``."""
        if self._reaper is None:
            self._reaper = asyncio.get_running_loop().create_task(self._reap())
        if backend == "host":
            await self._size_pools()
        session = _Session(placement_group)
        try:
            tools = {name: session.stub(name) for name in tool_names}
            executor = executor_class(backend)(tools=tools, **options)
            await executor.open()
        except Exception as exc:
            return _failure(exc)
        session.executor = executor
        self.sessions[session_id] = session
        return {"kind": "opened", "isolation": executor.isolation}

    async def fork(
        self, session_id: str, new_session_id: str, placement_group: str
    ) -> NodeOpened | NodeError | NodeLost:
        """Fork session `session_id` into a new session `new_session_id` on this node (its capacity
        held by `placement_group`); answers ``{"kind": "opened", "isolation": ..., "report": ...}``.

        The node's executor forks its session (`Executor.fork`); the child's tools are rebound to stubs
        of the child's own queue, so a tool the child calls reaches the parent process as the child's
        event, never as the parent session's. A refusal (a run in progress, a backend that cannot
        fork) is an ``ExecutorBusy`` or ``ForkError`` answer."""
        session = self.sessions.get(session_id)
        if session is None or session.executor is None:
            return _LOST
        if new_session_id in self.sessions:
            return {"kind": "error", "type": "ValueError", "message": f"session {new_session_id!r} exists"}
        if session.task is not None and not session.task.done():
            return {
                "kind": "error",
                "type": "ExecutorBusy",
                "message": "fork() needs the session idle, and a run of it is in progress; fork after it returns",
            }
        child = _Session(placement_group)
        self._forking[new_session_id] = False
        try:
            executor = await session.executor.fork()
        except Exception as exc:
            return _failure(exc)
        finally:
            abandoned = self._forking.pop(new_session_id)
        if abandoned:  # the parent closed the child while it was being made (a cancelled fork)
            await executor.close()
            return _LOST
        # The fork copied the parent's tools: those stubs would put the child's calls on the parent's queue.
        executor.tools = {name: child.stub(name) for name in session.executor.tools}
        child.executor = executor
        self.sessions[new_session_id] = child
        report = executor.fork_report
        return {
            "kind": "opened",
            "isolation": executor.isolation,
            "report": report.model_dump(mode="json") if report is not None else {},
        }

    async def run(
        self, session_id: str, code: str, stream: StreamOptions | None = None, timeout: float | None = None
    ) -> NodeRunEvent:
        """Start a run; answers with its first event (a tool call, output when `stream`ed, or ``done``
        with the result). `timeout` is the caller's executor's timeout now, which the node's executor
        takes for this run and the next (the caller may have changed it since the open)."""
        session = self.sessions.get(session_id)
        if session is None or session.executor is None:
            return _LOST
        if isinstance(timeout, (int, float)) and not isinstance(timeout, bool) and 0 < timeout < float("inf"):
            session.executor.timeout = float(timeout)
        if session.task is not None and not session.task.done():
            return {
                "kind": "error",
                "type": "ProtocolError",
                "message": "a run of this session is in progress",
            }
        session.task = asyncio.get_running_loop().create_task(
            self._run(session, session.executor, code, stream)
        )
        return await session.next()

    async def _run(
        self, session: _Session, executor: Executor, code: str, stream: StreamOptions | None
    ) -> None:
        try:
            if stream is None:
                result = await executor.run(code)
            else:
                result = await executor.run(
                    code,
                    on_output=session.output,  # in order with the tool stubs' events
                    chars=stream["chars"],
                    chars_per_second=stream["chars_per_second"],
                )
        except Exception as exc:  # misuse or a backend failure: the parent raises it again
            session.events.put_nowait(_failure(exc))
            return
        session.flush_dropped()
        session.events.put_nowait({"kind": "done", "result": result.model_dump(mode="json")})

    async def next_event(self, session_id: str) -> NodeRunEvent:
        """The run's next event, after the parent answered a tool call (or while it still works on it)."""
        session = self.sessions.get(session_id)
        if session is None:
            return _LOST
        return await session.next()

    async def answer(self, session_id: str, call_id: int, reply: ToolResult) -> None:
        """The parent's answer to a tool call: ``{"value": ...}`` or ``{"error": {"type", "message"}}``.
        An answer that comes after the run gave up on it (timeout) is dropped."""
        session = self.sessions.get(session_id)
        future = session.pending.get(call_id) if session else None
        if future is not None and not future.done():
            future.set_result(reply)

    async def reset(self, session_id: str) -> NodeAnswer:
        return await self._call(session_id, "reset")

    async def define(self, session_id: str, variables: dict[str, Any]) -> NodeAnswer:
        """Variables for the session, in the codec's form: decoded here (a type whose library this
        node lacks stays encoded, and encodes back the same) and sent in by the node's executor,
        which checks them again."""
        session = self.sessions.get(session_id)
        if session is None or session.executor is None:
            return _LOST
        if type(variables) is not dict:
            return _failure(ValueError("the variables must be one JSON object of names to values"))
        try:
            decoded = values.decode(variables)
        except values.CodecError as exc:  # the runner's words for the same refusal
            return _failure(ValueError(f"the variables could not be decoded: {exc}"))
        try:
            await session.executor.send_variables(decoded)
        except Exception as exc:
            return _failure(exc)
        return {"kind": "value", "value": None}

    async def upload(self, session_id: str, path: str, data: bytes) -> NodeAnswer:
        return await self._call(session_id, "upload", path, data)

    async def download(self, session_id: str, path: str, max_bytes: int | None = None) -> NodeAnswer:
        """The file, read here under the driver's cap: the node's backend stops at it, so no more than
        the cap ever crosses the cluster (the driver checks the size again)."""
        return await self._call(session_id, "download", path, max_bytes=max_bytes)

    async def _call(self, session_id: str, method: str, *args: Any, **options: Any) -> NodeAnswer:
        session = self.sessions.get(session_id)
        if session is None or session.executor is None:
            return _LOST
        try:
            value = await getattr(session.executor, method)(*args, **options)
        except Exception as exc:
            return _failure(exc)
        return {"kind": "value", "value": value}

    async def set_network(self, session_id: str, network: dict[str, Any] | None) -> NodeAnswer:
        """New egress rules for the session's next connection (`NetworkPolicy` fields; None: every
        connection refused), applied by this node's own gateway, which the node's executor built."""
        from ...egress.policy import NetworkPolicy

        try:
            rules: NetworkPolicy | bool = False if network is None else NetworkPolicy.model_validate(network)
        except ValueError as exc:
            return _failure(exc)
        return await self._call(session_id, "set_network", rules)

    async def close(self, session_id: str) -> None:
        """Close the session (kills its worker, returns it to nothing: workers are never handed on)."""
        session = self.sessions.pop(session_id, None)
        if session is None:
            if session_id in self._forking:
                self._forking[session_id] = True  # `fork` closes it once it is made
            return
        if session.task is not None and not session.task.done():
            session.task.cancel()  # the executor discards a worker whose run was cancelled
            try:
                await session.task
            except BaseException:  # noqa: BLE001 - the cancellation itself, or the run's own failure
                pass
        if session.executor is not None:
            await session.executor.close()

    async def _reap(self) -> None:
        """Close sessions whose parent went away without closing them (crashed driver, lost network).

        A session holds its capacity through a placement group the parent's job owns; Ray removes a
        job's placement groups when the job ends, so a session whose group is gone has no owner left.
        """
        import ray
        from ray.util import placement_group_table

        while True:
            await asyncio.sleep(REAP_INTERVAL)
            if not ray.is_initialized():  # not inside a Ray worker (tests drive the agent directly)
                continue
            try:
                table = await asyncio.to_thread(placement_group_table)
            except Exception:  # the GCS is briefly unreachable: try again next time
                continue
            for session_id, session in list(self.sessions.items()):
                entry = table.get(session.placement_group)
                if entry is None or entry.get("state") == "REMOVED":
                    await self.close(session_id)
