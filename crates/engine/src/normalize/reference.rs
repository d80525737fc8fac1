//! The maskers written as plainly as they can be, every masker tried at every byte: the
//! specification the one-pass masker ([`super::mask`]) is tested against.

use super::{Maskers, Outcome, ResultRules};
use crate::event::ToolResult;
use crate::hash::{StreamHasher, hash_bytes};

/// Masks `s` trying every masker at every byte.
pub(super) fn mask_trying_every_byte(m: &Maskers, s: &str) -> String {
    let b = s.as_bytes();
    let (mut out, mut i, mut copied) = (String::new(), 0, 0);
    while i < b.len() {
        match match_at(m, b, i) {
            Some((n, rep)) if n > 0 => {
                out.push_str(&s[copied..i]);
                out.push_str(rep);
                i += n;
                while i < b.len() && !s.is_char_boundary(i) {
                    i += 1;
                }
                copied = i;
            }
            _ => {
                i += 1;
                while i < b.len() && !s.is_char_boundary(i) {
                    i += 1;
                }
            }
        }
    }
    out.push_str(&s[copied..]);
    out
}

fn is_word(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

fn digits(b: &[u8], i: usize) -> usize {
    b[i.min(b.len())..]
        .iter()
        .take_while(|c| c.is_ascii_digit())
        .count()
}

fn hexes(b: &[u8], i: usize) -> usize {
    b[i.min(b.len())..]
        .iter()
        .take_while(|c| c.is_ascii_hexdigit())
        .count()
}

fn starts_ci(b: &[u8], i: usize, word: &str) -> bool {
    b.len() >= i + word.len() && b[i..i + word.len()].eq_ignore_ascii_case(word.as_bytes())
}

/// The masker matching at `i`, if any: its length and replacement.
#[inline]
fn match_at<'r>(m: &Maskers, b: &[u8], i: usize) -> Option<(usize, &'r str)> {
    let c = b[i];
    let boundary = i == 0 || !is_word(b[i - 1]);
    if c == 0x1b && m.ansi {
        Some((ansi_len(b, i), ""))
    } else if boundary && c.is_ascii_alphanumeric() {
        word_mask(m, b, i)
    } else if c == b'(' && m.counters {
        // (3/10)
        let n1 = digits(b, i + 1);
        let n2 = if n1 > 0 && b.get(i + 1 + n1) == Some(&b'/') {
            digits(b, i + 2 + n1)
        } else {
            0
        };
        if n2 > 0 && b.get(i + 2 + n1 + n2) == Some(&b')') {
            Some((3 + n1 + n2, "(<n>/<n>)"))
        } else {
            None
        }
    } else if c == b'#' && m.counters && (i == 0 || !is_word(b[i - 1])) {
        // #7
        let n = digits(b, i + 1);
        (n > 0 && (i + 1 + n >= b.len() || !is_word(b[i + 1 + n]))).then_some((1 + n, "#<n>"))
    } else if c == b'/' && m.temp_paths {
        temp_len(b, i).map(|n| (n, "/tmp/<tmp>"))
    } else {
        None
    }
}

/// `head` ends with a local host: `[::1]`, `localhost` or four dotted numbers after no word.
fn local_host_before(head: &[u8]) -> bool {
    if head.ends_with(b"]") {
        return true;
    }
    let lower = String::from_utf8_lossy(head).to_ascii_lowercase();
    if lower.ends_with("localhost") {
        return true;
    }
    let start = head
        .iter()
        .rposition(|c| !(c.is_ascii_digit() || *c == b'.'))
        .map_or(0, |p| p + 1);
    let ip = &head[start..];
    let parts: Vec<&[u8]> = ip.split(|&c| c == b'.').collect();
    parts.len() == 4 && !parts[0].is_empty() && (start == 0 || !is_word(head[start - 1]))
}

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

fn temp_len(b: &[u8], i: usize) -> Option<usize> {
    let prefix = ["/tmp/", "/var/tmp/", "/private/tmp/"]
        .into_iter()
        .find(|p| b[i..].starts_with(p.as_bytes()))?;
    if i > 0 && (is_word(b[i - 1]) || b[i - 1] == b'/' || b[i - 1] == b'.') {
        return None;
    }
    let start = i + prefix.len();
    let n = b[start..]
        .iter()
        .take_while(|&&c| c != b'/' && !c.is_ascii_whitespace() && !b"'\"`:),]".contains(&c))
        .count();
    (n > 0).then_some(prefix.len() + n)
}

