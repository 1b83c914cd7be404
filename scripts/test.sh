#!/usr/bin/env bash
# Set up, then run the whole suite twice: on SQLite and on PostgreSQL (a fresh database per server).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if ! pg_isready -h 127.0.0.1 -p 5432 -q 2>/dev/null; then
  # CI machines start PostgreSQL before the run; start it if it stopped.
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql)" main start || true
fi
.venv/bin/ruff check openrelay tests bench
echo "== store: SQLite ==" >&2
OPENRELAY_TEST_DB=sqlite .venv/bin/python -m pytest -q "$@"
echo "== store: PostgreSQL ==" >&2
OPENRELAY_TEST_DB=postgres .venv/bin/python -m pytest -q "$@"
