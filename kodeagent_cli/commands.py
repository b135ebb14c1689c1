"""The commands: exec, run, bench, images, cleanup."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from .common import (
    BENCHMARKS,
    EXIT_FAILED,
    EXIT_OK,
    EXIT_TIMEOUT,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    CommandError,
    backend_options,
    module_patterns,
    network_setting,
    print_json,
    read_code,
    table,
)


def cmd_exec(args: argparse.Namespace) -> int:
    """Run a file (or stdin) in one sandbox session; relay its stdout and stderr; exit by its outcome."""
    code = read_code(args.file)
    import anyio

    from sandboxes import DEFAULT_ALLOWED_IMPORTS, BackendUnavailable, Policy, SandboxError, open_executor
    from sandboxes.runtime import values

    imports = module_patterns(args.allow_import)
    allowed = list(dict.fromkeys([*([] if args.only_imports else DEFAULT_ALLOWED_IMPORTS), *imports]))
    network = network_setting(args)
    try:
        policy = Policy(
            allowed_imports=tuple(allowed),
            allow_builtins=tuple(module_patterns(args.allow_builtin)),
            network=network,
        )
    except ValueError as exc:
        raise CommandError(f"invalid policy: {exc}", EXIT_USAGE) from None
    options: dict[str, Any] = {
        **backend_options(args.backend_option),
        "policy": policy,
        "timeout": args.timeout,
    }
    if args.workdir:
        options["workdir"] = args.workdir

    # On a terminal the output is written as the code produces it; `--json` and pipes get the result's.
    live = not args.json and sys.stdout.isatty()

    def relay(stream: Any) -> Any:
        def write(event: Any) -> None:  # an OutputEvent of that stream
            if event.dropped:
                sys.stderr.write(
                    f"\n[{event.dropped} characters of output not shown: over the stream's budget]\n"
                )
            stream.write(event.text)
            stream.flush()

        return write

    async def go() -> Any:
        async with open_executor(args.backend, **options) as executor:
            if live:
                return await executor.run(code, on_stdout=relay(sys.stdout), on_stderr=relay(sys.stderr))
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
        if not live:
            sys.stdout.write(result.stdout)
            sys.stdout.flush()
            sys.stderr.write(result.stderr)
        shown = result.shown_value()
        if shown is not None:  # as the Python prompt shows an expression's value
            print(shown)
        if result.has_final_answer:
            answer = result.final_answer
            print(answer if isinstance(answer, str) else values.shown(answer))
        if result.error is not None:
            text = result.error.traceback or str(result.error)
            sys.stderr.write(text if text.endswith("\n") else text + "\n")
        if result.state_lost and not result.timed_out:
            sys.stderr.write("(the sandbox worker was lost and replaced)\n")
        write_refused(result.network)
    if result.timed_out:
        return EXIT_TIMEOUT
    return EXIT_OK if result.ok else EXIT_FAILED


def write_refused(report: Any) -> None:
    """A stderr line per connection the egress gateway refused, naming the rule (`--json` has the
    whole report)."""
    if report is None:
        return
    for line in report.refusals(limit=100):
        sys.stderr.write(line + "\n")
    if report.error:
        sys.stderr.write(f"[network: {report.error}]\n")


# ---------------------------------------------------------------------- run


def cmd_run(args: argparse.Namespace) -> int:
    """Run an agent on a task and stream its steps; exit 0 when it reached a successful final answer."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    try:
        import anyio

        from kodeagent import CodeActAgent, ReActAgent, print_response
        from kodeagent.errors import KodeAgentError
    except ImportError as exc:
        raise CommandError(
            f"the agents are not available ({exc}); pip install 'kodeagent[agents]'", EXIT_UNAVAILABLE
        ) from None
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
    # On a terminal the reply and the code's output are shown as they come; `--json` and a pipe get
    # whole steps only (a streamed piece would be printed twice, once inline and once in its step).
    live = not args.json and sys.stdout.isatty()
    common: dict[str, Any] = {
        "stream": live,
        "litellm_params": litellm_params,
        "max_iterations": args.max_iterations,
        "structured_output": args.structured_output,
    }
    try:
        if args.agent == "codeact":
            imports = module_patterns(args.allow_import)
            executor_options = backend_options(args.backend_option)
            network = network_setting(args)
            if network:
                executor_options["policy"] = _network_policy(network, imports)
            agent: Any = CodeActAgent(
                args.model,
                backend=args.backend,
                timeout=args.timeout,
                executor_options=executor_options,
                allowed_imports=None if not imports else _with_defaults(imports),
                **common,
            )
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
        print_json({"final": final, "responses": responses, "usage": usage})
    else:
        print(agent.usage_tracker.report(include_breakdown=False), file=sys.stderr)
    return EXIT_OK if final.get("successful") else EXIT_FAILED


def _network_policy(network: Any, imports: list[str]) -> Any:
    """The agent's default policy (its imports) with the network flags' setting."""
    from sandboxes import DEFAULT_ALLOWED_IMPORTS, Policy

    allowed = _with_defaults(imports) if imports else list(DEFAULT_ALLOWED_IMPORTS)
    return Policy(allowed_imports=tuple(allowed), network=network)


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
        raise CommandError(
            f"benchmark {args.name!r} cannot be loaded ({exc}); pip install 'kodeagent[bench]'",
            EXIT_UNAVAILABLE,
        ) from None
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
            info = images.build_image(
                args.variant,
                base=args.base,
                offline=args.offline,
                mirror=args.mirror,
                force=args.force,
                progress=lambda m: print(m, file=sys.stderr),
            )
            if args.json:
                print_json(info.model_dump())
            else:
                state = "unchanged, reused" if info.reused else "built"
                print(f"{info.alias} -> {info.tag} ({state}, {info.size_mb} MB)")
            return EXIT_OK
        found = images.list_images()
    except Exception as exc:  # noqa: BLE001 - a Docker API error: one line, not a traceback
        raise _docker_command_error(exc) from None
    if args.json:
        print_json([info.model_dump() for info in found])
    elif not found:
        print("no sandbox images; build one with `kodeagent images build` (add --offline without Docker Hub)")
    else:
        table(
            ["image", "alias", "variant", "size"],
            [[i.tag, i.alias, i.variant, f"{i.size_mb:.1f} MB"] for i in found],
            "Sandbox images",
        )
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
        print_json({"removed": removed, "removed_images": old_images})
    else:
        print(f"removed {len(removed)} sandbox container(s)")
        if args.images:
            print(f"removed {len(old_images)} old image tag(s)")
    return EXIT_OK
