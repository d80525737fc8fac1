//! One session's state: a bounded ring of compact call records, per-loop counters, and a little
//! text state. Single-threaded; the [`crate::Engine`] keeps sessions behind sharded mutexes.

use std::borrow::Cow;
use std::sync::Arc;

use loopguard_rules::{Action, Settings};
use loopguard_store::{GroupStore, WorkerId};

use crate::compiled::CompiledRules;
use crate::detect::text::{TURNS, TextState, TurnText};
use crate::detect::{Det, Detection, Involved, Record, Window, calls, flag, results};
use crate::escalation::{Decision, Loops, Vars, decide};
use crate::event::{Call, Event, Text, ToolResult, UserMessage};
use crate::fingerprint::{CallKeys, file_of};
use crate::hash::hash_str;
use crate::plugins::{self, Hits};
use crate::verdict::{CallRef, Verdict};

mod state;

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

const FILE_TOOLS_HINT: &str =
    " Use the file tools (read, edit, write) instead of shell commands for file operations.";

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
    /// Membership of a group (swarm), when the session joined one.
    group: Option<Box<Member>>,
    /// Seq of the newest call before the latest message from a person, and what that message
    /// did to the calls before it.
    user_seq: u32,
    user_turn: UserTurn,
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
            group: None,
            user_seq: 0,
            user_turn: UserTurn::Open,
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
        let (start, len) = (self.start as usize, self.len as usize);
        if len < cap {
            if let Some(slot) = self.ring.get_mut((start + len) % cap) {
                *slot = r;
            }
            self.len += 1;
        } else {
            if let Some(slot) = self.ring.get_mut(start) {
                *slot = r;
            }
            self.start = ((start + 1) % cap) as u32;
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

    fn on_call(&mut self, c: &Call<'_>) -> Verdict {
        let rules = Arc::clone(&self.rules);
        let tool = rules.tool(c.tool);
        if !tool.watched {
            // Switched off by the policy: not recorded, so its result is ignored too.
            return Verdict::allow();
        }
        let det = rules.detectors(tool.category);
        let keys = rules
            .fingerprint
            .keys(&tool.keys, &c.arguments, &det.test_fix.test_commands);
        // A call ends any text turn: that turn was not a monologue. Text said again after a
        // call is a status line about new work, not a repeated turn.
        if let Some(text) = &mut self.text {
            text.end_turn();
            text.forget_turns();
        }
        self.seq = self.seq.wrapping_add(1);
        let seq = self.seq;
        let now = self.rel(c.time_ms);
        let mut flags = 0;
        for (on, f) in [
            (keys.wait, flag::WAIT),
            (keys.test, flag::TEST),
            (keys.file_op, flag::FILE_OP),
            (tool.keys.shell, flag::SHELL),
            (
                keys.modify || (tool.modifies && !keys.read_only),
                flag::MODIFY,
            ),
        ] {
            if on {
                flags |= f;
            }
        }
        self.push(Record {
            exact: keys.exact as u32,
            fuzzy: keys.fuzzy as u32,
            digest: 0,
            sketch: 0,
            call: hash_str(c.call_id) as u32,
            time: now,
            tool: tool.id,
            flags,
        });
        self.remember_id(seq, c.call_id);
        let group = self.group_call(&rules, &keys, tool.id, c.time_ms);

        let w = self.window(now);
        let a = self.allowance;
        let unknown = !tool.known || self.unknown.contains(&tool.id);
        let [exact, fuzzy, cycle, interleaved, unknown_tool] = calls::detect(&w, det, a, unknown);
        let unknown_tool = unknown_tool.map(|d| by_name(d, &tool.name));
        // The group loop comes last: on a tie the session's own detectors win.
        let group_loop = match &group {
            GroupCheck::Loop(d) => Some(*d),
            GroupCheck::Quiet | GroupCheck::Unavailable => None,
        };
        let mut cands = [exact, fuzzy, cycle, interleaved, unknown_tool, group_loop];
        drop_exempt(&tool, &mut cands);
        let hits = rules.plugins.on_call(c, &keys, &tool, &w);
        let (mut verdict, _) = self.escalate(
            &rules,
            &cands,
            hits,
            tool.category,
            u64::from(seq),
            Some(c),
            now,
        );
        if let Some(armed) = self.armed.take()
            && armed.tool == tool.id
            && armed.verdict.action > verdict.action
        {
            let notes = std::mem::take(&mut verdict.notes);
            verdict = armed.verdict;
            verdict.notes = notes;
            self.flags = self.flags.saturating_add(1);
        }
        if matches!(group, GroupCheck::Unavailable) && verdict.action < Action::Block {
            let notes = std::mem::take(&mut verdict.notes);
            verdict = self.store_refusal(c, u64::from(seq));
            verdict.notes = notes;
        }
        if matches!(verdict.action, Action::Block | Action::Terminate)
            && let Some(i) = self.newest_index()
            && let Some(r) = self.ring.get_mut(i)
        {
            r.flags |= flag::RESULT | flag::ERROR | flag::BLOCKED;
        }
        verdict
    }

    /// Records the call's fuzzy fingerprint in the session's group, if it is a worker of one, and
    /// says whether the swarm as a whole is looping on it. Waits (`sleep 30`) are not counted.
    fn group_call(
        &mut self,
        rules: &CompiledRules,
        keys: &CallKeys,
        tool: u16,
        at_ms: u64,
    ) -> GroupCheck {
        let g = &rules.config.group;
        let Some(m) = self.group.as_deref_mut() else {
            return GroupCheck::Quiet;
        };
        if !g.enabled || keys.wait {
            return GroupCheck::Quiet;
        }
        let tally = m.store.record(&m.group, m.id, keys.fuzzy, at_ms);
        if tally.is_unavailable() {
            return GroupCheck::Unavailable;
        }
        if tally.count < u64::from(g.threshold) || tally.workers < g.min_workers {
            return GroupCheck::Quiet;
        }
        m.workers = tally.workers;
        GroupCheck::Loop(Detection {
            tool: Some(tool),
            involved: Involved::Fuzzy(keys.fuzzy as u32),
            ..Detection::new(
                Det::GroupLoop,
                keys.fuzzy,
                u32::try_from(tally.count).unwrap_or(u32::MAX),
                g.threshold,
            )
        })
    }

    /// The refusal of a call when the group store fails closed.
    fn store_refusal(&self, c: &Call<'_>, seq: u64) -> Verdict {
        let group = self.group.as_deref().map_or("", |m| &*m.group);
        let this = CallRef {
            seq,
            call_id: c.call_id.to_owned(),
        };
        Verdict {
            action: Action::Block,
            message: format!(
                "Refused: {} was not run. The shared loop-detection state of swarm `{group}` is unreachable and this deployment refuses calls it cannot check. Wait a moment and try again, or tell the user the swarm cannot proceed.",
                c.tool
            ),
            detector: Some(Cow::Borrowed("group_store")),
            rule: Some("group.store".to_owned()),
            count: 0,
            calls: vec![this.clone()],
            loop_start: Some(this),
            notes: Vec::new(),
        }
    }

    /// The escalation counters a detection counts against: group loops have their own.
    fn loops_for(&self, det: Det) -> &Loops {
        match (det, self.group.as_deref()) {
            (Det::GroupLoop, Some(m)) => &m.loops,
            _ => &self.loops,
        }
    }

    fn loops_for_mut(&mut self, det: Det) -> &mut Loops {
        match (det, self.group.as_deref_mut()) {
            (Det::GroupLoop, Some(m)) => &mut m.loops,
            _ => &mut self.loops,
        }
    }

    fn newest_index(&self) -> Option<usize> {
        let cap = self.cap();
        (self.len > 0).then(|| (self.start as usize + self.len as usize - 1) % cap)
    }

    fn on_result(&mut self, r: &ToolResult<'_>) -> Verdict {
        let rules = Arc::clone(&self.rules);
        let now = self.rel(r.time_ms);
        let h = hash_str(r.call_id) as u32;
        let cap = self.cap();
        let Some(k) = self.full_window(now).iter().position(|x| x.call == h) else {
            return Verdict::allow();
        };
        let outcome = rules.results.outcome(r);
        let idx = (self.start as usize + self.len as usize - 1 - k) % cap;
        let Some(rec) = self.ring.get_mut(idx) else {
            return Verdict::allow();
        };
        rec.flags &= !(flag::RESULT
            | flag::ERROR
            | flag::EMPTY
            | flag::RETRYABLE
            | flag::BLOCKED
            | flag::CHANGED
            | flag::SKETCH);
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
        rec.sketch = outcome.sketch.unwrap_or(0);
        if outcome.sketch.is_some() {
            rec.flags |= flag::SKETCH;
        }
        let mut rec = *rec;
        // Did the world this call looks at change since its previous run?
        let full = self.full_window(now);
        let changed = (k + 1..full.len())
            .filter_map(|i| full.get(i))
            .find(|o| o.exact == rec.exact && o.real_result())
            .is_some_and(|o| !rec.same_outcome_as(o));
        if changed && let Some(r) = self.ring.get_mut(idx) {
            r.flags |= flag::CHANGED;
            rec = *r;
        }
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
        let lifted = self.judge_user_turn(&rec, k, now);
        let w = self.window(now);
        if k >= w.len() {
            // A call set aside by a person's message.
            return Verdict::allow();
        }
        let a = self.allowance;
        // The call was judged without the calls before a person's message; its outcome just
        // showed that message changed nothing, so it is judged again with them.
        let [exact, fuzzy, cycle, interleaved, _] = if lifted && k == 0 {
            let unknown = self.unknown.contains(&rec.tool);
            calls::detect(&w, det, a, unknown)
        } else {
            [None; 5]
        };
        let mut cands = [
            results::no_progress(&w, k, &det.no_progress, a),
            results::same_outcome(&w, k, &det.same_outcome),
            results::error_cascade(&w, k, &det.error_cascade)
                .map(|d| tool.as_ref().map_or(d, |t| by_name(d, &t.name))),
            results::test_fix(&w, k, &det.test_fix),
            calls::failing_cycle(&w, k, &det.cycle, a),
            exact,
            fuzzy,
            cycle,
            interleaved,
        ];
        if let Some(t) = tool.as_deref() {
            drop_exempt(t, &mut cands);
        }
        // Plugins see the engine's judgement of failure (error patterns included).
        let judged = ToolResult {
            is_error: outcome.error,
            ..*r
        };
        let hits = rules
            .plugins
            .on_result(&judged, tool.as_deref(), &rec, outcome.digest, &w);
        let seq = self.seq.wrapping_sub(k as u32);
        let (verdict, file_tools_hint) =
            self.escalate(&rules, &cands, hits, category, u64::from(seq), None, now);
        if verdict.action != Action::Block {
            return verdict;
        }
        // The call already ran: warn now, refuse the next call of this tool.
        let tool_name = tool.as_ref().map_or("the tool", |t| &*t.name);
        let warning = Verdict {
            action: Action::Warn,
            message: format!(
                "{tool_name} keeps producing the same outcome ({}, {} times). The next {tool_name} call will be refused unless you change your approach.{}",
                verdict.detector.as_deref().unwrap_or("loop"),
                verdict.count,
                if file_tools_hint { FILE_TOOLS_HINT } else { "" }
            ),
            ..verdict.clone()
        };
        let mut verdict = Verdict {
            notes: Vec::new(),
            ..verdict
        };
        // A plugin's message can be any size: the waiting refusal keeps a bounded one.
        clip_text(&mut verdict.message, MAX_TEXT_BYTES);
        verdict.calls.truncate(MAX_WINDOW);
        self.armed = Some(Box::new(Armed {
            tool: rec.tool,
            verdict,
        }));
        warning
    }

    /// A result of the call at `k` (its record `rec`) arrived: if a person's message set calls
    /// aside and this call repeats one of them, their outcomes say whether the message changed
    /// anything.
    /// Returns whether the calls set aside count again from now on.
    fn judge_user_turn(&mut self, rec: &Record, k: usize, now: u32) -> bool {
        if self.user_turn != UserTurn::Pending || !rec.real_result() {
            return false;
        }
        let after = self.seq.wrapping_sub(self.user_seq) as usize;
        if k >= after {
            return false;
        }
        let w = self.full_window(now);
        let before = (after..w.len())
            .filter_map(|i| w.get(i))
            .find(|o| o.exact == rec.exact && o.real_result());
        let Some(o) = before else {
            return false;
        };
        let unchanged = rec.same_outcome_as(o);
        self.user_turn = if unchanged {
            UserTurn::Open
        } else {
            UserTurn::Final
        };
        unchanged
    }

    fn on_text(&mut self, t: &Text<'_>) -> Verdict {
        let rules = Arc::clone(&self.rules);
        let p = &rules.config.detectors;
        let end = !t.chunk || t.end_of_turn;
        let ts = self.text.get_or_insert_with(Box::default);
        let occasion = TEXT_OCCASION | ts.turn_no.wrapping_add(1);
        // Reasoning is only scanned for chanting: it is not a turn of its own.
        if !t.reasoning {
            ts.turn.feed(t.text);
        }
        let mut chant = None;
        if p.chanting.enabled {
            let ch = ts.chant.get_or_insert_with(Box::default);
            chant = ch.feed(t.text, &p.chanting);
            if end || (t.reasoning && !t.chunk) {
                chant = chant.or(ch.end(&p.chanting));
                // Idle sessions keep no text buffers.
                ts.chant = None;
            }
        }
        let chanting = chant
            .map(|(key, count)| Detection::new(Det::Chanting, key, count, p.chanting.threshold));
        let mut cands = [None, None, chanting];
        // Narration beside calls is not a turn without action, nor a repeated turn: the calls
        // are judged, not the words.
        if end && !t.reasoning {
            ts.turn_no = ts.turn_no.wrapping_add(1);
        }
        if end && !t.reasoning && !t.narration {
            let (digest, chars) = ts.turn.take();
            ts.monologue = ts.monologue.saturating_add(1);
            if p.monologue.enabled && ts.monologue >= p.monologue.threshold {
                cands[0] = Some(Detection::new(
                    Det::Monologue,
                    0x6d6f_6e6f,
                    ts.monologue,
                    p.monologue.threshold,
                ));
            }
            // Empty turns count too: nothing said again, each answered by a host prompt.
            if p.text_repeat.enabled && (chars >= p.text_repeat.min_chars || chars == 0) {
                let seen = ts.turns[..ts.turns_len]
                    .iter()
                    .filter(|&&d| d == digest)
                    .count() as u32;
                ts.turns[ts.turns_next] = digest;
                ts.turns_next = (ts.turns_next + 1) % TURNS;
                ts.turns_len = (ts.turns_len + 1).min(TURNS);
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
        if end && t.narration {
            ts.turn = TurnText::default();
        }
        let now = self.rel(t.time_ms);
        let hits = rules.plugins.on_text(t, &self.window(now));
        self.escalate(&rules, &cands, hits, None, occasion, None, now)
            .0
    }

    fn on_user(&mut self, u: &UserMessage<'_>) -> Verdict {
        let user = &self.rules.config.user;
        if u.injected || user.automated_patterns.iter().any(|re| re.is_match(u.text)) {
            return Verdict::allow();
        }
        if let Some(text) = &mut self.text {
            text.end_turn();
        }
        let allowance = allowance(user, u.text);
        let retry = user.retry_requests.iter().any(|re| re.is_match(u.text));
        if self.rules.config.time.reset_on_user_message {
            // The calls so far are set aside; their loops keep their escalation unless the
            // person asked for a retry or for repetitions. A refusal decided on a result is
            // dropped: the person may have changed what the next call will find.
            self.user_seq = self.seq;
            self.user_turn = if retry || allowance > 0 {
                self.loops.clear();
                UserTurn::Final
            } else {
                UserTurn::Pending
            };
            self.armed = None;
        }
        self.allowance = allowance;
        Verdict::allow()
    }

    fn reset_all(&mut self) {
        self.clear_window();
        self.loops.clear();
        self.seq = 0;
        self.has_epoch = false;
        self.ids.clear();
        self.flags = 0;
        self.allowance = 0;
        if let Some(text) = &mut self.text {
            text.end_turn();
            text.forget_turns();
        }
        self.unknown.clear();
        self.armed = None;
        self.user_seq = 0;
        self.user_turn = UserTurn::Open;
        if let Some(m) = self.group.as_deref_mut() {
            m.loops.clear();
        }
    }

    // --- escalation -------------------------------------------------------------------------

    /// Picks the most severe outcome among the detections, the built-in detectors' and the
    /// plugins' (ties: detector order, built-in first), counts it against its loop, and builds
    /// the verdict; plugin notes ride along. Also says whether the message carries the hint to
    /// use the file tools (failing shell file operations).
    #[allow(clippy::too_many_arguments)]
    fn escalate(
        &mut self,
        rules: &CompiledRules,
        cands: &[Option<Detection>],
        hits: Hits,
        category: Option<usize>,
        occasion: u64,
        call: Option<&Call<'_>>,
        now: u32,
    ) -> (Verdict, bool) {
        let mut best: Option<Decision<'_>> = None;
        for d in cands.iter().flatten() {
            let loops = self.loops_for(d.det);
            let Some(dec) = decide(rules, loops, self.flags, d, category, occasion) else {
                continue;
            };
            if best.as_ref().is_none_or(|b| dec.action > b.action) {
                best = Some(dec);
            }
        }
        if hits.is_empty() {
            return self.builtin_verdict(rules, best, category, occasion, call, now);
        }
        let builtin = best.as_ref().map(|b| b.action);
        let (mut verdict, hint) = match plugins::decide(
            rules,
            &self.loops,
            self.flags,
            &hits,
            category,
            occasion,
            builtin,
        ) {
            Some(p) => {
                self.loops.commit(p.loop_key, occasion);
                if p.action == Action::Allow {
                    (Verdict::allow(), false)
                } else {
                    let flags_before = self.flags;
                    self.flags = self.flags.saturating_add(1);
                    let this = (occasion & TEXT_OCCASION == 0).then(|| CallRef {
                        seq: occasion,
                        call_id: self.id_of(occasion as u32),
                    });
                    let v = plugins::verdict(rules, &p, &hits, category, call, this, flags_before);
                    (v, false)
                }
            }
            None => self.builtin_verdict(rules, best, category, occasion, call, now),
        };
        verdict.notes = hits.notes;
        (verdict, hint)
    }

    fn builtin_verdict(
        &mut self,
        rules: &CompiledRules,
        best: Option<Decision<'_>>,
        category: Option<usize>,
        occasion: u64,
        call: Option<&Call<'_>>,
        now: u32,
    ) -> (Verdict, bool) {
        let Some(dec) = best else {
            return (Verdict::allow(), false);
        };
        self.loops_for_mut(dec.detection.det)
            .commit(dec.detection.loop_key(), occasion);
        if dec.action == Action::Allow {
            return (Verdict::allow(), false);
        }
        let flags_before = self.flags;
        self.flags = self.flags.saturating_add(1);
        let verdict = self.build_verdict(rules, &dec, category, call, flags_before, now);
        if let Some(start) = &verdict.loop_start {
            self.ids.pin(start.seq as u32);
        }
        (verdict, dec.detection.file_tools_hint)
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
        // The group ladder is the policy's choice for the swarm, not the tool category's.
        let in_category = if d.det == Det::GroupLoop {
            ""
        } else {
            category_name
        };
        let rule = crate::escalation::rule_name(in_category, dec.ladder, dec.step);
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
            workers: match (d.det, self.group.as_deref()) {
                (Det::GroupLoop, Some(m)) => m.workers,
                _ => 1,
            },
        };
        let mut message = crate::escalation::message(dec.step, dec.action, &vars, None);
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
            notes: Vec::new(),
        }
    }
}