/// Maskers that start at a word boundary with an alphanumeric byte.
fn word_mask<'r>(m: &Maskers, b: &[u8], i: usize) -> Option<(usize, &'r str)> {
    let end_ok = |j: usize| j >= b.len() || !is_word(b[j]);
    let c = b[i];
    if c.is_ascii_digit() {
        let n = digits(b, i);
        if m.timestamps
            && let Some(len) = timestamp_len(b, i, n)
        {
            return Some((len, "<ts>"));
        }
        if m.uuids && b.get(i + 8) == Some(&b'-') && uuid_at(b, i) {
            return Some((36, "<uuid>"));
        }
        if m.counters && starts_ci(b, i + n, " times") && end_ok(i + n + 6) {
            return Some((n + 6, "<n> times"));
        }
        if m.durations
            && let Some(len) = duration_len(b, i, n)
        {
            return Some((len, "<dur>"));
        }
        if m.durations
            && let Some(len) = rate_len(b, i, n)
        {
            return Some((len, "<rate>"));
        }
        // A notebook's execution count: `In [7]:`, `Out[7]:`, `Cell In[7], line 3`.
        if m.counters && i >= 1 && b[i - 1] == b'[' && b.get(i + n) == Some(&b']') {
            let head = &b[..i - 1];
            let head = head.strip_suffix(b" ").unwrap_or(head);
            for w in ["In", "Out"] {
                if head.ends_with(w.as_bytes())
                    && (head.len() == w.len() || !is_word(head[head.len() - w.len() - 1]))
                {
                    return Some((n, "<n>"));
                }
            }
        }
        // A program's pid in a log line's tag: `app[2211]:`.
        if m.pids
            && i >= 2
            && b[i - 1] == b'['
            && is_word(b[i - 2])
            && b.get(i + n) == Some(&b']')
            && b.get(i + n + 1) == Some(&b':')
        {
            return Some((n, "<pid>"));
        }
        // An ephemeral port after a host: `127.0.0.1:54321`, `localhost:61234`.
        if m.ids
            && n == 5
            && i >= 2
            && b[i - 1] == b':'
            && local_host_before(&b[..i - 1])
            && end_ok(i + n)
            && std::str::from_utf8(&b[i..i + n])
                .ok()
                .and_then(|t| t.parse::<u32>().ok())
                .is_some_and(|p| (32768..=65535).contains(&p))
        {
            return Some((n, "<port>"));
        }
        if m.ids && volatile_key_before(b, i) {
            let mut j = i + n;
            if b.get(j) == Some(&b'.') && digits(b, j + 1) > 0 {
                j += 1 + digits(b, j + 1);
            }
            if end_ok(j) {
                return Some((j - i, "<n>"));
            }
        }
    }
    if m.uuids && c.is_ascii_hexdigit() && b.get(i + 8) == Some(&b'-') && uuid_at(b, i) {
        return Some((36, "<uuid>"));
    }
    if m.hex_ids && c.is_ascii_hexdigit() {
        let mut start = i;
        if c == b'0' && matches!(b.get(i + 1), Some(b'x' | b'X')) {
            start = i + 2;
        }
        let n = hexes(b, start);
        if n >= 8 && end_ok(start + n) {
            return Some((start - i + n, "<hex>"));
        }
    }
    if m.pids && matches!(c, b'p' | b'P' | b't' | b'T') {
        for word in ["pid", "pgid", "ppid", "tid"] {
            if !starts_ci(b, i, word) {
                continue;
            }
            let mut j = i + word.len();
            while j < b.len() && matches!(b[j], b' ' | b':' | b'=' | b'#') {
                j += 1;
            }
            let n = digits(b, j);
            if n > 0 && j > i + word.len() && end_ok(j + n) {
                return Some((j + n - i, "pid <n>"));
            }
        }
    }
    if m.ids
        && let Some(len) = id_len(b, i)
    {
        return Some((len, "<id>"));
    }
    // The counter words start with one of these letters.
    if m.counters && matches!(c | 0x20, b'a' | b'r' | b't' | b'i' | b'b') {
        for (word, rep) in [
            ("attempt", "attempt <n>"),
            ("retry", "retry <n>"),
            ("try", "try <n>"),
            ("iteration", "iteration <n>"),
            ("round", "round <n>"),
            ("revision", "revision <n>"),
            ("build", "build <n>"),
            ("run", "run <n>"),
        ] {
            if starts_ci(b, i, word) {
                let mut j = i + word.len();
                while j < b.len() && matches!(b[j], b' ' | b'#' | b':' | b'=') {
                    j += 1;
                }
                let n = digits(b, j);
                if n > 0 && j > i + word.len() && end_ok(j + n) {
                    return Some((j + n - i, rep));
                }
            }
        }
    }
    None
}

