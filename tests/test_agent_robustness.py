"""The loop against what real servers and callers do: refused response formats, bad credentials,
unusable replies (kept verbatim), streaming asked for, unknown prices, continuing conversations, plans.

All through litellm to the loopback stand-in (`tests/support/llm_standin.py`) over real HTTP.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from support.llm_standin import (
    StandinLLM,
    code_final,
    code_step,
    collect,
    error,
    react_finish,
    register_standin_models,
    reply,
)

from kodeagent import CodeActAgent, ConfigurationError, LLMError, ReActAgent, StepRecord

pytestmark = pytest.mark.anyio
UNKNOWN_MODEL = "openai/local-gguf"  # a name litellm has no facts about, as with a local server's model


# ---------------------------------------------------------------------- structured output


async def test_auto_probes_a_local_server_and_falls_back_like_llama_cpp() -> None:
    """llama.cpp's server refuses json_schema (422) and accepts json_object with a schema: use that."""
    with StandinLLM(response_formats={"text", "json_object"}) as server:
        server.add(code_step("print(6 * 7)"), code_final("42"))
        agent = CodeActAgent(UNKNOWN_MODEL, litellm_params=server.params())
        responses = await collect(agent.run("6 times 7?"))
        assert responses[-1].value == "42"
        assert server.rejected == ["response_format type 'json_schema'"]  # probed once, then remembered
        sent = [r.get("response_format") for r in server.requests]
        assert [f["type"] for f in sent] == ["json_object", "json_object"]
        assert sent[0]["schema"]["properties"]["code"] == {"type": "string"}
        step = next(r for r in responses if r.type == "step")
        assert step.metadata["response_format"] == "json_object_schema"


async def test_a_server_refusing_every_format_gets_free_text() -> None:
    with StandinLLM(response_formats={"text"}) as server:
        server.add("```python\nprint(1 + 1)\n```", "Final Answer: 2")
        agent = CodeActAgent(UNKNOWN_MODEL, litellm_params=server.params())
        responses = await collect(agent.run("1 + 1?"))
        assert responses[-1].value == "2"
        assert len(server.rejected) == 3  # json_schema, json_object with schema, json_object
        assert "response_format" not in server.requests[-1]


@pytest.mark.parametrize(
    ("choice", "expected"),
    [("json_schema", "json_schema"), ("json_object", "json_object"), ("off", None)],
)
async def test_structured_output_choice_is_what_is_sent(
    llm: StandinLLM, choice: str, expected: str | None
) -> None:
    llm.add(react_finish("ok"))
    agent = ReActAgent(llm.model("plain"), litellm_params=llm.params(), structured_output=choice)  # type: ignore[arg-type]
    await collect(agent.run("say ok"))
    sent = llm.requests[0].get("response_format")
    assert (sent or {}).get("type") == expected


# ---------------------------------------------------------------------- raw replies and refusals


async def test_unusable_reply_is_kept_verbatim_and_told_with_the_format(llm: StandinLLM) -> None:
    both = '{"thought": "t", "code": "print(1)", "final_answer": "1"}'
    llm.add(both, code_step("print(2)"), code_final("2"))
    seen: list[StepRecord] = []
    agent = CodeActAgent(llm.model("json"), litellm_params=llm.params(), on_step=seen.append)
    responses = await collect(agent.run("two?"))
    assert responses[-1].value == "2"
    assert seen[0].raw_reply == both and seen[0].code is None  # nothing of it ran
    told = llm.requests[1]["messages"][-1]["content"]
    assert "both runs code and gives a final answer" in told and '"code": "<Python source>"' in told
    assert [s.raw_reply for s in seen[1:]] == [code_step("print(2)"), code_final("2")]


async def test_native_tool_calls_are_kept_as_the_raw_reply(llm: StandinLLM) -> None:
    def add(a: int, b: int) -> int:
        """Adds. Args: a: first. b: second."""
        return a + b

    llm.add(reply(tool_calls=[("add", {"a": 1, "b": 2})]), reply("3"))
    seen: list[StepRecord] = []
    agent = ReActAgent(llm.model("native"), litellm_params=llm.params(), tools=[add], on_step=seen.append)
    await collect(agent.run("1+2"))
    raw = json.loads(seen[0].raw_reply or "")
    assert raw[0]["function"] == {"name": "add", "arguments": '{"a": 1, "b": 2}'}
    assert seen[1].raw_reply == "3"


# ---------------------------------------------------------------------- smaller defects


async def test_authentication_failures_are_not_retried(llm: StandinLLM) -> None:
    llm.add(error(401, "invalid api key"), react_finish("never"))
    agent = ReActAgent(llm.model("json"), litellm_params=llm.params(), max_retries=3)
    with pytest.raises(LLMError, match="authentication"):
        await collect(agent.run("x"))
    assert len(llm.requests) == 1


