#!/usr/bin/env bash
# The teacher's own queries in int8 under torch (`--int8` with a document encoder as query
# encoder: the documents' recipe, indexer/torch_int8_documents.py, on FBGEMM's kernels) against
# float32 queries, on the same XQuAD-R index (six languages pooled, me5-small documents):
# X-Y mAP@20 with and without the language-bias correction, through `vecplug eval`.
# Writes benchmarks/results/eval_teacher_int8/<run>/report.md and .json and a summary,
# eval_teacher_int8.md. About 6 minutes on a 2-core machine.
# Env: VECPLUG (default: the repository's .venv), INDEX (default: a temporary folder; give it
#      to reuse an encoded pool, e.g. the one benchmarks/eval.sh builds).
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
index="${INDEX:-$tmp/xquad-r}"
out="$tmp/eval_teacher_int8"
mkdir -p "$out"

run() {  # name, then VAR=value settings for this run
    local name="$1"
    shift
    env "$@" "$VECPLUG" eval "$data" --index "$index" --query-encoder me5-small --mode xy \
        --debias both --out "$out/$name" --summary-only -q > /dev/null  # the report is in --out
    echo "| $name | $* | $(grep -m1 '^| mAP@20 ' "$out/$name/report.md" | cut -d'|' -f3,4 | tr -s ' ' | sed 's/^ //; s/ $//') |"
}

{
    echo "# The teacher's own queries in int8 under torch (X-Y mAP@20, six languages pooled)"
    echo
    echo "$(date -u '+%Y-%m-%d %H:%M UTC'), $(uname -m), $(nproc) CPUs; reports beside this file."
    echo
    echo "| run | settings | X-Y mAP@20 | with the correction |"
    echo "| --- | --- | ---: | ---: |"
    run teacher-queries-fp32 VECPLUG_MODEL_RUNTIME=torch VECPLUG_MODEL_QUERY_QUANTIZE=none
    run teacher-queries-torch-int8 VECPLUG_MODEL_RUNTIME=torch VECPLUG_MODEL_QUERY_QUANTIZE=int8
} > "$out/eval_teacher_int8.md"
rm -rf "$here/results/eval_teacher_int8"
mv "$out" "$here/results/eval_teacher_int8"
cat "$here/results/eval_teacher_int8/eval_teacher_int8.md"
