"""A wheel installed outside the checkout carries what it needs: the runner, the Dockerfiles (as
package data of `sandboxes`), and the `py.typed` markers; `kodeagent images build` works from it.

Builds the wheel with pip (build isolation fetches setuptools from the package index), installs it
into a fresh virtual environment (with this interpreter's packages visible for the dependencies),
and runs everything from a directory outside the checkout.

"This interpreter's packages" are those of the environment running the tests, which may itself be a
virtual environment: `venv --system-site-packages` shows only the *base* interpreter's, so a path
file adds the running environment's site directories too (after the new environment's own, so the
installed wheel, not the checkout, is what imports).
"""

from __future__ import annotations

import json
import os
import pathlib
import site
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


def see_running_environment(python: pathlib.Path) -> None:
    """Make the site directories of the environment running the tests importable in `python`'s venv.

    Plain directory lines, so that the path files in them (the checkout's editable install among them)
    are not run: the dependencies become importable, the checkout does not."""
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.strip()
    running = [*site.getsitepackages(), site.getusersitepackages()]
    lines = [d for d in dict.fromkeys(os.path.realpath(d) for d in running) if os.path.isdir(d)]
    (pathlib.Path(purelib) / "_kodeagent_test_deps.pth").write_text("".join(f"{d}\n" for d in lines))


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A venv outside the checkout with the wheel of this checkout installed in it."""
    base = tmp_path_factory.mktemp("wheel")
    wheels = base / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels), str(ROOT)],
        check=True,
        timeout=600,
    )
    (wheel,) = wheels.glob("kodeagent-*.whl")
    venv = base / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True, timeout=120
    )
    python = venv / "bin" / "python"
    see_running_environment(python)
    # --ignore-installed: the environment running the tests may have this very version (an editable
    # install of the checkout), which pip would otherwise take as already satisfied.
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--no-deps", "--ignore-installed", str(wheel)],
        check=True,
        timeout=300,
    )
    outside = base / "elsewhere"
    outside.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return {"venv": venv, "python": python, "cwd": outside, "env": env}


def test_the_installed_wheel_finds_its_dockerfiles_and_runner(installed: dict[str, Any]) -> None:
    found = subprocess.run(
        [str(installed["python"]), "-c", PROBE],
        cwd=installed["cwd"],
        env=installed["env"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert found.returncode == 0, found.stderr
    probe = json.loads(found.stdout)
    site = str(installed["venv"])
    assert probe["sandboxes"].startswith(site), f"the checkout's copy was imported: {probe['sandboxes']}"
    assert probe["images_dir"].startswith(site) and probe["images_dir"].endswith("sandboxes/_images")
    for name in (
        "Dockerfile",
        "Dockerfile.datascience",
        "requirements.txt",
        "datascience/kodeagent_mpl_backend.py",
    ):
        assert name in probe["files"], probe["files"]
        assert (ROOT / "images" / name).read_bytes() == (
            pathlib.Path(probe["images_dir"]) / name
        ).read_bytes()
    assert probe["runner"] and probe["typed"] == [True, True]


@pytest.mark.docker
def test_images_build_works_from_the_installed_wheel(installed: dict[str, Any]) -> None:
    from support import backend_docker

    backend_docker.require()
    kodeagent = installed["venv"] / "bin" / "kodeagent"
    built = subprocess.run(
        [str(kodeagent), "images", "build"],
        cwd=installed["cwd"],
        env=installed["env"],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    assert "kodeagent-sandbox:py" in built.stdout + built.stderr
