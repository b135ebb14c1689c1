"""Agent benchmark: CodeAct against ReAct on the same tasks, with a real model.

    python -m benchmarks.agent --model gpt-4o-mini                      # key from OPENAI_API_KEY
    python -m benchmarks.agent --model gemini/gemini-2.5-flash --tasks tools --agents codeact,react
    python -m benchmarks.agent --model openai/x --api-base http://127.0.0.1:8000/v1 --limit 5

Two task sets, both graded automatically:
- `humaneval`: HumanEval problems posed as agent tasks ("write this function"); the final answer
  (the function's source) is graded by running the problem's tests in a fresh sandbox session with
  the problem's policy, exactly as the execution benchmark runs programs.
- `tools`: multi-tool tasks in the spirit of the CodeAct paper's M3ToolEval: a small, deterministic
  world (prices, stock, exchange rates, cities, forecasts) behind tools, and questions that need
  several tool calls plus some arithmetic. Answers are numbers (graded with a tolerance) or names
  and lists (graded after normalising case, spaces and punctuation).

Reported per agent type and task set: success rate, steps, tokens, cost and wall time, so CodeAct and
ReAct can be compared on the same tasks. litellm is imported by the agents on their first call.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from rich.console import Console

from sandboxes.backends import BACKEND_NAMES, backend_name

from .common import (
    fmt_ms,
    make_console,
    print_table,
    progress,
    publish,
    script_main,
    summarize,
)

# ---------------------------------------------------------------------- the tool world

PRICES_USD = {"apple": 0.5, "banana": 0.25, "cherry": 3.0, "durian": 12.0, "eggplant": 1.75, "fig": 2.4}
STOCK = {"apple": 40, "banana": 120, "cherry": 15, "durian": 3, "eggplant": 22, "fig": 0}
RATES = {("USD", "EUR"): 0.9, ("EUR", "GBP"): 0.85, ("JPY", "USD"): 1 / 150, ("USD", "CHF"): 0.88}
POPULATION = {
    "Paris": 2_102_650,
    "Berlin": 3_878_100,
    "Madrid": 3_332_035,
    "Oslo": 717_710,
    "Rome": 2_746_984,
}
DISTANCE_KM = {
    frozenset({"Paris", "Berlin"}): 878.0,
    frozenset({"Berlin", "Madrid"}): 1869.0,
    frozenset({"Madrid", "Paris"}): 1053.0,
    frozenset({"Paris", "Rome"}): 1106.0,
    frozenset({"Rome", "Berlin"}): 1184.0,
    frozenset({"Oslo", "Berlin"}): 838.0,
}
FORECAST_C = {
    "Paris": [14.0, 15.5, 13.0, 12.5, 16.0, 17.5, 15.0],
    "Berlin": [11.0, 9.5, 10.0, 12.0, 13.5, 8.0, 9.0],
    "Oslo": [4.0, 5.5, 3.0, 6.5, 7.0, 2.5, 4.5],
    "Madrid": [22.0, 24.5, 23.0, 25.0, 21.5, 20.0, 26.0],
    "Rome": [19.0, 20.5, 18.0, 21.0, 22.5, 19.5, 20.0],
}


def _known(mapping: dict[str, Any], key: str, what: str) -> str:
    for name in mapping:
        if name.lower() == str(key).strip().lower():
            return name
    raise ValueError(f"unknown {what} {key!r}; known: {', '.join(sorted(mapping))}")


def get_price(item: str) -> float:
    """Price of one unit of a product, in USD.

    Args:
        item: product name, e.g. "apple".
    """
    return PRICES_USD[_known(PRICES_USD, item, "product")]


def get_stock(item: str) -> int:
    """Units of a product in stock.

    Args:
        item: product name, e.g. "apple".
    """
    return STOCK[_known(STOCK, item, "product")]


def list_products() -> list[str]:
    """Names of all products."""
    return sorted(PRICES_USD)


def convert_currency(amount: float, from_currency: str, to_currency: str) -> float:
    """Convert an amount between two currencies. Only direct pairs that the bank quotes are supported
    (either direction): USD-EUR, EUR-GBP, JPY-USD, USD-CHF; convert in several steps otherwise.

    Args:
        amount: the amount in `from_currency`.
        from_currency: ISO code, e.g. "USD".
        to_currency: ISO code, e.g. "EUR".
    """
    pair = (from_currency.upper(), to_currency.upper())
    if pair in RATES:
        return amount * RATES[pair]
    if pair[::-1] in RATES:
        return amount / RATES[pair[::-1]]
    raise ValueError(
        f"no direct rate for {pair[0]}->{pair[1]}; quoted pairs: " + ", ".join(f"{a}-{b}" for a, b in RATES)
    )


def get_population(city: str) -> int:
    """Population of a city.

    Args:
        city: city name, e.g. "Paris".
    """
    return POPULATION[_known(POPULATION, city, "city")]


def get_distance_km(city_a: str, city_b: str) -> float:
    """Road distance between two cities in km (only some pairs are known).

    Args:
        city_a: a city name.
        city_b: another city name.
    """
    key = frozenset({_known(POPULATION, city_a, "city"), _known(POPULATION, city_b, "city")})
    if key not in DISTANCE_KM:
        raise ValueError(f"no road distance known between {city_a} and {city_b}")
    return DISTANCE_KM[key]


def get_forecast(city: str) -> list[float]:
    """Daily high temperatures (Celsius) for the next 7 days.

    Args:
        city: city name, e.g. "Oslo".
    """
    return list(FORECAST_C[_known(FORECAST_C, city, "city")])


TOOLS: list[Callable[..., Any]] = [
    get_price,
    get_stock,
    list_products,
    convert_currency,
    get_population,
    get_distance_km,
    get_forecast,
]


@dataclass(frozen=True)
class ToolTask:
    """A question about the tool world with its exact answer (a number, or text/list compared normalised)."""

    task_id: str
    question: str
    answer: float | str
    tolerance: float = 0.01


def _tool_tasks() -> list[ToolTask]:
    p, s = PRICES_USD, STOCK
    eur = (12 * p["apple"] + 7 * p["cherry"]) * RATES[("USD", "EUR")]
    value = s["apple"] * p["apple"] + s["banana"] * p["banana"]
    trip = (
        DISTANCE_KM[frozenset({"Paris", "Berlin"})]
        + DISTANCE_KM[frozenset({"Berlin", "Madrid"})]
        + DISTANCE_KM[frozenset({"Madrid", "Paris"})]
    )
    oslo = sum(FORECAST_C["Oslo"]) / 7
    gbp = 1000 * RATES[("JPY", "USD")] * RATES[("USD", "EUR")] * RATES[("EUR", "GBP")]
    swing = max(("Paris", "Berlin", "Oslo"), key=lambda c: max(FORECAST_C[c]) - min(FORECAST_C[c]))
    cheap = ", ".join(sorted(n for n, v in p.items() if v < 2))
    in_stock_value = sum(p[n] * s[n] for n in p)
    per_km = POPULATION["Berlin"] / DISTANCE_KM[frozenset({"Oslo", "Berlin"})]
    return [
        ToolTask(
            "tools/0",
            "What do 12 apples and 7 cherries cost together, in EUR? Round to 2 decimals.",
            round(eur, 2),
        ),
        ToolTask(
            "tools/1",
            "Which of Paris, Berlin and Madrid has the largest population? Answer with the city name.",
            max(("Paris", "Berlin", "Madrid"), key=POPULATION.__getitem__),
        ),
        ToolTask(
            "tools/2",
            "What is the average forecast high in Oslo over the next 7 days, in Celsius, "
            "rounded to 1 decimal?",
            round(oslo, 1),
            0.051,
        ),
        ToolTask("tools/3", "How many km is the round trip Paris -> Berlin -> Madrid -> Paris?", trip),
        ToolTask("tools/4", "What is the total value in USD of all apples and bananas in stock?", value),
        ToolTask("tools/5", "Convert 1000 JPY to GBP. Round to 2 decimals.", round(gbp, 2)),
        ToolTask(
            "tools/6",
            "Among Paris, Berlin and Oslo, which city has the largest difference between its "
            "warmest and coldest forecast day? Answer with the city name.",
            swing,
        ),
        ToolTask(
            "tools/7",
            "List every product that costs less than 2 USD per unit, alphabetically, separated by commas.",
            cheap,
        ),
        ToolTask(
            "tools/8", "What is the total value in USD of the whole stock (every product)?", in_stock_value
        ),
        ToolTask(
            "tools/9",
            "Divide Berlin's population by the road distance from Oslo to Berlin in km. "
            "Round to the nearest whole number.",
            float(round(per_km)),
            0.51,
        ),
    ]


TOOL_TASKS = _tool_tasks()


def _normalise(text: str) -> str:
    return re.sub(r"[^a-z0-9,]", "", text.lower())


NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")


def grade_tool_answer(task: ToolTask, answer: Any) -> bool:
    """Numbers: any number in the answer within the tolerance. Text: equal after normalising."""
    if isinstance(task.answer, str):
        return _normalise(str(answer)) == _normalise(task.answer)
    if isinstance(answer, int | float) and not isinstance(answer, bool):
        return abs(float(answer) - task.answer) <= task.tolerance
    for match in NUMBER.findall(str(answer)):
        try:
            if abs(float(match.replace(",", "")) - task.answer) <= task.tolerance:
                return True
        except ValueError:
            continue
    return False


# ---------------------------------------------------------------------- HumanEval as agent tasks

HUMANEVAL_TEMPLATE = (
    "Implement the following Python function so that it is correct for all inputs described in its "
    "docstring. Your final answer must be the complete source code of the function (signature, body, "
    "and any imports it needs), and nothing else.\n\n```python\n{prompt}```"
)
FENCE = re.compile(r"```(?:python|py)?\s*\n(.*?)```", re.DOTALL)


def extract_code(answer: Any) -> str:
    """The code in a final answer: the last fenced block if there is one, else the text itself."""
    text = str(answer)
    blocks = FENCE.findall(text)
    return blocks[-1] if blocks else text


def humaneval_program(problem: dict[str, Any], answer: Any) -> str:
    code = extract_code(answer)
    if not re.search(rf"def\s+{re.escape(problem['entry_point'])}\s*\(", code):
        code = problem["prompt"] + code  # the answer was only the body
    return code + "\n\n" + problem["test"] + "\n" + f"check({problem['entry_point']})\n"


async def grade_humaneval(problem: dict[str, Any], answer: Any, backend: str) -> tuple[bool, str]:
    """Run the problem's tests on the answer in a fresh sandbox session."""
    from sandboxes import open_executor

    from .humaneval import policy_for

    async with open_executor(backend_name(backend), policy=policy_for(problem), timeout=10) as executor:
        result = await executor.run(humaneval_program(problem, answer))
    return result.ok, "passed" if result.ok else str(result.error or "timed out")


