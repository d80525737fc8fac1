//! Detectors that run when a result arrives: no_progress, same_outcome, error_cascade,
//! test_fix. `k` is the position of the result's call in the window (0 = newest).

use loopguard_rules::config::{Counted, SameOutcome, TestFix};

use super::{Det, Detection, Involved, Record, Window, flag, for_record, needed};

fn older<'a>(w: &Window<'a>, k: usize) -> impl Iterator<Item = (usize, &'a Record)> + 'a {
    let w = *w;
    (k + 1..w.len()).filter_map(move |i| w.get(i).map(|r| (i, r)))
}

/// Tries counted newest first: calls decided together (made before the previous one's result
/// came back, `flag::BATCH`: one assistant message) are one try, since the model saw none of
/// their outcomes before it made them.
struct Tries<'a> {
    count: u32,
    newer: &'a Record,
}

impl<'a> Tries<'a> {
    /// The newest call's try.
    fn new(r: &'a Record) -> Tries<'a> {
        Tries { count: 1, newer: r }
    }

    /// The next older call of the run.
    fn add(&mut self, o: &'a Record) {
        if !self.newer.has(flag::BATCH) {
            self.count += 1;
        }
        self.newer = o;
    }
}

pub fn no_progress(w: &Window<'_>, k: usize, p: &Counted, allowance: u32) -> Option<Detection> {
    let r = w.get(k)?;
    // A wait that shows nothing is never counted; one that shows something (a terminal's
    // screen after a wait, a page after `browser_wait_for`) looks, as a poll does.
    if !p.enabled || !r.real_result() || (r.has(flag::WAIT) && r.has(flag::EMPTY)) {
        return None;
    }
    let mut count = 1u32;
    let mut start = k;
    for (i, o) in older(w, k) {
        // A successful modification since the older run is progress.
        if o.progress() && o.exact != r.exact {
            break;
        }
        if o.exact != r.exact || !o.real_result() {
            continue;
        }
        if !r.same_outcome_as(o) {
            break;
        }
        count += 1;
        start = i;
    }
    let threshold = if r.has(flag::WAIT) {
        p.threshold.saturating_mul(super::POLL_SLACK)
    } else {
        for_record(p.threshold, r)
    };
    // A poll of work still under way is expected to show the same until the work ends: how
    // often it may look is the call detectors' to judge ([`super::pending_due`]), or, for a
    // wait, which they do not count, this detector's at the same pace. That pace is slower, so
    // the window is read for it only where the count is due anyway.
    let due = count >= needed(threshold, allowance, count, start - k + 1)
        && (!super::polls_pending(w, k)
            || (r.has(flag::WAIT) && super::pending_due(count, p.threshold, allowance)));
    due.then(|| Detection {
        tool: Some(r.tool),
        involved: Involved::Exact(r.exact),
        start_seq: w.seq(start),
        ..Detection::new(Det::NoProgress, u64::from(r.exact), count, threshold)
    })
}

/// An error, or (with `include_empty`) an empty answer: the empty result of a call that looks
/// for something. Shell commands that print nothing succeeded, and so did a change to the
/// world that reports nothing (a file written, a button clicked): an empty result is no
/// answer only where an answer was asked for.
///
/// Retryable failures count here: one transient failure retried is not a loop, but different
/// calls all failing the same way is.
fn bad(r: &Record, include_empty: bool) -> bool {
    r.ran()
        && (r.has(flag::ERROR)
            || (include_empty && r.has(flag::EMPTY) && !r.has(flag::SHELL) && !r.has(flag::MODIFY)))
}

/// What `same_outcome` counts of a result: an error, an empty answer, or (with
/// `include_success`) an answer with something in it (long enough to have a sketch: a short
/// acknowledgement such as `ok` repeats in healthy work).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Error,
    Empty,
    Answer,
}

