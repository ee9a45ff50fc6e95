# Sluice: `make run` starts the gateway with the sample config; `make test` builds everything and runs every test.
SHELL := /bin/bash
export PATH := $(HOME)/.cargo/bin:$(PATH)
CARGO ?= cargo
BIN := target/release/sluice

# Debian packages the tests use: real etcd and Redis servers, nginx/HAProxy/wrk for the side-by-side benchmark
# tests, protoc for etcd-client's build.
TEST_PKGS := etcd-server redis-server nginx haproxy wrk nghttp2-client protobuf-compiler curl openssl procps util-linux
RUN_PKGS := curl
BENCH_PKGS := nginx haproxy wrk nghttp2-client valgrind

.PHONY: run test lint build bench deps-test deps-run deps-bench clean-data

build:
	@scripts/toolchain.sh
	$(CARGO) build --release -p sluice

deps-run:
	@scripts/deps.sh $(RUN_PKGS)

deps-test:
	@scripts/deps.sh $(TEST_PKGS)

deps-bench:
	@scripts/deps.sh $(BENCH_PKGS)

# Foreground gateway on :9080 with conf/config.yaml; the sample route /hello goes to a mock upstream on :1980,
# started alongside and stopped with it.
run: deps-run build
	@$(BIN) mock --listen 127.0.0.1:1980 --body-size 1024 & mock=$$!; \
	trap 'kill $$mock 2>/dev/null' EXIT INT TERM; \
	$(BIN) start -c conf/config.yaml

lint:
	@scripts/toolchain.sh
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

test: deps-test lint
	$(CARGO) test --workspace --no-fail-fast

bench: deps-bench build
	$(BIN) bench --out bench-out

# Forget the embedded store (the next `make run` seeds it again from conf/apisix.yaml).
clean-data:
	rm -rf .data
