"""The in-sandbox API on the Docker backend, through the real SDK: the home is the container's
working directory, files, cells and commands run inside the container."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("e2b_code_interpreter")
from e2b_code_interpreter import Sandbox  # noqa: E402

pytestmark = [pytest.mark.docker, pytest.mark.e2b]


def test_files_cells_and_commands_in_a_container(serve_with: Any) -> None:
    from support import backend_docker

    backend_docker.require()
    served = serve_with(backend="docker", backend_options={"image": backend_docker.IMAGE})
    sandbox = Sandbox.create(**served.sdk_options())
    try:
        sandbox.files.write("/home/user/in.txt", "from the client")
        cell = sandbox.run_code("import os\nprint(os.getcwd())\nopen('in.txt').read()")
        assert cell.text == "'from the client'"
        workdir = cell.logs.stdout[0].strip()
        command = sandbox.commands.run("cat in.txt; pwd; echo made > out.txt")
        assert command.stdout == f"from the client{workdir}\n" and workdir == "/workspace"
        assert sandbox.files.read("/home/user/out.txt") == "made\n"
        assert [e.name for e in sandbox.files.list("/home/user") if not e.name.startswith(".")] == [
            "in.txt",
            "out.txt",
        ]
        container = sandbox.commands.run("cat /proc/1/cgroup; hostname").stdout
        assert container  # the container's own /proc, not refused: commands are the sandbox's own
    finally:
        sandbox.kill()
