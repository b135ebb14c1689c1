"""What the host backend says when bubblewrap cannot make namespaces: the cause, read from the kernel's
settings (here a copy of /proc/sys under a temporary root) and bubblewrap's own words, and its fixes.
The real refusal, under a real seccomp filter, is tested in tests/backends/host/test_host_bubblewrap.py."""

from __future__ import annotations

import pathlib

import pytest

from kodeagent_cli.doctor import images_build_fix
from sandboxes.backends.host.bubblewrap import diagnose, in_container
from sandboxes.images import build_command, image_missing_message

UNPRIVILEGED = "bwrap: No permissions to creating new namespace, likely because the kernel does not allow non-privileged user namespaces."
SECCOMP = "bwrap: Creating new namespace failed: Operation not permitted"
APPARMOR = "bwrap: setting up uid map: Permission denied"


def machine(tmp_path: pathlib.Path, **settings: str) -> str:
    """A root directory whose proc/sys holds `settings` ("kernel/unprivileged_userns_clone": "0", ...)."""
    for name, value in settings.items():
        path = tmp_path / "proc" / "sys" / name.replace(".", "/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{value}\n")
    return str(tmp_path)


@pytest.mark.parametrize(
    ("setting", "value", "cause", "fix"),
    [
        (
            "kernel.unprivileged_userns_clone",
            "0",
            "kernel.unprivileged_userns_clone = 0",
            "sysctl -w kernel.unprivileged_userns_clone=1",
        ),
        (
            "user.max_user_namespaces",
            "0",
            "user.max_user_namespaces = 0",
            "sysctl -w user.max_user_namespaces=",
        ),
        ("kernel.apparmor_restrict_unprivileged_userns", "1", "AppArmor", "apt-get install bubblewrap"),
    ],
)
def test_a_kernel_setting_that_forbids_user_namespaces_is_named_with_its_fix(
    tmp_path: pathlib.Path, setting: str, value: str, cause: str, fix: str
) -> None:
    root = machine(tmp_path, **{setting: value})
    message = diagnose(APPARMOR if "apparmor" in setting else UNPRIVILEGED, root=root, uid=1000)
    assert cause in message and fix in message, message
    assert "bubblewrap said: bwrap:" in message and message.endswith("use the docker or e2b backend")


def test_settings_that_allow_user_namespaces_are_not_blamed(tmp_path: pathlib.Path) -> None:
    root = machine(
        tmp_path,
        **{
            "kernel.unprivileged_userns_clone": "1",
            "user.max_user_namespaces": "15000",
            "kernel.apparmor_restrict_unprivileged_userns": "0",
        },
    )
    message = diagnose(UNPRIVILEGED, root=root, uid=1000)
    assert "sysctl -w" not in message and "AppArmor" not in message, message
    assert "unprivileged user namespaces seem to be refused" in message and "unshare --user" in message


def test_root_refused_names_a_seccomp_filter_or_a_container(tmp_path: pathlib.Path) -> None:
    root = machine(tmp_path, **{"kernel.unprivileged_userns_clone": "0"})
    message = diagnose(SECCOMP, root=root, uid=0)
    assert "unprivileged_userns_clone" not in message, "root needs no unprivileged user namespace"
    assert "seccomp" in message and "--security-opt seccomp=unconfined" in message, message
    (tmp_path / "proc" / "1").mkdir(parents=True)
    (tmp_path / "proc" / "1" / "cgroup").write_text("0::/system.slice/docker-0123abcd.scope\n")
    assert in_container(str(tmp_path))
    assert "this runs in a container" in diagnose(SECCOMP, root=str(tmp_path), uid=0)


def test_an_unknown_failure_is_quoted(tmp_path: pathlib.Path) -> None:
    message = diagnose("bwrap: Unknown option --perms", root=machine(tmp_path), uid=0)
    assert "bubblewrap said: bwrap: Unknown option --perms" in message, message


@pytest.mark.parametrize("image", ["kodeagent-sandbox:py", "kodeagent-sandbox:datascience"])
def test_doctor_names_kodeagent_images_build_for_a_missing_image(image: str) -> None:
    fix = images_build_fix(build_command(image))
    assert fix is not None and "`kodeagent images build" in fix and "sandboxes.images" not in fix, fix
    assert ("--variant datascience" in fix) == image.endswith("datascience")
    assert "`kodeagent images build" in (images_build_fix(image_missing_message(image)) or "")
