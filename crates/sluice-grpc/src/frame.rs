//! gRPC length-prefixed message framing (`flag:u8 | length:u32be | message`), shared by gRPC and grpc-web.

use bytes::{Buf, Bytes, BytesMut};

/// The 5-byte prefix length.
pub const PREFIX_LEN: usize = 5;
/// grpc-web marks its trailer frame with this bit in the flag byte.
pub const TRAILER_FLAG: u8 = 0x80;
const COMPRESSED_FLAG: u8 = 0x01;

/// Appends one uncompressed frame holding `message` to `out`.
pub fn encode_frame(message: &[u8], out: &mut Vec<u8>) {
    encode_frame_with_flag(0, message, out);
}

pub(crate) fn encode_frame_with_flag(flag: u8, message: &[u8], out: &mut Vec<u8>) {
    out.reserve(PREFIX_LEN + message.len());
    out.push(flag);
    out.extend_from_slice(&(message.len() as u32).to_be_bytes());
    out.extend_from_slice(message);
}

/// A framing problem in bytes received from an upstream or a client.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("compressed gRPC messages are not supported (grpc-encoding was not negotiated)")]
    Compressed,
    #[error("gRPC message of {len} bytes exceeds the limit of {limit} bytes")]
    TooLarge { len: usize, limit: usize },
    #[error("gRPC frame has an unknown flag byte 0x{0:02x}")]
    BadFlag(u8),
    #[error("gRPC stream ended inside a frame ({0} bytes left over)")]
    Truncated(usize),
}

/// One decoded frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// The flag byte: 0 for a message, [`TRAILER_FLAG`] for a grpc-web trailer block.
    pub flag: u8,
    pub payload: Bytes,
}

impl Frame {
    pub fn is_trailer(&self) -> bool {
        self.flag & TRAILER_FLAG != 0
    }
}

/// Incremental frame decoder: feed bytes as they arrive, take complete frames out. A message is never buffered
/// beyond `max_message` bytes, so a hostile length prefix cannot make it allocate 4 GiB.
#[derive(Debug)]
pub struct Deframer {
    buf: BytesMut,
    max_message: usize,
    allow_trailer: bool,
}

impl Deframer {
    /// A decoder for plain gRPC (flag must be 0).
    pub fn new(max_message: usize) -> Self {
        Deframer {
            buf: BytesMut::new(),
            max_message,
            allow_trailer: false,
        }
    }

    /// A decoder for grpc-web bodies, where a frame with the 0x80 flag carries trailers.
    pub fn grpc_web(max_message: usize) -> Self {
        Deframer {
            allow_trailer: true,
            ..Deframer::new(max_message)
        }
    }

    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// The next complete frame, `Ok(None)` when more bytes are needed.
    pub fn next_frame(&mut self) -> Result<Option<Frame>, FrameError> {
        if self.buf.len() < PREFIX_LEN {
            return Ok(None);
        }
        let flag = self.buf[0];
        let len = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]) as usize;
        let trailer = self.allow_trailer && flag & TRAILER_FLAG != 0;
        if !trailer {
            match flag {
                0 => {}
                COMPRESSED_FLAG => return Err(FrameError::Compressed),
                f => return Err(FrameError::BadFlag(f)),
            }
        } else if flag & !TRAILER_FLAG & !COMPRESSED_FLAG != 0 {
            return Err(FrameError::BadFlag(flag));
        }
        if len > self.max_message {
            return Err(FrameError::TooLarge {
                len,
                limit: self.max_message,
            });
        }
        if self.buf.len() < PREFIX_LEN + len {
            return Ok(None);
        }
        self.buf.advance(PREFIX_LEN);
        let payload = self.buf.split_to(len).freeze();
        Ok(Some(Frame { flag, payload }))
    }

    /// Called at end of stream: an error if a partial frame is left.
    pub fn finish(&self) -> Result<(), FrameError> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(FrameError::Truncated(self.buf.len()))
        }
    }

    /// Bytes held waiting for the rest of a frame.
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn encodes_prefix() {
        let mut out = Vec::new();
        encode_frame(b"\x08\x03", &mut out);
        assert_eq!(out, b"\x00\x00\x00\x00\x02\x08\x03");
    }

    #[test]
    fn rejects_compressed_and_bad_flags() {
        let mut d = Deframer::new(100);
        d.push(b"\x01\x00\x00\x00\x00");
        assert_eq!(d.next_frame(), Err(FrameError::Compressed));
        let mut d = Deframer::new(100);
        d.push(b"\x80\x00\x00\x00\x00");
        assert_eq!(d.next_frame(), Err(FrameError::BadFlag(0x80)));
        let mut d = Deframer::grpc_web(100);
        d.push(b"\x80\x00\x00\x00\x00");
        assert!(d.next_frame().unwrap().unwrap().is_trailer());
    }

    #[test]
    fn hostile_length_is_refused_before_buffering() {
        let mut d = Deframer::new(1024);
        d.push(b"\x00\xff\xff\xff\xff");
        assert_eq!(
            d.next_frame(),
            Err(FrameError::TooLarge {
                len: u32::MAX as usize,
                limit: 1024
            })
        );
    }

    #[test]
    fn truncated_stream_is_reported() {
        let mut d = Deframer::new(1024);
        d.push(b"\x00\x00\x00\x00\x05abc");
        assert_eq!(d.next_frame(), Ok(None));
        assert_eq!(d.finish(), Err(FrameError::Truncated(8)));
    }

    proptest! {
        #[test]
        fn round_trip_any_split(msgs in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..300), 0..8),
                                split in 1usize..64) {
            let mut wire = Vec::new();
            for m in &msgs {
                encode_frame(m, &mut wire);
            }
            let mut d = Deframer::new(1 << 20);
            let mut got = Vec::new();
            for chunk in wire.chunks(split) {
                d.push(chunk);
                while let Some(f) = d.next_frame().unwrap() {
                    prop_assert_eq!(f.flag, 0);
                    got.push(f.payload.to_vec());
                }
            }
            d.finish().unwrap();
            prop_assert_eq!(got, msgs);
        }
    }
}
