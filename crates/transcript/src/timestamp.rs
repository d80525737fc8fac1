//! Recorded wall-clock times: the RFC 3339 `timestamp` of a Claude Code or Codex line, read as
//! milliseconds since the Unix epoch.
//!
//! Read by hand, since no dependency of the workspace parses RFC 3339: `YYYY-MM-DD`, `T` (or `t`
//! or a space), `hh:mm:ss`, an optional fraction (milliseconds kept, further digits ignored),
//! then `Z` or an offset `±hh:mm`. Each field has a fixed width and range, so the reader is
//! bounded by the length of its input and cannot overflow; a time before 1970 is refused.

use std::collections::HashMap;

use serde_json::Value;

use crate::{BadInput, Item, Line};

/// Milliseconds since the Unix epoch of an RFC 3339 date and time, or `None` when `text` is not
/// one (or is before 1970).
pub(crate) fn parse_rfc3339(text: &str) -> Option<u64> {
    let b = text.as_bytes();
    let num = |from: usize, len: usize| -> Option<i64> {
        let digits = b.get(from..from + len)?;
        digits.iter().try_fold(0i64, |n, &d| {
            d.is_ascii_digit().then(|| n * 10 + i64::from(d - b'0'))
        })
    };
    let at = |i: usize, c: u8| b.get(i) == Some(&c);
    let year = num(0, 4)?;
    let month = num(5, 2)?;
    let day = num(8, 2)?;
    let hour = num(11, 2)?;
    let minute = num(14, 2)?;
    let second = num(17, 2)?;
    let separators = at(4, b'-')
        && at(7, b'-')
        && matches!(b.get(10), Some(b'T' | b't' | b' '))
        && at(13, b':')
        && at(16, b':');
    if !separators {
        return None;
    }
    if !(1..=12).contains(&month)
        || day < 1
        || day > days_in_month(year, month)
        || hour > 23
        || minute > 59
        // 60: a leap second.
        || second > 60
    {
        return None;
    }
    let mut i = 19;
    let mut millis = 0i64;
    if at(i, b'.') {
        i += 1;
        let start = i;
        while b.get(i).is_some_and(u8::is_ascii_digit) {
            if i - start < 3 {
                millis = millis * 10 + i64::from(b[i] - b'0');
            }
            i += 1;
        }
        if i == start {
            return None;
        }
        for _ in (i - start)..3 {
            millis *= 10;
        }
    }
    let offset_minutes = match b.get(i) {
        Some(b'Z' | b'z') if i + 1 == b.len() => 0,
        Some(&sign @ (b'+' | b'-')) if i + 6 == b.len() && at(i + 3, b':') => {
            let (h, m) = (num(i + 1, 2)?, num(i + 4, 2)?);
            if h > 23 || m > 59 {
                return None;
            }
            let minutes = h * 60 + m;
            if sign == b'-' { -minutes } else { minutes }
        }
        _ => return None,
    };
    let days = days_from_civil(year, month, day);
    let seconds = days * 86_400 + hour * 3_600 + minute * 60 + second - offset_minutes * 60;
    u64::try_from(seconds * 1000 + millis).ok()
}

fn is_leap(year: i64) -> bool {
    year % 4 == 0 && (year % 100 != 0 || year % 400 == 0)
}

