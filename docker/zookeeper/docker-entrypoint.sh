#!/bin/sh
# Writes $ZOO_CONF_DIR/zoo.cfg from ZOO_* variables unless one is mounted there, then runs the
# command. The variables and their defaults are those of the official zookeeper image.
set -eu
cfg="$ZOO_CONF_DIR/zoo.cfg"
if [ ! -f "$cfg" ]; then
  {
    echo "dataDir=$ZOO_DATA_DIR"
    echo "dataLogDir=$ZOO_DATA_LOG_DIR"
    echo "tickTime=${ZOO_TICK_TIME:-2000}"
    echo "initLimit=${ZOO_INIT_LIMIT:-5}"
    echo "syncLimit=${ZOO_SYNC_LIMIT:-2}"
    echo "maxClientCnxns=${ZOO_MAX_CLIENT_CNXNS:-60}"
    echo "autopurge.snapRetainCount=${ZOO_AUTOPURGE_SNAPRETAINCOUNT:-3}"
    echo "autopurge.purgeInterval=${ZOO_AUTOPURGE_PURGEINTERVAL:-0}"
    echo "4lw.commands.whitelist=${ZOO_4LW_COMMANDS_WHITELIST:-srvr}"
    echo "standaloneEnabled=${ZOO_STANDALONE_ENABLED:-true}"
    # Debian's jars lack the servlet API the admin server needs.
    echo "admin.enableServer=false"
    if [ -n "${ZOO_SERVERS:-}" ]; then
      for server in $ZOO_SERVERS; do echo "$server"; done
    else
      echo "server.1=localhost:2888:3888;2181"
    fi
  } >"$cfg"
fi
if [ ! -f "$ZOO_DATA_DIR/myid" ]; then
  echo "${ZOO_MY_ID:-1}" >"$ZOO_DATA_DIR/myid"
fi
exec "$@"
