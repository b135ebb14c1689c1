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
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from .errors import BackendUnavailable, SandboxError
from .runtime import RUNTIME_DIR

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

ROOT = Path(__file__).resolve().parent.parent


def _images_dir() -> Path:
    """The Dockerfiles: a checkout's top-level `images/`, else the copy an installed wheel carries."""
    checkout = ROOT / "images"
    return checkout if (checkout / "Dockerfile").is_file() else Path(__file__).resolve().parent / "_images"


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


# --------------------------------------------------------------------------- docker connection


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


# --------------------------------------------------------------------------- hashing inputs


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
    baked = (found.labels or {}).get(LABEL_RUNTIME)
    if baked is not None and baked != runtime_hash():
        command = build_command(image) or "the command that made it"
        return f"the image {image!r} holds an older runner than sandboxes/runtime/; rebuild it with {command}"
    return None


# --------------------------------------------------------------------------- wheelhouse


def pinned_requirements(path: Path) -> list[tuple[str, str]]:
    """(normalised name, version) of each `name==version` line; other lines are refused."""
    pins: list[tuple[str, str]] = []
    for raw in path.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        match = re.fullmatch(r"([A-Za-z0-9_.\-]+)==([A-Za-z0-9_.+!\-]+)", line)
        if not match:
            raise ImageBuildError(f"{path}: {raw!r} is not pinned as name==version; pin every requirement")
        pins.append((_normalise(match[1]), match[2]))
    return pins


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def _find_wheel(directory: Path, name: str, version: str | None) -> Path | None:
    for wheel in sorted(directory.glob("*.whl")):
        parts = wheel.name.split("-")
        if _normalise(parts[0]) == name and (version is None or parts[1] == version):
            return wheel
    return None


