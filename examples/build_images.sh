#!/usr/bin/env bash
# Build the Docker sandbox images (`kodeagent-sandbox:py`, and `:datascience` with numpy/pandas),
# then list them. Cheap when nothing changed; `--offline` makes the base image from a Debian mirror
# when Docker Hub is out of reach. Extra arguments go to `kodeagent images build` (try --help).
#
#     bash examples/build_images.sh [--variant datascience] [--offline]
set -euo pipefail
kodeagent images build "$@"
kodeagent images list
