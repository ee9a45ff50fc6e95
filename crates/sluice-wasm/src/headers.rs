//! A header map as a filter sees it during one call: copied in from the request context before the call (into
//! buffers the pooled instance keeps, so a warm instance copies without allocating), changed by the filter, and
//! given back as edits for the names it touched.

use bytes::Bytes;

/// One header: spans into [`HeaderMap::buf`], and whether the filter added it.
#[derive(Debug, Clone, Copy)]
struct Ent {
    name: (u32, u32),
    value: (u32, u32),
    added: bool,
}

#[derive(Default)]
pub(crate) struct HeaderMap {
    buf: Vec<u8>,
    ents: Vec<Ent>,
    /// Lower-case names the filter changed, and whether it only added values to them.
    touched: Vec<(Vec<u8>, bool)>,
}

impl HeaderMap {
    pub(crate) fn clear(&mut self) {
        self.buf.clear();
        self.ents.clear();
        self.touched.clear();
    }

    fn span(&mut self, b: &[u8], lower: bool) -> (u32, u32) {
        let at = self.buf.len();
        if lower {
            self.buf.extend(b.iter().map(u8::to_ascii_lowercase));
        } else {
            self.buf.extend_from_slice(b);
        }
        (at as u32, b.len() as u32)
    }

    /// Loads one header (names are kept lower case, as Envoy hands them to filters).
    pub(crate) fn load(&mut self, name: &[u8], value: &[u8]) {
        let name = self.span(name, true);
        let value = self.span(value, false);
        self.ents.push(Ent {
            name,
            value,
            added: false,
        });
    }

    fn at(&self, s: (u32, u32)) -> &[u8] {
        &self.buf[s.0 as usize..(s.0 + s.1) as usize]
    }

    pub(crate) fn get(&self, name: &[u8]) -> Option<&[u8]> {
        self.ents
            .iter()
            .find(|e| self.at(e.name).eq_ignore_ascii_case(name))
            .map(|e| self.at(e.value))
    }

    pub(crate) fn len(&self) -> usize {
        self.ents.len()
    }

    /// Every value of `name`.
    fn values<'a>(&'a self, name: &'a [u8]) -> impl Iterator<Item = (&'a [u8], bool)> + 'a {
        self.ents
            .iter()
            .filter(move |e| self.at(e.name).eq_ignore_ascii_case(name))
            .map(|e| (self.at(e.value), e.added))
    }

    fn touch(&mut self, name: &[u8], add_only: bool) {
        match self
            .touched
            .iter_mut()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
        {
            Some(t) => t.1 &= add_only,
            None => self.touched.push((name.to_ascii_lowercase(), add_only)),
        }
    }

    pub(crate) fn add(&mut self, name: &[u8], value: &[u8]) {
        self.touch(name, true);
        let name = self.span(name, true);
        let value = self.span(value, false);
        self.ents.push(Ent {
            name,
            value,
            added: true,
        });
    }

    pub(crate) fn remove(&mut self, name: &[u8]) {
        self.touch(name, false);
        let buf = &self.buf;
        self.ents.retain(|e| {
            !buf[e.name.0 as usize..(e.name.0 + e.name.1) as usize].eq_ignore_ascii_case(name)
        });
    }

    pub(crate) fn replace(&mut self, name: &[u8], value: &[u8]) {
        self.remove(name);
        let name = self.span(name, true);
        let value = self.span(value, false);
        self.ents.push(Ent {
            name,
            value,
            added: true,
        });
    }

    /// Replaces the whole map (`proxy_set_header_map_pairs`).
    pub(crate) fn set_all(&mut self, pairs: &[(&[u8], &[u8])]) {
        let names: Vec<Vec<u8>> = self.ents.iter().map(|e| self.at(e.name).to_vec()).collect();
        for n in &names {
            self.touch(n, false);
        }
        self.ents.clear();
        for (n, v) in pairs {
            self.touch(n, false);
            let name = self.span(n, true);
            let value = self.span(v, false);
            self.ents.push(Ent {
                name,
                value,
                added: true,
            });
        }
    }

    /// The proxy-wasm pairs encoding: count, then (name length, value length) per pair, then each name and value
    /// followed by a NUL; all numbers u32 little-endian.
    pub(crate) fn serialize(&self, out: &mut Vec<u8>) {
        out.clear();
        out.extend_from_slice(&(self.ents.len() as u32).to_le_bytes());
        for e in &self.ents {
            out.extend_from_slice(&e.name.1.to_le_bytes());
            out.extend_from_slice(&e.value.1.to_le_bytes());
        }
        for e in &self.ents {
            out.extend_from_slice(self.at(e.name));
            out.push(0);
            out.extend_from_slice(self.at(e.value));
            out.push(0);
        }
    }

    pub(crate) fn changed(&self) -> bool {
        !self.touched.is_empty()
    }

    /// The changes for the request going upstream: each touched name's values replace the original ones;
    /// `:path`, `:method` and `:authority` become the new target, method and Host.
    pub(crate) fn apply_request(&mut self, e: &mut sluice_plugins::Edits) {
        for (name, _) in std::mem::take(&mut self.touched) {
            let mut vals = self.values(&name).map(|(v, _)| Bytes::copy_from_slice(v));
            match &name[..] {
                b":path" => e.uri = vals.next(),
                b":method" => e.method = vals.next(),
                b":authority" => e.host = vals.next(),
                n if n.starts_with(b":") => {}
                _ => {
                    let vals: Vec<Bytes> = vals.collect();
                    e.set_headers
                        .retain(|(n, _)| !n.eq_ignore_ascii_case(&name));
                    let name = Bytes::from(name);
                    if vals.is_empty() {
                        e.remove_headers.push(name);
                    } else {
                        e.set_headers
                            .extend(vals.into_iter().map(|v| (name.clone(), v)));
                    }
                }
            }
        }
    }

    /// The changes for the response going to the client: values the filter only added are appended, a name it
    /// replaced or removed is set to what is left; `:status` becomes the status.
    pub(crate) fn apply_response(&mut self, e: &mut sluice_plugins::RespEdits) {
        for (name, add_only) in std::mem::take(&mut self.touched) {
            if name == b":status" {
                let status = self
                    .values(&name)
                    .next()
                    .and_then(|(v, _)| std::str::from_utf8(v).ok()?.parse::<u16>().ok());
                if let Some(s) = status.filter(|s| (100..1000).contains(s)) {
                    e.status = Some(s);
                }
                continue;
            }
            if name.starts_with(b":") {
                continue;
            }
            let shared = Bytes::from(name.clone());
            if add_only {
                for (v, added) in self.values(&name) {
                    if added {
                        e.add_headers
                            .push((shared.clone(), Bytes::copy_from_slice(v)));
                    }
                }
                continue;
            }
            e.set_headers
                .retain(|(n, _)| !n.eq_ignore_ascii_case(&name));
            e.add_headers
                .retain(|(n, _)| !n.eq_ignore_ascii_case(&name));
            let mut vals = self.values(&name).map(|(v, _)| Bytes::copy_from_slice(v));
            match vals.next() {
                None => e.remove_headers.push(shared),
                Some(first) => {
                    e.set_headers.push((shared.clone(), first));
                    let rest: Vec<_> = vals.map(|v| (shared.clone(), v)).collect();
                    e.add_headers.extend(rest);
                }
            }
        }
    }
}

