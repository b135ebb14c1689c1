"""A server with `python_guards = true`, through the unmodified SDKs: cells run as the session's own
guarded code (kodeagent's language guards refuse dunder and introspection escapes), envd serves file
reads and writes only, and everything that needs the server's plain-Python helpers is refused with an
error that says so, before anything runs in the sandbox."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from support.served import Served

pytest.importorskip("e2b_code_interpreter")
from e2b.exceptions import SandboxException  # noqa: E402
from e2b_code_interpreter import Sandbox  # noqa: E402

pytestmark = pytest.mark.e2b


@pytest.fixture
def guarded(serve_with: Any) -> Iterator[tuple[Served, Sandbox]]:
    served = serve_with(python_guards=True)
    sandbox = Sandbox.create(**served.sdk_options())
    yield served, sandbox
    sandbox.kill()


def in_session(served: Served, sandbox: Sandbox, code: str) -> Any:
    executor = served.app.registry.get("alice", sandbox.sandbox_id).sandbox.executor
    return served.call(lambda: executor.run(code))


# ------------------------------------------------------------------ attacks


def test_introspection_escapes_are_refused_and_reach_nothing(guarded: tuple[Served, Sandbox]) -> None:
    served, sandbox = guarded
    for code in (
        "leak = ().__class__.__base__.__subclasses__()",
        "leak = __import__('os')",
        "leak = (lambda: 0).__globals__",
    ):
        execution = sandbox.run_code(code)
        assert execution.error is not None and execution.error.name == "PolicyViolation", code
    assert sandbox.run_code("'leak' in dir()").text == "False"  # none of them got as far as binding it


def test_what_needs_the_helpers_is_refused_before_it_runs(guarded: tuple[Served, Sandbox]) -> None:
    served, sandbox = guarded
    for attempt in (
        lambda: sandbox.commands.run("touch made-by-command"),
        lambda: sandbox.files.make_dir("made-by-mkdir"),
        lambda: sandbox.files.list("."),
        lambda: sandbox.files.rename("a", "b"),
    ):
        with pytest.raises(SandboxException, match="python_guards"):
            attempt()
    with pytest.raises(SandboxException, match="python_guards"):  # the SDK's word for a 400 here
        sandbox.create_code_context()
    with pytest.raises(SandboxException, match="python_guards"):
        sandbox.run_code("import os\nos.environ.get('SET_BY_CELL')", envs={"SET_BY_CELL": "1"})
    made = in_session(served, sandbox, "import os\nsorted(os.listdir('.'))").value
    assert made == []  # nothing above reached the session's home


def test_a_symlink_planted_by_a_cell_is_not_followed_by_a_read(guarded: tuple[Served, Sandbox]) -> None:
    served, sandbox = guarded
    assert (
        sandbox.run_code("import os\nos.symlink('/etc/passwd', 'link')\nos.path.islink('link')").text
        == "True"
    )
    with pytest.raises(SandboxException) as refused:
        sandbox.files.read("link")
    assert "root:" not in str(refused.value)


# ------------------------------------------------------------------ what works


def test_cells_keep_state_stream_output_and_give_values_and_errors(guarded: tuple[Served, Sandbox]) -> None:
    served, sandbox = guarded
    sandbox.run_code("x = 20")
    seen: list[str] = []
    execution = sandbox.run_code("print('half', x)\n{'x': x * 2}", on_stdout=lambda m: seen.append(m.line))
    assert execution.error is None
    assert execution.results[0].is_main_result and execution.results[0].json == {"x": 40}
    assert "half 20" in "".join(seen)
    failed = sandbox.run_code("1 / 0")
    assert failed.error is not None and failed.error.name == "ZeroDivisionError"
    # The policy a served sandbox has: every import, subprocesses, files anywhere the OS boundary allows.
    assert sandbox.run_code(
        "import subprocess\nsubprocess.run(['echo', 'hi'], capture_output=True).stdout"
    ).text == ("b'hi\\n'")


def test_file_reads_and_writes_work(guarded: tuple[Served, Sandbox]) -> None:
    served, sandbox = guarded
    sandbox.files.write("/home/user/data.txt", "from the client")
    assert sandbox.run_code("open('data.txt').read()").text == "'from the client'"
    sandbox.run_code("open('out.txt', 'w').write('from the cell')")
    assert sandbox.files.read("out.txt") == "from the cell"
