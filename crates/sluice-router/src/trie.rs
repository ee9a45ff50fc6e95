//! A compressed (radix) byte trie with two payload slots per key: `exact` and `prefix`.
//!
//! Owns the key → payload index and the lookup order the router needs: the exact slot of the
//! whole key first, then every prefix slot along the key from the longest to the shortest
//! (lua-resty-radixtree's `hash_path` then `radix_tree_up` walk). Payloads are plain `u32`
//! indices; what they point at is the caller's business. Built once, then read-only: lookup
//! is `O(key length + prefix hits)`, allocation-free, and independent of the number of keys.

/// Build-time node: owned label and child lists, rewritten freely while inserting.
#[derive(Debug, Clone, Default)]
struct BuildNode {
    label: Vec<u8>,
    /// First byte of each child's label, sorted; parallel to `children`.
    child_bytes: Vec<u8>,
    children: Vec<u32>,
    exact: Option<u32>,
    prefix: Option<u32>,
}

/// Which slot a payload came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Slot {
    Exact,
    Prefix,
}

/// The mutable form, used while compiling a snapshot; [`TrieBuilder::finish`] freezes it.
#[derive(Debug, Clone)]
pub(crate) struct TrieBuilder {
    nodes: Vec<BuildNode>,
}

impl Default for TrieBuilder {
    fn default() -> Self {
        TrieBuilder {
            nodes: vec![BuildNode::default()],
        }
    }
}

impl TrieBuilder {
    /// The payload slot for `key`, created empty if needed.
    pub(crate) fn slot_mut(&mut self, key: &[u8], slot: Slot) -> &mut Option<u32> {
        let id = self.insert(key) as usize;
        let node = &mut self.nodes[id];
        match slot {
            Slot::Exact => &mut node.exact,
            Slot::Prefix => &mut node.prefix,
        }
    }

    fn insert(&mut self, mut key: &[u8]) -> u32 {
        let mut node = 0usize;
        loop {
            let Some(&first) = key.first() else {
                return node as u32;
            };
            let (at, child_id) = match self.nodes[node].child_bytes.binary_search(&first) {
                Err(at) => {
                    let id = self.nodes.len() as u32;
                    self.nodes.push(BuildNode {
                        label: key.to_vec(),
                        ..BuildNode::default()
                    });
                    let parent = &mut self.nodes[node];
                    parent.child_bytes.insert(at, first);
                    parent.children.insert(at, id);
                    return id;
                }
                Ok(at) => (at, self.nodes[node].children[at] as usize),
            };
            let label = &self.nodes[child_id].label;
            let common = label.iter().zip(key).take_while(|(a, b)| a == b).count();
            if common < label.len() {
                // Split `child` into `mid` (shared part) -> `child` (rest).
                let mid_id = self.nodes.len() as u32;
                let rest = self.nodes[child_id].label.split_off(common);
                let shared = std::mem::replace(&mut self.nodes[child_id].label, rest);
                let rest_first = self.nodes[child_id].label[0];
                self.nodes.push(BuildNode {
                    label: shared,
                    child_bytes: vec![rest_first],
                    children: vec![child_id as u32],
                    ..BuildNode::default()
                });
                self.nodes[node].children[at] = mid_id;
                node = mid_id as usize;
            } else {
                node = child_id;
            }
            key = &key[common..];
        }
    }

    /// Freezes into the compact lookup form: flat arrays, breadth-first node order so that
    /// siblings sit next to each other, and `up` links to the nearest prefix ancestor.
    pub(crate) fn finish(self) -> Trie {
        let mut t = Trie {
            nodes: Vec::with_capacity(self.nodes.len()),
            labels: Vec::new(),
            child_bytes: Vec::new(),
            child_ids: Vec::new(),
        };
        // (build id, new id of the nearest ancestor with a prefix payload)
        let mut queue = std::collections::VecDeque::from([(0usize, NONE)]);
        // Children of new node `k` are given consecutive ids when `k` is dequeued.
        let mut next_id = 1u32;
        while let Some((bid, up)) = queue.pop_front() {
            let b = &self.nodes[bid];
            let id = t.nodes.len() as u32;
            let label_start = t.labels.len() as u32;
            t.labels.extend_from_slice(&b.label);
            let child_start = t.child_ids.len() as u32;
            t.child_bytes.extend_from_slice(&b.child_bytes);
            for _ in &b.children {
                t.child_ids.push(next_id);
                next_id += 1;
            }
            t.nodes.push(Node {
                label_start,
                label_len: b.label.len() as u32,
                child_start,
                child_len: b.children.len() as u32,
                exact: b.exact.unwrap_or(NONE),
                prefix: b.prefix.unwrap_or(NONE),
                up,
            });
            let below = if b.prefix.is_some() { id } else { up };
            for &c in &b.children {
                queue.push_back((c as usize, below));
            }
        }
        t
    }
}

