//! Credentials kept out of what an upstream says back.
//!
//! Some upstreams quote the key they were sent in their errors ("Incorrect API key provided:
//! sk-…"), and an upstream or a debugging middlebox may echo it in a response header. An error
//! body, an error event or a header passed back reaches the client (and could reach logs), so
//! every credential value of the request — and of the upstream URL — is replaced by
//! [`REDACTED`] before it does. Inside JSON only strings (and object keys) are changed, so the
//! body stays valid JSON whatever a credential holds; values shorter than [`MIN_SECRET`] bytes
//! are left alone, so that a short key cannot make ordinary words of the body disappear.
//!
//! A credential is also found encoded:
//! - **percent-encoded**, any of its bytes written `%XX` (either case of hex digits), as any
//!   URL encoder writes it (`sk-abc%2Fdef`, `%73%6B-…`): the text is searched as decoded and
//!   the run that decodes to the credential is replaced whole;
//! - **base64**, standard and URL-safe alphabets: the whole credential encoded alone (padded
//!   or not), and, for a credential encoded among other bytes (`Basic base64(user:key)`), the
//!   characters that hold its bytes only, at each of the three alignments it can have. The one
//!   or two characters at each end that mix its bits with the neighbours' are left (they hold
//!   at most 4 bits of it). These runs are at least 10 characters (60 bits of the credential)
//!   for the shortest credential redacted, so they do not match by chance;
//! - both: a base64 form percent-encoded (`c2st%2B…`).
//!
//! Not found: other encodings (hex, double percent-encoding, `+` for a space), a credential
//! cut in pieces.

use std::borrow::Cow;
use std::sync::Arc;

use axum::http::{HeaderMap, HeaderValue};
use serde_json::Value;

use crate::upstream::Upstream;

/// What stands in for a credential.
pub const REDACTED: &str = "[redacted]";

/// The shortest credential value redacted.
pub const MIN_SECRET: usize = 8;

/// The most credential values of one request searched for: the upstream URL's first, then the
/// credential headers', then the cookies'. Each costs a search of every text redacted, so a
/// request with thousands of cookies costs what one with 64 does.
pub const MAX_SECRETS: usize = 64;

/// Whether a request header carries a credential, by its name: `authorization`, `x-api-key`,
/// `api-key`, `cookie`, and others that name a key, token, secret or password
/// (`x-goog-api-key`, `ocp-apim-subscription-key`, `x-auth-token`, …).
fn is_credential_header(name: &str) -> bool {
    ["auth", "key", "token", "secret", "password", "cookie"]
        .iter()
        .any(|w| name.contains(w))
}

/// The credential values of one request and of the upstream URL, and what is searched for
/// them. Shown by `Debug` as a count only.
#[derive(Clone, Default)]
pub struct Secrets(Arc<Forms>);

/// The credentials and their forms.
#[derive(Default)]
struct Forms {
    /// The credential values, each once.
    values: Vec<String>,
    /// Each value and its base64 forms, each once, longest first (so that one holding another
    /// is replaced whole).
    forms: Vec<String>,
}

impl std::fmt::Debug for Secrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Secrets({})", self.0.values.len())
    }
}

impl Secrets {
    /// The values worth redacting among `values`: at least [`MIN_SECRET`] bytes, each once.
    /// At most [`MAX_SECRETS`] are kept, the first ones given.
    pub fn new(values: impl IntoIterator<Item = String>) -> Secrets {
        let mut seen = std::collections::HashSet::new();
        let kept: Vec<String> = values
            .into_iter()
            .filter(|v| v.len() >= MIN_SECRET && seen.insert(v.clone()))
            .take(MAX_SECRETS)
            .collect();
        let mut seen = std::collections::HashSet::new();
        let mut forms: Vec<String> = Vec::new();
        for v in &kept {
            for f in std::iter::once(v.clone()).chain(base64_forms(v.as_bytes())) {
                if seen.insert(f.clone()) {
                    forms.push(f);
                }
            }
        }
        forms.sort_by_key(|s| std::cmp::Reverse(s.len()));
        Secrets(Arc::new(Forms {
            values: kept,
            forms,
        }))
    }

