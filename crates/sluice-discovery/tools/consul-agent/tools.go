//go:build tools

// Package tools pins Consul's agent (MPL-2.0, v1.14.11: before the envoyextensions and troubleshoot submodules)
// so that `go build github.com/hashicorp/consul` builds the real server that the discovery tests start.
package tools

import _ "github.com/hashicorp/consul"
