//! Fingerprints of arguments given as JSON text (what a model writes and a proxy forwards),
//! computed while the text is scanned: no `serde_json::Value` is built and, once the
//! per-thread buffers have grown, nothing is allocated.
//!
//! The keys are the ones the parsed path ([`FingerprintRules::keys`] with
//! [`Arguments::Json`]) gives for the same text, bit for bit: strings are hashed through the
//! same canonical forms, numbers through the same [`Number`] values, and object members are
//! summed, so their order does not matter. What the scanner does not settle exactly as
//! `serde_json` would — duplicate or escaped keys, objects of many members, deep nesting, a
//! shell command given as an argument vector, a policy that keeps key order, text that is not
//! JSON at all — makes it answer `None`, and the caller parses the text instead.

use std::cell::RefCell;

use regex::Regex;
use serde_json::Number;

use super::{
    ArgKind, CallKeys, EditSides, FingerprintRules, HI, LO, PATH_KEYS, Role, ToolKeys, WaitArgs,
    combine, looks_read_only, number_bits,
};
use crate::hash::{hash_bytes, mix, tag};

/// Objects with more members than this are left to the parser (the duplicate-key check keeps
/// the member hashes of one object on the stack).
const MAX_MEMBERS: usize = 32;
/// Nesting deeper than this is left to the parser (which has its own limit).
const MAX_DEPTH: u32 = 64;
/// Decoded-string buffers larger than this are not kept.
const DECODED_KEEP: usize = 1 << 16;

/// A scan's buffers, kept by each thread.
struct Buffers {
    /// Where strings with escapes are decoded before hashing.
    decoded: Vec<u8>,
    /// The key hashes of the objects being scanned (each object's after its parents'), to
    /// leave duplicate keys to the parser.
    seen: Vec<u64>,
}

thread_local! {
    static BUFFERS: RefCell<Buffers> = const {
        RefCell::new(Buffers {
            decoded: Vec::new(),
            seen: Vec::new(),
        })
    };
}

/// Where a string's contents are: in the text itself (no escapes) or decoded into the buffer.
#[derive(Clone, Copy, Debug)]
enum Src {
    Text(usize, usize),
    Decoded(usize, usize),
}

/// A top-level member's value, as far as the shell command, the read-tool path and the
/// read-only check need to know it.
#[derive(Clone, Copy, Debug)]
enum Kind {
    Str(Src),
    Null,
    Array,
    Other,
}

/// An object being scanned: where its key hashes start in [`Scanner::seen`], how many it has,
/// and a bit for each (by the hash's top six bits), so that a key whose bit is not yet set
/// needs no look through the others.
struct Members {
    from: usize,
    count: usize,
    bits: u64,
}

/// What the scan of a string found besides where it is: whether its text is already in
/// canonical form as text and as a path (what [`super::plain`] says of it); both false when
/// the scan could not tell (a string with escapes).
#[derive(Clone, Copy, Debug)]
struct Plain {
    text: bool,
    path: bool,
}

/// A string the scan could not tell about.
const UNKNOWN: Plain = Plain {
    text: false,
    path: false,
};

struct Scanner<'a> {
    s: &'a str,
    b: &'a [u8],
    i: usize,
    /// Decoded strings of this call; a string decoded for a member that is kept (the command,
    /// a path) stays until the call's keys are made.
    dec: &'a mut Vec<u8>,
    /// Key hashes of the objects being scanned.
    seen: &'a mut Vec<u64>,
}

impl FingerprintRules {
    /// The keys of raw JSON arguments, or `None` when the text must be parsed (see the module
    /// docs).
    pub(super) fn keys_of_raw(
        &self,
        tool: &ToolKeys,
        s: &str,
        test_commands: &[Regex],
    ) -> Option<CallKeys> {
        if !self.sort_keys {
            return None;
        }
        BUFFERS.with(|cell| {
            let mut bufs = cell.try_borrow_mut().ok()?;
            let Buffers { decoded, seen } = &mut *bufs;
            decoded.clear();
            seen.clear();
            let out = Scanner {
                s,
                b: s.as_bytes(),
                i: 0,
                dec: decoded,
                seen,
            }
            .call(self, tool, test_commands);
            if decoded.capacity() > DECODED_KEEP {
                *decoded = Vec::new();
            }
            out
        })
    }
}

