//! The routes of a snapshot by slot: what the router's value points at. A slot is a route's for as long as the
//! route exists, so a write that adds, changes or removes a few routes touches their slots and the router's keys
//! for them, never the other routes' (issue 16: a write must not cost O(routes)). Persistent: a successor shares
//! every chunk it does not change, so cloning costs one pointer per 64 routes and a change copies one chunk.
//! A request reads it with two loads (`get`).

use std::sync::Arc;

const SHIFT: u32 = 6;
const CHUNK: usize = 1 << SHIFT;

type Chunk<T> = [Option<T>; CHUNK];

pub(crate) struct Slots<T> {
    chunks: Vec<Arc<Chunk<T>>>,
    /// Free slots (of removed routes), reused before the table grows.
    free: Vec<u32>,
    used: usize,
}

impl<T> Default for Slots<T> {
    fn default() -> Self {
        Slots {
            chunks: Vec::new(),
            free: Vec::new(),
            used: 0,
        }
    }
}

impl<T> Clone for Slots<T> {
    fn clone(&self) -> Self {
        Slots {
            chunks: self.chunks.clone(),
            free: self.free.clone(),
            used: self.used,
        }
    }
}

impl<T: Clone> Slots<T> {
    #[inline]
    pub fn get(&self, slot: u32) -> Option<&T> {
        let c = self.chunks.get((slot >> SHIFT) as usize)?;
        c[slot as usize & (CHUNK - 1)].as_ref()
    }

    /// Number of slots in use.
    pub fn len(&self) -> usize {
        self.used
    }

    /// A free slot (the lowest freed one is not sought: any free slot will do).
    pub fn alloc(&mut self) -> u32 {
        if let Some(s) = self.free.pop() {
            return s;
        }
        let s = (self.chunks.len() * CHUNK) as u32;
        self.chunks.push(Arc::new(std::array::from_fn(|_| None)));
        self.free.extend((s + 1..s + CHUNK as u32).rev());
        s
    }

    pub fn set(&mut self, slot: u32, v: T) {
        let c = Arc::make_mut(&mut self.chunks[(slot >> SHIFT) as usize]);
        if c[slot as usize & (CHUNK - 1)].replace(v).is_none() {
            self.used += 1;
        }
    }

    pub fn clear(&mut self, slot: u32) {
        let Some(c) = self.chunks.get_mut((slot >> SHIFT) as usize) else {
            return;
        };
        if Arc::make_mut(c)[slot as usize & (CHUNK - 1)]
            .take()
            .is_some()
        {
            self.used -= 1;
            self.free.push(slot);
        }
    }

    /// Every occupied slot's value, in slot order.
    pub fn values(&self) -> impl Iterator<Item = &T> {
        self.chunks.iter().flat_map(|c| c.iter().flatten())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_reused_and_clones_do_not_see_later_changes() {
        let mut a: Slots<u32> = Slots::default();
        let s: Vec<u32> = (0..200).map(|_| a.alloc()).collect();
        let mut uniq = s.clone();
        uniq.sort_unstable();
        uniq.dedup();
        assert_eq!(uniq.len(), 200);
        for &i in &s {
            a.set(i, i * 10);
        }
        assert_eq!(a.len(), 200);
        let b = a.clone();
        a.clear(s[7]);
        a.set(s[8], 1);
        assert_eq!((a.get(s[7]), a.get(s[8])), (None, Some(&1)));
        assert_eq!(
            (b.get(s[7]), b.get(s[8])),
            (Some(&(s[7] * 10)), Some(&(s[8] * 10)))
        );
        assert_eq!(a.len(), 199);
        // The freed slot comes back before the table grows.
        assert_eq!(a.alloc(), s[7]);
        assert_eq!(a.get(100_000), None);
        assert_eq!(b.values().count(), 200);
    }
}
