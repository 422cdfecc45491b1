#!/bin/sh
# Initializes a cluster in $PGDATA on first start, then runs the server in the foreground as PID 1
# (so `docker stop` reaches it). Follows the official image's variables; unlike it, no temporary
# server is started during initialization (the database is created in single-user mode), so
# "database system is ready to accept connections" is logged exactly once, when it is true.
set -eu

PGDATA=${PGDATA:-/var/lib/postgresql/data}
POSTGRES_USER=${POSTGRES_USER:-postgres}
POSTGRES_DB=${POSTGRES_DB:-$POSTGRES_USER}
export PGDATA

# `docker run IMAGE -c key=value` means `postgres -c key=value`.
if [ "${1:-postgres}" != postgres ] && [ "${1#-}" = "$1" ]; then
  exec "$@"
fi
[ "${1:-}" = postgres ] && shift

if [ "$(id -u)" = 0 ]; then
  mkdir -p "$PGDATA"
  chown postgres:postgres "$PGDATA"
  chmod 700 "$PGDATA"
  exec setpriv --reuid=postgres --regid=postgres --init-groups "$0" postgres "$@"
fi

if [ ! -s "$PGDATA/PG_VERSION" ]; then
  if [ -n "${POSTGRES_HOST_AUTH_METHOD:-}" ]; then
    auth=$POSTGRES_HOST_AUTH_METHOD
  elif [ -n "${POSTGRES_PASSWORD:-}" ]; then
    auth=scram-sha-256
  else
    echo "zuno-postgres: set POSTGRES_PASSWORD (or POSTGRES_HOST_AUTH_METHOD=trust for a private test network)" >&2
    exit 1
  fi
  echo "zuno-postgres: initializing a cluster in $PGDATA (user $POSTGRES_USER, database $POSTGRES_DB, host auth $auth)" >&2
  pwfile=
  if [ -n "${POSTGRES_PASSWORD:-}" ]; then
    pwfile=$(mktemp)
    printf '%s\n' "$POSTGRES_PASSWORD" >"$pwfile"
  fi
  initdb -D "$PGDATA" -U "$POSTGRES_USER" -E UTF8 --locale=C.UTF-8 \
    --auth-local=trust --auth-host="$auth" ${pwfile:+--pwfile="$pwfile"} >/dev/null
  if [ -n "$pwfile" ]; then rm -f "$pwfile"; fi
  # Clients come from the container network, not only loopback.
  {
    echo "host all all 0.0.0.0/0 $auth"
    echo "host all all ::/0 $auth"
  } >>"$PGDATA/pg_hba.conf"
  echo "listen_addresses = '*'" >>"$PGDATA/postgresql.conf"
  if [ "$POSTGRES_DB" != postgres ]; then
    echo "CREATE DATABASE \"$POSTGRES_DB\"" | postgres --single -j -D "$PGDATA" postgres >/dev/null
  fi
fi

exec postgres -D "$PGDATA" "$@"