# ---------------------------------------------------------------------- running agents


def make_agent(
    kind: str,
    model: str,
    backend: str,
    tools: list[Callable[..., Any]],
    max_iterations: int,
    litellm_params: dict[str, Any],
) -> Any:
    from kodeagent import CodeActAgent, ReActAgent

    common: dict[str, Any] = {
        "tools": tools,
        "max_iterations": max_iterations,
        "litellm_params": litellm_params,
    }
    if kind == "codeact":
        return CodeActAgent(model, backend=backend, timeout=20, **common)  # type: ignore[arg-type]
    return ReActAgent(model, **common)


async def run_one(agent: Any, task: str) -> dict[str, Any]:
    """Drain one agent run: the final answer, whether the agent called it a success, and step count."""
    steps = 0
    final: Any = None
    claimed = False
    error = None
    started = time.perf_counter()
    try:
        async for response in agent.run(task):
            if response.type == "step":
                steps += 1
            elif response.type == "final":
                final = response.value
                claimed = bool(response.metadata.get("task_successful", True))
    except Exception as exc:  # noqa: BLE001 - a crashed run is a failed task, recorded with its reason
        error = f"{type(exc).__name__}: {exc}"
    usage = agent.usage_tracker.metrics()["total"]
    measured = [step.cpu_seconds for step in agent.steps if step.cpu_seconds is not None]
    return {
        "answer": final,
        "claimed_success": claimed,
        "steps": steps,
        "seconds": time.perf_counter() - started,
        "cpu_seconds": sum(measured) if measured else None,  # the sandbox's, over the task's code runs
        "tokens": usage["total_tokens"],
        "cost": usage["cost"],
        "calls": usage["calls"],
        "error": error,
    }


