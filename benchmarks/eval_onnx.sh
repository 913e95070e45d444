#!/usr/bin/env bash
# Quality of the encoders' runtimes and quantisations on XQuAD-R (six languages pooled): the
# shipped student's queries in torch fp32 / torch int8 / ONNX Runtime fp32 / ONNX Runtime int8
# against the same me5-small documents, X-Y with and without the language-bias correction;
# the teacher's own queries in fp32 / torch int8 / ONNX Runtime int8 (`--int8` with a document
# encoder as query encoder); then me5-small documents in ONNX Runtime int8 (a second index),
# searched by the fp32 teacher.
# Writes benchmarks/results/eval_onnx/<run>/report.md and .json and a summary, eval_onnx.md
# (with OUT: <OUT>/<run>/..., <OUT>.md).
# About 25 minutes on a 2-core machine (two indexes of 7,308 sentences); run nothing else meanwhile.
# Needs: pip install 'vecplug[onnx]'.
# Env: VECPLUG (default: the repository's .venv), STUDENT (default: me5-small-student-k6),
#      INDEX, INDEX_INT8 (default: temporary folders; give them to reuse the encoded pools;
#      INDEX may be the one benchmarks/eval.sh builds),
#      RUNS (default: all; e.g. "teacher-documents-fp32 teacher-queries-torch-int8", ~9 minutes)
#      and OUT (default: eval_onnx): the results folder's name under benchmarks/results.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
STUDENT="${STUDENT:-me5-small-student-k6}"
RUNS="${RUNS:-}"
folder="${OUT:-eval_onnx}"
index="${INDEX:-$tmp/xquad-r}"
index_int8="${INDEX_INT8:-$tmp/xquad-r-documents-int8}"
out="$tmp/$folder"
mkdir -p "$out"

run() {  # name, index, encoder, then VAR=value settings for this run
    local name="$1" idx="$2" encoder="$3"
    shift 3
    if [[ -n "$RUNS" && " $RUNS " != *" $name "* ]]; then return; fi
    env "$@" "$VECPLUG" eval "$data" --index "$idx" --query-encoder "$encoder" --mode xy \
        --debias both --out "$out/$name" --summary-only -q > /dev/null  # the report is in --out
    # the X-Y mAP@20 row: plain, then with the correction
    echo "| $name | $* | $(grep -m1 '^| mAP@20 ' "$out/$name/report.md" | cut -d'|' -f3,4 | tr -s ' ' | sed 's/^ //; s/ $//') |"
}

{
    echo "# Runtimes and quantisation on XQuAD-R (X-Y mAP@20, six languages pooled)"
    echo
    echo "$(date -u '+%Y-%m-%d %H:%M UTC'), $(uname -m), $(nproc) CPUs; reports beside this file."
    echo
    echo "| run | settings | X-Y mAP@20 | with the correction |"
    echo "| --- | --- | ---: | ---: |"
    run student-torch-fp32 "$index" "$STUDENT" VECPLUG_MODEL_RUNTIME=torch VECPLUG_MODEL_QUERY_QUANTIZE=none
    run student-torch-int8 "$index" "$STUDENT" VECPLUG_MODEL_RUNTIME=torch VECPLUG_MODEL_QUERY_QUANTIZE=int8
    run student-onnx-fp32 "$index" "$STUDENT" VECPLUG_MODEL_RUNTIME=onnx VECPLUG_MODEL_QUERY_QUANTIZE=none
    run student-onnx-int8 "$index" "$STUDENT" VECPLUG_MODEL_RUNTIME=onnx VECPLUG_MODEL_QUERY_QUANTIZE=int8
    run teacher-documents-fp32 "$index" me5-small VECPLUG_MODEL_RUNTIME=torch VECPLUG_MODEL_QUERY_QUANTIZE=none
    run teacher-queries-torch-int8 "$index" me5-small VECPLUG_MODEL_RUNTIME=torch VECPLUG_MODEL_QUERY_QUANTIZE=int8
    run teacher-queries-onnx-int8 "$index" me5-small VECPLUG_MODEL_RUNTIME=onnx VECPLUG_MODEL_QUERY_QUANTIZE=int8
    run teacher-documents-onnx-int8 "$index_int8" me5-small VECPLUG_MODEL_RUNTIME=onnx \
        VECPLUG_MODEL_QUERY_QUANTIZE=none VECPLUG_MODEL_DOCUMENT_QUANTIZE=int8
} > "$out/$folder.md"
# results replace the previous ones only when every run finished
rm -rf "${here:?}/results/$folder"
mv "$out" "$here/results/$folder"
cat "$here/results/$folder/$folder.md"
