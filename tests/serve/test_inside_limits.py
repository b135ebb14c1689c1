"""The in-sandbox limits come from the server's config (`ServeConfig.inside`, declared once in
`InsideLimits`): a configured cap takes effect in a served sandbox through the unmodified SDKs, and
a config that would not hold is refused before the server starts."""

from __future__ import annotations

from typing import Any

import pytest
from support.served import Served

from sandboxes.adapters.serve.config import ServeConfigError, make_config

pytest.importorskip("e2b_code_interpreter")
from e2b.exceptions import InvalidArgumentException, SandboxException  # noqa: E402
from e2b_code_interpreter import Sandbox  # noqa: E402

pytestmark = pytest.mark.e2b

SMALL = {"max_file_bytes": 4096, "max_code_bytes": 2048, "max_list_entries": 3, "max_rpc_bytes": 4096}


def run(served: Served, sandbox: Sandbox, code: str) -> Any:
    executor = served.app.registry.get("alice", sandbox.sandbox_id).sandbox.executor
    return served.call(lambda: executor.run(code)).value


@pytest.mark.parametrize(
    "inside",
    [
        {"max_file_bytes": 0},
        {"max_list_entries": -1},
        {"max_code_bytes": "2048"},  # a string is not a number of bytes
        {"max_files": 3},  # not a limit this server has
    ],
)
def test_a_limit_that_would_not_hold_is_refused_naming_it(inside: dict[str, Any]) -> None:
    with pytest.raises(ServeConfigError, match="inside"):
        make_config({"inside": inside})


def test_configured_limits_take_effect_in_a_sandbox(serve_with: Any) -> None:
    served = serve_with(inside=SMALL)
    assert served.app.config.inside.max_file_bytes == 4096
    sandbox = Sandbox.create(**served.sdk_options())
    try:
        sandbox.files.write("/home/user/fits.bin", b"x" * 4096)
        with pytest.raises(SandboxException, match="4,096"):
            sandbox.files.write("/home/user/over.bin", b"x" * 4097)
        assert run(served, sandbox, "import os\nsorted(os.listdir('.'))") == ["fits.bin"]  # nothing written

        run(served, sandbox, "open('big.bin', 'wb').write(b'y' * 5000)")
        with pytest.raises(SandboxException, match="4,096"):
            sandbox.files.read("/home/user/big.bin")

        run(served, sandbox, "[open(f'f{i}', 'w').close() for i in range(3)]")  # 5 entries now
        with pytest.raises((InvalidArgumentException, SandboxException), match="3"):
            sandbox.files.list("/home/user")

        assert sandbox.run_code("x = 1\nx").text == "1"
        with pytest.raises(SandboxException):
            sandbox.run_code("y = 2  # " + "z" * 3000)
        assert run(served, sandbox, "'y' in dir()") is False  # the oversized cell never ran
    finally:
        sandbox.kill()
