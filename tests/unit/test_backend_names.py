"""One list of backends: `sandboxes.backends.BackendName` is what `BACKENDS` holds, and every reader
(kodeagent's `RunEnv` and its check, the command line, the benchmarks' options) offers exactly it."""

from __future__ import annotations

import argparse
import contextlib
import io
import re
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


def _offered(parser: argparse.ArgumentParser, argv: list[str]) -> tuple[str, ...]:
    """The backends `parser` takes after `argv`: each one it names when refusing an unknown backend,
    checked to parse as itself."""
    errors = io.StringIO()
    with contextlib.redirect_stderr(errors), pytest.raises(SystemExit):
        parser.parse_args([*argv, "--backend", "moon"])
    refusal = re.search(r"invalid choice: 'moon' \(choose from (.*)\)", errors.getvalue())
    assert refusal, errors.getvalue()
    names = tuple(name.strip().strip("'") for name in refusal.group(1).split(","))
    for name in names:
        assert parser.parse_args([*argv, "--backend", name]).backend in (name, [name])  # doctor: a list
    return names


def test_the_command_line_and_the_benchmarks_offer_the_list() -> None:
    import importlib

    from kodeagent_cli import build_parser

    for argv in (["run", "a task", "--model", "openai/x"], ["exec", "-"], ["doctor"], ["mcp"]):
        assert _offered(build_parser(), argv) == BACKEND_NAMES
    for name, argv in (("humaneval", []), ("agent", ["--model", "openai/x"])):
        parser = argparse.ArgumentParser(prog=name)
        importlib.import_module(f"benchmarks.{name}").add_arguments(parser)
        assert _offered(parser, argv) == BACKEND_NAMES
    parser = argparse.ArgumentParser(prog="latency")
    importlib.import_module("benchmarks.latency").add_arguments(parser)
    assert _offered(parser, []) == ("all", *BACKEND_NAMES)
