#!/usr/bin/env bash
# Set up, start `orl serve` on the built-in local models, run a real batch, and leave its results on disk.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
DATA=${DATA_DIR:-.openrelay-demo}
OUT=${OUT_DIR:-demo-output}
PORT=$(.venv/bin/python -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
mkdir -p "$OUT"
.venv/bin/orl serve --data-dir "$DATA" --port "$PORT" >"$OUT/serve.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null; wait $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 1 100); do
  curl -fs "http://127.0.0.1:$PORT/healthz" >/dev/null 2>&1 && break
  sleep 0.2
done
export OPENRELAY_BASE_URL="http://127.0.0.1:$PORT/v1"
export OPENRELAY_API_KEY
OPENRELAY_API_KEY=$(cat "$DATA/api-key")
.venv/bin/orl batches create --input-file examples/requests.jsonl --metadata job=demo \
  --rejections-out "$OUT/rejections.jsonl" >"$OUT/batch.json"
BATCH=$(.venv/bin/python -c 'import json,sys; print(json.load(open(sys.argv[1]))["id"])' "$OUT/batch.json")
.venv/bin/orl batches wait "$BATCH" >"$OUT/batch.json"
.venv/bin/python - "$OUT/batch.json" <<'PY'
import json, sys
b = json.load(open(sys.argv[1]))
print(f"{b['id']}: {b['status']}, {b['request_counts']}, usage {b['usage']}", file=sys.stderr)
PY
OUTPUT_ID=$(.venv/bin/python -c 'import json,sys; print(json.load(open(sys.argv[1]))["output_file_id"] or "")' "$OUT/batch.json")
ERROR_ID=$(.venv/bin/python -c 'import json,sys; print(json.load(open(sys.argv[1]))["error_file_id"] or "")' "$OUT/batch.json")
[ -n "$OUTPUT_ID" ] && .venv/bin/orl files content get "$OUTPUT_ID" -o "$OUT/results.jsonl" >/dev/null
[ -n "$ERROR_ID" ] && .venv/bin/orl files content get "$ERROR_ID" -o "$OUT/errors.jsonl" >/dev/null
echo "demo: results in $OUT/results.jsonl${ERROR_ID:+, errors in $OUT/errors.jsonl}" >&2
.venv/bin/python - "$OUT/results.jsonl" <<'PY'
import json, sys
for raw in open(sys.argv[1]):
    line = json.loads(raw)
    answer = line["response"]["body"]["choices"][0]["message"]["content"]
    print(f"  {line['custom_id']}: {answer[:100]!r}", file=sys.stderr)
PY
