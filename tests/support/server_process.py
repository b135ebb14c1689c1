"""A server command (`kodeagent serve`, `kodeagent mcp --http`) as a real subprocess, for the CLI tests:
ready once its stderr announces where it listens; every stderr line is kept in `lines`."""

from __future__ import annotations

import os
import re
import subprocess
import threading
from collections.abc import Sequence


class ServerProcess:
    """Starts `argv` and waits until a stderr line matches `announce` (its match is `announced`)."""

    def __init__(
        self,
        argv: Sequence[str],
        announce: re.Pattern[str],
        *,
        env: dict[str, str],
        cwd: str | os.PathLike[str],
        stop_wait: float = 60,
    ) -> None:
        self.process = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=env,
            cwd=cwd,
            text=True,
        )
        self.lines: list[str] = []
        self.announced: re.Match[str] | None = None
        self._announce = announce
        self._stop_wait = stop_wait
        self._ready = threading.Event()
        threading.Thread(target=self._drain, daemon=True).start()
        if not self._ready.wait(60) or self.announced is None:
            self.stop()
            raise AssertionError("the server did not start:\n" + "".join(self.lines))

    def _drain(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.lines.append(line)
            found = self._announce.search(line)
            if found and self.announced is None:
                self.announced = found
                self._ready.set()
        self._ready.set()

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.terminate()
        return self.process.wait(self._stop_wait)