def run(
    *,
    model: str,
    agents: Sequence[str] = ("codeact", "react"),
    task_sets: Sequence[str] = ("humaneval", "tools"),
    backend: str = "host",
    limit: int | None = 20,
    max_iterations: int = 8,
    api_base: str | None = None,
    console: Console | None = None,
) -> dict[str, Any]:
    """Run every agent on every task; return the JSON-ready result."""
    import anyio

    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    console = console or make_console()
    params: dict[str, Any] = {"api_base": api_base} if api_base else {}
    work: list[tuple[str, str, str, Callable[[Any], Any]]] = []  # (set, task id, prompt, grader)
    if "humaneval" in task_sets:
        from .humaneval import load_problems

        problems = list(load_problems().values())[: limit if limit else None]
        for problem in problems:

            async def grade_code(answer: Any, p: dict[str, Any] = problem) -> tuple[bool, str]:
                return await grade_humaneval(p, answer, backend)

            work.append(
                (
                    "humaneval",
                    problem["task_id"],
                    HUMANEVAL_TEMPLATE.format(prompt=problem["prompt"]),
                    grade_code,
                )
            )
    if "tools" in task_sets:
        for tool_task in TOOL_TASKS[: limit if limit else None]:

            async def grade(answer: Any, t: ToolTask = tool_task) -> tuple[bool, str]:
                ok = grade_tool_answer(t, answer)
                return ok, "correct" if ok else f"expected {t.answer!r}"

            work.append(("tools", tool_task.task_id, tool_task.question, grade))
    records: list[dict[str, Any]] = []

    async def all_runs(advance: Callable[[int], None]) -> None:
        # One event loop for the whole benchmark: litellm keeps per-loop state (clients, logging).
        for kind in agents:
            for task_set, task_id, prompt, grader in work:
                tools = TOOLS if task_set == "tools" else []
                agent = make_agent(kind, model, backend, tools, max_iterations, params)
                outcome = await run_one(agent, prompt)
                if outcome["answer"] is not None and outcome["error"] is None:
                    passed, verdict = await grader(outcome["answer"])
                else:
                    passed, verdict = False, outcome["error"] or "no final answer"
                records.append(
                    {
                        "agent": kind,
                        "task_set": task_set,
                        "task_id": task_id,
                        "passed": passed,
                        "verdict": verdict[:300],
                        **{k: v for k, v in outcome.items() if k != "answer"},
                        "answer": str(outcome["answer"])[:2000],
                    }
                )
                advance(1)

    with progress(console, f"agents on {model}", len(work) * len(agents)) as advance:
        anyio.run(all_runs, advance)
    return {
        "model": model,
        "backend": backend,
        "max_iterations": max_iterations,
        "records": records,
        "summary": summarise(records),
    }


