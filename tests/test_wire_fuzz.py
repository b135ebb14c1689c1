"""A fuzzer for the sandbox channel: a real `Executor` drives a real runner process that answers every
operation with what hypothesis chooses — arbitrary, truncated, oversized, duplicated, out-of-order and
wrongly typed messages, lines without the token or with another, JSON nested past the parser's limit,
a fork reply naming a process that is not the fork's — and every call must still either return its
result or raise a `SandboxError`. After each example nothing the example started is left running, and
a bystander process (standing in for another session, whose pid the hostile runner names in its fork
replies) is untouched.

The runner is `tests/support/scripted_runner.py`, started on a socketpair as the host backend starts the real
one (a `HostWorker` at the process level owns it). Examples: `KODEAGENT_FUZZ_EXAMPLES` (default 40 here;
a longer run: ``KODEAGENT_FUZZ_EXAMPLES=2000 python -m pytest tests/test_wire_fuzz.py --timeout=0
--hypothesis-show-statistics``, which also reports the examples tried; the suite's per-test timeout
of 300 s holds all examples of the one test).
"""

from __future__ import annotations

import json
import os
import pathlib
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from support.wire_helpers import RUN_FIELDS

from sandboxes import ExecutionResult, SandboxError
from sandboxes.backends.host.process import HostWorker
from sandboxes.executor import Executor
from sandboxes.runtime.bounds import line_limit
from sandboxes.session import Session

pytestmark = pytest.mark.anyio

RUNNER = pathlib.Path(__file__).parent / "support" / "scripted_runner.py"
EXAMPLES = int(os.environ.get("KODEAGENT_FUZZ_EXAMPLES", "40"))
OUTPUT_LIMIT = 2_000
TIMEOUT = 0.5

# ------------------------------------------------------------------------------------ what the runner says

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)
pids = st.sampled_from(["@PID@", "@BYSTANDER@"])

messages = st.one_of(
    st.fixed_dictionaries({"op": st.just("reply"), "pid": pids, "uid": st.integers(0, 70_000)}),  # init
    st.fixed_dictionaries({"op": st.just("reply"), **{k: st.just(v) for k, v in RUN_FIELDS.items()}}).map(
        lambda m: {**m, "stdout": "ran\n"}
    ),
    st.just({"op": "reply"}),
    st.fixed_dictionaries(
        {
            "op": st.just("tool_call"),
            "id": st.integers(0, 5),
            "name": st.sampled_from(["echo", "boom", "missing"]),
            "args": st.lists(json_values, max_size=2),
            "kwargs": st.dictionaries(st.sampled_from(["a", "b"]), json_values, max_size=2),
        }
    ),
    st.fixed_dictionaries(
        {
            "op": st.just("output"),
            "stream": st.sampled_from(["stdout", "stderr"]),
            "text": st.text(max_size=20),
            "dropped": st.integers(0, 9),
        }
    ),
    st.fixed_dictionaries({"op": st.just("fatal"), "message": st.text(max_size=20)}),
    st.just({"op": "fork_channel"}),
    st.fixed_dictionaries(
        {
            "op": st.just("reply"),
            "pid": pids,
            "threads": st.integers(0, 3),
            "processes": st.integers(0, 3),
            "sockets": st.integers(0, 3),
        }
    ),
    st.fixed_dictionaries({"op": st.just("reply"), "error": st.text(max_size=20)}),
)


@st.composite
def mutated(draw: st.DrawFn) -> dict[str, Any]:
    """A message, sometimes with a field dropped, retyped or added."""
    message: dict[str, Any] = dict(draw(messages))
    change = draw(st.sampled_from(["none", "none", "none", "drop", "retype", "add"]))
    keys = sorted(message)
    if change == "drop":
        message.pop(draw(st.sampled_from(keys)))
    elif change == "retype":
        message[draw(st.sampled_from(keys))] = draw(json_values)
    elif change == "add":
        message[draw(st.text(max_size=6))] = draw(json_values)
    return message


@st.composite
def lines(draw: st.DrawFn) -> str:
    """One message as a line: its token first (mostly), or missing, wrong, last or twice."""
    message = draw(mutated())
    body = json.dumps(message)[1:]  # without its opening brace
    token = draw(st.sampled_from(["first"] * 6 + ["missing", "wrong", "last", "twice"]))
    if token == "missing":
        text = "{" + body
    elif token == "wrong":
        text = '{"token": "' + "0" * 32 + '", ' + body
    elif token == "last":
        text = json.dumps({**message, "token": "@TOKEN@"})
    elif token == "twice":
        text = '{"token": "@TOKEN@", ' + body[:-1] + ', "token": "forged"}'
    else:
        text = '{"token": "@TOKEN@", ' + body if message else '{"token": "@TOKEN@"}'
    for name in ("@PID@", "@BYSTANDER@"):
        text = text.replace(f'"{name}"', name)  # the runner makes these numbers
    return text


