//! The host's ids of a session's recent calls, in one small buffer.

use super::*;

/// The host's ids of the last [`ID_POOL`] calls, in one buffer: slot `seq % ID_POOL` holds the
/// id of call `seq`; and the ids of up to [`PINNED_IDS`] loop starts, kept past that.
#[derive(Debug, Default)]
pub(super) struct CallIds {
    /// The slots' ids (whole strings), one after the other.
    pub(super) buf: Vec<u8>,
    pub(super) lens: [u32; ID_POOL],
    pub(super) seqs: [u32; ID_POOL],
    /// Loop starts, oldest first (allocated at the first verdict).
    pub(super) pinned: Vec<(u32, Box<str>)>,
}

impl CallIds {
    pub(super) fn span(&self, slot: usize) -> std::ops::Range<usize> {
        let len = |i: usize| self.lens.get(i).map_or(0, |&n| n as usize);
        let start = (0..slot).map(len).sum::<usize>();
        start..start + len(slot)
    }

    pub(super) fn set(&mut self, seq: u32, id: &str) {
        let slot = seq as usize % ID_POOL;
        // An id over `MAX_ID_BYTES` is not kept.
        let id = if id.len() <= MAX_ID_BYTES { id } else { "" };
        let span = self.span(slot);
        let (old, new, total) = (span.len(), id.len(), self.buf.len());
        // Make room (growing exactly: in steady state ids keep their lengths and nothing is
        // allocated), or close the gap.
        if new > old {
            self.buf.reserve_exact(new - old);
            self.buf.resize(total + new - old, 0);
            self.buf.copy_within(span.end..total, span.start + new);
        } else if new < old {
            self.buf.copy_within(span.end..total, span.start + new);
            self.buf.truncate(total - (old - new));
        }
        if let (Some(dst), Some(len), Some(s)) = (
            self.buf.get_mut(span.start..span.start + new),
            self.lens.get_mut(slot),
            self.seqs.get_mut(slot),
        ) {
            dst.copy_from_slice(id.as_bytes());
            *len = new as u32;
            *s = seq;
        }
    }

    /// The id of call `seq`; empty when it is no longer kept.
    pub(super) fn get(&self, seq: u32) -> &str {
        let slot = seq as usize % ID_POOL;
        match self.seqs.get(slot) {
            Some(&s) if s == seq => self
                .buf
                .get(self.span(slot))
                .and_then(|b| std::str::from_utf8(b).ok())
                .unwrap_or(""),
            _ => self
                .pinned
                .iter()
                .find(|(s, _)| *s == seq)
                .map_or("", |(_, id)| id),
        }
    }

    /// Keeps the id of call `seq` (a loop's start) after it leaves the slots, if it is known;
    /// the oldest pinned id makes room.
    pub(super) fn pin(&mut self, seq: u32) {
        if seq == 0 || self.pinned.iter().any(|(s, _)| *s == seq) {
            return;
        }
        let id = self.get(seq);
        if id.is_empty() {
            return;
        }
        let id: Box<str> = id.into();
        if self.pinned.len() >= PINNED_IDS {
            self.pinned.remove(0);
        }
        self.pinned.push((seq, id));
    }

    pub(super) fn clear(&mut self) {
        self.buf.clear();
        self.lens = [0; ID_POOL];
        self.seqs = [0; ID_POOL];
        self.pinned.clear();
    }
}

#[cfg(test)]
mod call_id_tests {
    use super::*;

    #[test]
    fn call_ids_keep_the_last_few_of_any_length() {
        let mut ids = CallIds::default();
        let id = |seq: u32| "x".repeat(seq as usize % 7) + &seq.to_string();
        for seq in 1..40u32 {
            ids.set(seq, &id(seq));
            for back in 0..ID_POOL as u32 {
                if let Some(s) = seq.checked_sub(back).filter(|&s| s > 0) {
                    assert_eq!(ids.get(s), id(s), "seq {seq}, back {back}");
                }
            }
            if seq > ID_POOL as u32 {
                assert_eq!(ids.get(seq - ID_POOL as u32), "");
            }
        }
        ids.set(41, "");
        assert_eq!(ids.get(41), "");
        assert_eq!(ids.get(40 - 1), id(39));
        ids.clear();
        assert_eq!(ids.get(39), "");
        assert!(ids.buf.is_empty());
    }
}