def fill_wheelhouse(requirements: Path, python: str, progress: Progress = print) -> list[Path]:
    """The wheels for `requirements` (and pip) for CPython `python` ("3.11"), downloaded on the host if missing.

    Runs `pip download` only when some pinned wheel is absent, so a filled wheelhouse works offline.
    """
    directory = WHEELHOUSE / f"cp{python.replace('.', '')}"
    directory.mkdir(parents=True, exist_ok=True)
    pins = pinned_requirements(requirements)

    def present() -> list[Path] | None:
        found = [_find_wheel(directory, name, version) for name, version in pins]
        found.append(_find_wheel(directory, "pip", None))
        return None if any(w is None for w in found) else [w for w in found if w is not None]

    wheels = present()
    if wheels is not None:
        return wheels
    progress(f"downloading wheels for CPython {python} into {directory}")
    command = [
        sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--quiet",
        "--dest", str(directory), "--only-binary=:all:", "--implementation", "cp",
        "--python-version", python,
        "--platform", "manylinux2014_x86_64", "--platform", "manylinux_2_17_x86_64",
        "--platform", "manylinux_2_28_x86_64", "--platform", "linux_x86_64",
        "-r", str(requirements), "pip",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise ImageBuildError(
            f"pip download failed (is PyPI reachable from this host?):\n{done.stderr[-2000:]}\n"
            f"or put the wheels by hand into {directory}"
        )
    wheels = present()
    if wheels is None:
        raise ImageBuildError(
            f"pip download did not produce every pinned wheel of {requirements} in {directory}"
        )
    return wheels


# --------------------------------------------------------------------------- offline base image


def apt_mirror(suite: str = DEBIAN_SUITE) -> str:
    """The Debian mirror this machine's apt uses for `suite` (falls back to deb.debian.org)."""
    sources = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
    for source in sources:
        try:
            text = source.read_text()
        except OSError:
            continue
        for match in re.finditer(r"^deb\s+(?:\[[^\]]*\]\s+)?(\S+/debian/?)\s+" + suite + r"\s", text, re.M):
            return match[1].rstrip("/")
        for stanza in text.split("\n\n"):
            uris = re.search(r"^URIs:\s*(.+)$", stanza, re.M)
            suites = re.search(r"^Suites:\s*(.+)$", stanza, re.M)
            if uris and suites and suite in suites[1].split():
                for uri in uris[1].split():
                    if uri.rstrip("/").endswith("/debian"):
                        return uri.rstrip("/")
    return DEFAULT_MIRROR


def debian_base(
    client: docker.DockerClient, mirror: str | None = None, *, force: bool = False, progress: Progress = print
) -> str:
    """A Debian `DEBIAN_SUITE` image with python3, made by debootstrap + `docker import`; reused when present."""
    mirror = mirror or apt_mirror()
    spec = f"{DEBIAN_SUITE}|{mirror}|{','.join(DEBIAN_PACKAGES)}|{BASE_RECIPE_VERSION}"
    tag = f"{BASE_REPOSITORY}:{DEBIAN_SUITE}-{hashlib.sha256(spec.encode()).hexdigest()[:12]}"
    if not force and _image_exists(client, tag):
        return tag
    if shutil.which("debootstrap") is None:
        raise ImageBuildError("the offline base needs debootstrap: apt-get install debootstrap")
    if os.geteuid() != 0:
        raise ImageBuildError("debootstrap needs root: run the offline build as root (or with sudo)")
    progress(f"making {tag} from {mirror} with debootstrap (about a minute)")
    with tempfile.TemporaryDirectory(prefix="kodeagent-rootfs-") as scratch:
        rootfs = Path(scratch) / "rootfs"
        command = [
            "debootstrap", "--variant=minbase", f"--include={','.join(DEBIAN_PACKAGES)}",
            DEBIAN_SUITE, str(rootfs), mirror,
        ]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            raise ImageBuildError(f"debootstrap failed:\n{(done.stdout + done.stderr)[-3000:]}")
        for junk in (
            "usr/share/doc",
            "usr/share/man",
            "usr/share/info",
            "var/cache/apt",
            "var/lib/apt/lists",
        ):
            shutil.rmtree(rootfs / junk, ignore_errors=True)
        archive = Path(scratch) / "rootfs.tar"
        subprocess.run(["tar", "-C", str(rootfs), "-cf", str(archive), "."], check=True)
        changes = [
            "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "ENV LANG=C.UTF-8",
            f"LABEL {LABEL_IMAGE}=base",
            'CMD ["python3"]',
        ]
        repository, _, version = tag.partition(":")
        client.api.import_image_from_file(str(archive), repository=repository, tag=version, changes=changes)
    client.images.get(tag).tag(BASE_REPOSITORY, DEBIAN_SUITE)
    return tag


# --------------------------------------------------------------------------- building sandbox images


def _image_exists(client: docker.DockerClient, ref: str) -> bool:
    import docker.errors

    try:
        client.images.get(ref)
    except docker.errors.ImageNotFound:
        return False
    return True


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
    if _image_exists(client, wanted):
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
        if not force and _image_exists(client, tag):
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
                },  # fmt: skip
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
                    _info(image, tag, alias if alias in image.tags else "", variant, labels.get(LABEL_INPUTS, ""),
                          reused=True)
                )  # fmt: skip
    return sorted(found, key=lambda i: i.tag)


# --------------------------------------------------------------------------- orphan cleanup


def owner_label() -> str:
    """This process as a container owner: host, pid, and the pid's start time (pids get reused)."""
    return f"{socket.gethostname()}:{os.getpid()}:{_start_ticks(os.getpid())}"


def _start_ticks(pid: int) -> str:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "?"
    return stat.rsplit(")", 1)[1].split()[19]


def owner_alive(owner: str) -> bool:
    """Whether the process named by an owner label still runs (other hosts' owners count as alive)."""
    host, _, rest = owner.partition(":")
    pid, _, ticks = rest.partition(":")
    if host != socket.gethostname():
        return True
    if not pid.isdigit():
        return False
    return _start_ticks(int(pid)) == ticks != "?"


