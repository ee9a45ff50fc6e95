//! The chunked transfer coding (RFC 9112 §7.1): a strict incremental `ChunkedDecoder` and the encoder helpers.
//!
//! It owns chunk framing only: sizes, extensions (validated, bounded, then dropped), the CRLF after each chunk and
//! the trailer section (validated and returned raw). Data chunks are zero-copy splits of the caller's buffer. It
//! does not interpret extensions or trailer fields, and does not decompress anything. The state table is in
//! `chunked/LIFECYCLE.md` (update it with the code).

#[cfg(test)]
mod tests;

use bytes::{Buf, Bytes, BytesMut};

use crate::parse::is_tchar;
use crate::ParseError;

/// Total bytes of chunk extensions accepted in one message. RFC 9112 §7.1.1: "A recipient MUST ignore unrecognized
/// chunk extensions. A server ought to limit the total length of chunk extensions received in a request to an
/// amount reasonable for the services provided". 16 KiB, as hyper's `CHUNKED_EXTENSIONS_LIMIT`.
pub const CHUNK_EXT_LIMIT: usize = 16 * 1024;

/// Bytes of trailer section accepted (RFC 9112 §7.1.2 trailer-section = *( field-line CRLF )); over it -> 431.
pub const TRAILER_LIMIT: usize = 16 * 1024;

/// The last-chunk with an empty trailer section: ends a chunked body.
pub const LAST_CHUNK: &[u8] = b"0\r\n\r\n";

/// One decoding step's output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Chunk {
    /// Body bytes (a zero-copy split of the input buffer; a chunk may be delivered in several pieces).
    Data(Bytes),
    /// The body ended. `trailers` is the raw trailer section including its final CRLF (just `"\r\n"` if empty).
    End {
        /// Raw, validated trailer field lines plus the terminating empty line.
        trailers: Bytes,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Reading hex digits of chunk-size.
    Size {
        value: u64,
        digits: bool,
    },
    /// BWS after the size: only more whitespace or `;` may follow.
    SizeBws {
        value: u64,
    },
    /// Inside chunk-ext, up to CR.
    Ext {
        value: u64,
    },
    /// Saw CR of the size line.
    SizeLf {
        value: u64,
    },
    /// This many data bytes remain in the current chunk.
    Data(u64),
    DataCr,
    DataLf,
    /// After the last-chunk line: waiting for the whole trailer section.
    Trailers,
    Done,
}

/// Incremental, strict decoder for a chunked body. Feed it the connection's read buffer; it consumes exactly the
/// body, so bytes of a following message stay in the buffer.
#[derive(Debug, Clone)]
pub struct ChunkedDecoder {
    state: State,
    ext_bytes: usize,
}

impl Default for ChunkedDecoder {
    fn default() -> Self {
        Self::new()
    }
}

// === impl ChunkedDecoder ===

impl ChunkedDecoder {
    /// A decoder at the start of a chunked body.
    pub fn new() -> Self {
        ChunkedDecoder {
            state: State::Size {
                value: 0,
                digits: false,
            },
            ext_bytes: 0,
        }
    }

    /// Whether `Chunk::End` was returned; afterwards `decode` consumes nothing and returns `Ok(None)`.
    pub fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// Consume from `buf`; `Ok(None)` = need more input (everything given was consumed or is an incomplete
    /// trailer section). Strict: hex size without overflow, BWS only before `;`, extensions bounded by
    /// `CHUNK_EXT_LIMIT`, CRLF only (no bare LF or CR), trailer section bounded by `TRAILER_LIMIT` and validated.
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Chunk>, ParseError> {
        loop {
            match self.state {
                State::Data(remaining) => {
                    if buf.is_empty() {
                        return Ok(None);
                    }
                    let take = usize::try_from(remaining)
                        .unwrap_or(usize::MAX)
                        .min(buf.len());
                    let left = remaining - take as u64;
                    self.state = if left == 0 {
                        State::DataCr
                    } else {
                        State::Data(left)
                    };
                    return Ok(Some(Chunk::Data(buf.split_to(take).freeze())));
                }
                State::Trailers => return self.trailers(buf),
                State::Done => return Ok(None),
                _ => {
                    // Line states: a handful of bytes per chunk, stepped one at a time.
                    let Some(&b) = buf.first() else {
                        return Ok(None);
                    };
                    self.step(b)?;
                    buf.advance(1);
                }
            }
        }
    }

