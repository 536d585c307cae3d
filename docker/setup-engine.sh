#!/usr/bin/env bash
# Installs and configures podman for tidemq's images and container tests (Debian/Ubuntu, root).
# Idempotent: a second run only checks. Exit 0 once `podman run` works, else 1 with the reason
# on stderr (the last line says what to do).
set -euo pipefail
source "$(dirname "$0")/lib.sh"

# netavark and aardvark-dns are only recommended by podman, but containers find each other by
# name on a user-defined network through them (CNI without the dnsname plugin does not).
PACKAGES=(podman runc netavark aardvark-dns iptables debootstrap uidmap curl)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "podman is not installed: run 'sudo apt-get install ${missing[*]}' (Debian/Ubuntu)" >&2
    exit 1
  fi
  if ! command -v apt-get >/dev/null; then
    echo "podman is not installed and this is not a Debian-like system (no apt-get)" >&2
    exit 1
  fi
  log "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends -o DPkg::Lock::Timeout=300 "${missing[@]}" \
    >"$STATE_DIR/apt.log" || { tail -20 "$STATE_DIR/apt.log" >&2; exit 1; }
fi

write_containers_conf

if ! info=$(podman info --format '{{.Host.OCIRuntime.Name}}' 2>&1); then
  echo "podman is installed but does not work: $info" >&2
  exit 1
fi
log "podman ready ($(podman --version), runtime $info, config $CONTAINERS_CONF)"
