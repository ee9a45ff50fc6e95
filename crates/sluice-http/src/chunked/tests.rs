//! Chunked decoder/encoder tests. Every decode case is fed whole, byte by byte and split in two at every boundary;
//! all must yield the same body bytes, trailers, leftover bytes (or the same error).

use bytes::{BufMut, BytesMut};

use super::{
    encode_chunk_header, Chunk, ChunkedDecoder, CHUNK_EXT_LIMIT, LAST_CHUNK, TRAILER_LIMIT,
};
use crate::ParseError;

#[derive(Debug, PartialEq, Eq)]
struct Decoded {
    body: Vec<u8>,
    trailers: Vec<u8>,
    rest: Vec<u8>,
}

/// Feed `pieces` in order into one buffer, draining the decoder after each; `Err` on the first error.
fn run(pieces: &[&[u8]]) -> Result<Decoded, ParseError> {
    let mut dec = ChunkedDecoder::new();
    let mut buf = BytesMut::new();
    let mut body = Vec::new();
    for (i, piece) in pieces.iter().enumerate() {
        buf.put_slice(piece);
        loop {
            match dec.decode(&mut buf)? {
                Some(Chunk::Data(d)) => {
                    assert!(!d.is_empty(), "empty data chunk");
                    body.extend_from_slice(&d);
                }
                Some(Chunk::End { trailers }) => {
                    assert!(dec.is_done());
                    assert_eq!(dec.decode(&mut buf), Ok(None), "nothing after End");
                    let mut rest = buf.to_vec();
                    rest.extend_from_slice(&pieces[i + 1..].concat());
                    return Ok(Decoded {
                        body,
                        trailers: trailers.to_vec(),
                        rest,
                    });
                }
                None => break,
            }
        }
    }
    panic!(
        "body never ended: {:?}",
        String::from_utf8_lossy(&pieces.concat())
    );
}

fn all_ways(input: &[u8]) -> Result<Decoded, ParseError> {
    let whole = run(&[input]);
    let step = if input.len() > 4096 { 509 } else { 1 };
    let bytes: Vec<&[u8]> = input.chunks(step).collect();
    assert_eq!(
        run(&bytes),
        whole,
        "byte by byte: {:?}",
        String::from_utf8_lossy(input)
    );
    for k in (0..=input.len()).step_by(step) {
        let (a, b) = input.split_at(k);
        assert_eq!(
            run(&[a, b]),
            whole,
            "split at {k}: {:?}",
            String::from_utf8_lossy(input)
        );
    }
    whole
}

fn ok(input: &[u8]) -> Decoded {
    all_ways(input)
        .unwrap_or_else(|e| panic!("{:?} rejected: {e:?}", String::from_utf8_lossy(input)))
}

fn err(input: &[u8]) -> ParseError {
    match all_ways(input) {
        Ok(d) => panic!("{:?} accepted: {d:?}", String::from_utf8_lossy(input)),
        Err(e) => e,
    }
}

#[test]
fn basic_body() {
    let d = ok(b"4\r\nWiki\r\n5\r\npedia\r\n0\r\n\r\n");
    assert_eq!(d.body, b"Wikipedia");
    assert_eq!(d.trailers, b"\r\n");
    assert!(d.rest.is_empty());
}

#[test]
fn upper_case_hex_and_leading_zeros() {
    assert_eq!(ok(b"A\r\n0123456789\r\n000\r\n\r\n").body, b"0123456789");
    assert_eq!(ok(b"00001\r\nx\r\n0\r\n\r\n").body, b"x");
}

#[test]
fn extensions_are_accepted_and_dropped() {
    let d = ok(b"4;name=value;x=\"q s\"\r\nWiki\r\n0;last\r\n\r\n");
    assert_eq!(d.body, b"Wiki");
    assert_eq!(
        ok(b"4 \t;a\r\nWiki\r\n0\r\n\r\n").body,
        b"Wiki",
        "BWS before ';'"
    );
}

#[test]
fn trailers_are_returned_raw() {
    let d = ok(b"3\r\nabc\r\n0\r\nX-Checksum: 1\r\nX-Other: two\r\n\r\n");
    assert_eq!(d.body, b"abc");
    assert_eq!(d.trailers, b"X-Checksum: 1\r\nX-Other: two\r\n\r\n");
}

#[test]
fn following_message_stays_in_the_buffer() {
    let d = ok(b"1\r\na\r\n0\r\n\r\nGET / HTTP/1.1\r\n");
    assert_eq!(d.rest, b"GET / HTTP/1.1\r\n");
}

