//! Detectors that run when a call arrives: exact_repeat, fuzzy_repeat, cycle, interleaved,
//! unknown_tool, stagnation. The current call is the newest record of the window.
//!
//! On the hot path, [`scan`] runs exact_repeat, fuzzy_repeat, interleaved and unknown_tool in
//! one pass over the window; the one-detector functions give the same answers one at a time.

use loopguard_rules::Detectors;
use loopguard_rules::config::{Counted, Cycle};
#[cfg(test)]
use loopguard_rules::config::{ExactRepeat, FuzzyRepeat, Interleaved, UnknownTool};

use super::{
    Det, Detection, Involved, RETRY_SLACK, Record, Window, flag, for_record, needed, pending_due,
    polls_pending,
};

#[cfg(test)]
/// Counts the current call plus earlier matching calls. Calls whose result was a retryable
/// error are counted apart (the third value, the oldest of them the fourth); with `reset`, a
/// repeat whose result differs from the next one ends the count.
fn repeat_count(
    w: &Window<'_>,
    same: impl Fn(&Record) -> bool,
    consecutive: bool,
    reset: bool,
    fuzzy: bool,
) -> Option<(u32, usize, u32, usize)> {
    let cur = w.get(0)?;
    let mut count = 1u32;
    let mut start = 0usize;
    let (mut retries, mut retry_start) = (0u32, 0usize);
    let mut newer: Option<&Record> = None;
    for (k, r) in w.iter().enumerate().skip(1) {
        // A successful modification since the older repeats is progress.
        if r.progress() && r.exact != cur.exact {
            break;
        }
        if !same(r) {
            if consecutive {
                break;
            }
            continue;
        }
        if r.has(flag::WAIT) {
            continue;
        }
        if r.has(flag::RESULT) && r.has(flag::RETRYABLE) {
            retries += 1;
            retry_start = k;
            continue;
        }
        if reset && r.real_result() {
            if let Some(n) = newer
                && (!fuzzy || n.exact == r.exact)
                && !n.same_outcome_as(r)
            {
                break;
            }
            newer = Some(r);
        }
        count += 1;
        start = k;
    }
    Some((count, start, retries, retry_start))
}

/// The count and the oldest call of an `exact_repeat` detection, if the repeats (`count`
/// from `start`) or, with the retries of a call the infrastructure refused (`retries`, the
/// oldest at `retry_start`), [`RETRY_SLACK`] times the threshold call for one.
fn exact_found(
    threshold: u32,
    allowance: u32,
    (count, start, retries, retry_start): (u32, usize, u32, usize),
) -> Option<(u32, usize)> {
    if count >= needed(threshold, allowance, count, start + 1) {
        return Some((count, start));
    }
    let total = count.saturating_add(retries);
    (retries > 0
        && total
            >= threshold
                .saturating_mul(RETRY_SLACK)
                .saturating_add(allowance))
    .then_some((total, start.max(retry_start)))
}

#[cfg(test)]
pub fn exact_repeat(w: &Window<'_>, p: &ExactRepeat, allowance: u32) -> Option<Detection> {
    let cur = w.get(0)?;
    if !p.enabled || cur.has(flag::WAIT) {
        return None;
    }
    let counted = repeat_count(
        w,
        |r| r.exact == cur.exact,
        p.consecutive,
        p.reset_on_changed_result,
        false,
    )?;
    exact_found(for_record(p.threshold, cur), allowance, counted).map(|(count, start)| Detection {
        tool: Some(cur.tool),
        involved: Involved::Exact(cur.exact),
        start_seq: w.seq(start),
        ..Detection::new(
            Det::ExactRepeat,
            u64::from(cur.exact),
            count,
            for_record(p.threshold, cur),
        )
    })
}

#[cfg(test)]
pub fn fuzzy_repeat(w: &Window<'_>, p: &FuzzyRepeat, allowance: u32) -> Option<Detection> {
    let cur = w.get(0)?;
    if !p.enabled || cur.has(flag::WAIT) {
        return None;
    }
    let (count, start, _, _) = repeat_count(
        w,
        |r| r.fuzzy == cur.fuzzy,
        false,
        p.reset_on_changed_result,
        true,
    )?;
    (count >= needed(for_record(p.threshold, cur), allowance, count, start + 1)).then(|| {
        Detection {
            tool: Some(cur.tool),
            involved: Involved::Fuzzy(cur.fuzzy),
            start_seq: w.seq(start),
            ..Detection::new(
                Det::FuzzyRepeat,
                u64::from(cur.fuzzy),
                count,
                for_record(p.threshold, cur),
            )
        }
    })
}

