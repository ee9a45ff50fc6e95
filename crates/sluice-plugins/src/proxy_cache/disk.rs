//! A disk zone: nginx's `proxy_cache_path` as APISIX declares it. One file per cache key at
//! `disk_path/<levels>/<md5(key)>` (nginx's layout, which APISIX's PURGE computes), bounded by `disk_size` (least
//! recently used files removed first), and found again after a restart: opening the zone scans its directory,
//! as nginx's cache loader does.
//!
//! Crash safety: an answer is streamed into a temporary file next to its final name while it goes to the client,
//! and renamed into place only once the whole body arrived. A file ends with its body length and a CRC-32 of
//! everything before it; a file that does not check out (torn by a crash, truncated, or not ours) is removed and
//! counts as a miss, so a torn file is never served. Temporary files left by a crash are removed by the scan.
//! The key is stored in the file and compared, so two keys with one md5 never share an answer.
//!
//! File layout (integers little-endian): `SLCACHE1`, head length (u32), head, body, body length (u64), CRC-32
//! (u32). Head: stored at (unix ms, u64), freshness (ms, u64), status (u16), key (u32 length + bytes), Vary names
//! (u16 count, each u16 length + bytes), the request's Vary values (u32 length + bytes), headers (u16 count, each
//! u16 name length + name, u32 value length + value).

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use md5::{Digest, Md5};

use super::memory::MemZone;
use super::zones::DiskConf;
use super::{Entry, Lookup};

const MAGIC: &[u8; 8] = b"SLCACHE1";
const TRAILER: usize = 12;

pub(crate) struct DiskZone {
    inner: Arc<Inner>,
}

struct Inner {
    /// The answers most recently read from the files, decoded and checked, up to the zone's `memory_size` (by
    /// md5): a hit on them costs no system call, no CRC and no copy. Kept in step with the index: a file
    /// replaced, purged or evicted leaves it first.
    front: MemZone,
    root: PathBuf,
    levels: Vec<usize>,
    max: u64,
    index: Mutex<Index>,
    seq: AtomicU64,
}

/// The zone's files: what nginx's keys_zone holds in shared memory.
#[derive(Default)]
struct Index {
    files: HashMap<[u8; 16], (u64, u64)>,
    /// Last use -> file.
    lru: BTreeMap<u64, [u8; 16]>,
    tick: u64,
    bytes: u64,
}

impl Index {
    fn touch(&mut self, md5: [u8; 16], size: Option<u64>) {
        self.tick += 1;
        let tick = self.tick;
        let old = self.files.insert(md5, (size.unwrap_or(0), tick));
        if let Some((old_size, old_tick)) = old {
            self.lru.remove(&old_tick);
            match size {
                Some(_) => self.bytes -= old_size,
                // Only touched: keep the size.
                None => {
                    self.files.insert(md5, (old_size, tick));
                }
            }
        }
        if let Some(s) = size {
            self.bytes += s;
        }
        self.lru.insert(tick, md5);
    }

    fn remove(&mut self, md5: &[u8; 16]) -> bool {
        match self.files.remove(md5) {
            Some((size, tick)) => {
                self.lru.remove(&tick);
                self.bytes -= size;
                true
            }
            None => false,
        }
    }
}

fn md5_of(key: &[u8]) -> [u8; 16] {
    Md5::digest(key).into()
}

fn hex(md5: &[u8; 16]) -> String {
    let mut s = String::with_capacity(32);
    for b in md5 {
        s.push(char::from(b"0123456789abcdef"[usize::from(b >> 4)]));
        s.push(char::from(b"0123456789abcdef"[usize::from(b & 15)]));
    }
    s
}

fn unhex(name: &str) -> Option<[u8; 16]> {
    if name.len() != 32 {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(name.get(i * 2..i * 2 + 2)?, 16).ok()?;
    }
    Some(out)
}

impl Inner {
    /// nginx's path: each level takes its width of hex digits from the end of the md5, the last level first.
    fn path(&self, md5: &[u8; 16]) -> PathBuf {
        let h = hex(md5);
        let mut p = self.root.clone();
        let mut end = h.len();
        for w in &self.levels {
            p.push(&h[end - w..end]);
            end -= w;
        }
        p.push(&h);
        p
    }

