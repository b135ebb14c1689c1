"""The API reference's history methods, used as it describes them, judged by what the model is sent
and what the agent reports: `add_to_history`, `init_history`, `clear_history` and `add_output_file`
work on the run in progress, and after it on its record, never on a later run.

The model is the LLM stand-in over real HTTP; CodeAct's code runs on the host backend.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from support.llm_standin import StandinLLM, code_final, code_step, collect, react_call, react_finish

from kodeagent import AgentBusyError, ChatMessage, CodeActAgent, ReActAgent, StepRecord

pytestmark = pytest.mark.anyio


def contents(request: dict[str, Any]) -> list[str]:
    return [str(m.get("content")) for m in request["messages"]]


async def test_a_message_added_during_a_run_is_sent_with_the_next_step(llm: StandinLLM) -> None:
    llm.add(code_step("print(1)"), code_step("print(2)"), code_final("done"))
    added: list[int] = []

    def on_step(record: StepRecord) -> None:
        if record.index == 1:
            agent.add_to_history({"role": "user", "content": "Note: answer in French."})
            agent.add_to_history(ChatMessage(role="user", content="Note: be brief."))
            added.append(len(agent.chat_history))

    agent = CodeActAgent(llm.model("json"), litellm_params=llm.params(), on_step=on_step)
    final = (await collect(agent.run("Count")))[-1]
    assert final.value == "done"
    first, second, third = (contents(r) for r in llm.requests)
    assert "Note: answer in French." not in " ".join(first)
    assert second[-2:] == ["Note: answer in French.", "Note: be brief."]  # after step 1's observation
    assert "Note: be brief." in third  # and kept for the rest of the run
    assert agent.chat_history[added[0] - 2]["content"] == "Note: answer in French."


async def test_init_history_during_a_run_starts_its_conversation_over(llm: StandinLLM) -> None:
    llm.add(react_call("lookup", {"key": "a"}), react_finish("fresh start"))

    def lookup(key: str) -> str:
        """Look a key up. Args: key: the key."""
        return "value-of-" + key

    def on_step(record: StepRecord) -> None:
        agent.init_history()
        agent.add_to_history({"role": "user", "content": "Task: say 'fresh start'."})

    agent = ReActAgent(llm.model("json"), litellm_params=llm.params(), tools=[lookup], on_step=on_step)
    await collect(agent.run("Look up a"))
    first, second = llm.requests
    assert len(first["messages"]) == 2  # system prompt and task
    assert second["messages"][0] == first["messages"][0]  # the same system prompt
    assert contents(second)[1:] == ["Task: say 'fresh start'."]  # the task and step 1 are gone
    assert agent.msg_idx_of_new_task == 1


async def test_clear_history_is_refused_during_a_run(llm: StandinLLM) -> None:
    llm.add(code_step("print(1)"), code_final("done"))
    refused: list[Exception] = []

    def on_step(record: StepRecord) -> None:
        try:
            agent.clear_history()
        except AgentBusyError as exc:
            refused.append(exc)

    agent = CodeActAgent(llm.model("json"), litellm_params=llm.params(), on_step=on_step)
    assert (await collect(agent.run("Count")))[-1].value == "done"
    assert len(refused) == 2 and "init_history()" in str(refused[0])
    assert len(llm.requests[1]["messages"]) == 4  # system, task, reply, observation: nothing cleared


async def test_after_a_run_the_methods_change_its_record_not_the_next_run(llm: StandinLLM) -> None:
    llm.add(code_final("first"), code_final("second"), code_final("third"))
    agent = CodeActAgent(llm.model("json"), litellm_params=llm.params())
    await collect(agent.run("One"))
    system = agent.chat_history[0]
    agent.add_to_history({"role": "user", "content": "remember: 42"})
    assert agent.chat_history[-1]["content"] == "remember: 42" and "remember: 42" in agent.get_history()

    await collect(agent.run("Two"))  # a run builds its own conversation
    assert "remember: 42" not in " ".join(contents(llm.requests[1]))
    agent.add_to_history({"role": "user", "content": "remember: 43"})
    await collect(agent.run("Three", chat_history=agent.chat_history))  # carried on as told
    assert "remember: 43" in contents(llm.requests[2])

    agent.init_history()
    assert agent.chat_history == [system] and agent.msg_idx_of_new_task == 1
    agent.clear_history()
    assert agent.chat_history == [] and agent.get_history() == "" and agent.msg_idx_of_new_task == 0
    assert agent.task is not None and agent.task.result == "third"  # the rest of the record stays


async def test_a_file_recorded_by_a_tool_is_an_artifact_of_the_run(llm: StandinLLM, tmp_path: Path) -> None:
    llm.add(react_call("write_report", {"text": "all good"}), react_finish("written"))

    def write_report(text: str) -> str:
        """Write the report. Args: text: what it says."""
        path = tmp_path / "report.txt"
        path.write_text(text)
        agent.add_output_file(str(path))
        agent.add_output_file(str(path))  # recorded once
        return "saved"

    agent = ReActAgent(llm.model("json"), litellm_params=llm.params(), tools=[write_report])
    assert (await collect(agent.run("Report")))[-1].value == "written"
    expected = [os.path.abspath(tmp_path / "report.txt")]
    assert agent.artifacts == expected and agent.task_output_files == expected
    assert agent.task is not None and agent.task.output_files == expected

    llm.add(react_finish("nothing written"))
    await collect(agent.run("Again"))
    assert agent.artifacts == []  # the new run's own