fn outcome(r: &Record, p: &SameOutcome) -> Option<Outcome> {
    if bad(r, p.include_empty) {
        // A failure that says nothing but its exit code (`grep` finding no match) is an empty
        // answer.
        Some(if r.has(flag::ERROR) && !r.has(flag::EMPTY) {
            Outcome::Error
        } else {
            Outcome::Empty
        })
    } else if p.include_success && r.ran() && r.has(flag::SKETCH) {
        Some(Outcome::Answer)
    } else {
        None
    }
}

/// `same_outcome`: different calls in a row with the same outcome: the same error, the same
/// empty answer, or (`include_success`) the same answer, counted in [`Tries`].
pub fn same_outcome(w: &Window<'_>, k: usize, p: &SameOutcome) -> Option<Detection> {
    let r = w.get(k)?;
    if !p.enabled {
        return None;
    }
    let kind = outcome(r, p)?;
    // Tries, newest first: the run goes on while each try has a call with the outcome. The
    // other calls of such a try do not end it: they were decided with that call, before the
    // model saw any outcome (a terminal shows one screen for a batch of keystrokes: the
    // batch's other calls have no answer of their own).
    let mut count = 1u32;
    let mut start = k;
    let mut distinct = false;
    // Whether the call visited next is of the try of the call visited last.
    let mut joined = r.has(flag::BATCH);
    // Whether the try being visited has a call with the outcome (the current call's has).
    let mut found = true;
    for (i, o) in older(w, k) {
        if !joined {
            if !found {
                break;
            }
            found = false;
        }
        joined = o.has(flag::BATCH);
        let same = o.digest == r.digest
            || (r.has(flag::ERROR) && o.has(flag::ERROR) && r.near_duplicate(o));
        if !o.ran() || outcome(o, p) != Some(kind) || !same {
            continue;
        }
        distinct |= o.exact != r.exact;
        if !found {
            count += 1;
            found = true;
        }
        start = i;
    }
    let threshold = match kind {
        Outcome::Error => p.threshold,
        Outcome::Empty => p.empty_threshold,
        Outcome::Answer => p.success_threshold,
    };
    (distinct && count >= threshold).then(|| Detection {
        tool: Some(r.tool),
        involved: Involved::Digest(r.digest),
        start_seq: w.seq(start),
        ..Detection::new(Det::SameOutcome, u64::from(r.digest), count, threshold)
    })
}

/// Consecutive failures of one tool. Test runs are left to `test_fix`.
pub fn error_cascade(w: &Window<'_>, k: usize, p: &Counted) -> Option<Detection> {
    let r = w.get(k)?;
    if !p.enabled || !r.failed() || r.has(flag::TEST) {
        return None;
    }
    let mut tries = Tries::new(r);
    let mut start = k;
    for (i, o) in
        older(w, k).filter(|(_, o)| o.tool == r.tool && o.real_result() && !o.has(flag::TEST))
    {
        if !o.has(flag::ERROR) {
            break;
        }
        tries.add(o);
        start = i;
    }
    let (count, threshold) = (tries.count, for_record(p.threshold, r));
    (count >= threshold).then(|| Detection {
        tool: Some(r.tool),
        involved: Involved::Tool(r.tool),
        start_seq: w.seq(start),
        file_tools_hint: r.has(flag::SHELL) && r.has(flag::FILE_OP),
        ..Detection::new(Det::ErrorCascade, u64::from(r.tool), count, threshold)
    })
}

pub fn test_fix(w: &Window<'_>, k: usize, p: &TestFix) -> Option<Detection> {
    let r = w.get(k)?;
    if !p.enabled || !r.has(flag::TEST) || !r.failed() {
        return None;
    }
    let mut count = 1u32;
    let mut start = k;
    for (i, o) in older(w, k).filter(|(_, o)| o.has(flag::TEST) && o.real_result()) {
        // A pass, or another failure (fewer tests failing, a new error), is progress.
        if !o.has(flag::ERROR) || o.digest != r.digest {
            break;
        }
        count += 1;
        start = i;
    }
    (count >= p.threshold).then(|| Detection {
        tool: Some(r.tool),
        involved: Involved::Test,
        start_seq: w.seq(start),
        ..Detection::new(Det::TestFix, 0x7e57_f1c5, count, p.threshold)
    })
}
