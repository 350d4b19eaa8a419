# One entry point for routine tasks; CI runs `make test` (see .ci/run).
# Toolchains installed outside the default PATH on Debian images.
export PATH := $(PATH):/usr/local/go/bin:$(HOME)/.cargo/bin

.PHONY: setup build demo demo-cluster test test-unit test-runtimes test-integration test-cgroup-v2 fuzz bench bench-socialnet lint fmt clean

setup:
	@scripts/setup.sh

build: setup

## The demo: install, build, start Staccato on 127.0.0.1:8080, deploy examples, invoke them.
demo: setup
	@scripts/demo.sh

## The cluster demo (root): two gateways on etcd and three engines, each on a
## test host made of a network namespace; a cable pulled; all torn down after.
demo-cluster: setup
	@scripts/demo-cluster.sh

## Every test: formatting and clippy (lint), Rust unit and vector tests, each
## runtime's own suite, integration tests, the shared conformance suite for all
## five languages, and a short fuzz run.
test: setup lint
	cargo test --profile ci --workspace
	$(MAKE) -s -C runtimes/c test
	$(MAKE) -s -C runtimes/cpp test
	STACCATO_REQUIRE_FAST=1 python3 -m pytest -q runtimes/python/tests
	STACCATO_PY_PURE=1 python3 -m pytest -q runtimes/python/tests
	python3 -m pytest -q tools/staccato_analyzer/tests
	node --test runtimes/node/test/
	cd runtimes/go && go test ./...
	python3 -m pytest -q tests
	python3 -m pytest -q conformance
	scripts/fuzz.sh 15

## Every fuzz target for longer (FUZZ_SECONDS each, default 300); see fuzz/README.md.
FUZZ_SECONDS ?= 300
fuzz: setup
	scripts/fuzz.sh $(FUZZ_SECONDS)

## The container isolation tests on a cgroup v2 host: a Debian 12 VM under
## qemu booted with the unified hierarchy only (root; the first run makes the
## VM's root file system with debootstrap). Not part of `make test`: see README.
test-cgroup-v2: setup
	scripts/cgroup2-vm.sh

test-integration: setup
	python3 -m pytest -q tests

## Microbenchmarks (see BENCHMARKS.md).
bench: setup
	target/release/staccato bench micro

## The SocialNetwork application (examples/socialnet) on real Redis, memcached
## and PostgreSQL: every variant (Staccato default, internal calls through the
## gateway, managed concurrency off, no spinning; RPC servers) swept over
## offered rates in one run, ~50 minutes (3-host runs included). Results in bench-results/socialnet-*/.
## SOCIALNET_ARGS passes options (e.g. --variants staccato rpc --duration 10).
bench-socialnet: setup
	python3 examples/socialnet/snctl.py bench $(SOCIALNET_ARGS)

## Formatting and clippy with -D warnings (which enforces a SAFETY comment on
## every unsafe block in crates/sys).
MSRV := $(shell sed -n 's/^rust-version = "\(.*\)"/\1/p' Cargo.toml)
lint:
	cargo fmt --all --check
	cargo clippy --workspace --all-targets -- -D warnings
	cargo +$(MSRV) check --workspace --all-targets --quiet

fmt:
	cargo fmt --all

clean:
	cargo clean
	$(MAKE) -s -C runtimes/c clean
