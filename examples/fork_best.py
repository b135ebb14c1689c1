"""Fork a live session and keep the best of several candidate next steps.

Each candidate runs on its own copy-on-write fork of one session, all at once; the parent is never
changed, and what the losers did is gone with their forks.

    python examples/fork_best.py
"""

import anyio

from kodeagent import best_of, first_success
from sandboxes import ExecutionResult, open_executor

CANDIDATES = [
    "answer = sorted(data)[len(data) // 2]  # a median that ignores even lengths",
    "import statistics\nanswer = statistics.median(data)",
    "answer = data[99]  # wrong: raises IndexError",
]


def prefer_floats(code: str, result: ExecutionResult) -> float:
    return (2.0 if "statistics" in code else 1.0) if result.ok else 0.0


async def main() -> None:
    async with open_executor("host", timeout=10) as parent:
        await parent.run("data = [5, 1, 4, 2, 3, 6]")
        branch = await first_success(parent, CANDIDATES)
        async with branch.executor:
            print("first success:", branch.index, (await branch.executor.run("answer")).value)
        branch = await best_of(parent, CANDIDATES, rank=prefer_floats)
        async with branch.executor:
            print("best ranked:", branch.index, (await branch.executor.run("answer")).value)
        print("parent untouched:", (await parent.run("'answer' in dir()")).value)


if __name__ == "__main__":
    anyio.run(main)