impl FingerprintRules {
    /// [`FingerprintRules::text_hash`] of a string whose scan found out whether it is plain.
    #[inline]
    fn scanned_text_hash(&self, s: &str, path: bool, plain: Plain) -> u64 {
        let plain = if path && self.path_separators {
            plain.path
        } else {
            plain.text
        };
        if plain && self.collapse_whitespace && !s.starts_with("http") {
            return hash_bytes(tag::TEXT, s.as_bytes());
        }
        self.text_hash(s, path)
    }
}

impl<'a> Scanner<'a> {
    /// Skips whitespace: most JSON text has none between its tokens.
    #[inline(always)]
    fn ws(&mut self) {
        if self.b.get(self.i).is_some_and(|&c| c <= b' ') {
            self.more_ws();
        }
    }

    fn more_ws(&mut self) {
        while let Some(&c) = self.b.get(self.i) {
            if matches!(c, b' ' | b'\n' | b'\r' | b'\t') {
                self.i += 1;
            } else {
                break;
            }
        }
    }

    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    /// Whether only whitespace is left.
    fn at_end(&mut self) -> bool {
        self.ws();
        self.i == self.b.len()
    }

    fn str_of(&self, src: Src) -> Option<&str> {
        match src {
            Src::Text(a, z) => self.s.get(a..z),
            Src::Decoded(a, z) => std::str::from_utf8(self.dec.get(a..z)?).ok(),
        }
    }

    fn call(mut self, f: &FingerprintRules, tool: &ToolKeys, tests: &[Regex]) -> Option<CallKeys> {
        self.ws();
        if self.peek() != Some(b'{') {
            let v = self.value(f, tool, false, 0)?;
            if !self.at_end() {
                return None;
            }
            let exact = mix(tool.tool_hash, v);
            return Some(CallKeys {
                exact,
                fuzzy: exact,
                ..CallKeys::default()
            });
        }
        let mut members = self.open_object();
        let mut exact_acc = 0u64;
        let mut fuzzy_acc = 0u64;
        let mut any_primary = false;
        let mut read_only = false;
        let mut edit = EditSides::<Src>::default();
        let mut code_writes = false;
        let mut target = 0u64;
        // The shell command: its key's position among the command keys, its value, and its
        // text hash when computed.
        let mut command: Option<(usize, Kind, Option<u64>)> = None;
        // Primary members with a path key (read tools only): the parsed path visits members
        // in key order and takes the first such path, so they are ordered after the scan.
        let mut paths: [(&[u8], Kind); PATH_KEYS.len()] = [(b"", Kind::Null); PATH_KEYS.len()];
        let mut n_paths = 0usize;
        let mut only_path = tool.read_tool;
        let mut wait = WaitArgs::default();
        // A description's member (and whether it is primary), counted at the end unless a
        // reference turned up beside it (see `DESCRIPTION_KEY`); the sums make the order moot.
        let mut described: Option<(u64, bool)> = None;
        let mut referenced = false;
        while let Some((k, kh)) = self.next_member(&mut members)? {
            let role = tool.role_of_bytes(kh, k);
            let path_key = role.path;
            // The member's value hash and, for a string, its bare text hash.
            let (kind, value, text) = match self.peek()? {
                b'"' => {
                    let (src, plain) = self.string::<true>()?;
                    let v = self.str_of(src)?;
                    wait.see(
                        k,
                        if v.is_empty() {
                            ArgKind::EmptyStr
                        } else {
                            ArgKind::Str
                        },
                    );
                    if role.read_only && looks_read_only(v) {
                        read_only = true;
                    }
                    edit.see(role.edit, src);
                    code_writes |= role.code && super::shell::code_writes(v);
                    let text = f.scanned_text_hash(v, path_key, plain);
                    if path_key && !role.volatile {
                        target = target.wrapping_add(mix(kh, mix(tag::STRING, text)));
                    }
                    (Kind::Str(src), mix(tag::STRING, text), Some(text))
                }
                b'n' => {
                    wait.see(k, ArgKind::Flag);
                    (Kind::Null, self.value(f, tool, false, 0)?, None)
                }
                b'[' if role.command.is_some() => return None,
                b'[' => {
                    wait.see(k, ArgKind::Nested);
                    (Kind::Array, self.value(f, tool, path_key, 0)?, None)
                }
                b'-' | b'0'..=b'9' => {
                    wait.see(k, ArgKind::Number);
                    (Kind::Other, mix(tag::NUMBER, self.number()?), None)
                }
                c => {
                    wait.see(
                        k,
                        if c == b'{' {
                            ArgKind::Nested
                        } else {
                            ArgKind::Flag
                        },
                    );
                    (Kind::Other, self.value(f, tool, false, 0)?, None)
                }
            };
            if let Some(pos) = role.command
                && command.is_none_or(|c| pos < c.0)
            {
                // The text hash serves the shell keys only when it was made as a plain
                // (non-path) string of a member that counts.
                let text = text.filter(|_| !role.volatile && !path_key);
                command = Some((pos, kind, text));
            }
            if only_path && role.primary {
                if PATH_KEYS.iter().any(|p| p.as_bytes() == k) {
                    if let Some(slot) = paths.get_mut(n_paths) {
                        *slot = (k, kind);
                        n_paths += 1;
                    }
                } else if !matches!(kind, Kind::Null) {
                    only_path = false;
                }
            }
            referenced |= role.reference;
            if role.describes && !role.volatile {
                described = Some((mix(kh, value), role.primary));
            } else if !role.volatile {
                let member = mix(kh, value);
                exact_acc = exact_acc.wrapping_add(member);
                if role.primary {
                    any_primary = true;
                    fuzzy_acc = fuzzy_acc.wrapping_add(member);
                }
            }
        }
        if !self.at_end() {
            return None;
        }
        if let Some((member, primary)) = described
            && !referenced
        {
            exact_acc = exact_acc.wrapping_add(member);
            if primary {
                any_primary = true;
                fuzzy_acc = fuzzy_acc.wrapping_add(member);
            }
        }
        let finish = |acc: u64| mix(tool.tool_hash, mix(tag::OBJECT, acc));
        let exact = finish(exact_acc);
        let mut keys = CallKeys {
            exact,
            fuzzy: exact,
            read_only,
            noop_edit: edit.same(|a, b| self.str_of(a).is_some_and(|a| Some(a) == self.str_of(b))),
            edit: edit.both() || code_writes,
            target,
            wait: wait.waits(),
            ..CallKeys::default()
        };
        if let Some((_, Kind::Str(src), text)) = command {
            f.shell_keys(tool, self.str_of(src)?, text, &mut keys, tests);
            return Some(keys);
        }
        if only_path {
            // The parsed path visits members in key order: the first path key takes the path
            // (none if its value is no string); any later one that is not null spoils it.
            let paths = paths.get_mut(..n_paths)?;
            paths.sort_unstable_by(|a, b| a.0.cmp(b.0));
            let mut path: Option<Src> = None;
            for &(_, kind) in paths.iter() {
                if path.is_none() {
                    if let Kind::Str(src) = kind {
                        path = Some(src);
                    }
                } else if !matches!(kind, Kind::Null) {
                    only_path = false;
                }
            }
            if only_path && let Some(src) = path {
                keys.fuzzy = f.file_read_key(self.str_of(src)?);
                keys.file_read = true;
                return Some(keys);
            }
        }
        if any_primary {
            keys.fuzzy = combine(finish(fuzzy_acc), super::FUZZY_TAG);
        }
        Some(keys)
    }

