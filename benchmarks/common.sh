# Sourced by the benchmark scripts: strict mode, the repository root as working folder, the
# tools (PYTHON, VECPLUG: the repository's .venv unless given), the XQuAD-R dataset spec and a
# scratch folder removed on exit. Sets: here (benchmarks/), root, PYTHON, VECPLUG, data, tmp.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
cd "$root"
PYTHON="${PYTHON:-$root/.venv/bin/python}"
VECPLUG="${VECPLUG:-$root/.venv/bin/vecplug}"
data="xquad-r:$root/../shared/data/xquad-r"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
