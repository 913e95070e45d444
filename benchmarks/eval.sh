#!/usr/bin/env bash
# The adapter layer on XQuAD-R (six languages pooled): modes x query encoder (teacher, shipped
# student) x reranking (none, teacher) x language-bias correction (off, on) x translation
# consensus (off, on), then prefer, then the gated teacher reranker (the student's queries
# reranked only below a first-stage margin; the correction on, as new indexes have it), and
# with RUNS=eval-gate-int8 the same with the teacher's queries in int8 (the reranker
# teacher:int8, and the teacher alone with model.query_quantize: int8).
# Writes benchmarks/results/eval/{report.md,report.json,heatmap-*.svg},
# benchmarks/results/eval-prefer/ and benchmarks/results/eval-gate/. About 45 minutes on a
# 2-core machine; run nothing else meanwhile (two torch jobs on two cores slow each other
# down many times over).
# Env: VECPLUG (default: the repository's .venv), STUDENT (default: me5-small-student-k6),
#      INDEX (default: a temporary folder; give one to reuse the encoded pool),
#      SHARED_STUDENTS (default: "me5-small-student-k6-s3 me5-small-student-k7-s6": the
#      students of RUNS=eval-gate-shared, distilled by the README's "Shared-layer students"),
#      RUNS (default: "eval eval-prefer eval-gate"; a subset runs only those; also eval-gate-int8,
#      eval-teacher-recipe: the teacher's queries in float, int8 and the reranker's int8 recipe,
#      eval-gate-shared: students sharing layers with the teacher, gated by teacher:int8,
#      eval-centred: the index with a graph of language-centred vectors, and eval-flat: the
#      flat store's exact search beside the hnswlib store's),
#      GATES (default: "0.02 0.045 0.08 0.13": the student's margins at its 20th, 40th, 60th
#      and 80th percentiles on this set, with the correction: benchmarks/results/eval-gate/).
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
STUDENT="${STUDENT:-me5-small-student-k6}"
SHARED_STUDENTS="${SHARED_STUDENTS:-me5-small-student-k6-s3 me5-small-student-k7-s6}"
RUNS="${RUNS:-eval eval-prefer eval-gate}"
GATES="${GATES:-0.02 0.045 0.08 0.13}"
index="${INDEX:-$tmp/xquad-r}"
mkdir -p "$here/results"

