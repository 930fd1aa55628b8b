#!/usr/bin/env bash
# Issue 42 item 1's record: run CI (`bash .ci/run`) on fresh clones of main, one after another, and append one
# JSON line per run (commit, exit status, pytest's summary line, wall seconds, load average) to RECORD.
# Each run clones main's newest commit at its start, so the record shows which commit each green or red run tested.
#   usage: scripts/ci_repeat.sh RUNS RECORD.jsonl [REPO]
set -uo pipefail
runs=${1:?number of runs}; record=${2:?record file (.jsonl)}; repo=${3:-$(cd "$(dirname "$0")/.." && pwd)}
record=$(realpath -m "$record"); mkdir -p "$(dirname "$record")"
for i in $(seq 1 "$runs"); do
  dir=$(mktemp -d /tmp/ci_repeat.XXXXXX)
  git clone -q "$repo" "$dir/h3" || { echo "run $i: clone failed" >&2; exit 1; }
  commit=$(git -C "$dir/h3" rev-parse --short HEAD)
  echo "ci_repeat: run $i/$runs on $commit in $dir/h3 (log $dir/ci.log)" >&2
  start=$(date +%s); started=$(date -u +%FT%TZ)
  (cd "$dir/h3" && bash .ci/run) > "$dir/ci.log" 2>&1; rc=$?
  secs=$(( $(date +%s) - start ))
  summary=$(grep -E '^[=]* ?[0-9]+ (passed|failed)|[0-9]+ passed' "$dir/ci.log" | tail -1 | tr -d '=' | sed 's/^ *//;s/ *$//')
  load=$(cut -d' ' -f1-3 /proc/loadavg)
  printf '{"run": %d, "commit": "%s", "started": "%s", "rc": %d, "summary": "%s", "wall_s": %d, "loadavg_at_end": "%s"}\n' \
    "$i" "$commit" "$started" "$rc" "$summary" "$secs" "$load" >> "$record"
  echo "ci_repeat: run $i/$runs rc=$rc ($summary) in ${secs}s" >&2
  if [ "$rc" -ne 0 ]; then cp "$dir/ci.log" "${record%.jsonl}_${commit}_failed.log"; fi
  sed -n '/slowest 20 durations/,/^=/p' "$dir/ci.log" > "${record%.jsonl}_slowest_${commit}.txt"  # where the time goes
  rm -rf "$dir"
done
