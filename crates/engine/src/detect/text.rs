//! Detectors on assistant text: monologue (turns without a tool call), text_repeat (the same
//! turn again) and chanting (a unit repeated within one message, found while it streams).

use std::collections::HashMap;
use std::hash::BuildHasherDefault;

use loopguard_rules::config::Chanting;

use crate::fingerprint::plain;
use crate::hash::{MapHasher, StreamHasher};

/// Digests of the most recent turns kept per session.
pub const TURNS: usize = 8;

/// A whole turn's normalized text (whitespace collapsed, case folded), hashed while it streams.
#[derive(Clone, Copy, Debug, Default)]
pub struct TurnText {
    h: StreamHasher,
    chars: u32,
    space: bool,
    /// The last byte hashed was a digit (a run of digits is hashed as one `0`).
    digit: bool,
}

impl TurnText {
    pub fn feed(&mut self, s: &str) {
        // The normalized text goes to the hasher a block at a time.
        let mut out = Block::default();
        let mut rest = s;
        while let Some(&first) = rest.as_bytes().first() {
            if first.is_ascii() {
                // A run of ASCII: whitespace, or a word.
                if is_ascii_space(first) {
                    self.space = self.chars > 0;
                    rest = rest.get(1..).unwrap_or("");
                    continue;
                }
                self.separate(&mut out);
                let run = rest
                    .bytes()
                    .position(|b| !b.is_ascii() || is_ascii_space(b))
                    .unwrap_or(rest.len());
                let (word, tail) = rest.split_at(run);
                self.digit = out.extend_folded(&mut self.h, word.as_bytes(), self.digit);
                self.chars = self
                    .chars
                    .saturating_add(u32::try_from(run).unwrap_or(u32::MAX));
                rest = tail;
                continue;
            }
            let Some(ch) = rest.chars().next() else {
                break;
            };
            rest = rest.get(ch.len_utf8()..).unwrap_or("");
            if ch.is_whitespace() {
                self.space = self.chars > 0;
                continue;
            }
            self.separate(&mut out);
            self.digit = false;
            let mut b = [0u8; 4];
            for lc in ch.to_lowercase() {
                for &x in lc.encode_utf8(&mut b).as_bytes() {
                    out.push(&mut self.h, x);
                }
            }
            self.chars = self.chars.saturating_add(1);
        }
        out.flush(&mut self.h);
    }

    /// The single space a run of whitespace between two words becomes.
    fn separate(&mut self, out: &mut Block) {
        if self.space {
            self.digit = false;
            out.push(&mut self.h, b' ');
            self.chars = self.chars.saturating_add(1);
            self.space = false;
        }
    }

    /// The turn's digest and length in characters; starts a new turn.
    pub fn take(&mut self) -> (u64, u32) {
        let out = (self.h.finish(), self.chars);
        *self = TurnText::default();
        out
    }
}

/// A session's text state, allocated when its first text arrives (sessions that only call
/// tools keep none): the turn being hashed, the digests of recent turns, the monologue count and
/// the chanting detector's state for the message being written.
#[derive(Debug, Default)]
pub struct TextState {
    pub turn: TurnText,
    /// Digests of the most recent turns, a ring of `turns_len` entries.
    pub turns: [u64; TURNS],
    pub turns_len: usize,
    pub turns_next: usize,
    /// Turns seen; never reset, so each turn is a distinct escalation occasion.
    pub turn_no: u64,
    /// Consecutive turns without a tool call.
    pub monologue: u32,
    /// The digest of the last automated reply to a turn without a tool call, and how many such
    /// replies in a row were the same.
    pub reply: u64,
    pub same_replies: u32,
    /// The turns without a tool call that the last message taken for a person's ended (0 once
    /// a call or another message came): restored when the same words come again and so turn
    /// out to be the host's.
    pub ended_by_person: u32,
    /// Dropped when a message ends, so idle sessions keep no text buffers.
    pub chant: Option<Box<Chant>>,
}

impl TextState {
    /// A call or a user message ends the turn being written; it was not a monologue.
    pub fn end_turn(&mut self) {
        self.monologue = 0;
        self.same_replies = 0;
        self.ended_by_person = 0;
        self.turn = TurnText::default();
        self.chant = None;
    }