/// Drops the detections of detectors the tool is exempt from (`tools.<name>.exempt`).
fn drop_exempt(tool: &crate::compiled::ToolInfo, cands: &mut [Option<Detection>]) {
    if tool.exempt != 0 {
        for d in cands {
            *d = d.filter(|d| tool.watched_by(d.det));
        }
    }
}

/// A detection keyed by a tool id, keyed by the tool's name instead: tool ids depend on the order
/// in which an engine first saw its tools, and a loop counter must mean the same loop in the
/// engine a snapshot is restored into.
fn by_name(d: Detection, tool: &str) -> Detection {
    Detection {
        key: hash_str(tool),
        ..d
    }
}

/// The host's ids of the last [`ID_POOL`] calls, in one buffer: slot `seq % ID_POOL` holds the
/// id of call `seq`; and the ids of up to [`PINNED_IDS`] loop starts, kept past that.
#[derive(Debug, Default)]
struct CallIds {
    /// The slots' ids (whole strings), one after the other.
    buf: Vec<u8>,
    lens: [u32; ID_POOL],
    seqs: [u32; ID_POOL],
    /// Loop starts, oldest first (allocated at the first verdict).
    pinned: Vec<(u32, Box<str>)>,
}

impl CallIds {
    fn span(&self, slot: usize) -> std::ops::Range<usize> {
        let len = |i: usize| self.lens.get(i).map_or(0, |&n| n as usize);
        let start = (0..slot).map(len).sum::<usize>();
        start..start + len(slot)
    }

