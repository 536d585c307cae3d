#!/usr/bin/env bash
# Builds tidemq's images on this machine from nothing (Debian/Ubuntu, root): installs podman if
# needed, makes the base images with debootstrap (once; they are reused), then
#   ghcr.io/tidemq/tidemq:<appVersion>  docker/Dockerfile         (TIDEMQ_IMAGE to rename)
#   localhost/tidemq-zookeeper:3.8      docker/zookeeper/         (ZOOKEEPER_IMAGE to rename)
# With a registry at hand, `docker build -f docker/Dockerfile .` needs none of this.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

bash "$TIDEMQ_DIR/docker/setup-engine.sh"
bash "$TIDEMQ_DIR/docker/build-base-image.sh"

# pip in the build trusts what this host trusts (a TLS-inspecting proxy's CA, if any).
ca=${PIP_CERT:-${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}}
secret=()
[ -s "$ca" ] && secret=(--secret "id=pip-ca,src=$ca")

# --format docker: the OCI format has no HEALTHCHECK, and podman would drop it.
log "building $TIDEMQ_IMAGE"
podman build -q --format docker --label io.tidemq.build=1 --build-arg "BASE_IMAGE=$PYTHON_BASE_IMAGE" \
  "${secret[@]}" -t "$TIDEMQ_IMAGE" -f "$TIDEMQ_DIR/docker/Dockerfile" "$TIDEMQ_DIR" >/dev/null
if [ "${1:-}" != --tidemq-only ]; then
  log "building $ZOOKEEPER_IMAGE"
  podman build -q --format docker --label io.tidemq.build=1 --build-arg "BASE_IMAGE=$BASE_OS_IMAGE" \
    -t "$ZOOKEEPER_IMAGE" "$TIDEMQ_DIR/docker/zookeeper" >/dev/null
fi
# Earlier builds of these images that no tag points at any more (only ours: the label). Only
# housekeeping: an image an interrupted build's working container still uses stays, and the
# images just built are ready all the same.
if ! podman image prune -f --filter label=io.tidemq.build=1 >/dev/null 2>&1; then
  log "kept earlier builds still in use (an interrupted build's working container)"
fi
log "images ready: $TIDEMQ_IMAGE $ZOOKEEPER_IMAGE"
