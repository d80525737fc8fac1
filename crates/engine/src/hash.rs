//! Hashing for the hot path.
//!
//! - [`hash_bytes`]: a wyhash-style bulk hash of a byte slice, reading 16 bytes per round with a
//!   folded 64×64→128-bit multiply. Fingerprints hash each canonical string with it once.
//! - [`mix`]: combines two 64-bit values into one (order matters); fingerprints build the hash of
//!   a structure from the hashes of its parts.
//! - [`StreamHasher`]: a streaming hasher whose result does not depend on how the input was
//!   split, for text that arrives in chunks (assistant turns).
//! - [`MapHasher`]: the `std::hash::Hasher` of the engine's hash maps.

const K: u64 = 0x517c_c1b7_2722_0a95;
const P0: u64 = 0xa076_1d64_78bd_642f;
const P1: u64 = 0xe703_7ed1_a0b4_28db;

/// The folded multiply: the two halves of the 128-bit product, xored.
#[inline]
fn mum(a: u64, b: u64) -> u64 {
    let r = u128::from(a) * u128::from(b);
    (r as u64) ^ ((r >> 64) as u64)
}

/// Eight little-endian bytes at `i` (0 when out of range, which callers never ask for).
#[inline]
fn r8(s: &[u8], i: usize) -> u64 {
    s.get(i..)
        .and_then(<[u8]>::first_chunk::<8>)
        .map_or(0, |c| u64::from_le_bytes(*c))
}

/// Four little-endian bytes at `i`.
#[inline]
fn r4(s: &[u8], i: usize) -> u64 {
    s.get(i..)
        .and_then(<[u8]>::first_chunk::<4>)
        .map_or(0, |c| u64::from(u32::from_le_bytes(*c)))
}

/// Hash of a byte slice (wyhash's structure: 16 bytes per round, overlapping reads for the
/// tail, the length mixed into the result). Equal inputs and seeds give equal hashes; the
/// seed separates kinds of values.
#[inline]
pub fn hash_bytes(seed: u64, s: &[u8]) -> u64 {
    let len = s.len();
    let mut seed = seed ^ P0;
    let (a, b) = if len <= 16 {
        if len >= 4 {
            let q = (len >> 3) << 2;
            (
                (r4(s, 0) << 32) | r4(s, q),
                (r4(s, len - 4) << 32) | r4(s, len - 4 - q),
            )
        } else if let (Some(&first), Some(&last)) = (s.first(), s.last()) {
            let mid = s.get(len >> 1).copied().unwrap_or(0);
            (
                (u64::from(first) << 16) | (u64::from(mid) << 8) | u64::from(last),
                0,
            )
        } else {
            (0, 0)
        }
    } else {
        let mut rest = s;
        while rest.len() > 16 {
            let Some((block, tail)) = rest.split_first_chunk::<16>() else {
                break;
            };
            seed = mum(r8(block, 0) ^ P1, r8(block, 8) ^ seed);
            rest = tail;
        }
        (r8(s, len - 16), r8(s, len - 8))
    };
    mum(P1 ^ len as u64, mum(a ^ P1, b ^ seed))
}

/// Combines two 64-bit hashes (or a hash and a value) into one; order matters.
#[inline]
pub fn mix(a: u64, b: u64) -> u64 {
    mum(a ^ P0, b ^ P1)
}

/// Seeds that keep the hashes of different kinds of values apart.
pub(crate) mod tag {
    pub const OBJECT: u64 = 0x9ae1_6a3b_2f90_404f;
    pub const ARRAY: u64 = 0xc2b2_ae3d_27d4_eb4f;
    pub const STRING: u64 = 0x1656_67b1_9e37_79f9;
    pub const NUMBER: u64 = 0x27d4_eb2f_1656_67c5;
    pub const TRUE: u64 = 0x85eb_ca77_c2b2_ae63;
    pub const FALSE: u64 = 0x94d0_49bb_1331_11eb;
    pub const NULL: u64 = 0xbf58_476d_1ce4_e5b9;
    pub const KEY: u64 = 0x2545_f491_4f6c_dd1d;
    pub const RAW: u64 = 0x5851_f42d_4c95_7f2d;
    pub const FILE_READ: u64 = 0x1405_7b7e_f767_814f;
    pub const SHELL: u64 = 0xd6e8_feb8_6659_fd93;
    /// A text: whitespace-canonical bytes.
    pub const TEXT: u64 = 0x3c6e_f372_fe94_f82b;
}

/// FxHash-style word mixing with a final avalanche; the result does not depend on how the
/// input was split into `byte` and `bytes` calls.
#[derive(Clone, Copy, Debug, Default)]
pub struct StreamHasher {
    h: u64,
    word: u64,
    n: u32,
    len: u64,
}

impl StreamHasher {
    pub fn new() -> StreamHasher {
        StreamHasher::default()
    }

    #[inline]
    fn mix(&mut self, w: u64) {
        self.h = (self.h.rotate_left(5) ^ w).wrapping_mul(K);
    }

