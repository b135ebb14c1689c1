"""Durable homes (`serve.homes`): a Docker `durable_home` that this machine cannot give is refused at
start with what to do, and a Docker home belongs to the container's uid."""

from __future__ import annotations

import os
from typing import Any

import pytest

from sandboxes.adapters.serve import homes
from sandboxes.adapters.serve.config import ServeConfig, ServeConfigError, make_config


def docker(**settings: Any) -> ServeConfig:
    return make_config({"backend": "docker", "keys": ["e2b_" + "c3" * 20], **settings})


def test_shared_containers_cannot_have_a_home_each() -> None:
    with pytest.raises(ServeConfigError, match="sessions_per_container = 1, or set durable_home = false"):
        homes.check(docker(backend_options={"sessions_per_container": 4}))
    homes.check(docker(backend_options={"sessions_per_container": 4}, durable_home=False))


def test_a_daemon_elsewhere_cannot_see_this_machines_homes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", "tcp://192.0.2.1:2375")
    with pytest.raises(ServeConfigError, match="use a local daemon"):
        homes.check(docker())


def test_a_server_that_is_neither_root_nor_the_containers_uid_is_told_what_to_do() -> None:
    with pytest.raises(ServeConfigError) as refused:
        homes.check(docker(), euid=4321)
    said = str(refused.value)
    assert "owned by the container's uid 1000" in said and "run the server as root" in said
    assert 'backend_options.user = "4321:4321"' in said
    homes.check(docker(durable_home=False), euid=4321)


def test_a_docker_home_belongs_to_the_containers_uid() -> None:
    made = homes.Homes(docker(backend_options={"user": "1234:2345"}))
    try:
        home = made.make("abc")
        info = os.stat(home)
        assert (info.st_uid, info.st_gid, info.st_mode & 0o777) == (1234, 2345, 0o700)
        assert os.stat(made.root).st_mode & 0o777 == 0o711
    finally:
        made.close()
    assert not os.path.exists(made.root)
