//! The near-duplicate sketch of a masked result.

use crate::hash::mix;

/// Results with fewer words than this get no sketch: in a short result one changed word is a
/// large part of it, and the sketch could not tell it from noise.
pub const SKETCH_MIN_WORDS: u32 = 32;

/// At most this many words are sketched (from the start of the masked text), so a sketch costs
/// a bounded amount of work whatever the result's size.
pub(super) const SKETCH_MAX_WORDS: u32 = 4096;

/// Two sketches this close (differing bits of 64) are of near-duplicate texts. A bit differs
/// with probability (1 − J) / 2 for the Jaccard similarity J of the texts' word-pair sets, so
/// texts sharing 90% or more of their word pairs are judged near-duplicates about 9 times in
/// 10, texts sharing 80% about half the time, texts sharing 70% or less rarely (measured on
/// random texts of 40 to 400 words with words replaced).
pub const SKETCH_NEAR_BITS: u32 = 5;

/// How each byte enters a word's hash: letters lowercased, digits as `0`, `_` and non-ASCII
/// bytes as they are; 0 for a byte that is no word byte.
const FOLD: [u8; 256] = {
    let mut t = [0u8; 256];
    let mut c = 0;
    while c < 256 {
        let b = c as u8;
        t[c] = if b.is_ascii_digit() {
            b'0'
        } else if b.is_ascii_alphanumeric() || b == b'_' || b >= 0x80 {
            b.to_ascii_lowercase()
        } else {
            0
        };
        c += 1;
    }
    t
};

/// Whether `text` has `n` words or more, words as [`sketch`] reads them (runs of ASCII
/// letters, digits, `_` and non-ASCII bytes); reads only as far as the `n`th word's start.
pub(super) fn has_words(text: &str, n: u32) -> bool {
    let mut words = 0u32;
    let mut in_word = false;
    for &c in text.as_bytes() {
        let w = FOLD[usize::from(c)] != 0;
        if w && !in_word {
            words += 1;
            if words >= n {
                return true;
            }
        }
        in_word = w;
    }
    n == 0
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0100_0000_01b3;

/// A near-duplicate sketch of a text: 64 one-bit minwise hashes of its word pairs (b-bit
/// minwise hashing, Li and König, from one hash per word pair by one-permutation hashing with
/// densification, Shrivastava and Li), with every run of digits folded into one and case
/// ignored. Each word pair's hash goes to one of 64 bins, which keeps the smallest; a bit is
/// the lowest bit of its bin's minimum (an empty bin borrows its next bin's). Two texts differ
/// in a bit with probability about (1 − J) / 2 for the Jaccard similarity J of their word-pair
/// sets: near-duplicates differ in a few bits, unrelated texts in about 32. `None` below
/// [`SKETCH_MIN_WORDS`] words. Words are ASCII letters, digits, `_` and non-ASCII bytes, each
/// hashed with FNV-1a as it is scanned.
// Out of line: inlined into its caller, the word loop keeps fewer values in registers (~250
// instructions more on a 1 KiB result).
#[inline(never)]
pub fn sketch(text: &str) -> Option<u64> {
    const EMPTY: u64 = u64::MAX;
    let b = text.as_bytes();
    let mut mins = [EMPTY; 64];
    let mut words = 0u32;
    let mut prev = 0u64;
    let mut i = 0;
    let n = b.len();
    while words < SKETCH_MAX_WORDS {
        // The next word's first byte.
        while i < n && FOLD[usize::from(b[i])] == 0 {
            i += 1;
        }
        if i >= n {
            break;
        }
        let mut cur = FNV_OFFSET;
        'word: loop {
            // Eight bytes at a time while eight can be read (no bounds check per byte).
            while let Some(c) = b.get(i..i + 8).and_then(|s| <&[u8; 8]>::try_from(s).ok()) {
                for (t, &x) in c.iter().enumerate() {
                    let v = FOLD[usize::from(x)];
                    // Letters, `_` and non-ASCII bytes all enter the hash above `0`.
                    if v > b'0' {
                        cur = (cur ^ u64::from(v)).wrapping_mul(FNV_PRIME);
                        continue;
                    }
                    i += t;
                    if v == 0 {
                        break 'word;
                    }
                    // A run of digits enters the hash as one `0`.
                    cur = (cur ^ u64::from(b'0')).wrapping_mul(FNV_PRIME);
                    i += 1;
                    while i < n && b[i].is_ascii_digit() {
                        i += 1;
                    }
                    continue 'word;
                }
                i += 8;
            }
            // The last bytes, one at a time.
            while i < n {
                let v = FOLD[usize::from(b[i])];
                i += 1;
                if v > b'0' {
                    cur = (cur ^ u64::from(v)).wrapping_mul(FNV_PRIME);
                    continue;
                }
                if v == 0 {
                    i -= 1;
                    break;
                }
                cur = (cur ^ u64::from(b'0')).wrapping_mul(FNV_PRIME);
                while i < n && b[i].is_ascii_digit() {
                    i += 1;
                }
            }
            break;
        }
        let f = mix(prev, cur);
        let bin = (f >> 58) as usize;
        if let Some(m) = mins.get_mut(bin) {
            *m = (*m).min(f & ((1 << 58) - 1));
        }
        prev = cur;
        words += 1;
    }
    if words < SKETCH_MIN_WORDS {
        return None;
    }
    // Each bin's bit, an empty bin borrowing the next non-empty bin's minimum (at its
    // distance around the ring): one pass backwards, starting from the first non-empty bin
    // one turn on.
    let mut out = 0u64;
    let first = mins.iter().position(|&m| m != EMPTY)?;
    let (mut next, mut at) = (mins[first], first + 64);
    for bit in (0..64).rev() {
        if let Some(&m) = mins.get(bit)
            && m != EMPTY
        {
            (next, at) = (m, bit);
        }
        let distance = (at - bit) as u64;
        out |= (mix(next, distance) & 1) << bit;
    }
    Some(out)
}