async def test_a_missing_key_is_not_retried(llm: StandinLLM, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    agent = ReActAgent("openai/gpt-4o-mini", litellm_params={"api_base": llm.api_base}, max_retries=3)
    agent.retry_base_delay = 0.01
    with pytest.raises(LLMError, match="authentication") as caught:
        await collect(agent.run("x"))
    assert "RetryError" not in type(caught.value).__name__


async def test_continuing_a_conversation_says_the_python_session_is_new(llm: StandinLLM) -> None:
    llm.add(code_final("done"))
    earlier = [{"role": "user", "content": "define x = 5"}, {"role": "assistant", "content": "x is defined"}]
    agent = CodeActAgent(llm.model("json"), litellm_params=llm.params())
    await collect(agent.run("print x", chat_history=earlier))
    task_message = llm.requests[0]["messages"][-1]["content"]
    assert "the Python session is new" in task_message
    llm.add(code_final("done"))
    await collect(agent.run("print x"))
    assert "the Python session is new" not in llm.requests[1]["messages"][-1]["content"]


async def test_unknown_model_price_is_reported_as_unknown() -> None:
    with StandinLLM() as server:
        server.add(react_finish("hi"))
        agent = ReActAgent(UNKNOWN_MODEL, litellm_params=server.params(), structured_output="off")
        await collect(agent.run("hi"))
    assert agent.get_usage_metrics()["total"]["cost"] is None
    assert "cost: unknown" in agent.get_usage_report() and "$0.000000" not in agent.get_usage_report()


async def test_arun_and_run_sync_return_the_final_response(llm: StandinLLM) -> None:
    llm.add(react_finish("forty-two"))
    agent = ReActAgent(llm.model("json"), litellm_params=llm.params())
    final = await agent.arun("answer")
    assert final.type == "final" and final.value == "forty-two" and final.metadata["task_successful"]
    with pytest.raises(ConfigurationError, match="arun"):
        agent.run_sync("answer")  # inside an event loop: told to await arun instead


def test_run_sync_outside_an_event_loop() -> None:
    register_standin_models()
    with StandinLLM() as server:
        server.add(react_finish("synced"))
        agent = ReActAgent("openai/standin-json", litellm_params=server.params())
        assert agent.run_sync("answer").value == "synced"


async def test_planning_interval_in_the_constructor_and_on_step_sees_plans(llm: StandinLLM) -> None:
    llm.add(
        "1. [ ] print twice",  # the plan
        code_step("print(1)"),
        code_step("print(2)"),
        "1. [x] print twice",  # revised after 2 steps, as the interval says
        code_final("done"),
    )
    seen: list[StepRecord] = []
    agent = CodeActAgent(
        llm.model("json"), litellm_params=llm.params(), planning_interval=2, on_step=seen.append
    )
    assert agent.planner is not None and agent.planner.update_every == 2
    responses = await collect(agent.run("print 1 then 2"))
    assert responses[-1].value == "done"
    assert [(s.kind, s.index) for s in seen] == [
        ("plan", 0),
        ("step", 1),
        ("step", 2),
        ("plan", 3),
        ("step", 3),
    ]
    assert seen[0].thought == "1. [ ] print twice" and seen[3].thought == "1. [x] print twice"
    assert all(s.kind == "step" for s in agent.steps)


def test_cli_run_json_keeps_raw_replies_and_takes_an_api_key() -> None:
    register_standin_models()
    with StandinLLM() as server:
        server.add(
            '{"thought": "t", "code": "print(1)", "final_answer": "1"}',
            code_step("print(7)"),
            code_final("7"),
        )
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "kodeagent_cli",
                "run",
                "seven?",
                "--model",
                "openai/standin-json",
                "--api-base",
                server.api_base,
                "--api-key",
                "sk-from-cli",
                "--json",
            ],
            capture_output=True,
            text=True,
            timeout=180,
            env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"},
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        out = json.loads(proc.stdout)
        steps = [r["value"] for r in out["responses"] if r["type"] == "step"]
        assert steps[0]["raw_reply"] == '{"thought": "t", "code": "print(1)", "final_answer": "1"}'
        assert steps[0]["error"].startswith("unusable reply")
        assert out["final"]["value"] == "7"


def test_cli_hints_at_openai_prefix_when_api_base_has_no_provider() -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "kodeagent_cli",
            "run",
            "x",
            "--model",
            "smollm",
            "--api-base",
            "http://127.0.0.1:9/v1",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "openai/smollm" in proc.stderr


# ---------------------------------------------------------------------- the truth about cut output


def _kept_and_omitted(observation: str) -> tuple[str, int]:
    import re

    body = observation.split("Output:\n", 1)[1].split("\nStandard error:", 1)[0]
    markers = re.findall(r"\n\.\.\. \[([\d,]+) characters omitted\] \.\.\.\n", body)
    assert len(markers) == 1, body[:300]
    kept = re.sub(r"\n\.\.\. \[[\d,]+ characters omitted\] \.\.\.\n", "", body)
    return kept, int(markers[0].replace(",", ""))


@pytest.mark.parametrize("output_limit", [None, 1000])
async def test_observation_states_the_real_number_of_characters_omitted(
    llm: StandinLLM, output_limit: int | None
) -> None:
    """The sandbox cuts at its output_limit, the agent at its observation budget: one count, both added."""
    llm.add(code_step("print('A' * 60000 + 'B' * 60000)"), code_final("done"))
    options = {"output_limit": output_limit} if output_limit else {}
    agent = CodeActAgent(llm.model("json"), litellm_params=llm.params(), executor_options=options)
    responses = await collect(agent.run("print a lot"))
    step = next(r.value for r in responses if r.type == "step")
    kept, omitted = _kept_and_omitted(step.observation)
    assert kept.startswith("A") and kept.endswith("B") and set(kept) == {"A", "B"}
    assert len(kept) + omitted == 120000  # every printed character is either shown or counted
    assert len(kept) <= (output_limit or CodeActAgent.OUTPUT_LIMIT)
