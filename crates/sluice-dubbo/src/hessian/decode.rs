//! Hessian 2 decoder for untrusted input.
//!
//! Every length is checked against the bytes that remain before anything is allocated, nesting is bounded, and
//! references are bounded too: a reference (`Q`) to an earlier container decodes that container's bytes again
//! (the tree holds no shared nodes), and the bytes decoded that way are limited to `max_ref_bytes`, so a chain of
//! references cannot blow a small input up into a huge tree.

use std::sync::Arc;

use super::value::{ClassDef, Value};

/// Nesting limit by default (lists, maps and objects inside each other).
pub const DEFAULT_MAX_DEPTH: usize = 128;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("hessian: input ends inside a value")]
    Truncated,
    #[error("hessian: unexpected byte 0x{tag:02x} at offset {offset}")]
    UnexpectedTag { tag: u8, offset: usize },
    #[error("hessian: nesting deeper than {0}")]
    TooDeep(usize),
    #[error("hessian: bad length {len} at offset {offset}")]
    BadLength { len: i64, offset: usize },
    #[error("hessian: invalid UTF-8 in a string at offset {0}")]
    BadUtf8(usize),
    #[error("hessian: reference {0} to a value not seen")]
    BadRef(i64),
    #[error("hessian: class definition {0} not seen")]
    BadClass(i64),
    #[error("hessian: type reference {0} not seen")]
    BadType(i64),
    #[error("hessian: references expand beyond {0} bytes")]
    RefExpansion(usize),
}

type Result<T> = std::result::Result<T, DecodeError>;

#[derive(Clone, Copy)]
struct Slot {
    start: usize,
    end: usize,
    open: bool,
}

/// Reads Hessian 2 values from a byte slice. One decoder is one Hessian stream: class definitions, type names
/// and references carry over from one value to the next (a Dubbo body is one stream).
pub struct Decoder<'a> {
    input: &'a [u8],
    pos: usize,
    depth: usize,
    max_depth: usize,
    classes: Vec<Arc<ClassDef>>,
    types: Vec<String>,
    refs: Vec<Slot>,
    replaying: usize,
    ref_budget: usize,
    max_ref_bytes: usize,
}

impl<'a> Decoder<'a> {
    pub fn new(input: &'a [u8]) -> Self {
        let max_ref_bytes = input.len().max(64 * 1024);
        Decoder {
            input,
            pos: 0,
            depth: 0,
            max_depth: DEFAULT_MAX_DEPTH,
            classes: Vec::new(),
            types: Vec::new(),
            refs: Vec::new(),
            replaying: 0,
            ref_budget: max_ref_bytes,
            max_ref_bytes,
        }
    }

    /// Nesting limit (default [`DEFAULT_MAX_DEPTH`]).
    pub fn max_depth(mut self, depth: usize) -> Self {
        self.max_depth = depth;
        self
    }

    /// How many input bytes references may decode again in total (default: the input's length, at least 64 KiB).
    pub fn max_ref_bytes(mut self, bytes: usize) -> Self {
        self.max_ref_bytes = bytes;
        self.ref_budget = bytes;
        self
    }

    /// Offset of the next value.
    pub fn position(&self) -> usize {
        self.pos
    }

    /// True when all input has been read.
    pub fn is_empty(&self) -> bool {
        self.pos >= self.input.len()
    }

    fn remaining(&self) -> usize {
        self.input.len() - self.pos
    }

    fn byte(&mut self) -> Result<u8> {
        let b = *self.input.get(self.pos).ok_or(DecodeError::Truncated)?;
        self.pos += 1;
        Ok(b)
    }

