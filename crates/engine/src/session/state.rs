//! A session's state as a snapshot, and back: see [`crate::snapshot`].

use std::borrow::Cow;
use std::sync::Arc;

use loopguard_rules::{Action, Settings};
use loopguard_store::{GroupStore, WorkerId};

use super::{
    Armed, CallIds, ID_POOL, MAX_ID_BYTES, MAX_TEXT_BYTES, MAX_UNKNOWN, MAX_WINDOW, Member,
    PINNED_IDS, Session, UserTurn,
};
use crate::compiled::CompiledRules;
use crate::detect::Record;
use crate::detect::text::{TURNS, TextState};
use crate::escalation::Loops;
use crate::snapshot::{
    ArmedV1, CallIdV1, CallRefV1, FileV1, LoopV1, MemberV1, RecordV1, SessionV1, SettingsV1,
    SnapshotError, TargetV1, TextV1, UserTurnV1, VerdictV1,
};
use crate::verdict::{CallRef, Verdict};

impl SettingsV1 {
    pub(crate) fn from_settings(s: &Settings) -> SettingsV1 {
        SettingsV1 {
            enabled: s.enabled,
            max_repeats: s.max_repeats,
            ttl_seconds: s.ttl_seconds,
            mode: s.mode.clone(),
        }
    }

    pub(crate) fn to_settings(&self) -> Settings {
        Settings {
            enabled: self.enabled,
            max_repeats: self.max_repeats,
            ttl_seconds: self.ttl_seconds,
            mode: self.mode.clone(),
        }
    }
}

fn loops_v1(loops: &Loops) -> Vec<LoopV1> {
    loops
        .entries()
        .map(|(key, repeat, occasion)| LoopV1 {
            key,
            repeat,
            occasion,
        })
        .collect()
}

fn call_ref_v1(c: &CallRef) -> CallRefV1 {
    CallRefV1 {
        seq: c.seq,
        call_id: c.call_id.clone(),
    }
}

fn call_ref(c: &CallRefV1) -> CallRef {
    CallRef {
        seq: c.seq,
        call_id: c.call_id.clone(),
    }
}

impl Session {
    /// The session's state in the current snapshot format.
    pub(crate) fn to_snapshot(&self) -> SessionV1 {
        let rules = &self.rules;
        let tool_name = |id: u16| rules.tool_by_id(id).map(|t| t.name.to_string());
        let cap = self.ring.len();
        let window = (0..self.len as usize)
            .filter_map(|i| self.ring.get((self.start as usize + i) % cap.max(1)))
            .map(|r| RecordV1 {
                exact: u64::from(r.exact),
                fuzzy: u64::from(r.fuzzy),
                call: r.call,
                digest: r.digest,
                sketch: r.sketch,
                time: r.time,
                tool: tool_name(r.tool),
                flags: r.flags,
            })
            .collect();
        let mut call_ids: Vec<CallIdV1> = self
            .ids
            .seqs
            .iter()
            .filter(|&&seq| seq != 0)
            .map(|&seq| CallIdV1 {
                seq,
                id: self.ids.get(seq).to_owned(),
            })
            .collect();
        call_ids.sort_by_key(|c| c.seq);
        let loop_start_ids = self
            .ids
            .pinned
            .iter()
            .map(|(seq, id)| CallIdV1 {
                seq: *seq,
                id: id.to_string(),
            })
            .collect();
        let text = self.text.as_deref().map(|t| {
            let n = t.turns_len.min(TURNS);
            let turns = if n < TURNS {
                t.turns[..n].to_vec()
            } else {
                let next = t.turns_next % TURNS;
                t.turns[next..]
                    .iter()
                    .chain(&t.turns[..next])
                    .copied()
                    .collect()
            };
            TextV1 {
                turns,
                turn_no: t.turn_no,
                monologue: t.monologue,
                reply: t.reply,
                same_replies: t.same_replies,
                ended_by_person: t.ended_by_person,
            }
        });
        SessionV1 {
            settings: self
                .settings
                .as_deref()
                .map(SettingsV1::from_settings)
                .unwrap_or_default(),
            target: self.target.as_deref().map(|(t, _)| TargetV1 {
                backend: t.backend.clone(),
                model: t.model.clone(),
            }),
            group: self.group.as_deref().map(|m| MemberV1 {
                group: m.group.to_string(),
                worker: m.worker.to_string(),
                loops: loops_v1(&m.loops),
                workers: m.workers,
            }),
            seq: self.seq,
            epoch_ms: self.has_epoch.then_some(self.epoch),
            last_ms: self.last_ms,
            window,
            call_ids,
            loop_start_ids,
            flags: self.flags,
            loops: loops_v1(&self.loops),
            allowance: self.allowance,
            text,
            unknown_tools: self
                .unknown
                .iter()
                .filter_map(|&id| tool_name(id))
                .collect(),
            armed: self.armed.as_deref().map(|a| ArmedV1 {
                tool: tool_name(a.tool),
                verdict: VerdictV1 {
                    action: a.verdict.action.as_str().to_owned(),
                    message: a.verdict.message.clone(),
                    detector: a.verdict.detector.as_deref().map(str::to_owned),
                    rule: a.verdict.rule.clone(),
                    count: a.verdict.count,
                    calls: a.verdict.calls.iter().map(call_ref_v1).collect(),
                    loop_start: a.verdict.loop_start.as_ref().map(call_ref_v1),
                },
            }),
            user_turn: match self.user_turn {
                UserTurn::Open => None,
                turn => Some(UserTurnV1 {
                    seq: self.user_seq,
                    decided: turn == UserTurn::Final,
                }),
            },
            files: self
                .files
                .entries()
                .map(|(target, content, seq)| FileV1 {
                    target,
                    content,
                    seq,
                })
                .collect(),
            last_user: self.last_user,
            typed: self
                .typed
                .as_ref()
                .map_or_else(Vec::new, |t| t.hashes().to_vec()),
        }
    }