const NONE: u32 = u32::MAX;

/// Frozen node: 28 bytes, all references are offsets into the trie's flat arrays.
#[derive(Debug, Clone, Copy)]
struct Node {
    label_start: u32,
    label_len: u32,
    child_start: u32,
    child_len: u32,
    exact: u32,
    prefix: u32,
    /// Nearest strict ancestor carrying a prefix payload.
    up: u32,
}

/// Read-only radix trie (see the module docs for the lookup order).
#[derive(Debug, Clone)]
pub(crate) struct Trie {
    nodes: Vec<Node>,
    labels: Vec<u8>,
    child_bytes: Vec<u8>,
    child_ids: Vec<u32>,
}

impl Default for Trie {
    fn default() -> Self {
        TrieBuilder::default().finish()
    }
}

impl Trie {
    #[inline]
    fn child(&self, n: &Node, b: u8) -> Option<u32> {
        let start = n.child_start as usize;
        let bytes = self.child_bytes.get(start..start + n.child_len as usize)?;
        // Most nodes have a handful of children: a linear scan beats a binary search there.
        let at = if bytes.len() <= 16 {
            bytes.iter().position(|&c| c == b)?
        } else {
            bytes.binary_search(&b).ok()?
        };
        self.child_ids.get(start + at).copied()
    }

    /// Calls `f` with the exact payload of `key`, then with each prefix payload along `key`
    /// from the longest prefix to the shortest, until `f` returns `Some`.
    #[inline]
    pub(crate) fn lookup<R>(&self, key: &[u8], f: impl FnMut(u32, Slot) -> Option<R>) -> Option<R> {
        self.lookup_by(Forward(key), f)
    }

    /// [`Trie::lookup`] over `key` read back to front (hosts are stored reversed, so a
    /// `*.example.com` suffix becomes a prefix) without copying it.
    #[inline]
    pub(crate) fn lookup_rev<R>(
        &self,
        key: &[u8],
        f: impl FnMut(u32, Slot) -> Option<R>,
    ) -> Option<R> {
        self.lookup_by(Backward(key), f)
    }

    #[inline]
    fn lookup_by<K: Key, R>(&self, key: K, mut f: impl FnMut(u32, Slot) -> Option<R>) -> Option<R> {
        let mut node = self.nodes.first()?;
        let mut id = 0u32;
        let mut pos = 0usize;
        let mut deepest = NONE;
        loop {
            if node.prefix != NONE {
                deepest = id;
            }
            let Some(b) = key.at(pos) else {
                if node.exact != NONE {
                    if let r @ Some(_) = f(node.exact, Slot::Exact) {
                        return r;
                    }
                }
                break;
            };
            let Some(child_id) = self.child(node, b) else {
                break;
            };
            let Some(child) = self.nodes.get(child_id as usize) else {
                break;
            };
            let (ls, ll) = (child.label_start as usize, child.label_len as usize);
            // The first byte is known equal; single-byte labels (digit fan-out) need no more.
            if ll > 1 {
                let Some(want) = self.labels.get(ls + 1..ls + ll) else {
                    break;
                };
                if !key.eq_at(pos + 1, want) {
                    break;
                }
            }
            pos += ll;
            node = child;
            id = child_id;
        }
        while let Some(n) = self.nodes.get(deepest as usize) {
            if let r @ Some(_) = f(n.prefix, Slot::Prefix) {
                return r;
            }
            deepest = n.up;
        }
        None
    }
}

/// How the walk reads the key: front to back (paths) or back to front (hosts).
trait Key: Copy {
    fn at(self, pos: usize) -> Option<u8>;
    /// Whether the key, from `pos` on (in walk order), starts with `want`.
    fn eq_at(self, pos: usize, want: &[u8]) -> bool;
}

#[derive(Clone, Copy)]
struct Forward<'a>(&'a [u8]);

