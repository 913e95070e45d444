"""The teacher's int8 queries in another recipe than vecplug's, to weigh the recipes.

The document encoder's own int8 queries (``model.query_quantize: int8``) and the teacher
reranker's (``teacher:int8``) run ``indexer.encoder.TEACHER_QUERY_RECIPE`` under torch. This
runs ``vecplug eval`` or ``benchmarks/query_latency.py`` with it set to RECIPE: ``int8`` (the
documents' recipe, which they ran before 2026-11-29), ``int8-query`` (the students' query
recipe, every linear int8) or ``int8-teacher-query`` (vecplug's):

    VECPLUG_MODEL_QUERY_QUANTIZE=int8 python benchmarks/teacher_query_recipe.py int8-query \\
        eval xquad-r:../shared/data/xquad-r --index DIR --query-encoder me5-small --mode xy ...
    python benchmarks/teacher_query_recipe.py int8 latency me5-small+int8 --index DIR ...
"""
from __future__ import annotations

import sys

RECIPES = ("int8", "int8-query", "int8-teacher-query")


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] not in RECIPES or argv[1] not in ("eval", "latency"):
        print(f"usage: teacher_query_recipe.py {{{','.join(RECIPES)}}} {{eval,latency}} ARGS...", file=sys.stderr)
        return 2
    from vecplug.indexer import encoder

    encoder.TEACHER_QUERY_RECIPE = argv[0]
    if argv[1] == "latency":
        from pathlib import Path

        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import query_latency

        return query_latency.main(argv[2:])
    from vecplug.cli import cli

    cli.main(argv[1:], prog_name="vecplug")  # exits with the command's status
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
