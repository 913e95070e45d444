#!/usr/bin/env bash
# Distil me5-small students with k = 2, 3, 4 and 6 layers and compare them with the teacher
# on XQuAD-R (quality, one-query latency, size): results/students.{json,md}.
# About an hour on a 2-core machine (the teacher's targets are encoded once and cached).
# Run nothing else meanwhile: two torch jobs on two cores slow each other down many times over.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
models="${VECPLUG_HOME:-$HOME/.cache/vecplug}/models"
students=()
for k in ${LAYERS:-2 3 4 6}; do
    "$VECPLUG" distill -k "$k" --tatoeba ../shared/data/tatoeba --out "$models/me5-small-student-k$k"
    students+=("$models/me5-small-student-k$k")
done
mkdir -p "$here/results"
index="$tmp/xquad-r"
"$PYTHON" benchmarks/students.py me5-small "${students[@]}" --index "$index" \
    --json "$here/results/students.json" | tee "$here/results/students.md.tmp"
mv "$here/results/students.md.tmp" "$here/results/students.md"