#[test]
fn data_is_a_zero_copy_split() {
    let mut buf = BytesMut::from(&b"5\r\nhello\r\n0\r\n\r\n"[..]);
    let base = buf.as_ptr() as usize;
    let mut dec = ChunkedDecoder::new();
    match dec.decode(&mut buf) {
        Ok(Some(Chunk::Data(d))) => {
            assert_eq!(&d[..], b"hello");
            assert_eq!(
                d.as_ptr() as usize,
                base + 3,
                "points into the input allocation"
            );
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn size_line_errors() {
    use ParseError::*;
    let cases: &[(&[u8], ParseError)] = &[
        (b"\r\nabc", InvalidChunkSize),
        (b";x\r\n", InvalidChunkSize),
        (b"g\r\n", InvalidChunkSize),
        (b"-1\r\n", InvalidChunkSize),
        (b"0x10\r\n", InvalidChunkSize),
        (b"4 \r\nWiki\r\n0\r\n\r\n", InvalidChunkSize),
        (b"4 x\r\n", InvalidChunkSize),
        (b"4;a\x01\r\n", InvalidChunkSize),
        (b"4\nWiki\r\n0\r\n\r\n", BareLf),
        (b"4;ext\nWiki\r\n0\r\n\r\n", BareLf),
        (b"4\rWiki", BareCr),
        (b"10000000000000000\r\n", ChunkSizeOverflow),
    ];
    for (input, want) in cases {
        let e = err(input);
        assert_eq!(
            (e, e.status()),
            (*want, 400),
            "{:?}",
            String::from_utf8_lossy(input)
        );
        assert!(e.is_body_error() || matches!(e, BareLf | BareCr));
    }
}

#[test]
fn largest_size_is_not_an_overflow() {
    let mut dec = ChunkedDecoder::new();
    let mut buf = BytesMut::from(&b"ffffffffffffffff\r\nab"[..]);
    match dec.decode(&mut buf) {
        Ok(Some(Chunk::Data(d))) => assert_eq!(&d[..], b"ab"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn data_must_end_with_crlf() {
    assert_eq!(err(b"4\r\nWiki\n0\r\n\r\n"), ParseError::MissingChunkCrlf);
    assert_eq!(
        err(b"4\r\nWikii\r\n0\r\n\r\n"),
        ParseError::MissingChunkCrlf
    );
    assert_eq!(err(b"4\r\nWiki\rX0\r\n\r\n"), ParseError::MissingChunkCrlf);
}

#[test]
fn extensions_are_bounded_per_message() {
    let ext = "x".repeat(CHUNK_EXT_LIMIT / 2);
    let input = format!("1;{ext}\r\na\r\n1;{ext}\r\nb\r\n0\r\n\r\n");
    assert_eq!(err(input.as_bytes()), ParseError::ChunkExtensionTooLong);
    let fits = format!("1;{}\r\na\r\n0\r\n\r\n", "x".repeat(CHUNK_EXT_LIMIT - 2));
    assert_eq!(ok(fits.as_bytes()).body, b"a");
}

#[test]
fn trailer_errors() {
    use ParseError::*;
    let cases: &[(&[u8], ParseError)] = &[
        (b"0\r\nX: a\n\r\n", BareLf),
        (b"0\r\nX: a\r\n\n", BareLf),
        (b"0\r\nno colon\r\n\r\n", InvalidTrailer),
        (b"0\r\nX : a\r\n\r\n", InvalidTrailer),
        (b"0\r\nX: a\r\n b\r\n\r\n", InvalidTrailer),
        (b"0\r\nX: a\x01\r\n\r\n", InvalidTrailer),
        (b"0\r\nX: a\rb\r\n\r\n", InvalidTrailer),
    ];
    for (input, want) in cases {
        assert_eq!(err(input), *want, "{:?}", String::from_utf8_lossy(input));
    }
    let big = format!("0\r\nX-Big: {}\r\n\r\n", "t".repeat(TRAILER_LIMIT));
    let e = err(big.as_bytes());
    assert_eq!((e, e.status()), (TrailersTooLarge, 431));
}

#[test]
fn encode_chunk_header_is_lowercase_hex() {
    let cases: &[(usize, &[u8])] = &[
        (1, b"1\r\n"),
        (15, b"f\r\n"),
        (255, b"ff\r\n"),
        (4096, b"1000\r\n"),
        (0xdead_beef, b"deadbeef\r\n"),
    ];
    for (len, want) in cases {
        let mut out = BytesMut::new();
        encode_chunk_header(*len, &mut out);
        assert_eq!(&out[..], *want);
    }
    let mut out = BytesMut::new();
    encode_chunk_header(usize::MAX, &mut out);
    assert_eq!(out.len(), 2 * std::mem::size_of::<usize>() + 2);
}

#[test]
fn encode_then_decode_round_trips() {
    let payload: Vec<u8> = (0..5000u32).map(|i| (i * 7 % 251) as u8).collect();
    let mut wire = BytesMut::new();
    for piece in payload.chunks(777) {
        encode_chunk_header(piece.len(), &mut wire);
        wire.put_slice(piece);
        wire.put_slice(b"\r\n");
    }
    wire.put_slice(LAST_CHUNK);
    let d = ok(&wire);
    assert_eq!(d.body, payload);
    assert_eq!(d.trailers, b"\r\n");
}

/// Mutated bodies never panic, and whole / byte-by-byte / split feeding agree whenever the body completes or fails.
#[test]
fn mutated_bodies_decode_consistently() {
    const SEED: &[u8] = b"4;e=1\r\nWiki\r\n5\r\npedia\r\n0\r\nX-T: v\r\n\r\nNEXT";
    const BYTES: &[u8] = b" \t\r\n;:=0aFg\x00\x7f\xff";
    let mut state = 0xc4u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state as usize
    };
    for _ in 0..400 {
        let mut input = SEED.to_vec();
        for _ in 0..1 + next() % 3 {
            let at = next() % input.len();
            let b = BYTES[next() % BYTES.len()];
            match next() % 3 {
                0 => input[at] = b,
                1 => input.insert(at, b),
                _ => {
                    input.remove(at);
                }
            }
        }
        // Skip bodies that neither end nor fail within the input (they would wait for more bytes).
        let mut dec = ChunkedDecoder::new();
        let mut buf = BytesMut::from(&input[..]);
        let finishes = loop {
            match dec.decode(&mut buf) {
                Ok(Some(Chunk::Data(_))) => continue,
                Ok(Some(Chunk::End { .. })) | Err(_) => break true,
                Ok(None) => break false,
            }
        };
        if finishes {
            let _ = all_ways(&input);
        }
    }
}
