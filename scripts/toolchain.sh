#!/usr/bin/env bash
# Checks for a Rust toolchain at least as new as the workspace's rust-version (Debian's own cargo is too old for
# it), with rustfmt and clippy when asked (`toolchain.sh lint`). Where rustup manages the toolchain (~/.cargo/bin,
# which the Makefile puts on PATH), a missing or too old toolchain or component is installed through rustup;
# without rustup it stops with instructions instead of pretending.
set -euo pipefail
cd "$(dirname "$0")/.."
need=$(sed -n 's/^rust-version *= *"\([0-9.]*\)".*/\1/p' Cargo.toml)

# 0 when dotted version $1 >= $2.
ge() { [ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -n1)" = "$2" ]; }
have() { command -v rustc >/dev/null 2>&1 && command -v cargo >/dev/null 2>&1; }
version() { rustc --version 2>/dev/null | awk '{print $2}' | cut -d- -f1; }

if ! have || ! ge "$(version)" "$need"; then
  if command -v rustup >/dev/null 2>&1; then
    echo "Rust >= $need needed (found: $(version || true)); installing stable through rustup"
    rustup toolchain install stable --profile minimal
    rustup default stable
  else
    echo "error: Rust >= $need needed (found: $(have && version || echo none))." >&2
    echo "Install it with rustup (https://rustup.rs), then re-run; Debian's rustc/cargo packages are too old." >&2
    exit 1
  fi
fi
ge "$(version)" "$need" || { echo "error: rustc $(version) is older than $need" >&2; exit 1; }

if [ "${1:-}" = lint ]; then
  for c in rustfmt clippy; do
    bin=$c; [ $c = clippy ] && bin=cargo-clippy
    if ! command -v $bin >/dev/null 2>&1 || ! $bin --version >/dev/null 2>&1; then
      command -v rustup >/dev/null 2>&1 || { echo "error: $c missing and no rustup to add it" >&2; exit 1; }
      rustup component add $c
    fi
  done
fi
