//! reload