    /// Forgets the digests of recent turns.
    pub fn forget_turns(&mut self) {
        self.turns_len = 0;
        self.turns_next = 0;
    }

    /// Heap bytes held besides the state itself.
    pub fn heap_bytes(&self) -> usize {
        self.chant
            .as_ref()
            .map_or(0, |_| std::mem::size_of::<Chant>())
    }
}

/// Bytes on their way to a hasher, a block at a time.
struct Block {
    buf: [u8; 128],
    len: usize,
}

impl Default for Block {
    fn default() -> Block {
        Block {
            buf: [0; 128],
            len: 0,
        }
    }
}

impl Block {
    #[inline]
    fn push(&mut self, h: &mut StreamHasher, b: u8) {
        if self.len == self.buf.len() {
            self.flush(h);
        }
        if let Some(slot) = self.buf.get_mut(self.len) {
            *slot = b;
            self.len += 1;
        }
    }

    /// Pushes ASCII bytes, lowercased, each run of digits as one `0` (a counter in an
    /// otherwise identical turn does not make it new).
    /// `digit`: the byte before `bytes` was a digit. Returns whether the last one is.
    fn extend_folded(&mut self, h: &mut StreamHasher, mut bytes: &[u8], mut digit: bool) -> bool {
        if !bytes.iter().any(u8::is_ascii_digit) {
            self.extend_lowercase(h, bytes);
            return false;
        }
        while !bytes.is_empty() {
            let n = bytes
                .iter()
                .position(u8::is_ascii_digit)
                .unwrap_or(bytes.len());
            if n > 0 {
                self.extend_lowercase(h, &bytes[..n]);
                digit = false;
            }
            let d = bytes[n..].iter().take_while(|b| b.is_ascii_digit()).count();
            if d > 0 && !digit {
                self.push(h, b'0');
            }
            digit |= d > 0;
            bytes = &bytes[n + d..];
        }
        digit
    }

    /// Pushes ASCII bytes, lowercased.
    fn extend_lowercase(&mut self, h: &mut StreamHasher, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            if self.len == self.buf.len() {
                self.flush(h);
            }
            let room = self.buf.get_mut(self.len..).unwrap_or_default();
            let n = room.len().min(bytes.len());
            let (now, later) = bytes.split_at(n);
            for (o, &b) in room.iter_mut().zip(now) {
                *o = b.to_ascii_lowercase();
            }
            self.len += n;
            bytes = later;
        }
    }

    fn flush(&mut self, h: &mut StreamHasher) {
        h.bytes(self.buf.get(..self.len).unwrap_or_default());
        self.len = 0;
    }
}

/// `char::is_whitespace` for an ASCII byte.
fn is_ascii_space(b: u8) -> bool {
    matches!(b, b'\t'..=b'\r' | b' ')
}

type Counts = HashMap<u64, u32, BuildHasherDefault<MapHasher>>;

/// Per-message state of the chanting detector. Complete lines are processed once, as they
/// arrive; only the unfinished line is buffered.
#[derive(Debug, Default)]
pub struct Chant {
    line: String,
    scanned: usize,
    fence: bool,
    /// Short units repeated back to back, found on the raw text outside code fences.
    periodic: Periodic,
    para: StreamHasher,
    para_chars: usize,
    para_lines: u32,
    /// Within the unfinished line: sentences up to here were counted, bytes up to `scan` scanned.
    sent_pos: usize,
    scan: usize,
    /// Within the unfinished line: bytes of leading whitespace found so far (all of it while
    /// the line is blank), so each chunk trims only what it added.
    lead: usize,
    sentences: u32,
    counts: Counts,
    best: (u64, u32),
    fired: bool,
}

/// The longest unit [`Periodic`] looks for, in bytes.
const MAX_PERIOD: usize = 64;
/// The shortest stretch of text [`Periodic`] reports: a unit of a few characters repeated a
/// handful of times is ordinary text ("ha ha ha", "1, 2, 1, 2").
const MIN_PERIODIC_SPAN: usize = 128;
/// Text [`Periodic`] keeps at least: enough for the longest unit repeated 5 times.
const PERIODIC_KEEP: usize = 512;
/// [`Periodic`] looks for a repeated unit each time this many bytes arrived.
const PERIODIC_STRIDE: usize = 64;

