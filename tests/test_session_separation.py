"""Two sessions of one backend cannot reach each other at the OS layer: not over loopback, not over an
abstract unix socket.

The sessions run without the Python-level guards (`Policy(python_guards=False)`: the harness semantics'
mode, and what code that got past the guards has), so only the OS boundary separates them. Session A
listens on 127.0.0.1:PORT and on an abstract unix socket; a concurrent session B connects to both. The
proof is on both sides: B's connects fail, and A's listeners have nothing in their accept queues,
while A's own connections to them (the control) are accepted, and B serves and connects on its own
loopback on the very same port and name. Then A closes, and the same holds between B (listening now)
and a session C opened after A was gone.

At the host backend's bare `process` level there is no OS boundary between sessions to test: a
session without the guards is refused, and with them a session cannot open a socket at all.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from support.separation_helpers import CONNECT, abstract_name, assert_unreachable, free_port, listen

from sandboxes import BackendUnavailable, Policy

pytestmark = pytest.mark.anyio

UNGUARDED = Policy(python_guards=False)


async def test_sessions_cannot_reach_each_others_loopback_or_abstract_sockets(
    executor_factory: Callable[..., Any], backend: str
) -> None:
    port, name = free_port(), abstract_name()
    if backend == "e2b":
        from support.e2b_standin import namespaces

        if not namespaces.available():
            pytest.skip(
                "the E2B stand-in runs sandboxes as local processes and, not being root here, cannot "
                "give each a network namespace of its own as a real E2B microVM has"
            )
    if backend == "hostprocess":
        with pytest.raises(BackendUnavailable, match="python_guards"):
            async with executor_factory(policy=UNGUARDED, timeout=20) as ex:
                await ex.run("pass")
        async with executor_factory(policy=Policy(allowed_imports=["socket"]), timeout=20) as ex:
            refused = await ex.run(
                f"import socket\nsocket.socket().bind(('127.0.0.1', {port}))\nprint('bound')"
            )
        assert refused.error is not None and "bound" not in refused.stdout, refused
        return
    async with executor_factory(policy=UNGUARDED, timeout=30) as b:
        async with executor_factory(policy=UNGUARDED, timeout=30) as a:
            await listen(a, port, name)
            await assert_unreachable(a, b, port, name)
        # A is gone; B listens now, and C, opened after A closed (a pooled or reused worker, maybe), tries.
        second_port, second_name = free_port(), abstract_name()
        await listen(b, second_port, second_name)
        c = executor_factory(policy=UNGUARDED, timeout=30)
        async with c:
            await assert_unreachable(b, c, second_port, second_name)
            left = await c.run(CONNECT.format(port=port, name=name))
            assert left.ok and "connected" not in json.loads(left.stdout).values(), left
