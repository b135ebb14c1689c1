"""smolagents' real `CodeAgent` with `KodeagentExecutor`: every code step runs in our sandbox.

The model is the LLM stand-in (tests/support/llm_standin.py), reached by smolagents' own `LiteLLMModel` over
real HTTP; the code runs in real worker processes (and containers, and the E2B stand-in, where the
`run_env` fixture says so). What the model was shown after a step is read from the next request the
stand-in received.
"""

from __future__ import annotations

import datetime
import importlib.util
import os
import subprocess
from typing import Any

import pytest
from support.llm_standin import StandinLLM, register_standin_models
from support.needs import in_ci, require

if importlib.util.find_spec("smolagents") is None:  # CI installs the extra: there this is a failure
    reason = "the smolagents adapter needs its extra: pip install 'kodeagent[smolagents]'"
    if in_ci():
        raise RuntimeError(reason)
    pytest.skip(reason, allow_module_level=True)

from smolagents import CodeAgent, FinalAnswerTool, LiteLLMModel, Tool, tool  # noqa: E402
from smolagents.local_python_executor import (  # noqa: E402
    ExecutionTimeoutError,
    InterpreterError,
    LocalPythonExecutor,
)

from sandboxes.adapters.smolagents import CodeExecutionError, KodeagentExecutor  # noqa: E402

CALLS: list[tuple[str, int]] = []


@tool
def get_price(symbol: str) -> float:
    """The latest price of a stock.

    Args:
        symbol: its ticker, e.g. AAPL.
    """
    CALLS.append((symbol, os.getpid()))
    return {"AAPL": 200.0, "MSFT": 410.5}[symbol]


class SecretLength(Tool):
    name = "secret_length"
    description = "How long the API key is (the tool holds the key; the code never sees it)."
    inputs: dict[str, Any] = {}
    output_type = "integer"

    def forward(self) -> int:
        return len(os.environ["KODEAGENT_TEST_SECRET"])


class LabelledAnswer(FinalAnswerTool):
    """A final answer tool of the user's own: it must run here, on the value the code gave."""

    def forward(self, answer: Any) -> Any:
        CALLS.append(("final", os.getpid()))
        return f"ANSWER: {answer}"


def step(code: str, thought: str = "I will run some code.") -> str:
    """A model reply in CodeAgent's format."""
    return f"Thought: {thought}\n<code>\n{code}\n</code>"


def shown_after(llm: StandinLLM, request: int) -> str:
    """The text of the last message of request `request` (what the model read about the step before)."""
    content = llm.requests[request]["messages"][-1]["content"]
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content)


@pytest.fixture
def llm() -> Any:
    register_standin_models()
    with StandinLLM() as server:
        yield server


@pytest.fixture(autouse=True)
def _clear_calls() -> None:
    CALLS.clear()


def model(llm: StandinLLM) -> LiteLLMModel:
    return LiteLLMModel(model_id=llm.model("plain"), api_base=llm.api_base, api_key="sk-standin")


def agent(
    llm: StandinLLM, executor: KodeagentExecutor, tools: list[Any] | None = None, **kwargs: Any
) -> CodeAgent:
    return CodeAgent(
        tools=tools if tools is not None else [get_price],
        model=model(llm),
        executor=executor,
        additional_authorized_imports=kwargs.pop("imports", []),
        verbosity_level=0,
        **kwargs,
    )


def _backend_options(run_env: str) -> dict[str, Any]:
    if run_env == "docker":
        from support import backend_docker

        require(backend_docker.unavailable(), "smolagents on docker")
        return {"image": backend_docker.IMAGE}
    if run_env == "e2b":
        from support import backend_e2b

        require(backend_e2b.unavailable(), "smolagents on e2b")
        return backend_e2b.connection()
    return {}


