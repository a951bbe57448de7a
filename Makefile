# The two set-up commands of README.md. Each installs what is missing (Debian
# packages, through tools/install-deps.sh), builds with Bazel, and runs.
SHELL := /bin/bash
BAZEL ?= bazel
STATE_DIR ?= $(HOME)/.local/state/tandem
DATA_ROOT ?= /usr/share
LISTEN ?= 127.0.0.1:50051
METRICS_LISTEN ?= 127.0.0.1:9464

.PHONY: all deps build run test bench clean

all: build

deps:
	tools/install-deps.sh test

build: deps
	$(BAZEL) build //...

# tandemd in the foreground; Ctrl-C (SIGINT) shuts it down cleanly.
run: deps
	$(BAZEL) build //server:tandemd //clients/cli:tandem
	mkdir -p "$(STATE_DIR)"
	exec bazel-bin/server/tandemd --listen=$(LISTEN) --metrics_listen=$(METRICS_LISTEN) \
	  --state_dir="$(STATE_DIR)" --data_root="$(DATA_ROOT)"

# The format check; the executor's randomised stress, the update rules'
# stress, the pipeline's stage threads and concurrent oneDNN primitive
# creation under ThreadSanitizer; every test; then each fuzz target for
# FUZZ_SECONDS with libFuzzer
# (tools/fuzz.sh, docs/fuzzing.md); ends with GoogleTest-style totals over all
# test cases.
FUZZ_SECONDS ?= 30
TSAN_TESTS := //runtime/exec:plan_executor_stress_test //runtime/train:update_rules_stress_test \
	//runtime/exec:pipeline_runner_stress_test //runtime/cpu:primitive_creation_stress_test

test: deps
	tools/check_format.sh; status=$$?; \
	  $(BAZEL) test --config=tsan $(TSAN_TESTS) || status=1; \
	  $(BAZEL) test //... || status=1; \
	  tools/fuzz.sh $(FUZZ_SECONDS) || status=1; \
	  /usr/bin/python3 tools/test_summary.py --extra=bazel-out/k8-opttsan/testlogs || status=1; \
	  exit $$status

# Benchmarks against their peers (PyTorch on CPU, ZeRO-Offload in the planner).
bench:
	tools/install-deps.sh bench
	bench/run_all.sh

clean:
	$(BAZEL) clean
