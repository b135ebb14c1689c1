"""The offline base image: Debian from the mirror apt already uses (debootstrap, then `docker import`),
for machines that cannot reach Docker Hub."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from .common import (
    BASE_RECIPE_VERSION,
    BASE_REPOSITORY,
    DEBIAN_PACKAGES,
    DEBIAN_SUITE,
    DEFAULT_MIRROR,
    LABEL_IMAGE,
    ImageBuildError,
    Progress,
    image_exists,
)

if TYPE_CHECKING:
    import docker


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
    if not force and image_exists(client, tag):
        return tag
    if shutil.which("debootstrap") is None:
        raise ImageBuildError("the offline base needs debootstrap: apt-get install debootstrap")
    if os.geteuid() != 0:
        raise ImageBuildError("debootstrap needs root: run the offline build as root (or with sudo)")
    progress(f"making {tag} from {mirror} with debootstrap (about a minute)")
    with tempfile.TemporaryDirectory(prefix="kodeagent-rootfs-") as scratch:
        rootfs = Path(scratch) / "rootfs"
        command = [
            "debootstrap",
            "--variant=minbase",
            f"--include={','.join(DEBIAN_PACKAGES)}",
            DEBIAN_SUITE,
            str(rootfs),
            mirror,
        ]
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