#[derive(Clone, Copy)]
struct Backward<'a>(&'a [u8]);

impl Key for Forward<'_> {
    #[inline]
    fn at(self, pos: usize) -> Option<u8> {
        self.0.get(pos).copied()
    }
    #[inline]
    fn eq_at(self, pos: usize, want: &[u8]) -> bool {
        self.0.get(pos..pos + want.len()) == Some(want)
    }
}

impl Key for Backward<'_> {
    #[inline]
    fn at(self, pos: usize) -> Option<u8> {
        let i = self.0.len().checked_sub(pos + 1)?;
        self.0.get(i).copied()
    }
    #[inline]
    fn eq_at(self, pos: usize, want: &[u8]) -> bool {
        let Some(end) = self.0.len().checked_sub(pos) else {
            return false;
        };
        let Some(start) = end.checked_sub(want.len()) else {
            return false;
        };
        self.0
            .get(start..end)
            .is_some_and(|have| have.iter().rev().eq(want.iter()))
    }
}

#[cfg(test)]
mod tests {
    use super::{Slot, Trie, TrieBuilder};

    fn collect(t: &Trie, key: &str) -> Vec<(u32, Slot)> {
        let mut out = Vec::new();
        t.lookup::<()>(key.as_bytes(), |p, s| {
            out.push((p, s));
            None
        });
        out
    }

    #[test]
    fn exact_then_longest_to_shortest_prefix() {
        let mut t = TrieBuilder::default();
        *t.slot_mut(b"/", Slot::Prefix) = Some(1);
        *t.slot_mut(b"/api/", Slot::Prefix) = Some(2);
        *t.slot_mut(b"/api/v1/users", Slot::Exact) = Some(3);
        *t.slot_mut(b"/api/v1/", Slot::Prefix) = Some(4);
        *t.slot_mut(b"/apx", Slot::Exact) = Some(5);
        *t.slot_mut(b"/api/v1/users", Slot::Prefix) = Some(6);
        let t = t.finish();
        use Slot::*;
        assert_eq!(
            collect(&t, "/api/v1/users"),
            vec![
                (3, Exact),
                (6, Prefix),
                (4, Prefix),
                (2, Prefix),
                (1, Prefix)
            ]
        );
        assert_eq!(
            collect(&t, "/api/v1/user"),
            vec![(4, Prefix), (2, Prefix), (1, Prefix)]
        );
        assert_eq!(collect(&t, "/apx"), vec![(5, Exact), (1, Prefix)]);
        assert_eq!(collect(&t, "/ap"), vec![(1, Prefix)]);
        assert_eq!(collect(&t, "x"), vec![]);
        assert_eq!(collect(&t, ""), vec![]);
    }

    #[test]
    fn reversed_lookup_reads_back_to_front() {
        let mut t = TrieBuilder::default();
        *t.slot_mut(b"moc.elpmaxe.", Slot::Prefix) = Some(1);
        *t.slot_mut(b"moc.elpmaxe.oof", Slot::Exact) = Some(2);
        *t.slot_mut(b"moc.", Slot::Prefix) = Some(3);
        let t = t.finish();
        let rev = |k: &str| {
            let mut out = Vec::new();
            t.lookup_rev::<()>(k.as_bytes(), |p, _| {
                out.push(p);
                None
            });
            out
        };
        assert_eq!(rev("foo.example.com"), vec![2, 1, 3]);
        assert_eq!(rev("a.b.example.com"), vec![1, 3]);
        assert_eq!(rev("example.com"), vec![3]);
        assert_eq!(rev("xfoo.example.com"), vec![1, 3]);
        assert_eq!(rev("com"), Vec::<u32>::new());
    }

    #[test]
    fn stops_at_first_some() {
        let mut t = TrieBuilder::default();
        *t.slot_mut(b"ab", Slot::Prefix) = Some(1);
        *t.slot_mut(b"a", Slot::Prefix) = Some(2);
        *t.slot_mut(b"", Slot::Prefix) = Some(3);
        let t = t.finish();
        let mut seen = 0;
        let r = t.lookup(b"abc", |p, _| {
            seen += 1;
            (p == 2).then_some(p)
        });
        assert_eq!((r, seen), (Some(2), 2));
        assert_eq!(collect(&t, "zzz"), vec![(3, Slot::Prefix)]);
    }
}
