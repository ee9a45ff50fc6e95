//go:build tools

// Package tools pins h2spec's CLI (github.com/summerwind/h2spec/cmd/h2spec) in this module, so that
// `go build github.com/summerwind/h2spec/cmd/h2spec` here builds the version in go.mod. Sluice's test suite
// (crates/sluice-proxy/tests/h2/h2spec.rs) runs that build against its h2c listener.
package tools

import _ "github.com/summerwind/h2spec/cmd/h2spec"