/// Reads the pairs encoding (see [`HeaderMap::serialize`]); `None` when it is malformed.
pub(crate) fn parse_pairs(b: &[u8]) -> Option<Vec<(&[u8], &[u8])>> {
    let u32_at = |i: usize| -> Option<usize> {
        Some(u32::from_le_bytes(b.get(i..i + 4)?.try_into().ok()?) as usize)
    };
    if b.is_empty() {
        return Some(Vec::new());
    }
    let n = u32_at(0)?;
    if n > b.len() / 8 {
        return None;
    }
    let mut lens = Vec::with_capacity(n);
    for i in 0..n {
        lens.push((u32_at(4 + i * 8)?, u32_at(8 + i * 8)?));
    }
    let mut at = 4 + n * 8;
    let mut out = Vec::with_capacity(n);
    for (nl, vl) in lens {
        let name = b.get(at..at.checked_add(nl)?)?;
        at += nl + 1;
        let value = b.get(at..at.checked_add(vl)?)?;
        at += vl + 1;
        if at > b.len() {
            return None;
        }
        out.push((name, value));
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_round_trip_and_bad_input() {
        let mut m = HeaderMap::default();
        m.load(b"Host", b"a");
        m.load(b"x-y", b"");
        let mut out = Vec::new();
        m.serialize(&mut out);
        let p = parse_pairs(&out).unwrap();
        assert_eq!(p, vec![(&b"host"[..], &b"a"[..]), (&b"x-y"[..], &b""[..])]);
        // Lengths past the end, a count larger than the buffer could hold.
        assert!(parse_pairs(&out[..out.len() - 1]).is_none());
        let mut big = out.clone();
        big[0] = 0xff;
        assert!(parse_pairs(&big).is_none());
        let mut long = out.clone();
        long[4] = 0xff;
        assert!(parse_pairs(&long).is_none());
    }

    #[test]
    fn response_edits_add_and_replace() {
        let mut m = HeaderMap::default();
        m.load(b"Server", b"up");
        m.load(b"X-A", b"1");
        m.add(b"hello", b"world");
        m.replace(b"x-a", b"2");
        m.remove(b"server");
        let mut e = sluice_plugins::RespEdits::default();
        m.apply_response(&mut e);
        assert_eq!(
            e.add_headers,
            vec![(Bytes::from("hello"), Bytes::from("world"))]
        );
        assert_eq!(e.set_headers, vec![(Bytes::from("x-a"), Bytes::from("2"))]);
        assert_eq!(e.remove_headers, vec![Bytes::from("server")]);
    }
}
