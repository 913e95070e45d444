#!/usr/bin/env bash
# Narrower students: quality against query latency. Distils the shipped student's recipe (k=6,
# in-batch ranking term) on a quarter of its steps (one epoch, 10,000 Tatoeba pairs) at full
# feed-forward width and with --ffn-width for each of WIDTHS: a number starts from the teacher's
# layers, shipped-N narrows the shipped student to N (--init me5-small-student-k6) and trains it
# on. Then compares them with the teacher and the shipped student on XQuAD-R
# (results/students_ffn.{json,md}) and times them int8 under ONNX Runtime, or in RUNTIMES="torch
# onnx" (results/students_ffn_latency.{json,md}).
# About 90 minutes on a 2-core machine; run nothing else meanwhile. Students already in OUT are
# reused (delete them to distil again); INDEX names a pooled XQuAD-R index of me5-small to reuse
# (default: a temporary one). RECIPE=full distils on the whole recipe instead (two epochs, 20,000
# pairs: the shipped student's steps; about four times as long), into q-k6c-w<WIDTH>-full, and
# writes results/students_ffn-full*. Needs: pip install 'vecplug[onnx]'.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
OUT="${OUT:-${VECPLUG_HOME:-$HOME/.cache/vecplug}/models}"
case "${RECIPE:-quarter}" in
    quarter) recipe=(--epochs 1 --max-texts 20000); suffix="" ;;
    full) recipe=(); suffix="-full" ;;
    *) echo "RECIPE must be quarter or full, not '$RECIPE'" >&2; exit 2 ;;
esac
students=()
for w in ${WIDTHS:-full 1024 768 shipped-1024 shipped-768}; do
    folder="$OUT/q-k6c-w$w$suffix"
    case $w in
        full) extra=() ;;
        shipped-*) extra=(--init me5-small-student-k6 --ffn-width "${w#shipped-}") ;;
        *) extra=(--ffn-width "$w") ;;
    esac
    if [[ ! -f "$folder/student.json" ]]; then
        "$VECPLUG" distill -k 6 --contrastive 1.0 "${recipe[@]}" \
            --tatoeba ../shared/data/tatoeba --out "$folder" -q "${extra[@]}"
    fi
    students+=("$folder")
done
mkdir -p "$here/results"
index="${INDEX:-$tmp/xquad-r}"
"$PYTHON" benchmarks/students.py me5-small me5-small-student-k6 "${students[@]}" --index "$index" \
    --json "$here/results/students_ffn$suffix.json" | tee "$here/results/students_ffn$suffix.md.tmp"
mv "$here/results/students_ffn$suffix.md.tmp" "$here/results/students_ffn$suffix.md"
# RUNTIMES: where the int8 students are timed (onnx, torch or both: "torch onnx")
timed=()
for runtime in ${RUNTIMES:-onnx}; do
    case $runtime in onnx) at="@onnx" ;; torch) at="" ;; *) echo "unknown runtime '$runtime'" >&2; exit 2 ;; esac
    for s in me5-small-student-k6 "${students[@]}"; do timed+=("$s+int8$at"); done
done
"$PYTHON" benchmarks/query_latency.py "${timed[@]}" --index "$index" \
    --json "$here/results/students_ffn${suffix}_latency.json" | tee "$here/results/students_ffn${suffix}_latency.md.tmp"
mv "$here/results/students_ffn${suffix}_latency.md.tmp" "$here/results/students_ffn${suffix}_latency.md"
