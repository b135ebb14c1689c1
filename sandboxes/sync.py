"""A thin synchronous facade over `Executor`, for scripts and notebooks without an event loop."""

from __future__ import annotations

from contextlib import ExitStack
from types import TracebackType
from typing import Any, Self

from anyio.from_thread import BlockingPortal, start_blocking_portal

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

    def reset(self) -> None:
        """Forget the session's variables; see `Executor.reset`."""
        self._call(self.executor.reset)

    def upload(self, path: str, data: bytes | str) -> None:
        """Write a file into the working directory; see `Executor.upload`."""
        self._call(self.executor.upload, path, data)

    def download(self, path: str) -> bytes:
        """Read a file from the working directory; see `Executor.download`."""
        data: bytes = self._call(self.executor.download, path)
        return data

    @property
    def isolation(self) -> str:
        return self.executor.isolation

    def close(self) -> None:
        """Close the executor and stop the private event loop."""
        if self._portal is not None:
            try:
                self._portal.call(self.executor.close)
            finally:
                self._stack.close()
                self._portal = None

    def __enter__(self) -> Self:
        return self.open()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def open_executor_sync(backend: str = "host", **options: Any) -> SyncExecutor:
    """The blocking twin of `open_executor`: use it in a `with` block."""
    from .backends import open_executor

    return SyncExecutor(open_executor(backend, **options))
