//! What the session knows of the content of the files written last: by a shell command with
//! literal content (`echo … > app.py`, `cat > f <<'EOF'`), or by an editing tool's call that
//! names its file (`write_file` with a `path`). Writing a file again with what it already
//! holds changes nothing, even when other work came between the two writes.
//!
//! The two kinds are known by different hashes of a file, so each forgets the other's files
//! when it writes. Everything is forgotten when a command may change files in ways not
//! followed (`sed -i`, `git checkout`, a script that writes, an edit naming no file), so an
//! entry is only kept across calls that leave files alone (runs, reads, `mkdir`, `pip
//! install`) or write other files. The
//! memory is a few entries, replaced oldest first, and is part of the session's snapshot.

use crate::fingerprint::FileWrite;

/// Files remembered at once.
pub(crate) const SLOTS: usize = 4;

#[derive(Clone, Copy, Debug, Default)]
struct Slot {
    target: u32,
    content: u32,
    /// The call that wrote it (calls count from 1; 0 is an empty slot).
    seq: u32,
}

/// The content of the files written last, by hash.
#[derive(Clone, Debug, Default)]
pub(crate) struct Files {
    slots: [Slot; SLOTS],
    next: u8,
}

impl Files {
    /// The call that left `w`'s content in its file, when that is what the file holds.
    pub(crate) fn wrote(&self, w: &FileWrite) -> Option<u32> {
        self.slots
            .iter()
            .find(|s| s.seq != 0 && s.target == w.target)
            .filter(|s| s.content == w.content)
            .map(|s| s.seq)
    }

    /// Call `seq` left `w`'s content in its file.
    pub(crate) fn set(&mut self, w: &FileWrite, seq: u32) {
        let slot = match self
            .slots
            .iter()
            .position(|s| s.seq != 0 && s.target == w.target)
        {
            Some(i) => i,
            None => {
                let i = usize::from(self.next) % SLOTS;
                self.next = ((i + 1) % SLOTS) as u8;
                i
            }
        };
        if let Some(s) = self.slots.get_mut(slot) {
            *s = Slot {
                target: w.target,
                content: w.content,
                seq: seq.max(1),
            };
        }
    }

    /// Forgets the files written by shell commands (`shell`) or by editing tools.
    pub(crate) fn forget(&mut self, shell: bool) {
        for s in &mut self.slots {
            let w = FileWrite {
                target: s.target,
                content: s.content,
            };
            if w.by_shell() == shell {
                *s = Slot::default();
            }
        }
    }

    /// The remembered files (target, content, writing call), by slot.
    pub(crate) fn entries(&self) -> impl Iterator<Item = (u32, u32, u32)> + '_ {
        self.slots
            .iter()
            .filter(|s| s.seq != 0)
            .map(|s| (s.target, s.content, s.seq))
    }

    /// Files as [`Files::entries`] gave them (at most [`SLOTS`]; the caller checks).
    pub(crate) fn from_entries(entries: impl Iterator<Item = (u32, u32, u32)>) -> Files {
        let mut f = Files::default();
        for (slot, (target, content, seq)) in f.slots.iter_mut().zip(entries) {
            *slot = Slot {
                target,
                content,
                seq,
            };
        }
        f.next = (f.slots.iter().filter(|s| s.seq != 0).count() % SLOTS) as u8;
        f
    }

    pub(crate) fn clear(&mut self) {
        *self = Files::default();
    }
}
