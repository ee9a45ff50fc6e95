//! Consistent hashing ring for `chash` (ketama / lua-resty-chash style): each node owns
//! `160 * weight` pseudo-random points (weights reduced by their gcd), a key is served by the
//! first point at or after its hash, clockwise.
//!
//! Removing a node (or marking it unhealthy, or trying it on a retry) only moves the keys that
//! node owned: lookups skip its points and land on the next owner clockwise, exactly where a
//! rebuilt ring without it would send them. Point positions depend only on the node's `addr`,
//! so every gateway instance maps a key the same way. Rings are capped at [`MAX_POINTS`];
//! beyond that, point counts are scaled proportionally (at least 1 per node), which keeps
//! proportions but makes remapping across such a rescale less than minimal.
//! The hash is a small multiply-rotate hash with a murmur3 finaliser (not SipHash): it is
//! deterministic across builds and CPUs, which `ahash` is not. Not compatible with APISIX's
//! crc32 ring positions: a migrated fleet remaps keys once.

use super::{roundrobin::gcd, Filter};

/// Virtual nodes per unit of (gcd-reduced) weight, as lua-resty-chash's `CONSISTENT_POINTS`.
pub(super) const POINTS_PER_WEIGHT: u64 = 160;
/// Upper bound on points per priority group (512 KiB).
pub(super) const MAX_POINTS: u64 = 65_536;

const K1: u64 = 0x9e37_79b9_7f4a_7c15;
const K2: u64 = 0xc2b2_ae3d_27d4_eb4f;

/// Sorted ring positions and the node index owning each.
#[derive(Debug)]
pub(super) struct Ring {
    hashes: Box<[u32]>,
    owners: Box<[u32]>,
    /// `index[j]` = first position whose hash is >= `j << shift`: a lookup is one table read
    /// plus ~1 step of linear probing instead of a mispredicting binary search.
    index: Box<[u32]>,
    shift: u32,
}

impl Ring {
    /// `members[i]` (weight `weights[i]` > 0) is identified on the ring by `addrs[i]`.
    pub(super) fn build(members: &[u32], weights: &[u32], addrs: &[&str]) -> Self {
        let g = weights
            .iter()
            .fold(0u64, |g, &w| gcd(g, u64::from(w)))
            .max(1);
        let mut points: Vec<u64> = weights
            .iter()
            .map(|&w| u64::from(w) / g * POINTS_PER_WEIGHT)
            .collect();
        let total: u64 = points.iter().sum();
        if total > MAX_POINTS {
            points
                .iter_mut()
                .for_each(|p| *p = (*p * MAX_POINTS / total).max(1));
        }
        let mut ring: Vec<(u32, u64, u32)> =
            Vec::with_capacity(points.iter().sum::<u64>() as usize);
        for ((&member, &n), addr) in members.iter().zip(&points).zip(addrs) {
            let base = hash64(addr.as_bytes());
            for r in 0..n {
                ring.push((
                    fold(fmix64(base ^ r.wrapping_add(1).wrapping_mul(K1))),
                    base,
                    member,
                ));
            }
        }
        // Ties broken by the node's own hash, not its config position, so reordering or
        // removing nodes cannot change which node owns a shared position.
        ring.sort_unstable_by_key(|&(h, base, _)| (h, base));
        let hashes: Box<[u32]> = ring.iter().map(|p| p.0).collect();
        // About one bucket per point (at least 2, at most 2^16).
        let bits = (usize::BITS - ring.len().saturating_sub(1).leading_zeros()).clamp(1, 16);
        let shift = 32 - bits;
        let index = (0..1u64 << bits)
            .map(|j| hashes.partition_point(|&h| u64::from(h) < j << shift) as u32)
            .collect();
        Ring {
            owners: ring.iter().map(|p| p.2).collect(),
            hashes,
            index,
            shift,
        }
    }

    /// Owner of the first point at or after `key_hash`, skipping points the filter rejects.
    #[inline]
    pub(super) fn pick(&self, key_hash: u32, f: &Filter<'_>, open: bool) -> Option<usize> {
        let len = self.hashes.len();
        if len == 0 {
            return None;
        }
        let bucket = (key_hash >> self.shift) as usize;
        let mut start = self.index.get(bucket).map_or(0, |&p| p as usize);
        while start < len && self.hashes[start] < key_hash {
            start += 1;
        }
        if start == len {
            start = 0;
        }
        if open {
            return Some(self.owners[start] as usize);
        }
        let (tail, head) = self.owners.split_at(start);
        head.iter()
            .chain(tail)
            .map(|&i| i as usize)
            .find(|&i| f.allows(i))
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.hashes.len()
    }

    /// Plain binary-search lookup, the reference the bucket index must agree with.
    #[cfg(test)]
    pub(super) fn reference_owner(&self, key_hash: u32) -> usize {
        let p = self.hashes.partition_point(|&h| h < key_hash);
        self.owners[if p == self.hashes.len() { 0 } else { p }] as usize
    }
}

/// Ring position of a request's hash key.
#[inline]
pub(super) fn key_hash(key: &[u8]) -> u32 {
    fold(hash64(key))
}

/// Deterministic 64-bit hash: 8 bytes per multiply-rotate round, then murmur3's finaliser.
#[inline]
pub(super) fn hash64(bytes: &[u8]) -> u64 {
    let mut h = (bytes.len() as u64).wrapping_mul(K1) ^ K2;
    let mut chunks = bytes.chunks_exact(8);
    for c in &mut chunks {
        let mut word = [0u8; 8];
        word.copy_from_slice(c);
        h = (h ^ u64::from_le_bytes(word).wrapping_mul(K2))
            .rotate_left(31)
            .wrapping_mul(K1);
    }
    let rest = chunks.remainder();
    if !rest.is_empty() {
        let mut word = [0u8; 8];
        word[..rest.len()].copy_from_slice(rest);
        h = (h ^ u64::from_le_bytes(word).wrapping_mul(K2))
            .rotate_left(31)
            .wrapping_mul(K1);
    }
    fmix64(h)
}

#[inline]
fn fmix64(mut h: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

#[inline]
fn fold(h: u64) -> u32 {
    (h ^ (h >> 32)) as u32
}
