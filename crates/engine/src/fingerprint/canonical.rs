//! Canonical forms of argument strings, checked a word at a time and hashed without being
//! built when they are already canonical: whitespace, path separators, URL query noise.

use super::*;

pub(super) const LO: u64 = 0x0101_0101_0101_0101;

pub(super) const HI: u64 = 0x8080_8080_8080_8080;

/// The high bit of each byte of `w` that equals `b` (exact).
#[inline]
pub(super) fn eq_bytes(w: u64, b: u8) -> u64 {
    let x = w ^ (LO * u64::from(b));
    !(((x & !HI).wrapping_add(!HI)) | x) & HI
}

/// A word-at-a-time check that `s` is already in canonical form: printable ASCII with single
/// inner spaces and none at the ends; for a path also no `\`, no `//` and no leading `./`.
/// Never true for a string that is not canonical; may be false for some that are (control
/// characters), which the exact checks then decide.
pub(crate) fn plain(s: &[u8], path: bool) -> bool {
    let (Some(&first), Some(&last)) = (s.first(), s.last()) else {
        return true;
    };
    if first == b' ' || last == b' ' || (path && s.starts_with(b"./")) {
        return false;
    }
    // Per word: the flags of what is never plain, and the spaces and slashes (high bits).
    let check = |w: u64| {
        // Control characters and non-ASCII bytes.
        let mut bad = (w.wrapping_sub(LO * 0x20) & !w & HI) | (w & HI);
        let sp = eq_bytes(w, b' ');
        bad |= sp & (sp >> 8);
        let sl = if path {
            let sl = eq_bytes(w, b'/');
            bad |= eq_bytes(w, b'\\') | (sl & (sl >> 8));
            sl
        } else {
            0
        };
        (bad, sp, sl)
    };
    let n = s.len();
    if n < 8 {
        let mut w = [b'a'; 8];
        if let Some(head) = w.get_mut(..n) {
            head.copy_from_slice(s);
        }
        return check(u64::from_le_bytes(w)).0 == 0;
    }
    let mut bad = 0u64;
    // The previous word's last byte was a space (or a slash): bit 0.
    let (mut carry_space, mut carry_slash) = (0u64, 0u64);
    let mut chunks = s.chunks_exact(8);
    for c in &mut chunks {
        let mut b = [0u8; 8];
        b.copy_from_slice(c);
        let (x, sp, sl) = check(u64::from_le_bytes(b));
        bad |= x | (carry_space & (sp >> 7)) | (carry_slash & (sl >> 7));
        carry_space = sp >> 63;
        carry_slash = sl >> 63;
    }
    // The last 8 bytes, overlapping the words above: every pair of neighbours not yet checked
    // lies inside it.
    if !chunks.remainder().is_empty()
        && let Some(tail) = s.get(n - 8..).and_then(<[u8]>::first_chunk::<8>)
    {
        bad |= check(u64::from_le_bytes(*tail)).0;
    }
    bad == 0
}

/// Whether `s` is already in collapsed form (ASCII, single inner spaces, no edge spaces).
pub(super) fn collapsed(s: &str) -> bool {
    let b = s.as_bytes();
    if !s.is_ascii() {
        return false;
    }
    match (b.first(), b.last()) {
        (Some(f), Some(l)) if f.is_ascii_whitespace() || l.is_ascii_whitespace() => return false,
        _ => {}
    }
    let mut prev_space = false;
    for &c in b {
        if c.is_ascii_whitespace() {
            if c != b' ' || prev_space {
                return false;
            }
            prev_space = true;
        } else {
            prev_space = false;
        }
    }
    true
}

/// Whether an argument key holds a path.
pub fn is_path_key(k: &str) -> bool {
    is_path_key_bytes(k.as_bytes())
}

/// [`is_path_key`] of a key's bytes.
pub(super) fn is_path_key_bytes(k: &[u8]) -> bool {
    // Every name below ends with one of these letters: most keys are ruled out by their last.
    if !matches!(k.last(), Some(b'h' | b's' | b'e' | b'r' | b'd' | b'y')) {
        return false;
    }
    matches!(
        k,
        b"path"
            | b"paths"
            | b"file"
            | b"files"
            | b"filename"
            | b"dir"
            | b"directory"
            | b"cwd"
            | b"folder"
    ) || k.ends_with(b"path")
        || k.ends_with(b"paths")
        || k.ends_with(b"_file")
        || k.ends_with(b"_dir")
}

