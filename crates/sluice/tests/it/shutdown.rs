//! shutdown
