#!/usr/bin/env bash
# Narrower students: quality against query latency. Distils the shipped student's recipe (k=6,
# in-batch ranking term) on a quarter of its steps (one epoch, 10,000 Tatoeba pairs) at full
# feed-forward width and with --ffn-width for each of WIDTHS, then compares them with the teacher
# on XQuAD-R (results/students_ffn.{json,md}) and times them as the shipped student runs, int8
# under ONNX Runtime (results/students_ffn_latency.{json,md}).
# About 75 minutes on a 2-core machine; run nothing else meanwhile. Students already in OUT are
# reused (delete them to distil again); INDEX names a pooled XQuAD-R index of me5-small to reuse
# (default: a temporary one). Needs: pip install 'vecplug[onnx]'.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
OUT="${OUT:-${VECPLUG_HOME:-$HOME/.cache/vecplug}/models}"
students=()
for w in ${WIDTHS:-full 1024 768}; do
    folder="$OUT/q-k6c-w$w"
    extra=()
    [[ $w != full ]] && extra=(--ffn-width "$w")
    if [[ ! -f "$folder/student.json" ]]; then
        "$VECPLUG" distill -k 6 --contrastive 1.0 --epochs 1 --max-texts 20000 \
            --tatoeba ../shared/data/tatoeba --out "$folder" -q "${extra[@]}"
    fi
    students+=("$folder")
done
mkdir -p "$here/results"
index="${INDEX:-$tmp/xquad-r}"
"$PYTHON" benchmarks/students.py me5-small "${students[@]}" --index "$index" \
    --json "$here/results/students_ffn.json" | tee "$here/results/students_ffn.md.tmp"
mv "$here/results/students_ffn.md.tmp" "$here/results/students_ffn.md"
onnx=()
for s in "${students[@]}"; do onnx+=("$s+int8@onnx"); done
"$PYTHON" benchmarks/query_latency.py "${onnx[@]}" --index "$index" \
    --json "$here/results/students_ffn_latency.json" | tee "$here/results/students_ffn_latency.md.tmp"
mv "$here/results/students_ffn_latency.md.tmp" "$here/results/students_ffn_latency.md"
