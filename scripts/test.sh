#!/usr/bin/env bash
# Set up, then run the whole suite twice, on SQLite and on PostgreSQL (a fresh database per server), side by side:
# most of a test's time is spent waiting on servers and engines, so the two passes share the cores well. Each pass
# has its own temporary directory and its own range of ports (tests/support/server.py, free_port); its output is
# printed when both have ended. Extra arguments go to both pytest runs.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if ! pg_isready -h 127.0.0.1 -p 5432 -q 2>/dev/null; then
  # CI machines start PostgreSQL before the run; start it if it stopped.
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql)" main start || true
fi
.venv/bin/ruff check openrelay tests bench
runs="$(mktemp -d /tmp/orl-suite-XXXXXX)"
trap 'rm -rf "$runs"' EXIT
echo "== store: SQLite and PostgreSQL, side by side (started $(date +%T)) ==" >&2
stores=(sqlite postgres)
pids=()
for store in "${stores[@]}"; do
  OPENRELAY_TEST_DB="$store" .venv/bin/python -m pytest -q -p no:cacheprovider --basetemp="$runs/$store" "$@" \
    > "$runs/$store.log" 2>&1 &
  pids+=("$!")
done
failed=0
for i in "${!stores[@]}"; do
  store="${stores[$i]}"
  if ! wait "${pids[$i]}"; then failed=1; fi
  echo "== store: $store ==" >&2
  cat "$runs/$store.log"
done
echo "== ended $(date +%T) ==" >&2
exit "$failed"
