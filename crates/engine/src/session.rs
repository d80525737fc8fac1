//! One session's state: a bounded ring of compact call records, per-loop counters, and a little
//! text state. Single-threaded; the [`crate::Engine`] keeps sessions behind sharded mutexes.
//!
//! The rooms: this file holds the session and its window; `session/call_event.rs`,
//! `result_event.rs` and `conversation.rs` (text and user messages) judge each kind of event;
//! `verdicts.rs` turns detections into a verdict; `call_ids.rs` keeps the host's call ids;
//! `files.rs` what literal writes put in files; `state.rs` is the session's snapshot form.

use std::borrow::Cow;
use std::sync::Arc;

use loopguard_rules::{Action, Settings};
use loopguard_store::{GroupStore, WorkerId};

use crate::compiled::CompiledRules;
use crate::detect::text::{TURNS, TextState, TurnText};
use crate::detect::{Det, Detection, Involved, Record, Window, calls, flag, results};
use crate::engine::Target;
use crate::escalation::{Decision, Found, Loops, decide};
use crate::event::{Call, Event, Text, ToolResult, UserMessage};
use crate::fingerprint::{CallKeys, file_of};
use crate::hash::hash_str;
use crate::message::Vars;
use crate::plugins::Hits;
use crate::verdict::{CallRef, Verdict};

/// The first and last `n` bytes of `text` (whole characters; the second empty when the first
/// holds all of it): what a pattern that reads the ends of a long text reads.
pub(crate) fn ends(text: &str, n: usize) -> [&str; 2] {
    let mut head = text.len().min(n);
    while !text.is_char_boundary(head) {
        head -= 1;
    }
    let mut tail = text.len().saturating_sub(n).max(head);
    while !text.is_char_boundary(tail) {
        tail += 1;
    }
    [&text[..head], &text[tail..]]
}

mod call_event;
mod call_ids;
mod conversation;
mod files;
mod result_event;
mod state;
mod verdicts;

use call_ids::*;
use files::Files;

#[cfg(test)]
pub(crate) use conversation::allowance;
#[cfg(test)]
pub(crate) use result_event::pending_for_tests;

/// Ids of the most recent calls remembered for verdicts (older calls are reported by seq only).
const ID_POOL: usize = 6;
/// Ids of loop starts remembered besides them, kept from the first verdict that named them so
/// that later verdicts on a long loop still say where it began.
const PINNED_IDS: usize = 4;
/// Tools a session remembers as unknown.
const MAX_UNKNOWN: usize = 16;
/// The longest call id a session keeps (longer ids are not kept: verdicts name the call by its
/// seq only).
pub(crate) const MAX_ID_BYTES: usize = 4096;
/// The longest text a session keeps in a waiting refusal (its message, detector and rule names;
/// a longer message is cut at a character boundary) and in names (tools, groups, workers).
pub(crate) const MAX_TEXT_BYTES: usize = 64 * 1024;
/// The largest window any policy sets (`window.size` is 2 to 1,000; `max_repeats` is kept to
/// 1,000 too).
pub(crate) const MAX_WINDOW: usize = 1000;

/// `text` cut to at most `max` bytes at a character boundary.
pub(crate) fn clip_text(text: &mut String, max: usize) {
    if text.len() > max {
        let mut end = max;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
}
/// Occasions of text turns live in the upper half of the u64 range, apart from call seqs.
const TEXT_OCCASION: u64 = 1 << 63;

/// The state of one agent session.
#[derive(Debug)]
pub struct Session {
    rules: Arc<CompiledRules>,
    /// The window's records (allocated, whole, at the first call).
    ring: Box<[Record]>,
    start: u32,
    len: u32,
    seq: u32,
    /// Event time of the first event (`has_epoch`); records keep times relative to it.
    epoch: u64,
    has_epoch: bool,
    last_ms: u64,
    ids: CallIds,
    flags: u32,
    loops: Loops,
    allowance: u32,
    /// Allocated when the first text arrives.
    text: Option<Box<TextState>>,
    unknown: Vec<u16>,
    /// A refusal decided on a result, waiting for the next call of that tool.
    armed: Option<Box<Armed>>,
    /// The session's own settings tier, when it has one (`Engine::set_session_settings`);
    /// `rules` were compiled with it.
    settings: Option<Box<Settings>>,
    /// The backend and model the session's rules were resolved for, and the positions of the
    /// policy's overrides that match them; `None`: the engine's own target.
    target: Option<Box<(Target, Vec<usize>)>>,
    /// Membership of a group (swarm), when the session joined one.
    group: Option<Box<Member>>,
    /// Seq of the newest call before the latest message from a person, and what that message
    /// did to the calls before it.
    user_seq: u32,
    user_turn: UserTurn,
    /// The content of the files written last with literal content.
    files: Files,
    /// A hash of the last user message judged a person's (0: none yet).
    last_user: u64,
    /// The lines the last shell commands typed, allocated at the first one.
    typed: Option<Box<TypedLines>>,
}

/// The last [`TypedLines::LEN`] lines typed by shell commands
/// ([`crate::fingerprint::Typed`]), newest last: a terminal that echoes input while it is busy
/// may show the lines of several commands typed one after another.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct TypedLines {
    lines: [u32; TypedLines::LEN],
    len: u8,
}

