//! `IntMap`: a `HashMap` for integer keys (file descriptors, object addresses) with a hasher of a
//! few instructions instead of the standard library's SipHash.
//!
//! SipHash resists hash flooding by chosen keys; these keys are chosen by the kernel (fd
//! numbers) and the allocator (addresses), not by a peer, so that protection buys nothing here
//! and costs about 200 instructions per lookup (measured on the server's per-request task
//! table). The mix below spreads keys over both ends of the 64-bit hash: hashbrown takes the
//! bucket from the low bits and a tag from the top seven, and addresses share their low four
//! bits (alignment) and most of their high ones.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// `HashMap` keyed by an integer, hashed with [`IntHasher`].
pub type IntMap<K, V> = HashMap<K, V, BuildHasherDefault<IntHasher>>;

/// Hasher for integer keys; anything else is folded in 8 bytes at a time.
#[derive(Default, Clone, Copy)]
pub struct IntHasher(u64);

impl IntHasher {
    fn mix(&mut self, x: u64) {
        let h = (self.0 ^ x ^ (x >> 29)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        self.0 = h ^ (h >> 32);
    }
}

impl Hasher for IntHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.mix(u64::from_le_bytes(word));
        }
    }

    fn write_u64(&mut self, x: u64) {
        self.mix(x);
    }

    fn write_usize(&mut self, x: usize) {
        self.mix(x as u64);
    }

    fn write_i32(&mut self, x: i32) {
        // Sign-extended, so -1 and u32::MAX differ.
        self.mix(i64::from(x) as u64);
    }
}

#[cfg(test)]
mod tests {
    use super::IntMap;
    use std::hash::{BuildHasher, BuildHasherDefault};

    #[test]
    fn holds_fds_and_addresses_like_a_hashmap() {
        let mut fds: IntMap<i32, i32> = IntMap::default();
        for fd in -1..5000 {
            fds.insert(fd, fd * 2);
        }
        for fd in -1..5000 {
            assert_eq!(fds.remove(&fd), Some(fd * 2));
        }
        assert!(fds.is_empty());
        let mut addrs: IntMap<usize, usize> = IntMap::default();
        let base = 0x7f12_3456_0000_usize;
        for i in 0..5000 {
            addrs.insert(base + i * 48, i);
        }
        assert_eq!(addrs.len(), 5000);
        assert_eq!(addrs.get(&(base + 4999 * 48)), Some(&4999));
        assert_eq!(addrs.get(&(base + 1)), None);
    }

    #[test]
    fn aligned_addresses_spread_over_low_and_high_bits() {
        let build = BuildHasherDefault::<super::IntHasher>::default();
        let base = 0x7f12_3456_0000_usize;
        let hashes: Vec<u64> = (0..256).map(|i| build.hash_one(base + i * 16)).collect();
        let low: std::collections::HashSet<u64> = hashes.iter().map(|h| h & 0xff).collect();
        let top: std::collections::HashSet<u64> = hashes.iter().map(|h| h >> 57).collect();
        // 256 keys into 256 low-byte values and 128 tags: far from all in a few.
        assert!(low.len() > 128, "low bits: {} distinct", low.len());
        assert!(top.len() > 64, "top bits: {} distinct", top.len());
    }
}
