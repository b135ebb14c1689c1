"""Attack class: environment leaks.

A secret in the parent's environment, set before the executor is created, must not be visible to the
code by any route: `os.environ`, `os.getenv`, `/proc/self/environ`, the parent's `/proc/<pid>/environ`,
a child process's environment. Only what `env=` passes is there.
"""

from __future__ import annotations

import os

import pytest
from support.security_helpers import ESCAPED

from sandboxes import Policy

pytestmark = pytest.mark.anyio

SECRET = "kodeagent-test-secret-9f3b2c"

ROUTES = {
    "os.environ": "import os\nprint(dict(os.environ))",
    "os.getenv": "import os\nprint(os.getenv('KODEAGENT_TEST_SECRET'))",
    "environ bytes": "import os\nprint(os.environb)",
    "/proc/self/environ": "print(open('/proc/self/environ').read())",
    "parent's /proc environ": "import os\nprint(open(f'/proc/{os.getppid()}/environ').read())",
    "every /proc environ": (
        "import os\n"
        "for pid in range(1, 4):\n"
        "    try:\n        print(open(f'/proc/{pid}/environ').read())\n"
        "    except Exception as e:\n        print(type(e).__name__)\n"
    ),
    "child process environment": (
        "import subprocess\nprint(subprocess.run(['env'], capture_output=True, text=True).stdout)\n"
    ),
}


@pytest.fixture
def secret_in_parent(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("KODEAGENT_TEST_SECRET", SECRET)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    return SECRET


@pytest.mark.parametrize("name", sorted(ROUTES))
async def test_parent_environment_does_not_leak(executor_factory, secret_in_parent: str, name: str) -> None:
    assert os.environ["KODEAGENT_TEST_SECRET"] == secret_in_parent
    policy = Policy(allowed_imports=["os", "subprocess"], subprocess=True)
    async with executor_factory(policy=policy, timeout=10, env={"VISIBLE": "yes"}) as ex:
        result = await ex.run(ROUTES[name])
        everything = result.stdout + result.stderr + (result.error.message if result.error else "")
        assert secret_in_parent not in everything, result
        assert ESCAPED not in everything
        seen = await ex.run(
            "import os\nprint(os.environ.get('VISIBLE'), 'KODEAGENT_TEST_SECRET' in os.environ)"
        )
        assert seen.stdout == "yes False\n", seen


async def test_only_env_is_visible(executor_factory, secret_in_parent: str) -> None:
    async with executor_factory(
        policy=Policy(allowed_imports=["os"]), timeout=10, env={"A": "1", "B": "two"}
    ) as ex:
        result = await ex.run(
            "import os\nprint(sorted(k for k in os.environ if k in ('A', 'B', 'AWS_SECRET_ACCESS_KEY')))"
        )
    assert result.stdout == "['A', 'B']\n", result