    #[inline]
    pub fn byte(&mut self, b: u8) {
        self.word |= u64::from(b) << (8 * self.n);
        self.n += 1;
        self.len += 1;
        if self.n == 8 {
            let w = self.word;
            self.mix(w);
            self.word = 0;
            self.n = 0;
        }
    }

    #[inline]
    pub fn bytes(&mut self, s: &[u8]) {
        let mut rest = s;
        while self.n != 0 {
            match rest.split_first() {
                Some((&b, tail)) => {
                    self.byte(b);
                    rest = tail;
                }
                None => return,
            }
        }
        let mut chunks = rest.chunks_exact(8);
        for c in &mut chunks {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            self.mix(u64::from_le_bytes(w));
            self.len += 8;
        }
        for &b in chunks.remainder() {
            self.byte(b);
        }
    }

    pub fn finish(&self) -> u64 {
        let mut h = self.h;
        if self.n != 0 {
            h = (h.rotate_left(5) ^ self.word).wrapping_mul(K);
        }
        fmix(h ^ self.len)
    }
}

/// Murmur3's finalizer.
#[inline]
pub fn fmix(mut h: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

/// Hash of a string.
#[inline]
pub fn hash_str(s: &str) -> u64 {
    hash_bytes(0, s.as_bytes())
}

/// The hasher of the engine's hash maps (session ids, tool names, text units): each `write`
/// is one [`hash_bytes`] call.
#[derive(Clone, Copy, Debug, Default)]
pub struct MapHasher(u64);

impl std::hash::Hasher for MapHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        self.0 = hash_bytes(self.0, bytes);
    }

    #[inline]
    fn write_u8(&mut self, v: u8) {
        self.0 = mix(self.0, u64::from(v));
    }

    #[inline]
    fn write_u64(&mut self, v: u64) {
        self.0 = mix(self.0, v);
    }

    #[inline]
    fn write_usize(&mut self, v: usize) {
        self.0 = mix(self.0, v as u64);
    }

    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }
}

/// Combines two hashes (order matters).
#[inline]
pub fn combine(a: u64, b: u64) -> u64 {
    fmix(a.rotate_left(17) ^ b.wrapping_mul(K))
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;
    use std::hash::Hasher;

    use super::*;

    #[test]
    fn split_does_not_matter() {
        let text = "hello, world, this is a longer string";
        let mut whole = StreamHasher::new();
        whole.bytes(text.as_bytes());
        let mut h = StreamHasher::new();
        h.bytes(b"hel");
        h.bytes(b"lo, world, this ");
        h.byte(b'i');
        h.bytes(b"s a longer string");
        assert_eq!(whole.finish(), h.finish());
        let one = |s: &[u8]| {
            let mut h = StreamHasher::new();
            h.bytes(s);
            h.finish()
        };
        assert_ne!(one(b"a"), one(b"b"));
        assert_ne!(one(b""), one(b"\0"));
    }

    /// Every length from 0 to 80 (all the short-input and block paths), and every single-bit
    /// change of each input, gives a distinct hash; equal inputs give equal hashes.
    #[test]
    fn bulk_hash_tells_inputs_apart() {
        let base: Vec<u8> = (0..80u8)
            .map(|i| i.wrapping_mul(37).wrapping_add(11))
            .collect();
        let mut seen = HashSet::new();
        for len in 0..=base.len() {
            let s = &base[..len];
            let copy = s.to_vec();
            assert_eq!(hash_bytes(7, s), hash_bytes(7, &copy));
            assert!(seen.insert(hash_bytes(7, s)), "length {len}");
            for i in 0..len {
                for bit in 0..8 {
                    let mut t = s.to_vec();
                    t[i] ^= 1 << bit;
                    assert!(
                        seen.insert(hash_bytes(7, &t)),
                        "length {len}, byte {i}, bit {bit}"
                    );
                }
            }
        }
        // Zero bytes at the end are not padding.
        assert_ne!(hash_bytes(0, b"ab"), hash_bytes(0, b"ab\0"));
        assert_ne!(hash_bytes(0, &[0; 8]), hash_bytes(0, &[0; 9]));
        assert_ne!(hash_bytes(0, &[0; 16]), hash_bytes(0, &[0; 17]));
        // The seed separates kinds of values.
        assert_ne!(hash_bytes(tag::STRING, b"x"), hash_bytes(tag::KEY, b"x"));
        assert_ne!(hash_bytes(1, b""), hash_bytes(2, b""));
    }

    #[test]
    fn mix_is_ordered_and_spreads() {
        assert_ne!(mix(1, 2), mix(2, 1));
        let mut seen = HashSet::new();
        for a in 0..64u64 {
            for b in 0..64u64 {
                assert!(seen.insert(mix(a, b)));
            }
        }
        assert_eq!(hash_str("abc"), hash_bytes(0, b"abc"));
    }

    #[test]
    fn map_hasher_is_deterministic() {
        let h = |s: &str| {
            let mut m = MapHasher::default();
            std::hash::Hash::hash(s, &mut m);
            m.finish()
        };
        assert_eq!(h("session-1"), h("session-1"));
        assert_ne!(h("session-1"), h("session-2"));
        assert_ne!(h(""), h("\u{ff}"));
    }
}