impl TypedLines {
    pub(crate) const LEN: usize = 16;

    pub(crate) fn push(&mut self, hashes: &[u32]) {
        for &h in hashes {
            if usize::from(self.len) == Self::LEN {
                self.lines.copy_within(1.., 0);
                self.len -= 1;
            }
            if let Some(slot) = self.lines.get_mut(usize::from(self.len)) {
                *slot = h;
                self.len += 1;
            }
        }
    }

    pub(crate) fn hashes(&self) -> &[u32] {
        self.lines.get(..usize::from(self.len)).unwrap_or(&[])
    }
}

/// What the latest message from a person did to the counts of the calls before it.
///
/// A person's message may change the situation (new information, a new request), or not ("any
/// update?", "we are going in circles"). The calls before it are set aside until the outcome of
/// a repeated call says which: the same outcome again means the message changed nothing, and
/// the earlier calls count again; a different outcome means it did, and they stay aside.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum UserTurn {
    /// Every call in the window counts.
    #[default]
    Open,
    /// Calls up to `user_seq` are set aside until a repeated call's outcome decides.
    Pending,
    /// Calls up to `user_seq` are set aside for good: the message changed the situation, or
    /// asked for a retry or for repetitions.
    Final,
}

/// A session's place in a group (swarm) of workers.
#[derive(Debug)]
pub(crate) struct Member {
    pub(crate) group: Box<str>,
    pub(crate) worker: Box<str>,
    id: WorkerId,
    store: Arc<dyn GroupStore>,
    /// Escalation counters of group loops, apart from the session's own loops: a user message
    /// does not reset them (the swarm is still stuck), clearing the group does.
    loops: Loops,
    /// Distinct workers in the latest group-loop tally (the `{workers}` placeholder).
    workers: u32,
}

/// What the group store said about a call.
enum GroupCheck {
    Quiet,
    Loop(Detection),
    /// The store fails closed and cannot vouch for its answer: the call is refused.
    Unavailable,
}

/// A block decided when a result showed the loop: the call had already run, so the refusal
/// applies to the next call of the same tool. A call of another tool means the agent changed
/// course, and disarms it.
#[derive(Debug)]
struct Armed {
    tool: u16,
    verdict: Verdict,
}

impl Session {
    /// A session with no history, judged by `rules`.
    pub fn new(rules: Arc<CompiledRules>) -> Session {
        Session {
            rules,
            ring: Box::default(),
            start: 0,
            len: 0,
            seq: 0,
            epoch: 0,
            has_epoch: false,
            last_ms: 0,
            ids: CallIds::default(),
            flags: 0,
            loops: Loops::default(),
            allowance: 0,
            text: None,
            unknown: Vec::new(),
            armed: None,
            settings: None,
            target: None,
            group: None,
            user_seq: 0,
            user_turn: UserTurn::Open,
            files: Files::default(),
            last_user: 0,
            typed: None,
        }
    }

    /// Switches to rules compiled with new session `settings` (the tier the rules were made
    /// with). The window keeps its newest calls when its size changes; counters stay.
    pub(crate) fn set_rules(&mut self, rules: Arc<CompiledRules>, settings: Settings) {
        self.rules = rules;
        self.settings = (!settings.is_empty()).then(|| Box::new(settings));
        let cap = self.cap();
        if !self.ring.is_empty() && self.ring.len() != cap {
            let keep = (self.len as usize).min(cap);
            let old = self.ring.len();
            let first = self.start as usize + self.len as usize - keep;
            let mut ring = vec![Record::default(); cap].into_boxed_slice();
            for (i, slot) in ring.iter_mut().take(keep).enumerate() {
                if let Some(r) = self.ring.get((first + i) % old) {
                    *slot = *r;
                }
            }
            self.ring = ring;
            self.start = 0;
            self.len = keep as u32;
        }
    }

    /// The session's own settings tier (empty when it has none).
    pub fn settings(&self) -> Settings {
        self.settings.as_deref().cloned().unwrap_or_default()
    }

    /// The backend and model the session's rules were resolved for (`None`: the engine's), with
    /// the positions of the policy overrides that match them.
    pub(crate) fn target(&self) -> Option<&(Target, Vec<usize>)> {
        self.target.as_deref()
    }

    /// Records what the session's rules are resolved for.
    pub(crate) fn set_target(&mut self, target: Option<(Target, Vec<usize>)>) {
        self.target = target.map(Box::new);
    }

    /// The rules in force for this session (the engine's, or a variant with its settings).
    pub fn rules(&self) -> &Arc<CompiledRules> {
        &self.rules
    }