# gated NAME RERANKER TEACHER_QUANTIZE: the student reranked by RERANKER, ungated and at each
# of GATES, then the teacher alone (its queries' quantisation TEACHER_QUANTIZE) in the same
# conditions: what the gated reranker is weighed against
gated() {
    local name=$1 reranker=$2 quantize=$3 gates=(--rerank-gate always) g
    for g in $GATES; do gates+=(--rerank-gate "$g"); done
    "$VECPLUG" eval "$data" --index "$index" --query-encoder "$STUDENT" --mode xy --mode mono \
        --rerank none --rerank "$reranker" "${gates[@]}" --debias on \
        --out "$tmp/$name" --summary-only -q > "$tmp/$name.md"
    VECPLUG_MODEL_QUERY_QUANTIZE="$quantize" "$VECPLUG" eval "$data" --index "$index" \
        --query-encoder me5-small --mode xy --mode mono --debias on \
        --out "$tmp/$name/teacher" --summary-only -q > "$tmp/$name-teacher.md"
}
for name in $RUNS; do
    case "$name" in
        eval) "$VECPLUG" eval "$data" --index "$index" --query-encoder me5-small --query-encoder "$STUDENT" \
                  --mode xy --mode mono --rerank none --rerank teacher --debias both --consensus both \
                  --out "$tmp/eval" --summary-only -q > "$tmp/eval.md" ;;
        eval-prefer) "$VECPLUG" eval "$data" --index "$index" --query-encoder "$STUDENT" --mode prefer \
                  --debias both --consensus both --out "$tmp/eval-prefer" --summary-only -q > "$tmp/eval-prefer.md" ;;
        eval-gate) gated eval-gate teacher none ;;
        # an index of the same documents whose graph holds language-centred vectors
        # (index.hnsw_centred: the corrected search is then one walk, the others per language),
        # beside the plain graph's index searched the same way (eval-centred/plain/)
        eval-centred) for graph in plain centred; do
                  out="$tmp/eval-centred"; [[ $graph == plain ]] && out="$tmp/eval-centred/plain"
                  VECPLUG_INDEX_HNSW_CENTRED=$([[ $graph == centred ]] && echo true || echo false) \
                      "$VECPLUG" eval "$data" --index "$index-$graph" --query-encoder me5-small \
                      --query-encoder "$STUDENT" --mode xy --mode mono --rerank none --debias both \
                      --consensus both --out "$out" --summary-only -q > "$tmp/eval-centred-$graph.md"
              done ;;
        eval-gate-int8) gated eval-gate-int8 teacher:int8 int8 ;;
        # the teacher's queries in each of its settings, with and without the correction: the
        # student reranked by the float teacher and by teacher:int8, then the teacher alone in
        # float (float/), in int8 as vecplug runs it (indexer.encoder.TEACHER_QUERY_RECIPE: int8/),
        # in the students' query recipe (int8-query/) and in the documents' recipe
        # (int8-documents/; these two by benchmarks/teacher_query_recipe.py)
        eval-teacher-recipe) out="$tmp/eval-teacher-recipe"
              "$VECPLUG" eval "$data" --index "$index" --query-encoder "$STUDENT" --mode xy --rerank teacher \
                  --rerank teacher:int8 --debias both --out "$out" --summary-only -q > "$out.md"
              for q in float int8 int8-query int8-documents; do
                  run=("$VECPLUG")
                  [[ $q == int8-query ]] && run=("$PYTHON" "$here/teacher_query_recipe.py" int8-query)
                  [[ $q == int8-documents ]] && run=("$PYTHON" "$here/teacher_query_recipe.py" int8)
                  VECPLUG_MODEL_QUERY_QUANTIZE=$([[ $q == float ]] && echo none || echo int8) "${run[@]}" eval "$data" \
                      --index "$index" --query-encoder me5-small --mode xy --mode mono --debias both \
                      --out "$out/$q" --summary-only -q > "$out-$q.md"
              done ;;
        # students sharing their first layers with the teacher (SHARED_STUDENTS), their queries
        # in int8, gated by teacher:int8, which goes on from their last shared layer instead of
        # encoding the query again (X-Y only; the shipped student's rows are eval-gate-int8's)
        eval-gate-shared) students=() gates=(--rerank-gate always)
              for s in $SHARED_STUDENTS; do students+=(--query-encoder "$s"); done
              for g in $GATES; do gates+=(--rerank-gate "$g"); done
              VECPLUG_MODEL_QUERY_QUANTIZE=int8 "$VECPLUG" eval "$data" --index "$index" "${students[@]}" \
                  --mode xy --debias on --rerank none --rerank teacher:int8 "${gates[@]}" \
                  --out "$tmp/eval-gate-shared" --summary-only -q > "$tmp/eval-gate-shared.md" ;;
        # the same documents in the flat store (exact search: its corrected search ranks each
        # language's documents by centred cosine itself), beside the hnswlib store's index
        # searched the same way (eval-flat/hnswlib/: the corrected search ranks the languages
        # it scans by centred cosine too, and walks the others by plain cosine, rescored)
        eval-flat) for store in hnswlib flat; do
                  out="$tmp/eval-flat"; [[ $store == hnswlib ]] && out="$tmp/eval-flat/hnswlib"
                  VECPLUG_INDEX_STORE=$store "$VECPLUG" eval "$data" --index "$index-$store" \
                      --query-encoder me5-small --query-encoder "$STUDENT" --mode xy --mode mono \
                      --debias both --out "$out" --summary-only -q > "$tmp/eval-flat-$store.md"
              done ;;
        *) echo "unknown run '$name' (known: eval eval-prefer eval-gate eval-gate-int8 eval-teacher-recipe eval-gate-shared eval-centred eval-flat)" >&2; exit 2 ;;
    esac
done
# results replace the previous ones only when every run asked for finished
for name in $RUNS; do
    rm -rf "$here/results/$name"
    mv "$tmp/$name" "$here/results/$name"
    cat "$here/results/$name/report.md"
    for sub in teacher plain hnswlib float int8 int8-query int8-documents; do
        if [[ -f "$here/results/$name/$sub/report.md" ]]; then cat "$here/results/$name/$sub/report.md"; fi
    done
done
