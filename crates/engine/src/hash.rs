//! A small streaming hasher: bytes are fed one at a time or in slices, and the result does not
//! depend on how the input was split, so canonical forms can be hashed without being built.

const K: u64 = 0x517c_c1b7_2722_0a95;

/// Tags written between values so that different shapes never hash alike.
pub(crate) mod tag {
    pub const END: u8 = 0xFF;
    pub const OBJECT: u8 = 0xF0;
    pub const ARRAY: u8 = 0xF1;
    pub const STRING: u8 = 0xF2;
    pub const NUMBER: u8 = 0xF3;
    pub const TRUE: u8 = 0xF4;
    pub const FALSE: u8 = 0xF5;
    pub const NULL: u8 = 0xF6;
    pub const KEY: u8 = 0xF7;
    pub const RAW: u8 = 0xF8;
    pub const FILE_READ: u8 = 0xF9;
    pub const SHELL: u8 = 0xFA;
}

/// FxHash-style word mixing with a final avalanche.
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

    pub fn with_seed(seed: u64) -> StreamHasher {
        StreamHasher {
            h: seed,
            ..StreamHasher::default()
        }
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

    #[inline]
    pub fn u64(&mut self, v: u64) {
        self.bytes(&v.to_le_bytes());
    }

    pub fn finish(&self) -> u64 {
        let mut h = self.h;
        if self.n != 0 {
            h = (h.rotate_left(5) ^ self.word).wrapping_mul(K);
        }
        fmix(h ^ self.len)
    }
}

impl std::hash::Hasher for StreamHasher {
    fn write(&mut self, bytes: &[u8]) {
        self.bytes(bytes);
    }

    fn write_u64(&mut self, v: u64) {
        self.u64(v);
    }

    fn finish(&self) -> u64 {
        StreamHasher::finish(self)
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
pub fn hash_str(s: &str) -> u64 {
    let mut h = StreamHasher::new();
    h.bytes(s.as_bytes());
    h.finish()
}

/// Combines two hashes (order matters).
#[inline]
pub fn combine(a: u64, b: u64) -> u64 {
    fmix(a.rotate_left(17) ^ b.wrapping_mul(K))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_does_not_matter() {
        let whole = hash_str("hello, world, this is a longer string");
        let mut h = StreamHasher::new();
        h.bytes(b"hel");
        h.bytes(b"lo, world, this ");
        h.byte(b'i');
        h.bytes(b"s a longer string");
        assert_eq!(whole, h.finish());
        assert_ne!(hash_str("a"), hash_str("b"));
        assert_ne!(hash_str(""), hash_str("\0"));
    }
}
