"""A wheel installed outside the checkout carries what it needs: the runner, the Dockerfiles (as
package data of `sandboxes`), and the `py.typed` markers; `kodeagent images build` works from it.

Builds the wheel with pip (build isolation fetches setuptools from the package index), installs it
into a fresh virtual environment (with this interpreter's packages visible for the dependencies),
and runs everything from a directory outside the checkout.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
from typing import Any

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PROBE = """
import json, pathlib, sandboxes, kodeagent
from sandboxes import images
from sandboxes.runtime import RUNTIME_DIR
print(json.dumps({
    "sandboxes": sandboxes.__file__,
    "images_dir": str(images.IMAGES_DIR),
    "files": sorted(p.relative_to(images.IMAGES_DIR).as_posix() for p in images.IMAGES_DIR.rglob("*") if p.is_file()),
    "runner": (RUNTIME_DIR / "runner.py").is_file(),
    "typed": [(pathlib.Path(m.__file__).parent / "py.typed").is_file() for m in (sandboxes, kodeagent)],
}))
"""


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A venv outside the checkout with the wheel of this checkout installed in it."""
    base = tmp_path_factory.mktemp("wheel")
    wheels = base / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels), str(ROOT)],
                   check=True, timeout=600)  # fmt: skip
    (wheel,) = wheels.glob("kodeagent-*.whl")
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", str(wheel)], check=True, timeout=300)
    outside = base / "elsewhere"
    outside.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return {"venv": venv, "python": python, "cwd": outside, "env": env}


def test_the_installed_wheel_finds_its_dockerfiles_and_runner(installed: dict[str, Any]) -> None:
    found = subprocess.run([str(installed["python"]), "-c", PROBE], cwd=installed["cwd"], env=installed["env"],
                           capture_output=True, text=True, timeout=120)  # fmt: skip
    assert found.returncode == 0, found.stderr
    probe = json.loads(found.stdout)
    site = str(installed["venv"])
    assert probe["sandboxes"].startswith(site), f"the checkout's copy was imported: {probe['sandboxes']}"
    assert probe["images_dir"].startswith(site) and probe["images_dir"].endswith("sandboxes/_images")
    for name in ("Dockerfile", "Dockerfile.datascience", "requirements.txt", "datascience/kodeagent_mpl_backend.py"):
        assert name in probe["files"], probe["files"]
        assert (ROOT / "images" / name).read_bytes() == (pathlib.Path(probe["images_dir"]) / name).read_bytes()
    assert probe["runner"] and probe["typed"] == [True, True]


@pytest.mark.docker
def test_images_build_works_from_the_installed_wheel(installed: dict[str, Any]) -> None:
    import backend_docker

    backend_docker.require()
    kodeagent = installed["venv"] / "bin" / "kodeagent"
    built = subprocess.run([str(kodeagent), "images", "build"], cwd=installed["cwd"], env=installed["env"],
                           capture_output=True, text=True, timeout=900)  # fmt: skip
    assert built.returncode == 0, built.stdout + built.stderr
    assert "kodeagent-sandbox:py" in built.stdout + built.stderr
