#!/bin/sh
# `zkServer.sh start-foreground` as the official image runs it: the server in this process
# (exec: SIGTERM reaches the JVM), logging to the console.
set -eu
if [ "${1:-}" != start-foreground ]; then
  echo "this image runs ZooKeeper in the foreground only: zkServer.sh start-foreground" >&2
  exit 2
fi
J=/usr/share/java
# JVMFLAGS is a list of options: split on purpose.
# shellcheck disable=SC2086
exec java ${JVMFLAGS:--Xmx256m -XX:+UseSerialGC} \
  -cp "$J/zookeeper.jar:$J/slf4j-log4j12.jar:$J/log4j-1.2.jar" \
  -Dlog4j.configuration=file:/usr/local/share/zookeeper-log4j.properties \
  org.apache.zookeeper.server.quorum.QuorumPeerMain "$ZOO_CONF_DIR/zoo.cfg"
