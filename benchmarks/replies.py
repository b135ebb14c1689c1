"""Replies benchmark: a corpus of messy model replies, each read by the agents' own parser and scored.

    python -m benchmarks.replies              # every reply in benchmarks/corpus/replies/
    kodeagent bench replies --json            # the same, as JSON on stdout

Every reply is one a real model could send a CodeAct or ReAct agent (see the corpus README for the
shapes). It goes through `agent.parse_reply()` of a real `CodeActAgent` or `ReActAgent` holding the
corpus's tools — the exact code path of a run — and gets one of three outcomes:

- read as intended: the parser returned the code, tool call or final answer the reply meant, field
  for field, or it refused a reply the corpus marks as one to refuse, naming the expected problem;
- refused: the parser refused (a safe outcome: the model is told and tries again), but either the
  reply should have been read, or the refusal does not name the problem the corpus expects;
- misread: the parser returned something the reply did not mean, or acted on a reply that must be
  refused. This is the outcome that must never happen: the agent would run code or call a tool the
  model did not ask for, or stop with an answer it did not give.

No model and no network: the corpus is the input, so the result is exact and repeatable.
"""

from __future__ import annotations

import argparse
import os
import sys
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from .common import make_console, print_table, publish, script_main

CORPUS = Path(__file__).resolve().parent / "corpus" / "replies"
OUTCOMES = ("read as intended", "refused", "misread")


def get_price(symbol: str) -> float:
    """Latest price of a stock. Args: symbol: ticker, e.g. AAPL."""
    return 100.0


def get_weather(city: str, unit: str = "C") -> str:
    """Current weather in a city. Args: city: the city. unit: C or F."""
    return f"21 {unit} in {city}"


def search(query: str) -> list[str]:
    """Search the web. Args: query: what to look for."""
    return [query]


def convert_currency(amount: float, from_currency: str, to_currency: str) -> float:
    """Convert money. Args: amount: how much. from_currency: ISO code. to_currency: ISO code."""
    return amount


TOOLS: list[Callable[..., Any]] = [get_price, get_weather, search, convert_currency]


@dataclass(frozen=True)
class Reply:
    """One corpus entry: the reply text and what it means (or the problem a refusal must name)."""

    agent: str
    name: str
    shape: str
    text: str
    expect: str
    code: str | None = None
    final_answer: Any = None
    task_successful: bool | None = None
    action: str | None = None
    args: dict[str, Any] | None = None
    reason: str | None = None
    source: str = ""


def load_corpus(directory: Path = CORPUS) -> list[Reply]:
    """Every reply of every corpus file; malformed entries raise ValueError naming the entry."""
    replies: list[Reply] = []
    for path in sorted(directory.glob("*.toml")):
        data = tomllib.loads(path.read_text(encoding="utf-8"))
        agent = data.get("agent")
        if agent not in ("codeact", "react"):
            raise ValueError(f"{path.name}: top-level `agent` must be codeact or react, got {agent!r}")
        for entry in data.get("reply", []):
            known = {f for f in Reply.__dataclass_fields__ if f not in ("agent", "source")}
            unknown = set(entry) - known
            if unknown:
                raise ValueError(f"{path.name}: {entry.get('name')!r} has unknown keys {sorted(unknown)}")
            reply = Reply(agent=agent, source=path.name, **entry)
            if reply.expect not in ("read", "refuse"):
                raise ValueError(f"{path.name}: {reply.name!r}: expect must be read or refuse")
            if reply.expect == "refuse" and not reply.reason:
                raise ValueError(f"{path.name}: {reply.name!r}: a refusal needs the `reason` it must name")
            if reply.expect == "read" and not (
                reply.code is not None or reply.final_answer is not None or reply.action
            ):
                raise ValueError(
                    f"{path.name}: {reply.name!r}: say what it means (code, final_answer, action)"
                )
            replies.append(reply)
    return replies


