//! Sluice's integration suite (issue 2's "Done when"): every routing rule, each balancer's distribution, retries,
//! timeouts, keep-alive reuse, chunked and large streamed bodies, live reload of apisix.yaml under load, graceful
//! shutdown and the seed scenario, all over real sockets on 127.0.0.1. In-process gateways for most tests, the
//! real `sluice` binary for reload, shutdown and the seed. Benchmarks are not here (sluice-bench owns them).

mod admin;
mod admin_compat;
mod api_standalone;
mod balancer;
mod bench_preset;
mod bodies;
mod bulk;
mod cluster_bench;
mod connection;
mod consul_discovery;
mod control;
mod dashboard;
mod dns_discovery;
mod etcd_outage;
mod logs;
mod nodes;
mod operations;
mod product_name;
mod proxy;
mod reload;
mod roles;
mod routing;
mod secrets;
mod seed;
mod shutdown;
mod stream;
mod support;
mod tracing;
mod wasm;
mod zookeeper;