    /// Joins a group (swarm) as `worker`, leaving any group it was in.
    pub(crate) fn join(&mut self, group: &str, worker: &str, store: Arc<dyn GroupStore>) {
        self.group = Some(Box::new(Member {
            group: group.into(),
            worker: worker.into(),
            id: WorkerId::new(worker),
            store,
            loops: Loops::default(),
            workers: 0,
        }));
    }

    pub(crate) fn leave(&mut self) {
        self.group = None;
    }

    /// The group and worker name, when the session is a worker of a group.
    pub fn group(&self) -> Option<(&str, &str)> {
        self.group.as_deref().map(|m| (&*m.group, &*m.worker))
    }

    /// The group was cleared (the swarm completed): its loops start over.
    pub(crate) fn group_cleared(&mut self, group: &str) {
        if let Some(m) = self.group.as_deref_mut()
            && *m.group == *group
        {
            m.loops.clear();
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
            Event::User(u) => {
                let notes = self.rules.plugins.on_user(u);
                Verdict {
                    notes,
                    ..self.on_user(u)
                }
            }
            Event::Reset { session, time_ms } => {
                let notes = self.rules.plugins.reset(session, *time_ms);
                self.reset_all();
                Verdict {
                    notes,
                    ..Verdict::allow()
                }
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
            + std::mem::size_of_val::<[Record]>(&self.ring)
            + self.ids.buf.capacity()
            + self
                .ids
                .pinned
                .iter()
                .map(|(_, id)| std::mem::size_of::<(u32, Box<str>)>() + id.len())
                .sum::<usize>()
            + self.loops.capacity_bytes()
            + self.unknown.capacity() * 2
            + self
                .text
                .as_ref()
                .map_or(0, |t| std::mem::size_of::<TextState>() + t.heap_bytes())
            + self.settings.as_ref().map_or(0, |s| {
                std::mem::size_of::<Settings>() + s.mode.as_ref().map_or(0, String::capacity)
            })
            + self
                .typed
                .as_ref()
                .map_or(0, |_| std::mem::size_of::<TypedLines>())
            + self.group.as_ref().map_or(0, |m| {
                std::mem::size_of::<Member>()
                    + m.group.len()
                    + m.worker.len()
                    + m.loops.capacity_bytes()
            })
    }

    // --- the ring ---------------------------------------------------------------------------

    fn rel(&mut self, ms: u64) -> u32 {
        if !self.has_epoch {
            self.epoch = ms;
            self.has_epoch = true;
        }
        ms.saturating_sub(self.epoch).min(u64::from(u32::MAX)) as u32
    }

    /// The window's capacity (at most `u32::MAX` records).
    fn cap(&self) -> usize {
        self.rules.config.window_size.clamp(2, u32::MAX as usize)
    }

    fn push(&mut self, r: Record) {
        let cap = self.cap();
        if self.ring.len() != cap {
            self.ring = vec![Record::default(); cap].into_boxed_slice();
            self.clear_window();
        }
        // `start` and `len` are below `cap`: one wrap at most, without a division.
        let wrap = |i: usize| if i >= cap { i - cap } else { i };
        let (start, len) = (self.start as usize, self.len as usize);
        if len < cap {
            if let Some(slot) = self.ring.get_mut(wrap(start + len)) {
                *slot = r;
            }
            self.len += 1;
        } else {
            if let Some(slot) = self.ring.get_mut(start) {
                *slot = r;
            }
            self.start = wrap(start + 1) as u32;
        }
    }

    /// The live window: calls within the TTL, and not set aside by a person's message.
    fn window(&self, now: u32) -> Window<'_> {
        let mut w = self.full_window(now);
        if self.user_turn != UserTurn::Open {
            let after = self.seq.wrapping_sub(self.user_seq) as usize;
            w.live = w.live.min(after);
        }
        w
    }

    /// The window with the calls set aside by a person's message.
    fn full_window(&self, now: u32) -> Window<'_> {
        let mut w = Window {
            buf: &self.ring,
            start: self.start as usize,
            filled: self.len as usize,
            live: self.len as usize,
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
        self.ids.set(seq, id);
    }

    fn id_of(&self, seq: u32) -> String {
        self.ids.get(seq).to_owned()
    }

    // --- events -----------------------------------------------------------------------------

    /// The escalation counters a loop counts against: group loops have their own.
    fn loops_for(&self, found: &Found<'_>) -> &Loops {
        match (found.is_group(), self.group.as_deref()) {
            (true, Some(m)) => &m.loops,
            _ => &self.loops,
        }
    }

    fn loops_for_mut(&mut self, found: &Found<'_>) -> &mut Loops {
        match (found.is_group(), self.group.as_deref_mut()) {
            (true, Some(m)) => &mut m.loops,
            _ => &mut self.loops,
        }
    }

    fn newest_index(&self) -> Option<usize> {
        let cap = self.cap();
        // `start < cap` and `len <= cap`: one subtraction wraps it.
        (self.len > 0).then(|| {
            let i = self.start as usize + self.len as usize - 1;
            if i >= cap { i - cap } else { i }
        })
    }

    // --- escalation -------------------------------------------------------------------------
}