/// The canonical 64 bits of a JSON number: integers (and integral floats) by value, so `1` and
/// `1.0` are one number.
pub(super) fn number_bits(n: &Number) -> u64 {
    if let Some(i) = n.as_i64() {
        i as u64
    } else if let Some(u) = n.as_u64() {
        u
    } else if let Some(f) = n.as_f64() {
        if f.fract() == 0.0 && f.abs() < 9.0e15 {
            f as i64 as u64
        } else {
            f.to_bits()
        }
    } else {
        0
    }
}

/// Runs `f` on the cleared per-thread scratch buffer.
pub(super) fn with_scratch<T>(f: impl FnOnce(&mut Vec<u8>) -> T) -> T {
    SCRATCH.with(|cell| match cell.try_borrow_mut() {
        Ok(mut buf) => {
            buf.clear();
            let out = f(&mut buf);
            if buf.capacity() > SCRATCH_KEEP {
                *buf = Vec::new();
            }
            out
        }
        Err(_) => f(&mut Vec::new()),
    })
}

/// A path with nothing for [`FingerprintRules::canonical_path`] to change (whitespace aside).
pub(super) fn clean_path(s: &str) -> bool {
    !s.contains('\\') && !s.contains("//") && !s.starts_with("./")
}

/// Scratch buffers larger than this are not kept.
pub(super) const SCRATCH_KEEP: usize = 1 << 16;

thread_local! {
    /// Where non-canonical strings are canonicalized before hashing.
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

impl FingerprintRules {
    /// The hash of a string's canonical form: whitespace collapsed (when the policy says so),
    /// and for a path, separators normalized. Canonical strings are hashed as they are.
    pub(super) fn text_hash(&self, s: &str, path: bool) -> u64 {
        if s.starts_with("http")
            && let Some(q) = s.find('?')
            && s[..q].contains("://")
        {
            return self.url_hash(s, q);
        }
        let path = path && self.path_separators;
        let canonical = if self.collapse_whitespace {
            plain(s.as_bytes(), path) || (collapsed(s) && (!path || clean_path(s)))
        } else {
            !path || clean_path(s)
        };
        if canonical {
            return hash_bytes(tag::TEXT, s.as_bytes());
        }
        with_scratch(|buf| {
            if path {
                self.canonical_path(s, buf);
            } else {
                for (i, w) in s.split_whitespace().enumerate() {
                    if i > 0 {
                        buf.push(b' ');
                    }
                    buf.extend_from_slice(w.as_bytes());
                }
            }
            hash_bytes(tag::TEXT, buf)
        })
    }

    /// The hash of a URL without its volatile query parameters (`?_ts=…`, `&request_id=…`,
    /// any parameter named by `volatile_keys` or starting with `_`): a cache-busting parameter
    /// does not make a new request. `q` is the position of the `?`.
    pub(super) fn url_hash(&self, s: &str, q: usize) -> u64 {
        with_scratch(|buf| {
            buf.extend_from_slice(s[..q].trim().as_bytes());
            let (query, fragment) = match s[q + 1..].split_once('#') {
                Some((a, b)) => (a, Some(b)),
                None => (&s[q + 1..], None),
            };
            let mut first = true;
            for param in query.split('&').filter(|p| !p.is_empty()) {
                let name = param.split_once('=').map_or(param, |(n, _)| n);
                if name.starts_with('_') || self.volatile_keys.iter().any(|k| **k == *name) {
                    continue;
                }
                buf.push(if first { b'?' } else { b'&' });
                first = false;
                buf.extend_from_slice(param.trim().as_bytes());
            }
            if let Some(f) = fragment {
                buf.push(b'#');
                buf.extend_from_slice(f.as_bytes());
            }
            hash_bytes(tag::TEXT, buf)
        })
    }

    /// Writes a path's canonical form: `\` as `/`, no doubled separators, no leading `./`,
    /// whitespace collapsed when the policy says so.
    pub(super) fn canonical_path(&self, s: &str, out: &mut Vec<u8>) {
        let mut t = if self.collapse_whitespace {
            s.trim()
        } else {
            s
        };
        while let Some(rest) = t.strip_prefix("./").or_else(|| t.strip_prefix(".\\")) {
            t = rest.trim_start_matches(['/', '\\']);
        }
        let mut prev_slash = false;
        let mut prev_space = false;
        for &b in t.as_bytes() {
            let b = if b == b'\\' { b'/' } else { b };
            if b == b'/' && prev_slash {
                continue;
            }
            prev_slash = b == b'/';
            if self.collapse_whitespace && b.is_ascii_whitespace() {
                if !prev_space {
                    out.push(b' ');
                }
                prev_space = true;
                continue;
            }
            prev_space = false;
            out.push(b);
        }
    }
}