/// Finds a short unit repeated back to back ("01234012340123…", "Thinking... Done. Thinking...
/// Done. …", the same list item line after line). Every [`PERIODIC_STRIDE`] bytes it asks, for
/// each period up to [`MAX_PERIOD`], whether the newest stretch long enough for `threshold`
/// repetitions (and at least [`MIN_PERIODIC_SPAN`] bytes) repeats with that period; in text
/// that does not, each period fails within a byte or two, so the cost is a few comparisons per
/// byte.
#[derive(Debug, Default)]
struct Periodic {
    /// The newest bytes outside code, at most `2 * PERIODIC_KEEP` (allocated at the first).
    buf: Vec<u8>,
    since_check: usize,
    /// Inside code: every ` ``` ` toggles it, wherever it stands (code repeats legitimately).
    code: bool,
    ticks: u8,
    /// Spaces at the start of the current line so far (`u8::MAX` once past them), and whether
    /// the line is indented code (four spaces or a tab).
    indent: u8,
    indented: bool,
}

impl Periodic {
    /// Feeds bytes; returns (unit digest, repetitions) for the shortest unit found repeated
    /// `threshold` times over at least [`MIN_PERIODIC_SPAN`] bytes that holds a letter or digit
    /// (dividers such as `-----` or `=-=-=-` are not chanting).
    fn feed(&mut self, bytes: &[u8], threshold: u32) -> Option<(u64, u32)> {
        let mut found = None;
        let mut rest = bytes;
        while let Some(&c) = rest.first() {
            if self.code && c != b'`' {
                // Inside code only the next backtick matters.
                let n = rest.iter().position(|&b| b == b'`').unwrap_or(rest.len());
                rest = &rest[n..];
                self.ticks = 0;
                self.indent = u8::MAX;
                continue;
            }
            if self.indent != u8::MAX || self.ticks > 0 || c == b'`' || c == b'\n' {
                rest = &rest[1..];
                self.byte(c);
                if !self.code && !self.indented {
                    self.push(&[c], threshold, &mut found);
                }
                continue;
            }
            // Plain text up to the next newline or backtick goes in as it is.
            let n = rest
                .iter()
                .position(|&b| b == b'\n' || b == b'`')
                .unwrap_or(rest.len());
            let (plain, tail) = rest.split_at(n);
            rest = tail;
            if !self.indented {
                self.push(plain, threshold, &mut found);
            }
        }
        found
    }

    /// The state a byte at a line start or a backtick changes: code fences and indentation.
    fn byte(&mut self, c: u8) {
        if c == b'`' {
            self.ticks += 1;
            if self.ticks == 3 {
                self.code = !self.code;
                self.ticks = 0;
            }
        } else {
            self.ticks = 0;
        }
        match c {
            b'\n' => {
                self.indent = 0;
                self.indented = false;
            }
            b' ' if self.indent != u8::MAX => {
                self.indent += 1;
                self.indented |= self.indent >= 4;
            }
            b'\t' if self.indent != u8::MAX => self.indented = true,
            _ => self.indent = u8::MAX,
        }
    }

    /// Appends prose, looking for a repeated unit every [`PERIODIC_STRIDE`] bytes.
    fn push(&mut self, mut text: &[u8], threshold: u32, found: &mut Option<(u64, u32)>) {
        if self.buf.capacity() == 0 {
            self.buf.reserve_exact(2 * PERIODIC_KEEP);
        }
        while !text.is_empty() {
            let take = (PERIODIC_STRIDE - self.since_check).min(text.len());
            if self.buf.len() + take > 2 * PERIODIC_KEEP {
                self.buf.drain(..PERIODIC_KEEP);
            }
            self.buf.extend_from_slice(&text[..take]);
            text = &text[take..];
            self.since_check += take;
            if self.since_check >= PERIODIC_STRIDE {
                self.since_check = 0;
                if found.is_none() {
                    *found = self.check(threshold);
                }
            }
        }
    }

    /// Starts a new message, keeping the buffer.
    fn reset(&mut self) {
        self.buf.clear();
        self.since_check = 0;
        self.code = false;
        self.ticks = 0;
        self.indent = 0;
        self.indented = false;
    }

