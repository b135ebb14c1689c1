"""`kodeagent mcp`: the sandbox as an MCP server, on stdio or streamable HTTP.

Flags override the config file's settings (`--config`, JSON or TOML, the fields of
`sandboxes.adapters.mcp.ServerConfig`); `--allow-import` adds to the file's (or the default) imports,
`--allow-egress` and `--deny-egress` to its `policy.network` rules.
"""

from __future__ import annotations

import argparse
from typing import Any

from .common import (
    BACKENDS,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    CommandError,
    add_policy_arguments,
    backend_options,
    config_from_flags,
    egress_rules,
    module_patterns,
)


def add_mcp_command(commands: Any) -> None:
    """Add the `mcp` subcommand to the top-level parser's subcommands."""
    text = "serve the sandbox to MCP clients (desktop assistants, IDEs, agent SDKs) on stdio or HTTP"
    mcp = commands.add_parser("mcp", help=text, description=text + ". Logs go to stderr.")
    mcp.add_argument(
        "--http",
        metavar="[HOST:]PORT",
        nargs="?",
        const="",
        help="serve streamable HTTP instead of stdio (HOST defaults to 127.0.0.1; PORT 0 picks one; "
        "alone: the config file's http.host and http.port, else 127.0.0.1:8765)",
    )
    mcp.add_argument("--config", metavar="FILE", help="settings file (.json or .toml); flags override it")
    mcp.add_argument("--backend", choices=BACKENDS, help="where code runs (default host)")
    add_policy_arguments(mcp, network_default=None)
    mcp.add_argument(
        "--limit",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="resource limit of the worker, e.g. memory_mb=512 or cpu_seconds=60 (repeatable)",
    )
    mcp.add_argument(
        "--tool",
        action="append",
        default=[],
        metavar="[NAME=]MODULE:FUNCTION",
        help="a function the code may call by name; it runs in the server, outside the sandbox (repeatable)",
    )
    mcp.add_argument("--timeout", type=float, help="seconds per run when a call gives none (default 30)")
    mcp.add_argument("--max-timeout", type=float, help="the most a call may ask for (default 300)")
    mcp.add_argument(
        "--idle-timeout", type=float, help="close sessions unused this long, seconds (default 900)"
    )
    mcp.add_argument("--max-sessions", type=int, help="open sessions at once, in total (default 32)")
    mcp.add_argument("--max-sessions-per-token", type=int, help="open sessions at once per token (default 8)")
    mcp.add_argument(
        "--allow-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="HTTP: a browser Origin to accept besides loopback ones (repeatable)",
    )
    mcp.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="NAME[:PORT]",
        help="HTTP: a Host name to answer to besides IP addresses and localhost (repeatable)",
    )
    mcp.add_argument(
        "--no-watchdog",
        action="store_true",
        help="do not fork a watchdog (then a SIGKILLed server can leave workers behind)",
    )
    mcp.add_argument("-v", "--verbose", action="store_true", help="log every request to stderr")
    mcp.set_defaults(handler=cmd_mcp)


def parse_address(value: str) -> tuple[str, int]:
    """'8000' -> ('127.0.0.1', 8000); 'HOST:8000'; '[::1]:8000'."""
    host, sep, port = value.rpartition(":")
    if not sep:
        host, port = "127.0.0.1", value
    host = host or "127.0.0.1"
    if not port.isdigit() or int(port) > 65535:
        raise CommandError(f"--http {value!r}: give [HOST:]PORT, e.g. 8765 or 127.0.0.1:8765", EXIT_USAGE)
    return host.strip("[]"), int(port)


def settings_from_flags(args: argparse.Namespace, base: dict[str, Any]) -> dict[str, Any]:
    """The config file's settings (`base`) with the flags applied on top."""
    from sandboxes import DEFAULT_ALLOWED_IMPORTS

    settings = dict(base)
    for flag, key in (
        ("backend", "backend"),
        ("timeout", "timeout"),
        ("max_timeout", "max_timeout"),
        ("idle_timeout", "idle_timeout"),
        ("max_sessions", "max_sessions"),
        ("max_sessions_per_token", "max_sessions_per_token"),
    ):
        if getattr(args, flag) is not None:
            settings[key] = getattr(args, flag)
    if args.backend_option:
        settings["backend_options"] = {
            **settings.get("backend_options", {}),
            **backend_options(args.backend_option),
        }
    policy = dict(settings.get("policy", {}))
    imports = module_patterns(args.allow_import)
    if imports or args.only_imports:
        current = [] if args.only_imports else list(policy.get("allowed_imports", DEFAULT_ALLOWED_IMPORTS))
        policy["allowed_imports"] = list(dict.fromkeys([*current, *imports]))
    if args.allow_builtin:
        policy["allow_builtins"] = [*policy.get("allow_builtins", []), *module_patterns(args.allow_builtin)]
    network = merged_network(policy.get("network"), args)
    if network is not None:
        policy["network"] = network
    if args.limit:
        policy["limits"] = {**policy.get("limits", {}), **backend_options(args.limit)}
    if policy:
        settings["policy"] = policy
    if args.tool:
        tools = dict(settings.get("tools", {}) if isinstance(settings.get("tools"), dict) else {})
        for item in args.tool:
            name, sep, path = item.partition("=")
            if not sep:
                name, path = item.rpartition(":")[2].rpartition(".")[2], item
            tools[name.strip()] = path.strip()
        settings["tools"] = tools
    http = dict(settings.get("http", {}))
    if args.http:
        http["host"], http["port"] = parse_address(args.http)
    if args.allow_origin:
        http["allowed_origins"] = [*http.get("allowed_origins", []), *args.allow_origin]
    if args.allow_host:
        http["allowed_hosts"] = [*http.get("allowed_hosts", []), *args.allow_host]
    if http:
        settings["http"] = http
    return settings


def merged_network(current: Any, args: argparse.Namespace) -> Any:
    """The config file's `policy.network` with the flags on top: `--network` turns it on;
    `--allow-egress` and `--deny-egress` add to its rule lists (and turn it on). None: unchanged."""
    allow, deny = egress_rules(args.allow_egress), egress_rules(args.deny_egress)
    if not allow and not deny:
        return True if args.network and not current else None
    rules = dict(current) if isinstance(current, dict) else {}
    rules["allow"] = [*rules.get("allow", []), *allow]
    rules["deny"] = [*rules.get("deny", []), *deny]
    return rules


def cmd_mcp(args: argparse.Namespace) -> int:
    """Validate the settings, then serve until the client leaves or a signal arrives."""
    from sandboxes.adapters.mcp import McpConfigError, load_config, make_config, serve

    config = config_from_flags(args, load_config, make_config, settings_from_flags, McpConfigError)
    try:
        return serve(
            config,
            "http" if args.http is not None else "stdio",
            watchdog=not args.no_watchdog,
            verbose=args.verbose,
        )
    except McpConfigError as exc:
        raise CommandError(str(exc), EXIT_UNAVAILABLE if "pip install" in str(exc) else EXIT_USAGE) from None
    except OSError as exc:
        raise CommandError(f"cannot serve: {exc}", EXIT_UNAVAILABLE) from None