@pytest.mark.parametrize("run_env", ["host", pytest.param("docker", marks=pytest.mark.docker), "e2b"])
def test_tool_calls_state_values_and_the_final_answer_on_every_backend(llm, run_env):
    ex = KodeagentExecutor(backend=run_env, timeout=30, **_backend_options(run_env))
    llm.add(
        step("p = get_price('AAPL')\nprint('price', p)"),
        step("total = p + get_price(symbol='MSFT')\ntotal"),
        step("final_answer(total)"),
    )
    with agent(llm, ex) as a:
        answer = a.run("What do one AAPL and one MSFT cost together?")
    assert answer == 610.5
    assert CALLS == [("AAPL", os.getpid()), ("MSFT", os.getpid())]  # the tool ran here, in the parent
    assert "Execution logs:\nprice 200.0\n" in shown_after(llm, 1)
    assert "Last output from code snippet:\n610.5" in shown_after(llm, 2)  # `p` survived step 1
    assert llm.remaining == 0


def test_last_expression_values_as_code_output():
    with KodeagentExecutor() as ex:
        number = ex("x = 3\nprint('six')\nx * 2")
        data = ex("{'a': (1, 2), 'b': None}")
        not_json = ex("{'b', 'a'} - {'b'}")
        statement = ex("y = x")
    assert (number.output, number.logs, number.is_final_answer) == (6, "six\n", False)
    assert data.output == {"a": (1, 2), "b": None}  # of their own types (docs/values.md)
    assert type(data.output["a"]) is tuple and not_json.output == {"a"}
    assert statement.output is None and statement.logs == ""


def test_values_keep_their_types_as_code_output():
    with KodeagentExecutor() as ex:
        assert ex("{'a': (1, 2), 1: 'one'}").output == {"a": (1, 2), 1: "one"}
        assert ex("{'b', 'a'} - {'b'}").output == {"a"}
        assert ex("final_answer((1, {2: b'x'}))").output == (1, {2: b"x"})  # no FinalAnswerTool sent


def test_a_refused_import_is_shown_to_the_model_and_the_announced_ones_work(llm):
    ex = KodeagentExecutor(["json"])
    llm.add(
        step("import json\nprint(json.dumps({'ok': True}))"),
        step("import os\nprint(os.getcwd())"),
        step("final_answer('gave up on os')"),
    )
    with agent(llm, ex, imports=["json"]) as a:
        answer = a.run("Use json, then os.")
        assert a.authorized_imports == ex.authorized_imports
    assert answer == "gave up on os"
    system = shown_after_first_system(llm)
    assert str(ex.authorized_imports) in system  # the model is told exactly what the sandbox allows
    assert 'Execution logs:\n{"ok": true}' in shown_after(llm, 1)
    refused = shown_after(llm, 2)
    assert "Import of os is not allowed" in refused and "json" in refused
    assert "/" not in refused.split("Executing code yielded an error")[0]  # os.getcwd() never ran


def shown_after_first_system(llm: StandinLLM) -> str:
    content = llm.requests[0]["messages"][0]["content"]
    return content if isinstance(content, str) else "".join(p.get("text", "") for p in content)


def test_a_step_that_times_out_loses_its_state_but_not_the_agents_inputs(llm):
    ex = KodeagentExecutor(timeout=2)
    llm.add(
        step("x = 1"),
        step("while True:\n    pass"),
        step("print(n)\ntry:\n    x\nexcept NameError:\n    print('x is gone')"),
        step("final_answer(n)"),
    )
    with agent(llm, ex) as a:
        answer = a.run("Loop, then look.", additional_args={"n": 5})
    assert answer == 5
    timed_out = shown_after(llm, 2)
    assert (
        "ExecutionTimeoutError: Code execution exceeded the maximum execution time of 2 seconds" in timed_out
    )
    assert "Execution logs:\n5\nx is gone\n" in shown_after(llm, 3)


def test_a_final_answer_tool_of_ones_own_runs_in_the_parent(llm):
    ex = KodeagentExecutor()
    llm.add(step("print('almost')\nfinal_answer(answer=6 * 7)"))
    with agent(llm, ex, tools=[LabelledAnswer()]) as a:
        answer = a.run("What is six times seven?")
        logs = a.memory.steps[-1].observations
    assert answer == "ANSWER: 42"
    assert CALLS == [("final", os.getpid())]
    assert "almost" in logs


