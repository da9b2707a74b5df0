#!/bin/sh
# The official image's contract, for Debian's PostgreSQL 15: on an empty data directory, initdb with
# POSTGRES_USER (default postgres) as the superuser and POSTGRES_PASSWORD (or the file POSTGRES_PASSWORD_FILE
# names) as its password, create POSTGRES_DB (default: the user's name), accept password logins (scram-sha-256)
# from any address; then run the server as the postgres user. A data directory that is already initialised is
# used as it is: the variables only matter the first time, as with the official image.
set -eu

if [ -n "${POSTGRES_PASSWORD_FILE:-}" ]; then
    [ -z "${POSTGRES_PASSWORD:-}" ] || { echo "error: both POSTGRES_PASSWORD and POSTGRES_PASSWORD_FILE are set" >&2; exit 1; }
    POSTGRES_PASSWORD=$(cat "$POSTGRES_PASSWORD_FILE")
fi
POSTGRES_USER=${POSTGRES_USER:-postgres}
POSTGRES_DB=${POSTGRES_DB:-$POSTGRES_USER}
PGDATA=${PGDATA:-/var/lib/postgresql/data}
export PGDATA

if [ "$(id -u)" = 0 ]; then
    # A fresh volume belongs to root: hand it to postgres, then re-run this script as postgres.
    mkdir -p "$PGDATA" /var/run/postgresql
    chown postgres:postgres "$PGDATA" /var/run/postgresql
    chmod 700 "$PGDATA"
    exec setpriv --reuid=postgres --regid=postgres --init-groups "$0" "$@"
fi

if [ ! -s "$PGDATA/PG_VERSION" ]; then
    if [ -z "${POSTGRES_PASSWORD:-}" ]; then
        echo "error: database is uninitialized and no password is set: set POSTGRES_PASSWORD or POSTGRES_PASSWORD_FILE" >&2
        exit 1
    fi
    pwfile=$(mktemp)
    printf '%s\n' "$POSTGRES_PASSWORD" > "$pwfile"
    initdb --username="$POSTGRES_USER" --pwfile="$pwfile" --auth-local=trust --auth-host=scram-sha-256 \
        --encoding=UTF8 --locale=C.UTF-8 >/dev/null
    rm -f "$pwfile"
    printf "listen_addresses = '*'\n" >> "$PGDATA/postgresql.conf"
    printf 'host all all 0.0.0.0/0 scram-sha-256\nhost all all ::/0 scram-sha-256\n' >> "$PGDATA/pg_hba.conf"
    if [ "$POSTGRES_DB" != postgres ]; then
        # Started on the socket only, so no client sees a half-made database.
        pg_ctl -o "-c listen_addresses=''" -w start >/dev/null
        psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname postgres \
            -c "CREATE DATABASE \"$POSTGRES_DB\"" >/dev/null
        pg_ctl -m fast -w stop >/dev/null
    fi
    echo "entrypoint: initialised $PGDATA (user $POSTGRES_USER, database $POSTGRES_DB)"
fi

if [ "${1:-}" = postgres ]; then
    shift
    exec postgres "$@"
fi
exec "$@"
