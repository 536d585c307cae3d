#!/usr/bin/env bash
# Builds the base images tidemq's images start from on a machine with no container registry:
#   localhost/tidemq-debian:bookworm        Debian bookworm minbase, made by debootstrap
#   localhost/tidemq-python:3.11-bookworm   that plus python3 and venv (what python:3.11-slim gives)
# Each is skipped when it already exists (--force rebuilds both). Needs root and the Debian mirror.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

force=0
[ "${1:-}" = --force ] && force=1

if [ $force = 1 ] || ! image_exists "$BASE_OS_IMAGE"; then
  rootfs=$(mktemp -d /var/tmp/tidemq-rootfs.XXXXXX)
  trap 'rm -rf "$rootfs"' EXIT
  log "debootstrap bookworm (minbase) from $(debian_mirror): about 2 minutes"
  debootstrap --variant=minbase bookworm "$rootfs" "$(debian_mirror)" >"$STATE_DIR/debootstrap.log" 2>&1 \
    || { tail -20 "$STATE_DIR/debootstrap.log" >&2; exit 1; }
  # Security and point-release updates, as the official Debian images have them.
  cat >"$rootfs/etc/apt/sources.list" <<SOURCES
deb $(debian_mirror) bookworm main
deb $(debian_mirror) bookworm-updates main
deb http://deb.debian.org/debian-security bookworm-security main
SOURCES
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/lib/apt/lists/*
  tar -C "$rootfs" -c . | podman import -q --change 'CMD ["/bin/bash"]' - "$BASE_OS_IMAGE" >/dev/null
  rm -rf "$rootfs"
  log "imported $BASE_OS_IMAGE"
fi

# A container must start before anything is built on top: say exactly why when it cannot.
if ! out=$(podman run --rm --network none "$BASE_OS_IMAGE" true 2>&1); then
  echo "podman cannot start a container: $out" >&2
  exit 1
fi

if [ $force = 1 ] || ! image_exists "$PYTHON_BASE_IMAGE"; then
  log "building $PYTHON_BASE_IMAGE"
  podman build -q --build-arg "BASE_IMAGE=$BASE_OS_IMAGE" -t "$PYTHON_BASE_IMAGE" \
    -f "$TIDEMQ_DIR/docker/python-base/Dockerfile" "$TIDEMQ_DIR/docker/python-base" >/dev/null
fi
log "base images ready: $BASE_OS_IMAGE $PYTHON_BASE_IMAGE"