    fn set(&mut self, seq: u32, id: &str) {
        let slot = seq as usize % ID_POOL;
        // An id over `MAX_ID_BYTES` is not kept.
        let id = if id.len() <= MAX_ID_BYTES { id } else { "" };
        let span = self.span(slot);
        let (old, new, total) = (span.len(), id.len(), self.buf.len());
        // Make room (growing exactly: in steady state ids keep their lengths and nothing is
        // allocated), or close the gap.
        if new > old {
            self.buf.reserve_exact(new - old);
            self.buf.resize(total + new - old, 0);
            self.buf.copy_within(span.end..total, span.start + new);
        } else if new < old {
            self.buf.copy_within(span.end..total, span.start + new);
            self.buf.truncate(total - (old - new));
        }
        if let (Some(dst), Some(len), Some(s)) = (
            self.buf.get_mut(span.start..span.start + new),
            self.lens.get_mut(slot),
            self.seqs.get_mut(slot),
        ) {
            dst.copy_from_slice(id.as_bytes());
            *len = new as u32;
            *s = seq;
        }
    }

    /// The id of call `seq`; empty when it is no longer kept.
    fn get(&self, seq: u32) -> &str {
        let slot = seq as usize % ID_POOL;
        match self.seqs.get(slot) {
            Some(&s) if s == seq => self
                .buf
                .get(self.span(slot))
                .and_then(|b| std::str::from_utf8(b).ok())
                .unwrap_or(""),
            _ => self
                .pinned
                .iter()
                .find(|(s, _)| *s == seq)
                .map_or("", |(_, id)| id),
        }
    }

