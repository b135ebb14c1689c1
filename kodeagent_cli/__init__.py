"""The `kodeagent` command: run agents, execute code in a sandbox, benchmark, manage images, diagnose.

    kodeagent exec script.py --allow-import numpy.*      run code in a sandbox, print what it printed
    kodeagent run "What is 2**100?" --model gpt-4o-mini   run an agent and stream its steps
    kodeagent bench humaneval                             HumanEval execution benchmark (host backend)
    kodeagent bench latency|security|agent|soak|pools|runcode
    kodeagent images build|list                           Docker sandbox images
    kodeagent cleanup                                     remove leftover sandbox containers
    kodeagent mcp [--http [HOST:]PORT]                    the sandbox as an MCP server (stdio or HTTP)
    kodeagent serve [--http [HOST:]PORT]                  sandboxes over E2B's API, for E2B's SDKs
    kodeagent doctor                                      which backends work here, and how to fix the rest

Why it is written this way: this package is the top floor (nothing imports it: it sits beside, not inside,
`kodeagent`, because it imports `benchmarks`, which imports `kodeagent`) and must start fast,
so it imports only the standard library at start-up; `sandboxes`, `benchmarks`, rich, litellm and
the Docker and E2B SDKs are imported inside the command that needs them. Exit codes mean the same
thing in every command (see `EXIT_*`); `--json` prints one JSON document on stdout and nothing else.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from .commands import cmd_bench, cmd_cleanup, cmd_exec, cmd_images, cmd_run
from .common import (
    BACKENDS,
    BENCHMARKS,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_TIMEOUT,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    CommandError,
    add_network_arguments,
    add_policy_arguments,
)
from .doctor import cmd_doctor, doctor_checks
from .mcp import add_mcp_command
from .serve import add_serve_command


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kodeagent",
        description="Sandboxed code execution for CodeAct agents: run agents, execute code, benchmark.",
        epilog="exit codes: 0 ok, 1 failed, 2 usage, 3 backend or package unavailable, 124 timeout, 130 interrupted",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def add(name: str, help_text: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help_text, description=help_text)
        sub.add_argument("--json", action="store_true", help="print machine-readable JSON on stdout")
        return sub

    run = add("run", "run an agent on a task and stream its steps")
    run.add_argument("task", help="what the agent should do")
    run.add_argument(
        "--model", required=True, help="litellm model string, e.g. gpt-4o-mini or gemini/gemini-2.5-flash"
    )
    run.add_argument(
        "--agent", choices=("codeact", "react"), default="codeact", help="agent type (default codeact)"
    )
    run.add_argument(
        "--backend", choices=BACKENDS, default="host", help="where CodeAct code runs (default host)"
    )
    run.add_argument("--max-iterations", type=int, default=10, help="steps at most (default 10)")
    run.add_argument("--timeout", type=int, default=30, help="seconds per code run (default 30)")
    run.add_argument(
        "--allow-import",
        action="append",
        default=[],
        metavar="MODULE",
        help="extra module (pattern) the code may import, besides the defaults; repeatable",
    )
    add_network_arguments(run)
    run.add_argument("--api-base", help="OpenAI-compatible endpoint (e.g. a local server; model openai/NAME)")
    run.add_argument("--api-key", help="the provider's API key (default: its environment variable)")
    run.add_argument(
        "--structured-output",
        choices=("auto", "json_schema", "json_object", "off"),
        default="auto",
        help="constrain replies with a response format (default auto: when the model or server "
        "supports one, falling back to free text)",
    )
    run.add_argument(
        "-o",
        "--backend-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="option of the sandbox backend, e.g. image=kodeagent-sandbox:datascience (repeatable)",
    )
    run.add_argument("-v", "--verbose", action="store_true", help="also show log messages")
    run.set_defaults(handler=cmd_run)

    exe = add("exec", "run Python code in a sandbox and print what it printed")
    exe.add_argument("file", metavar="FILE", help="a Python file, or - for stdin")
    exe.add_argument("--backend", choices=BACKENDS, default="host", help="sandbox backend (default host)")
    add_policy_arguments(exe)
    exe.add_argument("--timeout", type=float, default=30.0, help="wall-clock seconds (default 30)")
    exe.add_argument("--workdir", help="working directory of the code (default: a fresh temporary one)")
    exe.set_defaults(handler=cmd_exec)

    bench = add("bench", "run a benchmark: " + ", ".join(BENCHMARKS))
    bench.add_argument(
        "name",
        choices=sorted(BENCHMARKS),
        metavar="NAME",
        help="; ".join(f"{k}: {v}" for k, v in BENCHMARKS.items()),
    )
    bench.add_argument(
        "options",
        nargs=argparse.REMAINDER,
        help="options of the benchmark (see `kodeagent bench NAME --help`)",
    )
    bench.set_defaults(handler=cmd_bench)

    images = add("images", "build or list Docker sandbox images")
    image_commands = images.add_subparsers(dest="images_command", metavar="ACTION", required=True)
    build = image_commands.add_parser("build", help="build a sandbox image (reused when nothing changed)")
    build.add_argument("--variant", default="py", help="py (default) or datascience")
    where = build.add_mutually_exclusive_group()
    where.add_argument(
        "--offline",
        action="store_true",
        default=None,
        help="make the base image from the Debian mirror (no Docker Hub)",
    )
    where.add_argument("--base", help="base image of the standard variant")
    build.add_argument("--mirror", help="Debian mirror for --offline")
    build.add_argument("--force", action="store_true", help="rebuild even when nothing changed")
    image_commands.add_parser("list", help="list sandbox images")
    for sub in image_commands.choices.values():
        sub.add_argument("--json", action="store_true", help="print machine-readable JSON on stdout")
    images.set_defaults(handler=cmd_images)

    clean = add("cleanup", "remove sandbox containers whose owner process is gone")
    clean.add_argument("--all", action="store_true", help="remove every sandbox container, live sessions too")
    clean.add_argument(
        "--images", action="store_true", help="also remove older image builds no alias points to"
    )
    clean.set_defaults(handler=cmd_cleanup)

    doctor = add("doctor", "check which backends work here, what is missing and how to fix it")
    doctor.add_argument(
        "--backend", choices=BACKENDS, action="append", help="check only this backend (repeatable)"
    )
    doctor.set_defaults(handler=cmd_doctor)

    add_mcp_command(commands)
    add_serve_command(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `kodeagent` console script; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code: int = args.handler(args)
        return code
    except CommandError as exc:
        print(f"kodeagent {args.command}: {exc}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


__all__ = [
    "BACKENDS",
    "BENCHMARKS",
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_TIMEOUT",
    "EXIT_UNAVAILABLE",
    "EXIT_USAGE",
    "CommandError",
    "build_parser",
    "doctor_checks",
    "main",
]
