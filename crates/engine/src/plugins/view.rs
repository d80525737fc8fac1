//! What a plugin is shown of an event: arguments as compact canonical JSON and the window as
//! fingerprints, written into per-thread buffers so that nothing is allocated in steady state.

use std::cell::Cell;
use std::fmt::Write;

use loopguard_plugin_host::abi::{WindowRecord, window_flags};
use serde_json::Value;

use crate::detect::{Record, Window, flag};
use crate::fingerprint::KeySet;

/// Nesting beyond this depth is written as `null` (serde_json parses at most 128 levels).
const MAX_DEPTH: usize = 128;

/// Buffers reused across events, so showing plugins an event allocates nothing in steady
/// state.
#[derive(Debug, Default)]
pub(super) struct Scratch {
    pub(super) args: String,
    pub(super) window: Vec<WindowRecord>,
}

thread_local! {
    static SCRATCH: Cell<Scratch> = const {
        Cell::new(Scratch {
            args: String::new(),
            window: Vec::new(),
        })
    };
}

/// Runs `f` with this thread's scratch buffers (fresh ones if they are in use or gone).
pub(super) fn with_scratch<T>(f: impl FnOnce(&mut Scratch) -> T) -> T {
    let mut s = SCRATCH.try_with(Cell::take).unwrap_or_default();
    let out = f(&mut s);
    let _ = SCRATCH.try_with(|c| c.set(s));
    out
}

/// Arguments as compact JSON: keys sorted (serde_json's maps are ordered), volatile keys
/// dropped at every level.
pub(super) fn canonical<'b>(buf: &'b mut String, v: &Value, volatile: &KeySet) -> &'b str {
    buf.clear();
    write_json(buf, v, volatile, 0);
    buf
}

/// The live window as fingerprints, oldest first, without the newest `skip` records.
pub(super) fn window<'b>(
    buf: &'b mut Vec<WindowRecord>,
    w: &Window<'_>,
    skip: usize,
) -> &'b [WindowRecord] {
    // Oldest first, the filled records are `older` then `newer`; the live ones are the last
    // `w.len()` of them.
    let (newer, older) = w.parts();
    let total = older.len() + newer.len();
    let from = total.saturating_sub(w.len());
    let to = total.saturating_sub(skip).max(from);
    let o = older
        .get(from.min(older.len())..to.min(older.len()))
        .unwrap_or_default();
    let n = newer
        .get(from.saturating_sub(older.len())..to.saturating_sub(older.len()))
        .unwrap_or_default();
    buf.clear();
    buf.extend(o.iter().map(record));
    buf.extend(n.iter().map(record));
    buf
}

fn record(r: &Record) -> WindowRecord {
    let mut flags = 0;
    if r.has(flag::RESULT) && !r.has(flag::BLOCKED) {
        flags |= window_flags::HAS_RESULT;
        if r.has(flag::ERROR) {
            flags |= window_flags::IS_ERROR;
        }
    }
    WindowRecord {
        exact: u64::from(r.exact),
        fuzzy: u64::from(r.fuzzy),
        result_digest: u64::from(r.digest),
        flags,
        reserved: 0,
    }
}

fn write_json(out: &mut String, v: &Value, volatile: &KeySet, depth: usize) {
    match v {
        _ if depth >= MAX_DEPTH => out.push_str("null"),
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        // serde_json prints numbers as it serializes them (itoa, ryu).
        Value::Number(n) => {
            let _ = write!(out, "{n}");
        }
        Value::String(text) => write_str(out, text),
        Value::Array(items) => {
            out.push('[');
            for (i, x) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_json(out, x, volatile, depth + 1);
            }
            out.push(']');
        }
        Value::Object(map) => {
            out.push('{');
            let mut first = true;
            for (k, x) in map {
                if volatile.contains(k) {
                    continue;
                }
                if !first {
                    out.push(',');
                }
                first = false;
                write_str(out, k);
                out.push(':');
                write_json(out, x, volatile, depth + 1);
            }
            out.push('}');
        }
    }
}

/// Whether a string may need escaping in JSON (a control character, `"` or `\\`), eight
/// bytes at a time; a false alarm only costs the slow path.
fn may_need_escape(s: &[u8]) -> bool {
    const LO: u64 = 0x0101_0101_0101_0101;
    const HI: u64 = 0x8080_8080_8080_8080;
    let has_zero = |x: u64| x.wrapping_sub(LO) & !x & HI != 0;
    let mut chunks = s.chunks_exact(8);
    for c in &mut chunks {
        let Ok(bytes) = <[u8; 8]>::try_from(c) else {
            return true;
        };
        let x = u64::from_le_bytes(bytes);
        // Bytes below 0x20 (ASCII only; UTF-8 continuation bytes have the high bit set).
        let control = x.wrapping_sub(0x20 * LO) & !x & HI != 0;
        if control || has_zero(x ^ (u64::from(b'"') * LO)) || has_zero(x ^ (u64::from(b'\\') * LO))
        {
            return true;
        }
    }
    chunks
        .remainder()
        .iter()
        .any(|&b| b < 0x20 || b == b'"' || b == b'\\')
}

/// A JSON string, escaped as serde_json escapes it.
fn write_str(out: &mut String, s: &str) {
    out.reserve(s.len() + 2);
    out.push('"');
    if !may_need_escape(s.as_bytes()) {
        out.push_str(s);
    } else {
        let mut from = 0;
        for (i, b) in s.bytes().enumerate() {
            let escaped = match b {
                b'"' => "\\\"",
                b'\\' => "\\\\",
                b'\n' => "\\n",
                b'\r' => "\\r",
                b'\t' => "\\t",
                0x08 => "\\b",
                0x0c => "\\f",
                0..0x20 => "",
                _ => continue,
            };
            out.push_str(s.get(from..i).unwrap_or_default());
            if escaped.is_empty() {
                let _ = write!(out, "\\u{b:04x}");
            } else {
                out.push_str(escaped);
            }
            from = i + 1;
        }
        out.push_str(s.get(from..).unwrap_or_default());
    }
    out.push('"');
}