/// Two positions one period apart continue a cycle: same call, and no progress in its result
/// where both are known (with `reset`; without, a changed result is no progress).
fn same_step(a: &Record, b: &Record, reset: bool) -> bool {
    let changed = reset && a.real_result() && b.real_result() && !a.same_outcome_as(b);
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
        // With `confirm`, the first call of the next turn too.
        let need = per.saturating_mul(reps) + usize::from(p.confirm);
        if need > w.len() {
            break;
        }
        let step = |i: usize| match (w.get(i), w.get(i + per)) {
            (Some(a), Some(b)) => same_step(a, b, p.reset_on_changed_result),
            _ => false,
        };
        // The current call one period back is the cheapest condition to check, so first.
        if !step(0) {
            continue;
        }
        let distinct = (1..per).any(|k| w.get(k).is_some_and(|r| r.exact != cur.exact));
        if !distinct {
            continue;
        }
        if !(1..need - per).all(step) {
            continue;
        }
        let mut run = need;
        while run < w.len() && step(run - per) {
            run += 1;
        }
        let mut signature = period as u64;
        for k in 0..per {
            if let Some(r) = w.get(k) {
                signature = signature.wrapping_add(crate::hash::fmix(u64::from(r.exact)));
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

/// What a step of a failing cycle is: a failure of a tool with its error signature, or a call
/// that did not fail.
fn outcome_id(r: &Record) -> u64 {
    if r.failed() {
        crate::hash::combine(u64::from(r.tool), u64::from(r.digest))
    } else {
        u64::from(r.exact)
    }
}

/// The cycle detector on a result: a cycle whose steps fail the same way while their arguments
/// vary a little (`npm ci` fails, `npm run build` fails, `npm ci --no-audit` fails, …). `k` is
/// the position of the call whose result arrived; cycles of identical calls are left to
/// [`cycle`], which sees them when the call arrives.
pub fn failing_cycle(w: &Window<'_>, k: usize, p: &Cycle, allowance: u32) -> Option<Detection> {
    let cur = w.get(k)?;
    if !p.enabled || !cur.failed() || p.repetitions == 0 {
        return None;
    }
    let reps = p.repetitions.saturating_add(allowance) as usize;
    let same = |a: &Record, b: &Record| {
        !a.has(flag::WAIT)
            && !b.has(flag::WAIT)
            && a.real_result()
            && b.real_result()
            && if a.exact == b.exact {
                a.same_outcome_as(b)
            } else {
                a.tool == b.tool && a.same_failure_as(b)
            }
    };
    for period in p.min_period.max(2)..=p.max_period {
        let per = period as usize;
        let need = per.saturating_mul(reps) + usize::from(p.confirm);
        if k + need > w.len() {
            break;
        }
        let step = |i: usize| match (w.get(k + i), w.get(k + i + per)) {
            (Some(a), Some(b)) => same(a, b),
            _ => false,
        };
        if !step(0) {
            continue;
        }
        let id = outcome_id(cur);
        if !(1..per).any(|i| w.get(k + i).is_some_and(|r| outcome_id(r) != id)) {
            continue;
        }
        if !(1..need - per).all(step) {
            continue;
        }
        // Identical calls all along are `cycle`'s.
        let varied = (0..need - per).any(|i| match (w.get(k + i), w.get(k + i + per)) {
            (Some(a), Some(b)) => a.exact != b.exact,
            _ => false,
        });
        if !varied {
            continue;
        }
        let mut run = need;
        while k + run < w.len() && step(run - per) {
            run += 1;
        }
        let mut signature = period as u64 ^ 0xfa11;
        for i in 0..per {
            if let Some(r) = w.get(k + i) {
                signature = signature.wrapping_add(crate::hash::fmix(outcome_id(r)));
            }
        }
        return Some(Detection {
            tool: Some(cur.tool),
            involved: Involved::All,
            start_seq: w.seq(k + run - 1),
            ..Detection::new(Det::Cycle, signature, (run / per) as u32, p.repetitions)
        });
    }
    None
}

#[cfg(test)]
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
        if r.progress() && r.exact != cur.exact {
            break;
        }
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
    (gap && count >= for_record(p.threshold, cur).saturating_add(allowance)).then(|| Detection {
        tool: Some(cur.tool),
        involved: Involved::Exact(cur.exact),
        start_seq: w.seq(start),
        ..Detection::new(
            Det::Interleaved,
            u64::from(cur.exact),
            count,
            for_record(p.threshold, cur),
        )
    })
}

#[cfg(test)]
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

/// Every detector that runs when a call arrives, in detector order: exact_repeat,
/// fuzzy_repeat, cycle, interleaved, unknown_tool, stagnation; `None` when none of them found a
/// loop. A call that is an exact repeat is not also reported as a fuzzy one. `unknown`: see
/// [`scan`].
#[inline]
pub fn detect(
    w: &Window<'_>,
    d: &Detectors,
    allowance: u32,
    unknown: bool,
) -> Option<[Option<Detection>; 6]> {
    let cur = w.get(0)?;
    // Most calls share no key with any other live call. Then only a threshold of one, a
    // counted tool or a run of state queries can make a detector fire, and the window is
    // looked at once, for the keys alone.
    let waiting = cur.has(flag::WAIT);
    let at_once = |on: bool, threshold: u32| on && threshold.saturating_add(allowance) <= 1;
    let (pe, pf) = (&d.exact_repeat, &d.fuzzy_repeat);
    let lone_fires = (d.unknown_tool.enabled && unknown)
        || (d.stagnation.enabled && cur.idle())
        || (!waiting && (at_once(pe.enabled, pe.threshold) || at_once(pf.enabled, pf.threshold)));
    if !lone_fires && !shares_keys(w, cur) {
        return None;
    }
    detect_all(w, d, allowance, unknown)
}

/// [`detect`] past its first look at the window's keys.
#[inline(never)]
fn detect_all(
    w: &Window<'_>,
    d: &Detectors,
    allowance: u32,
    unknown: bool,
) -> Option<[Option<Detection>; 6]> {
    let (mut found, repeated) = scan_window(w, d, allowance, unknown);
    // A call that is an exact repeat is not also reported as a fuzzy one, flagged or not.
    if found.exact.is_some() {
        found.fuzzy = None;
    }
    let flagged = found.exact.is_some() || found.fuzzy.is_some() || found.interleaved.is_some();
    if flagged && polls_pending(w, 0) {
        let due = |f: &mut Option<Detection>, threshold: u32| {
            *f = f.filter(|f| pending_due(f.count, threshold, allowance));
        };
        due(&mut found.exact, d.exact_repeat.threshold);
        due(&mut found.fuzzy, d.fuzzy_repeat.threshold);
        due(&mut found.interleaved, d.interleaved.threshold);
    }
    let all = [
        found.exact,
        found.fuzzy,
        // A cycle's first step is the current call one period back: none without another
        // live call with the current call's exact key.
        repeated.then(|| cycle(w, &d.cycle, allowance)).flatten(),
        found.interleaved,
        found.unknown,
        stagnation(w, &d.stagnation, allowance),
    ];
    all.iter().any(Option::is_some).then_some(all)
}

/// The live records as two slices, `(newer, older)`: newest first is `newer` backwards, then
/// `older` backwards.
fn live_parts<'a>(w: &Window<'a>) -> (&'a [Record], &'a [Record]) {
    let (newer, older) = w.parts();
    let live = w.len();
    match newer.len().checked_sub(live) {
        Some(skip) => (newer.get(skip..).unwrap_or_default(), &[][..]),
        None => (
            newer,
            older
                .get(older.len().saturating_sub(live - newer.len())..)
                .unwrap_or_default(),
        ),
    }
}

/// Whether a live call other than the current one `cur` (the newest) has its exact or its
/// fuzzy key.
#[inline]
fn shares_keys(w: &Window<'_>, cur: &Record) -> bool {
    // Both keys in one word, compared at once: a half of `x` that is zero (a key that matches)
    // sets its top bit in `(x - LOW) & !x`, and a nonzero half does not, except that a borrow
    // out of a zero low half can set it in a high half of 1, when the low half matched anyway.
    // Each half counts its matches, the current call's own among them; the loop has no exit
    // and no branch, so it is vectorized.
    const LOW: u64 = 0x0000_0001_0000_0001;
    let keys = |r: &Record| u64::from(r.exact) | u64::from(r.fuzzy) << 32;
    let want = keys(cur);
    let count = |n: u64, r: &Record| {
        let x = keys(r) ^ want;
        n + ((x.wrapping_sub(LOW) & !x) >> 31 & LOW)
    };
    let n = if w.len() == w.buf.len() {
        // The whole ring is live, in one slice.
        w.buf.iter().fold(0, count)
    } else {
        let (newer, older) = live_parts(w);
        newer.iter().fold(0, count) + older.iter().fold(0, count)
    };
    n & 0xffff_ffff > 1 || n >> 32 > 1
}

/// Whether a live call other than the current one `cur` (the newest) has its exact or its
/// fuzzy key or its tool.
fn shares_keys_or_tool(w: &Window<'_>, cur: &Record) -> bool {
    let (newer, older) = live_parts(w);
    let shares = |r: &&Record| r.exact == cur.exact || r.fuzzy == cur.fuzzy || r.tool == cur.tool;
    // The current call shares its own keys.
    newer.iter().filter(shares).count() + older.iter().filter(shares).count() > 1
}

/// The loop key of `stagnation`: one loop per session, however the idle calls are spelled.
const STAGNATION_KEY: u64 = 0x5374_6174_6551_7279;

/// `stagnation`: the current call ends a run of at least `threshold` (plus the allowance)
/// calls that do no work ([`Record::idle`]: state queries such as `git status`, waits, command
/// lines that do nothing such as `echo alive` or `pwd`), at least two of them no wait, with no
/// other call between them and none showing anything new. Nothing was done between them, so
/// what they show cannot have changed for the agent's doing, however differently each one
/// asks; any other call (an edit, a test run, a file read) ends the run, and so does a wait
/// whose result shows something no call before it showed, or a call whose result changed
/// since its previous run (a background job moving on: watching it is progress). A run of
/// waits alone is never counted: a wait that shows nothing is no loop.
pub fn stagnation(w: &Window<'_>, p: &Counted, allowance: u32) -> Option<Detection> {
    let cur = w.get(0)?;
    if !p.enabled || !cur.idle() {
        return None;
    }
    let need = p.threshold.saturating_add(allowance);
    let mut count = 0u32;
    let mut looks = 0u32;
    let mut start = 0usize;
    for (k, r) in w.iter().enumerate() {
        if !r.idle() || shows_new(w, k, r) {
            break;
        }
        count += 1;
        looks += u32::from(!r.has(flag::WAIT));
        start = k;
    }
    (count >= need && looks >= 2).then(|| Detection {
        tool: Some(cur.tool),
        involved: Involved::Idle,
        start_seq: w.seq(start),
        ..Detection::new(Det::Stagnation, STAGNATION_KEY, count, p.threshold)
    })
}

/// Whether the result of `r`, the window's call `k`, shows something new: it changed since
/// the call's previous run, or `r` is a wait whose result (with something in it) no older
/// call of the window showed.
fn shows_new(w: &Window<'_>, k: usize, r: &Record) -> bool {
    if !r.real_result() || r.has(flag::EMPTY) {
        return false;
    }
    r.has(flag::CHANGED)
        || (r.has(flag::WAIT)
            && !w
                .iter()
                .skip(k + 1)
                .any(|o| o.real_result() && o.digest == r.digest))
}

/// What [`scan`] found: the answers of [`exact_repeat`], [`fuzzy_repeat`], [`interleaved`] and
/// [`unknown_tool`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Scan {
    pub exact: Option<Detection>,
    pub fuzzy: Option<Detection>,
    pub interleaved: Option<Detection>,
    pub unknown: Option<Detection>,
}

