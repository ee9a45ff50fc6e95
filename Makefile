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
  openjdk-17-jdk-headless maven zookeeper dnsmasq-base iproute2
# The dubbo scenario (docs/benchmark.md) also runs Zookeeper for Pixiu, inside a network namespace (unshare, ip);
# `--preset ngxway` drives ApacheBench (apache2-utils).
BENCH_PKGS := $(BUILD_PKGS) nginx haproxy wrk nghttp2-client valgrind zookeeper openjdk-17-jdk-headless util-linux iproute2 \
  apache2-utils

.PHONY: run test lint build bench deps-test deps-run deps-bench deps-go deps-ui ui test-ui ui-screenshots clean-data

build: deps-run ui
	@scripts/toolchain.sh
	$(CARGO) build --release -p sluice

# The dashboard (docs/dashboard.md): ui/dist, embedded into the binary at /ui/ by crates/sluice-admin/build.rs
# (without it the binary serves a page saying to run this). Node.js 20.19+ and npm (the machine's, or Debian's).
# npm ci runs again only when the lockfile changed.
ui: ui/node_modules/.package-lock.json
	cd ui && npm run build --silent
	@cd ui && npm run size --silent

ui/node_modules/.package-lock.json: ui/package-lock.json ui/package.json
	@command -v npm >/dev/null 2>&1 || scripts/deps.sh nodejs npm
	@node -e 'const [a,b]=process.versions.node.split(".").map(Number); process.exit(a>20||(a==20&&b>=19)?0:1)' \
	  || { echo "the dashboard build (Vite) needs Node.js 20.19 or newer; found $$(node --version)" >&2; exit 1; }
	cd ui && npm ci --no-audit --no-fund
	@touch $@

# The dashboard's browser tests drive Debian's chromium through playwright-core (no browser download).
deps-ui:
	@scripts/deps.sh chromium

test-ui: deps-ui ui
	cd ui && npm test --silent
	$(CARGO) build -p sluice
	cd ui && SLUICE_BIN=../target/debug/sluice node e2e/run.mjs

# The same run, writing its screenshots into docs/img/dashboard-*.png (docs/dashboard.md shows them).
ui-screenshots: deps-ui ui
	$(CARGO) build -p sluice
	cd ui && SLUICE_E2E_SHOTS=docs SLUICE_BIN=../target/debug/sluice node e2e/run.mjs

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

# Incremental caches would add gigabytes to a one-off build of every test binary (CI builds from scratch).
test lint test-ui: export CARGO_INCREMENTAL = 0
test: deps-test deps-go ui lint
	$(CARGO) test --workspace --no-fail-fast
	$(MAKE) test-ui

bench: deps-bench deps-go build
	$(BIN) bench --out bench-out

# Forget the embedded store (the next `make run` seeds it again from conf/apisix.yaml).
clean-data:
	rm -rf .data
