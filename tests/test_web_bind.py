"""The listening socket the MCP server and `kodeagent serve` share (`sandboxes.adapters.web.bind`)."""

from __future__ import annotations

import asyncio
import socket

from sandboxes.adapters.web import bind


def test_connections_accepted_on_it_send_without_delay() -> None:
    """asyncio turns Nagle off only on sockets that name TCP as their protocol; with it on, a
    response written as head then body waited for the client's delayed ACK (~40 ms a request)."""
    listener = bind("127.0.0.1", 0)
    assert listener.proto == socket.IPPROTO_TCP
    seen: list[int] = []

    async def main() -> None:
        async def accepted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            seen.append(writer.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            writer.close()

        server = await asyncio.start_server(accepted, sock=listener)
        async with server:
            _, writer = await asyncio.open_connection(*listener.getsockname()[:2])
            while not seen:
                await asyncio.sleep(0.01)
            writer.close()

    asyncio.run(main())
    assert seen == [1]
