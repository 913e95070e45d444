#!/usr/bin/env bash
# The README's training worked examples, end to end, on XQuAD-R (six languages pooled):
#   1. vecplug train examples/train/tatoeba-xy.yaml: me5-small fine-tuned on Tatoeba pairs, X-Y batches
#   2. a 6-layer student distilled from it (the shipped default's recipe on a quarter of its
#      steps: 10,000 pairs instead of 20,000, one epoch instead of two)
#   3. vecplug eval before (me5-small + its shipped student) and after (the fine-tuned teacher +
#      its new student): X-Y mAP@20, mono MRR@10 and the language-bias measures, no correction
#      and the fine-tuned pair again with the language-bias correction on
#   4. vecplug train examples/train/cross-encoder-tatoeba.yaml, then the cross-encoder as a
#      reranker of me5-small's top 20 (first 100 questions per language)
# Writes benchmarks/results/train/{before,after,cross-encoder}/ and prints the reports.
# About an hour and a half on a 2-core machine; run nothing else meanwhile. Each step that already has its
# result (same config and data) is skipped, so an interrupted run continues where it stopped.
# Env: VECPLUG (default: the repository's .venv), MODELS (default: models/ in the repository).
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
MODELS="${MODELS:-models}"
out="$here/results/train"
mkdir -p "$out" "$MODELS"
ft="$MODELS/me5-small-tatoeba-xy"
student="$MODELS/me5-small-tatoeba-xy-student-k6"
cross="$MODELS/me5-small-cross-tatoeba"

timed() { local t0=$SECONDS; "$@"; echo ">> $(( (SECONDS - t0) / 60 )) min: $*" >&2; }

timed "$VECPLUG" train examples/train/tatoeba-xy.yaml --output "$ft"
if [[ ! -f "$student/student.json" ]]; then
    timed "$VECPLUG" distill --teacher "$ft" -k 6 --contrastive 1.0 --epochs 1 --max-texts 20000 \
        --tatoeba ../shared/data/tatoeba --out "$student"
fi
eval_run() {  # name, document encoder, query encoders...
    local name=$1 model=$2
    shift 2
    local args=()
    for q in "$@"; do args+=(--query-encoder "$q"); done
    timed "$VECPLUG" eval "$data" --model "$model" --index "$tmp/index-$name" "${args[@]}" \
        --mode xy --mode mono --no-debias --out "$tmp/$name" --summary-only -q > /dev/null
    rm -rf "${out:?}/$name" && mv "$tmp/$name" "$out/$name"
}
eval_run before me5-small me5-small me5-small-student-k6
eval_run after "$ft" "$ft" "$student"
timed "$VECPLUG" eval "$data" --model "$ft" --index "$tmp/index-after" --query-encoder "$ft" \
    --query-encoder "$student" --mode xy --mode mono --debias on --out "$tmp/after-debias" --summary-only -q > /dev/null
rm -rf "$out/after-debias" && mv "$tmp/after-debias" "$out/after-debias"
timed "$VECPLUG" train examples/train/cross-encoder-tatoeba.yaml --output "$cross"
timed "$VECPLUG" eval "$data" --model me5-small --index "$tmp/index-before" --query-encoder me5-small \
    --mode xy --mode mono --no-debias --rerank none --rerank "cross-encoder:$cross" --rerank-depth 20 \
    --limit 100 --out "$tmp/cross-encoder" --summary-only -q > /dev/null
rm -rf "$out/cross-encoder" && mv "$tmp/cross-encoder" "$out/cross-encoder"
cat "$out/before/report.md" "$out/after/report.md" "$out/cross-encoder/report.md"