/// Key names (or their last `_` part) whose numeric values are ids, times and timings.
const VOLATILE_KEYS: &[&str] = &[
    "id",
    "ms",
    "ns",
    "us",
    "took",
    "elapsed",
    "duration",
    "latency",
    "time",
    "timestamp",
    "ts",
    "at",
    "seq",
    "nonce",
    "pid",
    "epoch",
    "seconds",
    "secs",
    "sec",
    "millis",
    "seed",
];

/// The number at `i` is the value of a key such as `"took_ms": 132`, `request_id=88`,
/// `"messageId": 7`.
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
    VOLATILE_KEYS
        .iter()
        .any(|k| last.eq_ignore_ascii_case(k.as_bytes()) || key.eq_ignore_ascii_case(k.as_bytes()))
}

/// An opaque id at `i`: a token of letters, digits, `_` and `-` of 6 or more bytes with at
/// least 2 digits and 2 letters (`msg_01H8XK2`, `om_x100b8f3`, `req-7f3a9c`), not a plain word
/// or number.
fn id_len(b: &[u8], i: usize) -> Option<usize> {
    // One pass: the token's length, its digits and letters, and whether a letter precedes a
    // digit (a number with a unit, `1200px`, is not an id).
    let (mut n, mut digits, mut letters, mut mixed) = (0usize, 0u32, 0u32, false);
    let mut trailing_dashes = 0usize;
    for &c in &b[i..] {
        if c.is_ascii_digit() {
            digits += 1;
            mixed |= letters > 0;
            trailing_dashes = 0;
        } else if c.is_ascii_alphabetic() {
            letters += 1;
            trailing_dashes = 0;
        } else if c == b'_' {
            trailing_dashes = 0;
        } else if c == b'-' {
            trailing_dashes += 1;
        } else {
            break;
        }
        n += 1;
    }
    // A trailing `-` belongs to the text around it.
    let n = n - trailing_dashes;
    (n >= 6 && digits >= 2 && letters >= 2 && mixed).then_some(n)
}

fn timestamp_len(b: &[u8], i: usize, n: usize) -> Option<usize> {
    let d2 = |j: usize| digits(b, j) == 2;
    // 2024-01-02[T ]12:34:56[.123][Z|+01:00]
    if n == 4
        && matches!(b.get(i + 4), Some(b'-' | b'/'))
        && d2(i + 5)
        && b.get(i + 7) == b.get(i + 4)
        && d2(i + 8)
    {
        let mut j = i + 10;
        if matches!(b.get(j), Some(b'T' | b' '))
            && digits(b, j + 1) == 2
            && b.get(j + 3) == Some(&b':')
        {
            j = time_end(b, j + 1);
        }
        return Some(j - i);
    }
    // 12:34:56[.123]
    if (1..=2).contains(&n)
        && b.get(i + n) == Some(&b':')
        && d2(i + n + 1)
        && b.get(i + n + 3) == Some(&b':')
    {
        return Some(time_end(b, i) - i);
    }
    // 01:23<00:45: a progress bar's elapsed and remaining minutes and seconds
    if (1..=2).contains(&n)
        && b.get(i + n) == Some(&b':')
        && d2(i + n + 1)
        && (b.get(i + n + 3) == Some(&b'<') || (i > 0 && b[i - 1] == b'<'))
    {
        return Some(time_end(b, i) - i);
    }
    // 01:02.345: minutes, seconds and their fraction (a test run's time)
    if (1..=2).contains(&n)
        && b.get(i + n) == Some(&b':')
        && d2(i + n + 1)
        && b.get(i + n + 3) == Some(&b'.')
        && digits(b, i + n + 4) > 0
    {
        return Some(time_end(b, i) - i);
    }
    None
}