fn days_in_month(year: i64, month: i64) -> i64 {
    match month {
        2 if is_leap(year) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days from 1970-01-01 to a date of the proleptic Gregorian calendar (Howard Hinnant's
/// `days_from_civil`), for years 0 to 9999.
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The `timestamp` of a recorded line: `None` when it has none, an error naming the line when
/// it is not an RFC 3339 date and time.
pub(crate) fn of_line(
    line: Line,
    obj: &serde_json::Map<String, Value>,
) -> Result<Option<u64>, BadInput> {
    match obj.get("timestamp") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => parse_rfc3339(s).map(Some).ok_or_else(|| {
            BadInput::at(
                line,
                format!(
                    "`timestamp` `{}` is not an RFC 3339 date and time after 1970 (like `2025-06-01T12:34:56.789Z`)",
                    crate::shorten(s, 40)
                ),
            )
        }),
        Some(_) => Err(BadInput::at(
            line,
            "`timestamp` must be a string (an RFC 3339 date and time)",
        )),
    }
}

/// Places events in time from the timestamps of the lines they were read from: the first event
/// of a stamped line at its timestamp, every other event one second after the previous one (the
/// first at 0), as for the other formats. Times never go back: an event stamped before the one
/// it follows is placed at the same time, so the file's order is kept.
pub(crate) fn place(items: &mut [Item], stamps: &HashMap<Line, u64>) {
    let mut last: Option<(Line, u64)> = None;
    for item in items {
        let stamp = match last {
            Some((line, _)) if line == item.line => None,
            _ => stamps.get(&item.line).copied(),
        };
        let ms = match (stamp, last) {
            (Some(t), Some((_, prev))) => t.max(prev),
            (Some(t), None) => t,
            (None, Some((_, prev))) => prev.saturating_add(1000),
            (None, None) => 0,
        };
        item.time_ms = ms;
        last = Some((item.line, ms));
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    #[test]
    fn rfc3339_times_read_as_milliseconds_since_the_epoch() {
        for (text, ms) in [
            ("1970-01-01T00:00:00Z", 0),
            ("1970-01-01T00:00:01.5Z", 1_500),
            ("2025-06-01T12:34:56.789Z", 1_748_781_296_789),
            ("2025-06-01t12:34:56.789123456z", 1_748_781_296_789),
            ("2025-06-01 14:34:56.789+02:00", 1_748_781_296_789),
            ("2025-06-01T07:04:56.789-05:30", 1_748_781_296_789),
            ("2024-02-29T00:00:00Z", 1_709_164_800_000),
            ("2016-12-31T23:59:60Z", 1_483_228_800_000),
            ("9999-12-31T23:59:59.999Z", 253_402_300_799_999),
        ] {
            assert_eq!(parse_rfc3339(text), Some(ms), "{text}");
        }
    }

    #[test]
    fn anything_else_is_refused_without_a_panic() {
        for text in [
            "",
            "2025",
            "yesterday",
            "2025-06-01",
            "2025-06-01T12:34:56",
            "2025-06-01T12:34:56.Z",
            "2025-06-01T12:34:56.789",
            "2025-06-01T12:34:56.789+0200",
            "2025-06-01T12:34:56.789+02:00x",
            "2025-06-01T12:34:56.789ZZ",
            "2025-13-01T00:00:00Z",
            "2025-00-01T00:00:00Z",
            "2025-02-29T00:00:00Z",
            "2025-04-31T00:00:00Z",
            "2025-06-01T24:00:00Z",
            "2025-06-01T23:60:00Z",
            "2025-06-01T23:59:61Z",
            "2025-06-01T23:59:59+24:00",
            "1969-12-31T23:59:59Z",
            "1970-01-01T00:30:00+01:00",
            "+025-06-01T00:00:00Z",
            "2025-06-01T00:00:00\u{e9}",
            "２０２５-06-01T00:00:00Z",
            "2025-06-01T12:34:56.99999999999999999999999999999999999999Z\u{0}",
        ] {
            assert_eq!(parse_rfc3339(text), None, "{text:?}");
        }
        // Every prefix and every byte-level mutation of a valid time is read or refused, never
        // a panic.
        let valid = "2025-06-01T12:34:56.789+02:00";
        for end in 0..=valid.len() {
            let _ = parse_rfc3339(&valid[..end]);
        }
        for i in 0..valid.len() {
            for c in ['0', '9', ':', '-', 'T', 'Z', '+', '.', 'x', '\u{e9}'] {
                let mut s = valid[..i].to_owned();
                s.push(c);
                s.push_str(&valid[i + 1..]);
                let _ = parse_rfc3339(&s);
            }
        }
        let long = format!("2025-06-01T12:34:56.{}Z", "9".repeat(1_000_000));
        assert_eq!(parse_rfc3339(&long), Some(1_748_781_296_999));
    }
}
