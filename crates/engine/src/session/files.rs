//! What the session knows of the content of the files a shell command wrote with literal
//! content (`echo … > app.py`, `cat > f <<'EOF'`): writing a file again with what it already
//! holds changes nothing, even when other work came between the two writes.
//!
//! A file's entry is forgotten when a command that may change files in ways not followed
//! runs (`sed -i`, `git checkout`, a script that writes, an editing tool), so an entry is only
//! kept across commands that leave files alone (runs, reads, `mkdir`, `pip install`). The
//! memory is a few entries, replaced oldest first, and is not part of snapshots: a restored
//! session starts with none, and judges its next write a change.

use crate::fingerprint::FileWrite;

/// Files remembered at once.
const SLOTS: usize = 4;

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

    pub(crate) fn clear(&mut self) {
        *self = Files::default();
    }
}