    /// A session from a snapshot, checked for consistency. `rules` are the engine's rules for
    /// the snapshot's settings (`settings`), `store` the engine's group store.
    pub(crate) fn from_snapshot(
        id: &str,
        snap: &SessionV1,
        rules: Arc<CompiledRules>,
        settings: Settings,
        store: &Arc<dyn GroupStore>,
    ) -> Result<Session, SnapshotError> {
        let invalid = |reason: String| SnapshotError::Invalid {
            session: id.to_owned(),
            reason,
        };
        check(snap).map_err(invalid)?;
        let tool_id = |name: &Option<String>| match name {
            Some(name) => rules.tool(name).id,
            None => u16::MAX,
        };
        let mut s = Session::new(Arc::clone(&rules));
        s.settings = (!settings.is_empty()).then(|| Box::new(settings));
        let cap = s.cap();
        if !snap.window.is_empty() {
            // A window larger than this policy's keeps its newest calls.
            let keep = snap.window.len().min(cap);
            let mut ring = vec![Record::default(); cap].into_boxed_slice();
            let newest = snap.window.iter().skip(snap.window.len() - keep);
            for (slot, r) in ring.iter_mut().zip(newest) {
                *slot = Record {
                    exact: r.exact as u32,
                    fuzzy: r.fuzzy as u32,
                    call: r.call,
                    digest: r.digest,
                    sketch: r.sketch,
                    time: r.time,
                    tool: tool_id(&r.tool),
                    flags: r.flags,
                };
            }
            s.ring = ring;
            s.len = keep as u32;
        }
        s.seq = snap.seq;
        s.has_epoch = snap.epoch_ms.is_some();
        s.epoch = snap.epoch_ms.unwrap_or(0);
        s.last_ms = snap.last_ms;
        let mut ids = CallIds::default();
        for c in &snap.call_ids {
            ids.set(c.seq, &c.id);
        }
        ids.pinned = snap
            .loop_start_ids
            .iter()
            .map(|c| (c.seq, c.id.as_str().into()))
            .collect();
        s.ids = ids;
        s.flags = snap.flags;
        s.loops = Loops::from_entries(snap.loops.iter().map(|l| (l.key, l.repeat, l.occasion)));
        s.allowance = snap.allowance;
        s.text = snap.text.as_ref().map(|t| {
            let mut state = TextState::default();
            for (slot, d) in state.turns.iter_mut().zip(&t.turns) {
                *slot = *d;
            }
            state.turns_len = t.turns.len();
            state.turns_next = t.turns.len() % TURNS;
            state.turn_no = t.turn_no;
            state.monologue = t.monologue;
            state.reply = t.reply;
            state.same_replies = t.same_replies;
            state.ended_by_person = t.ended_by_person;
            Box::new(state)
        });
        s.unknown = snap
            .unknown_tools
            .iter()
            .map(|t| rules.tool(t).id)
            .collect();
        if let Some(a) = &snap.armed {
            let v = &a.verdict;
            let action = Action::parse(&v.action)
                .ok_or_else(|| invalid(format!("unknown action `{}` in `armed`", v.action)))?;
            s.armed = Some(Box::new(Armed {
                tool: tool_id(&a.tool),
                verdict: Verdict {
                    action,
                    message: v.message.clone(),
                    detector: v.detector.clone().map(Cow::Owned),
                    rule: v.rule.clone(),
                    count: v.count,
                    calls: v.calls.iter().map(call_ref).collect(),
                    loop_start: v.loop_start.as_ref().map(call_ref),
                    notes: Vec::new(),
                },
            }));
        }
        s.files =
            super::Files::from_entries(snap.files.iter().map(|f| (f.target, f.content, f.seq)));
        s.last_user = snap.last_user;
        if !snap.typed.is_empty() {
            // The newest lines, if a snapshot holds more than a session keeps.
            let from = snap.typed.len().saturating_sub(super::TypedLines::LEN);
            let mut t = super::TypedLines::default();
            t.push(snap.typed.get(from..).unwrap_or(&[]));
            s.typed = Some(Box::new(t));
        }
        if let Some(u) = &snap.user_turn {
            s.user_seq = u.seq;
            s.user_turn = if u.decided {
                UserTurn::Final
            } else {
                UserTurn::Pending
            };
        }
        if let Some(m) = &snap.group {
            s.group = Some(Box::new(Member {
                group: m.group.as_str().into(),
                worker: m.worker.as_str().into(),
                id: WorkerId::new(&m.worker),
                store: Arc::clone(store),
                loops: Loops::from_entries(m.loops.iter().map(|l| (l.key, l.repeat, l.occasion))),
                workers: m.workers,
            }));
        }
        Ok(s)
    }
}