/// The state of one repeat count ([`repeat_count`]) during a [`scan`].
#[derive(Clone, Copy)]
struct Repeat {
    /// Still counting (no `break` yet).
    on: bool,
    count: u32,
    start: usize,
    /// The newest counted call with a real result.
    newer: Option<Record>,
    /// Calls whose result was a retryable error, and the oldest of them.
    retries: u32,
    retry_start: usize,
}

impl Repeat {
    fn new(on: bool) -> Repeat {
        Repeat {
            on,
            count: 1,
            start: 0,
            newer: None,
            retries: 0,
            retry_start: 0,
        }
    }

    /// One older record `r` at position `k`: the body of [`repeat_count`]'s loop.
    #[inline(always)]
    fn step(
        &mut self,
        k: usize,
        r: &Record,
        same: bool,
        consecutive: bool,
        reset: bool,
        fuzzy: bool,
    ) {
        if !same {
            self.on &= !consecutive;
            return;
        }
        if r.has(flag::WAIT) {
            return;
        }
        if r.has(flag::RESULT) && r.has(flag::RETRYABLE) {
            self.retries += 1;
            self.retry_start = k;
            return;
        }
        if reset && r.real_result() {
            if let Some(n) = self.newer
                && (!fuzzy || n.exact == r.exact)
                && !n.same_outcome_as(r)
            {
                self.on = false;
                return;
            }
            self.newer = Some(*r);
        }
        self.count += 1;
        self.start = k;
    }
}