def summarise(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per (agent, task set): success rate, mean steps, tokens, cost, wall time."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for record in records:
        groups.setdefault((record["agent"], record["task_set"]), []).append(record)
    rows = []
    for (agent, task_set), group in groups.items():
        rows.append(
            {
                "agent": agent,
                "task_set": task_set,
                "tasks": len(group),
                "passed": sum(r["passed"] for r in group),
                "success_rate": sum(r["passed"] for r in group) / len(group),
                "mean_steps": sum(r["steps"] for r in group) / len(group),
                "tokens": sum(r["tokens"] for r in group),
                "cost": None if any(r["cost"] is None for r in group) else sum(r["cost"] for r in group),
                "wall_seconds": sum(r["seconds"] for r in group),
                "per_task": summarize([r["seconds"] for r in group]),
                "per_task_cpu": summarize(
                    [r["cpu_seconds"] for r in group if r.get("cpu_seconds") is not None]
                ),
            }
        )
    return rows


def report(console: Console, result: dict[str, Any]) -> None:
    rows = [
        [
            f"{s['agent']} / {s['task_set']}",
            f"{s['passed']}/{s['tasks']}",
            f"{s['success_rate']:.0%}",
            f"{s['mean_steps']:.1f}",
            f"{s['tokens']:,}",
            "unknown" if s["cost"] is None else f"${s['cost']:.4f}",
            f"{s['wall_seconds']:.1f} s",
            f"{fmt_ms(s['per_task']['p50_ms'])} / {fmt_ms(s['per_task']['p95_ms'])}",
            f"{fmt_ms(s['per_task_cpu']['p50_ms'])} / {fmt_ms(s['per_task_cpu']['p95_ms'])}",
        ]
        for s in result["summary"]
    ]
    print_table(
        console,
        f"Agents on {result['model']} (code runs on {result['backend']})",
        [
            "agent / tasks",
            "passed",
            "success",
            "steps",
            "tokens",
            "cost",
            "wall time",
            "per task p50 / p95",
            "sandbox CPU per task p50 / p95",
        ],
        rows,
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model", required=True, help="litellm model string; its API key comes from the environment"
    )
    parser.add_argument("--api-base", help="OpenAI-compatible endpoint (e.g. a local server)")
    parser.add_argument(
        "--agents", default="codeact,react", help="comma-separated: codeact, react (default both)"
    )
    parser.add_argument(
        "--tasks", default="humaneval,tools", help="comma-separated: humaneval, tools (default both)"
    )
    parser.add_argument(
        "--backend",
        default="host",
        choices=BACKEND_NAMES,
        help="where CodeAct code and HumanEval grading run (default host; ray: on a Ray cluster's nodes)",
    )
    parser.add_argument("--limit", type=int, default=20, help="tasks per set at most (default 20; 0 = all)")
    parser.add_argument("--max-iterations", type=int, default=8, help="steps per task at most (default 8)")
    parser.add_argument(
        "--output", metavar="PATH", help="result JSON path (default results/agent-<time>.json)"
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON on stdout")


def _split(value: str, allowed: Sequence[str], what: str) -> list[str]:
    items = [v.strip() for v in value.split(",") if v.strip()]
    unknown = [v for v in items if v not in allowed]
    if unknown or not items:
        raise SystemExit(f"{what} must be a comma-separated subset of {', '.join(allowed)}; got {value!r}")
    return items


def execute(args: argparse.Namespace) -> int:
    """Exit 0 when the runs completed (the success rates are the result, not a pass/fail)."""
    console = make_console(args.json)
    result = run(
        model=args.model,
        agents=_split(args.agents, ("codeact", "react"), "--agents"),
        task_sets=_split(args.tasks, ("humaneval", "tools"), "--tasks"),
        backend=args.backend,
        limit=args.limit or None,
        max_iterations=args.max_iterations,
        api_base=args.api_base,
        console=console,
    )
    publish("agent", result, args, console, report)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return script_main(__doc__, "python -m benchmarks.agent", add_arguments, execute, argv)


if __name__ == "__main__":
    sys.exit(main())
