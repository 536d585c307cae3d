# Shared by the docker/*.sh scripts (sourced, not run): where the container engine's state lives
# and how to reach it. Podman runs rootful here; see ../shared/guides/containers.md for why each
# setting exists.

TIDEMQ_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
STATE_DIR=${TIDEMQ_CONTAINERS_STATE:-$TIDEMQ_DIR/.containers}
mkdir -p "$STATE_DIR"

# Our own containers.conf instead of editing /etc/containers: podman's defaults (crun, ulimits
# above the sandbox's hard limits) cannot start a container on this machine type.
export CONTAINERS_CONF="$STATE_DIR/containers.conf"

# One API socket per checkout, so two checkouts' test runs never stop each other's service.
SOCKET_ID=$(printf '%s' "$TIDEMQ_DIR" | md5sum | cut -c1-10)
SOCKET_PATH=/run/tidemq-podman/$SOCKET_ID.sock

BASE_OS_IMAGE=localhost/tidemq-debian:bookworm
PYTHON_BASE_IMAGE=localhost/tidemq-python:3.11-bookworm
# The reference the chart pulls by default (helm/tidemq/values.yaml image.*, tag = the chart's
# appVersion), so what `make image` builds is what `podman push` publishes.
TIDEMQ_VERSION=$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\} *$/\1/p' "$TIDEMQ_DIR/helm/tidemq/Chart.yaml")
TIDEMQ_IMAGE=${TIDEMQ_IMAGE:-ghcr.io/tidemq/tidemq:$TIDEMQ_VERSION}
ZOOKEEPER_IMAGE=${ZOOKEEPER_IMAGE:-localhost/tidemq-zookeeper:3.8}

log() { printf '%s %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

debian_mirror() {
  local m
  m=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
  echo "${m:-http://deb.debian.org/debian}"
}

# The hard limits of this shell, capped where runc cannot go above them (nproc 32768 is what
# podman's own processes get here). A container asking for more fails with "setrlimit".
write_containers_conf() {
  local nofile nproc
  nofile=$(ulimit -Hn); nproc=$(ulimit -Hu)
  if [ "$nofile" = unlimited ] || [ "$nofile" -gt 1048576 ]; then nofile=1048576; fi
  if [ "$nproc" = unlimited ] || [ "$nproc" -gt 32768 ]; then nproc=32768; fi
  cat >"$CONTAINERS_CONF.tmp" <<CONF
# Written by docker/lib.sh. crun refuses hybrid cgroup hosts; runc works.
[containers]
default_ulimits = ["nofile=${nofile}:${nofile}", "nproc=${nproc}:${nproc}"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
[network]
network_backend = "netavark"
CONF
  mv "$CONTAINERS_CONF.tmp" "$CONTAINERS_CONF"
}

image_exists() { podman image exists "$1" 2>/dev/null; }