def test_a_managed_agent_runs_in_its_own_sandbox_through_the_tool_bridge(llm):
    helper = agent(
        llm, KodeagentExecutor(), tools=[get_price], name="pricer", description="Looks up stock prices."
    )
    manager = agent(llm, KodeagentExecutor(), tools=[], managed_agents=[helper])
    llm.add(
        step("report = pricer(task='the price of AAPL')\nprint(report)"),  # the manager
        step("final_answer(get_price('AAPL'))"),  # the helper, inside the manager's step
        step("final_answer('AAPL is at 200.0')"),  # the manager again
    )
    with manager, helper:
        answer = manager.run("What does AAPL cost? Ask the pricer.")
    assert answer == "AAPL is at 200.0"
    assert CALLS == [("AAPL", os.getpid())]
    assert "200.0" in shown_after(llm, 2)  # the helper's report, printed by the manager's code
    assert "pricer" in shown_after_first_system(llm)


def test_one_executor_shared_by_two_agents_is_refused_clearly():
    ex = KodeagentExecutor()
    with ex:
        ex.send_tools({"inner": lambda: ex("1")})
        with pytest.raises(CodeExecutionError, match="running a step. Give each agent"):
            ex("inner()")


def test_variables_keep_their_types_and_what_the_codec_cannot_carry_is_refused(llm):
    ex = KodeagentExecutor()
    llm.add(
        step(
            "print(sum(data), meta['k'], type(meta['k']).__name__, sorted(tags), raw, day.year, keys[1])\n"
            "final_answer(len(data))"
        )
    )
    inputs = {
        "data": [1, 2, 3],
        "meta": {"k": (1, 2)},
        "tags": {"b", "a"},
        "raw": b"\x00",
        "day": datetime.date(2024, 2, 29),
        "keys": {1: "one"},
    }
    with agent(llm, ex) as a:
        assert a.run("Sum the data.", additional_args=inputs) == 3
        assert (
            "Execution logs:\n6 (1, 2) tuple ['a', 'b'] b'\\x00' 2024 one\n"
            in a.memory.steps[-1].observations
        )
        asked = len(llm.requests)
        with pytest.raises(TypeError, match="handle: a object object cannot enter the sandbox"):
            a.run("Use the handle.", additional_args={"handle": object()})
    assert len(llm.requests) == asked  # refused before any step


def test_tools_run_in_the_parent_and_their_secrets_stay_out(llm, monkeypatch):
    monkeypatch.setenv("KODEAGENT_TEST_SECRET", "s3cr3t-value")
    ex = KodeagentExecutor(["os"])
    llm.add(
        step(
            "import os\nprint(os.environ.get('KODEAGENT_TEST_SECRET'), sorted(os.environ.keys() - {'TMPDIR'}),"
            " os.environ.get('TMPDIR', os.getcwd()) == os.getcwd(), secret_length())"
        ),
        step("final_answer('done')"),
    )
    with agent(llm, ex, tools=[SecretLength()], imports=["os"]) as a:
        a.run("How long is the key?")
    seen = shown_after(llm, 1)
    # The tool read the key here, in the parent; the sandbox has no environment but, where /tmp is
    # not its to write, a TMPDIR naming its own directory.
    assert "Execution logs:\nNone [] True 12\n" in seen
    assert "s3cr3t" not in seen


def test_send_tools_keeps_the_session_unless_the_names_change():
    with KodeagentExecutor() as ex:
        ex.send_variables({"a": 1})
        ex.send_tools({"f": lambda: "first"})
        ex("x = 5")
        ex.send_tools({"f": lambda: "second"})  # same names: same session, the new function
        assert ex("(x, f())").output == (5, "second")
        ex.send_tools({"f": lambda: "third", "g": lambda: "new"})  # a new stub: a new session
        assert ex("(a, f(), g())").output == (1, "third", "new")  # the agent's variables are back
        with pytest.raises(CodeExecutionError, match="NameError"):
            ex("x")
        with pytest.raises(ValueError, match="'g'"):  # a stub would shadow it in every run
            ex.send_variables({"g": 1})


def test_cleanup_closes_the_session_and_a_later_step_opens_another():
    ex = KodeagentExecutor(pool=False, isolation="process")
    ex("1")
    assert ex._session is not None
    pid = ex._session.executor.session.worker.pid
    ex.cleanup()
    assert subprocess.run(["kill", "-0", str(pid)], capture_output=True).returncode != 0
    assert ex.isolation == "not started"
    assert ex("2").output == 2
    ex.cleanup()
    ex.cleanup()  # twice is fine