    fn check(&self, threshold: u32) -> Option<(u64, u32)> {
        let reps = threshold.max(2) as usize;
        let n = self.buf.len();
        let last = *self.buf.last()?;
        for p in 1..=MAX_PERIOD {
            let span = (p * reps).max(MIN_PERIODIC_SPAN);
            if span > n {
                break;
            }
            // The newest byte one period back first: in most text that settles it.
            let tail = &self.buf[n - span..];
            if tail[span - 1 - p] != last || tail[..span - p] != tail[p..] {
                continue;
            }
            let unit = &self.buf[n - p..];
            if !String::from_utf8_lossy(unit)
                .chars()
                .any(char::is_alphanumeric)
            {
                continue;
            }
            // How far the repetition reaches back within what is kept.
            let mut run = span - p;
            while run + p < n && self.buf[n - 1 - run] == self.buf[n - 1 - run - p] {
                run += 1;
            }
            let mut h = StreamHasher::new();
            h.byte(b'U');
            h.bytes(unit);
            return Some((h.finish(), ((run + p) / p) as u32));
        }
        None
    }
}

const SENTENCE: u8 = b'S';
const LINE: u8 = b'L';
const PARA: u8 = b'P';

fn is_list_item(t: &str) -> bool {
    if t.starts_with("- ") || t.starts_with("* ") || t.starts_with("+ ") {
        return true;
    }
    let n = t.bytes().take_while(u8::is_ascii_digit).count();
    n > 0 && (t[n..].starts_with(". ") || t[n..].starts_with(") "))
}

/// An order-insensitive hash of a sentence's words: each word's bytes lowercased, ASCII
/// punctuation left out, hashed (FNV-1a) and summed, in one pass. `None` for fewer than four
/// words (short phrases in another order are ordinary text).
fn bag_hash(s: &str) -> Option<u64> {
    use crate::hash::{FNV_OFFSET as START, fnv1a_byte};
    let mut sum = 0u64;
    let mut words = 0u32;
    let mut h = START;
    for &b in s.as_bytes() {
        if b.is_ascii_whitespace() {
            if h != START {
                sum = sum.wrapping_add(crate::hash::fmix(h));
                words += 1;
                h = START;
            }
        } else if !b.is_ascii_punctuation() {
            h = fnv1a_byte(h, b.to_ascii_lowercase());
        }
    }
    if h != START {
        sum = sum.wrapping_add(crate::hash::fmix(h));
        words += 1;
    }
    (words >= 4).then(|| crate::hash::combine(sum, u64::from(b'B')))
}

fn unit_hash(tag: u8, s: &str) -> u64 {
    let mut h = StreamHasher::new();
    h.byte(tag);
    feed_words(&mut h, s);
    h.finish()
}

/// Feeds the words of `s` (split at Unicode whitespace), joined by single spaces; text already
/// in that form goes in as it is.
fn feed_words(h: &mut StreamHasher, s: &str) {
    if plain(s.as_bytes(), false) {
        h.bytes(s.as_bytes());
        return;
    }
    for (i, w) in s.split_whitespace().enumerate() {
        if i > 0 {
            h.byte(b' ');
        }
        h.bytes(w.as_bytes());
    }
}

impl Chant {
    /// Feeds a chunk; returns (unit digest, count) the first time a unit reaches the threshold.
    pub fn feed(&mut self, text: &str, p: &Chanting) -> Option<(u64, u32)> {
        let room = (p.max_message_chars as usize).saturating_sub(self.scanned);
        let mut take = text.len().min(room);
        while !text.is_char_boundary(take) {
            take -= 1;
        }
        self.scanned += take;
        let mut rest = &text[..take];
        while let Some(nl) = rest.find('\n') {
            let seg = &rest[..nl];
            self.periodic_feed(&rest[..=nl], p);
            if self.line.is_empty() {
                self.line_done(seg, p);
            } else {
                let mut line = std::mem::take(&mut self.line);
                line.push_str(seg);
                self.line_done(&line, p);
                line.clear();
                self.line = line;
            }
            rest = &rest[nl + 1..];
        }
        self.periodic_feed(rest, p);
        self.line.push_str(rest);
        self.partial_sentences(p);
        self.report(p)
    }

    fn periodic_feed(&mut self, text: &str, p: &Chanting) {
        if let Some((key, reps)) = self.periodic.feed(text.as_bytes(), p.threshold)
            && reps > self.best.1
        {
            self.best = (key, reps);
        }
    }

