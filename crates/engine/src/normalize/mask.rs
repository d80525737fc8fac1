//! The built-in maskers, in one pass over the bytes.
//!
//! Every mask holds a cue (a digit, an `ESC`, a `/`, or the eighth of eight hex letters in a
//! row), and starts at most a few words before it ([`lead_in`]): past a word no masker
//! matched, the loop looks for the next cue eight bytes at a time and, when it is far, jumps
//! to where a mask holding it could start, passing over prose and code without reading their
//! words.
//!
//! Maskers start only at the first byte of a word (a run of ASCII letters, digits and `_`) or
//! at one of four other bytes (`ESC`, `(`, `#`, `/`). A byte-class table says what each byte
//! may start, so most bytes cost one lookup. A word is scanned once; what the scan learns (its
//! length, its leading digits, whether it holds digits, letters, bytes that are no hex digit)
//! and the byte after its leading digits rule out most maskers before any is tried, and a word
//! that no masker matched is passed over whole. `reference.rs` (tests) holds the plain form of
//! every masker, tried at every byte; property tests check that both mask every text alike.

use super::Maskers;
use super::out::{Out, Rep, pad};

/// A replacement, padded for [`Out::copy_rep`].
macro_rules! rep {
    ($s:literal) => {{
        const R: Rep = (&pad($s), $s.len());
        R
    }};
}

const DIGIT: u8 = 1;
/// `a`–`f`, `A`–`F`.
const HEX_LETTER: u8 = 1 << 1;
/// The other ASCII letters.
const LETTER: u8 = 1 << 2;
const UNDERSCORE: u8 = 1 << 3;
/// A byte other than a word's that a masker starts with: `ESC`, `(`, `#`, `/`.
const START: u8 = 1 << 4;
const ALPHA: u8 = HEX_LETTER | LETTER;
const ALNUM: u8 = DIGIT | ALPHA;
const WORD: u8 = ALNUM | UNDERSCORE;
/// Word bytes that are no hex digit.
const NOT_HEX: u8 = LETTER | UNDERSCORE;

/// The class of every byte; 0 for bytes that start nothing (non-ASCII included).
const CLASS: [u8; 256] = {
    let mut t = [0u8; 256];
    let mut c = 0;
    while c < 256 {
        let b = c as u8;
        t[c] = if b.is_ascii_digit() {
            DIGIT
        } else if b.is_ascii_hexdigit() {
            HEX_LETTER
        } else if b.is_ascii_alphabetic() {
            LETTER
        } else if b == b'_' {
            UNDERSCORE
        } else if matches!(b, 0x1b | b'(' | b'#' | b'/') {
            START
        } else {
            0
        };
        c += 1;
    }
    t
};

#[inline(always)]
fn class(c: u8) -> u8 {
    CLASS[usize::from(c)]
}

#[inline(always)]
fn is_word(c: u8) -> bool {
    class(c) & WORD != 0
}

/// Masks `s` with the enabled maskers into `out`, in one pass.
pub(super) fn mask_into(m: &Maskers, s: &str, out: &mut Out<'_>) {
    let b = s.as_bytes();
    let mut copied = 0;
    // The next cue at or after `i` ([`next_cue`]): no mask starts between `i` and its
    // [`lead_in`], which the loop jumps to. After a near cue, the end of the bytes read one by
    // one before the next look.
    let mut cue = next_cue(b, 0);
    let mut i = lead_in(b, 0, cue);
    let mut ahead = AHEAD;
    // No id starts before this ([`id_len`]).
    let mut no_id_before = 0;
    while i < b.len() {
        let k = class(b[i]);
        if k == 0 {
            i += 1;
            continue;
        }
        let hit = if k & WORD != 0 {
            let w = word(b, i);
            // Maskers start at a word's first byte (a word is never entered in the middle:
            // the rest of a word a mask ended in is passed over below).
            match if k & ALNUM != 0 {
                word_at(m, b, i, w, &mut no_id_before)
            } else {
                None
            } {
                Some(hit) => hit,
                None => {
                    i = w.end;
                    // Past a word no masker matched, the loop looks for the next cue (once it
                    // is past the last one) and jumps to it when it is far.
                    if i > cue {
                        cue = next_cue(b, i);
                        if cue - i < NEAR {
                            // Cues close together (a log's times, ids and counts): the next
                            // `ahead` bytes are read one by one, without looking for cues,
                            // and twice as many after the next near cue.
                            cue = i + ahead;
                            ahead = (ahead * 2).min(MAX_AHEAD);
                        } else {
                            i = lead_in(b, i, cue);
                            ahead = AHEAD;
                        }
                    }
                    continue;
                }
            }
        } else {
            match other_at(m, b, i) {
                Some(hit) => hit,
                None => {
                    i += 1;
                    continue;
                }
            }
        };
        let (len, rep) = hit;
        out.copy_rep(b, copied, i, rep);
        i += len.max(1);
        // A mask ends on a character boundary (the bytes after it are whole characters).
        while b.get(i).is_some_and(|&c| (c as i8) < -0x40) {
            i += 1;
        }
        copied = i;
        // No masker starts inside a word: the rest of one the mask ended in is passed over.
        if i > 0 && i < b.len() && is_word(b[i - 1]) {
            i = word_end(b, i);
        }
    }
    out.copy(b, copied.min(b.len()), b.len());
}

