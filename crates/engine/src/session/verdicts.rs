//! From detections to a verdict: the loop counters, the ladder step, the message.

use super::*;

impl Session {
    /// Picks the most severe outcome among the detections, the built-in detectors' and the
    /// plugins' (ties: detector order, built-in first, then plugins in policy order), counts it
    /// against its loop, and builds the verdict; plugin notes ride along. Also says whether the
    /// message carries the hint to use the file tools (failing shell file operations).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn escalate(
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
        let found = cands
            .iter()
            .flatten()
            .map(|d| Found::Builtin(*d))
            .chain(hits.found(&rules.plugins));
        for f in found {
            let loops = self.loops_for(&f);
            let Some(dec) = decide(rules, loops, self.flags, f, category, occasion) else {
                continue;
            };
            if best.as_ref().is_none_or(|b| dec.action > b.action) {
                best = Some(dec);
            }
        }
        let Some(dec) = best else {
            return (
                Verdict {
                    notes: hits.notes,
                    ..Verdict::allow()
                },
                false,
            );
        };
        self.loops_for_mut(&dec.found)
            .commit(dec.found.loop_key(), occasion);
        let mut verdict = if dec.action == Action::Allow {
            Verdict::allow()
        } else {
            let flags_before = self.flags;
            self.flags = self.flags.saturating_add(1);
            let verdict =
                self.build_verdict(rules, &dec, category, call, flags_before, occasion, now);
            if let Some(start) = &verdict.loop_start {
                self.ids.pin(start.seq as u32);
            }
            verdict
        };
        let hint = verdict.action != Action::Allow && dec.found.file_tools_hint();
        verdict.notes = hits.notes;
        (verdict, hint)
    }

    /// The verdict of a decision (not `allow`), for a built-in detector and a plugin alike.
    #[allow(clippy::too_many_arguments)]
    fn build_verdict(
        &self,
        rules: &CompiledRules,
        dec: &Decision<'_>,
        category: Option<usize>,
        call: Option<&Call<'_>>,
        flags_before: u32,
        occasion: u64,
        now: u32,
    ) -> Verdict {
        let found = &dec.found;
        let tool_info = found.tool().and_then(|id| rules.tool_by_id(id));
        let tool_name: Cow<'_, str> = match (call, &tool_info) {
            (Some(c), _) => Cow::Borrowed(c.tool),
            (None, Some(t)) => Cow::Owned(t.name.to_string()),
            (None, None) => Cow::Borrowed("text"),
        };
        let category_name = category
            .and_then(|i| rules.config.categories.get(i))
            .map_or("", |c| c.name.as_str());
        // The group ladder is the policy's choice for the swarm, not the tool category's.
        let in_category = if found.is_group() { "" } else { category_name };
        let rule = crate::escalation::rule_name(in_category, dec.ladder, dec.step);
        let file = match (call, &tool_info) {
            (Some(c), Some(t)) => file_of(&rules.fingerprint, &t.keys, &c.arguments),
            _ => String::new(),
        };
        let vars = Vars {
            tool: &tool_name,
            count: found.count(),
            detector: found.detector(),
            rule: &rule,
            pattern: found.pattern(),
            category: category_name,
            threshold: found.threshold(),
            window: rules.config.window_size,
            file: &file,
            flags: flags_before,
            action: dec.action.as_str(),
            workers: match (found.is_group(), self.group.as_deref()) {
                (true, Some(m)) => m.workers,
                _ => 1,
            },
        };
        let message = crate::message::verdict(
            dec.step,
            dec.action,
            &vars,
            found.detail(),
            found.file_tools_hint(),
        );
        let (calls, loop_start) = match found {
            Found::Builtin(d) => {
                let calls = self.calls_of(d, now);
                let start = calls.first().cloned();
                (calls, start)
            }
            // A plugin says that a loop is going on, not where it started: the verdict names
            // the call the event is about.
            Found::Plugin(_) => {
                let this = (occasion & TEXT_OCCASION == 0).then(|| CallRef {
                    seq: occasion,
                    call_id: self.id_of(occasion as u32),
                });
                (this.into_iter().collect(), None)
            }
        };
        Verdict {
            action: dec.action,
            message,
            detector: Some(match found {
                Found::Builtin(d) => Cow::Borrowed(d.det.name()),
                Found::Plugin(p) => Cow::Owned(p.name.to_owned()),
            }),
            rule: Some(rule),
            count: found.count(),
            calls,
            loop_start,
            notes: Vec::new(),
        }
    }

    /// The calls of the window a detection involves, oldest first.
    fn calls_of(&self, d: &Detection, now: u32) -> Vec<CallRef> {
        if d.involved == Involved::None {
            return Vec::new();
        }
        let w = self.window(now);
        let involved = |k: usize| {
            w.get(k)
                .is_some_and(|r| w.seq(k) >= d.start_seq && d.involved.matches(r))
        };
        // Marked and counted in one pass over the window, so the list is allocated once (it
        // grew by doubling: ~1,000 instructions a verdict naming 30 calls) and the records
        // are not read twice.
        let mut marked = [0u64; MAX_WINDOW.div_ceil(64)];
        if w.len() > 64 * marked.len() {
            // Longer than any policy's window: counted first, then listed.
            let mut calls = Vec::with_capacity((0..w.len()).filter(|&k| involved(k)).count());
            for k in (0..w.len()).rev().filter(|&k| involved(k)) {
                calls.push(CallRef {
                    seq: u64::from(w.seq(k)),
                    call_id: self.id_of(w.seq(k)),
                });
            }
            return calls;
        }
        let mut n = 0;
        for k in 0..w.len() {
            if involved(k)
                && let Some(m) = marked.get_mut(k / 64)
            {
                *m |= 1 << (k % 64);
                n += 1;
            }
        }
        let mut calls = Vec::with_capacity(n);
        // Oldest first: the highest marks first.
        for (j, &m) in marked.iter().enumerate().rev() {
            let mut m = m;
            while m != 0 {
                let bit = 63 - m.leading_zeros() as usize;
                m &= !(1 << bit);
                let seq = w.seq(j * 64 + bit);
                calls.push(CallRef {
                    seq: u64::from(seq),
                    call_id: self.id_of(seq),
                });
            }
        }
        calls
    }
}

/// Drops the detections of detectors the tool is exempt from (`tools.<name>.exempt`).
pub(super) fn drop_exempt(tool: &crate::compiled::ToolInfo, cands: &mut [Option<Detection>]) {
    if tool.exempt != 0 {
        for d in cands {
            *d = d.filter(|d| tool.watched_by(d.det));
        }
    }
}

/// A detection keyed by a tool id, keyed by the tool's name instead: tool ids depend on the order
/// in which an engine first saw its tools, and a loop counter must mean the same loop in the
/// engine a snapshot is restored into.
pub(super) fn by_name(d: Detection, tool: &str) -> Detection {
    Detection {
        key: hash_str(tool),
        ..d
    }
}