    /// The credentials a request forwards to the upstream, in its headers (each header's
    /// value after its scheme, if any: `Bearer sk-…` gives `sk-…`; each cookie's value; a
    /// `Basic` credential also decoded, `user:password` and the password alone), and those of the upstream URL (user name, password, query values).
    pub fn of(headers: &HeaderMap, upstream: &Upstream) -> Secrets {
        // The upstream URL's first: the operator's, never crowded out by a request's.
        let mut values: Vec<String> = upstream.secrets().to_vec();
        let mut cookies = Vec::new();
        for (name, value) in headers {
            let name = name.as_str();
            if !is_credential_header(name) {
                continue;
            }
            let value = String::from_utf8_lossy(value.as_bytes());
            let value = value.trim();
            if name == "cookie" {
                for pair in value.split(';') {
                    if cookies.len() >= MAX_SECRETS {
                        break;
                    }
                    if let Some((_, v)) = pair.split_once('=')
                        && v.trim().len() >= MIN_SECRET
                    {
                        cookies.push(v.trim().to_owned());
                    }
                }
            } else {
                let (scheme, token) = value
                    .split_once(' ')
                    .map_or(("", value), |(scheme, rest)| (scheme, rest.trim()));
                values.push(token.to_owned());
                // A `Basic` credential is also quoted decoded: `user:password`, the password.
                if scheme.eq_ignore_ascii_case("basic")
                    && let Some(plain) = unbase64(token).and_then(|b| String::from_utf8(b).ok())
                {
                    if let Some((_, password)) = plain.split_once(':') {
                        values.push(password.to_owned());
                    }
                    values.push(plain);
                }
            }
        }
        values.extend(cookies);
        Secrets::new(values)
    }

    /// Whether there is nothing to redact.
    pub fn is_empty(&self) -> bool {
        self.0.values.is_empty()
    }

    /// Whether `text` quotes a credential, as written, base64-encoded or percent-encoded.
    pub fn quoted_in(&self, text: &str) -> bool {
        !self.is_empty() && matches!(self.text(text), Cow::Owned(_))
    }

