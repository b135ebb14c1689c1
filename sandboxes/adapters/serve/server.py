"""Running `kodeagent serve`: the listening socket, the watchdog, uvicorn, and a shutdown that ends
every sandbox before the process exits.

The socket is bound before the watchdog forks, so a port in use fails in the command itself. A stop
signal (SIGTERM, SIGINT, SIGHUP) makes uvicorn stop taking requests, give the open ones
`shutdown_grace` seconds, and then run the app's lifespan shutdown, which closes every sandbox; a
SIGKILL leaves that to the watchdog (see `sandboxes.adapters.mcp.watchdog`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..web import bind, is_loopback, url_of
from . import homes
from .config import ServeConfig
from .errors import ServeError
from .keys import KEY_VARIABLE, with_keys

if TYPE_CHECKING:
    from .app import ServeApp

logger = logging.getLogger("sandboxes.adapters.serve")

STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


def say(message: str) -> None:
    print(f"kodeagent serve: {message}", file=sys.stderr, flush=True)


def serve(config: ServeConfig, *, watchdog: bool = True, verbose: bool = False) -> int:
    """Serve until a stop signal arrives; return the exit code. With `watchdog` (Linux) this process
    forks first: it stays as the watchdog and the child serves. Logs go to stderr."""
    config, generated = with_keys(config)
    homes.check(config)  # before anything starts: a home it cannot give is a usage error
    sock = bind(config.host, config.port)
    from ..mcp import watchdog as dog

    if watchdog and dog.available():
        watcher, scratch = dog.supervise(docker_sweep=config.backend == "docker", name="serve")
        info = f"server pid {os.getpid()}, watchdog pid {watcher}, temporary files in {scratch}"
    else:
        info = f"server pid {os.getpid()}, no watchdog"
    stops: list[int] = []
    for signum in STOP_SIGNALS:  # until uvicorn listens, remember a stop instead of dying mid-start
        signal.signal(signum, lambda number, _frame: stops.append(number))
    logging.basicConfig(
        level="INFO" if verbose else "WARNING",
        stream=sys.stderr,
        format="kodeagent serve: %(levelname)s %(message)s",
    )
    url = url_of(sock)
    if generated:
        say(
            f"no key given: clients set E2B_API_KEY={generated} (set {KEY_VARIABLE} or keys in a config file "
            "to choose one)"
        )
    if not is_loopback(config.host):
        say(
            f"warning: {config.host} is not a loopback address: the server is reachable from the network, and "
            "its keys and tokens travel in clear text unless TLS (a reverse proxy) is in front"
        )
    announce = (
        f"listening on {url} (E2B_API_URL and E2B_SANDBOX_URL), backend {config.backend}, "
        f"keys: {', '.join(k.name for k in config.keys)} ({info})"
    )
    run(config, sock, ready=lambda: say(announce), early=stops, verbose=verbose)
    return 0


def run(
    config: ServeConfig,
    sock: socket.socket,
    *,
    ready: Callable[[], None] | None = None,
    early: list[int] | None = None,
    verbose: bool = False,
) -> None:
    """uvicorn serving `create_app(config)` on `sock` until a stop signal; every sandbox is closed
    before this returns."""
    import uvicorn

    from .app import create_app

    app = create_app(config)
    server = _server(
        uvicorn.Config(
            app,
            log_level="info" if verbose else "warning",
            lifespan="on",
            access_log=verbose,
            timeout_graceful_shutdown=math.ceil(config.shutdown_grace),
        )
    )
    pending = early if early is not None else []

    def stop(signum: int, _frame: Any = None) -> None:
        if not server.should_exit:
            logger.warning("received %s: ending every sandbox", signal.Signals(signum).name)
        server.should_exit = True

    original_startup = server.startup

    async def startup(sockets: list[socket.socket] | None = None) -> None:
        await original_startup(sockets=sockets)
        for signum in STOP_SIGNALS:
            signal.signal(signum, stop)
        if ready is not None:
            ready()
        for number in pending:
            stop(number)

    server.startup = startup
    server.run(sockets=[sock])


def _server(config: Any) -> Any:
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn without its signal handlers: ours stop it, then the lifespan shutdown ends the
        sandboxes (uvicorn's would re-raise SIGTERM once it stopped, ending the process with a signal)."""

        def capture_signals(self) -> Any:
            return contextlib.nullcontext()

    return Server(config)


@dataclass
class Background:
    """A server running in a thread of this process (`in_thread`): its URL, app and event loop."""

    url: str
    app: ServeApp
    loop: asyncio.AbstractEventLoop


@contextlib.contextmanager
def in_thread(config: ServeConfig, *, startup_limit: float = 60) -> Iterator[Background]:
    """Serve `config` (which must name its keys) on loopback from a thread of this process until the
    block ends; then every sandbox is closed. For `kodeagent doctor`, the bench and tests."""
    import uvicorn

    from .app import create_app

    app = create_app(config)
    sock = bind(config.host, config.port)
    loops: list[asyncio.AbstractEventLoop] = []

    async def recording(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan" and not loops:
            loops.append(asyncio.get_running_loop())
        await app(scope, receive, send)

    server = _server(
        uvicorn.Config(
            recording, log_level="warning", lifespan="on", access_log=False, timeout_graceful_shutdown=3
        )
    )
    thread = threading.Thread(
        target=server.run, kwargs={"sockets": [sock]}, daemon=True, name="kodeagent-serve"
    )
    thread.start()
    deadline = time.monotonic() + startup_limit
    try:
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise ServeError("the server did not start (see its log on stderr)")
            time.sleep(0.005)
        yield Background(url_of(sock), app, loops[0])
    finally:
        server.should_exit = True
        thread.join(60)
        sock.close()