/// End of `hh:mm[:ss[.frac]][Z|±hh[:]mm]` starting at `j`.
fn time_end(b: &[u8], j: usize) -> usize {
    let mut j = j + digits(b, j);
    while b.get(j) == Some(&b':') && digits(b, j + 1) == 2 {
        j += 3;
    }
    if matches!(b.get(j), Some(b'.' | b',')) && digits(b, j + 1) > 0 {
        j += 1 + digits(b, j + 1);
    }
    match b.get(j) {
        Some(b'Z') => j + 1,
        Some(b'+' | b'-') if digits(b, j + 1) == 2 => {
            let mut k = j + 3;
            if b.get(k) == Some(&b':') {
                k += 1;
            }
            if digits(b, k) == 2 { k + 2 } else { j + 3 }
        }
        _ => j,
    }
}

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
    j >= b.len() || !is_word(b[j])
}

fn duration_len(b: &[u8], i: usize, n: usize) -> Option<usize> {
    let mut j = i + n;
    if b.get(j) == Some(&b'.') && digits(b, j + 1) > 0 {
        j += 1 + digits(b, j + 1);
    }
    // A unit starts with a letter (or `µ`), directly or after one space.
    if !b
        .get(j)
        .is_some_and(|&u| u.is_ascii_alphabetic() || u == b' ' || u == 0xc2)
    {
        return None;
    }
    let end_ok = |k: usize| k >= b.len() || !is_word(b[k]);
    // Units that may also follow one space.
    const SPACED: &[&str] = &[
        "ms",
        "sec",
        "secs",
        "second",
        "seconds",
        "min",
        "mins",
        "minute",
        "minutes",
        "milliseconds",
        "hr",
        "hrs",
        "hour",
        "hours",
        "day",
        "days",
        "week",
        "weeks",
    ];
    let mut best = None;
    if b[j..].starts_with("µs".as_bytes()) && end_ok(j + "µs".len()) {
        best = Some(j + "µs".len());
    }
    // Units that follow directly, each ending the word or followed by the next amount and
    // unit (`1h2m3.5s`, `4m55s`).
    for u in TIGHT {
        if b[j..].starts_with(u.as_bytes()) {
            let e = j + u.len();
            if end_ok(e) {
                best = best.max(Some(e));
            } else if let Some(e) = tight_groups(b, e) {
                best = best.max(Some(e));
            }
        }
    }
    if b.get(j) == Some(&b' ') {
        for u in SPACED {
            if b[j + 1..].starts_with(u.as_bytes()) && end_ok(j + 1 + u.len()) {
                best = best.max(Some(j + 1 + u.len()));
            }
        }
        // Seconds after a space (`Time: 2.345 s, estimated 3 s`).
        if b[j + 1..].starts_with(b"s") && end_ok(j + 2) {
            best = best.max(Some(j + 2));
        }
    }
    best.map(|e| e - i)
}

/// A rate: an amount, maybe one space, a unit of data or of work, `/s`, ending a word
/// (`12.3 MB/s`, `9.52it/s`).
fn rate_len(b: &[u8], i: usize, n: usize) -> Option<usize> {
    let mut j = i + n;
    if b.get(j) == Some(&b'.') && digits(b, j + 1) > 0 {
        j += 1 + digits(b, j + 1);
    }
    if b.get(j) == Some(&b' ') {
        j += 1;
    }
    let end = j + b[j.min(b.len())..]
        .iter()
        .take_while(|&&c| is_word(c))
        .count();
    let unit = std::str::from_utf8(&b[j.min(b.len())..end]).ok()?;
    let rest = &b[end..];
    (RATE_UNITS.contains(&unit)
        && rest.starts_with(b"/s")
        && rest.get(2).is_none_or(|&c| !is_word(c)))
    .then_some(end + 2 - i)
}