def test_errors_raise_as_interpreter_errors_with_the_output_first():
    from smolagents.local_python_executor import InterpreterError

    with KodeagentExecutor() as ex:
        with pytest.raises(InterpreterError) as info:
            ex("print('before')\n1 / 0")
    error = info.value
    assert isinstance(error, CodeExecutionError)
    assert str(error).startswith("before\nExecuting code yielded an error:\nTraceback")
    assert "ZeroDivisionError: division by zero" in str(error)
    assert error.result.error is not None and error.result.error.line == 2


class TwoPartAnswer(FinalAnswerTool):
    """A final answer tool with several inputs (smolagents' own tests have one like it)."""

    inputs = {
        "answer1": {"type": "string", "description": "First part of the answer."},
        "answer2": {"type": "string", "description": "Second part of the answer."},
    }

    def forward(self, answer1: str, answer2: str) -> str:
        CALLS.append(("final", os.getpid()))
        return answer1 + "CUSTOM" + answer2


def test_a_final_answer_tool_with_several_inputs_works_as_smolagents_own(llm):
    llm.add(step("final_answer(answer1='1', answer2='2')"))
    with agent(llm, KodeagentExecutor(), tools=[TwoPartAnswer()]) as a:
        assert a.run("Answer in two parts.") == "1CUSTOM2"
    assert CALLS == [("final", os.getpid())]  # the agent's tool ran here, on the call's arguments


def test_final_answer_calls_give_what_smolagents_local_executor_gives():
    calls = [
        "final_answer(answer1='a', answer2='b')",
        "final_answer('a', 'b')",
        "final_answer('a', answer2='b')",
        "final_answer({'answer1': 'a', 'answer2': 'b'})",  # one dict of the inputs: smolagents' own rule
    ]
    local = LocalPythonExecutor([])
    local.send_tools({"final_answer": TwoPartAnswer()})
    with KodeagentExecutor() as ours:
        ours.send_tools({"final_answer": TwoPartAnswer()})
        for code in calls:
            theirs, mine = local(code), ours(code)
            assert (mine.output, mine.is_final_answer) == (theirs.output, True), code


class Report:
    """A value that exists only in this process (the codec could not carry it)."""

    def __init__(self, data: Any) -> None:
        self.data = data


class ReportAnswer(FinalAnswerTool):
    def forward(self, answer: Any) -> Any:
        return Report(answer)


def test_a_final_answer_tools_output_stays_here_whatever_its_type():
    with KodeagentExecutor() as ex:
        ex.send_tools({"final_answer": ReportAnswer()})
        out = ex("print('done')\nfinal_answer(answer=[1, 2])")
    assert isinstance(out.output, Report) and out.output.data == [1, 2]
    assert (out.is_final_answer, out.logs) == (True, "done\n")


class PositiveAnswer(FinalAnswerTool):
    def forward(self, answer: Any) -> Any:
        if answer < 0:
            raise ValueError("the answer must be positive")
        return answer


def test_a_final_answer_tools_error_reaches_the_code_as_its_own_exception():
    with KodeagentExecutor() as ex:
        ex.send_tools({"final_answer": PositiveAnswer()})
        out = ex(
            "try:\n    final_answer(-1)\nexcept ValueError as e:\n    print('refused:', e)\nfinal_answer(2)"
        )
        with pytest.raises(CodeExecutionError, match="the answer must be positive") as info:
            ex("final_answer(-5)")
    assert (out.output, out.is_final_answer) == (2, True)
    assert "refused:" in out.logs and "the answer must be positive" in out.logs
    assert not info.value.result.has_final_answer


def test_a_timeout_raises_smolagents_execution_timeout_error():
    with KodeagentExecutor(timeout=1) as ex:
        ex("x = 1")
        with pytest.raises(ExecutionTimeoutError) as info:
            ex("while True:\n    pass")
        after = ex("print('again')")
    error = info.value
    assert isinstance(error, CodeExecutionError) and isinstance(error, InterpreterError)
    assert error.result.timed_out
    assert str(error).startswith(
        "Executing code yielded an error:\nExecutionTimeoutError: Code execution exceeded the maximum "
        "execution time of 1 seconds"
    )
    assert "variables, functions and imports from earlier steps are lost" in str(error)
    assert after.logs == "again\n"  # the next step runs in a new session


