#!/usr/bin/env bash
# Set up, then run the whole suite twice, on SQLite and on PostgreSQL (a fresh database per server), side by side:
# most of a test's time is spent waiting on servers and engines, so the two passes share the cores well. The
# PostgreSQL pass runs only the tests that can tell the stores apart (tests/conftest.py). Each pass has its own
# temporary directory and its own range of ports (tests/support/server.py, free_port); its output is printed when
# both have ended. Each pass runs its test files in OPENRELAY_TEST_WORKERS processes (pytest-xdist, a file to a
# process, so a module's server is started once). Extra arguments go to both pytest runs.
#   --unit  the unit tier: tests/unit, in process on SQLite files (no server, no engine process; the engine
#           replaced at its boundary, tests/support/relay.py)
#   --fast  the fast tier: SQLite only, without the tests marked `slow` (built-in models, Chromium, SeaweedFS,
#           llama-server, fuzzing, schemathesis)
set -euo pipefail
cd "$(dirname "$0")/.."
stores=(sqlite postgres)
select=()
tier="every test"
workers="${OPENRELAY_TEST_WORKERS:-2}"
dist=loadfile
needs_postgres=1  # the SQLite pass too: a few tests are about PostgreSQL itself (its outages, its change notices)
if [[ "${1:-}" == "--unit" ]]; then
  shift
  stores=(sqlite)
  select=(tests/unit)
  tier="the unit tier (tests/unit)"
  dist=load  # no server for a module to share: any test to any process
  needs_postgres=0
elif [[ "${1:-}" == "--fast" ]]; then
  shift
  stores=(sqlite)
  select=(-m "not slow")
  tier="the fast tier (not slow)"
  workers="${OPENRELAY_TEST_WORKERS:-4}"
fi
bash scripts/setup.sh
if [[ "$needs_postgres" == 1 ]] && ! pg_isready -h 127.0.0.1 -p 5432 -q 2>/dev/null; then
  # CI machines start PostgreSQL before the run; start it if it stopped.
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql)" main start || true
fi
.venv/bin/ruff check openrelay tests bench
.venv/bin/mypy openrelay  # configured in pyproject.toml ([tool.mypy])
runs="$(mktemp -d /tmp/orl-suite-XXXXXX)"
trap 'rm -rf "$runs"' EXIT
echo "== $tier on ${stores[*]}, side by side, $workers processes each (started $(date +%T)) ==" >&2
pids=()
for store in "${stores[@]}"; do
  OPENRELAY_TEST_DB="$store" .venv/bin/python -m pytest -q -p no:cacheprovider --basetemp="$runs/$store" \
    -n "$workers" --dist "$dist" ${select[@]+"${select[@]}"} "$@" > "$runs/$store.log" 2>&1 &
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
