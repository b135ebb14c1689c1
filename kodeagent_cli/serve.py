"""`kodeagent serve`: self-hosted sandboxes behind E2B's protocol, for the unmodified `e2b` and
`e2b-code-interpreter` SDKs (point `E2B_API_URL` and `E2B_SANDBOX_URL` at it, `E2B_API_KEY` its key).

Flags override the config file's settings (`--config`, JSON or TOML, the fields of
`sandboxes.adapters.serve.config.ServeConfig`).
"""

from __future__ import annotations

import argparse
from typing import Any

from .common import EXIT_UNAVAILABLE, EXIT_USAGE, CommandError, backend_options, config_from_flags
from .mcp import parse_address

SERVE_BACKENDS = ("host", "docker")


def add_serve_command(commands: Any) -> None:
    """Add the `serve` subcommand to the top-level parser's subcommands."""
    text = "serve sandboxes over E2B's API, so E2B's SDKs and the frameworks on them run on this machine"
    serve = commands.add_parser("serve", help=text, description=text + ". Logs go to stderr.")
    serve.add_argument(
        "--http",
        metavar="[HOST:]PORT",
        help="where to listen (HOST defaults to 127.0.0.1; PORT 0 picks one; default: the config file's "
        "host and port, else 127.0.0.1:49982)",
    )
    serve.add_argument("--config", metavar="FILE", help="settings file (.json or .toml); flags override it")
    serve.add_argument("--backend", choices=SERVE_BACKENDS, help="where sandboxes run (default host)")
    serve.add_argument(
        "-o",
        "--backend-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an option of the backend, e.g. image=kodeagent-sandbox:datascience (repeatable)",
    )
    serve.add_argument(
        "--max-sandboxes", type=int, help="sandboxes alive at once, every key together (default 64)"
    )
    serve.add_argument(
        "--max-sandboxes-per-key", type=int, help="sandboxes alive at once per API key (default 16)"
    )
    serve.add_argument(
        "--no-internet", action="store_true", help="no sandbox gets internet (E2B's default is on)"
    )
    serve.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="NAME[:PORT]",
        help="a Host name to answer to besides IP addresses and localhost (repeatable)",
    )
    serve.add_argument(
        "--no-watchdog",
        action="store_true",
        help="do not fork a watchdog (then a SIGKILLed server can leave sandboxes behind)",
    )
    serve.add_argument("-v", "--verbose", action="store_true", help="log every request to stderr")
    serve.set_defaults(handler=cmd_serve)


def settings_from_flags(args: argparse.Namespace, base: dict[str, Any]) -> dict[str, Any]:
    """The config file's settings (`base`) with the flags applied on top."""
    settings = dict(base)
    for flag in ("backend", "max_sandboxes", "max_sandboxes_per_key"):
        if getattr(args, flag) is not None:
            settings[flag] = getattr(args, flag)
    if args.backend_option:
        settings["backend_options"] = {
            **settings.get("backend_options", {}),
            **backend_options(args.backend_option),
        }
    if args.http:
        settings["host"], settings["port"] = parse_address(args.http)
    if args.no_internet:
        settings["internet"] = False
    if args.allow_host:
        settings["allowed_hosts"] = [*settings.get("allowed_hosts", []), *args.allow_host]
    return settings


def cmd_serve(args: argparse.Namespace) -> int:
    """Validate the settings, then serve until a stop signal; every sandbox ends with the server."""
    from sandboxes.adapters.serve.config import ServeConfigError, load_config, make_config

    config = config_from_flags(args, load_config, make_config, settings_from_flags, ServeConfigError)
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        raise CommandError(
            "kodeagent serve needs uvicorn and starlette: pip install 'kodeagent[mcp]'", EXIT_UNAVAILABLE
        ) from None
    from sandboxes.adapters.serve.server import serve

    try:
        return serve(config, watchdog=not args.no_watchdog, verbose=args.verbose)
    except ServeConfigError as exc:
        raise CommandError(str(exc), EXIT_USAGE) from None
    except OSError as exc:
        raise CommandError(f"cannot serve: {exc}", EXIT_UNAVAILABLE) from None
