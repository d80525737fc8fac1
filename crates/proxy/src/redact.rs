//! Credentials kept out of what an upstream says back.
//!
//! Some upstreams quote the key they were sent in their errors ("Incorrect API key provided:
//! sk-…"). An error body or error event reaches the client (and could reach logs), so every
//! credential value of the request — and of the upstream URL — is replaced by [`REDACTED`]
//! before it does. Inside JSON only strings (and object keys) are changed, so the body stays
//! valid JSON whatever a credential holds; values shorter than [`MIN_SECRET`] bytes are left
//! alone, so that a short key cannot make ordinary words of the body disappear.

use std::borrow::Cow;
use std::sync::Arc;

use axum::http::HeaderMap;
use serde_json::Value;

use crate::upstream::Upstream;

/// What stands in for a credential.
pub const REDACTED: &str = "[redacted]";

/// The shortest credential value redacted.
pub const MIN_SECRET: usize = 8;

/// Whether a request header carries a credential, by its name: `authorization`, `x-api-key`,
/// `api-key`, `cookie`, and others that name a key, token, secret or password
/// (`x-goog-api-key`, `ocp-apim-subscription-key`, `x-auth-token`, …).
fn is_credential_header(name: &str) -> bool {
    ["auth", "key", "token", "secret", "password", "cookie"]
        .iter()
        .any(|w| name.contains(w))
}

/// The credential values of one request and of the upstream URL, longest first (so that one
/// holding another is replaced whole). Shown by `Debug` as a count only.
#[derive(Clone, Default)]
pub struct Secrets(Arc<[String]>);

impl std::fmt::Debug for Secrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Secrets({})", self.0.len())
    }
}

impl Secrets {
    /// The values worth redacting among `values`: at least [`MIN_SECRET`] bytes, each once.
    pub fn new(values: impl IntoIterator<Item = String>) -> Secrets {
        let mut kept: Vec<String> = Vec::new();
        for v in values {
            if v.len() >= MIN_SECRET && !kept.contains(&v) {
                kept.push(v);
            }
        }
        kept.sort_by_key(|s| std::cmp::Reverse(s.len()));
        Secrets(kept.into())
    }

    /// The credentials a request forwards to the upstream, in its headers (each header's
    /// value after its scheme, if any: `Bearer sk-…` gives `sk-…`; each cookie's value),
    /// and those of the upstream URL (user name, password, query values).
    pub fn of(headers: &HeaderMap, upstream: &Upstream) -> Secrets {
        let mut values = Vec::new();
        for (name, value) in headers {
            let name = name.as_str();
            if !is_credential_header(name) {
                continue;
            }
            let value = String::from_utf8_lossy(value.as_bytes());
            let value = value.trim();
            if name == "cookie" {
                for pair in value.split(';') {
                    if let Some((_, v)) = pair.split_once('=') {
                        values.push(v.trim().to_owned());
                    }
                }
            } else {
                let token = value.split_once(' ').map_or(value, |(_, rest)| rest.trim());
                values.push(token.to_owned());
            }
        }
        values.extend(upstream.secrets().iter().cloned());
        Secrets::new(values)
    }

    /// Whether there is nothing to redact.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// `text` with every credential replaced.
    pub fn text<'a>(&self, text: &'a str) -> Cow<'a, str> {
        let mut out = Cow::Borrowed(text);
        for s in self.0.iter() {
            if out.contains(s.as_str()) {
                out = Cow::Owned(out.replace(s.as_str(), REDACTED));
            }
        }
        out
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
}