    /// Counts the finished sentences of the unfinished line, so a sentence chanted on one
    /// endless line is caught while it streams.
    fn partial_sentences(&mut self, p: &Chanting) {
        // The line only grows until it ends, so its leading whitespace is trimmed once.
        let t = match self.line.get(self.lead..) {
            Some(rest) => rest.trim_start(),
            None => self.line.trim_start(),
        };
        self.lead = self.line.len() - t.len();
        if self.fence || t.len() < 3 || Self::skipped(&self.line, t) {
            return;
        }
        let line = std::mem::take(&mut self.line);
        let b = line.as_bytes();
        let mut from = self.sent_pos;
        for i in self.scan.max(from)..b.len().saturating_sub(1) {
            if matches!(b[i], b'.' | b'!' | b'?') && b[i + 1].is_ascii_whitespace() {
                let s = line[from..=i].trim();
                if Self::fits(s, p) {
                    self.count_sentence(s);
                }
                self.sentences += 1;
                from = i + 1;
            }
        }
        self.sent_pos = from;
        self.scan = b.len().saturating_sub(1);
        self.line = line;
    }

    /// Lines that are never counted: fences, tables, headings, list items, indented code.
    fn skipped(line: &str, t: &str) -> bool {
        t.starts_with("```")
            || t.starts_with("~~~")
            || t.starts_with('|')
            || t.starts_with('#')
            || is_list_item(t)
            || line.starts_with("    ")
            || line.starts_with('\t')
    }

    /// Ends the message: the unfinished line and paragraph are counted, then the state resets.
    pub fn end(&mut self, p: &Chanting) -> Option<(u64, u32)> {
        if self.periodic.since_check > 0
            && let Some((key, reps)) = self.periodic.check(p.threshold)
            && reps > self.best.1
        {
            self.best = (key, reps);
        }
        if !self.line.is_empty() {
            let line = std::mem::take(&mut self.line);
            self.line_done(&line, p);
            self.line = line;
        }
        self.para_done(p);
        let found = self.report(p);
        self.line.clear();
        if self.line.capacity() > 4096 {
            self.line = String::new();
        }
        self.counts.clear();
        if self.counts.capacity() > 1024 {
            self.counts = Counts::default();
        }
        self.scanned = 0;
        self.sent_pos = 0;
        self.scan = 0;
        self.lead = 0;
        self.sentences = 0;
        self.fence = false;
        self.periodic.reset();
        self.best = (0, 0);
        self.fired = false;
        found
    }

    fn report(&mut self, p: &Chanting) -> Option<(u64, u32)> {
        if !self.fired && self.best.1 >= p.threshold {
            self.fired = true;
            return Some(self.best);
        }
        None
    }

    /// Counts a sentence as it is, and as a bag of words: the same sentence with its words
    /// moved around ("I will now check X." / "I will check X now.") is the same unit.
    fn count_sentence(&mut self, s: &str) {
        self.count(unit_hash(SENTENCE, s));
        if let Some(bag) = bag_hash(s) {
            self.count(bag);
        }
    }

    fn count(&mut self, key: u64) {
        let c = self.counts.entry(key).or_insert(0);
        *c += 1;
        if *c > self.best.1 {
            self.best = (key, *c);
        }
    }

    fn fits(s: &str, p: &Chanting) -> bool {
        let n = s.chars().count();
        n >= p.min_unit_chars as usize && n <= p.max_unit_chars as usize
    }