    /// `text` with every credential replaced, as written, base64-encoded or percent-encoded.
    pub fn text<'a>(&self, text: &'a str) -> Cow<'a, str> {
        let mut out = Cow::Borrowed(text);
        for s in &self.0.forms {
            if out.contains(s.as_str()) {
                out = Cow::Owned(out.replace(s.as_str(), REDACTED));
            }
        }
        if out.contains('%')
            && let Some(r) = self.percent_encoded(&out)
        {
            out = Cow::Owned(r);
        }
        out
    }

    /// `text` with every run that percent-decodes to a credential form replaced; `None` when
    /// there is none. Linear in `text` for each form: the text is decoded once, the forms are
    /// searched in it, and the runs found are mapped back in one walk.
    fn percent_encoded(&self, text: &str) -> Option<String> {
        let bytes = text.as_bytes();
        let mut decoded = Vec::with_capacity(bytes.len());
        let mut i = 0;
        while i < bytes.len() {
            let (b, n) = decoded_at(bytes, i);
            decoded.push(b);
            i += n;
        }
        if decoded.len() == bytes.len() {
            // No escape: what is there was searched as written.
            return None;
        }
        let mut found: Vec<(usize, usize)> = Vec::new();
        for f in &self.0.forms {
            found.extend(
                memchr::memmem::find_iter(&decoded, f.as_bytes()).map(|at| (at, at + f.len())),
            );
        }
        if found.is_empty() {
            return None;
        }
        found.sort_unstable();
        let mut merged: Vec<(usize, usize)> = Vec::new();
        for (s, e) in found {
            match merged.last_mut() {
                Some(last) if s <= last.1 => last.1 = last.1.max(e),
                _ => merged.push((s, e)),
            }
        }
        // Decoded positions to positions of `text`, in one walk.
        let (mut at, mut at_decoded) = (0, 0);
        let mut to_text = |target: usize| {
            while at_decoded < target {
                at += decoded_at(bytes, at).1;
                at_decoded += 1;
            }
            at
        };
        let mut out = String::with_capacity(text.len());
        let mut copied = 0;
        for (s, e) in merged {
            let (s, e) = (to_text(s), to_text(e));
            if !text.is_char_boundary(s) || !text.is_char_boundary(e) {
                continue;
            }
            out.push_str(&text[copied..s]);
            out.push_str(REDACTED);
            copied = e;
        }
        if copied == 0 {
            return None;
        }
        out.push_str(&text[copied..]);
        Some(out)
    }

    /// `value` with every credential replaced, still a valid header value (and as sensitive as
    /// it was); `None` when it holds none. Bytes that are not UTF-8 are searched around, and
    /// become U+FFFD when something is replaced.
    pub fn header(&self, value: &HeaderValue) -> Option<HeaderValue> {
        if self.is_empty() {
            return None;
        }
        let text = String::from_utf8_lossy(value.as_bytes());
        let Cow::Owned(replaced) = self.text(&text) else {
            return None;
        };
        let mut out = HeaderValue::from_bytes(replaced.as_bytes())
            .unwrap_or_else(|_| HeaderValue::from_static(REDACTED));
        out.set_sensitive(value.is_sensitive());
        Some(out)
    }

    /// Whether a header name holds a credential: as [`text`](Secrets::text) finds one, or
    /// in lowercase (names are kept in lowercase, and compared without case).
    pub fn in_name(&self, name: &str) -> bool {
        self.0
            .values
            .iter()
            .any(|v| name.contains(&v.to_ascii_lowercase()))
            || matches!(self.text(name), Cow::Owned(_))
    }

    /// Replaces every credential in the strings and object keys of `v`; returns whether
    /// anything was replaced.
    pub fn value(&self, v: &mut Value) -> bool {
        if self.is_empty() {
            return false;
        }
        match v {
            Value::String(s) => match self.text(s) {
                Cow::Borrowed(_) => false,
                Cow::Owned(r) => {
                    *s = r;
                    true
                }
            },
            Value::Array(items) => items
                .iter_mut()
                .fold(false, |changed, x| self.value(x) | changed),
            Value::Object(map) => {
                if map.keys().any(|k| matches!(self.text(k), Cow::Owned(_))) {
                    // A key holds a credential: the object is rebuilt with its keys replaced.
                    for (k, mut x) in std::mem::take(map) {
                        self.value(&mut x);
                        map.insert(self.text(&k).into_owned(), x);
                    }
                    true
                } else {
                    map.values_mut()
                        .fold(false, |changed, x| self.value(x) | changed)
                }
            }
            Value::Null | Value::Bool(_) | Value::Number(_) => false,
        }
    }
}

/// The byte at `i` of `text` as percent-decoded, and how many bytes of `text` it takes:
/// `%XX` (hex digits of either case) is one byte, anything else stands for itself.
fn decoded_at(text: &[u8], i: usize) -> (u8, usize) {
    let hex = |at: usize| text.get(at).and_then(|b| (*b as char).to_digit(16));
    if text[i] == b'%'
        && let (Some(high), Some(low)) = (hex(i + 1), hex(i + 2))
    {
        // Two hex digits (each below 16) make one byte.
        return (((high << 4) | low) as u8, 3);
    }
    (text[i], 1)
}

/// The base64 alphabets: standard and URL-safe.
const ALPHABETS: [&[u8; 64]; 2] = [
    b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/",
    b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_",
];

