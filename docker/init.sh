#!/bin/sh
# The stack's init container (compose.yaml's `init` service): runs once as root before Redis,
# the workers and the CLI start, then exits; they wait for it to succeed. The image itself runs
# as uid 10001, so the steps that need root are done here and nowhere else (the init-container
# pattern, rather than an entrypoint that starts as root and drops privileges in every container).
#
# 1. Refuses REDIS_PASSWORD when it is empty or still docker/.env.example's.
# 2. Makes /data/out (a bind mount of docker/out) writable by uid 10001: the Docker daemon
#    creates a missing bind-mount folder owned by root, so it is given to 10001. A folder you
#    made yourself is left as it is, and refused with the command to run if 10001 cannot write it.
# 3. Keeps /data/bulk (the CLI's data directory, a named volume) owned by 10001 and owner-only.
set -eu

EXAMPLE_PASSWORD="change-me-to-a-long-random-string"  # docker/.env.example's (tests/test_compose.py keeps them equal)
BULK_UID="${BULK_UID:-10001}"
OUT_DIR="${OUT_DIR:-/data/out}"
BULK_DIR="${BULK_DIR:-/data/bulk}"

fail() {
  echo "hermes-bulk init: $1" >&2
  exit 1
}

if [ -z "${REDIS_PASSWORD:-}" ] || [ "$REDIS_PASSWORD" = "$EXAMPLE_PASSWORD" ]; then
  fail "REDIS_PASSWORD in docker/.env is empty or still the example's; set a long random one (for example: openssl rand -hex 24)."
fi

mkdir -p "$OUT_DIR" "$BULK_DIR"
if [ "$(stat -c %u "$OUT_DIR")" = 0 ]; then
  chown "$BULK_UID" "$OUT_DIR"
  chmod u+rwx "$OUT_DIR"
elif ! setpriv --reuid="$BULK_UID" --regid="$BULK_UID" --clear-groups test -w "$OUT_DIR" -a -x "$OUT_DIR"; then
  fail "docker/out (mounted at $OUT_DIR) is owned by uid $(stat -c %u "$OUT_DIR") and uid $BULK_UID cannot write to it; run: sudo chown $BULK_UID docker/out"
fi

chown "$BULK_UID" "$BULK_DIR"
chmod 0700 "$BULK_DIR"
