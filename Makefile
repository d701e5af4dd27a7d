# hangdoc — `make help` lists the targets.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=  # a subset: make test PYTEST_ARGS="--no-cov -k NAME" (the coverage floor is for the whole suite)

.DEFAULT_GOAL := help

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-15s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	@$(PY) -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null || { \
		echo "make: PY=$(PY) is not Python 3.11 or newer (or not found); pick one: make $(or $(MAKECMDGOALS),install) PY=python3.11" >&2; exit 1; }
	@$(PY) -c 'import ensurepip, venv' 2>/dev/null || { \
		echo "make: $(PY) cannot create a virtualenv: install its venv module (Debian/Ubuntu: apt-get install python3-venv, or python3.X-venv for PY=python3.X)" >&2; exit 1; }
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[test,dev]'
	touch $(STAMP)

install: $(STAMP)  ## create .venv with hangdoc, torch==2.13.0 (CPU) and the test tools

demo: $(STAMP)  ## start a real 4-rank hung torch.distributed job, diagnose it, clean up
	$(BIN)/python examples/run_demo.py $(ARGS)

watch-demo: $(STAMP)  ## run the demo job under `hangdoc watch --on-hang kill`: it notices the hang, reports it in hangs/, ends the job
	$(BIN)/python examples/watch_demo.py hangs

test: $(STAMP)  ## run the whole test suite (real jobs, real py-spy), with its coverage report and floor
	$(BIN)/python -m pytest -q -p no:cacheprovider --cov=hangdoc --cov-report=term $(PYTEST_ARGS)

test-fast: $(STAMP)  ## the unit tests only (tests/unit: no job started)
	$(BIN)/python -m pytest -q -m "not live and not netns" $(PYTEST_ARGS)

bench: $(STAMP)  ## time to verdict vs. py-spy loops; writes docs/benchmarks.md
	$(BIN)/python bench/bench_diagnose.py --write docs/benchmarks.md

bench-watch: $(STAMP)  ## hangdoc watch: detection latency and false alarms on real torchrun jobs; writes docs/benchmarks.md
	$(BIN)/python bench/bench_watch.py --repeat 3 --steps 1000 --write docs/benchmarks.md

bench-fanout: $(STAMP)  ## coordinator fan-out to 8/32/128 replaying agents; appends to docs/benchmarks.md
	$(BIN)/python bench/bench_fanout.py --sizes 8,32,128 --repeat 5 --write docs/benchmarks.md

bench-accuracy: $(STAMP)  ## every corpus job diagnosed live and replayed, and replayed in part: docs/benchmarks.md
	$(BIN)/python bench/bench_accuracy.py --live --recorded --partial --write docs/benchmarks.md

bench-beyond: $(STAMP)  ## root causes past the ranks (recorded and live), and what following costs a plain job: docs/benchmarks.md
	git worktree add -f /tmp/hangdoc-baseline 408fb66 >/dev/null 2>&1 || true
	$(BIN)/python bench/bench_beyond.py --recorded --live --baseline /tmp/hangdoc-baseline --repeat 7 --write docs/benchmarks.md

bench-service: $(STAMP)  ## what hangdoc server costs a node (one look at 8 ranks) and the server (2,000 reports): docs/benchmarks.md
	$(BIN)/python bench/bench_service.py --ranks 8 --looks 10 --reports 2000 --write docs/benchmarks.md

bench-probe: $(STAMP)  ## what the in-process probe costs a job, idle and asked; writes docs/benchmarks.md
	$(BIN)/python bench/bench_probe.py --rounds 12 --write docs/benchmarks.md

bench-scale: $(STAMP)  ## analyse() of 1k/10k/100k-rank synthetic jobs (and one of 1M), analyze --json of their bundles; writes docs/benchmarks.md
	$(BIN)/python bench/bench_scale.py --sizes 1000,10000,100000 --huge 1000000 --write docs/benchmarks.md

lint: $(STAMP)  ## ruff (rules and format) + mypy --strict ([tool.ruff], [tool.mypy] in pyproject.toml)
	$(BIN)/ruff check hangdoc tests bench examples tools
	$(BIN)/ruff format --check hangdoc tests bench examples tools
	$(BIN)/mypy hangdoc

proto: PROTO_OUT ?= hangdoc/fleet/v1
proto: $(STAMP)  ## regenerate hangdoc/fleet/v1 from proto/ (pinned grpcio-tools)
	rm -rf $(PROTO_OUT)/.gen && mkdir -p $(PROTO_OUT)/.gen
	$(BIN)/python -m grpc_tools.protoc -Iproto --python_out=$(PROTO_OUT)/.gen \
		--pyi_out=$(PROTO_OUT)/.gen --grpc_python_out=$(PROTO_OUT)/.gen proto/hangdoc/v1/agent.proto
	mv $(PROTO_OUT)/.gen/hangdoc/v1/agent_pb2.py $(PROTO_OUT)/.gen/hangdoc/v1/agent_pb2.pyi $(PROTO_OUT)/
	sed 's/^from hangdoc\.v1 import agent_pb2 as /from . import agent_pb2 as /' \
		$(PROTO_OUT)/.gen/hangdoc/v1/agent_pb2_grpc.py > $(PROTO_OUT)/agent_pb2_grpc.py
	rm -rf $(PROTO_OUT)/.gen

clean:  ## remove the virtualenv and caches
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache

.PHONY: help install demo watch-demo test test-fast bench bench-fanout bench-watch bench-accuracy bench-beyond bench-service bench-probe bench-scale lint proto clean
