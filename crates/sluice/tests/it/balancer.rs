//! balancer
