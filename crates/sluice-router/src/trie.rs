//! A compressed (radix) byte trie with two payload slots per key: `exact` and `prefix`.
//!
//! Owns the key → payload map and the lookup order the router needs: the exact slot of the
//! whole key first, then every prefix slot along the key from the longest to the shortest
//! (lua-resty-radixtree's `hash_path` then `radix_tree_up` walk). Payloads are opaque to it.
//!
//! Persistent (issue 16): nodes are `Arc`s and every change goes through `Arc::make_mut`, so
//! a trie that is not shared is changed in place (a build) while one shared with a published
//! router is changed by copying only the nodes on the key's path (O(key length × fan-out),
//! independent of the number of keys); the old version keeps serving unchanged. Lookup is
//! `O(key length + prefix hits)`, allocation-free, and independent of the number of keys; the
//! prefix hits are visited while the walk unwinds, longest first.

use std::sync::Arc;

/// Which slot a payload came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Slot {
    Exact,
    Prefix,
}

#[derive(Debug, Clone)]
struct Node<P> {
    label: Box<[u8]>,
    /// First byte of each child's label, sorted; parallel to `children`. Exactly sized (issue 16: most nodes of a
    /// large route table are leaves, and a `Vec` grown by `insert` kept 4-8 slots of slack in each).
    child_bytes: Box<[u8]>,
    children: Box<[Arc<Node<P>>]>,
    exact: Option<P>,
    prefix: Option<P>,
}

impl<P> Node<P> {
    fn new(label: &[u8]) -> Self {
        Node {
            label: label.into(),
            child_bytes: Box::default(),
            children: Box::default(),
            exact: None,
            prefix: None,
        }
    }

    fn is_empty(&self) -> bool {
        self.children.is_empty() && self.exact.is_none() && self.prefix.is_none()
    }

    #[inline]
    fn child(&self, b: u8) -> Option<&Node<P>> {
        // Most nodes have a handful of children: a linear scan beats a binary search there.
        let at = if self.child_bytes.len() <= 16 {
            self.child_bytes.iter().position(|&c| c == b)?
        } else {
            self.child_bytes.binary_search(&b).ok()?
        };
        self.children.get(at).map(|c| &**c)
    }
}

/// The trie; cloning it is O(1) (the root is shared until one side changes).
#[derive(Debug)]
pub(crate) struct Trie<P> {
    root: Arc<Node<P>>,
}

impl<P> Clone for Trie<P> {
    fn clone(&self) -> Self {
        Trie {
            root: self.root.clone(),
        }
    }
}

impl<P> Default for Trie<P> {
    fn default() -> Self {
        Trie {
            root: Arc::new(Node::new(b"")),
        }
    }
}

impl<P: Clone> Trie<P> {
    /// Changes the payload in `slot` of `key` with `f` (which may create, change or clear it), copying the nodes on
    /// the key's path that are shared with another version. Nodes left without payload or children are pruned.
    pub(crate) fn update<R>(
        &mut self,
        key: &[u8],
        slot: Slot,
        f: impl FnOnce(&mut Option<P>) -> R,
    ) -> R {
        update(&mut self.root, key, slot, f)
    }
}

