#!/usr/bin/env bash
# Runs a command (make test: pytest) with tidemq's container engine ready for testcontainers:
# podman installed and configured, the base and tidemq images built (docker/build-image.sh;
# cached), podman's Docker-compatible API on a socket of this checkout, and the environment
# testcontainers needs. Afterwards removes the containers and networks tidemq.testing made in
# this run and stops the API service it started. The command's exit code is returned.
#
# When no engine can be made to work, the command still runs with TIDEMQ_CONTAINERS_UNAVAILABLE
# set to the reason: the container tests skip with it, and every other test runs.
set -uo pipefail
source "$(dirname "$0")/lib.sh"

unavailable() {
  echo "container engine unavailable: $1" >&2
  export TIDEMQ_CONTAINERS_UNAVAILABLE="$1"
}

service_pid=""
if ! out=$(bash "$TIDEMQ_DIR/docker/build-image.sh" 2>&1 >/dev/null); then
  printf '%s\n' "$out" >&2
  unavailable "$(printf '%s\n' "$out" | tail -1)"
else
  printf '%s\n' "$out" >&2
  mkdir -p "$(dirname "$SOCKET_PATH")"
  if ! curl -sf --unix-socket "$SOCKET_PATH" http://d/_ping >/dev/null 2>&1; then
    rm -f "$SOCKET_PATH"
    podman system service --time=0 "unix://$SOCKET_PATH" >"$STATE_DIR/podman-service.log" 2>&1 &
    service_pid=$!
    for _ in $(seq 100); do
      curl -sf --unix-socket "$SOCKET_PATH" http://d/_ping >/dev/null 2>&1 && break
      sleep 0.1
    done
  fi
  if ! curl -sf --unix-socket "$SOCKET_PATH" http://d/_ping >/dev/null 2>&1; then
    unavailable "podman's API did not answer on $SOCKET_PATH: $(tail -3 "$STATE_DIR/podman-service.log")"
  else
    export DOCKER_HOST="unix://$SOCKET_PATH"
    # No Ryuk (its image cannot be pulled): tidemq.testing removes what it starts, and so does
    # the cleanup below. /.dockerenv on this machine type would make testcontainers look for a
    # gateway it does not need.
    export TESTCONTAINERS_RYUK_DISABLED=true
    export TESTCONTAINERS_CONNECTION_MODE=docker_host
    export TIDEMQ_TEST_IMAGE="$TIDEMQ_IMAGE"
    export TIDEMQ_TEST_ZOOKEEPER_IMAGE="$ZOOKEEPER_IMAGE"
    export TIDEMQ_TESTING_RUN="run-$$-$RANDOM"
  fi
fi

"$@"
rc=$?

if [ -n "${TIDEMQ_TESTING_RUN:-}" ]; then
  filter="label=io.tidemq.testing.run=$TIDEMQ_TESTING_RUN"
  left=$(podman ps -aq --filter "$filter")
  if [ -n "$left" ]; then
    echo "removing $(echo "$left" | wc -w) container(s) this run left behind" >&2
    # shellcheck disable=SC2086
    podman rm -f -v $left >/dev/null
  fi
  for net in $(podman network ls -q --filter "$filter"); do podman network rm -f "$net" >/dev/null; done
fi
if [ -n "$service_pid" ]; then
  kill "$service_pid" 2>/dev/null
  wait "$service_pid" 2>/dev/null
  rm -f "$SOCKET_PATH"
fi
exit $rc