/// A cue closer than this to where the loop is is no reason to jump ([`mask_into`]).
const NEAR: usize = 8;
/// How far the loop reads on without looking for cues after one was near ([`mask_into`]),
/// at first and at most.
const AHEAD: usize = 32;
const MAX_AHEAD: usize = 1024;

/// Each byte's lowest bit, in a word of eight bytes.
#[cfg_attr(all(target_arch = "x86_64", target_feature = "sse2"), cfg(test))]
const LANES: u64 = 0x0101_0101_0101_0101;
/// Each byte's highest bit.
#[cfg_attr(all(target_arch = "x86_64", target_feature = "sse2"), cfg(test))]
const HIGH: u64 = 0x80 * LANES;

/// The highest bit of each byte of `x` in `lo..=hi` (ASCII bounds), and no other bit. The low
/// seven bits of every byte are compared at once, in sums that never carry into the next byte.
#[cfg_attr(all(target_arch = "x86_64", target_feature = "sse2"), cfg(test))]
#[inline(always)]
fn bytes_in(x: u64, lo: u8, hi: u8) -> u64 {
    let low = x & !HIGH;
    let from_lo = low + LANES * u64::from(0x80 - lo);
    let past_hi = low + LANES * u64::from(0x7f - hi);
    from_lo & !past_hi & !x & HIGH
}

/// The first cue at or after `from` (`b.len()` when there is none): a digit, an `ESC`, a `/`,
/// or the eighth of eight hex letters in a row. Every mask holds a cue (a number, a uuid or
/// hex word, an escape code, a temp path), so none starts before the [`lead_in`] of the first:
/// prose and code are passed over sixteen bytes at a time (eight without SSE2).
// Out of line: the masker's loop keeps more in registers without it.
#[inline(never)]
fn next_cue(b: &[u8], from: usize) -> usize {
    #[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
    {
        next_cue_sse2(b, from)
    }
    #[cfg(not(all(target_arch = "x86_64", target_feature = "sse2")))]
    {
        next_cue_swar(b, from)
    }
}

/// [`next_cue`], sixteen bytes at a time, each compared at once in SSE2 registers (through
/// `safe_arch`'s safe wrappers): the cues and the hex letters as two 16-bit masks.
#[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
fn next_cue_sse2(b: &[u8], from: usize) -> usize {
    use safe_arch::{
        bitor_m128i, cmp_eq_mask_i8_m128i, load_unaligned_m128i, m128i, min_u8_m128i,
        move_mask_i8_m128i, set_splat_i8_m128i, sub_i8_m128i,
    };
    // The bytes of `v` in `lo..=lo + span`: `x - lo <= span` as unsigned bytes.
    #[inline(always)]
    fn within(v: m128i, lo: u8, span: u8) -> m128i {
        let d = sub_i8_m128i(v, set_splat_i8_m128i(lo as i8));
        cmp_eq_mask_i8_m128i(min_u8_m128i(d, set_splat_i8_m128i(span as i8)), d)
    }
    let mut j = from;
    // The hex letters of the 16 bytes before `j` (none before `from`).
    let mut prev = 0u32;
    while j < b.len() {
        // Read in place (a copy first would cost a stall on every call).
        let v = match b.get(j..j + 16).and_then(|s| <&[u8; 16]>::try_from(s).ok()) {
            Some(c) => load_unaligned_m128i(c),
            None => {
                // The last bytes, padded with zeros (no cue, no hex letter).
                let mut c = [0u8; 16];
                c[..b.len() - j].copy_from_slice(&b[j..]);
                load_unaligned_m128i(&c)
            }
        };
        // `/` and the digits are neighbours in ASCII: one range.
        let cue = bitor_m128i(
            within(v, b'/', b'9' - b'/'),
            cmp_eq_mask_i8_m128i(v, set_splat_i8_m128i(0x1b)),
        );
        let hex = within(bitor_m128i(v, set_splat_i8_m128i(0x20)), b'a', b'f' - b'a');
        let cue = move_mask_i8_m128i(cue) as u32 & 0xffff;
        let hex = move_mask_i8_m128i(hex) as u32 & 0xffff;
        // Bit `k` of `run`: bytes `k..k + 8` of the 32 (the 16 before, then these) are all
        // hex letters; the eighth of them, byte `k + 7`, is in these 16 for `k` from 9 on.
        let w = prev | (hex << 16);
        let mut run = w & (w >> 1);
        run &= run >> 2;
        run &= run >> 4;
        let hits = cue | ((run >> 9) & 0xffff);
        if hits != 0 {
            return (j + hits.trailing_zeros() as usize).min(b.len());
        }
        prev = hex;
        j += 16;
    }
    b.len()
}

