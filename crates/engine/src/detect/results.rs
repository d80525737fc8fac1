//! Detectors that run when a result arrives: no_progress, same_outcome, error_cascade,
//! test_fix. `k` is the position of the result's call in the window (0 = newest).

use loopguard_rules::config::{Counted, SameOutcome, TestFix};

use super::{Det, Detection, Involved, Record, Window, flag, for_record, needed};

fn older<'a>(w: &Window<'a>, k: usize) -> impl Iterator<Item = (usize, &'a Record)> + 'a {
    let w = *w;
    (k + 1..w.len()).filter_map(move |i| w.get(i).map(|r| (i, r)))
}

pub fn no_progress(w: &Window<'_>, k: usize, p: &Counted, allowance: u32) -> Option<Detection> {
    let r = w.get(k)?;
    if !p.enabled || !r.real_result() || r.has(flag::WAIT) {
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
    (count >= needed(for_record(p.threshold, r), allowance, count, start - k + 1)).then(|| {
        Detection {
            tool: Some(r.tool),
            involved: Involved::Exact(r.exact),
            start_seq: w.seq(start),
            ..Detection::new(
                Det::NoProgress,
                u64::from(r.exact),
                count,
                for_record(p.threshold, r),
            )
        }
    })
}

/// An error, or (with `include_empty`) an empty result of a non-shell call: shell commands
/// that print nothing succeeded.
///
/// Retryable failures count here: one transient failure retried is not a loop, but different
/// calls all failing the same way is.
fn bad(r: &Record, include_empty: bool) -> bool {
    r.ran() && (r.has(flag::ERROR) || (include_empty && r.has(flag::EMPTY) && !r.has(flag::SHELL)))
}

pub fn same_outcome(w: &Window<'_>, k: usize, p: &SameOutcome) -> Option<Detection> {
    let r = w.get(k)?;
    if !p.enabled || !bad(r, p.include_empty) {
        return None;
    }
    let mut count = 1u32;
    let mut start = k;
    let mut distinct = false;
    for (i, o) in older(w, k).filter(|(_, o)| o.ran()) {
        let same = o.digest == r.digest
            || (r.has(flag::ERROR) && o.has(flag::ERROR) && r.near_duplicate(o));
        if !bad(o, p.include_empty) || !same {
            break;
        }
        distinct |= o.exact != r.exact;
        count += 1;
        start = i;
    }
    // Every counted result has this one's digest: all errors, or all empty answers.
    let threshold = if r.has(flag::ERROR) {
        p.threshold
    } else {
        p.empty_threshold
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
    let mut count = 1u32;
    let mut start = k;
    for (i, o) in
        older(w, k).filter(|(_, o)| o.tool == r.tool && o.real_result() && !o.has(flag::TEST))
    {
        if !o.has(flag::ERROR) {
            break;
        }
        count += 1;
        start = i;
    }
    (count >= for_record(p.threshold, r)).then(|| Detection {
        tool: Some(r.tool),
        involved: Involved::Tool(r.tool),
        start_seq: w.seq(start),
        file_tools_hint: r.has(flag::SHELL) && r.has(flag::FILE_OP),
        ..Detection::new(
            Det::ErrorCascade,
            u64::from(r.tool),
            count,
            for_record(p.threshold, r),
        )
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
