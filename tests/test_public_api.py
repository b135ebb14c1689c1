"""The public face of both packages as a type checker and a fresh interpreter see it: the real classes
behind the lazily loaded backends (not `object`), and no backend SDK loaded by `import sandboxes`.
(Every exported name exists and is documented: `tests/unit/test_exports.py`.)"""

from __future__ import annotations

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_public_classes_are_visible_to_type_checkers() -> None:
    """`sandboxes.HostExecutor` is loaded lazily at run time; mypy must still see the class."""
    probe = (
        "import sandboxes, kodeagent\n"
        "reveal_type(sandboxes.HostExecutor)\n"
        "reveal_type(sandboxes.DockerExecutor)\n"
        "reveal_type(sandboxes.E2BExecutor)\n"
        "reveal_type(kodeagent.CodeActAgent)\n"
    )
    found = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-error-summary", "--follow-imports=silent", "-c", probe],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    revealed = [line for line in found.stdout.splitlines() if "Revealed type" in line]
    assert len(revealed) == 4, found.stdout + found.stderr
    for line, name in zip(
        revealed, ["HostExecutor", "DockerExecutor", "E2BExecutor", "CodeActAgent"], strict=True
    ):
        assert "def (" in line or f"type[{name}]" in line or f".{name}" in line, line
        assert '"builtins.object"' not in line, line


def test_importing_sandboxes_loads_no_backend_sdk() -> None:
    code = (
        "import sys, sandboxes\n"
        "heavy = [m for m in ('docker', 'e2b', 'ray', 'litellm', 'kodeagent') if m in sys.modules]\n"
        "print(','.join(heavy))"
    )
    found = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert found.returncode == 0, found.stderr
    assert found.stdout.strip() == ""


def test_the_grading_api_is_exported() -> None:
    """The batch grading names (`sandboxes.grading`) are part of `sandboxes`' face."""
    import sandboxes
    from sandboxes import grading

    names = {"Graded", "Grading", "Program", "ProgramStatus", "SandboxFailure", "Verdict"}
    names |= {"grade", "grade_all", "grade_sync"}
    assert names <= set(sandboxes.__all__) and names == set(grading.__all__)
    assert all(getattr(sandboxes, name) is getattr(grading, name) for name in names)