/// [`next_cue`], eight bytes at a time in a `u64` (where SSE2 is not there, and for the
/// tests).
#[cfg_attr(all(target_arch = "x86_64", target_feature = "sse2"), cfg(test))]
fn next_cue_swar(b: &[u8], from: usize) -> usize {
    let mut j = from;
    // Hex letters in a row just before `j`.
    let mut run = 0u32;
    while j < b.len() {
        let x = match b.get(j..j + 8).and_then(|s| <[u8; 8]>::try_from(s).ok()) {
            Some(c) => u64::from_le_bytes(c),
            None => {
                // The last bytes, padded with zeros (no cue, no hex letter).
                let mut c = [0u8; 8];
                c[..b.len() - j].copy_from_slice(&b[j..]);
                u64::from_le_bytes(c)
            }
        };
        // `/` and the digits are neighbours in ASCII: one range.
        let hits = bytes_in(x, b'/', b'9') | bytes_in(x, 0x1b, 0x1b);
        let other = !bytes_in(x | (0x20 * LANES), b'a', b'f') & HIGH;
        let mut first = hits.trailing_zeros() / 8;
        if run + other.trailing_zeros() / 8 >= 8 {
            first = first.min(7 - run);
        }
        if first < 8 {
            return j + first as usize;
        }
        // A run of eight within these bytes would have been found: `other` is not empty.
        run = other.leading_zeros() / 8;
        j += 8;
    }
    b.len()
}

/// Both ways of finding the next cue, for the tests.
#[cfg(test)]
pub(super) fn next_cue_both(b: &[u8], from: usize) -> (usize, usize) {
    (next_cue(b, from), next_cue_swar(b, from))
}

/// Where a mask holding the cue at `cue` starts at the earliest, not before `from` (a
/// position the masker's loop reaches: the text's start, a word's or a byte of no word): the
/// cue itself for an `ESC` or a `/`; for a digit or a hex letter, the start of the run of word
/// bytes and `-` it is in (`req-7f3a9c`, a uuid, `crate_305`), or the `(` before that run
/// (`(3/10)`), or the separators before it (`#7`) and the pid name or counter word before
/// them (`pid 7`, `retry #3`).
#[inline(never)]
fn lead_in(b: &[u8], from: usize, cue: usize) -> usize {
    let Some(&c) = b.get(cue) else {
        return b.len();
    };
    if matches!(c, 0x1b | b'/') {
        return cue;
    }
    let mut r = cue;
    while r > from && (is_word(b[r - 1]) || b[r - 1] == b'-') {
        r -= 1;
    }
    if r == from {
        return r;
    }
    match b[r - 1] {
        b'(' => r - 1,
        c if is_separator(c) => {
            let mut s = r - 1;
            while s > from && is_separator(b[s - 1]) {
                s -= 1;
            }
            let mut w = s;
            while w > from && is_word(b[w - 1]) {
                w -= 1;
            }
            // The pid names and the counter words, by their lengths and first letters.
            let name = &b[w..s];
            let counted = matches!(name.len(), 3 | 4 | 5 | 7 | 8 | 9)
                && matches!(name[0] | 0x20, b'p' | b't' | b'a' | b'r' | b'i' | b'b');
            if counted { w } else { s }
        }
        _ => r,
    }
}

/// The word starting at `i`: where it ends, the union of its bytes' classes
/// ([`DIGIT`], [`HEX_LETTER`], [`LETTER`], [`UNDERSCORE`]), and how many digits it starts with.
#[derive(Clone, Copy, Debug)]
struct Word {
    end: usize,
    acc: u8,
    lead_digits: usize,
}

/// Scans the word starting at `i`.
#[inline(always)]
fn word(b: &[u8], i: usize) -> Word {
    let mut j = i;
    let mut acc = 0;
    // Eight bytes at a time while eight can be read (no bounds check per byte), then a byte at
    // a time.
    'scan: {
        while let Some(c) = b.get(j..j + 8).and_then(|s| <&[u8; 8]>::try_from(s).ok()) {
            for (t, &x) in c.iter().enumerate() {
                let k = class(x);
                if k & WORD == 0 {
                    j += t;
                    break 'scan;
                }
                acc |= k;
            }
            j += 8;
        }
        while j < b.len() {
            let k = class(b[j]);
            if k & WORD == 0 {
                break;
            }
            acc |= k;
            j += 1;
        }
    }
    let lead_digits = if acc == DIGIT {
        j - i
    } else if acc & DIGIT == 0 {
        0
    } else {
        digits(b, i)
    };
    Word {
        end: j,
        acc,
        lead_digits,
    }
}

/// The end of the word (if any) at `i`.
#[inline(always)]
fn word_end(b: &[u8], i: usize) -> usize {
    let mut j = i;
    while j < b.len() && is_word(b[j]) {
        j += 1;
    }
    j
}

