"""Only one thing pyproject.toml cannot say: the wheel carries `images/` (the Dockerfiles, their
requirements and extra files) as package data of `sandboxes`, at `sandboxes/_images/`, so that
`kodeagent images build` works from an installed wheel. The top-level `images/` stays the one copy
people read and edit; this copies it at build time."""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

IMAGES = Path(__file__).resolve().parent / "images"


class BuildWithImages(build_py):
    def run(self) -> None:
        super().run()
        target = Path(self.build_lib) / "sandboxes" / "_images"
        for source in sorted(IMAGES.rglob("*")):
            if source.is_file() and source.suffix != ".md" and "__pycache__" not in source.parts:
                destination = target / source.relative_to(IMAGES)
                destination.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(source, destination)


setup(cmdclass={"build_py": BuildWithImages})