/// The state of [`interleaved`] during a [`scan`].
#[derive(Clone, Copy)]
struct Interleave {
    on: bool,
    count: u32,
    start: usize,
    digest: Option<u32>,
    gap: bool,
    last: usize,
}

impl Interleave {
    #[inline(always)]
    fn step(&mut self, k: usize, r: &Record, cur: &Record, failures_only: bool) {
        if r.exact != cur.exact || (r.has(flag::RESULT) && r.has(flag::RETRYABLE)) {
            return;
        }
        if failures_only {
            if !r.failed() {
                self.on = false;
                return;
            }
            match self.digest {
                None => self.digest = Some(r.digest),
                Some(d) if d != r.digest => {
                    self.on = false;
                    return;
                }
                Some(_) => {}
            }
        }
        self.gap |= k > self.last + 1;
        self.last = k;
        self.count += 1;
        self.start = k;
    }
}

/// exact_repeat, fuzzy_repeat, interleaved and unknown_tool in one pass over the window,
/// newest first, stopping once none of them can change its answer. `unknown`: the tool is not
/// among the known tools, or a result said it does not exist.
#[cfg(test)]
pub fn scan(w: &Window<'_>, d: &Detectors, allowance: u32, unknown: bool) -> Scan {
    scan_window(w, d, allowance, unknown).0
}

