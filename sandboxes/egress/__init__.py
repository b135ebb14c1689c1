"""The egress gateway: what a network-on session may reach, enforced outside the sandbox.

A network-on session keeps a network namespace of its own with only ``lo`` (as with the network
off). Its one way out is a listening socket that the gateway owns but that lives *inside* that
namespace, on ``127.0.0.1:3128``: an HTTP proxy (``CONNECT`` and plain-HTTP forwarding) and a
SOCKS5 proxy on the same port. The gateway (a separate, unprivileged process on the host) resolves
names itself, checks the policy on the address it will actually connect to, connects from the
host's namespace, and reports every connection. See docs/egress.md.

The modules `match`, `dns`, `intercept` and `gateway` are standard library only: the gateway process
runs them without importing the rest of `sandboxes` (or pydantic). `policy` (the models), `service`
(the parent's side: the process, the listeners) and `ca` (a session's certificate authority, for
secrets at egress; `cryptography`, imported only when a session has secrets) are for the parent.
"""

PROXY_PORT = 3128
"""The port of the gateway's listener inside every network-on session's namespace (its own
namespace, so the same port for every session)."""
PROXY_URL = f"http://127.0.0.1:{PROXY_PORT}"
