"""Inside a served sandbox through the unmodified SDKs (`e2b`, `e2b-code-interpreter`) against a real
`kodeagent serve` on loopback: files, run_code, contexts, commands, and the exceptions the SDK raises
for what the server refuses; each effect checked in the session itself."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from support.served import Served

pytest.importorskip("e2b_code_interpreter")
from e2b import CommandExitException  # noqa: E402
from e2b.exceptions import (  # noqa: E402
    FileNotFoundException,
    InvalidArgumentException,
    SandboxException,
    TimeoutException,
)
from e2b_code_interpreter import Sandbox  # noqa: E402

pytestmark = pytest.mark.e2b


@pytest.fixture
def sandbox(served: Served) -> Iterator[Sandbox]:
    made = Sandbox.create(timeout=300, **served.sdk_options())
    yield made
    made.kill()


# ------------------------------------------------------------------ files


def test_code_naming_home_user_literally_and_the_files_api_agree(sandbox: Sandbox) -> None:
    # The namespaces level binds the sandbox's home at /home/user and works there, as E2B does.
    cell = sandbox.run_code("import os\nopen('/home/user/data.csv', 'w').write('a,b\\n1,2\\n')\nos.getcwd()")
    assert cell.error is None and cell.text == "'/home/user'"
    assert sandbox.files.read("/home/user/data.csv") == "a,b\n1,2\n"
    sandbox.files.write("/home/user/in/sent.txt", "from the client")
    assert sandbox.run_code("open('/home/user/in/sent.txt').read()").text == "'from the client'"
    shell = sandbox.commands.run("cat /home/user/in/sent.txt; echo; pwd; echo x > /home/user/shell.txt")
    assert shell.stdout == "from the client\n/home/user\n"
    assert sandbox.files.read("shell.txt") == "x\n"


def test_files_round_trip(sandbox: Sandbox) -> None:
    info = sandbox.files.write("/home/user/docs/a.txt", "hello")
    assert info.path == "/home/user/docs/a.txt"
    assert sandbox.files.read("/home/user/docs/a.txt") == "hello"
    sandbox.files.write("docs/b.bin", b"\x00\xff" * 100)
    assert sandbox.files.read("/home/user/docs/b.bin", format="bytes") == b"\x00\xff" * 100
    assert sandbox.run_code("open('docs/a.txt').read()").results[0].text == "'hello'"
    names = sorted(e.name for e in sandbox.files.list("/home/user/docs"))
    assert names == ["a.txt", "b.bin"]
    assert sandbox.files.exists("/home/user/docs/a.txt") and not sandbox.files.exists("/home/user/nope")
    assert sandbox.files.make_dir("/home/user/docs/sub") is True
    assert sandbox.files.make_dir("/home/user/docs/sub") is False
    deep = {e.path for e in sandbox.files.list("/home/user", depth=3)}
    assert "/home/user/docs/sub" in deep and "/home/user/docs/a.txt" in deep
    moved = sandbox.files.rename("/home/user/docs/a.txt", "/home/user/docs/sub/c.txt")
    assert moved.path == "/home/user/docs/sub/c.txt"
    assert sandbox.files.get_info("/home/user/docs/sub/c.txt").size == 5
    sandbox.files.remove("/home/user/docs")
    assert not sandbox.files.exists("/home/user/docs")
    assert sandbox.run_code("import os; os.path.exists('docs')").results[0].text == "False"


def test_write_files_in_one_multipart_request(sandbox: Sandbox) -> None:
    written = sandbox.files.write_files(
        [{"path": "m/1.txt", "data": "one"}, {"path": "/home/user/m/2.txt", "data": "two"}]
    )
    assert [w.path for w in written] == ["/home/user/m/1.txt", "/home/user/m/2.txt"]
    assert sandbox.files.read("m/2.txt") == "two"


def test_file_errors_are_the_sdks_exceptions(sandbox: Sandbox) -> None:
    with pytest.raises(FileNotFoundException):
        sandbox.files.read("/home/user/missing.txt")
    with pytest.raises(FileNotFoundException):
        sandbox.files.get_info("/home/user/missing.txt")
    with pytest.raises(InvalidArgumentException, match="outside /home/user"):
        sandbox.files.read("/etc/passwd")
    with pytest.raises(InvalidArgumentException, match="outside /home/user"):
        sandbox.files.write("/home/user/../../tmp/planted", "x")
    with pytest.raises(InvalidArgumentException):
        sandbox.files.list("/proc")


def test_file_over_the_request_cap_is_refused(serve_with: Any) -> None:
    served = serve_with(max_request_bytes=1024)
    sandbox = Sandbox.create(**served.sdk_options())
    try:
        with pytest.raises(SandboxException, match="413"):
            sandbox.files.write("/home/user/big.bin", b"x" * 4096)
        assert not sandbox.files.exists("/home/user/big.bin")
    finally:
        sandbox.kill()


def test_another_sandboxs_token_cannot_reach_files(served: Served) -> None:
    mine, theirs = Sandbox.create(**served.sdk_options()), Sandbox.create(**served.sdk_options("bob"))
    try:
        theirs.files.write("/home/user/secret.txt", "bob's")
        headers = {
            "E2b-Sandbox-Id": theirs.sandbox_id,
            "E2b-Sandbox-Port": "49983",
            "X-Access-Token": mine._envd_access_token or "",
        }
        read = httpx.get(f"{served.url}/files", params={"path": "/home/user/secret.txt"}, headers=headers)
        assert read.status_code == 502 and b"bob's" not in read.content
        wrote = httpx.post(
            f"{served.url}/files",
            params={"path": "/home/user/planted"},
            content=b"x",
            headers={**headers, "content-type": "application/octet-stream"},
        )
        assert wrote.status_code == 502
        assert not theirs.files.exists("/home/user/planted")
    finally:
        mine.kill()
        theirs.kill()


# ------------------------------------------------------------------ the interpreter


def test_run_code_values_logs_and_state(sandbox: Sandbox) -> None:
    first = sandbox.run_code("x = 40\nprint('out')\nimport sys; print('err', file=sys.stderr)\nx + 2")
    assert first.text == "42" and first.error is None
    assert first.logs.stdout == ["out\n"] and first.logs.stderr == ["err\n"]
    assert sandbox.run_code("x * 2").text == "80"
    data = sandbox.run_code("{'a': [1, 2], 'b': None}").results[0]
    assert data.json == {"a": [1, 2], "b": None} and data.is_main_result
    assert sandbox.run_code("y = 1").results == []
    streamed: list[str] = []
    sandbox.run_code("for i in range(3): print(i)", on_stdout=lambda m: streamed.append(m.line))
    assert "".join(streamed) == "0\n1\n2\n"


def test_run_code_error_has_name_value_traceback(sandbox: Sandbox) -> None:
    error = sandbox.run_code("def f():\n    return 1 / 0\nf()").error
    assert error is not None
    assert error.name == "ZeroDivisionError" and error.value == "division by zero"
    assert "return 1 / 0" in error.traceback and "kodeagent" not in error.traceback


def test_shell_lines_run_as_jupyter_runs_them(sandbox: Sandbox) -> None:
    run = sandbox.run_code("!echo from-shell\nprint('python')\n!ls /no-such-dir")
    assert run.error is None
    assert "".join(run.logs.stdout) == "from-shell\npython\n"
    assert "no-such-dir" in "".join(run.logs.stderr)
    assert sandbox.run_code("a = '!not a shell line'\na").text == "'!not a shell line'"


def test_other_languages_are_refused(sandbox: Sandbox) -> None:
    with pytest.raises(SandboxException, match="Python only"):
        sandbox.run_code("console.log(1)", language="js")


def test_contexts_have_their_own_namespaces(sandbox: Sandbox) -> None:
    sandbox.run_code("shared = 'default'")
    context = sandbox.create_code_context()
    assert context.cwd == "/home/user" and context.language == "python"
    assert sandbox.run_code("shared", context=context).error.name == "NameError"
    sandbox.run_code("own = 7", context=context)
    assert sandbox.run_code("own", context=context).text == "7"
    assert sandbox.run_code("shared").text == "'default'"
    assert {c.id for c in sandbox.list_code_contexts()} == {"default", context.id}
    sandbox.restart_code_context(context)
    assert sandbox.run_code("own", context=context).error.name == "NameError"
    sandbox.remove_code_context(context)
    assert [c.id for c in sandbox.list_code_contexts()] == ["default"]
    assert sandbox.run_code("shared").text == "'default'"


def test_context_cwd_is_its_working_directory(sandbox: Sandbox) -> None:
    sandbox.files.write("/home/user/work/here.txt", "in work")
    context = sandbox.create_code_context(cwd="/home/user/work")
    assert sandbox.run_code("open('here.txt').read()", context=context).text == "'in work'"
    with pytest.raises(SandboxException):
        sandbox.create_code_context(cwd="/etc")


FIGURE = (
    "import matplotlib.pyplot as plt\nfig = plt.figure(figsize={size}, dpi={dpi})\nplt.plot([1, 3, 2])\nfig"
)


def _png(result: Any) -> Any:
    import base64
    import io

    from PIL import Image

    data = base64.b64decode(result.png)
    assert data.startswith(b"\x89PNG")
    return Image.open(io.BytesIO(data))


def test_matplotlib_figure_is_the_main_results_png(sandbox: Sandbox) -> None:
    pytest.importorskip("matplotlib")  # the dev extra has it; the host sandbox runs this Python
    # No `matplotlib.use(...)`: a sandbox has no display, so pyplot picks Agg as E2B's kernel does.
    execution = sandbox.run_code(FIGURE.format(size=(4, 3), dpi=50))
    assert execution.error is None, execution.error
    (result,) = execution.results
    assert result.is_main_result
    assert result.text == "<Figure size 200x150 with 1 Axes>"  # Jupyter's text/plain for it
    assert _png(result).size == (200, 150)
    assert "png" in result.formats() and result.json is None


def test_a_figure_bigger_than_the_runs_output_still_arrives_whole(sandbox: Sandbox) -> None:
    pytest.importorskip("matplotlib")
    # Noise does not compress: its PNG is far past what one run's value may carry (64,000 characters).
    code = (
        "import matplotlib.pyplot as plt, random\nrandom.seed(1)\nfig = plt.figure(figsize=(8, 8), dpi=100)\n"
        "plt.imshow([[random.random() for _ in range(400)] for _ in range(400)])\nfig"
    )
    (result,) = sandbox.run_code(code).results
    assert len(result.png) > 200_000
    assert _png(result).size == (800, 800)
    assert sandbox.commands.run("ls -A .kodeagent-display || true").stdout.strip() == ""  # spill removed


def test_a_dropped_execute_interrupts_the_run_and_the_next_says_state_lost(sandbox: Sandbox) -> None:
    sandbox.run_code("kept = 1")
    sandbox.files.write("/home/user/durable.txt", "stays")
    with pytest.raises(TimeoutException):
        sandbox.run_code("import time\ntime.sleep(120)", timeout=2)
    assert sandbox.files.read("/home/user/durable.txt") == "stays"  # the home outlives the session
    # Were the dropped run still going it would hold the session for two minutes: this cell's own
    # timeout (the SDK raises past it) shows it was stopped.
    after = sandbox.run_code("kept", timeout=30)
    assert after.error is not None and after.error.name == "NameError"
    assert "state was lost" in after.error.value
    again = sandbox.run_code("kept")
    assert again.error is not None and "state was lost" not in again.error.value  # told once
    assert sandbox.run_code("1 + 1").text == "2"


def test_a_context_without_state_is_not_told_of_a_loss(sandbox: Sandbox) -> None:
    with pytest.raises(TimeoutException):
        sandbox.run_code("import time\ntime.sleep(120)", timeout=2)
    fresh = sandbox.create_code_context()
    assert sandbox.run_code("1", context=fresh).error is None


# ------------------------------------------------------------------ commands


def test_command_output_and_exit_code(sandbox: Sandbox) -> None:
    result = sandbox.commands.run("echo out; echo err >&2")
    assert (result.stdout, result.stderr, result.exit_code) == ("out\n", "err\n", 0)
    with pytest.raises(CommandExitException) as failed:
        sandbox.commands.run("echo partial; exit 3")
    assert failed.value.exit_code == 3 and failed.value.stdout == "partial\n"
    lines: list[str] = []
    sandbox.commands.run("for i in 1 2 3; do echo $i; done", on_stdout=lines.append)
    assert "".join(lines) == "1\n2\n3\n"


def test_command_runs_in_home_with_envs_and_cwd(sandbox: Sandbox) -> None:
    sandbox.files.make_dir("/home/user/sub")
    assert sandbox.commands.run("echo $GREETING", envs={"GREETING": "hi"}).stdout == "hi\n"
    sandbox.commands.run("echo made > from-shell.txt", cwd="/home/user/sub")
    assert sandbox.files.read("/home/user/sub/from-shell.txt") == "made\n"
    with pytest.raises(SandboxException):
        sandbox.commands.run("true", cwd="/etc")


def test_command_timeout_kills_it_and_keeps_the_state(sandbox: Sandbox) -> None:
    sandbox.run_code("kept = 'yes'")
    with pytest.raises(TimeoutException):
        sandbox.commands.run("sleep 30; touch /home/user/late", timeout=1)
    assert sandbox.run_code("kept").text == "'yes'"  # the helper killed it: the session stayed
    time.sleep(0.3)
    assert not sandbox.files.exists("/home/user/late")


def test_background_command_can_be_listed_and_killed(sandbox: Sandbox) -> None:
    handle = sandbox.commands.run("sleep 30; touch /home/user/late", background=True)
    deadline = time.monotonic() + 10
    while not sandbox.commands.list() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [p.pid for p in sandbox.commands.list()] == [handle.pid]
    assert sandbox.commands.kill(handle.pid) is True
    deadline = time.monotonic() + 10
    while sandbox.commands.list() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sandbox.commands.list() == []
    assert not sandbox.files.exists("/home/user/late")


def test_command_and_cell_do_not_corrupt_each_other(sandbox: Sandbox) -> None:
    outputs: dict[str, Any] = {}

    def command() -> None:
        outputs["command"] = sandbox.commands.run("for i in $(seq 50); do echo c$i; done").stdout

    thread = threading.Thread(target=command)
    thread.start()
    outputs["cell"] = sandbox.run_code("for i in range(50): print(f'p{i}')").logs.stdout
    thread.join(30)
    assert outputs["command"] == "".join(f"c{i}\n" for i in range(1, 51))
    assert "".join(outputs["cell"]) == "".join(f"p{i}\n" for i in range(50))


def test_a_background_command_does_not_hold_the_session(sandbox: Sandbox) -> None:
    handle = sandbox.commands.run("sleep 30", background=True)
    # Were the command holding the session, this cell would wait 30 s and the SDK would time out.
    assert sandbox.run_code("'free'", timeout=10).text == "'free'"
    assert sandbox.files.write("/home/user/also.txt", "free").path == "/home/user/also.txt"
    handle.kill()


def test_stdin_reaches_the_command(sandbox: Sandbox) -> None:
    handle = sandbox.commands.run("cat; echo done", background=True, stdin=True)
    sandbox.commands.send_stdin(handle.pid, "hello\n")
    sandbox.commands.close_stdin(handle.pid)
    result = handle.wait()
    assert result.stdout == "hello\ndone\n" and result.exit_code == 0
    without = sandbox.commands.run("sleep 5", background=True)
    with pytest.raises(SandboxException):
        sandbox.commands.send_stdin(without.pid, "x")
    without.kill()


def test_connect_reattaches_to_a_running_command(sandbox: Sandbox) -> None:
    handle = sandbox.commands.run("sleep 0.5; echo late; exit 5", background=True)
    handle.disconnect()  # leaving the stream leaves the command running
    again = sandbox.commands.connect(handle.pid)
    with pytest.raises(CommandExitException) as ended:
        again.wait()
    assert ended.value.exit_code == 5 and "late" in ended.value.stdout
    with pytest.raises(SandboxException):
        sandbox.commands.connect(handle.pid)  # it ended: no such command any more


def test_a_helper_call_on_a_sandbox_ended_meanwhile_is_envds_error(served: Served) -> None:
    """A command's stream that outlives its sandbox (killed beside the client's own timeout) sends its
    deadline's kill, or its next poll, to a closed session: that is envd's `unavailable`, the end of
    the stream, not an exception out of the response (a traceback in the server's log)."""
    from sandboxes.adapters.serve.connect import RpcError
    from sandboxes.adapters.serve.envd import session

    sandbox = Sandbox.create(timeout=300, **served.sdk_options())
    try:
        held = served.app.registry.get("alice", sandbox.sandbox_id)
        served.call(held.sandbox.executor.close)

        async def signal() -> Any:
            return await session.call(held.sandbox, {"op": "signal", "pid": 1, "signal": 9})

        with pytest.raises(RpcError, match="killed or ended") as raised:
            served.call(signal)
        assert raised.value.code == "unavailable"
    finally:
        sandbox.kill()
