"""Streaming agents (`stream=True`) against the LLM stand-in's server-sent events, over real HTTP.

Each streaming run is compared with the same scripted run without streaming: the steps, the answer and
the usage must be the same; streaming only adds `token` (and, in CodeAct, `output`) responses.
"""

from __future__ import annotations

import json
import os
import pty
import re
import select
import subprocess
import sys
from contextlib import aclosing
from pathlib import Path
from typing import Any

import pytest
from support.llm_standin import StandinLLM, code_final, code_step, collect, cut, react_finish, reply
from support.needs import require

from kodeagent import AgentResponse, CodeActAgent, ReActAgent, StepRecord, tool
from kodeagent.llm import litellm_module
from sandboxes import ExecutorState

pytestmark = pytest.mark.anyio


@tool
def get_price(symbol: str) -> float:
    """Latest price of a stock. Args: symbol: ticker, e.g. AAPL."""
    return {"AAPL": 200.0, "MSFT": 410.5}[symbol]


def codeact(llm: StandinLLM, stream: bool, run_env: str = "host") -> CodeActAgent:
    options: dict[str, Any] = {}
    if run_env == "docker":
        options["executor_options"] = {"image": "kodeagent-sandbox:py"}
    elif run_env == "e2b":  # the loopback E2B stand-in, driven by the unmodified SDK
        from support import backend_e2b

        options["executor_options"] = backend_e2b.connection()
    agent = CodeActAgent(
        llm.model("json"),
        run_env=run_env,  # type: ignore[arg-type]
        **options,
        litellm_params=llm.params(),
        tools=[get_price],
        allowed_imports=["math", "sys", "time"],
        timeout=20,
        stream=stream,
    )
    agent.retry_base_delay = 0.01
    return agent


def comparable(step: StepRecord) -> dict[str, Any]:
    """A step record without its timings and CPU time (which differ from run to run)."""
    data = step.model_dump(mode="json", exclude={"duration", "cpu_seconds"})
    for call in data["tool_calls"]:
        call.pop("duration")
    return data


def steps(responses: list[AgentResponse]) -> list[dict[str, Any]]:
    return [comparable(r.value) for r in responses if r.type == "step"]


def usage(responses: list[AgentResponse]) -> dict[str, Any]:
    final = responses[-1]
    assert final.type == "final"
    return dict(final.metadata["usage"])


def tokens_by_step(responses: list[AgentResponse]) -> dict[int, str]:
    out: dict[int, str] = {}
    for r in responses:
        if r.type == "token":
            out[r.metadata["step"]] = out.get(r.metadata["step"], "") + r.value
    return out


@pytest.fixture(
    params=[
        "host",
        pytest.param("docker", marks=pytest.mark.docker),
        pytest.param("e2b", marks=pytest.mark.e2b),
    ]
)
def run_env(request: pytest.FixtureRequest) -> str:
    """Where CodeAct's code runs: the host, and Docker and E2B (its loopback stand-in) where usable."""
    from support import backend_docker, backend_e2b

    reason = {"host": lambda: None, "docker": backend_docker.unavailable, "e2b": backend_e2b.unavailable}
    require(reason[request.param](), f"CodeAct on {request.param}")
    return str(request.param)


SCRIPT = [
    code_step("import math\nprint('root', math.sqrt(get_price('AAPL') * 2))"),
    code_final("20.0"),
]


# ---------------------------------------------------------------------- the stand-in's events


