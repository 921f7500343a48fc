#!/bin/sh
# The GCS fault-tolerance Redis of docker-compose.gcs-ft.yaml (Dockerfile.redis).
#
# The password: made at the first start from the kernel's random source into
# /secret/password (a volume of its own, the redis user's, 0600), which the
# heads mount read-only and read through ARGUS_GCS_FT_REDIS_PASSWORD_FILE.
# redis-server takes it on stdin as configuration, never on its command line.
# Everything stays in memory (no RDB, no append-only file). Arguments are
# redis-server options after these (docs/deploy.md's host-network Redis:
# `--bind <head IP> --port 6390`); a `--requirepass` there wins over the
# generated one.
set -eu
umask 077
f=/secret/password
if [ ! -s "$f" ]; then
    head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$f.tmp"
    mv "$f.tmp" "$f"
fi
exec redis-server - --bind 0.0.0.0 --port 6379 --save "" --appendonly no "$@" <<CONF
requirepass $(cat "$f")
CONF