    /// Opens the object whose `{` is at the cursor.
    fn open_object(&mut self) -> Members {
        self.i += 1;
        Members {
            from: self.seen.len(),
            count: 0,
            bits: 0,
        }
    }

    /// The next member of an object: its key and the key's hash, the cursor left at its
    /// value; `Some(None)` past the closing brace (the object's key hashes are then
    /// forgotten); `None` for what is left to the parser (bad syntax, a duplicate key, too
    /// many members).
    #[inline(always)]
    fn next_member(&mut self, m: &mut Members) -> Option<Option<(&'a [u8], u64)>> {
        self.ws();
        if m.count == 0 {
            if self.peek() == Some(b'}') {
                self.i += 1;
                return Some(None);
            }
        } else {
            match self.peek()? {
                b',' => {
                    self.i += 1;
                    self.ws();
                }
                b'}' => {
                    self.i += 1;
                    self.seen.truncate(m.from);
                    return Some(None);
                }
                _ => return None,
            }
        }
        let k = self.key()?;
        let kh = hash_bytes(tag::KEY, k);
        let bit = 1u64 << (kh >> 58);
        if m.count >= MAX_MEMBERS || (m.bits & bit != 0 && self.seen.get(m.from..)?.contains(&kh)) {
            return None;
        }
        m.count += 1;
        m.bits |= bit;
        self.seen.push(kh);
        self.ws();
        if self.peek() != Some(b':') {
            return None;
        }
        self.i += 1;
        self.ws();
        Some(Some((k, kh)))
    }

