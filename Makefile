# Two commands on a fresh machine (Python 3.11):
#   make demo   set up, build the default model, index the example corpus, search it
#   make test   set up and run the whole test suite (slow tests included)
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
DEMO_INDEX ?= .demo-index
# torch first, pinned: this machine has its CPU build; a bare requirement pulls CUDA (GBs).
# Where pip finds torch on PyPI (a Linux wheel with CUDA libraries), take the CPU build with
#   make TORCH_PIP_ARGS='--index-url https://download.pytorch.org/whl/cpu' test
TORCH ?= torch==2.13.0
TORCH_PIP_ARGS ?=

.PHONY: setup models demo test test-fast bench bench-speed bench-students bench-students-dim bench-students-ffn bench-eval clean

setup: $(VENV)/.installed

$(VENV)/.installed: setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q $(TORCH_PIP_ARGS) $(TORCH)
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $@

models: setup
	$(BIN)/vecplug models build me5-small

demo: models
	rm -rf $(DEMO_INDEX)
	$(BIN)/vecplug index examples/corpus --index $(DEMO_INDEX)
	$(BIN)/vecplug info --index $(DEMO_INDEX)
	@echo; echo "== cross-lingual search (xy): each answer exists only in another language =="
	@echo "   (student first stage, language-bias correction, teacher reranking of the top 50)"
	@# each line: a query, a tab, the document holding its answer (examples/CORPUS.md); the queries
	@# go through one process (search -: a query a line, the models loaded once), its answers in
	@# order, a blank line between two; the tally says how many answers made the top 3 (what
	@# me5-small misses: the README, "Two commands")
	@out=$$(cut -f1 examples/demo_queries.tsv | $(BIN)/vecplug search - --index $(DEMO_INDEX) -k 3 --rerank teacher) \
		|| exit 1; \
	printf '%s\n' "$$out" | awk -v answers="$$(cut -f2 examples/demo_queries.tsv | paste -sd '|' -)" ' \
		BEGIN { RS = ""; total = split(answers, answer, "|") } \
		{ n++; print ""; print; \
		  if (index($$0, "] " answer[n])) { found++; print "   -> the answer (" answer[n] ") is in the top 3" } \
		  else print "   -> the answer (" answer[n] ") is NOT in the top 3" } \
		END { if (n != total) { print "error: " n " answers for " total " queries"; exit 1 } \
		      print ""; print "== answers in the top 3: " found + 0 " of " total " queries ==" }'
	@echo; echo "== same-language search (mono) =="
	$(BIN)/vecplug search "Wie viele buddhistische Tempel gibt es in Kyoto?" --mode mono --index $(DEMO_INDEX) -k 3

test: setup
	$(BIN)/python -m pytest -v

test-fast: setup
	$(BIN)/python -m pytest -q -m "not slow"

bench: models
	$(BIN)/python -m pip install -q -e '.[bench]'
	bash benchmarks/run_all.sh --exact

bench-speed: models
	$(BIN)/python -m pip install -q -e '.[bench]'
	BENCH="encode_speed batch_plan precision_probe int8_documents query_latency model_memory ann_scale" bash benchmarks/run_all.sh

bench-students: models
	bash benchmarks/students.sh

bench-students-dim: models
	bash benchmarks/students_dim.sh

bench-students-ffn: models
	$(BIN)/python -m pip install -q -e '.[onnx]'
	bash benchmarks/students_ffn.sh

bench-eval: models
	bash benchmarks/eval.sh

clean:
	rm -rf $(VENV) $(DEMO_INDEX) .vecplug build *.egg-info