/// [`scan`], and whether another live call has the current call's exact key.
fn scan_window(w: &Window<'_>, d: &Detectors, allowance: u32, unknown: bool) -> (Scan, bool) {
    let Some(cur) = w.get(0) else {
        return (Scan::default(), false);
    };
    let (pe, pf, pi, pu) = (
        &d.exact_repeat,
        &d.fuzzy_repeat,
        &d.interleaved,
        &d.unknown_tool,
    );
    let waiting = cur.has(flag::WAIT);
    let mut exact = Repeat::new(pe.enabled && !waiting);
    let mut fuzzy = Repeat::new(pf.enabled && !waiting);
    let mut inter = Interleave {
        on: pi.enabled && !waiting,
        count: 1,
        start: 0,
        digest: None,
        gap: false,
        last: 0,
    };
    let count_tool = pu.enabled && unknown;
    let (mut tool_count, mut tool_start) = (1u32, 0usize);
    let (exact_on, fuzzy_on, inter_on) = (exact.on, fuzzy.on, inter.on);

    // Most windows hold no other call with the current call's keys (or tool, when its calls
    // are counted): then every count is the current call's alone, which one pass over the
    // records' keys, with no state to keep, settles.
    let alone = !if count_tool {
        shares_keys_or_tool(w, cur)
    } else {
        shares_keys(w, cur)
    };
    let repeated = !alone && {
        let (newer, older) = live_parts(w);
        newer.iter().filter(|r| r.exact == cur.exact).count()
            + older.iter().filter(|r| r.exact == cur.exact).count()
            > 1
    };

    for k in (1..w.len()).take_while(|_| !alone) {
        if !(exact.on || fuzzy.on || inter.on || count_tool) {
            break;
        }
        let Some(r) = w.get(k) else {
            break;
        };
        // A successful modification since the older repeats is progress.
        if r.progress() && r.exact != cur.exact {
            exact.on = false;
            fuzzy.on = false;
            inter.on = false;
            if !count_tool {
                break;
            }
            if r.tool == cur.tool {
                tool_count += 1;
                tool_start = k;
            }
            continue;
        }
        // Most records share nothing with the current call (the tool matters only when its
        // calls are counted).
        if r.exact != cur.exact && r.fuzzy != cur.fuzzy && (!count_tool || r.tool != cur.tool) {
            exact.on &= !pe.consecutive;
            continue;
        }
        if exact.on {
            let same = r.exact == cur.exact;
            exact.step(
                k,
                r,
                same,
                pe.consecutive,
                pe.reset_on_changed_result,
                false,
            );
        }
        if fuzzy.on {
            let same = r.fuzzy == cur.fuzzy;
            fuzzy.step(k, r, same, false, pf.reset_on_changed_result, true);
        }
        if inter.on {
            inter.step(k, r, cur, pi.failures_only);
        }
        if count_tool && r.tool == cur.tool {
            tool_count += 1;
            tool_start = k;
        }
    }

    let detection =
        |det: Det, key: u64, count: u32, threshold: u32, involved, start: usize| Detection {
            tool: Some(cur.tool),
            involved,
            start_seq: w.seq(start),
            ..Detection::new(det, key, count, threshold)
        };
    let found = Scan {
        exact: exact_on
            .then(|| {
                exact_found(
                    for_record(pe.threshold, cur),
                    allowance,
                    (exact.count, exact.start, exact.retries, exact.retry_start),
                )
            })
            .flatten()
            .map(|(count, start)| {
                let e = cur.exact;
                detection(
                    Det::ExactRepeat,
                    u64::from(e),
                    count,
                    for_record(pe.threshold, cur),
                    Involved::Exact(e),
                    start,
                )
            }),
        fuzzy: (fuzzy_on
            && fuzzy.count
                >= needed(
                    for_record(pf.threshold, cur),
                    allowance,
                    fuzzy.count,
                    fuzzy.start + 1,
                ))
        .then(|| {
            let f = cur.fuzzy;
            detection(
                Det::FuzzyRepeat,
                u64::from(f),
                fuzzy.count,
                for_record(pf.threshold, cur),
                Involved::Fuzzy(f),
                fuzzy.start,
            )
        }),
        interleaved: (inter_on
            && inter.gap
            && inter.count >= for_record(pi.threshold, cur).saturating_add(allowance))
        .then(|| {
            let e = cur.exact;
            detection(
                Det::Interleaved,
                u64::from(e),
                inter.count,
                for_record(pi.threshold, cur),
                Involved::Exact(e),
                inter.start,
            )
        }),
        unknown: (count_tool && tool_count >= pu.threshold).then(|| {
            let t = cur.tool;
            detection(
                Det::UnknownTool,
                u64::from(t),
                tool_count,
                pu.threshold,
                Involved::Tool(t),
                tool_start,
            )
        }),
    };
    (found, repeated)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn record() -> impl Strategy<Value = Record> {
        // Few distinct keys, digests and tools, so that matches are common.
        (0u32..3, 0u32..3, 0u32..2, 0usize..4, 0u16..2, any::<u16>()).prop_map(
            |(exact, fuzzy, digest, sketch, tool, flags)| Record {
                exact,
                fuzzy: fuzzy.min(exact),
                call: 0,
                digest,
                sketch: [0u64, 1, 0xff, 0xffff_0000_0000][sketch],
                time: 0,
                tool,
                flags: flags & 0x3fff,
            },
        )
    }

    fn detectors(
        consecutive: bool,
        reset: [bool; 2],
        failures_only: bool,
        enabled: [bool; 4],
        thresholds: [u32; 4],
    ) -> Detectors {
        static DEFAULT: std::sync::OnceLock<Detectors> = std::sync::OnceLock::new();
        let mut d = DEFAULT
            .get_or_init(|| {
                loopguard_rules::Policy::builtin_default()
                    .policy
                    .unwrap()
                    .resolve(None, None)
                    .detectors
            })
            .clone();
        d.exact_repeat.consecutive = consecutive;
        d.exact_repeat.reset_on_changed_result = reset[0];
        d.fuzzy_repeat.reset_on_changed_result = reset[1];
        d.interleaved.failures_only = failures_only;
        d.exact_repeat.enabled = enabled[0];
        d.fuzzy_repeat.enabled = enabled[1];
        d.interleaved.enabled = enabled[2];
        d.unknown_tool.enabled = enabled[3];
        d.exact_repeat.threshold = thresholds[0];
        d.fuzzy_repeat.threshold = thresholds[1];
        d.interleaved.threshold = thresholds[2];
        d.unknown_tool.threshold = thresholds[3];
        d
    }

    /// Two calls made in turn whose answers differ each time (a search engine's hits in
    /// another order): no cycle while a changed answer is progress, a cycle once it is not.
    #[test]
    fn a_cycle_of_calls_whose_answers_vary_by_themselves() {
        // Oldest first: A B A B A, every answer another digest.
        let ring: Vec<Record> = (0..5u32)
            .map(|i| Record {
                exact: 1 + i % 2,
                fuzzy: 1 + i % 2,
                digest: 10 + i,
                flags: flag::RESULT,
                ..Record::default()
            })
            .collect();
        let w = Window {
            buf: &ring,
            start: 0,
            filled: 5,
            live: 5,
            newest_seq: 100,
        };
        let mut p = detectors(false, [true; 2], true, [true; 4], [3, 4, 3, 2]).cycle;
        p.min_period = 2;
        p.max_period = 4;
        p.repetitions = 2;
        p.confirm = true;
        p.reset_on_changed_result = true;
        assert_eq!(cycle(&w, &p, 0), None);
        p.reset_on_changed_result = false;
        assert_eq!(cycle(&w, &p, 0).map(|d| d.count), Some(2));
    }

    proptest! {
        /// The one-pass scan answers exactly as the one-detector functions do, for any window
        /// (wrapped or not, partly expired) and any settings.
        #[test]
        fn scan_matches_the_detectors_one_by_one(
            ring in prop::collection::vec(record(), 1..12),
            start in 0usize..12,
            filled in 1usize..12,
            expired in 0usize..12,
            settings in (any::<bool>(), any::<[bool; 2]>(), any::<bool>(), any::<[bool; 4]>()),
            thresholds in prop::array::uniform4(1u32..5),
            allowance in 0u32..3,
            unknown in any::<bool>(),
        ) {
            let filled = filled.min(ring.len());
            let w = Window {
                buf: &ring,
                start: start % ring.len(),
                filled,
                live: filled - expired.min(filled - 1),
                newest_seq: 100,
            };
            let (consecutive, reset, failures_only, enabled) = settings;
            let d = detectors(consecutive, reset, failures_only, enabled, thresholds);
            let one_by_one = Scan {
                exact: exact_repeat(&w, &d.exact_repeat, allowance),
                fuzzy: fuzzy_repeat(&w, &d.fuzzy_repeat, allowance),
                interleaved: interleaved(&w, &d.interleaved, allowance),
                unknown: unknown_tool(&w, &d.unknown_tool, unknown),
            };
            prop_assert_eq!(scan(&w, &d, allowance, unknown), one_by_one);
            // `detect` leaves out the cycle detector only when it could not fire.
            let mut d = d;
            d.cycle.min_period = 2;
            d.cycle.max_period = 4;
            d.cycle.repetitions = 2;
            let all = detect(&w, &d, allowance, unknown);
            let [_, _, found, ..] = all.unwrap_or_default();
            prop_assert_eq!(found, cycle(&w, &d.cycle, allowance));
            // `detect` answers as the detectors one by one, and `None` when none fired.
            let exact = exact_repeat(&w, &d.exact_repeat, allowance);
            let each = [
                exact,
                fuzzy_repeat(&w, &d.fuzzy_repeat, allowance).filter(|_| exact.is_none()),
                cycle(&w, &d.cycle, allowance),
                interleaved(&w, &d.interleaved, allowance),
                unknown_tool(&w, &d.unknown_tool, unknown),
                stagnation(&w, &d.stagnation, allowance),
            ];
            prop_assert_eq!(all, each.iter().any(Option::is_some).then_some(each));
        }
    }
}