fn update<P: Clone, R>(
    node: &mut Arc<Node<P>>,
    key: &[u8],
    slot: Slot,
    f: impl FnOnce(&mut Option<P>) -> R,
) -> R {
    let n = Arc::make_mut(node);
    let Some(&first) = key.first() else {
        return f(match slot {
            Slot::Exact => &mut n.exact,
            Slot::Prefix => &mut n.prefix,
        });
    };
    let at = match n.child_bytes.binary_search(&first) {
        Ok(at) => at,
        Err(at) => {
            let mut leaf = Node::new(key);
            let r = f(match slot {
                Slot::Exact => &mut leaf.exact,
                Slot::Prefix => &mut leaf.prefix,
            });
            if !leaf.is_empty() {
                n.child_bytes = inserted(&n.child_bytes, at, first);
                n.children = inserted(&n.children, at, Arc::new(leaf));
            }
            return r;
        }
    };
    let Some(child) = n.children.get_mut(at) else {
        unreachable!("child_bytes and children are parallel")
    };
    let common = child
        .label
        .iter()
        .zip(key)
        .take_while(|(a, b)| a == b)
        .count();
    if common < child.label.len() {
        // Split `child` into `mid` (shared part) -> `child` (rest).
        let mut rest = (**child).clone();
        rest.label = child.label[common..].into();
        let mut mid = Node::new(&child.label[..common]);
        mid.child_bytes = Box::new([rest.label[0]]);
        mid.children = Box::new([Arc::new(rest)]);
        *child = Arc::new(mid);
    }
    let r = update(child, &key[common..], slot, f);
    // Keep the trie compressed under churn: drop empty nodes, merge a payload-less node into its only child.
    if child.is_empty() {
        n.child_bytes = removed(&n.child_bytes, at);
        n.children = removed(&n.children, at);
    } else if child.exact.is_none() && child.prefix.is_none() && child.children.len() == 1 {
        let c = Arc::make_mut(child);
        let Some(mut only) = std::mem::take(&mut c.children).into_vec().pop() else {
            unreachable!("one child")
        };
        let label: Box<[u8]> = c.label.iter().chain(only.label.iter()).copied().collect();
        Arc::make_mut(&mut only).label = label;
        *child = only;
    }
    r
}

/// `items` with `v` inserted at `at`, exactly sized.
fn inserted<T: Clone>(items: &[T], at: usize, v: T) -> Box<[T]> {
    let mut out = Vec::with_capacity(items.len() + 1);
    out.extend_from_slice(&items[..at]);
    out.push(v);
    out.extend_from_slice(&items[at..]);
    out.into_boxed_slice()
}

/// `items` without the one at `at`, exactly sized.
fn removed<T: Clone>(items: &[T], at: usize) -> Box<[T]> {
    let mut out = Vec::with_capacity(items.len() - 1);
    out.extend_from_slice(&items[..at]);
    out.extend_from_slice(&items[at + 1..]);
    out.into_boxed_slice()
}

impl<P> Trie<P> {
    /// Calls `f` with the exact payload of `key`, then with each prefix payload along `key`
    /// from the longest prefix to the shortest, until `f` returns `Some`.
    #[inline]
    pub(crate) fn lookup<'a, R>(
        &'a self,
        key: &[u8],
        mut f: impl FnMut(&'a P, Slot) -> Option<R>,
    ) -> Option<R> {
        walk(&self.root, Forward(key), 0, &mut f)
    }

    /// [`Trie::lookup`] over `key` read back to front (hosts are stored reversed, so a
    /// `*.example.com` suffix becomes a prefix) without copying it.
    #[inline]
    pub(crate) fn lookup_rev<'a, R>(
        &'a self,
        key: &[u8],
        mut f: impl FnMut(&'a P, Slot) -> Option<R>,
    ) -> Option<R> {
        walk(&self.root, Backward(key), 0, &mut f)
    }

    /// No key holds a payload.
    pub(crate) fn is_empty(&self) -> bool {
        self.root.is_empty()
    }
}

