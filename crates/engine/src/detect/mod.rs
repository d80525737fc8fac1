//! The built-in detectors. Each reads only the session's bounded window of call records (or, for
//! text, a few digests of recent turns) and returns at most one [`Detection`].

pub mod calls;
pub mod results;
pub mod text;

/// The built-in detectors: the one list of `loopguard_rules::schema` (names, `{pattern}`
/// words, parameters), with the group loop last.
pub use loopguard_rules::Detector as Det;

/// Tag mixed into loop keys so loops of different kinds never share a counter (the exact-key
/// detectors share one on purpose).
fn loop_tag(det: Det) -> u64 {
    match det {
        Det::ExactRepeat | Det::NoProgress | Det::Interleaved => 0,
        other => 0x9e37_79b9_7f4a_7c15 ^ (other as u64 + 1),
    }
}

/// Record flags.
pub mod flag {
    pub const RESULT: u16 = 1;
    pub const ERROR: u16 = 1 << 1;
    pub const EMPTY: u16 = 1 << 2;
    pub const RETRYABLE: u16 = 1 << 3;
    /// Refused by the engine: it never ran, no result will come.
    pub const BLOCKED: u16 = 1 << 4;
    pub const WAIT: u16 = 1 << 5;
    pub const TEST: u16 = 1 << 6;
    pub const FILE_OP: u16 = 1 << 7;
    pub const SHELL: u16 = 1 << 8;
    /// A call of a tool that changes the world (its category `modifies`).
    pub const MODIFY: u16 = 1 << 9;
    /// The result differs (substantively, see [`super::Record::same_outcome_as`]) from the
    /// previous result of the same call: the world this call looks at changed.
    pub const CHANGED: u16 = 1 << 10;
    /// The result has enough words for a near-duplicate sketch ([`crate::normalize::SKETCH_MIN_WORDS`]);
    /// a failure's is in `Record::sketch`.
    pub const SKETCH: u16 = 1 << 11;
    /// A shell command that only shows the state of the work (`shell.state_queries`).
    pub const QUERY: u16 = 1 << 12;
    /// A shell command line that waits and then looks (`sleep 30 && gh run view 42`).
    pub const POLL: u16 = 1 << 13;
    /// The call was made before the previous call's result came back (calls of one assistant
    /// message): the model decided both before it saw either outcome.
    pub const BATCH: u16 = 1 << 14;
    /// The result says the work it looks at is still under way (`results.pending_patterns`):
    /// the same call made next polls it.
    pub const PENDING: u16 = 1 << 15;
}

/// How many times their threshold the repeat detectors (`exact_repeat`, `fuzzy_repeat`,
/// `interleaved`, `no_progress`, `error_cascade`) need before they flag a poll
/// (`flag::POLL`): what it looks at changes by itself, and waiting for it takes a few looks.
pub const POLL_SLACK: u32 = 2;

/// How many times its threshold `exact_repeat` needs before it flags a call made again after
/// failures that were the infrastructure's trouble (`results.retryable_patterns`): retrying
/// through a rate limit or an outage is what such errors ask for, but not without end.
pub const RETRY_SLACK: u32 = 3;

/// The threshold of a repeat detector for the record `r`: [`POLL_SLACK`] times `threshold`
/// for a poll.
pub fn for_record(threshold: u32, r: &Record) -> u32 {
    if r.has(flag::POLL) {
        threshold.saturating_mul(POLL_SLACK)
    } else {
        threshold
    }
}

/// How many times their threshold the repeat detectors (`exact_repeat`, `fuzzy_repeat`,
/// `interleaved`; `no_progress` for a wait) need before they flag a poll of work that its previous look
/// said was still under way ([`polls_pending`]), and how many more polls each further flag
/// takes: a job that reports itself running changes by itself, and a long build or test run
/// takes many looks. Its counts still climb the ladder, a third as fast, so a job that never
/// ends is still stopped.
pub const PENDING_SLACK: u32 = 3;

/// Whether the record at `k` polls work still under way: the newest older run of its exact
/// call (one refused, which never ran, is passed over) had a result that said so
/// (`flag::PENDING`).
pub fn polls_pending(w: &Window<'_>, k: usize) -> bool {
    let Some(cur) = w.get(k) else {
        return false;
    };
    w.iter()
        .skip(k + 1)
        .find(|r| r.exact == cur.exact && r.real_result())
        .is_some_and(|r| r.has(flag::PENDING))
}