    fn line_done(&mut self, line: &str, p: &Chanting) {
        let from = std::mem::take(&mut self.sent_pos);
        let counted = std::mem::take(&mut self.sentences);
        self.scan = 0;
        self.lead = 0;
        let t = line.trim();
        if t.starts_with("```") || t.starts_with("~~~") {
            self.fence = !self.fence;
            self.para_done(p);
            return;
        }
        if self.fence || line.starts_with("    ") || line.starts_with('\t') {
            return;
        }
        if t.is_empty() || t.starts_with('|') || t.starts_with('#') || is_list_item(t) {
            self.para_done(p);
            // The same list item again and again is the same repetition written as a list.
            if is_list_item(t) && Self::fits(t, p) {
                self.count(unit_hash(LINE, t));
            }
            return;
        }
        let mut sentences = counted;
        let mut from = from;
        let b = line.as_bytes();
        let first = from;
        for i in first..b.len() {
            let end = matches!(b[i], b'.' | b'!' | b'?')
                && b.get(i + 1).is_none_or(|c| c.is_ascii_whitespace());
            if end {
                let s = line[from..=i].trim();
                if Self::fits(s, p) {
                    self.count_sentence(s);
                }
                sentences += 1;
                from = i + 1;
            }
        }
        let tail = line[from..].trim();
        if !tail.is_empty() {
            if Self::fits(tail, p) {
                self.count_sentence(tail);
            }
            sentences += 1;
        }
        if sentences > 1 && Self::fits(t, p) {
            self.count(unit_hash(LINE, t));
        }
        if self.para_lines > 0 {
            self.para.byte(b' ');
        }
        feed_words(&mut self.para, t);
        self.para_chars += t.chars().count();
        self.para_lines += 1;
    }

