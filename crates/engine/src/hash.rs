//! Hashing for the hot path: the functions of `loopguard-hash` under the engine's own path,
//! and the seeds that keep the hashes of different kinds of values apart.
//!
//! - [`hash_bytes`]: a wyhash-style bulk hash of a byte slice. Fingerprints hash each canonical
//!   string with it once.
//! - [`mix`]: combines two 64-bit values into one (order matters); fingerprints build the hash of
//!   a structure from the hashes of its parts.
//! - [`StreamHasher`]: a streaming hasher whose result does not depend on how the input was
//!   split, for text that arrives in chunks (assistant turns).
//! - [`MapHasher`]: the `std::hash::Hasher` of the engine's hash maps.

pub use loopguard_hash::{
    FNV_OFFSET, MapHasher, StreamHasher, combine, fmix, fnv1a_byte, hash_bytes, hash_str, mix,
};

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_separate_kinds_of_values() {
        assert_ne!(hash_bytes(tag::STRING, b"x"), hash_bytes(tag::KEY, b"x"));
    }
}
