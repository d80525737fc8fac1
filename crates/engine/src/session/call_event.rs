//! A call event: fingerprinted, recorded in the window, judged by the call detectors and
//! the group, then escalated.

use super::verdicts::{by_name, drop_exempt};
use super::*;
use crate::fingerprint::{FileWrite, NOOP_FUZZY};
use crate::hash::mix;

impl Session {
    pub(super) fn on_call(&mut self, c: &Call<'_>) -> Verdict {
        // The rules are borrowed while the session is not changed, and shared (an `Arc` clone)
        // only by what changes it with them in hand: most calls need no clone.
        let tool = self.rules.tool(c.tool);
        if !tool.watched {
            // Switched off by the policy: not recorded, so its result is ignored too.
            return Verdict::allow();
        }
        let keys = {
            let rules = &*self.rules;
            let det = rules.detectors(tool.category);
            rules
                .fingerprint
                .keys(&tool.keys, &c.arguments, &det.test_fix.test_commands)
        };
        // A call ends any text turn: that turn was not a monologue. Text said again after a
        // call is a status line about new work, not a repeated turn.
        if let Some(text) = &mut self.text {
            text.end_turn();
            text.forget_turns();
        }
        self.seq = self.seq.wrapping_add(1);
        let seq = self.seq;
        let now = self.rel(c.time_ms);
        let bit = |on: bool, f: u16| if on { f } else { 0 };
        // Against the previous call: made before its result came back, the two were decided
        // together (calls of one assistant message); made right after a wait, this call looks
        // at what was waited for: it polls; made again right after its result said the work
        // was still under way, it polls too.
        let exact = keys.exact as u32;
        let (batched, after_wait) =
            self.newest_index()
                .and_then(|i| self.ring.get(i))
                .map_or((false, false), |r| {
                    (
                        !r.has(flag::RESULT),
                        r.has(flag::WAIT) || (r.has(flag::PENDING) && r.exact == exact),
                    )
                });
        let wait = keys.wait || tool.waits;
        let flags = bit(wait, flag::WAIT)
            | bit(keys.poll || (after_wait && !wait), flag::POLL)
            | bit(keys.test || tool.tests, flag::TEST)
            | bit(keys.file_op, flag::FILE_OP)
            | bit(keys.query, flag::QUERY)
            | bit(tool.keys.shell, flag::SHELL)
            | bit(self.modifies(&keys, &tool, exact, now), flag::MODIFY)
            | bit(batched, flag::BATCH);
        // A command line that does nothing: such lines count together only while nothing else
        // is done, so their fuzzy key is the last call that did something; the record is known
        // by its digest, fixed from the call on.
        // Such a line is known by what was done before it, too: the same marker echoed after
        // other work (`echo DONE` once a command has finished) is no repeat of it, while the
        // same marker after the same work, or back to back, is.
        let idle = tool.keys.shell && keys.fuzzy == u64::from(NOOP_FUZZY);
        let (exact, fuzzy) = if idle {
            let anchor = self
                .full_window(now)
                .iter()
                .find(|r| !(r.has(flag::SHELL) && r.digest == NOOP_FUZZY))
                .map_or(0, |r| r.exact);
            (
                mix(u64::from(exact), u64::from(anchor)) as u32,
                mix(u64::from(NOOP_FUZZY), u64::from(anchor)) as u32,
            )
        } else {
            (exact, keys.fuzzy as u32)
        };
        self.push(Record {
            exact,
            fuzzy,
            digest: if idle { NOOP_FUZZY } else { 0 },
            sketch: 0,
            call: hash_str(c.call_id) as u32,
            time: now,
            tool: tool.id,
            flags,
        });
        self.remember_id(seq, c.call_id);
        if keys.typed.n > 0 {
            self.typed
                .get_or_insert_with(Box::default)
                .push(keys.typed.hashes());
        }
        let group = if self.group.is_some() {
            let rules = Arc::clone(&self.rules);
            self.group_call(&rules, &keys, tool.id, c.time_ms)
        } else {
            GroupCheck::Quiet
        };

        let rules = &*self.rules;
        let det = rules.detectors(tool.category);
        let w = self.window(now);
        let a = self.allowance;
        let unknown = !tool.known || (!self.unknown.is_empty() && self.unknown.contains(&tool.id));
        let found = calls::detect(&w, det, a, unknown);
        let hits = rules.plugins.on_call(c, &keys, &tool, &w);
        if found.is_none()
            && hits.detections.is_empty()
            && matches!(group, GroupCheck::Quiet)
            && self.armed.is_none()
        {
            // Nothing to escalate, and no refusal waiting.
            return Verdict {
                notes: hits.notes,
                ..Verdict::allow()
            };
        }
        let rules = Arc::clone(&self.rules);
        let [exact, fuzzy, cycle, interleaved, unknown_tool, stagnation] =
            found.unwrap_or_default();
        // The group loop comes last: on a tie the session's own detectors win.
        let group_loop = match &group {
            GroupCheck::Loop(d) => Some(*d),
            GroupCheck::Quiet | GroupCheck::Unavailable => None,
        };
        let mut cands = [
            exact,
            fuzzy,
            cycle,
            interleaved,
            unknown_tool.map(|d| by_name(d, &tool.name)),
            stagnation,
            group_loop,
        ];
        drop_exempt(&tool, &mut cands);
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

    /// Whether a call (not yet recorded) changes the world, so that its success is progress for
    /// the calls around it: a shell command that modifies, or a call of a modifying tool that
    /// does not only look (`"command": "view"`) and does not replace a text with itself. A write
    /// made again with no other write since (the previous write, the same call, did not fail)
    /// leaves the world as the first one left it: no change. So does a shell command whose
    /// only changes are literal writes of what the files already hold ([`Files`]), whatever
    /// was done between that left files alone. Keeps the session's memory of files up to date.
    fn modifies(
        &mut self,
        keys: &CallKeys,
        tool: &crate::compiled::ToolInfo,
        exact: u32,
        now: u32,
    ) -> bool {
        // A tool of a category that modifies, or any tool whose arguments are shaped as an
        // edit (a custom `apply_edit` or `patch_file`), writes.
        let writes =
            keys.modify || ((tool.modifies || keys.edit) && !keys.read_only && !keys.noop_edit);
        if !writes {
            return false;
        }
        let shell = keys.modify;
        let by_tool = FileWrite::by_tool(keys.target, exact);
        let writes = &keys.writes;
        let (known, harmless) = if shell {
            (writes.as_slice(), writes.others_harmless)
        } else if keys.target != 0 {
            (std::slice::from_ref(&by_tool), true)
        } else {
            (&[][..], false)
        };
        let unchanged = harmless
            && !known.is_empty()
            && known.iter().all(|x| {
                self.files
                    .wrote(x)
                    .is_some_and(|seq| !self.write_failed(seq, now))
            });
        if !harmless {
            self.files.clear();
        } else if !known.is_empty() {
            // The other kind's files may be among these.
            self.files.forget(!shell);
        }
        if !unchanged {
            for x in known {
                self.files.set(x, self.seq);
            }
        }
        !unchanged
            && !self
                .full_window(now)
                .iter()
                .find(|r| r.has(flag::MODIFY))
                .is_some_and(|r| r.exact == exact && !(r.has(flag::RESULT) && r.has(flag::ERROR)))
    }

    /// Whether the call `seq`, still in the window, failed (its result came back an error).
    fn write_failed(&self, seq: u32, now: u32) -> bool {
        let back = self.seq.wrapping_sub(1).wrapping_sub(seq) as usize;
        self.full_window(now)
            .iter()
            .nth(back)
            .is_some_and(|r| r.has(flag::RESULT) && r.has(flag::ERROR))
    }

    /// Records the call's fuzzy fingerprint in the session's group, if it is a worker of one, and
    /// says whether the swarm as a whole is looping on it. Waits (`sleep 30`) are not counted.
    pub(super) fn group_call(
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
    pub(super) fn store_refusal(&self, c: &Call<'_>, seq: u64) -> Verdict {
        let group = self.group.as_deref().map_or("", |m| &*m.group);
        let this = CallRef {
            seq,
            call_id: c.call_id.to_owned(),
        };
        Verdict {
            action: Action::Block,
            message: crate::message::store_unreachable(c.tool, group),
            detector: Some(Cow::Borrowed("group_store")),
            rule: Some("group.store".to_owned()),
            count: 0,
            calls: vec![this.clone()],
            loop_start: Some(this),
            notes: Vec::new(),
        }
    }
}
