//! placeholder
pub mod fields;
pub mod frame;
pub mod grpc_web;
pub mod http_rule;
pub mod options;
pub mod proto;
pub mod status;
pub mod transcode;
