"""Benchmarks for kodeagent: HumanEval execution, latency, security corpus and agent task sets.

Each benchmark is a module with a `main(argv)` (so `python -m benchmarks.<name>` works) and a
`run(...)` function that returns a JSON-ready dict (what the `kodeagent bench` command calls). Speed
is always reported against a baseline measured in the same run, as medians and p95; the test suite
only smoke-tests these modules and never asserts a time.
"""
