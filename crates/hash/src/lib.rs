//! Every hash function loopguard uses, in one place.
//!
//! - The engine's hot path: [`hash_bytes`] (a wyhash-style bulk hash, 16 bytes per round with a
//!   folded 64×64→128-bit multiply), [`mix`] and [`combine`] (two 64-bit values into one),
//!   [`StreamHasher`] (text that arrives in chunks) and [`MapHasher`] (the engine's hash maps).
//! - FNV-1a ([`fnv1a`], [`fnv1a_byte`]) for short names hashed byte by byte (plugin session
//!   shards, plugin tags, text units).
//! - Finalizers that spread the bits of a 64-bit value: [`fmix`] (Murmur3's) and [`splitmix`]
//!   (SplitMix64's).
//! - [`FingerprintHasher`], the hasher of maps keyed by values that are hashes already.
//! - With the `xxh3` feature, [`xxh3`]: XXH3-64, the hash of names that several processes must
//!   agree on (worker ids, shards of a Redis store).
//!
//! # Key design decision
//!
//! Hash values are part of loopguard's formats: fingerprints, loop keys and worker ids are
//! written in snapshots and Redis keys, and plugin session shards must not move between
//! builds. So each function here is pinned by a test of its values (`tests` below), and a
//! change of any value is a change of format that needs a new snapshot version. The crate has
//! no dependency (XXH3 comes from `xxhash-rust` behind its feature), so plugins can use it
//! without linking anything else.
//!
//! ```
//! use loopguard_hash::{StreamHasher, fnv1a, hash_bytes, hash_str};
//!
//! // Equal inputs and seeds give equal hashes; the seed separates kinds of values.
//! assert_eq!(hash_str("cargo build"), hash_bytes(0, b"cargo build"));
//! assert_ne!(hash_bytes(1, b"x"), hash_bytes(2, b"x"));
//!
//! // A stream hash does not depend on how its input was split.
//! let (mut whole, mut parts) = (StreamHasher::new(), StreamHasher::new());
//! whole.bytes(b"hello, world");
//! parts.bytes(b"hello, ");
//! parts.bytes(b"world");
//! assert_eq!(whole.finish(), parts.finish());
//!
//! assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
//! ```

#![warn(missing_docs)]
#![forbid(unsafe_code)]

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

