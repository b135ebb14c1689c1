"""What every part of the image tooling shares: names, labels, where the Dockerfiles are, the
image models, the daemon connection, and the content hashes that decide whether an image is current."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel

from ..errors import BackendUnavailable, SandboxError
from ..runtime import RUNTIME_DIR

if TYPE_CHECKING:
    import docker

REPOSITORY = "kodeagent-sandbox"
BASE_REPOSITORY = "kodeagent-base"
DEFAULT_VARIANT = "py"
DEFAULT_IMAGE = f"{REPOSITORY}:{DEFAULT_VARIANT}"
DEFAULT_HUB_BASE = "python:3.12-slim"
DEBIAN_SUITE = "bookworm"
DEBIAN_PACKAGES = ("python3",)
DEFAULT_MIRROR = "http://deb.debian.org/debian"
BASE_RECIPE_VERSION = "1"
"""Bump when `make_debian_base` changes in a way that changes the image."""

LABEL = "org.kodeagent"
LABEL_IMAGE = f"{LABEL}.image"
LABEL_INPUTS = f"{LABEL}.inputs"
LABEL_VARIANT = f"{LABEL}.variant"
LABEL_RUNTIME = f"{LABEL}.runtime"
"""Hash of the runner files baked into an image: `image_is_current` compares it with this checkout's."""
LABEL_SANDBOX = f"{LABEL}.sandbox"
"""Every sandbox container carries `org.kodeagent.sandbox=1`; cleanup finds them by it."""
LABEL_OWNER = f"{LABEL}.owner"
"""`<host>:<pid>:<process start ticks>` of the process that created the container."""

ROOT = Path(__file__).resolve().parent.parent.parent


def _images_dir() -> Path:
    """The Dockerfiles: a checkout's top-level `images/`, else the copy an installed wheel carries."""
    checkout = ROOT / "images"
    return (
        checkout
        if (checkout / "Dockerfile").is_file()
        else Path(__file__).resolve().parent.parent / "_images"
    )


IMAGES_DIR = _images_dir()
WHEELHOUSE = Path(os.environ.get("KODEAGENT_WHEELHOUSE", Path.home() / ".cache" / "kodeagent" / "wheelhouse"))

Progress = Callable[[str], None]


class ImageBuildError(SandboxError):
    """An image could not be built; the message says which step failed and what to try."""


class Variant(BaseModel):
    """One kind of sandbox image."""

    name: str
    dockerfile: str
    requirements: str
    parent: str | None = None
    extra_files: tuple[str, ...] = ()


VARIANTS: dict[str, Variant] = {
    "py": Variant(name="py", dockerfile="Dockerfile", requirements="requirements.txt"),
    "datascience": Variant(
        name="datascience",
        dockerfile="Dockerfile.datascience",
        requirements="requirements-datascience.txt",
        parent="py",
        extra_files=("datascience/kodeagent_mpl_backend.py",),
    ),
}


class ImageInfo(BaseModel):
    """A sandbox image on the daemon."""

    tag: str
    """The content-addressed tag, e.g. ``kodeagent-sandbox:py-1a2b3c4d5e6f``."""
    alias: str
    """The moving tag that points to the newest build, e.g. ``kodeagent-sandbox:py``."""
    id: str
    variant: str
    inputs: str
    reused: bool = False
    size_mb: float = 0.0


def docker_client() -> docker.DockerClient:
    """A client for the local daemon, or `BackendUnavailable` saying what is missing and what to do."""
    try:
        import docker
        import docker.errors
    except ImportError as exc:
        raise BackendUnavailable(
            "the docker backend needs the Docker SDK for Python: pip install 'kodeagent[docker]'"
        ) from exc
    try:
        client = docker.from_env(timeout=120)
        client.ping()
    except docker.errors.DockerException as exc:
        raise BackendUnavailable(
            f"cannot reach the Docker daemon ({exc}); install Docker and start it "
            "(e.g. `sudo dockerd &`, or `bash .ci/docker.sh` here), or set DOCKER_HOST"
        ) from exc
    return client


def build_command(image: str) -> str | None:
    """The command that builds `image`, if it is one of ours."""
    variant = image.split(":", 1)[1].split("-", 1)[0] if image.startswith(f"{REPOSITORY}:") else None
    if variant not in VARIANTS:
        return None
    flag = "" if variant == DEFAULT_VARIANT else f" --variant {variant}"
    return f"`python -m sandboxes.images build{flag}` (add --offline without Docker Hub)"


def image_missing_message(image: str) -> str:
    """The error text for an image that is not on the daemon, naming the command that builds it."""
    command = build_command(image)
    if command:
        return f"the sandbox image {image!r} is not on this Docker daemon; build it with {command}"
    return f"the image {image!r} is not on this Docker daemon; pull or build it first (`docker pull {image}`)"


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def inputs_hash(context: Path, base_id: str, variant: str) -> str:
    """A hash of everything that decides the image's content: the build context and the base's id."""
    digest = hashlib.sha256(f"variant={variant}\nbase={base_id}\n".encode())
    for path in sorted(p for p in context.rglob("*") if p.is_file()):
        digest.update(f"{path.relative_to(context).as_posix()}={_sha256_file(path)}\n".encode())
    return digest.hexdigest()


def runtime_hash() -> str:
    """A hash of this checkout's runner files (what `sandboxes/runtime/` would put into an image)."""
    digest = hashlib.sha256()
    for path in sorted(RUNTIME_DIR.rglob("*.py")):
        if "__pycache__" not in path.parts:
            digest.update(f"{path.relative_to(RUNTIME_DIR).as_posix()}={_sha256_file(path)}\n".encode())
    return digest.hexdigest()


def image_problem(image: str = DEFAULT_IMAGE) -> str | None:
    """None if `image` is on the daemon with this checkout's runner; else what is wrong and how to fix it.

    A sandbox image carries its runner's hash as a label; an image built before the runner changed
    would test (or run) old code, so it counts as stale.
    """
    import docker.errors

    try:
        found = docker_client().images.get(image)
    except docker.errors.ImageNotFound:
        return image_missing_message(image)
    return stale_runner(image, found.labels)


def stale_runner(image: str, labels: dict[str, str] | None) -> str | None:
    """What is wrong when an image of ours carries another runner than this version of sandboxes
    (its `LABEL_RUNTIME` hash differs), with the command that rebuilds it; None when it is current
    or not one of ours. A stale runner would fail the protocol, or test old code, in obscure ways."""
    baked = (labels or {}).get(LABEL_RUNTIME)
    if baked is None or baked == runtime_hash():
        return None
    command = build_command(image) or "the command that made it"
    return f"the image {image!r} holds another runner than sandboxes/runtime/ has; rebuild it with {command}"


def image_exists(client: docker.DockerClient, ref: str) -> bool:
    import docker.errors

    try:
        client.images.get(ref)
    except docker.errors.ImageNotFound:
        return False
    return True