    fn step(&mut self, b: u8) -> Result<(), ParseError> {
        self.state = match self.state {
            State::Size { value, digits } => match b {
                b'0'..=b'9' | b'a'..=b'f' | b'A'..=b'F' => {
                    let digit = u64::from(hex_value(b));
                    let value = value
                        .checked_mul(16)
                        .and_then(|v| v.checked_add(digit))
                        .ok_or(ParseError::ChunkSizeOverflow)?;
                    State::Size {
                        value,
                        digits: true,
                    }
                }
                _ if !digits => return Err(ParseError::InvalidChunkSize),
                b';' => State::Ext { value },
                b' ' | b'\t' => State::SizeBws { value },
                b'\r' => State::SizeLf { value },
                b'\n' => return Err(ParseError::BareLf),
                _ => return Err(ParseError::InvalidChunkSize),
            },
            State::SizeBws { value } => match b {
                b' ' | b'\t' => State::SizeBws { value },
                b';' => State::Ext { value },
                _ => return Err(ParseError::InvalidChunkSize),
            },
            State::Ext { value } => {
                self.ext_bytes += 1;
                if self.ext_bytes > CHUNK_EXT_LIMIT {
                    return Err(ParseError::ChunkExtensionTooLong);
                }
                match b {
                    b'\r' => State::SizeLf { value },
                    b'\n' => return Err(ParseError::BareLf),
                    b'\t' | b' '..=0x7e | 0x80..=0xff => State::Ext { value },
                    _ => return Err(ParseError::InvalidChunkSize),
                }
            }
            State::SizeLf { value } => match b {
                b'\n' if value == 0 => State::Trailers,
                b'\n' => State::Data(value),
                _ => return Err(ParseError::BareCr),
            },
            State::DataCr if b == b'\r' => State::DataLf,
            State::DataLf if b == b'\n' => State::Size {
                value: 0,
                digits: false,
            },
            State::DataCr | State::DataLf => return Err(ParseError::MissingChunkCrlf),
            State::Data(_) | State::Trailers | State::Done => self.state,
        };
        Ok(())
    }

    /// Wait for the complete trailer section, validate it, hand it out raw.
    fn trailers(&mut self, buf: &mut BytesMut) -> Result<Option<Chunk>, ParseError> {
        let end = if buf.starts_with(b"\r\n") {
            Some(2)
        } else {
            memchr::memmem::find(buf, b"\r\n\r\n").map(|i| i + 4)
        };
        let Some(end) = end else {
            check_no_bare_lf(buf)?;
            if buf.len() > TRAILER_LIMIT {
                return Err(ParseError::TrailersTooLarge);
            }
            return Ok(None);
        };
        if end > TRAILER_LIMIT {
            return Err(ParseError::TrailersTooLarge);
        }
        validate_trailers(&buf[..end])?;
        self.state = State::Done;
        Ok(Some(Chunk::End {
            trailers: buf.split_to(end).freeze(),
        }))
    }
}

fn hex_value(b: u8) -> u8 {
    match b {
        b'0'..=b'9' => b - b'0',
        b'a'..=b'f' => b - b'a' + 10,
        _ => b - b'A' + 10,
    }
}

/// Every LF must end a CRLF; checked on incomplete input too so a bare LF fails at once, not at the size limit.
fn check_no_bare_lf(bytes: &[u8]) -> Result<(), ParseError> {
    for i in memchr::memchr_iter(b'\n', bytes) {
        if i == 0 || bytes[i - 1] != b'\r' {
            return Err(ParseError::BareLf);
        }
    }
    Ok(())
}

/// `section` ends with CRLFCRLF (or is CRLF): each line must be `token ":" OWS value` with no CTL but HTAB.
fn validate_trailers(section: &[u8]) -> Result<(), ParseError> {
    check_no_bare_lf(section)?;
    let body = &section[..section.len() - 2];
    for line in body.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
        let line = line.strip_suffix(b"\r").ok_or(ParseError::InvalidTrailer)?;
        let colon = memchr::memchr(b':', line).ok_or(ParseError::InvalidTrailer)?;
        let (name, value) = (&line[..colon], &line[colon + 1..]);
        if name.is_empty() || !name.iter().all(|&b| is_tchar(b)) {
            return Err(ParseError::InvalidTrailer);
        }
        if !value
            .iter()
            .all(|&b| b == b'\t' || (b >= 0x20 && b != 0x7f))
        {
            return Err(ParseError::InvalidTrailer);
        }
    }
    Ok(())
}

/// Append a chunk-size line (`"{hex}\r\n"`) for `len` data bytes; the caller writes the data and then `"\r\n"`.
/// `len` must not be 0: the body ends with [`LAST_CHUNK`] (or `"0\r\n"` + trailers).
pub fn encode_chunk_header(len: usize, out: &mut BytesMut) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut tmp = [0u8; 2 * std::mem::size_of::<usize>() + 2];
    let mut i = tmp.len() - 2;
    tmp[i..].copy_from_slice(b"\r\n");
    let mut n = len;
    loop {
        i -= 1;
        tmp[i] = HEX[n & 0xf];
        n >>= 4;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&tmp[i..]);
}