    /// Keeps the id of call `seq` (a loop's start) after it leaves the slots, if it is known;
    /// the oldest pinned id makes room.
    fn pin(&mut self, seq: u32) {
        if seq == 0 || self.pinned.iter().any(|(s, _)| *s == seq) {
            return;
        }
        let id = self.get(seq);
        if id.is_empty() {
            return;
        }
        let id: Box<str> = id.into();
        if self.pinned.len() >= PINNED_IDS {
            self.pinned.remove(0);
        }
        self.pinned.push((seq, id));
    }

    fn clear(&mut self) {
        self.buf.clear();
        self.lens = [0; ID_POOL];
        self.seqs = [0; ID_POOL];
        self.pinned.clear();
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

#[cfg(test)]
mod call_id_tests {
    use super::*;

    #[test]
    fn call_ids_keep_the_last_few_of_any_length() {
        let mut ids = CallIds::default();
        let id = |seq: u32| "x".repeat(seq as usize % 7) + &seq.to_string();
        for seq in 1..40u32 {
            ids.set(seq, &id(seq));
            for back in 0..ID_POOL as u32 {
                if let Some(s) = seq.checked_sub(back).filter(|&s| s > 0) {
                    assert_eq!(ids.get(s), id(s), "seq {seq}, back {back}");
                }
            }
            if seq > ID_POOL as u32 {
                assert_eq!(ids.get(seq - ID_POOL as u32), "");
            }
        }
        ids.set(41, "");
        assert_eq!(ids.get(41), "");
        assert_eq!(ids.get(40 - 1), id(39));
        ids.clear();
        assert_eq!(ids.get(39), "");
        assert!(ids.buf.is_empty());
    }
}
