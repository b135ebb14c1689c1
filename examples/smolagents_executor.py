"""smolagents' CodeAgent with every code step run in a kodeagent sandbox session.

    OPENAI_API_KEY=... python examples/smolagents_executor.py     # pip install -e '.[smolagents]'

`--model` is any litellm model; `OPENAI_API_BASE` points `openai/...` models at a local server.
"""

import argparse
import os

from smolagents import CodeAgent, LiteLLMModel, tool

from sandboxes import Policy
from sandboxes.adapters.smolagents import KodeagentExecutor


@tool
def get_price(symbol: str) -> float:
    """Latest price of a stock.

    Args:
        symbol: the ticker, e.g. AAPL.
    """
    return {"AAPL": 200.0, "MSFT": 400.0}[symbol]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("task", nargs="?", default="What do one AAPL and one MSFT share cost together?")
    parser.add_argument("--model", default="openai/gpt-4o-mini")
    parser.add_argument("--backend", default="host")
    args = parser.parse_args()
    imports = ["statistics"]  # the same list for both: the sandbox allows exactly what the agent announces
    executor = KodeagentExecutor(imports, backend=args.backend, policy=Policy(files="none"), timeout=30)
    model = LiteLLMModel(model_id=args.model, api_base=os.environ.get("OPENAI_API_BASE"))
    with CodeAgent(
        tools=[get_price],
        model=model,
        additional_authorized_imports=imports,
        executor=executor,
        verbosity_level=0,
    ) as agent:
        print("answer:", agent.run(args.task))


if __name__ == "__main__":
    main()
