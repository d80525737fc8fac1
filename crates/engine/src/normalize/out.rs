//! The masked text as it is written: bytes in a reused buffer that is kept [`SLACK`] bytes
//! longer than what has been written, so that short pieces (the spans between masks, the
//! replacements) are copied as one or two fixed 16-byte moves instead of a `memcpy` call each.
//! Bytes past the written length are left over from earlier writes and never read.

/// Bytes the buffer always holds past what has been written.
const SLACK: usize = 32;

/// A replacement of the masks, padded to 16 bytes, and its length.
pub(super) type Rep = (&'static [u8; 16], usize);

/// Pads a replacement (at most 16 bytes) to 16 bytes.
pub(super) const fn pad(s: &str) -> [u8; 16] {
    let b = s.as_bytes();
    let mut out = [0u8; 16];
    let mut i = 0;
    while i < b.len() {
        out[i] = b[i];
        i += 1;
    }
    out
}

/// The masked text being written into a reused buffer.
pub(super) struct Out<'a> {
    buf: &'a mut Vec<u8>,
    len: usize,
}

impl<'a> Out<'a> {
    /// Writes over `buf` from its start (its old contents are left in place, unread).
    pub(super) fn new(buf: &'a mut Vec<u8>) -> Out<'a> {
        Out { buf, len: 0 }
    }

    /// Makes room for `n` more bytes (and the slack after them).
    #[inline(always)]
    fn room(&mut self, n: usize) {
        if self.len + n + SLACK > self.buf.len() {
            self.grow(n);
        }
    }

    #[cold]
    #[inline(never)]
    fn grow(&mut self, n: usize) {
        let want = (self.len + n + SLACK).max(2 * self.buf.len()).max(256);
        self.buf.resize(want, 0);
    }

    /// Writes `src[from..to]`.
    #[inline(always)]
    pub(super) fn copy(&mut self, src: &[u8], from: usize, to: usize) {
        let n = to.saturating_sub(from);
        self.room(n);
        self.put(src, from, to, n);
    }

    /// Writes `src[from..to]`, then a replacement (one check for room for both).
    #[inline(always)]
    pub(super) fn copy_rep(&mut self, src: &[u8], from: usize, to: usize, (bytes, r): Rep) {
        let n = to.saturating_sub(from);
        self.room(n + 16);
        self.put(src, from, to, n);
        if let Some(d) = self
            .buf
            .get_mut(self.len..)
            .and_then(<[u8]>::first_chunk_mut::<16>)
        {
            *d = *bytes;
        }
        self.len += r.min(16);
    }

    /// Writes `src[from..to]`, `n` bytes, with room for them made.
    #[inline(always)]
    fn put(&mut self, src: &[u8], from: usize, to: usize, n: usize) {
        let at = self.len;
        if n <= 16 {
            // One 16-byte move when 16 bytes can be read from `from` (the bytes written past
            // the piece are overwritten by the next one, or left unread).
            if let Some(s) = src.get(from..).and_then(<[u8]>::first_chunk::<16>)
                && let Some(d) = self
                    .buf
                    .get_mut(at..)
                    .and_then(<[u8]>::first_chunk_mut::<16>)
            {
                *d = *s;
                self.len += n;
                return;
            }
        } else if n <= 32 {
            // Two moves, overlapping in the middle.
            if let Some(s) = src.get(from..).and_then(<[u8]>::first_chunk::<16>)
                && let Some(d) = self
                    .buf
                    .get_mut(at..)
                    .and_then(<[u8]>::first_chunk_mut::<16>)
            {
                *d = *s;
            }
            if let Some(s) = src.get(to - 16..).and_then(<[u8]>::first_chunk::<16>)
                && let Some(d) = self
                    .buf
                    .get_mut(at + n - 16..)
                    .and_then(<[u8]>::first_chunk_mut::<16>)
            {
                *d = *s;
            }
            self.len += n;
            return;
        }
        if let (Some(d), Some(s)) = (self.buf.get_mut(at..at + n), src.get(from..to)) {
            d.copy_from_slice(s);
        }
        self.len += n;
    }

    /// Writes bytes (rare pieces: the mark between the two ends of a long result).
    pub(super) fn bytes(&mut self, s: &[u8]) {
        self.copy(s, 0, s.len());
    }

    /// What has been written.
    pub(super) fn written(&self) -> &[u8] {
        self.buf.get(..self.len).unwrap_or_default()
    }
}
