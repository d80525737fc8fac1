//! Server-sent events, split from the bytes of a stream: the part every wire format's stream
//! rewriter shares.
//!
//! Lines end at `\n` (a `\r` before it is dropped); an event ends at a blank line. An event's
//! `data:` lines are joined with newlines; its `event:` line names its type. The raw text of
//! each event is kept, so events the proxy does not change reach the client byte for byte.

/// Largest single event accepted (bytes of its lines).
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
    line: Vec<u8>,
    lines: Vec<String>,
    bytes: usize,
}

/// The stream holds an event larger than [`MAX_EVENT`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TooLarge;

impl Splitter {
    /// Feeds bytes; complete events are appended to `out`.
    pub fn push(&mut self, bytes: &[u8], out: &mut Vec<Event>) -> Result<(), TooLarge> {
        let mut rest = bytes;
        while !rest.is_empty() {
            let Some(nl) = rest.iter().position(|&b| b == b'\n') else {
                self.line.extend_from_slice(rest);
                if self.line.len() + self.bytes > MAX_EVENT {
                    return Err(TooLarge);
                }
                return Ok(());
            };
            self.line.extend_from_slice(&rest[..nl]);
            rest = &rest[nl + 1..];
            if self.line.len() + self.bytes > MAX_EVENT {
                return Err(TooLarge);
            }
            if self.line.last() == Some(&b'\r') {
                self.line.pop();
            }
            let line = String::from_utf8_lossy(&self.line).into_owned();
            self.line.clear();
            if line.is_empty() {
                self.end_event(out);
            } else {
                self.bytes += line.len();
                self.lines.push(line);
            }
        }
        Ok(())
    }

    /// The stream ended: an unfinished event is completed.
    pub fn finish(&mut self, out: &mut Vec<Event>) {
        if !self.line.is_empty() {
            let line = String::from_utf8_lossy(&self.line).into_owned();
            self.line.clear();
            self.lines.push(line);
        }
        self.end_event(out);
    }

    fn end_event(&mut self, out: &mut Vec<Event>) {
        let lines = std::mem::take(&mut self.lines);
        self.bytes = 0;
        if lines.is_empty() {
            return;
        }
        let mut event = None;
        let mut data: Option<String> = None;
        for l in &lines {
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
        out.push(Event {
            event,
            data,
            raw: format!("{}\n\n", lines.join("\n")),
        });
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
    fn an_event_larger_than_the_limit_is_refused() {
        let mut s = Splitter::default();
        let mut out = Vec::new();
        let big = vec![b'x'; MAX_EVENT + 1];
        assert_eq!(s.push(&big, &mut out), Err(TooLarge));
    }
}