    fn para_done(&mut self, p: &Chanting) {
        if self.para_lines > 1
            && self.para_chars >= p.min_unit_chars as usize
            && self.para_chars <= p.max_unit_chars as usize
        {
            let mut h = self.para;
            h.byte(PARA);
            let key = h.finish();
            self.count(key);
        }
        self.para = StreamHasher::new();
        self.para_chars = 0;
        self.para_lines = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params() -> Chanting {
        Chanting {
            enabled: true,
            ladder: None,
            threshold: 5,
            min_unit_chars: 16,
            max_unit_chars: 2000,
            max_message_chars: 200_000,
        }
    }

    fn run(text: &str, chunk: usize) -> Option<(u64, u32)> {
        let p = params();
        let mut c = Chant::default();
        let mut found = None;
        let mut i = 0;
        while i < text.len() {
            let mut j = (i + chunk).min(text.len());
            while !text.is_char_boundary(j) {
                j += 1;
            }
            found = found.or(c.feed(&text[i..j], &p));
            i = j;
        }
        found.or(c.end(&p))
    }

    #[test]
    fn short_sentence_chanted() {
        let text = "I will fix the bug now. ".repeat(6);
        assert!(run(&text, 7).is_some());
        assert!(run(&text, 1000).is_some());
        assert!(run(&"I will fix the bug now.\n".repeat(6), 3).is_some());
    }

    #[test]
    fn long_paragraph_repeated() {
        let para = "Let me think about this problem carefully again because the answer \
                    depends on it, and each of these lines is part of one long paragraph\n\
                    which continues on a second line without any final punctuation mark \
                    and goes on for a while longer so that it is well over two hundred\n\n";
        assert!(para.len() > 200);
        assert!(run(&para.repeat(5), 13).is_some());
        assert!(run(&para.repeat(4), 13).is_none());
    }

    #[test]
    fn code_and_markdown_structure_are_not_chanting() {
        let mut text = String::from("Here is the table:\n\n| name | value |\n|---|---|\n");
        for i in 0..10 {
            text.push_str(&format!("| cell {i} | value {i} |\n"));
        }
        for i in 0..10 {
            text.push_str(&format!("- Added a test for case {i}\n"));
        }
        text.push_str("```\n");
        for _ in 0..10 {
            text.push_str("assert_eq!(value, expected_value);\n");
        }
        text.push_str("```\n");
        for _ in 0..10 {
            text.push_str("    let indented = code_line();\n");
        }
        for divider in ["-", "=", "━", "─", "*", "_", "=-", "+"] {
            text.push_str(&divider.repeat(80));
            text.push('\n');
        }
        text.push_str("```\n");
        text.push_str(&"0123456789abcdef".repeat(40));
        text.push_str("\n```\n");
        assert_eq!(run(&text, 11), None);
    }

    /// Short units repeated back to back: under `min_unit_chars`, still a loop.
    #[test]
    fn short_units_repeated_are_chanting() {
        for unit in [
            "01234",
            "SELEC",
            "Thinking... Done. ",
            "1, 1, ",
            "Let me read it. 好。",
        ] {
            let text = format!("Sure. {}", unit.repeat(60));
            assert!(run(&text, 7).is_some(), "{unit:?}");
        }
        // The same list item (or heading, or table row) line after line.
        for line in [
            "- the same list item text again\n",
            "## A repeated heading\n",
            "| same | row |\n",
        ] {
            assert!(run(&line.repeat(12), 5).is_some(), "{line:?}");
        }
        // A few repetitions of a short unit are ordinary text.
        assert_eq!(
            run("ha ha ha ha ha, that is funny. 1, 2, 1, 2, 1, 2.", 3),
            None
        );
    }

    #[test]
    fn scanning_stops_at_max_message_chars() {
        let p = Chanting {
            max_message_chars: 60,
            ..params()
        };
        let mut c = Chant::default();
        let text = "I will fix the bug now. ".repeat(10);
        assert_eq!(c.feed(&text, &p), None);
        assert_eq!(c.end(&p), None);
    }

    /// A line that starts with whitespace was trimmed whole on every chunk, past
    /// `max_message_chars` too (0.3 ms per 1-byte chunk): the work per chunk is now bounded by
    /// the chunk. The time bound is a sanity check for a debug build; it used to take minutes.
    #[test]
    fn a_line_of_leading_whitespace_costs_each_chunk_only_its_own_bytes() {
        let p = params();
        let mut c = Chant::default();
        let started = std::time::Instant::now();
        for _ in 0..2 * p.max_message_chars {
            assert_eq!(c.feed(" ", &p), None);
        }
        assert_eq!(c.end(&p), None);
        assert!(
            started.elapsed() < std::time::Duration::from_secs(20),
            "{:?}",
            started.elapsed()
        );
        // Chanting on a line that starts with spaces is found however the text is chunked
        // (streamed, it is reported as soon as it reaches the threshold).
        let text = format!("  {}", "I will fix the bug now. ".repeat(10));
        let whole = run(&text, text.len()).map(|(unit, _)| unit);
        assert!(whole.is_some());
        for chunk in [1, 2, 3, 7] {
            let streamed = run(&text, chunk);
            assert_eq!(streamed.map(|(unit, _)| unit), whole, "chunks of {chunk}");
            assert!(
                streamed.is_some_and(|(_, n)| n >= p.threshold),
                "{streamed:?}"
            );
        }
    }

    proptest::proptest! {
        /// No text, however chunked, makes the chanting detector panic.
        #[test]
        fn chanting_never_panics(s in "[ -~\\né€😀|#`*-]{0,200}", chunk in 1usize..17) {
            let _ = run(&s, chunk);
        }
    }

    /// The reference: one char at a time.
    fn turn_digest_slow(parts: &[&str]) -> (u64, u32) {
        let mut h = StreamHasher::new();
        let (mut chars, mut space, mut digit) = (0u32, false, false);
        for ch in parts.iter().flat_map(|p| p.chars()) {
            if ch.is_whitespace() {
                space = chars > 0;
                continue;
            }
            if space {
                h.byte(b' ');
                chars += 1;
                space = false;
                digit = false;
            }
            if ch.is_ascii_digit() {
                if !digit {
                    h.byte(b'0');
                }
                digit = true;
                chars += 1;
                continue;
            }
            digit = false;
            let mut b = [0u8; 4];
            for lc in ch.to_lowercase() {
                h.bytes(lc.encode_utf8(&mut b).as_bytes());
            }
            chars += 1;
        }
        (h.finish(), chars)
    }

    proptest::proptest! {
        /// Turn digests are those of the char-by-char definition, however the text is chunked.
        #[test]
        fn turn_text_matches_the_char_by_char_definition(
            s in "[ -~\t\n\x0b\x0cÉé€ İ\u{2003}\u{85}]{0,150}",
            cut in 0usize..150,
        ) {
            let mut cut = cut.min(s.len());
            while !s.is_char_boundary(cut) {
                cut -= 1;
            }
            let (a, b) = s.split_at(cut);
            let mut t = TurnText::default();
            t.feed(a);
            t.feed(b);
            proptest::prop_assert_eq!(t.take(), turn_digest_slow(&[a, b]));
        }
    }

    #[test]
    fn turn_text_normalizes() {
        let mut a = TurnText::default();
        a.feed("Hello   World");
        let mut b = TurnText::default();
        b.feed("  hello ");
        b.feed("world\n");
        assert_eq!(a.take().0, b.take().0);
    }
}