actions = st.one_of(
    lines().map(lambda text: ["line", text]),
    lines().map(lambda text: ["line", text]),
    lines().map(lambda text: ["line", text]),
    lines().map(lambda text: ["greet", text]),
    lines().map(lambda text: ["raw", text[: len(text) // 2]]),  # truncated, then whatever comes next
    st.text(max_size=30).map(lambda text: ["line", text]),  # not JSON at all
    st.just(["line", '{"token": "@TOKEN@", "op": "reply", "value": ' + "[" * 50_000 + "]" * 50_000 + "}"]),
    st.just(["flood", line_limit(OUTPUT_LIMIT) + 10]),
    st.just(["close"]),
    st.just(["hang"]),
)
answers = st.lists(actions, min_size=1, max_size=3)
scripts = st.lists(answers, min_size=1, max_size=8)
operations = st.lists(
    st.sampled_from(["run", "run", "stream", "tool", "reset", "fork", "upload", "download"]),
    min_size=1,
    max_size=6,
)

GOOD_INIT = [["line", '{"token": "@TOKEN@", "op": "reply", "pid": @PID@, "uid": 0}']]
GOOD_RUN = [["line", json.dumps({"token": "@TOKEN@", "op": "reply", **RUN_FIELDS})]]

# ------------------------------------------------------------------------------------ the executor


class ScriptedRunnerExecutor(Executor):
    """An executor whose sessions are `scripted_runner.py` processes: the first one follows the
    example's script (after a good answer to `init` unless the example fuzzes that too), every later
    one (after a discard) behaves."""

    backend = "scripted-runner"

    def __init__(self, first: list[Any], bystander: int, **options: Any) -> None:
        super().__init__(**options)
        self.scripts: Iterator[list[Any]] = iter([first])
        self.bystander = bystander
        self.workers: list[HostWorker] = []

    async def _new_session(self) -> Session:
        script = next(self.scripts, [GOOD_INIT] + [GOOD_RUN] * 40)
        worker = await anyio.to_thread.run_sync(start_runner, script, self.bystander)
        self.workers.append(worker)
        return await self._runner_session(worker)


def start_runner(script: list[Any], bystander: int) -> HostWorker:
    directory = tempfile.mkdtemp(prefix="kodeagent-fuzz-")
    path = os.path.join(directory, ".script.json")
    with open(path, "w", encoding="utf-8") as file:
        json.dump(script, file)
    # The runner knows its pid only once started: the placeholders become numbers there.
    program = (
        "import os, runpy, sys\n"
        f"text = open({path!r}).read().replace('@PID@', str(os.getpid())).replace('@BYSTANDER@', '{bystander}')\n"
        f"open({path!r}, 'w').write(text)\n"
        f"sys.argv = [{str(RUNNER)!r}, {path!r}]\n"
        f"runpy.run_path({str(RUNNER)!r}, run_name='__main__')\n"
    )
    parent_end, child_end = socket.socketpair()
    try:
        process = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", program],
            stdin=child_end.fileno(),
            stdout=child_end.fileno(),
            stderr=subprocess.DEVNULL,
            cwd=directory,
            env={},
            start_new_session=True,
        )
    finally:
        child_end.close()
    return HostWorker(process, parent_end, directory, None, "process", owns_workdir=True)


@pytest.fixture(scope="module")
def bystander() -> Iterator[subprocess.Popen[bytes]]:
    process = subprocess.Popen(["sleep", "3600"], start_new_session=True)
    yield process
    process.kill()
    process.wait()


async def echo(*args: Any, **kwargs: Any) -> Any:
    return [list(args), kwargs]


def boom(*args: Any, **kwargs: Any) -> Any:
    raise KeyError("boom")


async def drive(ex: ScriptedRunnerExecutor, operation: str) -> None:
    """One operation; it must return its result or raise a `SandboxError`."""
    try:
        if operation == "run":
            assert isinstance(await ex.run("x = 1"), ExecutionResult)
        elif operation == "tool":
            assert isinstance(await ex.run("echo(1)"), ExecutionResult)
        elif operation == "stream":
            async with ex.stream("print(1)") as events:
                async for _ in events:
                    pass
        elif operation == "reset":
            await ex.reset()
        elif operation == "fork":
            child = await ex.fork()
            await child.close()
        elif operation == "upload":
            await ex.upload("data.txt", b"hello")
        elif operation == "download":
            await ex.download("data.txt")
    except SandboxError:
        pass


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    derandomize="CI" in os.environ,
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink],  # no 'explain': minutes per failure
)
@given(script=scripts, ops=operations, fuzz_init=st.booleans())
async def test_whatever_the_runner_says_each_call_returns_or_raises_a_sandbox_error(
    script: list[Any], ops: list[str], fuzz_init: bool, bystander: subprocess.Popen[bytes]
) -> None:
    first = script if fuzz_init else [GOOD_INIT, *script]
    ex = ScriptedRunnerExecutor(
        first,
        bystander.pid,
        timeout=TIMEOUT,
        output_limit=OUTPUT_LIMIT,
        tools={"echo": echo, "boom": boom},
    )
    try:
        await ex.open()
    except SandboxError:
        pass
    else:
        for operation in ops:
            await drive(ex, operation)
    finally:
        await ex.close()
        await ex.wait_closed()
    for worker in ex.workers:
        assert worker.process is not None and worker.process.poll() is not None, "a runner was left running"
    assert bystander.poll() is None, "the hostile runner's fork reply killed a process that was not its own"