    /// Removes least recently used files until the zone fits `disk_size`.
    fn shrink(&self, index: &mut Index) {
        while index.bytes > self.max {
            let Some((_, victim)) = index.lru.pop_first() else {
                break;
            };
            if let Some((size, _)) = index.files.remove(&victim) {
                index.bytes -= size;
                self.front.purge(&victim);
                let _ = std::fs::remove_file(self.path(&victim));
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Index> {
        self.index.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl DiskZone {
    /// Creates the directory if needed and indexes the files already there (oldest modification first, so the
    /// least recently written go first when the zone is full); removes temporary files a crash left.
    pub(crate) fn open(conf: &DiskConf, memory_size: u64) -> Result<DiskZone, String> {
        std::fs::create_dir_all(&conf.path)
            .map_err(|e| format!("cache zone directory {}: {e}", conf.path.display()))?;
        let inner = Inner {
            front: MemZone::new(memory_size),
            root: conf.path.clone(),
            levels: conf.levels.clone(),
            max: conf.size,
            index: Mutex::default(),
            seq: AtomicU64::new(0),
        };
        let mut found = Vec::new();
        scan(&conf.path, conf.levels.len(), &mut found);
        found.sort_by_key(|(_, _, mtime)| *mtime);
        {
            let mut index = inner.lock();
            for (md5, size, _) in found {
                index.touch(md5, Some(size));
            }
            inner.shrink(&mut index);
        }
        Ok(DiskZone {
            inner: Arc::new(inner),
        })
    }

    pub(crate) fn get(
        &self,
        key: &[u8],
        sig: &dyn Fn(&[Box<str>]) -> Vec<u8>,
        now_ms: u64,
    ) -> Lookup {
        let md5 = md5_of(key);
        {
            // A key the index does not know costs no system call.
            let mut index = self.inner.lock();
            if !index.files.contains_key(&md5) {
                return Lookup::Miss;
            }
            match self.inner.front.get(&md5, sig, now_ms) {
                Lookup::Hit(e) if *e.key == *key => {
                    index.touch(md5, None);
                    return Lookup::Hit(e);
                }
                Lookup::Expired => return Lookup::Expired,
                _ => {}
            }
        }
        let path = self.inner.path(&md5);
        let Ok(raw) = std::fs::read(&path) else {
            self.inner.lock().remove(&md5);
            return Lookup::Miss;
        };
        let Some((entry, vary)) = decode(Bytes::from(raw)) else {
            // Torn, truncated or foreign: never served.
            let _ = std::fs::remove_file(&path);
            let mut index = self.inner.lock();
            index.remove(&md5);
            self.inner.front.purge(&md5);
            return Lookup::Miss;
        };
        if *entry.key != *key {
            return Lookup::Miss;
        }
        // One variant per key (nginx keeps one per Vary value set; the answer for other values is fetched).
        if !vary.is_empty() && *sig(&vary) != *entry.sig {
            return Lookup::Miss;
        }
        let expired = entry.expired(now_ms);
        let entry = Arc::new(entry);
        {
            let mut index = self.inner.lock();
            // Still the indexed file (not purged or replaced meanwhile): remember it.
            if index.files.contains_key(&md5) {
                self.inner.front.put(&md5, vary.into(), entry.clone());
            }
            index.touch(md5, None);
        }
        if expired {
            Lookup::Expired
        } else {
            Lookup::Hit(entry)
        }
    }

    /// APISIX's disk PURGE: removes the key's file; whether there was one.
    pub(crate) fn purge(&self, key: &[u8]) -> bool {
        let md5 = md5_of(key);
        {
            let mut index = self.inner.lock();
            index.remove(&md5);
            self.inner.front.purge(&md5);
        }
        std::fs::remove_file(self.inner.path(&md5)).is_ok()
    }

    /// Starts writing an answer (its head is known; the body follows). `None` when the file cannot be created.
    pub(crate) fn writer(
        &self,
        key: &[u8],
        vary: &[Box<str>],
        entry: &Entry,
    ) -> Option<DiskWriter> {
        let md5 = md5_of(key);
        let dest = self.inner.path(&md5);
        let dir = dest.parent()?;
        std::fs::create_dir_all(dir).ok()?;
        let n = self.inner.seq.fetch_add(1, Ordering::Relaxed);
        let tmp = dir.join(format!(".{}.{}.{n}.tmp", hex(&md5), std::process::id()));
        let mut head = Vec::with_capacity(256);
        encode_head(&mut head, key, vary, entry);
        let mut prefix = Vec::with_capacity(12 + head.len());
        prefix.extend_from_slice(MAGIC);
        prefix.extend_from_slice(&u32::try_from(head.len()).ok()?.to_le_bytes());
        prefix.extend_from_slice(&head);
        let mut file = std::fs::File::create(&tmp).ok()?;
        if file.write_all(&prefix).is_err() {
            let _ = std::fs::remove_file(&tmp);
            return None;
        }
        let mut crc = crc32fast::Hasher::new();
        crc.update(&prefix);
        Some(DiskWriter {
            zone: self.inner.clone(),
            md5,
            tmp,
            dest,
            file: Some(file),
            crc,
            body: 0,
            total: prefix.len() as u64,
        })
    }

    /// Bytes on disk as indexed (for tests and diagnostics).
    #[cfg(test)]
    pub(crate) fn bytes(&self) -> u64 {
        self.inner.lock().bytes
    }
}

/// An answer being written (see the module docs): dropped before [`DiskWriter::commit`], its file is removed.
pub(crate) struct DiskWriter {
    zone: Arc<Inner>,
    md5: [u8; 16],
    tmp: PathBuf,
    dest: PathBuf,
    file: Option<std::fs::File>,
    crc: crc32fast::Hasher,
    body: u64,
    total: u64,
}

impl DiskWriter {
    /// Appends a piece of the body; `false` (and the file is dropped) on a write error or past the zone's size.
    pub(crate) fn write(&mut self, data: &[u8]) -> bool {
        let Some(f) = self.file.as_mut() else {
            return false;
        };
        self.body += data.len() as u64;
        self.total += data.len() as u64;
        if self.total + TRAILER as u64 > self.zone.max || f.write_all(data).is_err() {
            self.abandon();
            return false;
        }
        self.crc.update(data);
        true
    }

    /// Ends the file and renames it into place.
    pub(crate) fn commit(mut self) {
        let Some(mut f) = self.file.take() else {
            return;
        };
        let mut trailer = [0u8; TRAILER];
        trailer[..8].copy_from_slice(&self.body.to_le_bytes());
        self.crc.update(&trailer[..8]);
        let crc = std::mem::replace(&mut self.crc, crc32fast::Hasher::new()).finalize();
        trailer[8..].copy_from_slice(&crc.to_le_bytes());
        let ok = f.write_all(&trailer).is_ok();
        drop(f);
        if !ok || std::fs::rename(&self.tmp, &self.dest).is_err() {
            let _ = std::fs::remove_file(&self.tmp);
            return;
        }
        let mut index = self.zone.lock();
        self.zone.front.purge(&self.md5);
        index.touch(self.md5, Some(self.total + TRAILER as u64));
        self.zone.shrink(&mut index);
    }

    fn abandon(&mut self) {
        if self.file.take().is_some() {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

impl Drop for DiskWriter {
    fn drop(&mut self) {
        self.abandon();
    }
}

/// Files under `dir`, `depth` levels down: (md5, size, modified). Temporary files are removed.
fn scan(dir: &Path, depth: usize, out: &mut Vec<([u8; 16], u64, std::time::SystemTime)>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let Ok(meta) = e.metadata() else { continue };
        let name = e.file_name();
        let name = name.to_string_lossy();
        if meta.is_dir() {
            if depth > 0 {
                scan(&e.path(), depth - 1, out);
            }
        } else if depth == 0 {
            if name.ends_with(".tmp") {
                let _ = std::fs::remove_file(e.path());
            } else if let Some(md5) = unhex(&name) {
                let mtime = meta.modified().unwrap_or(std::time::UNIX_EPOCH);
                out.push((md5, meta.len(), mtime));
            }
        }
    }
}

fn encode_head(out: &mut Vec<u8>, key: &[u8], vary: &[Box<str>], e: &Entry) {
    out.extend_from_slice(&e.stored_ms.to_le_bytes());
    out.extend_from_slice(&e.ttl_ms.to_le_bytes());
    out.extend_from_slice(&e.status.to_le_bytes());
    put32(out, key);
    out.extend_from_slice(&(vary.len().min(u16::MAX as usize) as u16).to_le_bytes());
    for v in vary.iter().take(u16::MAX as usize) {
        put16(out, v.as_bytes());
    }
    put32(out, &e.sig);
    out.extend_from_slice(&(e.headers.len().min(u16::MAX as usize) as u16).to_le_bytes());
    for (n, v) in e.headers.iter().take(u16::MAX as usize) {
        put16(out, n);
        put32(out, v);
    }
}

fn put16(out: &mut Vec<u8>, b: &[u8]) {
    let b = &b[..b.len().min(u16::MAX as usize)];
    out.extend_from_slice(&(b.len() as u16).to_le_bytes());
    out.extend_from_slice(b);
}

fn put32(out: &mut Vec<u8>, b: &[u8]) {
    let b = &b[..b.len().min(u32::MAX as usize)];
    out.extend_from_slice(&(b.len() as u32).to_le_bytes());
    out.extend_from_slice(b);
}

/// A bounds-checked reader over the head.
struct Cursor<'a>(&'a [u8]);

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Some(a)
    }
    fn u16(&mut self) -> Option<u16> {
        Some(u16::from_le_bytes(self.take(2)?.try_into().ok()?))
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
    fn bytes16(&mut self) -> Option<&'a [u8]> {
        let n = self.u16()?;
        self.take(usize::from(n))
    }
    fn bytes32(&mut self) -> Option<&'a [u8]> {
        let n = self.u32()?;
        self.take(usize::try_from(n).ok()?)
    }
}

/// A whole file: the answer (with its key) and its Vary names; `None` unless every length and the CRC check out.
fn decode(raw: Bytes) -> Option<(Entry, Vec<Box<str>>)> {
    let len = raw.len();
    if len < MAGIC.len() + 4 + TRAILER || &raw[..8] != MAGIC {
        return None;
    }
    let crc_at = len - 4;
    let stored_crc = u32::from_le_bytes(raw[crc_at..].try_into().ok()?);
    if crc32fast::hash(&raw[..crc_at]) != stored_crc {
        return None;
    }
    let body_len = usize::try_from(u64::from_le_bytes(
        raw[len - TRAILER..crc_at].try_into().ok()?,
    ))
    .ok()?;
    let head_len = usize::try_from(u32::from_le_bytes(raw[8..12].try_into().ok()?)).ok()?;
    let body_at = 12usize.checked_add(head_len)?;
    if body_at.checked_add(body_len)? != len - TRAILER {
        return None;
    }
    let mut c = Cursor(&raw[12..body_at]);
    let stored_ms = c.u64()?;
    let ttl_ms = c.u64()?;
    let status = c.u16()?;
    let key: Box<[u8]> = c.bytes32()?.into();
    let nvary = c.u16()?;
    let mut vary = Vec::with_capacity(usize::from(nvary));
    for _ in 0..nvary {
        vary.push(std::str::from_utf8(c.bytes16()?).ok()?.into());
    }
    let sig: Box<[u8]> = c.bytes32()?.into();
    let nh = c.u16()?;
    let mut headers = Vec::with_capacity(usize::from(nh));
    for _ in 0..nh {
        let n = Bytes::copy_from_slice(c.bytes16()?);
        let v = Bytes::copy_from_slice(c.bytes32()?);
        headers.push((n, v));
    }
    if !c.0.is_empty() {
        return None;
    }
    let body = raw.slice(body_at..body_at + body_len);
    Some((
        Entry {
            key,
            sig,
            status,
            headers,
            body,
            stored_ms,
            ttl_ms,
        },
        vary,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn zone(dir: &Path, size: u64) -> DiskZone {
        DiskZone::open(
            &DiskConf {
                path: dir.to_path_buf(),
                size,
                levels: vec![1, 2],
            },
            1 << 20,
        )
        .unwrap()
    }

    fn tmpdir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "sluice-pc-{name}-{}-{}",
            std::process::id(),
            rand::random::<u32>()
        ));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    fn put(z: &DiskZone, key: &[u8], body: &[u8]) {
        let e = Entry {
            key: Box::new([]),
            sig: Box::new([]),
            status: 200,
            headers: vec![(Bytes::from_static(b"X-A"), Bytes::from_static(b"1"))],
            body: Bytes::new(),
            stored_ms: 1000,
            ttl_ms: 1000,
        };
        let mut w = z.writer(key, &[], &e).unwrap();
        for piece in body.chunks(7) {
            assert!(w.write(piece));
        }
        w.commit();
    }

    fn hit(z: &DiskZone, key: &[u8]) -> Option<Vec<u8>> {
        match z.get(key, &|_| Vec::new(), 1500) {
            Lookup::Hit(e) => Some(e.body.to_vec()),
            _ => None,
        }
    }

    #[test]
    fn nginx_layout_survives_reopen_and_purges() {
        let d = tmpdir("layout");
        let z = zone(&d, 1 << 20);
        put(&z, b"k", b"hello world");
        let md5 = hex(&md5_of(b"k"));
        // APISIX's generate_cache_filename for levels 1:2.
        let path = d.join(&md5[31..]).join(&md5[29..31]).join(&md5);
        assert!(path.is_file(), "{}", path.display());
        assert_eq!(hit(&z, b"k").as_deref(), Some(&b"hello world"[..]));
        assert!(matches!(
            z.get(b"k", &|_| Vec::new(), 2001),
            Lookup::Expired
        ));
        drop(z);
        let z = zone(&d, 1 << 20);
        assert_eq!(hit(&z, b"k").as_deref(), Some(&b"hello world"[..]));
        assert!(z.purge(b"k"));
        assert!(!z.purge(b"k"));
        assert!(hit(&z, b"k").is_none());
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn remembered_answers_follow_the_files() {
        let d = tmpdir("front");
        let z = zone(&d, 1 << 20);
        put(&z, b"k", b"one");
        assert_eq!(hit(&z, b"k").as_deref(), Some(&b"one"[..]));
        // Served from memory now: the file is not read again...
        let path = z.inner.path(&md5_of(b"k"));
        assert_eq!(hit(&z, b"k").as_deref(), Some(&b"one"[..]));
        // ...but a new answer replaces it, and a purge drops it.
        put(&z, b"k", b"two");
        assert_eq!(hit(&z, b"k").as_deref(), Some(&b"two"[..]));
        assert!(z.purge(b"k"));
        assert!(hit(&z, b"k").is_none());
        assert!(!path.exists());
        // An evicted file leaves memory too.
        let small = zone(&tmpdir("front2"), 600);
        put(&small, b"a", &[b'a'; 300]);
        assert!(hit(&small, b"a").is_some());
        put(&small, b"b", &[b'b'; 300]);
        assert!(hit(&small, b"a").is_none());
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn torn_and_foreign_files_are_never_served() {
        let d = tmpdir("torn");
        let z = zone(&d, 1 << 20);
        put(&z, b"k", &[b'a'; 1000]);
        let path = z.inner.path(&md5_of(b"k"));
        let full = std::fs::read(&path).unwrap();
        // Every truncation, and a flipped byte anywhere, is refused.
        for cut in [0, 5, 12, 100, full.len() - 13, full.len() - 1] {
            std::fs::write(&path, &full[..cut]).unwrap();
            z.inner.lock().touch(md5_of(b"k"), Some(cut as u64));
            assert!(hit(&z, b"k").is_none(), "cut at {cut}");
        }
        for at in [3, 20, 500, full.len() - 2] {
            let mut bad = full.clone();
            bad[at] ^= 1;
            std::fs::write(&path, &bad).unwrap();
            z.inner.lock().touch(md5_of(b"k"), Some(bad.len() as u64));
            assert!(hit(&z, b"k").is_none(), "flip at {at}");
            assert!(!path.exists(), "a bad file is removed");
        }
        // An unfinished write leaves nothing behind, and a crash's temporary file goes at the next open.
        let e = Entry {
            key: Box::new([]),
            sig: Box::new([]),
            status: 200,
            headers: Vec::new(),
            body: Bytes::new(),
            stored_ms: 0,
            ttl_ms: 10,
        };
        let mut w = z.writer(b"k2", &[], &e).unwrap();
        assert!(w.write(b"partial"));
        let tmp = w.tmp.clone();
        assert!(tmp.exists());
        drop(w);
        assert!(!tmp.exists());
        std::fs::write(&tmp, b"left by a crash").unwrap();
        drop(z);
        let _z = zone(&d, 1 << 20);
        assert!(!tmp.exists());
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn bounded_by_disk_size() {
        let d = tmpdir("bound");
        let z = zone(&d, 10_000);
        for i in 0..50 {
            put(&z, format!("k{i}").as_bytes(), &[b'x'; 1000]);
            assert!(hit(&z, b"k0").is_some(), "k0 kept in use ({i})");
        }
        assert!(z.bytes() <= 10_000, "{}", z.bytes());
        assert!(hit(&z, b"k1").is_none());
        assert!(hit(&z, b"k49").is_some());
        // Larger than the zone: abandoned while streaming.
        let e = Entry {
            key: Box::new([]),
            sig: Box::new([]),
            status: 200,
            headers: Vec::new(),
            body: Bytes::new(),
            stored_ms: 0,
            ttl_ms: 10,
        };
        let mut w = z.writer(b"huge", &[], &e).unwrap();
        assert!(!(0..20).all(|_| w.write(&[b'y'; 1000])));
        drop(w);
        assert!(hit(&z, b"huge").is_none());
        let _ = std::fs::remove_dir_all(&d);
    }
}
