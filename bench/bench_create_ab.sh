#!/bin/bash
# The create benchmark (bench_batches.py --create-only) on an earlier commit ("before") and on this tree ("after"),
# alternated in the same minutes so that the machine's load hits both alike; the load average is printed beside
# each run, and at the end the median and the spread of each side's ratios (create over HTTP / orjson parse).
#     bench/bench_create_ab.sh REV [ROUNDS] [bench_batches.py arguments, e.g. --workload plain --repeat 9]
set -e
repo=$(cd "$(dirname "$0")/.." && pwd)
rev=${1:?a git revision to compare with}
rounds=${2:-4}
shift $(( $# < 2 ? $# : 2 ))
before=$(mktemp -d /tmp/orl-before-XXXXXX)
out=$(mktemp /tmp/orl-ab-XXXXXX)
trap 'rm -rf "$before" "$out"' EXIT
git -C "$repo" archive "$rev" | tar -x -C "$before"
cd /tmp
for i in $(seq "$rounds"); do
  for side in before after; do
    tree=$repo
    [ "$side" = before ] && tree=$before
    load=$(cut -d' ' -f1 /proc/loadavg)
    # bench_batches.py puts its own tree first on sys.path; PYTHONPATH does so for the `orl serve` it starts
    PYTHONPATH="$tree" "$repo/.venv/bin/python" "$tree/bench/bench_batches.py" --create-only "$@" \
      | grep -E "^create" | sed "s/^/$side $i (load $load): /" | tee -a "$out"
  done
done
for side in before after; do
  grep "^$side" "$out" | sed -E 's/.*ratio ([0-9.]+)x.*/\1/' | sort -n \
    | awk -v side="$side" '{r[NR]=$1} END {m = NR % 2 ? r[(NR+1)/2] : (r[NR/2] + r[NR/2+1]) / 2;
        printf "%s: median ratio %.2fx, spread %.2fx-%.2fx over %d runs\n", side, m, r[1], r[NR], NR}'
done
