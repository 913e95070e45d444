#!/usr/bin/env bash
# The adapter layer on XQuAD-R (six languages pooled): modes x query encoder (teacher, shipped
# student) x reranking (none, teacher) x language-bias correction (off, on) x translation
# consensus (off, on), then prefer.
# Writes benchmarks/results/eval/{report.md,report.json,heatmap-*.svg} and
# benchmarks/results/eval-prefer/. About half an hour on a 2-core machine; run nothing else
# meanwhile (two torch jobs on two cores slow each other down many times over).
# Env: VECPLUG (default: the repository's .venv), STUDENT (default: me5-small-student-k6),
#      INDEX (default: a temporary folder; give one to reuse the encoded pool).
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
STUDENT="${STUDENT:-me5-small-student-k6}"
index="${INDEX:-$tmp/xquad-r}"
mkdir -p "$here/results"
"$VECPLUG" eval "$data" --index "$index" --query-encoder me5-small --query-encoder "$STUDENT" \
    --mode xy --mode mono --rerank none --rerank teacher --debias both --consensus both \
    --out "$tmp/eval" --summary-only -q > "$tmp/eval.md"
"$VECPLUG" eval "$data" --index "$index" --query-encoder "$STUDENT" --mode prefer \
    --debias both --consensus both --out "$tmp/eval-prefer" --summary-only -q > "$tmp/eval-prefer.md"
# results replace the previous ones only when both runs finished
for name in eval eval-prefer; do
    rm -rf "$here/results/$name"
    mv "$tmp/$name" "$here/results/$name"
done
cat "$here/results/eval/report.md" "$here/results/eval-prefer/report.md"
