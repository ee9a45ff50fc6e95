//! bodies
