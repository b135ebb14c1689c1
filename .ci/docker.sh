#!/usr/bin/env bash
# Make Docker usable for the tests, idempotently: install docker.io if missing, start dockerd if it is
# not running, wait until it answers, then build the sandbox images the tests need. The build is
# content-addressed: when nothing that goes into an image changed, it is reused in about a second.
#
# Needs root (apt-get, dockerd, debootstrap). Docker Hub is not needed: without it the base image is
# made from the Debian mirror apt uses (see images/README.md). Safe to run again and again.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { echo "[docker.sh] $*" >&2; }

if [ "$(id -u)" != 0 ]; then
    log "not root: cannot install or start Docker; the Docker tests will skip (or fail under CI=true)"
    exit 1
fi

if ! command -v dockerd >/dev/null || ! command -v debootstrap >/dev/null; then
    log "installing docker.io and debootstrap"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io debootstrap >/dev/null
fi

if ! docker info >/dev/null 2>&1; then
    if ! pgrep -x dockerd >/dev/null; then
        log "starting dockerd (log: /tmp/dockerd.log)"
        nohup dockerd >/tmp/dockerd.log 2>&1 &
    fi
    for _ in $(seq 1 60); do
        docker info >/dev/null 2>&1 && break
        sleep 0.5
    done
    if ! docker info >/dev/null 2>&1; then
        log "dockerd did not come up in 30 s; last lines of /tmp/dockerd.log:"
        tail -n 20 /tmp/dockerd.log >&2 || true
        exit 1
    fi
fi
log "Docker is up: $(docker version --format '{{.Server.Version}}' 2>/dev/null)"

# Docker Hub when reachable, else the offline Debian base (the images module decides; see --offline).
python3 -m sandboxes.images build
python3 -m sandboxes.images build --variant datascience
# Containers left behind by earlier runs whose parent process died, and superseded image builds.
python3 -m sandboxes.images cleanup --images >/dev/null
