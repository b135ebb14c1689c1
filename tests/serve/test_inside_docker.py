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


def test_a_docker_home_outlives_a_lost_session_and_execute_still_answers(serve_with: Any) -> None:
    import os

    from e2b.exceptions import TimeoutException
    from support import backend_docker

    from sandboxes.backends.docker import client

    backend_docker.require()
    served = serve_with(backend="docker", backend_options={"image": backend_docker.IMAGE})
    sandbox = Sandbox.create(**served.sdk_options())
    held = served.app.registry.get("alice", sandbox.sandbox_id)
    assert held.home is not None and os.stat(held.home).st_uid == 1000  # the container's uid owns it
    try:
        sandbox.files.write("/home/user/from-client.txt", "sent")
        first = sandbox.run_code(
            "open('from-code.txt', 'w').write('made'); kept = 1; open('from-client.txt').read()"
        )
        assert first.error is None and first.text == "'sent'"
        before = held.sandbox.executor.container_id
        with pytest.raises(TimeoutException):  # the SDK drops the request: the session is replaced
            sandbox.run_code("import time\ntime.sleep(120)", timeout=2)
        after = sandbox.run_code("kept", timeout=60)
        assert after.error is not None and "state was lost" in after.error.value
        assert held.sandbox.executor.container_id != before  # a new container, the same home
        assert sandbox.files.read("/home/user/from-code.txt") == "made"
        again = sandbox.run_code("sorted(n for n in __import__('os').listdir('.') if not n.startswith('.'))")
        assert again.error is None and again.text == "['from-client.txt', 'from-code.txt']"

        # The container killed under the server: the next request gets a new one, files kept.
        client().api.kill(held.sandbox.executor.container_id)
        other = Sandbox.connect(sandbox.sandbox_id, **served.sdk_options())  # as a second client would
        for _ in range(3):  # the first request may find the session dead and be answered with its loss
            cell = other.run_code("open('from-code.txt').read()", timeout=60)
            if cell.error is None:
                break
        assert cell.text == "'made'"
        assert other.commands.run("cat from-client.txt").stdout == "sent"
    finally:
        sandbox.kill()
    assert not os.path.exists(held.home)
