"""One list of backends: `sandboxes.backends.BackendName` is what `BACKENDS` holds, and every reader
(kodeagent's `RunEnv` and its check, the command line, the benchmarks' options) offers exactly it."""

from __future__ import annotations

import argparse
from typing import get_args

import pytest

from kodeagent import CodeActAgent, ConfigurationError
from kodeagent.codeact import RunEnv
from sandboxes.backends import BACKEND_NAMES, BACKENDS, BackendName


def test_the_literal_names_every_backend_and_nothing_else() -> None:
    assert BACKEND_NAMES == get_args(BackendName)
    assert len(set(BACKEND_NAMES)) == len(BACKEND_NAMES)
    assert set(BACKEND_NAMES) == set(BACKENDS)


def test_run_env_is_the_literal() -> None:
    assert get_args(RunEnv) == BACKEND_NAMES


def test_codeact_takes_every_backend_and_names_them_when_refusing() -> None:
    for name in BACKEND_NAMES:
        assert CodeActAgent("openai/x", run_env=name).run_env == name
    with pytest.raises(ConfigurationError) as refused:
        CodeActAgent("openai/x", run_env="moon")  # type: ignore[arg-type]
    assert all(repr(name) in str(refused.value) for name in BACKEND_NAMES) and "'moon'" in str(refused.value)


def _backend_choices(parser: argparse.ArgumentParser) -> list[tuple[str, tuple[str, ...]]]:
    """(command, choices) of every ``--backend`` option in `parser` and its subcommands."""
    found: list[tuple[str, tuple[str, ...]]] = []
    for action in parser._actions:
        if "--backend" in action.option_strings and action.choices is not None:
            found.append((parser.prog, tuple(action.choices)))
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found.extend(_backend_choices(sub))
    return found


def test_the_command_line_and_the_benchmarks_offer_the_list() -> None:
    import importlib

    from kodeagent_cli import build_parser

    found = _backend_choices(build_parser())
    assert {prog.split()[-1] for prog, _ in found} >= {"run", "exec", "doctor", "mcp"}
    assert all(choices == BACKEND_NAMES for _, choices in found)
    for name in ("humaneval", "agent"):
        parser = argparse.ArgumentParser(prog=name)
        importlib.import_module(f"benchmarks.{name}").add_arguments(parser)
        assert _backend_choices(parser) == [(name, BACKEND_NAMES)]
    parser = argparse.ArgumentParser(prog="latency")
    importlib.import_module("benchmarks.latency").add_arguments(parser)
    assert _backend_choices(parser) == [("latency", ("all", *BACKEND_NAMES))]