/// `bytes` in base64 without padding, the bits of a last partial character zero.
fn base64(bytes: &[u8], alphabet: &[u8; 64]) -> String {
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for group in bytes.chunks(3) {
        let b = [
            group[0],
            group.get(1).copied().unwrap_or(0),
            group.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for k in 0..=group.len() {
            out.push(char::from(alphabet[((n >> (18 - 6 * k)) & 63) as usize]));
        }
    }
    out
}

/// `text` decoded from base64 (either alphabet, padding optional); `None` when it is not
/// base64.
fn unbase64(text: &str) -> Option<Vec<u8>> {
    let text = text.trim_end_matches('=');
    let mut out = Vec::with_capacity(text.len() / 4 * 3 + 2);
    let (mut bits, mut held) = (0u32, 0);
    for c in text.bytes() {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' | b'-' => 62,
            b'/' | b'_' => 63,
            _ => return None,
        };
        bits = (bits << 6) | u32::from(v);
        held += 6;
        if held >= 8 {
            held -= 8;
            out.push((bits >> held) as u8);
            bits &= (1 << held) - 1;
        }
    }
    Some(out)
}

/// What a credential looks like base64-encoded, in each alphabet: encoded alone (padded and
/// not), and the characters that hold its bits only when it follows 0, 1 or 2 other bytes of
/// what is encoded (its byte offset modulo 3). Character `j` holds bits `6j..6j + 6`; the
/// credential after `a` bytes holds bits `8a..8(a + len)`.
fn base64_forms(value: &[u8]) -> Vec<String> {
    let mut out = Vec::new();
    for alphabet in ALPHABETS {
        let alone = base64(value, alphabet);
        let padding = "=".repeat((3 - value.len() % 3) % 3);
        out.push(format!("{alone}{padding}"));
        out.push(alone);
        for a in 0..3 {
            let mut shifted = vec![0; a];
            shifted.extend_from_slice(value);
            let encoded = base64(&shifted, alphabet);
            let (first, end) = ((8 * a).div_ceil(6), 8 * (a + value.len()) / 6);
            if let Some(inner) = encoded.get(first..end) {
                out.push(inner.to_owned());
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use axum::http::HeaderValue;
    use serde_json::json;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_static(v));
        }
        h
    }

    fn upstream() -> Upstream {
        Upstream::parse("http://127.0.0.1:9/v1").unwrap()
    }

    #[test]
    fn every_credential_header_of_the_request_is_redacted() {
        let h = headers(&[
            ("authorization", "Bearer sk-bearer-0123456789"),
            ("x-api-key", "sk-ant-0123456789"),
            ("api-key", "azure0123456789"),
            ("x-goog-api-key", "AIzaSy0123456789"),
            ("cookie", "sid=cookie0123456789; theme=dark"),
            ("anthropic-version", "2023-06-01"),
            ("openai-organization", "org-0123456789"),
        ]);
        let s = Secrets::of(&h, &upstream());
        let text = "keys: sk-bearer-0123456789 sk-ant-0123456789 azure0123456789 \
             AIzaSy0123456789 cookie0123456789; version 2023-06-01 of org-0123456789, dark";
        assert_eq!(
            s.text(text),
            "keys: [redacted] [redacted] [redacted] [redacted] [redacted]; version 2023-06-01 \
             of org-0123456789, dark"
        );
        assert!(!format!("{s:?}").contains("sk-"), "{s:?}");
    }

    /// Regression: a `Cookie` header of tens of thousands of pairs made every value a secret
    /// with its base64 forms, kept unique by searching a list (quadratic: 50 s of CPU for one
    /// 440 KB header, on an async worker, with no key needed), and each a search of every text
    /// redacted. At most [`MAX_SECRETS`] values are kept, the upstream URL's and the credential
    /// headers' before any cookie's.
    #[test]
    fn a_request_s_credentials_are_bounded_and_cookies_come_last() {
        let pairs: Vec<String> = (0..20_000).map(|i| format!("c{i}=v{i:08}")).collect();
        let cookie = pairs.join("; ");
        let mut h = headers(&[("authorization", "Bearer sk-bearer-0123456789")]);
        h.insert("cookie", HeaderValue::from_str(&cookie).unwrap());
        let u = Upstream::parse("http://user:url-secret-0123@127.0.0.1:9/v1").unwrap();
        let s = Secrets::of(&h, &u);
        assert_eq!(s.0.values.len(), MAX_SECRETS);
        assert_eq!(
            s.text("url-secret-0123 sk-bearer-0123456789 v00000000 v00019999"),
            "[redacted] [redacted] [redacted] v00019999"
        );
    }

    #[test]
    fn short_credentials_are_left_alone() {
        let h = headers(&[("authorization", "Bearer a"), ("x-api-key", "test")]);
        let s = Secrets::of(&h, &upstream());
        assert!(s.is_empty(), "{s:?}");
        let mut v = json!({"error": {"message": "a test: Bearer a is not a key"}});
        assert!(!s.value(&mut v));
        assert_eq!(v["error"]["message"], "a test: Bearer a is not a key");
    }

    #[test]
    fn the_upstream_url_s_credentials_are_redacted_too() {
        let u = Upstream::parse("https://svc:hunter2pw@llm.example/v1?api-key=SECRETKEY123&v=1")
            .unwrap();
        let s = Secrets::of(&HeaderMap::new(), &u);
        assert_eq!(
            s.text("svc sent SECRETKEY123 and hunter2pw, v=1"),
            "svc sent [redacted] and [redacted], v=1"
        );
    }

    #[test]
    fn json_stays_json_with_credentials_in_strings_keys_and_escapes() {
        let s = Secrets::new(["sk-abc\"def/0123".to_owned()]);
        let mut v: Value = serde_json::from_str(
            r#"{"error": {"message": "Incorrect API key provided: sk-abc\"def\/0123.",
                "sk-abc\u0022def/0123": ["x", 1, null, "\u0073k-abc\"def/0123"]}}"#,
        )
        .unwrap();
        assert!(s.value(&mut v));
        assert_eq!(
            v,
            json!({"error": {"message": "Incorrect API key provided: [redacted].",
                "[redacted]": ["x", 1, null, "[redacted]"]}})
        );
        let text = v.to_string();
        assert!(serde_json::from_str::<Value>(&text).is_ok(), "{text}");
        let mut clean = json!({"error": {"message": "rate limited"}});
        assert!(!s.value(&mut clean));
    }

    /// Standard base64 with padding (the tests' own encoder, to check the one above).
    fn b64(bytes: &[u8]) -> String {
        let mut out = String::new();
        for g in bytes.chunks(3) {
            let n = g.iter().fold(0u32, |n, b| (n << 8) | u32::from(*b)) << (8 * (3 - g.len()));
            for k in 0..4 {
                out.push(if k <= g.len() {
                    char::from(ALPHABETS[0][((n >> (18 - 6 * k)) & 63) as usize])
                } else {
                    '='
                });
            }
        }
        out
    }

    #[test]
    fn the_encoder_agrees_with_known_base64() {
        assert_eq!(b64(b"user:sk-abc"), "dXNlcjpzay1hYmM=");
        assert_eq!(b64(b"Ma"), "TWE=");
        assert_eq!(base64(b"Man", ALPHABETS[0]), "TWFu");
        assert_eq!(base64(b"\xfb\xff", ALPHABETS[0]), "+/8");
        assert_eq!(base64(b"\xfb\xff", ALPHABETS[1]), "-_8");
    }

    // Regression: a key quoted percent-encoded (`sk-abc%2Fdef`, as a URL or a form carries it)
    // was not recognized and reached the client.
    #[test]
    fn percent_encoded_credentials_are_redacted() {
        let key = "sk-abc/def+0123~é";
        let s = Secrets::new([key.to_owned()]);
        for encoded in [
            "sk-abc%2Fdef%2B0123~%C3%A9",
            "sk-abc%2fdef%2b0123%7E%c3%a9",
            "%73%6B%2D%61%62%63%2F%64%65%66%2B%30%31%32%33%7E%C3%A9",
            "sk-abc/def+0123~%C3%A9",
        ] {
            let text = format!("url: https://x/?key={encoded}&v=1, 100% sure");
            assert_eq!(
                s.text(&text),
                "url: https://x/?key=[redacted]&v=1, 100% sure",
                "{encoded}"
            );
        }
        // Stray or broken escapes, and text around the key, are left as they are.
        let text = "50% off, %zz, %4, é%C3%A9 and sk-abc%2Fdef";
        assert_eq!(s.text(text), text);
        // A run that decodes to the key inside a longer one is replaced, and only it.
        assert_eq!(
            s.text("a%20sk-abc%2Fdef%2B0123~%C3%A9%20b"),
            "a%20[redacted]%20b"
        );
    }

    // Regression: a key quoted base64-encoded (alone, or in `Basic base64(user:key)`) was not
    // recognized and reached the client.
    #[test]
    fn base64_forms_of_a_credential_are_redacted_at_every_alignment() {
        let key = "sk-proj-Zx81/Qm0+Ppd~?";
        let s = Secrets::new([key.to_owned()]);
        // Alone, padded or not, in either alphabet: replaced whole.
        let alone = b64(key.as_bytes());
        assert!(alone.ends_with('='), "{alone}");
        let url_safe = alone.replace('+', "-").replace('/', "_");
        for text in [
            alone.clone(),
            alone.trim_end_matches('=').to_owned(),
            url_safe.clone(),
            url_safe.trim_end_matches('=').to_owned(),
        ] {
            assert_eq!(s.text(&format!("got {text}.")), "got [redacted].", "{text}");
        }
        // Among other bytes: what holds the key's bits only is replaced, whatever the offset;
        // at most 2 characters at each end, which also hold the neighbours' bits, are left.
        for before in ["", "u", "us", "user:", "a-long-user-name:"] {
            for after in ["", "!", "!?", "\n\n\n"] {
                let plain = format!("{before}{key}{after}");
                for encoded in [b64(plain.as_bytes()), {
                    let e = b64(plain.as_bytes()).replace('+', "-").replace('/', "_");
                    e.trim_end_matches('=').to_owned()
                }] {
                    let out = s.text(&format!("Basic {encoded}")).into_owned();
                    let what = format!("{plain:?} as {encoded}: {out}");
                    let rest = out.strip_prefix("Basic ").unwrap();
                    let (head, tail) = rest.split_once(REDACTED).expect(&what);
                    assert!(!tail.contains(REDACTED), "{what}");
                    assert!(head.len() <= (before.len() * 4).div_ceil(3) + 1, "{what}");
                    let own = (after.len() * 4).div_ceil(3) + 2;
                    assert!(tail.trim_end_matches('=').len() <= own, "{what}");
                }
            }
        }
        // Inside JSON, in a key and a value: still JSON.
        let mut v = json!({"error": {"message": format!("Basic {}", b64(format!("u:{key}").as_bytes())),
            alone.clone(): [url_safe]}});
        assert!(s.value(&mut v));
        let text = v.to_string();
        assert!(!text.contains(&alone[..12]), "{text}");
        assert!(serde_json::from_str::<Value>(&text).is_ok(), "{text}");
    }

    #[test]
    fn encoded_forms_of_short_values_and_near_misses_are_left_alone() {
        // A short key's encodings are not searched, as the key itself is not.
        let h = headers(&[("x-api-key", "sk/1234")]);
        let s = Secrets::of(&h, &upstream());
        assert!(s.is_empty());
        let text = format!("sk%2F1234 {}", b64(b"sk/1234"));
        assert_eq!(s.text(&text), text);
        // The encoding of a part of the key, or of another key sharing its start, stays.
        let key = "sk-live-0123456789";
        let s = Secrets::new([key.to_owned()]);
        let partial = format!(
            "{} {} {}",
            b64(&key.as_bytes()[..12]),
            b64(b"sk-live-0123456780"),
            "sk-live-012345678%30"
        );
        assert_eq!(s.text(&partial), partial);
    }

    // Regression: upstream response headers were passed back as they came, so one quoting the
    // caller's key (`x-debug-auth: Bearer sk-…`) showed it to the client.
    #[test]
    fn header_values_quoting_a_credential_stay_valid_header_values() {
        let key = "sk-proj-Zx81/Qm0+Ppd";
        let s = Secrets::new([key.to_owned()]);
        let plain = HeaderValue::from_str(&format!("Bearer {key}, realm=\"api\"")).unwrap();
        assert_eq!(
            s.header(&plain).unwrap(),
            "Bearer [redacted], realm=\"api\""
        );
        let basic = HeaderValue::from_str(&format!("Basic {}", b64(format!("u:{key}").as_bytes())))
            .unwrap();
        let out = s.header(&basic).unwrap();
        assert!(out.to_str().unwrap().contains(REDACTED), "{out:?}");
        let encoded = HeaderValue::from_static("k=sk-proj-Zx81%2FQm0%2BPpd; Path=/");
        assert_eq!(s.header(&encoded).unwrap(), "k=[redacted]; Path=/");
        // Bytes that are not UTF-8 (obs-text) around the key: still a valid value, sensitive
        // as it was.
        let mut bytes = b"\xff\xfe ".to_vec();
        bytes.extend_from_slice(key.as_bytes());
        let mut odd = HeaderValue::from_bytes(&bytes).unwrap();
        odd.set_sensitive(true);
        let out = s.header(&odd).unwrap();
        assert!(out.is_sensitive());
        assert_eq!(out.as_bytes(), "\u{fffd}\u{fffd} [redacted]".as_bytes());
        // Nothing to replace: `None`, the value passes as it is.
        assert!(
            s.header(&HeaderValue::from_static("req_0123456789"))
                .is_none()
        );
        assert!(Secrets::default().header(&plain).is_none());
    }

    // Regression: a caller's `Basic` credential was searched for only as sent (base64), so an
    // upstream quoting it decoded (`user:password`, or the password) showed it.
    #[test]
    fn a_basic_credential_is_redacted_decoded_too() {
        let basic = b64(b"svc-user:hunter2-password");
        let mut h = HeaderMap::new();
        h.insert(
            "authorization",
            HeaderValue::from_str(&format!("Basic {basic}")).unwrap(),
        );
        let s = Secrets::of(&h, &upstream());
        assert_eq!(
            s.text(&format!(
                "{basic} svc-user:hunter2-password hunter2-password svc-user"
            )),
            "[redacted] [redacted] [redacted] svc-user"
        );
        // Not base64, or a short password: what was sent only.
        assert_eq!(unbase64("a b"), None);
        assert_eq!(unbase64("TWE").unwrap(), b"Ma");
        assert_eq!(unbase64("-_8=").unwrap(), b"\xfb\xff");
        let h = headers(&[("authorization", "Basic dTpzaG9ydA==")]);
        let s = Secrets::of(&h, &upstream());
        assert_eq!(s.text("u:short and short"), "u:short and short");
    }

    proptest::proptest! {
        /// Any mix of written and percent-encoded characters of a key, among stray escapes
        /// and characters of several bytes, is found, and nothing panics.
        #[test]
        fn any_percent_encoding_of_a_key_is_found_among_stray_escapes(
            how in proptest::collection::vec(0..3u8, 16),
            before in "[%0-9a-fA-Fé€ ]{0,12}",
            after in "[%0-9a-fA-Fé€ ]{0,12}",
        ) {
            let key = "sk-ké/y+01€23~";
            let s = Secrets::new([key.to_owned()]);
            let mut encoded = String::new();
            for (c, how) in key.chars().zip(how) {
                let mut buf = [0; 4];
                for b in c.encode_utf8(&mut buf).bytes() {
                    match how {
                        1 => encoded.push_str(&format!("%{b:02X}")),
                        2 => encoded.push_str(&format!("%{b:02x}")),
                        _ => {}
                    }
                }
                if how == 0 {
                    encoded.push(c);
                }
            }
            let text = format!("{before}{encoded}{after}");
            let out = s.text(&text);
            proptest::prop_assert!(out.contains(REDACTED), "{} -> {}", text, out);
            proptest::prop_assert!(!out.contains(key), "{} -> {}", text, out);
            let _ = s.text(&format!("{after}{before}"));
        }
    }
}
