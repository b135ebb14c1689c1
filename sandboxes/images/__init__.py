"""Sandbox images for the Docker backend: build them (online or offline), list them, clean up after them.

    python -m sandboxes.images build                       # kodeagent-sandbox:py
    python -m sandboxes.images build --variant datascience # kodeagent-sandbox:datascience
    python -m sandboxes.images build --offline             # base made with debootstrap, no Docker Hub
    python -m sandboxes.images list
    python -m sandboxes.images cleanup                     # containers whose owner process is gone

Why it is built this way:
- Images are tagged with a hash of everything that went into them (Dockerfile, runner files, pinned
  requirements, wheels, the base image's id): `kodeagent-sandbox:py-<hash>`, plus the moving alias
  `kodeagent-sandbox:py`. An unchanged image is found by its tag and not rebuilt, so CI can call
  `build` every time.
- Python packages always come from a wheelhouse that pip fills *on the host* (containers here cannot
  verify PyPI's TLS), and the image build itself runs without network.
- Without Docker Hub, the base image is made from the Debian mirror apt already uses (debootstrap,
  then `docker import`).

The docker SDK is imported only inside functions, so `import sandboxes` never needs it.

One module a concern: `common` (names, labels, models, the daemon connection, content hashes),
`wheelhouse`, `base` (the offline Debian base), `build`, `cleanup`, `cli`.
"""

from __future__ import annotations

from .base import apt_mirror, debian_base
from .build import build_image, list_images
from .cleanup import cleanup, owner_alive, owner_label, remove_old_images
from .cli import main
from .common import (
    BASE_REPOSITORY,
    DEFAULT_IMAGE,
    DEFAULT_VARIANT,
    IMAGES_DIR,
    LABEL,
    LABEL_IMAGE,
    LABEL_INPUTS,
    LABEL_OWNER,
    LABEL_RUNTIME,
    LABEL_SANDBOX,
    LABEL_VARIANT,
    REPOSITORY,
    VARIANTS,
    WHEELHOUSE,
    ImageBuildError,
    ImageInfo,
    Variant,
    build_command,
    docker_client,
    image_missing_message,
    image_problem,
    inputs_hash,
    runtime_hash,
    stale_runner,
)
from .wheelhouse import fill_wheelhouse, pinned_requirements

__all__ = [
    "BASE_REPOSITORY",
    "DEFAULT_IMAGE",
    "DEFAULT_VARIANT",
    "IMAGES_DIR",
    "LABEL",
    "LABEL_IMAGE",
    "LABEL_INPUTS",
    "LABEL_OWNER",
    "LABEL_RUNTIME",
    "LABEL_SANDBOX",
    "LABEL_VARIANT",
    "REPOSITORY",
    "VARIANTS",
    "WHEELHOUSE",
    "ImageBuildError",
    "ImageInfo",
    "Variant",
    "apt_mirror",
    "build_command",
    "build_image",
    "cleanup",
    "debian_base",
    "docker_client",
    "fill_wheelhouse",
    "image_missing_message",
    "image_problem",
    "inputs_hash",
    "list_images",
    "main",
    "owner_alive",
    "owner_label",
    "pinned_requirements",
    "remove_old_images",
    "runtime_hash",
    "stale_runner",
]
