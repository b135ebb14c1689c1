"""The attack corpus (`benchmarks/corpus/*.toml`) on every backend: the one source of attacks.

Each attack is a complete attempt at an effect on this machine (a file written, a secret read, a
connection made, a forged final answer, a session that does not come back); it passes when that
effect did not happen, however the sandbox stopped it. Each benign snippet must print exactly what
CPython prints. Both run through `benchmarks.security` (`attempt`, `check_benign`), the code the
security benchmark scores, in a fresh session of the entry's policy (the default `Policy()`
unless it has one); the benchmark's control run (each attack works outside a sandbox) is
`tests/test_benchmarks_smoke.py`'s.

The whole corpus runs on the host backends and Docker (seconds to a minute each); E2B's stand-in
and Ray, whose sessions cost more to start and whose isolation is the node's host or Docker
backend or the stand-in's local processes, run a slice: the first attack of every class and
effect, and the first benign snippet of every few.
"""

from __future__ import annotations

from typing import Any

import pytest
from support.tiers import BACKEND_NAMES, backend_param

from benchmarks import security

pytestmark = pytest.mark.anyio

ATTACKS, BENIGN = security.load_corpus()
SLICED = {"e2b", "ray"}
BENIGN_EVERY = 5


def _slice(attacks: list[security.Attack]) -> list[security.Attack]:
    seen: set[tuple[str, str]] = set()
    kept = []
    for attack in attacks:
        if (attack.attack_class, attack.effect) not in seen:
            seen.add((attack.attack_class, attack.effect))
            kept.append(attack)
    return kept


def _cases(items: list[Any], sliced: list[Any], label: Any) -> list[Any]:
    return [
        backend_param(name, item, id=f"{name}-{label(item)}")
        for name in BACKEND_NAMES
        for item in (sliced if name in SLICED else items)
    ]


ATTACK_CASES = _cases(ATTACKS, _slice(ATTACKS), lambda a: f"{a.attack_class}/{a.name}")
BENIGN_CASES = _cases(BENIGN, BENIGN[::BENIGN_EVERY], lambda b: b.name)


@pytest.fixture(scope="module")
def where() -> Any:
    """The things attacks aim at: a secret file and variable, a victim process, a listener, canaries."""
    with security.targets() as targets:
        yield targets


@pytest.mark.parametrize(("backend", "attack"), ATTACK_CASES, indirect=["backend"])
async def test_the_attack_has_no_effect(executor_factory: Any, attack: security.Attack, where: Any) -> None:
    outcome = await security.attempt(executor_factory, attack, where)
    assert outcome["contained"], outcome


@pytest.mark.parametrize(("backend", "snippet"), BENIGN_CASES, indirect=["backend"])
async def test_benign_code_prints_what_cpython_prints(
    executor_factory: Any, snippet: security.Benign
) -> None:
    outcome = await security.check_benign(executor_factory, snippet)
    assert outcome["correct"], outcome
