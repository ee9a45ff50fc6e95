//! Hessian 2 encoder, with the compact encodings Java's `Hessian2Output` picks, so that values built like a Java
//! consumer's encode to the same bytes.

use std::sync::Arc;

use super::value::{ClassDef, Value};

/// Strings and binaries longer than this go out in chunks (what Java's `Hessian2Output` does).
const CHUNK: usize = 0x8000;

/// Writes Hessian 2 values into a buffer. One encoder is one Hessian stream: class definitions and type names
/// written once are referred to by number afterwards, so use one encoder for all the values of one Dubbo body.
pub struct Encoder<'a> {
    out: &'a mut Vec<u8>,
    classes: Vec<Arc<ClassDef>>,
    types: Vec<String>,
}

impl<'a> Encoder<'a> {
    /// Appends to `out`.
    pub fn new(out: &'a mut Vec<u8>) -> Self {
        Encoder {
            out,
            classes: Vec::new(),
            types: Vec::new(),
        }
    }

    pub fn write(&mut self, v: &Value) {
        match v {
            Value::Null => self.write_null(),
            Value::Bool(b) => self.write_bool(*b),
            Value::Int(i) => self.write_int(*i),
            Value::Long(l) => self.write_long(*l),
            Value::Double(d) => self.write_double(*d),
            Value::Date(ms) => self.write_date(*ms),
            Value::String(s) => self.write_str(s),
            Value::Binary(b) => self.write_binary(b),
            Value::List { typ, items } => {
                self.write_list_begin(items.len(), typ.as_deref());
                for it in items {
                    self.write(it);
                }
            }
            Value::Map { typ, entries } => {
                self.write_map_begin(typ.as_deref());
                for (k, v) in entries {
                    self.write(k);
                    self.write(v);
                }
                self.write_map_end();
            }
            Value::Object { class, fields } => {
                self.write_object_begin(class);
                // A value whose field count disagrees with its class still yields a well-formed stream.
                for i in 0..class.fields.len() {
                    self.write(fields.get(i).unwrap_or(&Value::Null));
                }
            }
            Value::Ref(n) => {
                self.out.push(b'Q');
                self.write_int(*n as i32);
            }
        }
    }

    pub fn write_null(&mut self) {
        self.out.push(b'N');
    }

    pub fn write_bool(&mut self, b: bool) {
        self.out.push(if b { b'T' } else { b'F' });
    }

    pub fn write_int(&mut self, v: i32) {
        let out = &mut *self.out;
        if (-0x10..=0x2f).contains(&v) {
            out.push((v + 0x90) as u8);
        } else if (-0x800..=0x7ff).contains(&v) {
            out.extend_from_slice(&[(0xc8 + (v >> 8)) as u8, v as u8]);
        } else if (-0x40000..=0x3ffff).contains(&v) {
            out.extend_from_slice(&[(0xd4 + (v >> 16)) as u8, (v >> 8) as u8, v as u8]);
        } else {
            out.push(b'I');
            out.extend_from_slice(&v.to_be_bytes());
        }
    }

    pub fn write_long(&mut self, v: i64) {
        let out = &mut *self.out;
        if (-8..=15).contains(&v) {
            out.push((v + 0xe0) as u8);
        } else if (-0x800..=0x7ff).contains(&v) {
            out.extend_from_slice(&[(0xf8 + (v >> 8)) as u8, v as u8]);
        } else if (-0x40000..=0x3ffff).contains(&v) {
            out.extend_from_slice(&[(0x3c + (v >> 16)) as u8, (v >> 8) as u8, v as u8]);
        } else if i32::try_from(v).is_ok() {
            out.push(b'Y');
            out.extend_from_slice(&(v as i32).to_be_bytes());
        } else {
            out.push(b'L');
            out.extend_from_slice(&v.to_be_bytes());
        }
    }

    pub fn write_double(&mut self, v: f64) {
        let out = &mut *self.out;
        // Same choices as Java's Hessian2Output.writeDouble (Java's (int) cast saturates like Rust's `as`).
        let i = v as i32;
        if i as f64 == v {
            match i {
                0 => return out.push(0x5b),
                1 => return out.push(0x5c),
                -0x80..=0x7f => return out.extend_from_slice(&[0x5d, i as u8]),
                -0x8000..=0x7fff => return out.extend_from_slice(&[0x5e, (i >> 8) as u8, i as u8]),
                _ => {}
            }
        }
        let mills = (v * 1000.0) as i32;
        if 0.001 * mills as f64 == v {
            out.push(0x5f);
            out.extend_from_slice(&mills.to_be_bytes());
        } else {
            out.push(b'D');
            out.extend_from_slice(&v.to_bits().to_be_bytes());
        }
    }

    /// A `java.util.Date` from milliseconds since the epoch.
    pub fn write_date(&mut self, ms: i64) {
        if ms % 60_000 == 0 {
            if let Ok(min) = i32::try_from(ms / 60_000) {
                self.out.push(0x4b);
                self.out.extend_from_slice(&min.to_be_bytes());
                return;
            }
        }
        self.out.push(0x4a);
        self.out.extend_from_slice(&ms.to_be_bytes());
    }

