//! Detectors that run when a call arrives: exact_repeat, fuzzy_repeat, cycle, interleaved,
//! unknown_tool. The current call is the newest record of the window.

use loopguard_rules::config::{Cycle, ExactRepeat, FuzzyRepeat, Interleaved, UnknownTool};

use super::{Det, Detection, Involved, Record, Window, flag};

/// Counts the current call plus earlier matching calls. Retried calls after a retryable error
/// are skipped; with `reset`, a repeat whose result differs from the next one ends the count.
fn repeat_count(
    w: &Window<'_>,
    same: impl Fn(&Record) -> bool,
    consecutive: bool,
    reset: bool,
    fuzzy: bool,
) -> Option<(u32, usize)> {
    w.get(0)?;
    let mut count = 1u32;
    let mut start = 0usize;
    let mut newer: Option<&Record> = None;
    for (k, r) in w.iter().enumerate().skip(1) {
        if !same(r) {
            if consecutive {
                break;
            }
            continue;
        }
        if r.has(flag::WAIT) || (r.has(flag::RESULT) && r.has(flag::RETRYABLE)) {
            continue;
        }
        if reset && r.real_result() {
            if let Some(n) = newer
                && (!fuzzy || n.exact == r.exact)
                && n.digest != r.digest
            {
                break;
            }
            newer = Some(r);
        }
        count += 1;
        start = k;
    }
    Some((count, start))
}

pub fn exact_repeat(w: &Window<'_>, p: &ExactRepeat, allowance: u32) -> Option<Detection> {
    let cur = w.get(0)?;
    if !p.enabled || cur.has(flag::WAIT) {
        return None;
    }
    let (count, start) = repeat_count(
        w,
        |r| r.exact == cur.exact,
        p.consecutive,
        p.reset_on_changed_result,
        false,
    )?;
    (count >= p.threshold.saturating_add(allowance)).then(|| Detection {
        tool: Some(cur.tool),
        involved: Involved::Exact(cur.exact),
        start_seq: w.seq(start),
        ..Detection::new(Det::ExactRepeat, cur.exact, count, p.threshold)
    })
}

pub fn fuzzy_repeat(w: &Window<'_>, p: &FuzzyRepeat, allowance: u32) -> Option<Detection> {
    let cur = w.get(0)?;
    if !p.enabled || cur.has(flag::WAIT) {
        return None;
    }
    let (count, start) = repeat_count(
        w,
        |r| r.fuzzy == cur.fuzzy,
        false,
        p.reset_on_changed_result,
        true,
    )?;
    (count >= p.threshold.saturating_add(allowance)).then(|| Detection {
        tool: Some(cur.tool),
        involved: Involved::Fuzzy(cur.fuzzy),
        start_seq: w.seq(start),
        ..Detection::new(Det::FuzzyRepeat, cur.fuzzy, count, p.threshold)
    })
}

/// Two positions one period apart continue a cycle: same call, and same result where both known.
fn same_step(a: &Record, b: &Record) -> bool {
    let changed = a.real_result() && b.real_result() && a.digest != b.digest;
    a.exact == b.exact && !a.has(flag::WAIT) && !b.has(flag::WAIT) && !changed
}

pub fn cycle(w: &Window<'_>, p: &Cycle, allowance: u32) -> Option<Detection> {
    let cur = w.get(0)?;
    if !p.enabled || cur.has(flag::WAIT) || p.repetitions == 0 {
        return None;
    }
    let reps = p.repetitions.saturating_add(allowance) as usize;
    for period in p.min_period.max(2)..=p.max_period {
        let per = period as usize;
        let need = per.saturating_mul(reps);
        if need > w.len() {
            break;
        }
        let distinct = (1..per).any(|k| w.get(k).is_some_and(|r| r.exact != cur.exact));
        if !distinct {
            continue;
        }
        let step = |i: usize| match (w.get(i), w.get(i + per)) {
            (Some(a), Some(b)) => same_step(a, b),
            _ => false,
        };
        if !(0..need - per).all(step) {
            continue;
        }
        let mut run = need;
        while run < w.len() && step(run - per) {
            run += 1;
        }
        let mut signature = period as u64;
        for k in 0..per {
            if let Some(r) = w.get(k) {
                signature = signature.wrapping_add(crate::hash::fmix(r.exact));
            }
        }
        return Some(Detection {
            tool: Some(cur.tool),
            involved: Involved::All,
            start_seq: w.seq(run - 1),
            ..Detection::new(Det::Cycle, signature, (run / per) as u32, p.repetitions)
        });
    }
    None
}

pub fn interleaved(w: &Window<'_>, p: &Interleaved, allowance: u32) -> Option<Detection> {
    let cur = w.get(0)?;
    if !p.enabled || cur.has(flag::WAIT) {
        return None;
    }
    let mut count = 1u32;
    let mut start = 0usize;
    let mut digest = None;
    let mut gap = false;
    let mut last = 0usize;
    for (k, r) in w.iter().enumerate().skip(1) {
        if r.exact != cur.exact || (r.has(flag::RESULT) && r.has(flag::RETRYABLE)) {
            continue;
        }
        if p.failures_only {
            if !r.failed() {
                break;
            }
            match digest {
                None => digest = Some(r.digest),
                Some(d) if d != r.digest => break,
                Some(_) => {}
            }
        }
        gap |= k > last + 1;
        last = k;
        count += 1;
        start = k;
    }
    (gap && count >= p.threshold.saturating_add(allowance)).then(|| Detection {
        tool: Some(cur.tool),
        involved: Involved::Exact(cur.exact),
        start_seq: w.seq(start),
        ..Detection::new(Det::Interleaved, cur.exact, count, p.threshold)
    })
}

/// `unknown`: the tool is not among the known tools, or a result said it does not exist.
pub fn unknown_tool(w: &Window<'_>, p: &UnknownTool, unknown: bool) -> Option<Detection> {
    let cur = w.get(0)?;
    if !p.enabled || !unknown {
        return None;
    }
    let mut count = 0u32;
    let mut start = 0usize;
    for (k, _) in w.iter().enumerate().filter(|(_, r)| r.tool == cur.tool) {
        count += 1;
        start = k;
    }
    (count >= p.threshold).then(|| Detection {
        tool: Some(cur.tool),
        involved: Involved::Tool(cur.tool),
        start_seq: w.seq(start),
        ..Detection::new(Det::UnknownTool, u64::from(cur.tool), count, p.threshold)
    })
}
