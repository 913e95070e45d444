"""The teacher's own int8 queries in the students' query recipe: what the teacher reranker runs.

The teacher reranker (``teacher:int8``) embeds queries with the document encoder in
``indexer.encoder.TEACHER_RERANK_RECIPE`` (every linear int8), while the document encoder's
own int8 queries (``model.query_quantize: int8``) keep the documents' recipe
(``TEACHER_QUERY_RECIPE``). This runs ``vecplug eval`` or ``benchmarks/query_latency.py`` with
the second set to the first, so the teacher alone can be weighed in the reranker's recipe:

    python benchmarks/teacher_query_recipe.py eval xquad-r:../shared/data/xquad-r --index DIR \\
        --query-encoder me5-small --mode xy --debias both ...   (with VECPLUG_MODEL_QUERY_QUANTIZE=int8)
    python benchmarks/teacher_query_recipe.py latency me5-small+int8 --index DIR ...
"""
from __future__ import annotations

import sys


def main(argv: list[str]) -> int:
    from vecplug.indexer import encoder

    encoder.TEACHER_QUERY_RECIPE = encoder.TEACHER_RERANK_RECIPE
    if argv[:1] == ["latency"]:
        from pathlib import Path

        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import query_latency

        return query_latency.main(argv[1:])
    from vecplug.cli import cli

    cli.main(argv, prog_name="vecplug")  # exits with the command's status
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
