module sluice/tools/grpc-peers

// grpc-go's examples, pinned (the Go proxy here refuses @latest for them); they need Go >= 1.25 (Debian
// bookworm's golang-go is 1.19: tests/common/grpc_peers.rs then reports Go as missing).
go 1.25.0

require google.golang.org/grpc/examples v0.0.0-20260825154716-030ee8becb20

require (
	golang.org/x/net v0.58.0 // indirect
	golang.org/x/sys v0.47.0 // indirect
	golang.org/x/text v0.41.0 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20260526163538-3dc84a4a5aaa // indirect
	google.golang.org/grpc v1.81.1 // indirect
	google.golang.org/protobuf v1.36.11 // indirect
)