/// The units of data and of work a rate counts per second.
const RATE_UNITS: &[&str] = &[
    "B", "kB", "KB", "MB", "GB", "TB", "KiB", "MiB", "GiB", "TiB", "kb", "Kb", "Mb", "Gb", "bit",
    "kbit", "Mbit", "Gbit", "it",
];

/// Units that follow an amount directly (`µs` apart: it ends a duration).
const TIGHT: &[&str] = &[
    "ms", "us", "ns", "s", "m", "h", "d", "hr", "hrs", "sec", "secs", "min", "mins",
];

/// The end of one or more `amount unit` groups (tight units) at `k`, the last ending a word.
fn tight_groups(b: &[u8], k: usize) -> Option<usize> {
    let n = digits(b, k);
    if n == 0 {
        return None;
    }
    let mut j = k + n;
    if b.get(j) == Some(&b'.') && digits(b, j + 1) > 0 {
        j += 1 + digits(b, j + 1);
    }
    let end_ok = |e: usize| e >= b.len() || !is_word(b[e]);
    TIGHT
        .iter()
        .filter(|u| b[j.min(b.len())..].starts_with(u.as_bytes()))
        .filter_map(|u| {
            let e = j + u.len();
            if end_ok(e) {
                Some(e)
            } else {
                tight_groups(b, e)
            }
        })
        .max()
}

/// The sketch a byte at a time, as plainly as it can be written: the specification of
/// [`super::sketch`].
pub(super) fn sketch_plain(text: &str) -> Option<u64> {
    const EMPTY: u64 = u64::MAX;
    let mut mins = [EMPTY; 64];
    let mut words = 0u32;
    let mut prev = 0u64;
    let mut cur = 0u64;
    let mut in_word = false;
    let mut in_digits = false;
    let mut add = |prev: u64, word: u64| {
        let f = crate::hash::mix(prev, word);
        let bin = (f >> 58) as usize;
        if let Some(m) = mins.get_mut(bin) {
            *m = (*m).min(f & ((1 << 58) - 1));
        }
    };
    for &b in text.as_bytes() {
        let word_byte = b.is_ascii_alphanumeric() || b == b'_' || b >= 0x80;
        if word_byte {
            if !in_word {
                in_word = true;
                in_digits = false;
                cur = 0xcbf2_9ce4_8422_2325;
            }
            let digit = b.is_ascii_digit();
            if digit && in_digits {
                continue;
            }
            in_digits = digit;
            let v = if digit { b'0' } else { b.to_ascii_lowercase() };
            cur = (cur ^ u64::from(v)).wrapping_mul(0x0100_0000_01b3);
        } else if in_word {
            in_word = false;
            add(prev, cur);
            prev = cur;
            words += 1;
            if words >= super::sketch::SKETCH_MAX_WORDS {
                break;
            }
        }
    }
    if in_word && words < super::sketch::SKETCH_MAX_WORDS {
        add(prev, cur);
        words += 1;
    }
    if words < super::sketch::SKETCH_MIN_WORDS {
        return None;
    }
    let mut out = 0u64;
    for bit in 0..64 {
        let (distance, min) = (0..64u64)
            .find_map(|d| {
                let m = mins[(bit + d as usize) % 64];
                (m != EMPTY).then_some((d, m))
            })
            .unwrap_or((0, 0));
        out |= (crate::hash::mix(min, distance) & 1) << bit;
    }
    Some(out)
}