def make_agents() -> dict[str, Any]:
    """A real CodeAct and ReAct agent with the corpus tools (no model is called: only the parser runs)."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    from kodeagent import CodeActAgent, ReActAgent

    return {
        "codeact": CodeActAgent("openai/replies-bench", tools=TOOLS),
        "react": ReActAgent("openai/replies-bench", tools=TOOLS, tool_calling="text"),
    }


@dataclass
class Verdict:
    outcome: str
    detail: str = ""
    parsed: dict[str, Any] = field(default_factory=dict)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, str) and isinstance(b, str):
        return a.strip() == b.strip()
    return bool(a == b)


def judge(agent: Any, reply: Reply) -> Verdict:
    """Parse `reply` with `agent` and compare with what it means."""
    from kodeagent import ResponseParseError

    try:
        message = agent.parse_reply(reply.text)
    except ResponseParseError as exc:
        problem = str(exc)
        observation = agent.format_error_observation(problem)
        if reply.expect == "refuse" and reply.reason and reply.reason.lower() in problem.lower():
            return Verdict("read as intended", problem, {"observation": observation})
        return Verdict("refused", problem, {"observation": observation})
    parsed = {k: v for k, v in message.model_dump(exclude={"content", "role"}).items() if v not in (None, "")}
    if reply.expect == "refuse":
        return Verdict("misread", f"should be refused ({reply.reason}) but was read", parsed)
    wrong = []
    is_final = message.is_final
    if reply.final_answer is not None:
        if not is_final or not _same(message.final_answer, reply.final_answer):
            wrong.append(f"final_answer {message.final_answer!r} (expected {reply.final_answer!r})")
        if reply.task_successful is not None and message.task_successful != reply.task_successful:
            wrong.append(f"task_successful {message.task_successful}")
    elif is_final:
        wrong.append(f"read as a final answer {message.final_answer!r}")
    if reply.code is not None and not _same(getattr(message, "code", None) or "", reply.code):
        wrong.append(f"code {getattr(message, 'code', None)!r} (expected {reply.code!r})")
    if reply.action is not None:
        if message.action != reply.action:
            wrong.append(f"action {message.action!r} (expected {reply.action!r})")
        if reply.args is not None and message.args != reply.args:
            wrong.append(f"args {message.args!r} (expected {reply.args!r})")
    if wrong:
        return Verdict("misread", "; ".join(wrong), parsed)
    return Verdict("read as intended", "", parsed)


def run(*, agents: Sequence[str] = ("codeact", "react"), shapes: Sequence[str] = ()) -> dict[str, Any]:
    built = make_agents()
    items = []
    for reply in load_corpus():
        if reply.agent not in agents or (shapes and not any(s in reply.shape for s in shapes)):
            continue
        verdict = judge(built[reply.agent], reply)
        items.append(
            {
                "agent": reply.agent,
                "name": reply.name,
                "shape": reply.shape,
                "expect": reply.expect,
                "outcome": verdict.outcome,
                "detail": verdict.detail,
                "parsed": verdict.parsed,
            }
        )
    totals = {o: sum(i["outcome"] == o for i in items) for o in OUTCOMES}
    must_read = [i for i in items if i["expect"] == "read"]
    return {
        "benchmark": "replies",
        "corpus": str(CORPUS),
        "n": len(items),
        "totals": totals,
        "must_read": len(must_read),
        "must_read_read": sum(i["outcome"] == "read as intended" for i in must_read),
        "must_refuse": len(items) - len(must_read),
        "items": items,
    }


def summary_rows(result: dict[str, Any]) -> list[list[str]]:
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for item in result["items"]:
        groups.setdefault((item["shape"], item["agent"]), []).append(item)
    rows = []
    for (shape, agent), items in sorted(
        groups.items(), key=lambda kv: (kv[0][0].startswith("refuse"), kv[0])
    ):
        counts = [sum(i["outcome"] == o for i in items) for o in OUTCOMES]
        rows.append([shape, agent, str(len(items)), *map(str, counts)])
    totals = result["totals"]
    rows.append(["all", "", str(result["n"]), *(str(totals[o]) for o in OUTCOMES)])
    return rows


def report(console: Console, result: dict[str, Any]) -> None:
    note = (
        f"read as intended: the reply's code, tool call or answer exactly, or a refusal naming the expected "
        f"problem; must-read replies read: {result['must_read_read']}/{result['must_read']}; "
        f"must-refuse replies: {result['must_refuse']}"
    )
    print_table(
        console,
        "Replies corpus",
        ["shape", "agent", "n", *OUTCOMES],
        summary_rows(result),
        note=note,
        left=(0, 1),
    )
    for item in result["items"]:
        if item["outcome"] != "read as intended":
            console.print(
                f"  {item['outcome'].upper()}: {item['agent']}/{item['name']}: {item['detail'][:200]}",
                markup=False,
                highlight=False,
            )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--agent",
        action="append",
        choices=["codeact", "react"],
        help="only this agent's replies (repeatable; default both)",
    )
    parser.add_argument(
        "--shape",
        action="append",
        default=[],
        metavar="TEXT",
        help="only shapes containing TEXT (repeatable)",
    )
    parser.add_argument(
        "--output", metavar="PATH", help="result JSON path (default results/replies-<time>.json)"
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON on stdout")


def execute(args: argparse.Namespace) -> int:
    """Exit 0 when nothing was misread and every must-read reply was read as intended."""
    console = make_console(args.json)
    result = run(agents=args.agent or ("codeact", "react"), shapes=args.shape)
    publish("replies", result, args, console, report)
    clean = result["totals"]["misread"] == 0 and result["must_read_read"] == result["must_read"]
    return 0 if clean else 1


def main(argv: Sequence[str] | None = None) -> int:
    return script_main(__doc__, "python -m benchmarks.replies", add_arguments, execute, argv)


if __name__ == "__main__":
    sys.exit(main())
