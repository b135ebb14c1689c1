"""A faithful local stand-in for E2B: control-plane REST API, sandbox proxy and envd, on loopback.

The unmodified `e2b` SDK drives it through its own options (``api_url``, ``sandbox_url``,
``api_key``); commands run as real local processes in a per-sandbox directory and, as in a sandbox's
own microVM, in network and IPC namespaces of the sandbox's own (`namespaces.py`; when run as root).
See `server.StandIn`.

Wire facts it is built on (read from the SDK 2.6x source, checked by `tests/backends/e2b/test_e2b_standin.py`):
- the SDK's HTTP layer is pyqwest (Rust reqwest/hyper); over plain ``http://`` it speaks HTTP/1.1,
  so uvicorn (h11) serves it, and Connect server streams are chunked HTTP/1.1 responses;
- with ``sandbox_url`` set, every sandbox is reached at that one URL and the sandbox is named by
  the ``E2b-Sandbox-Id`` header, exactly as at ``https://sandbox.e2b.app``; envd requests carry the
  ``X-Access-Token`` returned by create;
- envd RPCs use Connect with the JSON codec, no compression; file transfers are plain HTTP
  (``GET /files`` and multipart or octet-stream ``POST /files``);
- a dead sandbox is a 502 with a JSON body whose message contains "was not found".
"""

from .server import DEFAULT_API_KEY, StandIn

__all__ = ["DEFAULT_API_KEY", "StandIn"]
