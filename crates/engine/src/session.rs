//! One session's state: a bounded ring of compact call records, per-loop counters, and a little
//! text state. Single-threaded; the [`crate::Engine`] keeps sessions behind sharded mutexes.

use std::borrow::Cow;
use std::sync::Arc;

use loopguard_rules::Action;

use crate::compiled::CompiledRules;
use crate::detect::text::{Chant, TURNS, TurnText};
use crate::detect::{Det, Detection, Involved, Record, Window, calls, flag, results};
use crate::escalation::{Decision, Loops, Vars, decide, default_message, render};
use crate::event::{Call, Event, Text, ToolResult, UserMessage};
use crate::fingerprint::file_of;
use crate::hash::hash_str;
use crate::verdict::{CallRef, Verdict};

/// Call ids remembered for verdicts (older calls are reported by seq only).
const ID_POOL: usize = 6;
/// Tools a session remembers as unknown.
const MAX_UNKNOWN: usize = 16;
/// Occasions of text turns live in the upper half of the u64 range, apart from call seqs.
const TEXT_OCCASION: u64 = 1 << 63;

const FILE_TOOLS_HINT: &str =
    " Use the file tools (read, edit, write) instead of shell commands for file operations.";

/// The state of one agent session.
#[derive(Debug)]
pub struct Session {
    rules: Arc<CompiledRules>,
    ring: Vec<Record>,
    start: usize,
    len: usize,
    seq: u32,
    epoch: Option<u64>,
    last_ms: u64,
    ids: [String; ID_POOL],
    id_seqs: [u32; ID_POOL],
    flags: u32,
    loops: Loops,
    allowance: u32,
    monologue: u32,
    turn: TurnText,
    turns: [u64; TURNS],
    turns_len: usize,
    turns_next: usize,
    turn_no: u64,
    chant: Option<Box<Chant>>,
    unknown: Vec<u16>,
}

impl Session {
    pub fn new(rules: Arc<CompiledRules>) -> Session {
        Session {
            rules,
            ring: Vec::new(),
            start: 0,
            len: 0,
            seq: 0,
            epoch: None,
            last_ms: 0,
            ids: Default::default(),
            id_seqs: [0; ID_POOL],
            flags: 0,
            loops: Loops::default(),
            allowance: 0,
            monologue: 0,
            turn: TurnText::default(),
            turns: [0; TURNS],
            turns_len: 0,
            turns_next: 0,
            turn_no: 0,
            chant: None,
            unknown: Vec::new(),
        }
    }

    /// Observes one event and says what the host should do.
    pub fn observe(&mut self, event: &Event<'_>) -> Verdict {
        self.last_ms = self.last_ms.max(event.time_ms());
        if !self.rules.config.enabled {
            return Verdict::allow();
        }
        match event {
            Event::Call(c) => self.on_call(c),
            Event::Result(r) => self.on_result(r),
            Event::Text(t) => self.on_text(t),
            Event::User(u) => self.on_user(u),
            Event::Reset { .. } => {
                self.reset_all();
                Verdict::allow()
            }
        }
    }

    /// How many times this session was flagged (any action other than allow).
    pub fn flags(&self) -> u32 {
        self.flags
    }

    /// Calls seen since the session started (or was reset).
    pub fn calls_seen(&self) -> u64 {
        u64::from(self.seq)
    }

    /// The time of the latest event (ms).
    pub fn last_event_ms(&self) -> u64 {
        self.last_ms
    }

    /// Approximate bytes of memory this session holds, heap included.
    pub fn memory_bytes(&self) -> usize {
        std::mem::size_of::<Session>()
            + self.ring.capacity() * std::mem::size_of::<Record>()
            + self.ids.iter().map(String::capacity).sum::<usize>()
            + self.loops.capacity_bytes()
            + self.unknown.capacity() * 2
            + self
                .chant
                .as_ref()
                .map_or(0, |_| std::mem::size_of::<Chant>())
    }

    // --- the ring ---------------------------------------------------------------------------

    fn rel(&mut self, ms: u64) -> u32 {
        let epoch = *self.epoch.get_or_insert(ms);
        ms.saturating_sub(epoch).min(u64::from(u32::MAX)) as u32
    }

    fn push(&mut self, r: Record) {
        let cap = self.rules.config.window_size.max(2);
        if self.ring.capacity() < cap {
            self.ring.reserve_exact(cap - self.ring.len());
        }
        if self.len < cap {
            let i = (self.start + self.len) % cap;
            if i < self.ring.len() {
                self.ring[i] = r;
            } else {
                self.ring.push(r);
            }
            self.len += 1;
        } else {
            self.ring[self.start] = r;
            self.start = (self.start + 1) % cap;
        }
    }

