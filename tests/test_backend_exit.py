"""The backends' one exit hook closes every backend's resources in a real interpreter's exit."""

from __future__ import annotations

import pathlib
import subprocess
import sys
import textwrap


def test_the_exit_hook_closes_every_backends_resources(tmp_path: pathlib.Path) -> None:
    marker = tmp_path / "closed"
    child = textwrap.dedent(
        f"""
        from sandboxes.backends.resources import resources
        owned = resources("unit-exit")
        owned.submit("role", lambda: None).result()
        owned.on_close(lambda: open({str(marker)!r}, "a").write("closed\\n"))
        """
    )
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert marker.read_text() == "closed\n"
