"""`kodeagent serve`'s pure parts: its settings, its API keys, and E2B's network options mapped onto the
egress policy (or refused)."""

from __future__ import annotations

import json
import pathlib
import re

import pytest

from sandboxes.adapters.serve.config import ServeConfig, ServeConfigError, load_config, make_config
from sandboxes.adapters.serve.errors import BadRequest
from sandboxes.adapters.serve.keys import KEY_VARIABLE, generate_key, with_keys
from sandboxes.adapters.serve.network import network_of
from sandboxes.egress.policy import NetworkPolicy

KEY = "e2b_" + "c3" * 20


def test_defaults_are_safe() -> None:
    config = ServeConfig()
    assert config.host == "127.0.0.1" and config.keys == ()
    assert config.python_guards is False  # the lead's decision: a whole small Linux machine
    assert config.max_sandboxes_per_key <= config.max_sandboxes


def test_generated_keys_have_e2bs_form_and_differ() -> None:
    keys = {generate_key() for _ in range(50)}
    assert len(keys) == 50
    assert all(re.fullmatch(r"e2b_[0-9a-f]{40}", k) for k in keys)


def test_keys_come_from_the_config_then_the_environment_then_are_generated(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(KEY_VARIABLE, raising=False)
    own = make_config({"keys": [KEY]})
    assert with_keys(own) == (own, None)
    assert own.keys[0].name == "key-1"
    config, generated = with_keys(ServeConfig())
    assert generated is not None and config.keys[0].token == generated
    monkeypatch.setenv(KEY_VARIABLE, KEY)
    config, generated = with_keys(ServeConfig())
    assert generated is None and config.keys[0].token == KEY
    monkeypatch.setenv(KEY_VARIABLE, "short")
    with pytest.raises(ServeConfigError, match=KEY_VARIABLE):
        with_keys(ServeConfig())


def test_a_bad_setting_names_its_field(tmp_path: pathlib.Path) -> None:
    with pytest.raises(ServeConfigError, match="max_sandboxes_per_key is above"):
        make_config({"max_sandboxes": 2, "max_sandboxes_per_key": 3})
    with pytest.raises(ServeConfigError, match="backend"):
        make_config({"backend": "e2b"})  # serving E2B's protocol from E2B's cloud: not a backend here
    with pytest.raises(ServeConfigError, match="same key"):
        make_config({"keys": [KEY, KEY]})
    with pytest.raises(ServeConfigError, match="nonsense"):
        make_config({"nonsense": 1})
    file = tmp_path / "serve.json"
    file.write_text(json.dumps({"keys": [{"name": "ops", "token": KEY}], "port": 0}))
    assert load_config(file).keys[0].name == "ops"
    assert load_config(file, port=9).port == 9
    (tmp_path / "serve.yaml").write_text("x")
    with pytest.raises(ServeConfigError, match=".json or .toml"):
        load_config(tmp_path / "serve.yaml")


def test_network_defaults_follow_the_server() -> None:
    assert network_of(None, None, internet=True) is True
    assert network_of(None, None, internet=False) is False
    assert network_of(False, None, internet=True) is False
    assert network_of(True, None, internet=True) is True
    with pytest.raises(BadRequest, match="internet = false"):
        network_of(True, None, internet=False)


def test_deny_all_with_allow_is_an_allow_list() -> None:
    policy = network_of(
        None, {"denyOut": ["0.0.0.0/0"], "allowOut": ["pypi.org", "10.0.0.5/32"]}, internet=True
    )
    assert policy == NetworkPolicy(allow=("pypi.org", "10.0.0.5/32"))
    assert network_of(None, {"denyOut": ["0.0.0.0/0"]}, internet=True) is False
    assert network_of(None, {"denyOut": ["0.0.0.0/0"], "allowOut": ["0.0.0.0/0"]}, internet=True) is True


def test_a_deny_list_alone_is_a_deny_list() -> None:
    policy = network_of(None, {"denyOut": ["evil.example", "1.2.3.0/24"]}, internet=True)
    assert policy == NetworkPolicy(deny=("evil.example", "1.2.3.0/24"))


@pytest.mark.parametrize(
    ("access", "network", "why"),
    [
        (None, {"allowOut": ["pypi.org"]}, "allowOut without denyOut"),
        (False, {"allowOut": ["pypi.org"]}, "allow_internet_access is false"),
        (None, {"dnsServers": ["1.1.1.1"]}, "dnsServers"),
        (None, {"egressProxy": {"url": "x"}}, "egressProxy"),
        (None, {"rules": {"a.com": [{}]}}, "rules"),
        (None, {"maskRequestHost": "x"}, "maskRequestHost"),
        (None, {"denyOut": "0.0.0.0/0"}, "list of strings"),
        (None, {"denyOut": ["0.0.0.0/0"], "allowOut": ["not a rule !"]}, "not valid"),
        ("yes", None, "true or false"),
        (None, ["0.0.0.0/0"], "object"),
    ],
)
def test_what_does_not_map_is_refused(access: object, network: object, why: str) -> None:
    with pytest.raises(BadRequest, match=why):
        network_of(access, network, internet=True)
