//! Argument keys found by hash: the sets of primary, volatile and command keys of a tool.

use super::*;

/// Hash of an argument key, as used by [`KeySet`] and the member hashes.
#[inline]
pub(super) fn key_hash(k: &str) -> u64 {
    hash_bytes(tag::KEY, k.as_bytes())
}

/// A small set of argument keys, found by hash in a small open-addressing table (at most a
/// quarter full, so most probes end at once), each hit confirmed against the key's bytes kept
/// beside its hash.
#[derive(Clone, Debug, Default)]
pub struct KeySet {
    /// The keys, in the order they were first given.
    keys: Vec<Box<str>>,
    entries: Vec<Entry>,
    /// 1 + an index into `keys` and `entries`, 0 for an empty slot; a power-of-two length.
    slots: Box<[u16]>,
}

/// A key's hash, and its bytes when it is short (most are), in one place.
#[derive(Clone, Copy, Debug)]
pub(super) struct Entry {
    hash: u64,
    /// Length of a key of at most 16 bytes; `u8::MAX` for a longer one.
    len: u8,
    bytes: [u8; 16],
}

impl KeySet {
    pub fn new<'s>(keys: impl IntoIterator<Item = &'s str>) -> KeySet {
        let mut list: Vec<Box<str>> = Vec::new();
        for k in keys {
            if list.len() < usize::from(u16::MAX / 4) && !list.iter().any(|x| &**x == k) {
                list.push(k.into());
            }
        }
        let entries: Vec<Entry> = list
            .iter()
            .map(|k| {
                let mut bytes = [0u8; 16];
                let len = match bytes.get_mut(..k.len()) {
                    Some(b) => {
                        b.copy_from_slice(k.as_bytes());
                        k.len() as u8
                    }
                    None => u8::MAX,
                };
                Entry {
                    hash: key_hash(k),
                    len,
                    bytes,
                }
            })
            .collect();
        let size = (4 * list.len()).next_power_of_two().max(8);
        let mut slots = vec![0u16; size].into_boxed_slice();
        for (i, e) in entries.iter().enumerate() {
            let mut j = slot_of(e.hash, size);
            while slots[j] != 0 {
                j = (j + 1) & (size - 1);
            }
            slots[j] = i as u16 + 1;
        }
        KeySet {
            keys: list,
            entries,
            slots,
        }
    }

    /// The position of a key among the set's keys.
    pub fn position(&self, k: &str) -> Option<usize> {
        if self.keys.is_empty() {
            return None;
        }
        self.position_hashed(key_hash(k), k)
    }

    pub fn contains(&self, k: &str) -> bool {
        !self.keys.is_empty() && self.position_hashed(key_hash(k), k).is_some()
    }

    /// The position of a key given as bytes (a word of a command) among the set's keys.
    pub(super) fn position_of_bytes(&self, k: &[u8]) -> Option<usize> {
        if self.keys.is_empty() {
            return None;
        }
        self.position_hashed_bytes(hash_bytes(tag::KEY, k), k)
    }

    /// The position of a key (hashed with `key_hash`) among the set's keys.
    #[inline(always)]
    pub(super) fn position_hashed(&self, h: u64, k: &str) -> Option<usize> {
        self.position_hashed_bytes(h, k.as_bytes())
    }

    /// [`KeySet::position_hashed`] of a key given as bytes.
    #[inline(always)]
    pub(super) fn position_hashed_bytes(&self, h: u64, k: &[u8]) -> Option<usize> {
        let size = self.slots.len();
        let mut j = slot_of(h, size);
        // The table is at most a quarter full: an empty slot ends every probe sequence.
        for _ in 0..size {
            let i = usize::from(*self.slots.get(j)?).checked_sub(1)?;
            if let Some(e) = self.entries.get(i)
                && e.hash == h
                && match e.bytes.get(..usize::from(e.len)) {
                    Some(short) => same_key(short, k),
                    None => self.keys.get(i).is_some_and(|x| x.as_bytes() == k),
                }
            {
                return Some(i);
            }
            j = (j + 1) & (size - 1);
        }
        None
    }

    pub fn iter(&self) -> impl Iterator<Item = &str> {
        self.keys.iter().map(|s| &**s)
    }
}

/// The first table slot of a key hash.
#[inline]
pub(super) fn slot_of(h: u64, size: usize) -> usize {
    (h >> 32) as usize & (size - 1)
}

/// `a == b` for argument keys, which are short: compared in one or two overlapping word loads
/// rather than through a `memcmp` call.
#[inline]
pub(super) fn same_key(a: &[u8], b: &[u8]) -> bool {
    let n = a.len();
    if n != b.len() {
        return false;
    }
    let word = |s: &[u8], i: usize| {
        s.get(i..)
            .and_then(<[u8]>::first_chunk::<8>)
            .map(|c| u64::from_le_bytes(*c))
    };
    let half = |s: &[u8], i: usize| {
        s.get(i..)
            .and_then(<[u8]>::first_chunk::<4>)
            .map(|c| u32::from_le_bytes(*c))
    };
    match n {
        0..4 => a == b,
        4..8 => half(a, 0) == half(b, 0) && half(a, n - 4) == half(b, n - 4),
        8..=16 => word(a, 0) == word(b, 0) && word(a, n - 8) == word(b, n - 8),
        _ => a == b,
    }
}
