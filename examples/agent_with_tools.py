"""A CodeAct agent whose code calls a tool that runs in this process (the sandbox holds a stub).

    OPENAI_API_KEY=... python examples/agent_with_tools.py "Average of the AAPL and MSFT prices?"

Any litellm model: `--model gemini/gemini-2.5-flash`, or a local OpenAI-compatible server through
`OPENAI_API_BASE=http://127.0.0.1:8080/v1` (llama.cpp, vLLM, Ollama).
"""

import argparse

from kodeagent import CodeActAgent, tool

PRICES = {"AAPL": 200.0, "MSFT": 400.0, "GOOG": 170.0}


@tool
def get_price(symbol: str) -> float:
    """Latest price of a stock.

    Args:
        symbol: the ticker, e.g. AAPL.
    """
    return PRICES[symbol.upper()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("task", nargs="?", default="Average of the AAPL and MSFT prices?")
    parser.add_argument("--model", default="openai/gpt-4o-mini")
    args = parser.parse_args()
    agent = CodeActAgent(model_name=args.model, tools=[get_price], allowed_imports=["statistics"], timeout=30)
    final = agent.run_sync(args.task)
    print("answer:", final.value)
    print("successful:", final.metadata["task_successful"])
    print(agent.get_usage_report())


if __name__ == "__main__":
    main()