/// Whether a repeat detector with `threshold` flags a poll of work still under way at `count`
/// repeats: at [`PENDING_SLACK`] times the threshold (plus the user's `allowance`), then every
/// [`PENDING_SLACK`] times the threshold more.
pub fn pending_due(count: u32, threshold: u32, allowance: u32) -> bool {
    let step = threshold.max(1).saturating_mul(PENDING_SLACK);
    let first = step.saturating_add(allowance);
    count >= first && (count - first).is_multiple_of(step)
}

/// The count a repeat needs: `threshold` (plus the user's `allowance`) for repeats back to
/// back, one more when other calls came between them (the agent was doing other things too).
/// `span` is how many window positions the counted repeats cover.
pub fn needed(threshold: u32, allowance: u32, count: u32, span: usize) -> u32 {
    let gap = span > count as usize;
    threshold
        .saturating_add(allowance)
        .saturating_add(u32::from(gap))
}

/// One call in the window: 32 bytes. Its seq is implied by its position in the ring.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Record {
    /// A failure's near-duplicate sketch, when `flag::SKETCH` is set (0 for a success, which is
    /// never compared by sketch).
    pub sketch: u64,
    /// The exact fingerprint's low 32 bits (enough to tell calls apart within one window).
    pub exact: u32,
    /// The fuzzy fingerprint's low 32 bits.
    pub fuzzy: u32,
    /// Hash of the host's call id.
    pub call: u32,
    /// The normalized result's digest (32 bits suffice within one window), once it arrived.
    pub digest: u32,
    /// Event time in ms since the session's first event (saturating).
    pub time: u32,
    pub tool: u16,
    pub flags: u16,
}

impl Record {
    pub fn has(&self, f: u16) -> bool {
        self.flags & f != 0
    }

    /// A result that was produced by running the call (not refused, not retryable).
    pub fn real_result(&self) -> bool {
        self.has(flag::RESULT) && !self.has(flag::BLOCKED) && !self.has(flag::RETRYABLE)
    }

    pub fn failed(&self) -> bool {
        self.real_result() && self.has(flag::ERROR)
    }

    /// The result of this call shows no progress over `older`'s, a call with the same
    /// fingerprint: the same normalized result, or a failure after a failure (one error turning
    /// into another is not progress; a modification between them is, see [`Record::progress`]),
    /// or a write made again with nothing written since failing after it succeeded: the first
    /// made the change, and this one finds it made (`old_str` not found, nothing to commit).
    pub fn same_outcome_as(&self, older: &Record) -> bool {
        self.digest == older.digest
            || (self.failed() && older.failed())
            || (self.failed()
                && !self.has(flag::MODIFY)
                && older.has(flag::MODIFY)
                && older.real_result()
                && !older.has(flag::ERROR))
    }

    /// Both results are failures, and the same failure: the same error signature, or texts
    /// that are near-duplicates by their sketches (a long error page or trace that differs
    /// only in what it echoes of the request). Successful results are compared by
    /// [`Record::same_outcome_as`] alone: there one changed word can be the news (a status
    /// turning from `pending` to `done`), which a sketch cannot tell from noise.
    pub fn same_failure_as(&self, other: &Record) -> bool {
        self.failed()
            && other.failed()
            && (self.digest == other.digest || self.near_duplicate(other))
    }

    /// Both results have sketches, and they are near-duplicates (see
    /// [`crate::normalize::sketch`]).
    pub fn near_duplicate(&self, other: &Record) -> bool {
        self.has(flag::SKETCH)
            && other.has(flag::SKETCH)
            && (self.sketch ^ other.sketch).count_ones() <= crate::normalize::SKETCH_NEAR_BITS
    }

    /// Evidence of progress for the calls around it: a successful call of a modifying tool, or
    /// a call whose result changed since its previous run.
    pub fn progress(&self) -> bool {
        (self.has(flag::MODIFY) && self.real_result() && !self.has(flag::ERROR))
            || (self.has(flag::CHANGED) && self.real_result())
    }

