"""What adding a secret at egress costs: an HTTPS request through a connection the gateway
intercepts (TLS terminated with the session CA's certificate, the upstream verified, the head
rewritten) beside the same request through a plain ``CONNECT`` tunnel, alternately in one run.

``python -m benchmarks.egress_secrets [-n N]`` (root: it builds the tests' fake internet, two
network namespaces on this machine; nothing leaves it). Each sample is a new connection: ``CONNECT``,
the code's TLS handshake, one ``GET``, the whole answer read. Medians, p95 and their ratios.
"""

from __future__ import annotations

import json
import ssl
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .common import fmt_ms, fmt_ratio, ratio, script_main, summarize


def measure(n: int) -> dict[str, Any]:
    """`n` intercepted and `n` tunnelled requests, alternately: their summaries and ratios."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from support.egress_client import client_namespace, read_all  # type: ignore[import-not-found]
    from support.fake_internet import fake_internet, gateway_through, unavailable  # type: ignore[import-not-found]

    from sandboxes.egress.ca import SessionAuthority
    from sandboxes.egress.policy import NetworkPolicy

    problem = unavailable()
    if problem:
        raise SystemExit(f"egress_secrets: {problem}")
    authority = SessionAuthority()
    rules = NetworkPolicy(secrets={"secret.test": {"Authorization": "Bearer bench"}})
    session_trust = ssl.create_default_context(cadata=authority.certificate_pem.decode())
    with fake_internet() as net, gateway_through(net), client_namespace(net, rules, authority) as (conn, _):
        server_trust = ssl.create_default_context(cafile=net.ca_file)

        def once(target: str, context: ssl.SSLContext) -> float:
            started = time.perf_counter()
            raw, answer = conn.tunnel(target)
            with context.wrap_socket(raw, server_hostname="secret.test") as tls:
                tls.sendall(b"GET / HTTP/1.1\r\nHost: secret.test\r\nConnection: close\r\n\r\n")
                reply = read_all(tls)
            if b" 200 " not in reply.split(b"\r\n", 1)[0] or b"200" not in answer:
                raise RuntimeError(f"{target}: {answer[:80]!r} {reply[:80]!r}")
            return time.perf_counter() - started

        kinds: dict[str, tuple[Callable[[], float], list[float]]] = {
            "intercepted": (lambda: once("secret.test:443", session_trust), []),
            "tunnelled": (lambda: once("other.test:443", server_trust), []),
        }
        for action, _ in kinds.values():  # warm both paths (the gateway's first TLS contexts)
            action()
        for _ in range(n):
            for action, samples in kinds.values():
                samples.append(action())
    summary = {name: summarize(samples) for name, (_, samples) in kinds.items()}
    return {
        "n": n,
        "summary": summary,
        "ratio_p50": ratio(summary["intercepted"]["p50_ms"], summary["tunnelled"]["p50_ms"]),
        "ratio_p95": ratio(summary["intercepted"]["p95_ms"], summary["tunnelled"]["p95_ms"]),
    }


def add_arguments(parser: Any) -> None:
    parser.add_argument("-n", type=int, default=200, help="requests of each kind (default 200)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")


def execute(args: Any) -> int:
    result = measure(args.n)
    if args.json:
        print(json.dumps(result))
        return 0
    for name, row in result["summary"].items():
        print(f"{name:12} p50 {fmt_ms(row['p50_ms'])}  p95 {fmt_ms(row['p95_ms'])}")
    print(
        f"intercepted / tunnelled: p50 {fmt_ratio(result['ratio_p50'])}, p95 {fmt_ratio(result['ratio_p95'])}"
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return script_main(__doc__, "python -m benchmarks.egress_secrets", add_arguments, execute, argv)


if __name__ == "__main__":
    raise SystemExit(main())