    /// An object key at the cursor, which must have no escapes (an escaped key is left to
    /// the parser: it could spell the same key as another member).
    #[inline(always)]
    fn key(&mut self) -> Option<&'a [u8]> {
        if self.peek() != Some(b'"') {
            return None;
        }
        match self.string::<false>()?.0 {
            Src::Text(a, z) => self.b.get(a..z),
            Src::Decoded(..) => None,
        }
    }

    /// The hash of the value at the cursor, as [`FingerprintRules::value_hash`] gives it.
    fn value(
        &mut self,
        f: &FingerprintRules,
        tool: &ToolKeys,
        path: bool,
        depth: u32,
    ) -> Option<u64> {
        match self.peek()? {
            b'"' => {
                let (src, plain) = self.string::<true>()?;
                Some(mix(
                    tag::STRING,
                    f.scanned_text_hash(self.str_of(src)?, path, plain),
                ))
            }
            b'n' => self.literal(b"null", tag::NULL),
            b't' => self.literal(b"true", tag::TRUE),
            b'f' => self.literal(b"false", tag::FALSE),
            b'[' => {
                if depth >= MAX_DEPTH {
                    return None;
                }
                self.i += 1;
                let mut h = tag::ARRAY;
                let mut len = 0u64;
                self.ws();
                if self.peek() == Some(b']') {
                    self.i += 1;
                    return Some(mix(h, 0));
                }
                loop {
                    self.ws();
                    h = mix(h, self.value(f, tool, path, depth + 1)?);
                    len += 1;
                    self.ws();
                    match self.peek()? {
                        b',' => self.i += 1,
                        b']' => {
                            self.i += 1;
                            return Some(mix(h, len));
                        }
                        _ => return None,
                    }
                }
            }
            b'{' => {
                if depth >= MAX_DEPTH {
                    return None;
                }
                let mut members = self.open_object();
                let mut acc = 0u64;
                while let Some((k, kh)) = self.next_member(&mut members)? {
                    let role: Role = tool.role_of_bytes(kh, k);
                    let v = self.value(f, tool, role.path, depth + 1)?;
                    if !role.volatile {
                        acc = acc.wrapping_add(mix(kh, v));
                    }
                }
                Some(mix(tag::OBJECT, acc))
            }
            b'-' | b'0'..=b'9' => Some(mix(tag::NUMBER, self.number()?)),
            _ => None,
        }
    }

    fn literal(&mut self, word: &[u8], h: u64) -> Option<u64> {
        if self.b.get(self.i..)?.starts_with(word) {
            self.i += word.len();
            Some(h)
        } else {
            None
        }
    }

    /// The canonical bits ([`number_bits`]) of the number at the cursor, read as `serde_json`
    /// reads it: a plain non-negative integer directly, anything else through `serde_json`'s
    /// own number parser.
    #[inline]
    fn number(&mut self) -> Option<u64> {
        let b = self.b;
        let start = self.i;
        // A plain non-negative integer of at most 19 digits is read in one pass: it never
        // overflows a `u64`, whose bits are the number's (as an `i64` too, when it is one).
        let mut j = start;
        let mut v = 0u64;
        while let Some(d) = b.get(j).map(|c| c.wrapping_sub(b'0')).filter(|&d| d <= 9) {
            v = v.wrapping_mul(10).wrapping_add(u64::from(d));
            j += 1;
        }
        let len = j - start;
        if (1..=19).contains(&len)
            && (len == 1 || b.get(start) != Some(&b'0'))
            && !matches!(b.get(j), Some(b'.' | b'e' | b'E'))
        {
            self.i = j;
            return Some(v);
        }
        self.other_number()
    }

    /// [`Scanner::number`] of a number that is no plain integer of at most 19 digits (or no
    /// number at all).
    #[cold]
    #[inline(never)]
    fn other_number(&mut self) -> Option<u64> {
        let b = self.b;
        let start = self.i;
        let mut j = start;
        let digits = |j: &mut usize| {
            let from = *j;
            while b.get(*j).is_some_and(u8::is_ascii_digit) {
                *j += 1;
            }
            *j - from
        };
        if b.get(j) == Some(&b'-') {
            j += 1;
        }
        let int_start = j;
        let int_len = digits(&mut j);
        // JSON allows no leading zeros and needs a digit.
        if int_len == 0 || (int_len > 1 && b.get(int_start) == Some(&b'0')) {
            return None;
        }
        if b.get(j) == Some(&b'.') {
            j += 1;
            if digits(&mut j) == 0 {
                return None;
            }
        }
        if matches!(b.get(j), Some(b'e' | b'E')) {
            j += 1;
            if matches!(b.get(j), Some(b'+' | b'-')) {
                j += 1;
            }
            if digits(&mut j) == 0 {
                return None;
            }
        }
        self.i = j;
        serde_json::from_str::<Number>(self.s.get(start..j)?)
            .ok()
            .map(|n| number_bits(&n))
    }

    /// A string at the cursor (its opening quote), the cursor left past its closing quote.
    /// Control characters, bad escapes and lone surrogates make it `None`, as they make the
    /// text invalid JSON. With `PLAIN`, the scan also finds out whether the string (when it
    /// has no escapes) is already canonical, in the same pass.
    #[inline(always)]
    fn string<const PLAIN: bool>(&mut self) -> Option<(Src, Plain)> {
        let b = self.b;
        let start = self.i + 1;
        let mut j = start;
        // The high bit of each byte that is no ASCII or a space followed by a space (`bad`),
        // or a slash followed by a slash (`bad_path`).
        let (mut bad, mut bad_path) = (0u64, 0u64);
        loop {
            // Eight bytes at a time up to the first quote, backslash or control character
            // (the control-character test may also flag a byte after a real one, which is
            // never the first); with `PLAIN`, also the eight bytes one further on, each
            // byte's right neighbour. The last bytes of the text are padded with quotes: a
            // string that ends there is unterminated.
            let (w, next) = if PLAIN {
                match b.get(j..).and_then(<[u8]>::first_chunk::<9>) {
                    Some(c) => (word(c.first_chunk()), word(c.last_chunk())),
                    None => {
                        let c: [u8; 9] = padded(b, j)?;
                        (word(c.first_chunk()), word(c.last_chunk()))
                    }
                }
            } else {
                match b.get(j..).and_then(<[u8]>::first_chunk::<8>) {
                    Some(c) => (u64::from_le_bytes(*c), 0),
                    None => (u64::from_le_bytes(padded(b, j)?), 0),
                }
            };
            // `zeros` of the quote's, the backslash's and the control characters' differences,
            // sharing its last steps (a byte that is no ASCII is none of them).
            let hits = ((w ^ (LO * u64::from(b'"'))).wrapping_sub(LO)
                | (w ^ (LO * u64::from(b'\\'))).wrapping_sub(LO)
                | w.wrapping_sub(LO * 0x20))
                & !w
                & HI;
            // A pair of spaces or of slashes: the byte and its neighbour both are one.
            let (flags, slashes) = if PLAIN {
                let pair = |c: u8| zeros((w ^ (LO * u64::from(c))) | (next ^ (LO * u64::from(c))));
                ((w & HI) | pair(b' '), pair(b'/'))
            } else {
                (0, 0)
            };
            if hits == 0 {
                bad |= flags;
                bad_path |= slashes;
                j += 8;
                continue;
            }
            // The bytes before the first hit.
            let keep = (hits & hits.wrapping_neg()).wrapping_sub(1);
            bad |= flags & keep;
            bad_path |= slashes & keep;
            j += (hits.trailing_zeros() / 8) as usize;
            return match *b.get(j)? {
                b'"' => {
                    self.i = j + 1;
                    let plain = if PLAIN {
                        let s = b.get(start..j)?;
                        let edges = s.first() != Some(&b' ') && s.last() != Some(&b' ');
                        let text = bad == 0 && edges;
                        Plain {
                            text,
                            path: text && bad_path == 0 && !s.starts_with(b"./"),
                        }
                    } else {
                        UNKNOWN
                    };
                    Some((Src::Text(start, j), plain))
                }
                b'\\' => Some((self.escaped(start, j)?, UNKNOWN)),
                _ => None,
            };
        }
    }

    /// Decodes a string with escapes into the buffer: `start` is where its contents begin,
    /// `j` its first backslash.
    fn escaped(&mut self, start: usize, mut j: usize) -> Option<Src> {
        let b = self.b;
        let from = self.dec.len();
        self.dec.extend_from_slice(b.get(start..j)?);
        loop {
            match *b.get(j)? {
                b'"' => {
                    self.i = j + 1;
                    return Some(Src::Decoded(from, self.dec.len()));
                }
                b'\\' => {
                    let e = *b.get(j + 1)?;
                    j += 2;
                    let c = match e {
                        b'"' => b'"',
                        b'\\' => b'\\',
                        b'/' => b'/',
                        b'b' => 0x08,
                        b'f' => 0x0c,
                        b'n' => b'\n',
                        b'r' => b'\r',
                        b't' => b'\t',
                        b'u' => {
                            let hi = hex4(b, j)?;
                            j += 4;
                            let code = match hi {
                                0xd800..=0xdbff => {
                                    if b.get(j..j + 2)? != b"\\u" {
                                        return None;
                                    }
                                    let lo = hex4(b, j + 2)?;
                                    if !(0xdc00..=0xdfff).contains(&lo) {
                                        return None;
                                    }
                                    j += 6;
                                    0x10000 + ((hi - 0xd800) << 10) + (lo - 0xdc00)
                                }
                                0xdc00..=0xdfff => return None,
                                _ => hi,
                            };
                            let ch = char::from_u32(code)?;
                            let mut utf8 = [0u8; 4];
                            self.dec
                                .extend_from_slice(ch.encode_utf8(&mut utf8).as_bytes());
                            continue;
                        }
                        _ => return None,
                    };
                    self.dec.push(c);
                }
                c if c < 0x20 => return None,
                c => {
                    self.dec.push(c);
                    j += 1;
                }
            }
        }
    }
}