/// The masker matching at `i`, the first byte (an ASCII letter or digit) of the word `w`: its
/// length and replacement. Maskers are tried in a fixed order; each is tried only if the word
/// could start it.
/// `no_id_before` is where the last token [`id_len`] found no id in ends: no id starts before
/// it (the token from a later word start is the rest of that token, with fewer of everything),
/// so each byte is read for ids once.
#[inline]
fn word_at(
    m: &Maskers,
    b: &[u8],
    i: usize,
    w: Word,
    no_id_before: &mut usize,
) -> Option<(usize, Rep)> {
    let Word { end, acc, .. } = w;
    let c = b[i];
    let len = end - i;
    let next = b.get(end).copied();
    let hex_word = acc & NOT_HEX == 0;
    // A uuid's first group is a whole word: 8 hex digits, then `-`.
    let uuid = |m: &Maskers| m.uuids && len == 8 && hex_word && next == Some(b'-') && uuid_at(b, i);
    if class(c) & DIGIT != 0 {
        let n = w.lead_digits;
        let after = b.get(i + n).copied();
        if m.timestamps
            && matches!(after, Some(b'-' | b'/' | b':'))
            && let Some(len) = timestamp_len(b, i, n)
        {
            return Some((len, rep!("<ts>")));
        }
        if uuid(m) {
            return Some((36, rep!("<uuid>")));
        }
        if m.counters
            && after == Some(b' ')
            // `t` or `T` first (`| 0x20` makes `t` of no other byte).
            && b.get(i + n + 1).is_some_and(|&t| t | 0x20 == b't')
            && starts_ci(b, i + n, " times")
            && end_ok(b, i + n + 6)
        {
            return Some((n + 6, rep!("<n> times")));
        }
        if m.durations
            && after.is_some_and(|u| u == b'.' || u == b' ' || u == 0xc2 || class(u) & ALPHA != 0)
        {
            if let Some(len) = duration_len(b, i, n) {
                return Some((len, rep!("<dur>")));
            }
            if let Some(len) = rate_len(b, i, n) {
                return Some((len, rep!("<rate>")));
            }
        }
        if i >= 2
            && let Some(hit) = tagged_number(m, b, i, n)
        {
            return Some(hit);
        }
        if m.ids
            && i > 0
            && matches!(b[i - 1], b' ' | b'"' | b'\'' | b':' | b'=')
            && volatile_key_before(b, i)
        {
            let mut j = i + n;
            j += fraction(b, j);
            if end_ok(b, j) {
                return Some((j - i, rep!("<n>")));
            }
        }
        if m.hex_ids {
            if c == b'0' && matches!(b.get(i + 1), Some(b'x' | b'X')) {
                let h = hexes(b, i + 2);
                if h >= 8 && end_ok(b, i + 2 + h) {
                    return Some((2 + h, rep!("<hex>")));
                }
            } else if hex_word && len >= 8 {
                return Some((len, rep!("<hex>")));
            }
        }
    } else if acc & DIGIT != 0 || next == Some(b'-') {
        // A word starting with a letter that holds a digit or is followed by `-`: a uuid, a
        // hex word or an id (a name `pid 7` or `attempt 2` starts with has neither).
        if uuid(m) {
            return Some((36, rep!("<uuid>")));
        }
        if m.hex_ids && hex_word && len >= 8 {
            return Some((len, rep!("<hex>")));
        }
    } else {
        // A word of letters (and `_`) followed by no `-`: a hex word, or a name a number
        // follows (`pid 7`, `attempt 2`); no uuid, no id. Most words of prose and code are
        // passed over here.
        if m.hex_ids && hex_word && len >= 8 {
            return Some((len, rep!("<hex>")));
        }
        if !number_follows(b, end) {
            return None;
        }
        // `pid`, `pgid`, `ppid`, `tid`: a whole word, then a separator.
        if m.pids
            && matches!(len, 3 | 4)
            && matches!(c, b'p' | b'P' | b't' | b'T')
            && let Some(len) = pid_len(b, i, end)
        {
            return Some((len, rep!("pid <n>")));
        }
        // The counter words: whole words of these lengths starting with these letters.
        if m.counters
            && matches!(len, 3 | 5 | 7 | 8 | 9)
            && matches!(c | 0x20, b'a' | b'r' | b't' | b'i' | b'b')
        {
            return counter_at(b, i, end);
        }
        return None;
    }
    // An id has 2 digits and 2 letters, in this word or in words joined to it by `-`.
    if m.ids
        && i >= *no_id_before
        && (next == Some(b'-') || (len >= 6 && acc & DIGIT != 0 && acc & ALPHA != 0))
    {
        match id_len(b, i) {
            Ok(len) => return Some((len, rep!("<id>"))),
            Err(end) => *no_id_before = end,
        }
    }
    None
}

/// The `[` at `open` follows a notebook's `In` or `Out` (`In [7]:`, `Cell In[7], line 3`): the
/// number in the brackets counts the cells run.
// Out of line: rare, and the masker's loop keeps more in registers without it.
#[inline(never)]
fn execution_count_at(b: &[u8], open: usize) -> bool {
    let head = &b[..open];
    let head = head.strip_suffix(b" ").unwrap_or(head);
    [&b"In"[..], b"Out"].iter().any(|w| {
        head.ends_with(w)
            && head
                .len()
                .checked_sub(w.len() + 1)
                .is_none_or(|k| !is_word(head[k]))
    })
}

/// A number that its neighbours say is a counter, a pid or a port, `n` digits at `i` (`i >= 2`):
/// a notebook's execution count (`In [7]:`), a program's pid in a log line's tag
/// (`app[2211]:`), an ephemeral port after a host (`127.0.0.1:54321`, `localhost:61234`).
#[inline]
fn tagged_number(m: &Maskers, b: &[u8], i: usize, n: usize) -> Option<(usize, Rep)> {
    match b[i - 1] {
        b'[' if m.counters && b.get(i + n) == Some(&b']') && execution_count_at(b, i - 1) => {
            Some((n, rep!("<n>")))
        }
        b'[' if m.pids
            && is_word(b[i - 2])
            && b.get(i + n) == Some(&b']')
            && b.get(i + n + 1) == Some(&b':') =>
        {
            Some((n, rep!("<pid>")))
        }
        b':' if m.ids
            && n == 5
            && end_ok(b, i + n)
            && local_host_before(b, i - 1)
            && b.get(i..i + n)
                .is_some_and(|d| (&b"32768"[..]..=&b"65535"[..]).contains(&d)) =>
        {
            Some((n, rep!("<port>")))
        }
        _ => None,
    }
}