/// A result's outcome computed plainly: masked by [`mask_trying_every_byte`] into a string,
/// sketched by [`sketch_plain`].
pub(super) fn outcome_plain(rules: &ResultRules, r: &ToolResult<'_>) -> Outcome {
    let buf = &mut String::new();
    let out = r.output;
    let max = rules.max_bytes;
    if out.len() > 2 * max {
        let mut head = max;
        while !out.is_char_boundary(head) {
            head -= 1;
        }
        let mut tail = out.len() - max;
        while !out.is_char_boundary(tail) {
            tail += 1;
        }
        buf.push_str(&mask_trying_every_byte(&rules.maskers, &out[..head]));
        buf.push_str("\n<…>\n");
        buf.push_str(&mask_trying_every_byte(&rules.maskers, &out[tail..]));
    } else {
        buf.push_str(&mask_trying_every_byte(&rules.maskers, out));
    }
    for (re, rep) in &rules.patterns {
        if let std::borrow::Cow::Owned(s) = re.replace_all(buf, rep.as_str()) {
            *buf = s;
        }
    }
    let masked = buf.trim();
    let error = r.is_error
        || match r.exit_code {
            Some(code) => code != 0,
            None => {
                let mut head = masked.len().min(512);
                while !masked.is_char_boundary(head) {
                    head -= 1;
                }
                let head = &masked[..head];
                let mut tail = r.output.len().saturating_sub(512);
                while !r.output.is_char_boundary(tail) {
                    tail += 1;
                }
                let tail = &r.output[tail..];
                rules.errors.iter().any(|re| re.is_match(head))
                    || rules.error_tails.iter().any(|re| re.is_match(tail))
            }
        };
    // A failure is known by its signature, its first and last lines and, when neither names
    // an error, the first line between them that does: the same error for different attempts
    // (other content, other arguments echoed in between) is the same outcome. Its sketch is
    // keyed by that named line.
    let (digest, named_key, syntax) = if error {
        let lines: Vec<&str> = masked
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !super::is_label_line(l))
            .collect();
        let first = lines.first().copied().unwrap_or("");
        let last = if lines.len() > 1 {
            lines[lines.len() - 1]
        } else {
            ""
        };
        let middle = lines
            .get(1..lines.len().saturating_sub(1))
            .unwrap_or_default();
        let named = if super::names_error(first) || super::names_error(last) {
            None
        } else {
            middle
                .iter()
                .take(super::SIGNATURE_SCAN_LINES)
                .find(|l| super::names_error(l))
        };
        let ending = if last.is_empty() { first } else { last };
        // A syntax error is known by its type alone in the second digest.
        let syntax_kind = |line: &str| {
            let at = exception_plain(line)?;
            let kind = line[at..].split(':').next().unwrap_or("").trim_end();
            ["SyntaxError", "IndentationError", "TabError"]
                .iter()
                .any(|t| kind == *t || kind.ends_with(&format!(".{t}")))
                .then(|| kind.to_owned())
        };
        let sign = |syntax: bool| {
            let mut h = StreamHasher::new();
            if syntax {
                let file = masked
                    .rfind("File \"")
                    .map(|at| &masked[at + 6..])
                    .map_or("", |rest| rest.split(['"', '\n']).next().unwrap_or(""));
                h.bytes(file.as_bytes());
                h.byte(0);
            }
            if let Some(at) = exception_plain(ending) {
                h.byte(3);
                match syntax.then(|| syntax_kind(ending)).flatten() {
                    Some(kind) => h.bytes(kind.as_bytes()),
                    None => signature_line(&mut h, &ending.as_bytes()[at..]),
                }
            } else {
                h.byte(1);
                signature_line(&mut h, first.as_bytes());
                h.byte(b'\n');
                signature_line(&mut h, last.as_bytes());
            }
            if let Some(named) = named {
                let kind = syntax.then(|| syntax_kind(named)).flatten();
                h.byte(b'\n');
                signature_line(&mut h, kind.as_deref().unwrap_or(named).as_bytes());
            }
            h.finish()
        };
        let mut named_key = 0;
        if let Some(named) = named {
            let mut k = StreamHasher::new();
            k.byte(2);
            signature_line(&mut k, named.as_bytes());
            named_key = k.finish();
        }
        let syntax = (syntax_kind(ending).is_some() && exception_plain(ending).is_some()
            || named.is_some_and(|n| syntax_kind(n).is_some()))
        .then(|| sign(true));
        (sign(false), named_key, syntax)
    } else {
        (digest_folding_ends(super::without_id_ends(masked)), 0, None)
    };
    let empty = (error && super::says_nothing(masked))
        || (masked.len() <= super::EMPTY_MAX_BYTES
            && rules.empty.iter().any(|re| re.is_match(buf)));
    Outcome {
        // Every successful answer that found nothing is one outcome.
        digest: if empty && !error {
            super::EMPTY_DIGEST
        } else {
            digest
        },
        sketch: if error {
            sketch_plain(masked).map(|s| s ^ named_key)
        } else {
            None
        },
        long: sketch_plain(masked).is_some(),
        error,
        empty,
        retryable: error && super::retryable(&rules.retryable, masked),
        echo: false,
        syntax,
    }
}