    fn window(&self, now: u32) -> Window<'_> {
        let mut w = Window {
            buf: &self.ring[..self.ring.len().min(self.rules.config.window_size.max(2))],
            start: self.start,
            filled: self.len,
            live: self.len,
            newest_seq: self.seq,
        };
        let ttl = self.rules.config.time.ttl_seconds.saturating_mul(1000);
        if ttl > 0 {
            w.live = w
                .iter()
                .take_while(|r| u64::from(now.saturating_sub(r.time)) <= ttl)
                .count();
        }
        w
    }

    fn clear_window(&mut self) {
        self.start = 0;
        self.len = 0;
    }

    fn remember_id(&mut self, seq: u32, id: &str) {
        let slot = seq as usize % ID_POOL;
        self.ids[slot].clear();
        self.ids[slot].push_str(id);
        self.id_seqs[slot] = seq;
    }

    fn id_of(&self, seq: u32) -> String {
        let slot = seq as usize % ID_POOL;
        if self.id_seqs[slot] == seq {
            self.ids[slot].clone()
        } else {
            String::new()
        }
    }

    // --- events -----------------------------------------------------------------------------

    fn on_call(&mut self, c: &Call<'_>) -> Verdict {
        let rules = Arc::clone(&self.rules);
        let tool = rules.tool(c.tool);
        let det = rules.detectors(tool.category);
        let keys = rules
            .fingerprint
            .keys(&tool.keys, &c.arguments, &det.test_fix.test_commands);
        // A call ends any text turn: that turn was not a monologue.
        self.monologue = 0;
        self.turn = TurnText::default();
        self.chant = None;
        self.seq = self.seq.wrapping_add(1);
        let seq = self.seq;
        let now = self.rel(c.time_ms);
        let mut flags = 0;
        for (on, f) in [
            (keys.wait, flag::WAIT),
            (keys.test, flag::TEST),
            (keys.file_op, flag::FILE_OP),
            (tool.keys.shell, flag::SHELL),
        ] {
            if on {
                flags |= f;
            }
        }
        self.push(Record {
            exact: keys.exact,
            fuzzy: keys.fuzzy,
            digest: 0,
            call: hash_str(c.call_id) as u32,
            time: now,
            tool: tool.id,
            flags,
        });
        self.remember_id(seq, c.call_id);

        let w = self.window(now);
        let a = self.allowance;
        let unknown = !tool.known || self.unknown.contains(&tool.id);
        let exact = calls::exact_repeat(&w, &det.exact_repeat, a);
        let fuzzy = if exact.is_some() {
            None
        } else {
            calls::fuzzy_repeat(&w, &det.fuzzy_repeat, a)
        };
        let cands = [
            exact,
            fuzzy,
            calls::cycle(&w, &det.cycle, a),
            calls::interleaved(&w, &det.interleaved, a),
            calls::unknown_tool(&w, &det.unknown_tool, unknown),
        ];
        let verdict = self.escalate(&rules, &cands, tool.category, u64::from(seq), Some(c), now);
        if matches!(verdict.action, Action::Block | Action::Terminate)
            && let Some(i) = self.newest_index()
            && let Some(r) = self.ring.get_mut(i)
        {
            r.flags |= flag::RESULT | flag::ERROR | flag::BLOCKED;
        }
        verdict
    }

    fn newest_index(&self) -> Option<usize> {
        let cap = self.rules.config.window_size.max(2);
        (self.len > 0).then(|| (self.start + self.len - 1) % cap)
    }

    fn on_result(&mut self, r: &ToolResult<'_>) -> Verdict {
        let rules = Arc::clone(&self.rules);
        let now = self.rel(r.time_ms);
        let h = hash_str(r.call_id) as u32;
        let cap = rules.config.window_size.max(2);
        let Some(k) = self.window(now).iter().position(|x| x.call == h) else {
            return Verdict::allow();
        };
        let outcome = rules.results.outcome(r);
        let idx = (self.start + self.len - 1 - k) % cap;
        let Some(rec) = self.ring.get_mut(idx) else {
            return Verdict::allow();
        };
        rec.flags &= !(flag::RESULT | flag::ERROR | flag::EMPTY | flag::RETRYABLE | flag::BLOCKED);
        rec.flags |= flag::RESULT;
        for (on, f) in [
            (outcome.error, flag::ERROR),
            (outcome.empty, flag::EMPTY),
            (outcome.retryable, flag::RETRYABLE),
        ] {
            if on {
                rec.flags |= f;
            }
        }
        rec.digest = outcome.digest as u32;
        let rec = *rec;
        let tool = rules.tool_by_id(rec.tool);
        let category = tool.as_ref().and_then(|t| t.category);
        let det = rules.detectors(category);
        if outcome.error
            && det.unknown_tool.enabled
            && !self.unknown.contains(&rec.tool)
            && det
                .unknown_tool
                .error_patterns
                .iter()
                .any(|re| re.is_match(r.output))
        {
            if self.unknown.len() >= MAX_UNKNOWN {
                self.unknown.remove(0);
            }
            self.unknown.push(rec.tool);
        }
        let w = self.window(now);
        let a = self.allowance;
        let cands = [
            results::no_progress(&w, k, &det.no_progress, a),
            results::same_outcome(&w, k, &det.same_outcome),
            results::error_cascade(&w, k, &det.error_cascade),
            results::test_fix(&w, k, &det.test_fix),
        ];
        let seq = self.seq.wrapping_sub(k as u32);
        self.escalate(&rules, &cands, category, u64::from(seq), None, now)
    }

    fn on_text(&mut self, t: &Text<'_>) -> Verdict {
        let rules = Arc::clone(&self.rules);
        let p = &rules.config.detectors;
        let end = !t.chunk || t.end_of_turn;
        let occasion = TEXT_OCCASION | self.turn_no.wrapping_add(1);
        self.turn.feed(t.text);
        let mut chant = None;
        if p.chanting.enabled {
            let ch = self.chant.get_or_insert_with(Box::default);
            chant = ch.feed(t.text, &p.chanting);
            if end {
                chant = chant.or(ch.end(&p.chanting));
                // Idle sessions keep no text buffers.
                self.chant = None;
            }
        }
        let chanting = chant
            .map(|(key, count)| Detection::new(Det::Chanting, key, count, p.chanting.threshold));
        let mut cands = [None, None, chanting];
        if end {
            self.turn_no = self.turn_no.wrapping_add(1);
            self.monologue = self.monologue.saturating_add(1);
            let (digest, chars) = self.turn.take();
            if p.monologue.enabled && self.monologue >= p.monologue.threshold {
                cands[0] = Some(Detection::new(
                    Det::Monologue,
                    0x6d6f_6e6f,
                    self.monologue,
                    p.monologue.threshold,
                ));
            }
            if p.text_repeat.enabled && chars >= p.text_repeat.min_chars {
                let seen = self.turns[..self.turns_len]
                    .iter()
                    .filter(|&&d| d == digest)
                    .count() as u32;
                self.turns[self.turns_next] = digest;
                self.turns_next = (self.turns_next + 1) % TURNS;
                self.turns_len = (self.turns_len + 1).min(TURNS);
                if seen + 1 >= p.text_repeat.threshold {
                    cands[1] = Some(Detection::new(
                        Det::TextRepeat,
                        digest,
                        seen + 1,
                        p.text_repeat.threshold,
                    ));
                }
            }
        }
        let now = self.rel(t.time_ms);
        self.escalate(&rules, &cands, None, occasion, None, now)
    }

    fn on_user(&mut self, u: &UserMessage<'_>) -> Verdict {
        if u.injected {
            return Verdict::allow();
        }
        self.monologue = 0;
        self.turn = TurnText::default();
        self.chant = None;
        if self.rules.config.time.reset_on_user_message {
            self.clear_window();
            self.loops.clear();
            self.turns_len = 0;
            self.turns_next = 0;
        }
        self.allowance = allowance(&self.rules.config.user, u.text);
        Verdict::allow()
    }

    fn reset_all(&mut self) {
        self.clear_window();
        self.loops.clear();
        self.seq = 0;
        self.epoch = None;
        self.id_seqs = [0; ID_POOL];
        for id in &mut self.ids {
            id.clear();
        }
        self.flags = 0;
        self.allowance = 0;
        self.monologue = 0;
        self.turn = TurnText::default();
        self.turns_len = 0;
        self.turns_next = 0;
        self.chant = None;
        self.unknown.clear();
    }

    // --- escalation -------------------------------------------------------------------------

    /// Picks the most severe outcome among the detections (ties: detector order), counts it
    /// against its loop, and builds the verdict.
    fn escalate(
        &mut self,
        rules: &CompiledRules,
        cands: &[Option<Detection>],
        category: Option<usize>,
        occasion: u64,
        call: Option<&Call<'_>>,
        now: u32,
    ) -> Verdict {
        let mut best: Option<Decision<'_>> = None;
        for d in cands.iter().flatten() {
            let Some(dec) = decide(rules, &self.loops, self.flags, d, category, occasion) else {
                continue;
            };
            if best.as_ref().is_none_or(|b| dec.action > b.action) {
                best = Some(dec);
            }
        }
        let Some(dec) = best else {
            return Verdict::allow();
        };
        self.loops.commit(dec.detection.loop_key(), occasion);
        if dec.action == Action::Allow {
            return Verdict::allow();
        }
        let flags_before = self.flags;
        self.flags = self.flags.saturating_add(1);
        self.build_verdict(rules, &dec, category, call, flags_before, now)
    }

    fn build_verdict(
        &self,
        rules: &CompiledRules,
        dec: &Decision<'_>,
        category: Option<usize>,
        call: Option<&Call<'_>>,
        flags_before: u32,
        now: u32,
    ) -> Verdict {
        let d = &dec.detection;
        let tool_info = d.tool.and_then(|id| rules.tool_by_id(id));
        let tool_name: Cow<'_, str> = match (call, &tool_info) {
            (Some(c), _) => Cow::Borrowed(c.tool),
            (None, Some(t)) => Cow::Owned(t.name.to_string()),
            (None, None) => Cow::Borrowed("text"),
        };
        let category_name = category
            .and_then(|i| rules.config.categories.get(i))
            .map_or("", |c| c.name.as_str());
        let step_index = dec.step.map_or(0, |(i, _)| i);
        let rule = if category_name.is_empty() {
            format!("ladders.{}[{step_index}]", dec.ladder)
        } else {
            format!(
                "categories.{category_name}/ladders.{}[{step_index}]",
                dec.ladder
            )
        };
        let file = match (call, &tool_info) {
            (Some(c), Some(t)) => file_of(&rules.fingerprint, &t.keys, &c.arguments),
            _ => String::new(),
        };
        let vars = Vars {
            tool: &tool_name,
            count: d.count,
            detector: d.det.name(),
            rule: &rule,
            pattern: d.det.pattern(),
            category: category_name,
            threshold: d.threshold,
            window: rules.config.window_size,
            file: &file,
            flags: flags_before,
            action: dec.action.as_str(),
        };
        let template = dec
            .step
            .and_then(|(_, s)| s.message.as_deref())
            .unwrap_or_else(|| default_message(dec.action));
        let mut message = render(template, &vars);
        if d.file_tools_hint {
            message.push_str(FILE_TOOLS_HINT);
        }
        let mut calls = Vec::new();
        if d.involved != Involved::None {
            let w = self.window(now);
            for k in (0..w.len()).rev() {
                if let Some(r) = w.get(k)
                    && w.seq(k) >= d.start_seq
                    && d.involved.matches(r)
                {
                    calls.push(CallRef {
                        seq: u64::from(w.seq(k)),
                        call_id: self.id_of(w.seq(k)),
                    });
                }
            }
        }
        let loop_start = calls.first().cloned();
        Verdict {
            action: dec.action,
            message,
            detector: Some(Cow::Borrowed(d.det.name())),
            rule: Some(rule),
            count: d.count,
            calls,
            loop_start,
        }
    }
}

/// Extra repeats a user message asks for: the number it names, else the policy's allowance;
/// 0 when it asks for no repetition.
pub(crate) fn allowance(user: &loopguard_rules::config::User, text: &str) -> u32 {
    let Some(m) = user.repeat_requests.iter().find_map(|re| re.find(text)) else {
        return 0;
    };
    let s = m.as_str();
    // "5 times" names a count; "every 5 seconds" names an interval.
    let times = s.to_ascii_lowercase().contains("time");
    let digits: String = s.chars().filter(char::is_ascii_digit).collect();
    if times && let Ok(n) = digits.parse::<u32>() {
        return n;
    }
    const WORDS: &[(&str, u32)] = &[
        ("once", 1),
        ("twice", 2),
        ("thrice", 3),
        ("two", 2),
        ("three", 3),
        ("four", 4),
        ("five", 5),
        ("six", 6),
        ("seven", 7),
        ("eight", 8),
        ("nine", 9),
        ("ten", 10),
    ];
    s.split(|c: char| !c.is_alphabetic())
        .find_map(|w| {
            WORDS
                .iter()
                .find(|(name, _)| w.eq_ignore_ascii_case(name))
                .map(|&(_, n)| n)
        })
        .unwrap_or(user.repeat_allowance)
}