    /// A call that does no work: a state query (`flag::QUERY`), a wait, or a shell command
    /// line that does nothing ([`crate::fingerprint::NOOP_FUZZY`]: `echo alive`, `pwd`, a
    /// typed `C-c`).
    pub fn idle(&self) -> bool {
        self.has(flag::QUERY)
            || self.has(flag::WAIT)
            || (self.has(flag::SHELL) && self.digest == crate::fingerprint::NOOP_FUZZY)
    }

    /// The call ran and its result arrived (retryable failures included).
    pub fn ran(&self) -> bool {
        self.has(flag::RESULT) && !self.has(flag::BLOCKED)
    }
}

/// The live part of a session's ring buffer, newest first.
#[derive(Clone, Copy, Debug)]
pub struct Window<'a> {
    pub(crate) buf: &'a [Record],
    pub(crate) start: usize,
    pub(crate) filled: usize,
    /// Live records: the newest `live` of `filled` (older ones expired by TTL).
    pub(crate) live: usize,
    /// Seq of the newest record.
    pub(crate) newest_seq: u32,
}

impl<'a> Window<'a> {
    pub fn len(&self) -> usize {
        self.live
    }

    /// The k-th newest live record (0 = newest).
    pub fn get(&self, k: usize) -> Option<&'a Record> {
        if k >= self.live {
            return None;
        }
        let cap = self.buf.len();
        let mut i = self.start + self.filled - 1 - k;
        if i >= cap {
            i -= cap;
        }
        self.buf.get(i)
    }

    /// Seq of the k-th newest record.
    pub fn seq(&self, k: usize) -> u32 {
        self.newest_seq.wrapping_sub(k as u32)
    }

    /// The filled records as two slices, `(newer, older)`: newest first is `newer` backwards,
    /// then `older` backwards (only the first [`Window::len`] of them are live).
    pub fn parts(&self) -> (&'a [Record], &'a [Record]) {
        let cap = self.buf.len();
        let end = self.start + self.filled;
        if end <= cap {
            (&[], self.buf.get(self.start..end).unwrap_or_default())
        } else {
            (
                self.buf.get(..end - cap).unwrap_or_default(),
                self.buf.get(self.start..).unwrap_or_default(),
            )
        }
    }

    /// Live records, newest first.
    pub fn iter(&self) -> impl Iterator<Item = &'a Record> + 'a {
        let (newer, older) = self.parts();
        newer.iter().rev().chain(older.iter().rev()).take(self.live)
    }
}

/// Which calls of the window a detection involves (with seq ≥ its start).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Involved {
    None,
    Exact(u32),
    Fuzzy(u32),
    All,
    Tool(u16),
    Test,
    /// The calls of a run of calls that do no work ([`Record::idle`]).
    Idle,
    Digest(u32),
}

impl Involved {
    pub fn matches(&self, r: &Record) -> bool {
        match *self {
            Involved::None => false,
            Involved::Exact(k) => r.exact == k,
            Involved::Fuzzy(k) => r.fuzzy == k,
            Involved::All => true,
            Involved::Tool(t) => r.tool == t,
            Involved::Test => r.has(flag::TEST),
            Involved::Idle => r.idle(),
            Involved::Digest(d) => r.real_result() && r.digest == d,
        }
    }
}

/// What a detector found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Detection {
    pub det: Det,
    /// Identifies the loop across events (before the detector tag is mixed in).
    pub key: u64,
    pub count: u32,
    pub threshold: u32,
    /// The tool the loop is about, if any.
    pub tool: Option<u16>,
    pub involved: Involved,
    /// Seq of the first call of the loop (0: none).
    pub start_seq: u32,
    /// Shell file operations failing: point the model at the file tools.
    pub file_tools_hint: bool,
}

impl Detection {
    pub fn new(det: Det, key: u64, count: u32, threshold: u32) -> Detection {
        Detection {
            det,
            key,
            count,
            threshold,
            tool: None,
            involved: Involved::None,
            start_seq: 0,
            file_tools_hint: false,
        }
    }

    /// The key of the loop's escalation counter.
    pub fn loop_key(&self) -> u64 {
        match loop_tag(self.det) {
            0 => self.key,
            t => crate::hash::combine(self.key, t),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_is_32_bytes() {
        assert_eq!(std::mem::size_of::<Record>(), 32);
    }
}
