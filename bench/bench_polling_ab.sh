#!/bin/bash
# The polling benchmark before and after the batch object's openrelay numbers (issue 14 part 4), alternated on the
# same machine in the same minutes: "before" is a copy of this tree's package with the four batch routes of
# api/app.py as they were without the numbers (orl serve picks it up through PYTHONPATH), "after" the tree itself.
#     bench/bench_polling_ab.sh [--postgres]     (extra arguments go to bench_polling.py)
set -e
repo=$(cd "$(dirname "$0")/.." && pwd)
before=$(mktemp -d /tmp/orl-before-XXXXXX)
trap 'rm -rf "$before"' EXIT
cp -r "$repo/openrelay" "$before/"
"$repo/.venv/bin/python" - "$before/openrelay/api/app.py" <<'PY'
import sys
path = sys.argv[1]
text = open(path).read()
for old, new in [
    ("progress_service.page_answer_plan,\n                                   limit=",
     "batch_service.list_batches_plan,\n                                   limit="),
    ("_json(await by_plan(request, progress_service.batch_answer_plan, batch_id))",
     "_json((await by_plan(request, batch_service.get_batch_plan, batch_id)).as_api())"),
    ("lambda: progress_service.answer_of(rt, batch_service.cancel_batch(rt, key, batch_id))",
     "lambda: batch_service.cancel_batch(rt, key, batch_id).as_api()"),
    ("lambda: progress_service.answer_of(rt, batch_service.replace_metadata(rt, key, batch_id, raw))",
     "lambda: batch_service.replace_metadata(rt, key, batch_id, raw).as_api()"),
]:
    assert text.count(old) == 1, old
    text = text.replace(old, new)
open(path, "w").write(text)
PY
cd /tmp
for i in 1 2; do
  for side in before after; do
    echo "=== $side ($i) $*"
    if [ "$side" = before ]; then export PYTHONPATH="$before"; else unset PYTHONPATH; fi
    "$repo/.venv/bin/python" "$repo/bench/bench_polling.py" --duration 5 --rounds 2 "$@" 2>&1 \
      | grep -E "store:|ratio to healthz|round"
  done
done
