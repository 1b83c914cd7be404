#!/usr/bin/env bash
# Set up, start `orl serve` on the built-in local models, run one real batch per model role (chat, embeddings,
# OCR), and a small Responses API batch (/v1/responses) on the chat model, and leave their results on disk.
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
field() { .venv/bin/python -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]] or "")' "$1" "$2"; }

# The four batches are created together; each model runs its own (the chat model's two one after the other).
declare -A BATCHES
for job in chat:requests.jsonl:/v1/chat/completions embeddings:embeddings.jsonl:/v1/embeddings \
           ocr:ocr.jsonl:/v1/chat/completions responses:responses.jsonl:/v1/responses; do
  IFS=: read -r name input endpoint <<<"$job"
  mkdir -p "$OUT/$name"
  .venv/bin/orl batches create --input-file "examples/$input" --endpoint "$endpoint" --metadata "job=demo-$name" \
    --rejections-out "$OUT/$name/rejections.jsonl" >"$OUT/$name/batch.json"
  BATCHES[$name]=$(field "$OUT/$name/batch.json" id)
done
for name in chat embeddings ocr responses; do
  .venv/bin/orl batches wait "${BATCHES[$name]}" >"$OUT/$name/batch.json"
  OUTPUT_ID=$(field "$OUT/$name/batch.json" output_file_id)
  ERROR_ID=$(field "$OUT/$name/batch.json" error_file_id)
  [ -n "$OUTPUT_ID" ] && .venv/bin/orl files content get "$OUTPUT_ID" -o "$OUT/$name/results.jsonl" >/dev/null
  [ -n "$ERROR_ID" ] && .venv/bin/orl files content get "$ERROR_ID" -o "$OUT/$name/errors.jsonl" >/dev/null
done
.venv/bin/python - "$OUT" <<'PY'
import json, math, sys
from pathlib import Path

out = Path(sys.argv[1])
def lines(name):
    path = out / name / "results.jsonl"
    return [json.loads(raw) for raw in path.open()] if path.exists() else []

for name in ("chat", "embeddings", "ocr", "responses"):
    b = json.loads((out / name / "batch.json").read_text())
    print(f"{name}: {b['id']} {b['status']}, {b['request_counts']}, usage {b['usage']}", file=sys.stderr)
for line in lines("chat"):
    answer = line["response"]["body"]["choices"][0]["message"]["content"]
    print(f"  {line['custom_id']}: {answer[:100]!r}", file=sys.stderr)
vectors = {l["custom_id"]: l["response"]["body"]["data"][0]["embedding"] for l in lines("embeddings")}
names = sorted(vectors)
for i, a in enumerate(names):
    for b in names[i + 1:]:
        cos = sum(x * y for x, y in zip(vectors[a], vectors[b])) / math.prod(
            math.sqrt(sum(x * x for x in vectors[n])) for n in (a, b))
        print(f"  cosine {a} ~ {b}: {cos:.3f}", file=sys.stderr)
for line in lines("ocr"):
    text = line["response"]["body"]["choices"][0]["message"]["content"]
    print(f"  {line['custom_id']} read:\n    " + text.replace("\n", "\n    "), file=sys.stderr)
for line in lines("responses"):  # a Response object: its message's output_text parts
    body = line["response"]["body"]
    answer = "".join(part["text"] for item in body["output"] if item["type"] == "message"
                     for part in item["content"] if part["type"] == "output_text")
    print(f"  {line['custom_id']} (/v1/responses, {body['status']}): {answer[:100]!r}", file=sys.stderr)
print(f"demo: results in {out}/chat, {out}/embeddings, {out}/ocr and {out}/responses (results.jsonl, batch.json)",
      file=sys.stderr)
PY