/// What serde cannot check: sizes within the bounds of live sessions, and numbers that agree.
///
/// A snapshot over a bound is refused, whole, with the bound named: a window longer than any
/// policy's (1,000 calls), more call ids than a session keeps, a call id over 4 KiB, a refusal
/// message, detector or rule name over 64 KiB, more call references in it than a window holds,
/// a tool, group or worker name over 64 KiB. A window longer than this policy's but within
/// 1,000 keeps its newest calls, as a live session does when its window shrinks.
fn check(snap: &SessionV1) -> Result<(), String> {
    let calls = snap.window.len();
    if calls > MAX_WINDOW {
        return Err(format!(
            "the window holds {calls} calls, but no policy keeps more than {MAX_WINDOW}"
        ));
    }
    let long = |what: &str, text: &str, max: usize| {
        if text.len() > max {
            Err(format!(
                "{what} is {} bytes long, but a session keeps at most {max}",
                text.len()
            ))
        } else {
            Ok(())
        }
    };
    for c in snap.call_ids.iter().chain(&snap.loop_start_ids) {
        long("a call id", &c.id, MAX_ID_BYTES)?;
    }
    if snap.files.len() > super::files::SLOTS {
        return Err(format!(
            "{} files are remembered, but a session keeps at most {}",
            snap.files.len(),
            super::files::SLOTS
        ));
    }
    if let Some(f) = snap.files.iter().find(|f| f.seq == 0 || f.seq > snap.seq) {
        return Err(format!(
            "a file was written by call {}, but the session has seen calls 1 to {}",
            f.seq, snap.seq
        ));
    }
    for r in &snap.window {
        long(
            "a tool name",
            r.tool.as_deref().unwrap_or(""),
            MAX_TEXT_BYTES,
        )?;
    }
    for t in &snap.unknown_tools {
        long("an unknown tool's name", t, MAX_TEXT_BYTES)?;
    }
    if let Some(m) = &snap.group {
        long("the group name", &m.group, MAX_TEXT_BYTES)?;
        long("the worker name", &m.worker, MAX_TEXT_BYTES)?;
    }
    if let Some(a) = &snap.armed {
        let v = &a.verdict;
        long(
            "the waiting refusal's tool",
            a.tool.as_deref().unwrap_or(""),
            MAX_TEXT_BYTES,
        )?;
        long("the waiting refusal's message", &v.message, MAX_TEXT_BYTES)?;
        long(
            "the waiting refusal's detector",
            v.detector.as_deref().unwrap_or(""),
            MAX_TEXT_BYTES,
        )?;
        long(
            "the waiting refusal's rule",
            v.rule.as_deref().unwrap_or(""),
            MAX_TEXT_BYTES,
        )?;
        if v.calls.len() > MAX_WINDOW {
            return Err(format!(
                "the waiting refusal names {} calls, but a verdict names at most {MAX_WINDOW}",
                v.calls.len()
            ));
        }
        for c in v.calls.iter().chain(&v.loop_start) {
            long("a call id in the waiting refusal", &c.call_id, MAX_ID_BYTES)?;
        }
    }
    if calls > u32::MAX as usize || calls as u64 > u64::from(snap.seq) {
        return Err(format!(
            "the window holds {calls} calls but `seq` says only {} were seen",
            snap.seq
        ));
    }
    if calls > 0 && snap.epoch_ms.is_none() {
        return Err("the window holds calls but there is no `epoch_ms`".to_owned());
    }
    if snap.call_ids.len() > ID_POOL {
        return Err(format!(
            "{} call ids, but a session keeps at most {ID_POOL}",
            snap.call_ids.len()
        ));
    }
    if snap.loop_start_ids.len() > PINNED_IDS {
        return Err(format!(
            "{} loop-start call ids, but a session keeps at most {PINNED_IDS}",
            snap.loop_start_ids.len()
        ));
    }
    if let Some(c) = snap
        .loop_start_ids
        .iter()
        .find(|c| c.seq == 0 || c.seq > snap.seq || c.id.is_empty())
    {
        return Err(format!(
            "loop-start call id `{}` has seq {}, outside 1..={}, or is empty",
            c.id, c.seq, snap.seq
        ));
    }
    let mut slots = [false; ID_POOL];
    for c in &snap.call_ids {
        if c.seq == 0 || c.seq > snap.seq {
            return Err(format!(
                "call id `{}` has seq {}, outside 1..={}",
                c.id, c.seq, snap.seq
            ));
        }
        let slot = c.seq as usize % ID_POOL;
        if std::mem::replace(&mut slots[slot], true) {
            return Err(format!(
                "call id `{}` (seq {}) is one of two ids kept for seqs {ID_POOL} apart",
                c.id, c.seq
            ));
        }
    }
    let loops = |name: &str, loops: &[LoopV1]| {
        if loops.len() > Loops::CAPACITY {
            return Err(format!(
                "{} {name} loop counters, but a session keeps at most {}",
                loops.len(),
                Loops::CAPACITY
            ));
        }
        match loops.iter().find(|l| l.repeat == 0) {
            Some(l) => Err(format!(
                "{name} loop `{:016x}` has a repeat count of 0",
                l.key
            )),
            None => Ok(()),
        }
    };
    loops("session", &snap.loops)?;
    if let Some(m) = &snap.group {
        if m.group.is_empty() || m.worker.is_empty() {
            return Err("a group membership needs a group and a worker name".to_owned());
        }
        loops("group", &m.loops)?;
    }
    if let Some(t) = &snap.text
        && t.turns.len() > TURNS
    {
        return Err(format!(
            "{} recent turn digests, but a session keeps at most {TURNS}",
            t.turns.len()
        ));
    }
    if let Some(u) = &snap.user_turn
        && u.seq > snap.seq
    {
        return Err(format!(
            "the latest user message follows call {}, but `seq` says only {} were seen",
            u.seq, snap.seq
        ));
    }
    if snap.unknown_tools.len() > MAX_UNKNOWN {
        return Err(format!(
            "{} unknown tools, but a session keeps at most {MAX_UNKNOWN}",
            snap.unknown_tools.len()
        ));
    }
    if snap.unknown_tools.iter().any(String::is_empty) {
        return Err("an unknown tool has an empty name".to_owned());
    }
    Ok(())
}