/// A host ends at `colon`: an IPv4 address (`127.0.0.1`), an IPv6 one in brackets (`[::1]`)
/// or `localhost`, where test servers listen on ports of their own choice. Not a file name
/// (`main.c:40213`: a line number).
// Out of line: rare, and the masker's loop keeps more in registers without it.
#[inline(never)]
fn local_host_before(b: &[u8], colon: usize) -> bool {
    let head = &b[..colon];
    if head.ends_with(b"]")
        || head
            .len()
            .checked_sub(9)
            .is_some_and(|at| head[at..].eq_ignore_ascii_case(b"localhost"))
    {
        return true;
    }
    let dotted = head
        .iter()
        .rev()
        .take_while(|c| c.is_ascii_digit() || **c == b'.')
        .count();
    let (before, ip) = head.split_at(colon - dotted);
    ip.first().is_some_and(u8::is_ascii_digit)
        && ip.iter().filter(|&&c| c == b'.').count() == 3
        && before.last().is_none_or(|&c| !is_word(c))
}

/// The maskers starting with a byte other than a word's (`ESC`, `(`, `#`, `/`).
#[inline]
fn other_at(m: &Maskers, b: &[u8], i: usize) -> Option<(usize, Rep)> {
    match b[i] {
        0x1b if m.ansi => Some((ansi_len(b, i), rep!(""))),
        b'(' if m.counters => {
            // (3/10)
            let n1 = digits(b, i + 1);
            let n2 = if n1 > 0 && b.get(i + 1 + n1) == Some(&b'/') {
                digits(b, i + 2 + n1)
            } else {
                0
            };
            (n2 > 0 && b.get(i + 2 + n1 + n2) == Some(&b')'))
                .then_some((3 + n1 + n2, rep!("(<n>/<n>)")))
        }
        b'#' if m.counters && (i == 0 || !is_word(b[i - 1])) => {
            // #7
            let n = digits(b, i + 1);
            (n > 0 && end_ok(b, i + 1 + n)).then_some((1 + n, rep!("#<n>")))
        }
        // `/tmp/`, `/var/tmp/`, `/private/tmp/` (most `/` are followed by none of their
        // second bytes: a path's other parts, `//` comments).
        b'/' if m.temp_paths && matches!(b.get(i + 1), Some(b't' | b'v' | b'p')) => {
            temp_len(b, i).map(|n| (n, rep!("/tmp/<tmp>")))
        }
        _ => None,
    }
}

/// Nothing of a word follows at `j`.
#[inline(always)]
fn end_ok(b: &[u8], j: usize) -> bool {
    b.get(j).is_none_or(|&c| !is_word(c))
}

#[inline]
fn digits(b: &[u8], i: usize) -> usize {
    let mut j = i;
    while j < b.len() && b[j].is_ascii_digit() {
        j += 1;
    }
    j.max(i) - i
}

/// The length of `.digits` at `j` (0 if there is none).
#[inline(always)]
fn fraction(b: &[u8], j: usize) -> usize {
    if b.get(j) != Some(&b'.') {
        return 0;
    }
    match digits(b, j + 1) {
        0 => 0,
        n => n + 1,
    }
}

#[inline(always)]
fn digit_at(b: &[u8], j: usize) -> bool {
    b.get(j).is_some_and(u8::is_ascii_digit)
}

/// Exactly two digits at `j`.
#[inline(always)]
fn two_digits(b: &[u8], j: usize) -> bool {
    digit_at(b, j) && digit_at(b, j + 1) && !digit_at(b, j + 2)
}

#[inline]
fn hexes(b: &[u8], i: usize) -> usize {
    b.get(i..).map_or(0, |t| {
        t.iter().take_while(|c| c.is_ascii_hexdigit()).count()
    })
}

#[inline]
fn starts_ci(b: &[u8], i: usize, word: &str) -> bool {
    b.get(i..i + word.len())
        .is_some_and(|t| t.eq_ignore_ascii_case(word.as_bytes()))
}

// Out of line: rare, and the masker's loop keeps more in registers without it.
#[inline(never)]
fn ansi_len(b: &[u8], i: usize) -> usize {
    match b.get(i + 1) {
        Some(b'[') => {
            let mut j = i + 2;
            while j < b.len() && !(0x40..=0x7e).contains(&b[j]) {
                j += 1;
            }
            (j + 1).min(b.len()) - i
        }
        Some(b']') => {
            let mut j = i + 2;
            while j < b.len() && b[j] != 0x07 && !(b[j] == 0x1b && b.get(j + 1) == Some(&b'\\')) {
                j += 1;
            }
            if j < b.len() && b[j] == 0x1b {
                j += 1;
            }
            (j + 1).min(b.len()) - i
        }
        Some(c) if c.is_ascii() => 2,
        _ => 1,
    }
}