    fn peek(&self) -> Result<u8> {
        self.input
            .get(self.pos)
            .copied()
            .ok_or(DecodeError::Truncated)
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        if self.remaining() < n {
            return Err(DecodeError::Truncated);
        }
        let s = &self.input[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N]> {
        let mut a = [0; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }

    fn u16(&mut self) -> Result<usize> {
        Ok(u16::from_be_bytes(self.array()?) as usize)
    }

    fn unexpected(&self, tag: u8) -> DecodeError {
        DecodeError::UnexpectedTag {
            tag,
            offset: self.pos.saturating_sub(1),
        }
    }

    /// Reads the next value.
    pub fn read(&mut self) -> Result<Value> {
        loop {
            let start = self.pos;
            let tag = self.byte()?;
            return Ok(match tag {
                b'N' => Value::Null,
                b'T' => Value::Bool(true),
                b'F' => Value::Bool(false),
                0x80..=0xd7 | b'I' => Value::Int(self.int_after(tag)?),
                0xd8..=0xff | 0x38..=0x3f | b'Y' | b'L' => Value::Long(self.long_after(tag)?),
                0x5b..=0x5f | b'D' => Value::Double(self.double_after(tag)?),
                0x4a => Value::Date(i64::from_be_bytes(self.array()?)),
                0x4b => Value::Date(i32::from_be_bytes(self.array()?) as i64 * 60_000),
                0x00..=0x1f | 0x30..=0x33 | b'S' | b'R' => Value::String(self.string_after(tag)?),
                0x20..=0x2f | 0x34..=0x37 | b'A' | b'B' => Value::Binary(self.binary_after(tag)?),
                b'C' => {
                    self.class_def()?;
                    continue;
                }
                b'U' | b'V' | b'W' | b'X' | 0x70..=0x7f => self.list_after(tag, start)?,
                b'H' | b'M' => self.map_after(tag, start)?,
                b'O' | 0x60..=0x6f => self.object_after(tag, start)?,
                b'Q' => self.reference()?,
                _ => return Err(self.unexpected(tag)),
            });
        }
    }

    /// Reads an int (`I` or a compact int), as lengths and indexes are written.
    pub fn read_int(&mut self) -> Result<i32> {
        let tag = self.byte()?;
        match tag {
            0x80..=0xd7 | b'I' => self.int_after(tag),
            _ => Err(self.unexpected(tag)),
        }
    }

    /// Reads a string or null (`None`).
    pub fn read_string(&mut self) -> Result<Option<String>> {
        let tag = self.byte()?;
        match tag {
            b'N' => Ok(None),
            0x00..=0x1f | 0x30..=0x33 | b'S' | b'R' => self.string_after(tag).map(Some),
            _ => Err(self.unexpected(tag)),
        }
    }

    fn int_after(&mut self, tag: u8) -> Result<i32> {
        Ok(match tag {
            0x80..=0xbf => tag as i32 - 0x90,
            0xc0..=0xcf => ((tag as i32 - 0xc8) << 8) | self.byte()? as i32,
            0xd0..=0xd7 => {
                let [a, b] = self.array()?;
                ((tag as i32 - 0xd4) << 16) | (a as i32) << 8 | b as i32
            }
            _ => i32::from_be_bytes(self.array()?),
        })
    }

    fn long_after(&mut self, tag: u8) -> Result<i64> {
        Ok(match tag {
            0xd8..=0xef => tag as i64 - 0xe0,
            0xf0..=0xff => ((tag as i64 - 0xf8) << 8) | self.byte()? as i64,
            0x38..=0x3f => {
                let [a, b] = self.array()?;
                ((tag as i64 - 0x3c) << 16) | (a as i64) << 8 | b as i64
            }
            b'Y' => i32::from_be_bytes(self.array()?) as i64,
            _ => i64::from_be_bytes(self.array()?),
        })
    }

    fn double_after(&mut self, tag: u8) -> Result<f64> {
        Ok(match tag {
            0x5b => 0.0,
            0x5c => 1.0,
            0x5d => self.byte()? as i8 as f64,
            0x5e => i16::from_be_bytes(self.array()?) as f64,
            0x5f => 0.001 * i32::from_be_bytes(self.array()?) as f64,
            _ => f64::from_bits(u64::from_be_bytes(self.array()?)),
        })
    }

    fn string_after(&mut self, mut tag: u8) -> Result<String> {
        let mut s = String::new();
        let mut high: Option<u16> = None;
        loop {
            let (units, last) = match tag {
                0x00..=0x1f => (tag as usize, true),
                0x30..=0x33 => (((tag as usize - 0x30) << 8) | self.byte()? as usize, true),
                b'S' => (self.u16()?, true),
                b'R' => (self.u16()?, false),
                _ => return Err(self.unexpected(tag)),
            };
            self.utf16_units(units, &mut s, &mut high)?;
            if last {
                if high.is_some() {
                    s.push(char::REPLACEMENT_CHARACTER);
                }
                return Ok(s);
            }
            tag = self.byte()?;
        }
    }

    /// Decodes `units` UTF-16 units written as UTF-8, CESU-8 (Java: surrogates as 3 bytes each) or 4-byte UTF-8
    /// (counted as 2 units, what dubbo-go writes). A lone surrogate becomes U+FFFD.
    fn utf16_units(&mut self, units: usize, s: &mut String, high: &mut Option<u16>) -> Result<()> {
        let rest = &self.input[self.pos..];
        if high.is_none() && rest.len() >= units && rest[..units].is_ascii() {
            // ASCII: one byte per unit (the common case).
            s.push_str(
                std::str::from_utf8(&rest[..units]).map_err(|_| DecodeError::BadUtf8(self.pos))?,
            );
            self.pos += units;
            return Ok(());
        }
        s.reserve(units.min(rest.len()));
        let mut left = units;
        while left > 0 {
            let at = self.pos;
            let b0 = self.byte()? as u32;
            let cont = |d: &mut Self| -> Result<u32> {
                let b = d.byte()? as u32;
                if b & 0xc0 != 0x80 {
                    return Err(DecodeError::BadUtf8(at));
                }
                Ok(b & 0x3f)
            };
            let (cp, n) = if b0 < 0x80 {
                (b0, 1)
            } else if b0 & 0xe0 == 0xc0 {
                (((b0 & 0x1f) << 6) | cont(self)?, 1)
            } else if b0 & 0xf0 == 0xe0 {
                (((b0 & 0x0f) << 12) | cont(self)? << 6 | cont(self)?, 1)
            } else if b0 & 0xf8 == 0xf0 && left >= 2 {
                let cp = ((b0 & 0x07) << 18) | cont(self)? << 12 | cont(self)? << 6 | cont(self)?;
                (cp, 2)
            } else {
                return Err(DecodeError::BadUtf8(at));
            };
            left -= n;
            match cp {
                0xd800..=0xdbff => {
                    if high.replace(cp as u16).is_some() {
                        s.push(char::REPLACEMENT_CHARACTER);
                    }
                }
                0xdc00..=0xdfff => match high.take() {
                    Some(h) => {
                        let c = 0x10000 + ((h as u32 - 0xd800) << 10) + (cp - 0xdc00);
                        s.push(char::from_u32(c).unwrap_or(char::REPLACEMENT_CHARACTER));
                    }
                    None => s.push(char::REPLACEMENT_CHARACTER),
                },
                _ => {
                    if high.take().is_some() {
                        s.push(char::REPLACEMENT_CHARACTER);
                    }
                    s.push(char::from_u32(cp).ok_or(DecodeError::BadUtf8(at))?);
                }
            }
        }
        Ok(())
    }

    fn binary_after(&mut self, mut tag: u8) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        loop {
            let (len, last) = match tag {
                0x20..=0x2f => (tag as usize - 0x20, true),
                0x34..=0x37 => (((tag as usize - 0x34) << 8) | self.byte()? as usize, true),
                b'B' => (self.u16()?, true),
                b'A' => (self.u16()?, false),
                _ => return Err(self.unexpected(tag)),
            };
            out.extend_from_slice(self.take(len)?);
            if last {
                return Ok(out);
            }
            tag = self.byte()?;
        }
    }

    /// A length or count that must be covered by the remaining input, `min_bytes` bytes per element at least.
    fn count(&mut self, min_bytes: usize) -> Result<usize> {
        let offset = self.pos;
        let n = self.read_int()?;
        if n < 0 || (n as usize).saturating_mul(min_bytes) > self.remaining() {
            return Err(DecodeError::BadLength {
                len: n as i64,
                offset,
            });
        }
        Ok(n as usize)
    }

    fn read_type(&mut self) -> Result<String> {
        let tag = self.byte()?;
        match tag {
            0x00..=0x1f | 0x30..=0x33 | b'S' | b'R' => {
                let t = self.string_after(tag)?;
                if self.replaying == 0 {
                    self.types.push(t.clone());
                }
                Ok(t)
            }
            0x80..=0xd7 | b'I' => {
                let i = self.int_after(tag)?;
                usize::try_from(i)
                    .ok()
                    .and_then(|i| self.types.get(i))
                    .cloned()
                    .ok_or(DecodeError::BadType(i as i64))
            }
            _ => Err(self.unexpected(tag)),
        }
    }

    fn class_def(&mut self) -> Result<()> {
        let name = self.read_string()?.ok_or(DecodeError::UnexpectedTag {
            tag: b'N',
            offset: self.pos - 1,
        })?;
        let n = self.count(1)?;
        let mut fields = Vec::with_capacity(n);
        for _ in 0..n {
            let f = self.read_string()?.ok_or(DecodeError::UnexpectedTag {
                tag: b'N',
                offset: self.pos - 1,
            })?;
            fields.push(f);
        }
        if self.replaying == 0 {
            self.classes.push(Arc::new(ClassDef { name, fields }));
        }
        Ok(())
    }

    fn enter(&mut self, start: usize) -> Result<Option<usize>> {
        self.depth += 1;
        if self.depth > self.max_depth {
            return Err(DecodeError::TooDeep(self.max_depth));
        }
        if self.replaying > 0 {
            return Ok(None);
        }
        self.refs.push(Slot {
            start,
            end: 0,
            open: true,
        });
        Ok(Some(self.refs.len() - 1))
    }

    fn leave(&mut self, slot: Option<usize>) {
        self.depth -= 1;
        if let Some(i) = slot {
            self.refs[i].end = self.pos;
            self.refs[i].open = false;
        }
    }

    fn list_after(&mut self, tag: u8, start: usize) -> Result<Value> {
        let slot = self.enter(start)?;
        let typ = match tag {
            b'U' | b'V' | 0x70..=0x77 => Some(self.read_type()?),
            _ => None,
        };
        let len = match tag {
            b'V' | b'X' => Some(self.count(1)?),
            0x70..=0x77 => Some(tag as usize - 0x70),
            0x78..=0x7f => Some(tag as usize - 0x78),
            _ => None,
        };
        let mut items = Vec::with_capacity(len.unwrap_or(0).min(self.remaining()));
        match len {
            Some(n) => {
                for _ in 0..n {
                    items.push(self.read()?);
                }
            }
            None => {
                while self.peek()? != b'Z' {
                    items.push(self.read()?);
                }
                self.pos += 1;
            }
        }
        self.leave(slot);
        Ok(Value::List { typ, items })
    }

    fn map_after(&mut self, tag: u8, start: usize) -> Result<Value> {
        let slot = self.enter(start)?;
        let typ = if tag == b'M' {
            Some(self.read_type()?)
        } else {
            None
        };
        let mut entries = Vec::new();
        while self.peek()? != b'Z' {
            let k = self.read()?;
            let v = self.read()?;
            entries.push((k, v));
        }
        self.pos += 1;
        self.leave(slot);
        Ok(Value::Map { typ, entries })
    }

    fn object_after(&mut self, tag: u8, start: usize) -> Result<Value> {
        let idx = match tag {
            b'O' => self.read_int()? as i64,
            _ => tag as i64 - 0x60,
        };
        let class = usize::try_from(idx)
            .ok()
            .and_then(|i| self.classes.get(i))
            .cloned()
            .ok_or(DecodeError::BadClass(idx))?;
        let slot = self.enter(start)?;
        let mut fields = Vec::with_capacity(class.fields.len().min(self.remaining()));
        for _ in 0..class.fields.len() {
            fields.push(self.read()?);
        }
        self.leave(slot);
        Ok(Value::Object { class, fields })
    }

    fn reference(&mut self) -> Result<Value> {
        let n = self.read_int()?;
        let slot = usize::try_from(n)
            .ok()
            .and_then(|i| self.refs.get(i).copied())
            .ok_or(DecodeError::BadRef(n as i64))?;
        if slot.open {
            return Ok(Value::Ref(n as u32));
        }
        let cost = slot.end - slot.start;
        if cost > self.ref_budget {
            return Err(DecodeError::RefExpansion(self.max_ref_bytes));
        }
        self.ref_budget -= cost;
        let back = self.pos;
        self.pos = slot.start;
        self.replaying += 1;
        self.refs[n as usize].open = true;
        let v = self.read();
        self.refs[n as usize].open = false;
        self.replaying -= 1;
        self.pos = back;
        v
    }
}

/// Decodes exactly one value that must fill `input`.
pub fn from_slice(input: &[u8]) -> Result<Value> {
    let mut d = Decoder::new(input);
    let v = d.read()?;
    if !d.is_empty() {
        return Err(DecodeError::UnexpectedTag {
            tag: input[d.position()],
            offset: d.position(),
        });
    }
    Ok(v)
}
