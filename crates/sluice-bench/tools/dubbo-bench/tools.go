//go:build tools

// Pins dubbo-go-pixiu v1.1.0 in this module so that `go build github.com/apache/dubbo-go-pixiu/cmd/pixiu`
// builds the peer of the `dubbo` bench scenario from go.sum (never a floating version).
package tools

import _ "github.com/apache/dubbo-go-pixiu/cmd/pixiu"
