//! A compressed (radix) byte trie with two payload slots per key: `exact` and `prefix`.
//!
//! Owns the key → payload index and the lookup order the router needs: the exact slot of the
//! whole key first, then every prefix slot along the key from the longest to the shortest
//! (lua-resty-radixtree's `hash_path` then `radix_tree_up` walk). Payloads are plain `u32`
//! indices; what they point at is the caller's business. Built once, then read-only: lookup
//! is `O(key length + prefix hits)`, allocation-free, and independent of the number of keys.

#[derive(Debug, Clone, Default)]
struct Node {
    label: Vec<u8>,
    /// First byte of each child's label, sorted; parallel to `children`.
    child_bytes: Vec<u8>,
    children: Vec<u32>,
    exact: Option<u32>,
    prefix: Option<u32>,
    /// Nearest strict ancestor carrying a prefix payload (filled by `finish`).
    up: Option<u32>,
}

/// Which slot a payload came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Slot {
    Exact,
    Prefix,
}

#[derive(Debug, Clone)]
pub(crate) struct Trie {
    nodes: Vec<Node>,
}

impl Default for Trie {
    fn default() -> Self {
        Trie {
            nodes: vec![Node::default()],
        }
    }
}

impl Trie {
    /// The payload slot for `key`, created empty if needed (build time only).
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
            let pos = self.nodes[node].child_bytes.binary_search(&first);
            let child = match pos {
                Err(at) => {
                    let id = self.nodes.len() as u32;
                    self.nodes.push(Node {
                        label: key.to_vec(),
                        ..Node::default()
                    });
                    let parent = &mut self.nodes[node];
                    parent.child_bytes.insert(at, first);
                    parent.children.insert(at, id);
                    return id;
                }
                Ok(at) => (at, self.nodes[node].children[at] as usize),
            };
            let (at, child_id) = child;
            let label = &self.nodes[child_id].label;
            let common = label.iter().zip(key).take_while(|(a, b)| a == b).count();
            if common < label.len() {
                // Split `child` into `mid` (shared part) -> `child` (rest).
                let mid_id = self.nodes.len() as u32;
                let rest = self.nodes[child_id].label.split_off(common);
                let shared = std::mem::replace(&mut self.nodes[child_id].label, rest);
                let rest_first = self.nodes[child_id].label[0];
                self.nodes.push(Node {
                    label: shared,
                    child_bytes: vec![rest_first],
                    children: vec![child_id as u32],
                    ..Node::default()
                });
                self.nodes[node].children[at] = mid_id;
                node = mid_id as usize;
            } else {
                node = child_id;
            }
            key = &key[common..];
        }
    }

    /// Computes the `up` links; call once after the last insert.
    pub(crate) fn finish(&mut self) {
        let mut stack: Vec<(usize, Option<u32>)> = vec![(0, None)];
        while let Some((id, up)) = stack.pop() {
            self.nodes[id].up = up;
            let below = if self.nodes[id].prefix.is_some() {
                Some(id as u32)
            } else {
                up
            };
            for &c in &self.nodes[id].children {
                stack.push((c as usize, below));
            }
        }
    }

    /// Calls `f` with the exact payload of `key`, then with each prefix payload along `key`
    /// from the longest prefix to the shortest, until `f` returns `Some`.
    #[inline]
    pub(crate) fn lookup<R>(
        &self,
        key: &[u8],
        mut f: impl FnMut(u32, Slot) -> Option<R>,
    ) -> Option<R> {
        let mut node = &self.nodes[0];
        let mut id = 0u32;
        let mut pos = 0usize;
        let mut deepest: Option<u32> = None;
        loop {
            if node.prefix.is_some() {
                deepest = Some(id);
            }
            let Some(&b) = key.get(pos) else {
                if let Some(e) = node.exact {
                    if let r @ Some(_) = f(e, Slot::Exact) {
                        return r;
                    }
                }
                break;
            };
            let Ok(at) = node.child_bytes.binary_search(&b) else {
                break;
            };
            let child_id = node.children[at];
            let child = &self.nodes[child_id as usize];
            if !key[pos..].starts_with(&child.label) {
                break;
            }
            pos += child.label.len();
            node = child;
            id = child_id;
        }
        let mut cur = deepest;
        while let Some(nid) = cur {
            let n = &self.nodes[nid as usize];
            if let Some(p) = n.prefix {
                if let r @ Some(_) = f(p, Slot::Prefix) {
                    return r;
                }
            }
            cur = n.up;
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::{Slot, Trie};

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
        let mut t = Trie::default();
        *t.slot_mut(b"/", Slot::Prefix) = Some(1);
        *t.slot_mut(b"/api/", Slot::Prefix) = Some(2);
        *t.slot_mut(b"/api/v1/users", Slot::Exact) = Some(3);
        *t.slot_mut(b"/api/v1/", Slot::Prefix) = Some(4);
        *t.slot_mut(b"/apx", Slot::Exact) = Some(5);
        *t.slot_mut(b"/api/v1/users", Slot::Prefix) = Some(6);
        t.finish();
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
    fn stops_at_first_some() {
        let mut t = Trie::default();
        *t.slot_mut(b"ab", Slot::Prefix) = Some(1);
        *t.slot_mut(b"a", Slot::Prefix) = Some(2);
        *t.slot_mut(b"", Slot::Prefix) = Some(3);
        t.finish();
        let mut seen = 0;
        let r = t.lookup(b"abc", |p, _| {
            seen += 1;
            (p == 2).then_some(p)
        });
        assert_eq!((r, seen), (Some(2), 2));
        assert_eq!(collect(&t, "zzz"), vec![(3, Slot::Prefix)]);
    }
}
