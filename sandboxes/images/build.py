"""Building sandbox images from a minimal context, content-addressed so an unchanged image is reused."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..runtime import RUNTIME_DIR
from .base import debian_base
from .common import (
    DEFAULT_HUB_BASE,
    DEFAULT_VARIANT,
    IMAGES_DIR,
    LABEL_IMAGE,
    LABEL_INPUTS,
    LABEL_RUNTIME,
    LABEL_VARIANT,
    REPOSITORY,
    VARIANTS,
    ImageBuildError,
    ImageInfo,
    Progress,
    Variant,
    docker_client,
    image_exists,
    inputs_hash,
    runtime_hash,
)
from .wheelhouse import fill_wheelhouse

if TYPE_CHECKING:
    import docker


def _resolve_base(
    client: docker.DockerClient,
    base: str | None,
    offline: bool | None,
    mirror: str | None,
    progress: Progress,
) -> str:
    """The base image reference: given, pulled from Docker Hub, or made offline."""
    import docker.errors

    if offline:
        return debian_base(client, mirror, progress=progress)
    wanted = base or DEFAULT_HUB_BASE
    if image_exists(client, wanted):
        return wanted
    try:
        progress(f"pulling {wanted}")
        client.images.pull(wanted)
        return wanted
    except docker.errors.DockerException as exc:
        if base is not None or offline is False:
            raise ImageBuildError(f"cannot pull the base image {wanted!r}: {exc}") from exc
        progress(f"cannot pull {wanted} ({exc.__class__.__name__}); making the base offline instead")
        return debian_base(client, mirror, progress=progress)


def _python_version(client: docker.DockerClient, image: str) -> str:
    """The `X.Y` of `python3` in `image` (so that the wheelhouse matches it)."""
    code = "import sys; print('%d.%d' % sys.version_info[:2])"
    try:
        out = client.containers.run(image, ["python3", "-c", code], remove=True, network_disabled=True)
    except Exception as exc:
        raise ImageBuildError(f"the base image {image!r} has no working python3: {exc}") from exc
    return bytes(out).decode().strip()


def _assemble_context(variant: Variant, wheels: Iterable[Path], directory: Path) -> None:
    """Lay out the repository paths the Dockerfile copies, and nothing else."""
    images = directory / "images"
    (images / "wheels").mkdir(parents=True)
    for name in (variant.dockerfile, variant.requirements, *variant.extra_files):
        target = images / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(IMAGES_DIR / name, target)
    for wheel in wheels:
        shutil.copy2(wheel, images / "wheels" / wheel.name)
    runtime = directory / "sandboxes" / "runtime"
    runtime.mkdir(parents=True)
    if not (RUNTIME_DIR / "runner.py").is_file():
        raise ImageBuildError(f"{RUNTIME_DIR / 'runner.py'} is missing: the image needs the runner")
    for source in sorted(RUNTIME_DIR.rglob("*")):
        if source.is_file() and "__pycache__" not in source.parts and source.suffix != ".pyc":
            target = runtime / source.relative_to(RUNTIME_DIR)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target)


def build_image(
    variant: str = DEFAULT_VARIANT,
    *,
    base: str | None = None,
    offline: bool | None = None,
    mirror: str | None = None,
    force: bool = False,
    progress: Progress = print,
) -> ImageInfo:
    """Build (or find already built) the sandbox image `variant`; return its tags.

    Args:
        variant: "py" (the standard image) or "datascience" (numpy, pandas, matplotlib).
        base: the base image of "py" (default python:3.12-slim). Ignored for variants built on "py".
        offline: True: make the base from the Debian mirror; False: the base must be pullable;
            None: try Docker Hub, fall back to the offline base.
        mirror: Debian mirror for the offline base (default: the one apt uses).
        force: rebuild even if an image with the same inputs exists.
    """
    if variant not in VARIANTS:
        raise ImageBuildError(f"unknown image variant {variant!r}; choose one of: {', '.join(VARIANTS)}")
    spec = VARIANTS[variant]
    client = docker_client()
    import docker.errors

    if spec.parent is not None:
        parent = build_image(
            spec.parent, base=base, offline=offline, mirror=mirror, force=False, progress=progress
        )
        base_ref = parent.tag
    else:
        base_ref = _resolve_base(client, base, offline, mirror, progress)
    base_id = client.images.get(base_ref).id
    wheels = fill_wheelhouse(IMAGES_DIR / spec.requirements, _python_version(client, base_ref), progress)

    with tempfile.TemporaryDirectory(prefix="kodeagent-image-") as scratch:
        context = Path(scratch)
        _assemble_context(spec, wheels, context)
        inputs = inputs_hash(context, base_id, variant)
        tag = f"{REPOSITORY}:{variant}-{inputs[:12]}"
        alias = f"{REPOSITORY}:{variant}"
        if not force and image_exists(client, tag):
            image = client.images.get(tag)
            image.tag(REPOSITORY, variant)
            return _info(image, tag, alias, variant, inputs, reused=True)
        progress(f"building {tag} from {base_ref}")
        log: list[str] = []
        try:
            for chunk in client.api.build(
                path=str(context),
                dockerfile=f"images/{spec.dockerfile}",
                tag=tag,
                buildargs={"BASE": base_ref},
                labels={
                    LABEL_IMAGE: "sandbox",
                    LABEL_VARIANT: variant,
                    LABEL_INPUTS: inputs,
                    LABEL_RUNTIME: runtime_hash(),
                },
                network_mode="none",
                rm=True,
                forcerm=True,
                pull=False,
                decode=True,
            ):
                if "stream" in chunk:
                    log.append(chunk["stream"])
                if "error" in chunk:
                    raise ImageBuildError(f"building {tag} failed: {chunk['error']}\n{''.join(log)[-3000:]}")
        except docker.errors.APIError as exc:
            raise ImageBuildError(f"building {tag} failed: {exc}\n{''.join(log)[-3000:]}") from exc
        image = client.images.get(tag)
        image.tag(REPOSITORY, variant)
        return _info(image, tag, alias, variant, inputs, reused=False)


def _info(image: Any, tag: str, alias: str, variant: str, inputs: str, *, reused: bool) -> ImageInfo:
    return ImageInfo(
        tag=tag,
        alias=alias,
        id=image.id,
        variant=variant,
        inputs=inputs,
        reused=reused,
        size_mb=round(image.attrs.get("Size", 0) / 1e6, 1),
    )


def list_images() -> list[ImageInfo]:
    """Every sandbox image on the daemon (content-addressed tags; `alias` set where the alias points at it)."""
    client = docker_client()
    found: list[ImageInfo] = []
    for image in client.images.list(filters={"label": f"{LABEL_IMAGE}=sandbox"}):
        labels = image.labels or {}
        variant = labels.get(LABEL_VARIANT, "?")
        alias = f"{REPOSITORY}:{variant}"
        for tag in image.tags:
            if tag != alias:
                found.append(
                    _info(
                        image,
                        tag,
                        alias if alias in image.tags else "",
                        variant,
                        labels.get(LABEL_INPUTS, ""),
                        reused=True,
                    )
                )
    return sorted(found, key=lambda i: i.tag)
