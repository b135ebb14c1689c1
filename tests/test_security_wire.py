"""The runner is hostile: code without the Python-level guards holds its runner and answers the parent
with anything it likes. Whatever it sends, `run()` returns a result (never raises), a malformed message
discards the session (the result says `state_lost`), and the next run starts clean; on every backend.

Each attack writes on the runner's own channel, with its token, so the parent gets past the token
check and must validate what it reads: a tool call whose name is a list, JSON nested past the
parser's limit, a reply whose fields have the wrong types, a tool call outside a run.

Not attack-corpus entries: the code runs without the Python-level guards and its effect is on
the parent's parsing of the wire, which only the result's fields and the next run show.
"""

from __future__ import annotations

from typing import Any

import pytest

from sandboxes import Policy

pytestmark = pytest.mark.anyio

FIND_RUNNER = (
    "import gc, json, os\n"
    "runner = next(o for o in gc.get_objects() if type(o).__name__ == 'Runner' and hasattr(o, 'channel'))\n"
    "def raw(text):\n"
    "    line = b'{\"token\": \"' + runner.channel.token.encode() + b'\", ' + text + b'\\n'\n"
    "    with runner.channel.lock:\n"
    "        os.write(runner.channel.write_fd, line)\n"
)

FULL_REPLY = (
    "{'op': 'reply', 'stdout': '', 'stderr': '', 'stdout_omitted': 0, 'stderr_omitted': 0, "
    "'truncated': False, 'error': None, 'oom': False, 'final_answer': None, 'has_final_answer': False, "
    "'value': None, 'artifacts': [], 'artifacts_omitted': 0}"
)

ATTACKS = {
    "a tool call whose name is a list": (
        "runner.channel.send({'op': 'tool_call', 'id': 1, 'name': ['lookup'], 'args': [], 'kwargs': {}})\n",
        "ToolCall.name",
    ),
    "a tool call whose arguments are an object": (
        "runner.channel.send({'op': 'tool_call', 'id': 1, 'name': 'lookup', 'args': {'a': 1}, 'kwargs': {}})\n",
        "ToolCall.args",
    ),
    "JSON nested past the parser's limit": (
        "raw(b'\"op\": \"reply\", \"value\": ' + b'[' * 200_000 + b']' * 200_000 + b'}')\n",
        "nested too deeply",
    ),
    "a reply whose counts are text": (
        f"reply = {FULL_REPLY}\nreply['stdout_omitted'] = 'many'\nrunner.channel.send(reply)\n",
        "RunReply.stdout_omitted",
    ),
    "a reply whose error is a number": (
        f"reply = {FULL_REPLY}\nreply['error'] = 7\nrunner.channel.send(reply)\n",
        "RunReply.error",
    ),
    "a reply that lacks its fields": (
        "runner.channel.send({'op': 'reply', 'stdout': 'forged'})\n",
        "is missing",
    ),
    "a message of no kind": ('raw(b\'"op": ["reply"]}\')\n', "not a message"),
    # A shared container's session host speaks on the same stream, its lines marked with "!".
    "a session host's line nested past the parser's limit": (
        "os.write(runner.channel.write_fd, b'!' + b'[' * 200_000 + b'\\n')\n",
        "did not come from the runner",
    ),
    "a line without the token": (
        'os.write(runner.channel.write_fd, b\'{"op": "reply", "token": "\' + '
        "runner.channel.token.encode() + b'\"}\\n')\n",
        "did not come from the runner",
    ),
}


@pytest.mark.parametrize("attack", sorted(ATTACKS))
async def test_a_forged_message_discards_the_session_and_run_returns(
    executor_factory: Any, backend: str, attack: str
) -> None:
    if backend == "hostprocess":
        pytest.skip("python_guards=False is refused at this level (tests/test_result_bounds.py)")
    forge, why = ATTACKS[attack]
    called: list[Any] = []
    async with executor_factory(
        policy=Policy(python_guards=False), timeout=30, tools={"lookup": lambda *a: called.append(a)}
    ) as ex:
        assert (await ex.run("x = 42")).ok
        # The forged message goes out while the code still runs: the runner's own reply follows it.
        result = await ex.run(FIND_RUNNER + forge + "import time\ntime.sleep(0.5)\n")
        after = await ex.run("print('x' in globals())")
    assert result.error is not None and result.error.type == "WorkerCrashed", result
    assert why in result.error.message, result.error.message
    assert result.state_lost
    assert called == []  # no tool ran for a malformed call
    assert after.ok and after.stdout == "False\n", after  # a fresh session: x is gone