// Out of line: rare, and the masker's loop keeps more in registers without it.
#[inline(never)]
fn temp_len(b: &[u8], i: usize) -> Option<usize> {
    let rest = &b[i..];
    let prefix = ["/tmp/", "/var/tmp/", "/private/tmp/"]
        .into_iter()
        .find(|p| rest.starts_with(p.as_bytes()))?;
    if i > 0 && (is_word(b[i - 1]) || b[i - 1] == b'/' || b[i - 1] == b'.') {
        return None;
    }
    let n = rest[prefix.len()..]
        .iter()
        .take_while(|&&c| c != b'/' && !c.is_ascii_whitespace() && !b"'\"`:),]".contains(&c))
        .count();
    (n > 0).then_some(prefix.len() + n)
}

/// A byte between a pid name or counter word and its number: ` `, `:`, `=`, `#`.
#[inline(always)]
fn is_separator(c: u8) -> bool {
    matches!(c, b' ' | b':' | b'=' | b'#')
}

/// A number follows the word ending at `end` after one or more separators
/// ([`is_separator`]): what `pid 7` and `attempt 2` need, tested before their names are
/// compared (most words of prose and code are followed by a letter or nothing of the kind).
#[inline(always)]
fn number_follows(b: &[u8], end: usize) -> bool {
    let separator = |j: usize| b.get(j).is_some_and(|&c| is_separator(c));
    if !separator(end) {
        return false;
    }
    let mut j = end + 1;
    while separator(j) {
        j += 1;
    }
    digit_at(b, j)
}

/// `pid 7`, `PGID: 48213`, `tid=3` at `i`: the word `b[i..end]`, separators, a number.
fn pid_len(b: &[u8], i: usize, end: usize) -> Option<usize> {
    let word = &b[i..end];
    if !["pid", "pgid", "ppid", "tid"]
        .iter()
        .any(|w| word.eq_ignore_ascii_case(w.as_bytes()))
    {
        return None;
    }
    number_after(b, i, end)
}

/// The end of `separators number` after the word `b[i..end]` (at least one separator, then
/// digits ending a word), as a length from `i`.
#[inline]
fn number_after(b: &[u8], i: usize, end: usize) -> Option<usize> {
    let mut j = end;
    while j < b.len() && is_separator(b[j]) {
        j += 1;
    }
    let n = digits(b, j);
    (n > 0 && j > end && end_ok(b, j + n)).then_some(j + n - i)
}

/// `attempt 2`, `retry #3`, `run: 9` at `i`: a counter word `b[i..end]`, separators, a number.
// Out of line: rare, and the masker's loop keeps more in registers without it.
#[inline(never)]
fn counter_at(b: &[u8], i: usize, end: usize) -> Option<(usize, Rep)> {
    let word = &b[i..end];
    let rep = [
        ("attempt", rep!("attempt <n>")),
        ("retry", rep!("retry <n>")),
        ("try", rep!("try <n>")),
        ("iteration", rep!("iteration <n>")),
        ("round", rep!("round <n>")),
        ("revision", rep!("revision <n>")),
        ("build", rep!("build <n>")),
        ("run", rep!("run <n>")),
    ]
    .into_iter()
    .find(|(w, _)| word.eq_ignore_ascii_case(w.as_bytes()))?
    .1;
    number_after(b, i, end).map(|len| (len, rep))
}

/// Whether a key name (or its last `_` part) is one whose numeric values are ids, times and
/// timings, in any case: compared lowercased, by length and bytes at once.
#[inline]
fn volatile_key(k: &[u8]) -> bool {
    let mut lower = [0u8; 9];
    let Some(l) = lower.get_mut(..k.len()) else {
        return false;
    };
    for (l, c) in l.iter_mut().zip(k) {
        *l = c.to_ascii_lowercase();
    }
    matches!(
        &*l,
        b"id"
            | b"ms"
            | b"ns"
            | b"us"
            | b"took"
            | b"elapsed"
            | b"duration"
            | b"latency"
            | b"time"
            | b"timestamp"
            | b"ts"
            | b"at"
            | b"seq"
            | b"nonce"
            | b"pid"
            | b"epoch"
            | b"seconds"
            | b"secs"
            | b"sec"
            | b"millis"
            | b"seed"
    )
}

/// The number at `i` is the value of a key such as `"took_ms": 132`, `request_id=88`,
/// `"messageId": 7`. Out of line: most numbers are no such value, and the masker's loop keeps
/// more in registers without it.
#[inline(never)]
fn volatile_key_before(b: &[u8], i: usize) -> bool {
    let mut j = i;
    let skip = |j: &mut usize, set: &[u8]| {
        while *j > 0 && set.contains(&b[*j - 1]) {
            *j -= 1;
        }
    };
    skip(&mut j, b" \"'");
    if j == 0 || !matches!(b[j - 1], b':' | b'=') {
        return false;
    }
    j -= 1;
    skip(&mut j, b" \"'");
    let end = j;
    while j > 0 && (b[j - 1].is_ascii_alphanumeric() || b[j - 1] == b'_' || b[j - 1] == b'-') {
        j -= 1;
    }
    let key = &b[j..end];
    if key.is_empty() {
        return false;
    }
    // The last part: after `_` or `-`, or a camelCase tail (`messageId`, `tookMs`).
    let cut = key
        .iter()
        .rposition(|&c| c == b'_' || c == b'-')
        .map(|p| p + 1)
        .or_else(|| key.iter().rposition(u8::is_ascii_uppercase))
        .unwrap_or(0);
    let last = &key[cut..];
    volatile_key(last) || volatile_key(key)
}

