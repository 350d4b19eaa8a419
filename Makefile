# One entry point for routine tasks; CI runs `make test` (see .ci/run).
.PHONY: setup build demo test test-unit test-runtimes test-integration bench lint fmt clean

setup:
	@scripts/setup.sh

build: setup

## The demo: install, build, start Staccato on 127.0.0.1:8080, deploy examples, invoke them.
demo: setup
	@scripts/demo.sh

## Every test: Rust unit and vector tests, both runtimes' suites, integration tests.
test: setup
	cargo test --release --workspace
	$(MAKE) -s -C runtimes/c test
	python3 -m pytest -q runtimes/python/tests
	python3 -m pytest -q tests

test-integration: setup
	python3 -m pytest -q tests

## Microbenchmarks (see BENCHMARKS.md).
bench: setup
	target/release/staccato bench micro

lint:
	cargo fmt --all --check
	cargo clippy --workspace --all-targets -- -D warnings

fmt:
	cargo fmt --all

clean:
	cargo clean
	$(MAKE) -s -C runtimes/c clean
