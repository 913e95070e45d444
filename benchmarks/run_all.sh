#!/usr/bin/env bash
# Run the three benchmarks and collect their output in benchmarks/results/:
#   lengths.{json,md}, langid.{json,md}, xquad_r.{json,md} and REPORT.md (all of them together).
#
# Usage:  benchmarks/run_all.sh [options for xquad_r.py, e.g. --exact, --langs en de, --limit 100]
#         benchmarks/run_all.sh --report-only   (only rebuild REPORT.md from the existing *.md)
# Env:    PYTHON (default: the repository's .venv, else python), VECPLUG_HOME (model cache).
# The XQuAD-R run takes several minutes on a 2-core machine (it encodes ~7,300 sentences).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
out="$here/results"
if [[ -z "${PYTHON:-}" ]]; then
    if [[ -x "$root/.venv/bin/python" ]]; then PYTHON="$root/.venv/bin/python"; else PYTHON=python; fi
fi
mkdir -p "$out"
cd "$root"

# The scripts write their JSON only once finished, and the Markdown goes to a .tmp file renamed
# on success: an interrupted run leaves the previous results whole.
run() {
    local name=$1
    shift
    echo ">> $PYTHON benchmarks/$name.py $* --json $out/$name.json" >&2
    "$PYTHON" "benchmarks/$name.py" "$@" --json "$out/$name.json" | tee "$out/$name.md.tmp"
    mv "$out/$name.md.tmp" "$out/$name.md"
    echo >&2
}

started=$(date -u +%Y-%m-%dT%H:%M:%SZ)
if [[ "${1:-}" == "--report-only" ]]; then
    shift
    started="(results as found)"
else
    run lengths
    run langid
    run xquad_r "$@"
fi

{
    echo "# vecplug benchmarks"
    echo
    echo "Made by \`benchmarks/run_all.sh $*\`, started $started, finished $(date -u +%Y-%m-%dT%H:%M:%SZ);"
    echo "VECPLUG_HOME=${VECPLUG_HOME:-(default)}. Each section starts with its machine, date and command;"
    echo "the JSON next to this file holds every number."
    for name in lengths langid xquad_r; do
        echo
        cat "$out/$name.md"
    done
} > "$out/REPORT.md.tmp"
mv "$out/REPORT.md.tmp" "$out/REPORT.md"
echo "wrote $out/REPORT.md" >&2