async def test_standin_streams_chunks_litellm_reassembles(llm: StandinLLM) -> None:
    litellm = litellm_module()
    text = "Hello, this reply arrives in many small pieces."
    llm.add(reply(text), reply(tool_calls=[("get_price", {"symbol": "MSFT"})]))
    messages = [{"role": "user", "content": "hi"}]
    for expected_content, expected_calls in ((text, None), (None, [("get_price", '{"symbol": "MSFT"}')])):
        stream = await litellm.acompletion(
            model=llm.model("native"),
            messages=messages,
            stream=True,
            stream_options={"include_usage": True},
            **llm.params(),
        )
        chunks = [c async for c in stream]
        deltas = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
        built = litellm.stream_chunk_builder(chunks, messages=messages)
        assert built is not None
        message = built.choices[0].message
        if expected_content is not None:
            assert len(deltas) > 3  # really in pieces, not one
            assert "".join(deltas) == expected_content == message.content
            assert built.choices[0].finish_reason == "stop"
        else:
            calls = [(c.function.name, c.function.arguments) for c in message.tool_calls]
            assert calls == expected_calls
            assert built.choices[0].finish_reason == "tool_calls"
        # the usage chunk the server sent (its own count), not one litellm made up
        whole = llm._completion(llm.requests[-1], reply(expected_content, tool_calls=[]))
        assert built.usage.prompt_tokens == whole["usage"]["prompt_tokens"]
    assert all(r["stream"] is True and r["stream_options"] == {"include_usage": True} for r in llm.requests)


# ---------------------------------------------------------------------- CodeAct


async def test_streaming_codeact_run_equals_the_plain_run(llm: StandinLLM, run_env: str) -> None:
    llm.add(*SCRIPT)
    plain = await collect(codeact(llm, False, run_env).run("sqrt of twice the AAPL price?"))
    llm.add(*SCRIPT)
    streamed = await collect(codeact(llm, True, run_env).run("sqrt of twice the AAPL price?"))

    assert not [r for r in plain if r.type in ("token", "output")]
    assert steps(streamed) == steps(plain)
    assert len(steps(plain)) == 2
    # the code step's CPU time is measured either way (the streamed result carries its usage too);
    # on E2B it comes from the sandbox's metrics, sampled every few seconds, so a short step has a
    # figure only when a sample fell inside it: present or not, by chance, in each run
    cpu = [[r.value.cpu_seconds is not None for r in rs if r.type == "step"] for rs in (plain, streamed)]
    if run_env != "e2b":
        assert cpu[0] == cpu[1]
    else:
        assert cpu[0][1:] == cpu[1][1:] == [False]  # the final answer's step runs no code
    if run_env == "host":  # measured by the parent here
        assert cpu[0] == [True, False]
    assert streamed[-1].value == plain[-1].value == "20.0"
    assert streamed[-1].metadata["task_successful"] is True
    # the model saw the same conversation both times
    assert [r["messages"] for r in llm.requests[2:]] == [r["messages"] for r in llm.requests[:2]]
    assert all(r.get("stream") for r in llm.requests[2:]) and not any(
        r.get("stream") for r in llm.requests[:2]
    )
    # each step's tokens, joined, are its reply verbatim
    records = [r.value for r in streamed if r.type == "step"]
    assert tokens_by_step(streamed) == {s.index: s.raw_reply for s in records}
    assert sum(r.type == "token" for r in streamed) > 4


async def test_output_arrives_while_the_step_runs(llm: StandinLLM, run_env: str) -> None:
    code = "import sys\nprint('first line')\nprint('to stderr', file=sys.stderr)\nprint('second line')"
    llm.add(code_step(code), code_final("done"))
    responses = await collect(codeact(llm, True, run_env).run("print some lines"))
    first_step = next(i for i, r in enumerate(responses) if r.type == "step")
    outputs = [r for r in responses if r.type == "output"]
    assert outputs and all(responses.index(o) < first_step for o in outputs)
    stdout = "".join(o.value for o in outputs if o.metadata["stream"] == "stdout")
    stderr = "".join(o.value for o in outputs if o.metadata["stream"] == "stderr")
    assert stdout == "first line\nsecond line\n"
    assert stderr == "to stderr\n"
    assert {o.metadata["step"] for o in outputs} == {1}
    # the step's observation is built from the result, as without streaming
    observation = responses[first_step].value.observation
    assert "first line" in observation and "second line" in observation


