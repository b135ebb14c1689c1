"""A thin synchronous facade over `Executor`, for scripts and notebooks without an event loop."""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, ExitStack
from types import TracebackType
from typing import Any, Self, Unpack

from anyio.from_thread import BlockingPortal, start_blocking_portal

from .events import Event, EventStream, StreamBudget
from .executor import Executor
from .models import ExecutionResult


class SyncExecutor:
    """Runs an `Executor` on a private event loop thread and exposes blocking methods.

    ::

        with open_executor_sync("host", timeout=10) as ex:
            print(ex.run("print(6 * 7)").stdout)
    """

    def __init__(self, executor: Executor) -> None:
        self.executor = executor
        self._stack = ExitStack()
        self._portal: BlockingPortal | None = None

    def open(self) -> Self:
        if self._portal is None:
            self._portal = self._stack.enter_context(start_blocking_portal())
            try:
                self._portal.call(self.executor.open)
            except BaseException:
                self._stack.close()
                self._portal = None
                raise
        return self

    def _call(self, func: Any, *args: Any) -> Any:
        if self._portal is None:
            self.open()
        assert self._portal is not None
        return self._portal.call(func, *args)

    def run(self, code: str | bytes) -> ExecutionResult:
        """Run code; see `Executor.run`."""
        result: ExecutionResult = self._call(self.executor.run, code)
        return result

    def stream(self, code: str | bytes, **budget: Unpack[StreamBudget]) -> SyncEventStream:
        """Run code and watch it: an iterator of its events, the last a `ResultEvent` (see
        `Executor.stream`). Use it in a `with` block (leaving early cancels the run), or iterate it
        to the end::

            with ex.stream("print(1)") as events:
                for event in events:
                    ...
        """
        if self._portal is None:
            self.open()
        assert self._portal is not None
        return SyncEventStream(
            self._portal, self._portal.wrap_async_context_manager(self.executor.stream(code, **budget))
        )

    def fork(self) -> SyncExecutor:
        """A copy of this session as a new executor (on an event loop of its own); see `Executor.fork`."""
        child: Executor = self._call(self.executor.fork)
        return SyncExecutor(child)

    def reset(self) -> None:
        """Forget the session's variables; see `Executor.reset`."""
        self._call(self.executor.reset)

    def send_variables(self, variables: Mapping[str, Any]) -> None:
        """Bind variables in the session, each of its own type; see `Executor.send_variables`."""
        self._call(self.executor.send_variables, variables)

    def upload(self, path: str, data: bytes | str) -> None:
        """Write a file into the working directory; see `Executor.upload`."""
        self._call(self.executor.upload, path, data)

    def download(self, path: str, *, max_bytes: int | None = None) -> bytes:
        """Read a file from the working directory, at most `max_bytes` of it; see `Executor.download`."""
        data: bytes = self._call(functools.partial(self.executor.download, path, max_bytes=max_bytes))
        return data

    @property
    def isolation(self) -> str:
        return self.executor.isolation

    def close(self, wait: bool = False) -> None:
        """Close the executor and stop the private event loop; with `wait`, return only once nothing
        of the session is left (see `Executor.wait_closed`)."""
        if self._portal is not None:
            try:
                self._portal.call(self.executor.close)
                if wait:
                    self._portal.call(self.executor.wait_closed)
            finally:
                self._stack.close()
                self._portal = None

    def __enter__(self) -> Self:
        return self.open()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class SyncEventStream(Iterator[Event]):
    """The blocking twin of `EventStream`: an iterator, and a context manager that holds the run."""

    def __init__(self, portal: BlockingPortal, manager: AbstractContextManager[EventStream]) -> None:
        self._portal = portal
        self._manager = manager
        self._events: EventStream | None = None
        self._done = False

    def __enter__(self) -> Self:
        if self._events is None and not self._done:
            self._events = self._manager.__enter__()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._done = True
        if self._events is not None:
            self._events = None
            self._manager.__exit__(exc_type, exc, tb)

    def __iter__(self) -> Self:
        return self

    def __next__(self) -> Event:
        if self._done:
            raise StopIteration
        self.__enter__()  # iterated without `with`: the run starts here and ends with the last event
        assert self._events is not None
        try:
            event: Event = self._portal.call(self._events.__anext__)
        except StopAsyncIteration:
            self.__exit__(None, None, None)
            raise StopIteration from None
        except BaseException as exc:
            self.__exit__(type(exc), exc, exc.__traceback__)
            raise
        return event

    def close(self) -> None:
        """Stop watching; a run still going is cancelled (as leaving the `with` block)."""
        self.__exit__(None, None, None)


def open_executor_sync(backend: str = "host", **options: Any) -> SyncExecutor:
    """The blocking twin of `open_executor`: use it in a `with` block."""
    from .backends import backend_name, open_executor

    return SyncExecutor(open_executor(backend_name(backend), **options))
