"""The in-sandbox API on the Docker backend, through the real SDK: the home is the container's
working directory, files, cells and commands run inside the container."""

from __future__ import annotations

import time
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


def test_metrics_and_a_figure_in_a_datascience_container(serve_with: Any) -> None:
    from support import backend_docker

    image = backend_docker.IMAGE.rsplit(":", 1)[0] + ":datascience"
    backend_docker.require(image, "datascience")
    served = serve_with(backend="docker", backend_options={"image": image})
    sandbox = Sandbox.create(**served.sdk_options())
    try:
        (figure,) = sandbox.run_code(
            "import matplotlib.pyplot as plt\nfig = plt.figure(figsize=(2, 1), dpi=50)\nplt.plot([1, 2])\nfig"
        ).results
        assert figure.is_main_result and figure.text == "<Figure size 100x50 with 1 Axes>"
        assert figure.png is not None and figure.png.startswith("iVBORw0KGgo")  # base64 of PNG's magic
        before = sandbox.get_metrics()[-1]
        sandbox.run_code(
            "held = bytearray(64 * 1024 * 1024)\nfor i in range(0, len(held), 4096): held[i] = 1"
        )
        sandbox.commands.run("head -c 3000000 /dev/urandom > blob.bin")
        after = sandbox.get_metrics()[-1]
        assert after.mem_used >= before.mem_used + 60 * 1024 * 1024
        assert after.mem_total > after.mem_used and after.cpu_count >= 1
        assert after.disk_used >= before.disk_used + 3_000_000  # the container's home volume

        watch = sandbox.files.watch_dir("/home/user")  # inotify on the home volume, outside the container
        sandbox.commands.run("echo hi > watched.txt")
        names: set[str] = set()
        for _ in range(100):
            names |= {e.name for e in watch.get_new_events()}
            if "watched.txt" in names:
                break
            time.sleep(0.05)
        assert "watched.txt" in names
        watch.stop()
    finally:
        sandbox.kill()