/// Where the last exception thrown in `line` starts, written plainly: a word of `Error` or
/// `Exception` after a letter, then `:` or the line's end, with the letters, digits, `_` and `.`
/// before it.
fn exception_plain(line: &str) -> Option<usize> {
    if line.len() > 1000 {
        return None;
    }
    let b = line.as_bytes();
    let mut found = None;
    for end in 0..=b.len() {
        if end < b.len() && b[end] != b':' {
            continue;
        }
        for suffix in ["Error", "Exception"] {
            let Some(at) = end.checked_sub(suffix.len()) else {
                continue;
            };
            if at == 0 || &b[at..end] != suffix.as_bytes() || !b[at - 1].is_ascii_alphabetic() {
                continue;
            }
            let mut start = at;
            while start > 0
                && (b[start - 1].is_ascii_alphanumeric()
                    || b[start - 1] == b'_'
                    || b[start - 1] == b'.')
            {
                start -= 1;
            }
            found = Some(start);
        }
    }
    found
}

/// Hashes a line of an error with its quoted parts as `<q>`: an error that echoes what it was
/// given (`old_str \`x\` did not appear`, `No order with id 'ORD-1'`) is the same error for
/// other input. An apostrophe inside a word (`doesn't`) is not a quote. A quoted token of
/// syntax (three bytes at most, punctuation other than `_` and spaces, one punctuation at
/// least: `']'`, `':'`) is kept as written, its quotes with it.
fn signature_line(h: &mut StreamHasher, line: &[u8]) {
    let mut out = Vec::new();
    let mut i = 0;
    while i < line.len() {
        let q = line[i];
        let opens =
            matches!(q, b'\'' | b'"' | b'`') && (i == 0 || !line[i - 1].is_ascii_alphanumeric());
        let close = line[i + 1..].iter().take(200).position(|&c| c == q);
        if let (true, Some(len)) = (opens, close) {
            let quoted = &line[i + 1..i + 1 + len];
            let punct = |c: &u8| c.is_ascii_punctuation() && *c != b'_';
            let syntax = quoted.len() <= 3
                && quoted.iter().all(|c| punct(c) || *c == b' ')
                && quoted.iter().any(punct);
            if syntax {
                out.extend_from_slice(&line[i..i + len + 2]);
            } else {
                out.extend_from_slice(b"<q>");
            }
            i += len + 2;
            continue;
        }
        out.push(q);
        i += 1;
    }
    h.bytes(&out);
}

/// Results with this many lines or more have their first and last lines compared with every
/// run of digits folded into one: a harness wraps output in a header or footer of counters and
/// timings (`[exec #7 exit=0 elapsed=0.01s]`, `read 3× this session · 0.4 ms`) that is noise,
/// while the numbers inside the output are its news.
const FOLD_ENDS_LINES: usize = 6;

/// The digest of a masked, trimmed result (see [`FOLD_ENDS_LINES`]).
fn digest_folding_ends(masked: &str) -> u64 {
    let bytes = masked.as_bytes();
    let newlines = bytes
        .iter()
        .filter(|&&b| b == b'\n')
        .take(FOLD_ENDS_LINES - 1)
        .count();
    if newlines + 1 < FOLD_ENDS_LINES {
        return hash_bytes(0, bytes);
    }
    let first_end = masked.find('\n').unwrap_or(masked.len());
    let last_start = masked.rfind('\n').map_or(0, |i| i + 1).max(first_end);
    let mut h = StreamHasher::new();
    fold_digits(&mut h, &bytes[..first_end]);
    h.bytes(&bytes[first_end..last_start]);
    fold_digits(&mut h, &bytes[last_start..]);
    h.finish()
}

/// Hashes `text` with each run of ASCII digits as one `0`.
fn fold_digits(h: &mut StreamHasher, text: &[u8]) {
    let mut from = 0;
    let mut i = 0;
    while i < text.len() {
        if text[i].is_ascii_digit() {
            h.bytes(&text[from..i]);
            h.byte(b'0');
            while i < text.len() && text[i].is_ascii_digit() {
                i += 1;
            }
            from = i;
        } else {
            i += 1;
        }
    }
    h.bytes(&text[from..]);
}
