//go:build tools

// Package tools pins grpc-go's example servers (helloworld greeter_server, route_guide server) in this module, so
// that `go build google.golang.org/grpc/examples/...` here builds the versions in go.mod. Sluice's gRPC tests
// (crates/sluice-proxy/tests/common/grpc_peers.rs) build and start them as real upstreams.
package tools

import (
	_ "google.golang.org/grpc/examples/helloworld/greeter_server"
	_ "google.golang.org/grpc/examples/route_guide/server"
)
