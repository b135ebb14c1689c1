"""`python -m sandboxes.images`: build, list and clean up sandbox images."""

from __future__ import annotations

import argparse
import sys

from ..errors import SandboxError
from .build import build_image, list_images
from .cleanup import cleanup, remove_old_images
from .common import DEFAULT_HUB_BASE, DEFAULT_VARIANT, VARIANTS


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sandboxes.images",
        description="Build, list and clean up the sandbox images of the Docker backend.",
    )
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
            info = build_image(
                args.variant,
                base=args.base,
                offline=args.offline,
                mirror=args.mirror,
                force=args.force,
                progress=lambda m: print(m, file=sys.stderr),
            )
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
