//! Hessian 2 serialization (<http://hessian.caucho.com/doc/hessian-serialization.html>): a value model, an
//! encoder that writes the compact forms Java's `Hessian2Output` writes, and a decoder safe on hostile input.

mod decode;
mod encode;
mod value;

pub use decode::{from_slice, DecodeError, Decoder, DEFAULT_MAX_DEPTH};
pub use encode::{to_vec, Encoder};
pub use value::{ClassDef, Value};
