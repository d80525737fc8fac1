//! A result event: normalized, matched with its call, judged by the result detectors.

use super::verdicts::{by_name, drop_exempt};
use super::*;

impl Session {
    pub(super) fn on_result(&mut self, r: &ToolResult<'_>) -> Verdict {
        let rules = Arc::clone(&self.rules);
        let now = self.rel(r.time_ms);
        let h = hash_str(r.call_id) as u32;
        let cap = self.cap();
        let Some(k) = self.full_window(now).iter().position(|x| x.call == h) else {
            return Verdict::allow();
        };
        // A command that changes files is often silent, and a harness that shows each command
        // before its output would show it alone: only the output of one that changes nothing
        // is read for an echo.
        let typed = match (&self.typed, self.full_window(now).get(k)) {
            (Some(t), Some(rec)) if rec.has(flag::SHELL) && !rec.has(flag::MODIFY) => t.hashes(),
            _ => &[],
        };
        let outcome = rules.results.outcome_typed(r, typed);
        // Whether the work is still under way matters only to a call made again, and a failure
        // is no state to wait on: only a successful result of a repeated call is read for it (a
        // first call's next repeat is not yet counted).
        let pending = !outcome.error
            && !rules.config.results.pending_patterns.is_empty()
            && {
                let w = self.full_window(now);
                w.get(k).is_some_and(|cur| {
                    (k + 1..w.len())
                        .filter_map(|i| w.get(i))
                        .any(|o| o.exact == cur.exact)
                })
            }
            && ends_match(&rules.config.results.pending_patterns, r.output);
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
            | flag::SKETCH
            | flag::PENDING);
        rec.flags |= flag::RESULT;
        // A test run that fails reports on the code under test, whatever statuses its tests
        // expected or met (`assert 503 == 200`): never the infrastructure's trouble.
        let retryable = outcome.retryable && !rec.has(flag::TEST);
        for (on, f) in [
            (outcome.error, flag::ERROR),
            (outcome.empty, flag::EMPTY),
            (retryable, flag::RETRYABLE),
            (pending, flag::PENDING),
        ] {
            if on {
                rec.flags |= f;
            }
        }
        // What a command line that does nothing prints is its own text: one outcome.
        if rec.has(flag::SHELL) && rec.digest == crate::fingerprint::NOOP_FUZZY {
            rec.digest = crate::fingerprint::NOOP_FUZZY;
            rec.sketch = 0;
        } else {
            // A test run's failures compare with syntax errors known by their type alone:
            // code that does not parse is one state ([`crate::normalize::Outcome::syntax`]).
            let digest = match outcome.syntax {
                Some(d) if rec.has(flag::TEST) => d,
                _ => outcome.digest,
            };
            rec.digest = digest as u32;
            rec.sketch = outcome.sketch.unwrap_or(0);
            if outcome.long {
                rec.flags |= flag::SKETCH;
            }
        }
        let mut rec = *rec;
        let full = self.full_window(now);
        let previous = (k + 1..full.len())
            .filter_map(|i| full.get(i))
            .find(|o| o.exact == rec.exact && o.real_result())
            .copied();
        // The host refused to run a call made again (a framework's own repeat guard): nothing
        // ran, so nothing changed, and the call is one more attempt. Otherwise: did the world
        // this call looks at change since its previous run?
        let refused =
            previous.is_some() && refused(&rules.config.results.refused_patterns, r.output);
        let changed = !refused && previous.is_some_and(|o| !rec.same_outcome_as(&o));
        let mark = if refused {
            flag::BLOCKED
        } else if changed {
            flag::CHANGED
        } else {
            0
        };
        if mark != 0
            && let Some(r) = self.ring.get_mut(idx)
        {
            r.flags |= mark;
            rec = *r;
        }
        let tool = rules.tool_by_id(rec.tool);
        let category = tool.as_ref().and_then(|t| t.category);
        let det = rules.detectors(category);
        if outcome.error
            && det.unknown_tool.enabled
            && !self.unknown.contains(&rec.tool)
            && ends_match(&det.unknown_tool.error_patterns, r.output)
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
        let [exact, fuzzy, cycle, interleaved, _, stagnation] = if lifted && k == 0 {
            let unknown = self.unknown.contains(&rec.tool);
            calls::detect(&w, det, a, unknown).unwrap_or_default()
        } else {
            [None; 6]
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
            stagnation,
        ];
        if let Some(t) = tool.as_deref() {
            drop_exempt(t, &mut cands);
        }
        // Plugins see the engine's judgement of failure (error patterns included); a failure
        // that says nothing but its exit code is an empty answer, no failure.
        let silent = outcome.error && outcome.empty;
        let judged = ToolResult {
            is_error: outcome.error && !silent,
            exit_code: if silent { None } else { r.exit_code },
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
            message: crate::message::refusal_waits(
                tool_name,
                verdict.detector.as_deref().unwrap_or("loop"),
                verdict.count,
                file_tools_hint,
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
    pub(super) fn judge_user_turn(&mut self, rec: &Record, k: usize, now: u32) -> bool {
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
}

/// Whether the start of a result says the host refused to run the call because it was made
/// again (`results.refused_patterns`).
fn refused(patterns: &[regex::Regex], output: &str) -> bool {
    if patterns.is_empty() {
        return false;
    }
    let mut head = output.len().min(END_BYTES);
    while !output.is_char_boundary(head) {
        head -= 1;
    }
    patterns.iter().any(|re| re.is_match(&output[..head]))
}

/// Bytes read from each end of a result for `results.pending_patterns` and
/// `detectors.unknown_tool.error_patterns`.
const END_BYTES: usize = 512;

/// Whether a pattern matches a result's first or last [`END_BYTES`] bytes: where a status line
/// (`still running`) or a harness's error about the call itself (`Unknown tool: x`) stands. The
/// rest of an output, however long, is not read.
fn ends_match(patterns: &[regex::Regex], output: &str) -> bool {
    if patterns.is_empty() {
        return false;
    }
    let [first, last] = super::ends(output, END_BYTES);
    patterns
        .iter()
        .any(|re| re.is_match(first) || (!last.is_empty() && re.is_match(last)))
}

/// [`ends_match`] for the tests.
#[cfg(test)]
pub(crate) fn pending_for_tests(patterns: &[regex::Regex], output: &str) -> bool {
    ends_match(patterns, output)
}