    /// A string. Hessian counts UTF-16 units and, like Java, writes a supplementary character as two 3-byte
    /// surrogates; any other character's bytes are its UTF-8 bytes.
    pub fn write_str(&mut self, s: &str) {
        let bytes = s.as_bytes();
        if !bytes.iter().any(|&b| b >= 0xf0) {
            let units = if s.is_ascii() {
                bytes.len()
            } else {
                s.chars().count()
            };
            if units <= CHUNK {
                self.string_chunk_header(units, true);
                self.out.extend_from_slice(bytes);
                return;
            }
        }
        let units: Vec<u16> = s.encode_utf16().collect();
        let mut rest = &units[..];
        while rest.len() > CHUNK {
            let mut n = CHUNK;
            // Never split a surrogate pair across chunks.
            if (0xd800..0xdc00).contains(&rest[n - 1]) {
                n -= 1;
            }
            self.string_chunk_header(n, false);
            self.write_units(&rest[..n]);
            rest = &rest[n..];
        }
        self.string_chunk_header(rest.len(), true);
        self.write_units(rest);
    }

    fn string_chunk_header(&mut self, units: usize, last: bool) {
        let out = &mut *self.out;
        if !last {
            out.push(b'R');
            out.extend_from_slice(&(units as u16).to_be_bytes());
        } else if units < 32 {
            out.push(units as u8);
        } else if units < 1024 {
            out.extend_from_slice(&[0x30 + (units >> 8) as u8, units as u8]);
        } else {
            out.push(b'S');
            out.extend_from_slice(&(units as u16).to_be_bytes());
        }
    }

    fn write_units(&mut self, units: &[u16]) {
        for &u in units {
            let u = u as u32;
            if u < 0x80 {
                self.out.push(u as u8);
            } else if u < 0x800 {
                self.out
                    .extend_from_slice(&[0xc0 | (u >> 6) as u8, 0x80 | (u & 0x3f) as u8]);
            } else {
                self.out.extend_from_slice(&[
                    0xe0 | (u >> 12) as u8,
                    0x80 | ((u >> 6) & 0x3f) as u8,
                    0x80 | (u & 0x3f) as u8,
                ]);
            }
        }
    }

    pub fn write_binary(&mut self, b: &[u8]) {
        let out = &mut *self.out;
        if b.len() < 16 {
            out.push(0x20 + b.len() as u8);
        } else if b.len() < 1024 {
            out.extend_from_slice(&[0x34 + (b.len() >> 8) as u8, b.len() as u8]);
        } else {
            let mut rest = b;
            while rest.len() > CHUNK {
                out.push(b'A');
                out.extend_from_slice(&(CHUNK as u16).to_be_bytes());
                out.extend_from_slice(&rest[..CHUNK]);
                rest = &rest[CHUNK..];
            }
            out.push(b'B');
            out.extend_from_slice(&(rest.len() as u16).to_be_bytes());
            out.extend_from_slice(rest);
            return;
        }
        out.extend_from_slice(b);
    }

    /// Starts a fixed-length list; the caller then writes `len` values.
    pub fn write_list_begin(&mut self, len: usize, typ: Option<&str>) {
        match typ {
            Some(t) => {
                if len <= 7 {
                    self.out.push(0x70 + len as u8);
                    self.write_type(t);
                } else {
                    self.out.push(b'V');
                    self.write_type(t);
                    self.write_int(len as i32);
                }
            }
            None => {
                if len <= 7 {
                    self.out.push(0x78 + len as u8);
                } else {
                    self.out.push(b'X');
                    self.write_int(len as i32);
                }
            }
        }
    }

    /// Starts a map: `H` when untyped, `M` + type otherwise. The caller writes key, value pairs, then
    /// [`Encoder::write_map_end`].
    pub fn write_map_begin(&mut self, typ: Option<&str>) {
        match typ {
            Some(t) => {
                self.out.push(b'M');
                self.write_type(t);
            }
            None => self.out.push(b'H'),
        }
    }

    pub fn write_map_end(&mut self) {
        self.out.push(b'Z');
    }

    /// Starts an object of `class` (writing its definition the first time); the caller writes one value per field.
    pub fn write_object_begin(&mut self, class: &Arc<ClassDef>) {
        let idx = match self
            .classes
            .iter()
            .position(|c| Arc::ptr_eq(c, class) || **c == **class)
        {
            Some(i) => i,
            None => {
                self.out.push(b'C');
                self.write_str(&class.name);
                self.write_int(class.fields.len() as i32);
                for f in &class.fields {
                    self.write_str(f);
                }
                self.classes.push(class.clone());
                self.classes.len() - 1
            }
        };
        if idx < 16 {
            self.out.push(0x60 + idx as u8);
        } else {
            self.out.push(b'O');
            self.write_int(idx as i32);
        }
    }

    fn write_type(&mut self, t: &str) {
        match self.types.iter().position(|x| x == t) {
            Some(i) => self.write_int(i as i32),
            None => {
                self.types.push(t.to_owned());
                self.write_str(t);
            }
        }
    }
}

/// Encodes one value as a complete Hessian stream.
pub fn to_vec(v: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    Encoder::new(&mut out).write(v);
    out
}