async def test_usage_totals_equal_streamed_and_not(llm: StandinLLM) -> None:
    llm.add(*SCRIPT)
    plain = usage(await collect(codeact(llm, stream=False).run("sqrt?")))
    llm.add(*SCRIPT)
    streamed = usage(await collect(codeact(llm, stream=True).run("sqrt?")))
    assert plain["prompt_tokens"] > 0 and plain["completion_tokens"] > 0 and plain["cost"] > 0
    assert streamed == plain


async def test_usage_is_counted_when_the_stream_has_no_usage_chunk(llm: StandinLLM) -> None:
    from support.llm_standin import Reply

    llm.add(*(Reply(content=text, usage_chunk=False) for text in SCRIPT))
    responses = await collect(codeact(llm, stream=True).run("sqrt?"))
    assert responses[-1].value == "20.0"
    counted = usage(responses)
    litellm = litellm_module()
    # the replies' own tokens, counted by litellm's token counter (within a token a reply: how the
    # builder joins the pieces), not the server's four-characters-a-token figure, which it never sent
    expected = sum(litellm.token_counter(model=llm.model("json"), text=text) for text in SCRIPT)
    assert abs(counted["completion_tokens"] - expected) <= len(SCRIPT)
    served = sum(len(json.dumps({"role": "assistant", "content": text})) // 4 for text in SCRIPT)
    assert counted["completion_tokens"] != served
    assert counted["prompt_tokens"] > 0 and counted["cost"] > 0


async def test_retry_after_partial_tokens_is_announced(llm: StandinLLM) -> None:
    first = SCRIPT[0]
    llm.add(cut(first, after=4), *SCRIPT)
    responses = await collect(codeact(llm, stream=True).run("sqrt?"))
    kinds = [(r.type, r.metadata.get("event")) for r in responses]
    retry = kinds.index(("log", "retry"))
    notice = responses[retry]
    assert notice.metadata["discard_partial"] is True and notice.metadata["attempt"] == 2
    assert "retried" in notice.value
    before = "".join(r.value for r in responses[:retry] if r.type == "token")
    assert before and first.startswith(before) and before != first  # a partial reply came first
    step_at = next(i for i, r in enumerate(responses) if r.type == "step")
    after = "".join(r.value for r in responses[retry:step_at] if r.type == "token")
    assert after == first == responses[step_at].value.raw_reply
    assert responses[-1].value == "20.0"


# ---------------------------------------------------------------------- ReAct's native tool calls


async def test_react_native_tool_call_deltas_assembled(llm: StandinLLM) -> None:
    script = [reply(tool_calls=[("get_price", {"symbol": "MSFT"})]), reply(react_finish("410.5"))]

    def agent(server: StandinLLM, stream: bool) -> ReActAgent:
        a = ReActAgent(
            server.model("native"), litellm_params=server.params(), tools=[get_price], stream=stream
        )
        a.retry_base_delay = 0.01
        return a

    llm.add(*script)
    plain = await collect(agent(llm, False).run("MSFT price?"))
    with StandinLLM() as twin:  # a second server, so that its tool-call ids count from 1 again
        twin.add(*script)
        streamed = await collect(agent(twin, True).run("MSFT price?"))
    assert steps(streamed) == steps(plain)
    call = steps(streamed)[0]["tool_calls"][0]
    assert (call["name"], call["args"], call["result"]) == ("get_price", {"symbol": "MSFT"}, 410.5)
    assert twin.requests[1]["messages"] == llm.requests[1]["messages"]
    assert twin.requests[0]["stream"] is True
    assert streamed[-1].value == plain[-1].value == "410.5"
    assert usage(streamed) == usage(plain)


# ---------------------------------------------------------------------- the command line on a terminal

CLI = [sys.executable, "-m", "kodeagent_cli"]
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")


def cli_env() -> dict[str, str]:
    """The environment of a CLI subprocess: this checkout first on its path, a key for the stand-in."""
    path = os.pathsep.join([str(Path(__file__).parents[1]), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path, "OPENAI_API_KEY": "sk-standin"}


def on_terminal(args: list[str], *, stop_when: str | None = None) -> tuple[str, bool | None]:
    """Run the CLI with a pseudo-terminal as its stdout and stderr; its output, ANSI codes removed.

    With `stop_when`, also whether the process was still running when that text first appeared.
    """
    master, slave = pty.openpty()
    env = {**cli_env(), "COLUMNS": "400", "TERM": "xterm"}
    proc = subprocess.Popen(CLI + args, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave, env=env)
    os.close(slave)
    raw = b""
    running_at_stop: bool | None = None
    try:
        while True:
            ready, _, _ = select.select([master], [], [], 120)
            if not ready:
                raise AssertionError(f"no output for 120 s; so far: {raw!r}")
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the terminal's other end closed (the process ended)
                break
            if not data:
                break
            raw += data
            if (
                stop_when
                and running_at_stop is None
                and stop_when in ANSI.sub("", raw.decode(errors="replace"))
            ):
                running_at_stop = proc.poll() is None
    finally:
        os.close(master)
        proc.wait(timeout=60)
    return ANSI.sub("", raw.decode(errors="replace")).replace("\r\n", "\n"), running_at_stop


def test_exec_on_a_terminal_prints_while_the_code_runs() -> None:
    code = "import time\nprint('first', flush=True)\ntime.sleep(3)\nprint('second')\n"
    script = Path(os.environ.get("TMPDIR", "/tmp")) / f"stream-{os.getpid()}.py"
    script.write_text(code)
    try:
        out, running = on_terminal(["exec", str(script), "--allow-import", "time"], stop_when="first")
    finally:
        script.unlink()
    assert running is True  # 'first' reached the terminal while the code was still sleeping
    assert out.count("first") == 1 and out.count("second") == 1  # written once: not again from the result
    assert out.index("first") < out.index("second")


def test_run_on_a_terminal_shows_tokens_and_output(llm: StandinLLM) -> None:
    script = [code_step("print('hello' + '-out')"), code_final("done")]
    args = ["run", "say hello", "--model", llm.model("json"), "--api-base", llm.api_base]
    llm.add(*script)
    out, _ = on_terminal(args)
    assert '{"thought": "Let me compute this."' in out  # the reply's tokens, verbatim
    assert out.count("hello-out") == 2  # printed as the code ran, and again in the step's observation
    assert "done" in out
    llm.add(*script)
    piped = subprocess.run(
        CLI + args,
        capture_output=True,
        text=True,
        timeout=120,
        env=cli_env(),
    )
    assert piped.returncode == 0, piped.stderr
    assert '{"thought"' not in piped.stdout and piped.stdout.count("hello-out") == 1  # whole steps only
    assert not any(r.get("stream") for r in llm.requests[2:])


async def test_leaving_a_streaming_run_mid_step_releases_it(llm: StandinLLM) -> None:
    code = "import time\nprint('working', flush=True)\ntime.sleep(30)\nprint('never')"
    llm.add(code_step(code), code_final("done"))
    agent = codeact(llm, stream=True)
    seen: list[AgentResponse] = []
    async with aclosing(agent.run("work")) as responses:
        async for response in responses:
            seen.append(response)
            if response.type == "output":
                assert agent.last_run is not None
                executor = agent.last_run.executor
                break  # the consumer leaves while the step's code is still running
    assert seen[-1].value == "working\n"
    run = agent.last_run
    assert run is not None and run.finished and run.emit is None
    assert executor is not None and executor.state is ExecutorState.CLOSED
    # the agent is usable again at once: a new run goes through
    llm.script.clear()
    llm.add(code_final("again"))
    assert (await agent.arun("again?")).value == "again"
