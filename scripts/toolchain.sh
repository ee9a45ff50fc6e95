#!/usr/bin/env bash
# Checks for a Rust toolchain new enough for the workspace (Debian's own cargo is too old for it).
set -euo pipefail
if ! command -v cargo >/dev/null 2>&1; then
  [ -x "$HOME/.cargo/bin/cargo" ] && exit 0
  echo "error: cargo not found. Install Rust >= 1.85 (rustup) and re-run." >&2
  exit 1
fi
