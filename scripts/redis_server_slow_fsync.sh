#!/bin/sh
# redis-server with every fdatasync slowed by $SLOW_FSYNC_US microseconds (1.5 s by default),
# through strace's fault injection: a disk that syncs slowly, on demand. Point
# $HEADSTART_REDIS_SERVER at this file and every Redis headstart starts (tests, serve,
# loadtest) runs under it. `-D` keeps redis-server the process started (same pid: a SIGKILL
# is a crash of the server) with strace as a detached grandchild; `-f` follows Redis's
# background threads, where `appendfsync everysec` syncs.
set -eu
server=$(command -v redis-server || command -v valkey-server) || {
    echo "redis_server_slow_fsync.sh: no redis-server or valkey-server on PATH" >&2; exit 127; }
command -v strace >/dev/null || { echo "redis_server_slow_fsync.sh: strace is not installed" >&2; exit 127; }
exec strace -D -f -qq -o /dev/null -e trace=fdatasync \
    -e inject=fdatasync:delay_enter="${SLOW_FSYNC_US:-1500000}" "$server" "$@"
