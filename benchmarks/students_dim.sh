#!/usr/bin/env bash
# Lower-dimension students: quality against memory per vector. Distils the shipped student's
# recipe (k=6, in-batch ranking term) on a quarter of its steps (one epoch, 10,000 Tatoeba pairs)
# at full width and with --dim 128 and 32 (documents projected by PCA), then compares them with
# the teacher on XQuAD-R: results/students_dim.{json,md}.
# About 45 minutes on a 2-core machine; run nothing else meanwhile. Students already in OUT are
# reused (delete them to distil again); INDEX names a pooled XQuAD-R index of me5-small to reuse
# (default: a temporary one).
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
OUT="${OUT:-${VECPLUG_HOME:-$HOME/.cache/vecplug}/models}"
students=()
for d in ${DIMS:-full 128 32}; do
    folder="$OUT/q-k6c-$d"
    extra=()
    [[ $d != full ]] && extra=(--dim "$d")
    if [[ ! -f "$folder/student.json" ]]; then
        "$VECPLUG" distill -k 6 --contrastive 1.0 --epochs 1 --max-texts 20000 \
            --tatoeba ../shared/data/tatoeba --out "$folder" "${extra[@]}"
    fi
    students+=("$folder")
done
mkdir -p "$here/results"
index="${INDEX:-$tmp/xquad-r}"
"$PYTHON" benchmarks/students.py me5-small "${students[@]}" --index "$index" \
    --json "$here/results/students_dim.json" | tee "$here/results/students_dim.md.tmp"
mv "$here/results/students_dim.md.tmp" "$here/results/students_dim.md"