@pytest.mark.parametrize(
    "imports, missing",
    [
        (["i_do_not_exist"], "i_do_not_exist"),
        (["math", "i_do_not_exist"], "i_do_not_exist"),
        (["i_do_not_exist.*", "json"], "i_do_not_exist"),
        (["a_missing.sub", "b_missing"], "a_missing, b_missing"),
    ],
)
def test_a_missing_authorized_module_is_refused_at_construction(imports, missing):
    with pytest.raises(InterpreterError) as info:
        KodeagentExecutor(imports)
    assert str(info.value) == (
        f"Non-installed authorized modules: {missing}. Please install these modules or remove them "
        "from the authorized imports list."
    )
    local = pytest.raises(InterpreterError, match="Non-installed authorized modules")
    with local:  # smolagents' own executor refuses the same list
        LocalPythonExecutor(imports)


@pytest.mark.parametrize("imports", [["math"], ["*"], ["os.*"], ["collections.abc"], []])
def test_installed_and_wildcard_imports_are_accepted_without_starting_a_sandbox(imports):
    ex = KodeagentExecutor(imports)
    assert ex._session is None and ex.isolation == "not started"


@pytest.mark.docker
def test_a_module_missing_in_the_docker_image_is_refused_when_the_session_opens():
    from support import backend_docker

    require(backend_docker.unavailable(), "smolagents on docker")
    ex = KodeagentExecutor(
        ["json", "numpy", "no_such_module.*"], backend="docker", image=backend_docker.IMAGE
    )
    with pytest.raises(InterpreterError) as info:  # the image has no numpy; the parent's Python has
        ex("1")
    assert str(info.value).startswith(
        "Non-installed authorized modules in the docker sandbox: no_such_module, numpy."
    )
    assert ex._session is None  # the probed session was closed
    ex.cleanup()


def test_a_syntax_error_shows_the_model_the_line_and_a_caret():
    with KodeagentExecutor() as ex:
        with pytest.raises(CodeExecutionError) as info:
            ex('print("Missing parenthesis')
    text = str(info.value)
    assert text.startswith("Executing code yielded an error:\n")
    assert '    print("Missing parenthesis\n          ^\nSyntaxError: unterminated string literal' in text


def test_network_rules_hold_and_the_model_reads_each_refusal(llm):
    from support.loopback_http import GATEWAY_GET, LoopbackHttp

    from sandboxes.backends.host.process import namespaces_available
    from sandboxes.egress.service import unavailable

    require(unavailable() or (None if namespaces_available() else "no namespaces here"), "the egress gateway")
    with LoopbackHttp() as service, LoopbackHttp() as other:
        ex = KodeagentExecutor(["socket"], network={"allow": [f"127.0.0.1:{service.port}"]})
        fetch = (
            GATEWAY_GET
            + f"for port in ({service.port}, {other.port}):\n    print(gateway_get('127.0.0.1', port)[0])"
        )
        llm.add(step(fetch), step("final_answer('fetched')"))
        with agent(llm, ex, imports=["socket"]) as a:
            assert a.run("Fetch both pages.") == "fetched"
        assert service.paths == ["/"] and other.paths == []  # the rule for one port opened only that one
    shown = shown_after(llm, 1)
    assert "HTTP/1.0 200 OK\nHTTP/1.1 403 Forbidden\n" in shown
    assert f"[network: 127.0.0.1:{other.port} refused by loopback (" in shown  # why, in the model's logs


def test_network_is_given_once():
    from sandboxes import NetworkPolicy, Policy

    with pytest.raises(ValueError, match="network once"):
        KodeagentExecutor(policy=Policy(network=True), network=NetworkPolicy(allow=["pypi.org"]))
    with pytest.raises(ValueError, match="not a rule"):
        KodeagentExecutor(network={"allow": ["no such host!"]})
    ex = KodeagentExecutor(network=True)
    assert ex.policy.network_policy == NetworkPolicy()  # the public internet only, as Policy(network=True)
