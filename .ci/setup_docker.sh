#!/usr/bin/env bash
# Docker engine + the project's sandbox image, for the `docker`-marked tests (tests/sandbox/).
#
# Idempotent; run as root from the repo root on Debian bookworm. Registries cannot be reached, so
# the base image is a debootstrap minbase rootfs (with python3) made from the Debian mirror apt
# uses, `docker import`ed, then `docker build` adds the non-root user and the shipped task repos.
# Skips what is already there: a daemon that answers, an image tag that exists.
#   AGENTBATCH_SANDBOX_IMAGE  image tag to build (default agentbatch-sandbox:1)
#   AGENTBATCH_REBUILD=1      rebuild the image even when the tag exists
#   DOCKERD_LOG               dockerd log file (default /var/log/agentbatch-dockerd.log)
set -euo pipefail

IMAGE="${AGENTBATCH_SANDBOX_IMAGE:-agentbatch-sandbox:1}"
BASE_IMAGE="agentbatch-base:bookworm"
LOG="${DOCKERD_LOG:-/var/log/agentbatch-dockerd.log}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export DEBIAN_FRONTEND=noninteractive
export DOCKER_BUILDKIT=0  # the legacy builder needs no buildx plugin

log() { echo "[setup_docker] $*" >&2; }

if ! command -v dockerd >/dev/null 2>&1; then
  log "installing docker.io from Debian"
  apt-get update -qq
  # policy-rc.d keeps apt from trying to start services on machines without systemd
  [ -e /usr/sbin/policy-rc.d ] || { printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d; chmod +x /usr/sbin/policy-rc.d; trap 'rm -f /usr/sbin/policy-rc.d' EXIT; }
  apt-get install -y -qq --no-install-recommends docker.io iptables ca-certificates >/dev/null
fi

if ! docker info >/dev/null 2>&1; then
  log "starting dockerd (log: $LOG)"
  # iptables may be missing or unusable in a VM without the nat module; fall back to no bridge NAT.
  extra=()
  if ! iptables -t nat -L >/dev/null 2>&1; then extra=(--iptables=false); fi
  nohup dockerd --storage-driver overlay2 "${extra[@]}" >>"$LOG" 2>&1 &
  for _ in $(seq 1 60); do
    docker info >/dev/null 2>&1 && break
    sleep 1
  done
  docker info >/dev/null 2>&1 || { log "dockerd did not come up in 60 s; tail of $LOG:"; tail -n 30 "$LOG" >&2; exit 1; }
fi

if [ "${AGENTBATCH_REBUILD:-0}" != "1" ] && docker image inspect "$IMAGE" >/dev/null 2>&1; then
  log "image $IMAGE exists; nothing to build"
  exit 0
fi

if [ "${AGENTBATCH_REBUILD:-0}" = "1" ] || ! docker image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
  command -v debootstrap >/dev/null 2>&1 || { apt-get update -qq; apt-get install -y -qq --no-install-recommends debootstrap >/dev/null; }
  # Same mirror as apt's own sources (deb822 or one-line format), else deb.debian.org.
  MIRROR="$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources 2>/dev/null \
            | awk '$1 ~ /^(URIs:|deb)$/ && $2 ~ /\/debian\/?$/ { print $2; exit }' || true)"
  MIRROR="${MIRROR:-http://deb.debian.org/debian}"
  ROOTFS="$(mktemp -d /tmp/agentbatch-rootfs.XXXXXX)"
  log "debootstrap minbase bookworm from $MIRROR into $ROOTFS"
  debootstrap --variant=minbase --include=python3 bookworm "$ROOTFS" "$MIRROR" >/tmp/agentbatch-debootstrap.log 2>&1 \
    || { tail -n 30 /tmp/agentbatch-debootstrap.log >&2; exit 1; }
  # Smaller image: no apt lists, docs, man pages or caches.
  rm -rf "$ROOTFS"/var/lib/apt/lists/* "$ROOTFS"/var/cache/apt/* "$ROOTFS"/usr/share/doc/* \
         "$ROOTFS"/usr/share/man/* "$ROOTFS"/usr/share/locale/*
  tar -C "$ROOTFS" -c . | docker import - "$BASE_IMAGE" >/dev/null
  rm -rf "$ROOTFS"
  log "imported $BASE_IMAGE"
fi

CTX="$(mktemp -d /tmp/agentbatch-image.XXXXXX)"
cp "$HERE/agentbatch/environments/bash_tasks/Dockerfile" "$CTX/Dockerfile"
"${PYTHON:-$HERE/.venv/bin/python}" -m agentbatch.environments.bash_tasks.catalog export "$CTX/tasks" 2>/dev/null \
  || python3 "$HERE/agentbatch/environments/bash_tasks/catalog.py" export "$CTX/tasks"
docker build -q --build-arg BASE="$BASE_IMAGE" -t "$IMAGE" "$CTX" >/dev/null
rm -rf "$CTX"
log "built $IMAGE"
