//! From detections to a verdict: the loop counters, the ladder step, the message.

use super::*;

impl Session {
    /// Picks the most severe outcome among the detections, the built-in detectors' and the
    /// plugins' (ties: detector order, built-in first), counts it against its loop, and builds
    /// the verdict; plugin notes ride along. Also says whether the message carries the hint to
    /// use the file tools (failing shell file operations).
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

    pub(super) fn builtin_verdict(
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

    pub(super) fn build_verdict(
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
