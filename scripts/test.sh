#!/usr/bin/env bash
# The README's test command: install what the suite needs (scripts/install.sh), then run it.
# `bash scripts/test.sh tests/unit` runs only the fast tier.
set -euo pipefail
cd "$(dirname "$0")/.."
export LITELLM_LOCAL_MODEL_COST_MAP=True
bash scripts/install.sh
python3 -m pytest -q "$@"