#[cfg(test)]
thread_local! {
    /// Bytes [`id_len`] read on this thread (tests).
    pub(super) static ID_BYTES_READ: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// An opaque id at `i`: a token of letters, digits, `_` and `-` of 6 or more bytes with at
/// least 2 digits and 2 letters (`msg_01H8XK2`, `om_x100b8f3`, `req-7f3a9c`), not a plain word
/// or number. `Err` holds where the token ends when it is none.
fn id_len(b: &[u8], i: usize) -> Result<usize, usize> {
    // One pass: the token's length, its digits and letters, and whether a letter precedes a
    // digit (a number with a unit, `1200px`, is not an id).
    let (mut n, mut digits, mut letters, mut mixed) = (0usize, 0u32, 0u32, false);
    let mut trailing_dashes = 0usize;
    for &c in &b[i..] {
        let k = class(c);
        if k & DIGIT != 0 {
            digits += 1;
            mixed |= letters > 0;
            trailing_dashes = 0;
        } else if k & ALPHA != 0 {
            letters += 1;
            trailing_dashes = 0;
        } else if k & UNDERSCORE != 0 {
            trailing_dashes = 0;
        } else if c == b'-' {
            trailing_dashes += 1;
        } else {
            break;
        }
        n += 1;
    }
    let end = i + n;
    #[cfg(test)]
    ID_BYTES_READ.with(|r| r.set(r.get() + n));
    // A trailing `-` belongs to the text around it.
    let n = n - trailing_dashes;
    if n >= 6 && digits >= 2 && letters >= 2 && mixed {
        Ok(n)
    } else {
        Err(end)
    }
}

fn timestamp_len(b: &[u8], i: usize, n: usize) -> Option<usize> {
    // 2024-01-02[T ]12:34:56[.123][Z|+01:00]
    if n == 4 && date_at(b, i + 4) {
        let mut j = i + 10;
        // `T12:` or ` 12:` (each read at once when four bytes are there).
        let time = match b.get(j..j + 4) {
            Some(&[t, h1, h2, c]) => {
                matches!(t, b'T' | b' ') && h1.is_ascii_digit() && h2.is_ascii_digit() && c == b':'
            }
            _ => {
                matches!(b.get(j), Some(b'T' | b' '))
                    && two_digits(b, j + 1)
                    && b.get(j + 3) == Some(&b':')
            }
        };
        if time {
            j = time_end(b, j + 1);
        }
        return Some(j - i);
    }
    // 12:34:56[.123], or 01:02.345 (minutes, seconds and their fraction: a test run's time),
    // or a progress bar's elapsed and remaining minutes and seconds, `01:23<00:45`
    if (1..=2).contains(&n)
        && b.get(i + n) == Some(&b':')
        && two_digits(b, i + n + 1)
        && match b.get(i + n + 3) {
            Some(b':' | b'<') => true,
            Some(b'.') if digit_at(b, i + n + 4) => true,
            next => i > 0 && b[i - 1] == b'<' && !next.is_some_and(u8::is_ascii_digit),
        }
    {
        return Some(time_end(b, i) - i);
    }
    None
}

/// `-01-02` (or `/01/02`) at `j`, then no digit: a date's month and day after its year.
#[inline(always)]
fn date_at(b: &[u8], j: usize) -> bool {
    match b.get(j..j + 7) {
        // Each byte read once when seven are there.
        Some(&[s, m1, m2, s2, d1, d2, after]) => {
            matches!(s, b'-' | b'/')
                && s2 == s
                && [m1, m2, d1, d2].iter().all(u8::is_ascii_digit)
                && !after.is_ascii_digit()
        }
        _ => {
            matches!(b.get(j), Some(b'-' | b'/'))
                && two_digits(b, j + 1)
                && b.get(j + 3) == b.get(j)
                && two_digits(b, j + 4)
        }
    }
}

/// End of `hh:mm[:ss[.frac]][Z|±hh[:]mm]` starting at `j`.
fn time_end(b: &[u8], j: usize) -> usize {
    // The common `hh:mm:ss` (then no digit) in one test; what follows it as below.
    let mut j = match b.get(j..j + 9) {
        Some(&[h1, h2, b':', m1, m2, b':', s1, s2, after])
            if [h1, h2, m1, m2, s1, s2].iter().all(u8::is_ascii_digit)
                && !after.is_ascii_digit() =>
        {
            j + 8
        }
        _ => j + digits(b, j),
    };
    while b.get(j) == Some(&b':') && two_digits(b, j + 1) {
        j += 3;
    }
    if matches!(b.get(j), Some(b'.' | b',')) && digit_at(b, j + 1) {
        j += 1 + digits(b, j + 1);
    }
    match b.get(j) {
        Some(b'Z') => j + 1,
        Some(b'+' | b'-') if two_digits(b, j + 1) => {
            let mut k = j + 3;
            if b.get(k) == Some(&b':') {
                k += 1;
            }
            if two_digits(b, k) { k + 2 } else { j + 3 }
        }
        _ => j,
    }
}

// Out of line: rare, and the masker's loop keeps more in registers without it.
#[inline(never)]
fn uuid_at(b: &[u8], i: usize) -> bool {
    if b.len() < i + 36 {
        return false;
    }
    let groups = [8, 4, 4, 4, 12];
    let mut j = i;
    for (g, &len) in groups.iter().enumerate() {
        if hexes(b, j) < len || (len == 12 && hexes(b, j) != 12) {
            return false;
        }
        j += len;
        if g < 4 {
            if b.get(j) != Some(&b'-') {
                return false;
            }
            j += 1;
        }
    }
    end_ok(b, j)
}

/// A duration at `i`, whose leading digits are `n` bytes: `12ms`, `0.01s`, `45 ms`, `3 seconds`,
/// `2 hours`, `4m55s`.
fn duration_len(b: &[u8], i: usize, n: usize) -> Option<usize> {
    let mut j = i + n;
    j += fraction(b, j);
    // A unit starts with a letter (or `µ`), directly or after one space, and ends a word: it
    // is the whole word there. The units' first letters rule out most words before they are
    // read.
    let (spaced, at) = match *b.get(j)? {
        b' ' if matches!(b.get(j + 1), Some(b'm' | b's' | b'h' | b'd' | b'w')) => (true, j + 1),
        0xc2 => {
            return (b.get(j..j + 3) == Some("µs".as_bytes()) && end_ok(b, j + 3))
                .then_some(j + 3 - i);
        }
        b'm' | b'u' | b'n' | b's' | b'h' | b'd' => (false, j),
        _ => return None,
    };
    let end = word_end(b, at);
    let unit = &b[at..end];
    if spaced {
        // Seconds after a space too (`Time: 2.345 s, estimated 3 s`).
        return (matches!(
            unit,
            b"ms"
                | b"sec"
                | b"secs"
                | b"second"
                | b"seconds"
                | b"min"
                | b"mins"
                | b"minute"
                | b"minutes"
                | b"milliseconds"
                | b"hr"
                | b"hrs"
                | b"hour"
                | b"hours"
                | b"day"
                | b"days"
                | b"week"
                | b"weeks"
        ) || unit == b"s")
            .then_some(end - i);
    }
    if tight_unit(unit) {
        return Some(end - i);
    }
    // A unit followed by the next amount (`4m55s`, `1h2m3.5s`): the word is a run of them.
    groups_end(b, at).map(|e| e - i)
}

/// A rate at `i` (`n` digits there): an amount, maybe one space, a unit of data or of work
/// and `/s` (`12.3 MB/s`, `850KiB/s`, `9.52it/s`): how fast a download or a loop went, which
/// changes from one run to the next.
// Out of line: rare, and the masker's loop keeps more in registers without it.
#[inline(never)]
fn rate_len(b: &[u8], i: usize, n: usize) -> Option<usize> {
    let mut j = i + n;
    j += fraction(b, j);
    if b.get(j) == Some(&b' ') {
        j += 1;
    }
    // The units' first letters rule out most words before they are read.
    if !matches!(
        b.get(j)?,
        b'B' | b'b' | b'k' | b'K' | b'M' | b'G' | b'T' | b'i'
    ) {
        return None;
    }
    let end = word_end(b, j);
    (rate_unit(&b[j..end]) && b.get(end..end + 2) == Some(b"/s") && end_ok(b, end + 2))
        .then_some(end + 2 - i)
}

/// A unit of data or of work that a rate counts per second.
fn rate_unit(u: &[u8]) -> bool {
    matches!(
        u,
        b"B" | b"kB"
            | b"KB"
            | b"MB"
            | b"GB"
            | b"TB"
            | b"KiB"
            | b"MiB"
            | b"GiB"
            | b"TiB"
            | b"kb"
            | b"Kb"
            | b"Mb"
            | b"Gb"
            | b"bit"
            | b"kbit"
            | b"Mbit"
            | b"Gbit"
            | b"it"
    )
}

/// A unit that follows an amount directly.
#[inline(always)]
fn tight_unit(u: &[u8]) -> bool {
    matches!(
        u,
        b"ms"
            | b"us"
            | b"ns"
            | b"s"
            | b"m"
            | b"h"
            | b"d"
            | b"hr"
            | b"hrs"
            | b"sec"
            | b"secs"
            | b"min"
            | b"mins"
    )
}

/// The end of a run of `unit amount unit …` at `at` (the first amount already read) ending a
/// word, or `None` when the word there is anything else.
// Out of line: rare, and the masker's loop keeps more in registers without it.
#[inline(never)]
fn groups_end(b: &[u8], at: usize) -> Option<usize> {
    let mut j = at;
    loop {
        let letters = b[j..]
            .iter()
            .take_while(|c| c.is_ascii_alphabetic())
            .count();
        if !tight_unit(&b[j..j + letters]) {
            return None;
        }
        j += letters;
        if end_ok(b, j) {
            return Some(j);
        }
        let n = digits(b, j);
        if n == 0 {
            return None;
        }
        j += n;
        j += fraction(b, j);
    }
}
