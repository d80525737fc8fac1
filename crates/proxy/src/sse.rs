//! Server-sent events, split from the bytes of a stream: the part every wire format's stream
//! rewriter shares.
//!
//! Lines end at `\n` (a `\r` before it is dropped); an event ends at a blank line. An event's
//! `data:` lines are joined with newlines; its `event:` line names its type. The raw text of
//! each event is kept, so events the proxy does not change reach the client byte for byte.

/// Largest single event accepted (bytes of its lines and their ends).
pub const MAX_EVENT: usize = 16 << 20;

/// One event of a stream.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Event {
    /// The `event:` field, if any.
    pub event: Option<String>,
    /// The `data:` lines joined by newlines; `None` when the event has none (a comment, a
    /// keep-alive).
    pub data: Option<String>,
    /// The event as it arrived, ending with its blank line.
    pub raw: String,
}

/// Splits a byte stream into events.
#[derive(Debug, Default)]
pub struct Splitter {
    /// The start of a line whose end has not arrived.
    line: Vec<u8>,
    /// The complete lines of the event being read, each ending in `\n`.
    event: Vec<u8>,
}

/// The stream holds an event larger than [`MAX_EVENT`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TooLarge;

impl Splitter {
    /// Feeds bytes; complete events are appended to `out`.
    pub fn push(&mut self, bytes: &[u8], out: &mut Vec<Event>) -> Result<(), TooLarge> {
        let mut rest = bytes;
        while !rest.is_empty() {
            let Some(nl) = memchr::memchr(b'\n', rest) else {
                self.line.extend_from_slice(rest);
                if self.line.len() + self.event.len() > MAX_EVENT {
                    return Err(TooLarge);
                }
                return Ok(());
            };
            let (head, tail) = rest.split_at(nl);
            rest = tail.get(1..).unwrap_or_default();
            let line = if self.line.is_empty() {
                head
            } else {
                self.line.extend_from_slice(head);
                &self.line
            };
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            if line.len() + self.event.len() > MAX_EVENT {
                return Err(TooLarge);
            }
            if line.is_empty() {
                self.line.clear();
                self.end_event(out);
            } else {
                self.event.extend_from_slice(line);
                self.event.push(b'\n');
                self.line.clear();
            }
        }
        Ok(())
    }

    /// The stream ended: an unfinished event is completed.
    pub fn finish(&mut self, out: &mut Vec<Event>) {
        if !self.line.is_empty() {
            self.event.append(&mut self.line);
            self.event.push(b'\n');
        }
        self.end_event(out);
    }

    fn end_event(&mut self, out: &mut Vec<Event>) {
        if self.event.is_empty() {
            return;
        }
        let bytes = std::mem::take(&mut self.event);
        let mut raw = match String::from_utf8(bytes) {
            Ok(s) => s,
            Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
        };
        let mut event = None;
        let mut data: Option<String> = None;
        for l in raw.split_terminator('\n') {
            if let Some(v) = l.strip_prefix("event:") {
                event = Some(v.strip_prefix(' ').unwrap_or(v).to_owned());
            } else if let Some(v) = l.strip_prefix("data:") {
                let v = v.strip_prefix(' ').unwrap_or(v);
                match &mut data {
                    Some(d) => {
                        d.push('\n');
                        d.push_str(v);
                    }
                    None => data = Some(v.to_owned()),
                }
            }
        }
        raw.push('\n');
        out.push(Event { event, data, raw });
    }
}

/// An event with a type and JSON data, as the proxy writes it.
pub fn event(name: &str, data: &serde_json::Value) -> String {
    format!("event: {name}\ndata: {data}\n\n")
}

/// A data-only event, as the proxy writes it.
pub fn data(data: &serde_json::Value) -> String {
    format!("data: {data}\n\n")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn events_split_anywhere_come_out_whole() {
        let text = "event: a\r\ndata: {\"x\":\r\ndata: 1}\r\n\r\n: keep-alive\n\ndata: [DONE]\n\n";
        for step in 1..text.len() {
            let mut s = Splitter::default();
            let mut out = Vec::new();
            for piece in text.as_bytes().chunks(step) {
                s.push(piece, &mut out).unwrap();
            }
            s.finish(&mut out);
            assert_eq!(out.len(), 3, "step {step}");
            assert_eq!(out[0].event.as_deref(), Some("a"));
            assert_eq!(out[0].data.as_deref(), Some("{\"x\":\n1}"));
            assert_eq!(out[1].data, None);
            assert_eq!(out[1].raw, ": keep-alive\n\n");
            assert_eq!(out[2].data.as_deref(), Some("[DONE]"));
        }
    }

    #[test]
    fn lines_end_with_or_without_a_carriage_return_and_bad_bytes_are_replaced() {
        let mut s = Splitter::default();
        let mut out = Vec::new();
        s.push(b"data: a\xff\r\n: note\r\n\r\ndata: b", &mut out)
            .unwrap();
        s.finish(&mut out);
        assert_eq!(out.len(), 2);
        assert_eq!(out[0].raw, "data: a\u{fffd}\n: note\n\n");
        assert_eq!(out[0].data.as_deref(), Some("a\u{fffd}"));
        assert_eq!(out[1].raw, "data: b\n\n");
        assert_eq!(out[1].data.as_deref(), Some("b"));
    }

    #[test]
    fn an_event_larger_than_the_limit_is_refused() {
        let mut s = Splitter::default();
        let mut out = Vec::new();
        let big = vec![b'x'; MAX_EVENT + 1];
        assert_eq!(s.push(&big, &mut out), Err(TooLarge));
    }
}