/// The high bit of every zero byte of `v`, and possibly of bytes after one (a borrow): exact up
/// to the first zero byte, and never missing one, which is all the string scan needs (a
/// byte flagged after a real one only makes a string look less plain than it is).
#[inline(always)]
fn zeros(v: u64) -> u64 {
    v.wrapping_sub(LO) & !v & HI
}

/// The bytes of the text from `j` on, fewer than `N`, padded with quotes to `N`.
#[inline(never)]
fn padded<const N: usize>(b: &[u8], j: usize) -> Option<[u8; N]> {
    let mut c = [b'"'; N];
    let rest = b.get(j..).unwrap_or_default();
    c.get_mut(..rest.len())?.copy_from_slice(rest);
    Some(c)
}

/// The little-endian word of eight bytes (zero for none).
#[inline(always)]
fn word(c: Option<&[u8; 8]>) -> u64 {
    c.map_or(0, |c| u64::from_le_bytes(*c))
}

/// The value of four hex digits at `j`.
fn hex4(b: &[u8], j: usize) -> Option<u32> {
    let mut v = 0u32;
    for &c in b.get(j..j + 4)? {
        v = (v << 4) | char::from(c).to_digit(16)?;
    }
    Some(v)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)] // test code

    use proptest::prelude::*;

    use super::*;

    /// Scans the JSON string `text` (with its quotes) for what it says about plain forms.
    fn scan(text: &str) -> Option<(Src, Plain)> {
        let (mut dec, mut seen) = (Vec::new(), Vec::new());
        Scanner {
            s: text,
            b: text.as_bytes(),
            i: 0,
            dec: &mut dec,
            seen: &mut seen,
        }
        .string::<true>()
    }

    proptest! {
        /// The string scan's plain forms are [`super::super::plain`]'s, wherever the string
        /// ends in the text (the padded last word included).
        #[test]
        fn string_scan_finds_the_plain_forms(
            s in "[ a/.\\x7fé]{0,40}",
            tail in "[}\\] ]{0,9}",
        ) {
            let text = format!("\"{s}\"{tail}");
            let (src, plain) = scan(&text).unwrap();
            let Src::Text(a, z) = src else { panic!("no escapes: {text:?}") };
            prop_assert_eq!(&text[a..z], s.as_str());
            prop_assert_eq!(plain.text, super::super::plain(s.as_bytes(), false), "{:?}", s);
            prop_assert_eq!(plain.path, super::super::plain(s.as_bytes(), true), "{:?}", s);
        }

        /// For any printable text, a string the scan calls plain is plain (the scan may miss
        /// a plain one after a space or a slash).
        #[test]
        fn string_scan_never_calls_plain_what_is_not(s in "[ -~é]{0,40}") {
            let text = serde_json::to_string(&s).unwrap();
            let (_, plain) = scan(&text).unwrap();
            prop_assert!(!plain.text || super::super::plain(s.as_bytes(), false), "{:?}", s);
            prop_assert!(!plain.path || super::super::plain(s.as_bytes(), true), "{:?}", s);
        }

        /// An unterminated string is no string, however close to the end of the text.
        #[test]
        fn unterminated_string_is_none(s in "[ a/é]{0,20}") {
            let text = format!("\"{s}");
            prop_assert!(scan(&text).is_none());
        }
    }
}
