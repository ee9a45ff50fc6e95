# Sluice: `make run` starts the gateway with the sample config; `make test` builds everything and runs every test.
# Both install what is missing (Debian packages through apt, Rust through rustup when rustup is there) and do
# nothing more when everything is already installed.
SHELL := /bin/bash
# rustup's cargo, and a Go installed from go.dev's tarball, are not on Debian's default PATH.
export PATH := $(HOME)/.cargo/bin:$(if $(wildcard /usr/local/go/bin/go),/usr/local/go/bin:)$(PATH)
CARGO ?= cargo
BIN := target/release/sluice

# What the build itself needs: protoc and its well-known .proto includes (etcd-client's build script compiles
# etcd's protos, which import google/protobuf/descriptor.proto), a C compiler and libc headers (ring, mimalloc,
# the linker), CA certificates for cargo's downloads.
BUILD_PKGS := protobuf-compiler libprotobuf-dev gcc libc6-dev ca-certificates
RUN_PKGS := $(BUILD_PKGS) curl
# The tests start real etcd and Redis servers and real gRPC peers (python3-venv for the Python one), drive curl
# (with HTTP/2) and openssl, and kill processes; nginx, HAProxy and wrk are for the side-by-side benchmark tests.
# Go (h2spec, the grpc-go and dubbo-go test peers) is installed by deps-go; Java and Maven build the Java Dubbo
# test provider (crates/sluice-proxy/tools/dubbo-java-peer, dependencies from Maven Central).
TEST_PKGS := $(BUILD_PKGS) etcd-server redis-server nginx haproxy wrk nghttp2-client curl openssl procps util-linux python3-venv \
  openjdk-17-jdk-headless maven
BENCH_PKGS := $(BUILD_PKGS) nginx haproxy wrk nghttp2-client valgrind

.PHONY: run test lint build bench deps-test deps-run deps-bench deps-go clean-data

build: deps-run
	@scripts/toolchain.sh
	$(CARGO) build --release -p sluice

deps-run:
	@scripts/deps.sh $(RUN_PKGS)

deps-test:
	@scripts/deps.sh $(TEST_PKGS)

deps-bench:
	@scripts/deps.sh $(BENCH_PKGS)

# h2spec (the HTTP/2 conformance tests) is built with Go; Debian's golang-go when no Go is on PATH.
deps-go:
	@command -v go >/dev/null 2>&1 || scripts/deps.sh golang-go

# Foreground gateway on :9080 with conf/config.yaml; the sample route /hello goes to a mock upstream on :1980,
# started alongside and stopped with it.
run: build
	@$(BIN) mock --listen 127.0.0.1:1980 --body-size 1024 & mock=$$!; \
	trap 'kill $$mock 2>/dev/null' EXIT INT TERM; \
	$(BIN) start -c conf/config.yaml

lint: deps-run
	@scripts/toolchain.sh lint
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

test: deps-test deps-go lint
	$(CARGO) test --workspace --no-fail-fast

bench: deps-bench build
	$(BIN) bench --out bench-out

# Forget the embedded store (the next `make run` seeds it again from conf/apisix.yaml).
clean-data:
	rm -rf .data