/// Hash of a byte slice (wyhash's structure: 16 bytes per round, overlapping reads for the
/// tail, the length mixed into the result). Equal inputs and seeds give equal hashes; the
/// seed separates kinds of values.
#[inline]
pub fn hash_bytes(seed: u64, s: &[u8]) -> u64 {
    let len = s.len();
    let mut seed = seed ^ P0;
    let (a, b) = if len <= 16 {
        // The four-byte reads at 0, q, len - 4 and len - 4 - q (q = 4 from 8 bytes on, 8 at
        // 16, 0 below 8), taken from the first and last eight (or four) bytes.
        if let (Some(first), Some(last)) = (s.first_chunk::<8>(), s.last_chunk::<8>()) {
            let (f, l) = (u64::from_le_bytes(*first), u64::from_le_bytes(*last));
            if len < 16 {
                (f.rotate_left(32), l)
            } else {
                (
                    (f << 32) | (l & 0xffff_ffff),
                    (l & !0xffff_ffff) | (f >> 32),
                )
            }
        } else if let (Some(first), Some(last)) = (s.first_chunk::<4>(), s.last_chunk::<4>()) {
            let (f, l) = (
                u64::from(u32::from_le_bytes(*first)),
                u64::from(u32::from_le_bytes(*last)),
            );
            ((f << 32) | f, (l << 32) | l)
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

/// Hash of a string: [`hash_bytes`] with seed 0.
#[inline]
pub fn hash_str(s: &str) -> u64 {
    hash_bytes(0, s.as_bytes())
}

/// Combines two 64-bit hashes (or a hash and a value) into one with a folded multiply; order
/// matters.
#[inline]
pub fn mix(a: u64, b: u64) -> u64 {
    mum(a ^ P0, b ^ P1)
}

/// Combines two hashes with a rotation, a multiply and [`fmix`]; order matters.
#[inline]
pub fn combine(a: u64, b: u64) -> u64 {
    fmix(a.rotate_left(17) ^ b.wrapping_mul(K))
}

/// Murmur3's 64-bit finalizer: every input bit affects every output bit.
#[inline]
pub fn fmix(mut h: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

/// SplitMix64's finalizer (Stafford's variant 13).
#[inline]
pub fn splitmix(mut h: u64) -> u64 {
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

/// FxHash-style word mixing with a final avalanche; the result does not depend on how the
/// input was split into [`StreamHasher::byte`] and [`StreamHasher::bytes`] calls.
#[derive(Clone, Copy, Debug, Default)]
pub struct StreamHasher {
    h: u64,
    word: u64,
    n: u32,
    len: u64,
}

impl StreamHasher {
    /// A hasher that has seen nothing.
    pub fn new() -> StreamHasher {
        StreamHasher::default()
    }

    #[inline]
    fn mix(&mut self, w: u64) {
        self.h = (self.h.rotate_left(5) ^ w).wrapping_mul(K);
    }

    /// Feeds one byte.
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

    /// Feeds bytes.
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

    /// The hash of everything fed so far.
    pub fn finish(&self) -> u64 {
        let mut h = self.h;
        if self.n != 0 {
            h = (h.rotate_left(5) ^ self.word).wrapping_mul(K);
        }
        fmix(h ^ self.len)
    }
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

/// The hasher of maps keyed by values that are well-mixed 64-bit hashes already (call
/// fingerprints): one multiply and a fold per key, where SipHash would cost more than the rest
/// of a lookup.
#[derive(Clone, Copy, Debug, Default)]
pub struct FingerprintHasher(u64);

impl std::hash::Hasher for FingerprintHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0 ^ n).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }

    fn finish(&self) -> u64 {
        self.0 ^ (self.0 >> 29)
    }
}

/// FNV-1a's offset basis: the hash of no bytes.
pub const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

/// FNV-1a's 64-bit prime.
const FNV_PRIME: u64 = 0x0100_0000_01b3;

/// One step of FNV-1a: `h` (start from [`FNV_OFFSET`]) with the byte `b` fed in.
#[inline]
pub const fn fnv1a_byte(h: u64, b: u8) -> u64 {
    (h ^ b as u64).wrapping_mul(FNV_PRIME)
}

/// FNV-1a (64-bit) of a byte slice.
#[inline]
pub fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(FNV_OFFSET, |h, &b| fnv1a_byte(h, b))
}

/// A hash of several byte strings: FNV-1a over each one followed by a `0xff` byte (which no
/// UTF-8 text contains), then the first round of Murmur3's finalizer. The similarity plugin's
/// call and group keys; group keys become the engine's loop keys, which snapshots keep.
pub fn fnv1a_fields(parts: &[&[u8]]) -> u64 {
    let mut h = FNV_OFFSET;
    for part in parts {
        h = part.iter().fold(h, |h, &b| fnv1a_byte(h, b));
        h = fnv1a_byte(h, 0xff);
    }
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^ (h >> 33)
}

/// XXH3-64 with seed 0: the hash every process and every build derives alike from the same
/// bytes (worker ids in snapshots and Redis, store shards).
#[cfg(feature = "xxh3")]
#[inline]
pub fn xxh3(bytes: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(bytes)
}

/// XXH3-64 with a secret seed: a keyed hash (the proxy names callers by a keyed hash of their
/// API key, with a seed the key's holder cannot know).
#[cfg(feature = "xxh3")]
#[inline]
pub fn xxh3_keyed(bytes: &[u8], seed: u64) -> u64 {
    xxhash_rust::xxh3::xxh3_64_with_seed(bytes, seed)
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;
    use std::hash::Hasher;

    use super::*;

    const INPUTS: [&[u8]; 6] = [
        b"",
        b"a",
        b"abc",
        b"session-1",
        b"{\"command\":\"cargo build\"}",
        b"0123456789abcdef0123456789abcdefXYZ - a longer input that crosses several 16-byte blocks",
    ];

    fn stream(s: &[u8]) -> u64 {
        let mut h = StreamHasher::new();
        h.bytes(s);
        h.finish()
    }

    /// Four little-endian bytes at `i`.
    fn r4(s: &[u8], i: usize) -> u64 {
        s.get(i..)
            .and_then(<[u8]>::first_chunk::<4>)
            .map_or(0, |c| u64::from(u32::from_le_bytes(*c)))
    }

    /// [`hash_bytes`] with its short inputs read four bytes at a time, as the structure says.
    fn hash_bytes_by_fours(seed: u64, s: &[u8]) -> u64 {
        let len = s.len();
        if !(4..=16).contains(&len) {
            return hash_bytes(seed, s);
        }
        let q = (len >> 3) << 2;
        let a = (r4(s, 0) << 32) | r4(s, q);
        let b = (r4(s, len - 4) << 32) | r4(s, len - 4 - q);
        mum(P1 ^ len as u64, mum(a ^ P1, b ^ (seed ^ P0)))
    }

    #[test]
    fn short_inputs_hash_as_their_four_byte_reads() {
        let text: Vec<u8> = (0..40u8).map(|i| i.wrapping_mul(37) ^ 0x5a).collect();
        for len in 0..=20 {
            for at in 0..8 {
                let s = &text[at..at + len];
                assert_eq!(hash_bytes(3, s), hash_bytes_by_fours(3, s), "{len} at {at}");
            }
        }
    }

    /// The values snapshots, Redis keys and plugin shards depend on. A change here is a change
    /// of format: bump the snapshot version rather than the expected values.
    #[test]
    fn values_are_pinned() {
        let expected: [[u64; 6]; 6] = [
            // hash_bytes(0, _)
            [
                0x42bc_986d_c5ee_c4d3,
                0x6cf8_4e5a_2465_e867,
                0xb480_8df2_2d44_ffcf,
                0xd1eb_bb0c_ba0e_b463,
                0xda2d_01ed_ec7b_9389,
                0x98b6_3dbb_32a1_25b6,
            ],
            // hash_bytes(7, _)
            [
                0x575c_a3f1_b41b_b7eb,
                0x4d81_9ac6_f84d_17ce,
                0x0076_4909_46b8_039d,
                0x405a_855c_d284_7116,
                0xc9c8_1a1f_5a8e_56ce,
                0x2a34_9422_9e88_127a,
            ],
            // StreamHasher
            [
                0x0000_0000_0000_0000,
                0x496a_d212_cde3_9848,
                0x5ebd_fb5e_0767_0ea8,
                0x984a_afa0_f5e0_a3e6,
                0x0f88_d060_649f_ecb1,
                0x484d_5236_baa1_7530,
            ],
            // fnv1a
            [
                0xcbf2_9ce4_8422_2325,
                0xaf63_dc4c_8601_ec8c,
                0xe71f_a219_0541_574b,
                0x1688_595d_cf49_184d,
                0xd0ab_f8ff_7070_3b0e,
                0x235e_84d7_97dc_2d2c,
            ],
            // splitmix(fnv1a(_)), the results plugin's token hash
            [
                0xf52a_15e9_a9b5_e89b,
                0x02c0_bdbf_4814_20f8,
                0x0dd4_9049_0804_b508,
                0x8f9d_4a83_e238_4785,
                0x8f90_332b_b915_fce3,
                0x8904_0df0_19aa_94a3,
            ],
            // fnv1a_fields(&[_])
            [
                0xaf9b_af0b_40b2_142d,
                0x5667_8dc8_7994_7c86,
                0xa581_6b67_ed6b_e80a,
                0x95cc_332e_320d_fad6,
                0x4b76_84f4_4f6e_117b,
                0xabe6_495c_3404_7694,
            ],
        ];
        for (i, s) in INPUTS.iter().enumerate() {
            let got = [
                hash_bytes(0, s),
                hash_bytes(7, s),
                stream(s),
                fnv1a(s),
                splitmix(fnv1a(s)),
                fnv1a_fields(&[s]),
            ];
            for (f, row) in expected.iter().enumerate() {
                assert_eq!(got[f], row[i], "function {f}, input {i}");
            }
        }
        assert_eq!(fnv1a_fields(&[b"abc", b"tail"]), 0x8d4f_ee97_6303_d6a6);
        assert_eq!(fnv1a_fields(&[b"", b"tail"]), 0x6151_3bfa_d0a9_1837);
        let pairs = [(0u64, 0u64), (1, 2), (0xdead_beef, 0x1234_5678_9abc_def0)];
        let expected = [
            // mix, combine, fmix(a ^ b), splitmix(a ^ b)
            [0x1ff5_c292_3a78_8d2c, 0, 0, 0],
            [
                0xf785_8b38_a849_9be9,
                0xfb84_b64a_bc53_e5e0,
                0x0b51_81c5_09f8_d8ce,
                0x1e53_5eed_e314_28f0,
            ],
            [
                0xb6da_8eac_4776_6f43,
                0xc609_17ef_2476_53cb,
                0x758f_36b7_dbba_0f58,
                0x2559_f017_15f6_6ef1,
            ],
        ];
        for ((a, b), row) in pairs.into_iter().zip(expected) {
            assert_eq!(
                [mix(a, b), combine(a, b), fmix(a ^ b), splitmix(a ^ b)],
                row,
                "{a:#x}, {b:#x}"
            );
        }
    }

    #[cfg(feature = "xxh3")]
    #[test]
    fn xxh3_values_are_pinned() {
        let expected = [
            0x2d06_8005_38d3_94c2,
            0xe6c6_32b6_1e96_4e1f,
            0x78af_5f94_892f_3950,
            0xc07e_a649_48c9_a305,
            0x7b74_6738_4355_18ad,
            0x2a74_d077_d572_1b16,
        ];
        for (s, e) in INPUTS.iter().zip(expected) {
            assert_eq!(xxh3(s), e);
        }
    }

    #[test]
    fn split_does_not_matter() {
        let text = "hello, world, this is a longer string";
        let mut h = StreamHasher::new();
        h.bytes(b"hel");
        h.bytes(b"lo, world, this ");
        h.byte(b'i');
        h.bytes(b"s a longer string");
        assert_eq!(stream(text.as_bytes()), h.finish());
        assert_ne!(stream(b"a"), stream(b"b"));
        assert_ne!(stream(b""), stream(b"\0"));
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

    #[test]
    fn fingerprint_hasher_spreads_nearby_keys() {
        let h = |k: u64| {
            let mut f = FingerprintHasher::default();
            f.write_u64(k);
            f.finish()
        };
        let seen: HashSet<u64> = (0..1000).map(h).collect();
        assert_eq!(seen.len(), 1000);
    }
}