def cleanup(*, everything: bool = False, progress: Progress = print) -> list[str]:
    """Remove sandbox containers whose owner process is gone (or all of them); return their ids.

    Containers normally disappear with their session; this catches those of a parent that was
    killed with SIGKILL or lost power. `everything=True` also removes live sessions' containers.
    """
    client = docker_client()
    import docker.errors

    removed: list[str] = []
    # sparse: no per-container inspect, which raises NotFound for one that goes away meanwhile
    found = client.containers.list(all=True, sparse=True, filters={"label": f"{LABEL_SANDBOX}=1"})
    for container in found:
        owner = (container.attrs.get("Labels") or {}).get(LABEL_OWNER, "")
        if everything or not owner_alive(owner):
            try:
                container.remove(force=True, v=True)
            except docker.errors.NotFound:
                continue
            except docker.errors.APIError as exc:
                progress(f"could not remove {container.short_id}: {exc}")
                continue
            removed.append(container.id)
            progress(f"removed {container.short_id} ({container.attrs.get('State', '?')}, owner {owner or 'unknown'})")
    return removed


def remove_old_images(progress: Progress = print) -> list[str]:
    """Remove sandbox images that no alias points to any more (older builds); return their tags.

    Every change of the runner or the requirements makes a new content-addressed image; without
    this they pile up. Images still used by a container are kept.
    """
    client = docker_client()
    import docker.errors

    removed: list[str] = []
    for image in client.images.list(filters={"label": f"{LABEL_IMAGE}=sandbox"}):
        variant = (image.labels or {}).get(LABEL_VARIANT, "")
        if f"{REPOSITORY}:{variant}" in image.tags:
            continue
        for tag in image.tags:
            try:
                client.images.remove(tag)
            except docker.errors.APIError as exc:  # in use by a container, or a child image's parent
                progress(f"kept {tag}: {exc.explanation or exc}")
                continue
            removed.append(tag)
            progress(f"removed image {tag}")
    return removed


# --------------------------------------------------------------------------- command line


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sandboxes.images", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    build = commands.add_parser("build", help="build a sandbox image (reused if its inputs did not change)")
    build.add_argument("--variant", default=DEFAULT_VARIANT, choices=sorted(VARIANTS))
    where = build.add_mutually_exclusive_group()
    where.add_argument(
        "--offline",
        action="store_true",
        default=None,
        help="make the base image from the Debian mirror (no Docker Hub)",
    )
    where.add_argument("--base", help=f"base image of the standard variant (default {DEFAULT_HUB_BASE})")
    build.add_argument("--mirror", help="Debian mirror for --offline (default: the one apt uses)")
    build.add_argument("--force", action="store_true", help="rebuild even when nothing changed")
    commands.add_parser("list", help="list sandbox images")
    clean = commands.add_parser("cleanup", help="remove sandbox containers whose owner process is gone")
    clean.add_argument("--all", action="store_true", help="remove every sandbox container, live sessions too")
    clean.add_argument("--images", action="store_true", help="also remove older builds no alias points to")
    args = parser.parse_args(argv)
    try:
        if args.command == "build":
            info = build_image(args.variant, base=args.base, offline=args.offline, mirror=args.mirror,
                               force=args.force, progress=lambda m: print(m, file=sys.stderr))  # fmt: skip
            print(
                f"{info.alias} -> {info.tag} ({'unchanged, reused' if info.reused else 'built'}, {info.size_mb} MB)"
            )
        elif args.command == "list":
            for info in list_images():
                print(f"{info.tag:45} {info.size_mb:8.1f} MB  {('= ' + info.alias) if info.alias else ''}")
        else:
            removed = cleanup(everything=args.all, progress=lambda m: print(m, file=sys.stderr))
            print(f"removed {len(removed)} container(s)")
            if args.images:
                tags = remove_old_images(progress=lambda m: print(m, file=sys.stderr))
                print(f"removed {len(tags)} old image tag(s)")
    except SandboxError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