/// `node`'s label is matched up to `pos`: its subtree's exact hit and prefix hits first, then its own prefix.
/// Recursion depth is bounded by the trie's depth (the configured keys), not by the request.
fn walk<'a, P, K: Key, R>(
    node: &'a Node<P>,
    key: K,
    pos: usize,
    f: &mut impl FnMut(&'a P, Slot) -> Option<R>,
) -> Option<R> {
    match key.at(pos) {
        None => {
            if let Some(e) = &node.exact {
                if let r @ Some(_) = f(e, Slot::Exact) {
                    return r;
                }
            }
        }
        Some(b) => {
            if let Some(child) = node.child(b) {
                let ll = child.label.len();
                // The first byte is known equal; single-byte labels (digit fan-out) need no more.
                if ll <= 1 || key.eq_at(pos + 1, child.label.get(1..).unwrap_or_default()) {
                    if let r @ Some(_) = walk(child, key, pos + ll, f) {
                        return r;
                    }
                }
            }
        }
    }
    match &node.prefix {
        Some(p) => f(p, Slot::Prefix),
        None => None,
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
    use super::{Slot, Trie};

    fn set(t: &mut Trie<u32>, key: &[u8], slot: Slot, v: Option<u32>) {
        t.update(key, slot, |p| *p = v);
    }

    fn collect(t: &Trie<u32>, key: &str) -> Vec<(u32, Slot)> {
        let mut out = Vec::new();
        t.lookup::<()>(key.as_bytes(), |p, s| {
            out.push((*p, s));
            None
        });
        out
    }

    fn sample() -> Trie<u32> {
        let mut t = Trie::default();
        set(&mut t, b"/", Slot::Prefix, Some(1));
        set(&mut t, b"/api/", Slot::Prefix, Some(2));
        set(&mut t, b"/api/v1/users", Slot::Exact, Some(3));
        set(&mut t, b"/api/v1/", Slot::Prefix, Some(4));
        set(&mut t, b"/apx", Slot::Exact, Some(5));
        set(&mut t, b"/api/v1/users", Slot::Prefix, Some(6));
        t
    }

    #[test]
    fn exact_then_longest_to_shortest_prefix() {
        let t = sample();
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
    fn a_change_copies_the_path_and_leaves_the_old_version_serving() {
        let old = sample();
        let mut new = old.clone();
        set(&mut new, b"/api/v1/", Slot::Prefix, None);
        set(&mut new, b"/apx", Slot::Exact, None);
        set(&mut new, b"/api/v2", Slot::Exact, Some(7));
        use Slot::*;
        assert_eq!(
            collect(&new, "/api/v1/users"),
            vec![(3, Exact), (6, Prefix), (2, Prefix), (1, Prefix)]
        );
        assert_eq!(collect(&new, "/apx"), vec![(1, Prefix)]);
        assert_eq!(
            collect(&new, "/api/v2"),
            vec![(7, Exact), (2, Prefix), (1, Prefix)]
        );
        // The old version is untouched.
        assert_eq!(collect(&old, "/apx"), vec![(5, Exact), (1, Prefix)]);
        assert_eq!(collect(&old, "/api/v2"), vec![(2, Prefix), (1, Prefix)]);
        // Clearing every payload prunes every node.
        for (k, s) in [
            (&b"/"[..], Prefix),
            (b"/api/", Prefix),
            (b"/api/v1/users", Exact),
            (b"/api/v1/users", Prefix),
            (b"/api/v2", Exact),
        ] {
            set(&mut new, k, s, None);
        }
        assert!(new.is_empty());
        assert!(!old.is_empty());
    }

    #[test]
    fn reversed_lookup_reads_back_to_front() {
        let mut t = Trie::default();
        set(&mut t, b"moc.elpmaxe.", Slot::Prefix, Some(1));
        set(&mut t, b"moc.elpmaxe.oof", Slot::Exact, Some(2));
        set(&mut t, b"moc.", Slot::Prefix, Some(3));
        let rev = |k: &str| {
            let mut out = Vec::new();
            t.lookup_rev::<()>(k.as_bytes(), |p, _| {
                out.push(*p);
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
        let mut t = Trie::default();
        set(&mut t, b"ab", Slot::Prefix, Some(1));
        set(&mut t, b"a", Slot::Prefix, Some(2));
        set(&mut t, b"", Slot::Prefix, Some(3));
        let mut seen = 0;
        let r = t.lookup(b"abc", |p, _| {
            seen += 1;
            (*p == 2).then_some(*p)
        });
        assert_eq!((r, seen), (Some(2), 2));
        assert_eq!(collect(&t, "zzz"), vec![(3, Slot::Prefix)]);
    }
}
