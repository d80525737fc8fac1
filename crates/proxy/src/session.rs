//! Which session a request belongs to.
//!
//! In order:
//!
//! 1. the `X-Session-Id` header (`hdr:<value>`), when present and non-empty;
//! 2. the client's own name for the conversation or its end user: chat's `user`, Anthropic's
//!    `metadata.user_id` (`user:<value>`), a Responses `conversation` (`conv:<id>`) or `user`;
//! 3. for a Responses request continuing a stored response (`previous_response_id`), the
//!    session of that response (`resp:<id>` when the proxy never saw it);
//! 4. a stable hash of the conversation's opening (`conv:<16 hex digits>`): the system prompt
//!    (Anthropic's `system`, Responses' `instructions`, leading `system`/`developer` messages)
//!    and the first user message, as the client sent them. A conversation keeps its opening as
//!    it grows, so every request of it lands in the same session; two conversations that open
//!    with exactly the same prompts share one — send `X-Session-Id` when that can happen (the
//!    same task run many times).
//!
//! Ids longer than [`MAX_ID`] bytes are hashed, so a client cannot make the proxy keep
//! arbitrarily long keys.
//!
//! Every id is scoped to the caller's credential ([`caller`]): a keyed hash of the API key the
//! request carries (`key:<16 hex digits>/…`, the key itself is never kept), or `anon/…`. Two
//! callers with different keys never share a session, whatever header, `user` value or opening
//! prompts they send. Keyless callers all share `anon`; with
//! [`Options::require_key`](crate::Options::require_key) their requests are refused before a
//! session is looked for.

use axum::http::HeaderMap;
use loopguard_hash::xxh3 as xxh3_64;

use crate::body::Body;
use crate::wire::Wire;

/// The session header.
pub const HEADER: &str = "x-session-id";
/// Longest id kept as written.
pub const MAX_ID: usize = 200;

/// The API key a request carries: `Authorization: Bearer …` (or any other scheme, or a key
/// sent without one), else `x-api-key` (Anthropic), else `api-key` (Azure OpenAI), else
/// `x-goog-api-key` (Gemini; its `key` query parameter is read into this header for the
/// purpose); the first of them that holds a key. A header that holds none (empty, or a scheme alone) does not hide
/// the ones after it.
pub fn credential(headers: &HeaderMap) -> Option<&str> {
    let auth = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            let v = v.trim();
            match v.split_once(' ') {
                Some((_, k)) => Some(k.trim()),
                // `Bearer` alone is what a client with an empty key sends once the header's
                // trailing space is trimmed in transit: a scheme and no key.
                None if SCHEMES.iter().any(|s| v.eq_ignore_ascii_case(s)) => None,
                None => Some(v),
            }
        })
        .filter(|k| !k.is_empty());
    auth.or_else(|| {
        ["x-api-key", "api-key", "x-goog-api-key"]
            .iter()
            .find_map(|h| {
                headers
                    .get(*h)
                    .and_then(|v| v.to_str().ok())
                    .map(str::trim)
                    .filter(|k| !k.is_empty())
            })
    })
}

/// `Authorization` schemes that, written alone, carry no key.
const SCHEMES: [&str; 3] = ["bearer", "basic", "token"];

/// The keyed hash of a credential (`seed` is the proxy's secret, chosen at start).
pub fn key_hash(key: &str, seed: u64) -> u64 {
    loopguard_hash::xxh3_keyed(key.as_bytes(), seed)
}

/// The caller part of a session id: `key:<keyed hash>` or `anon`.
pub fn caller(headers: &HeaderMap, seed: u64) -> String {
    credential(headers).map_or_else(
        || "anon".to_owned(),
        |k| format!("key:{:016x}", key_hash(k, seed)),
    )
}

/// The session of a request within its caller. `continued` names the session of a stored
/// response the request continues, when the proxy knows it.
pub fn identify(
    headers: &HeaderMap,
    wire: Wire,
    body: &mut Body<'_>,
    continued: impl FnOnce(&str) -> Option<String>,
) -> String {
    if let Some(v) = headers.get(HEADER).and_then(|v| v.to_str().ok()) {
        let v = v.trim();
        if !v.is_empty() {
            return bounded("hdr", v);
        }
    }
    if let Some((kind, v)) = wire.session_hint(body) {
        return bounded(kind, &v);
    }
    if let Some(prev) = wire.previous_response(body) {
        return continued(&prev).unwrap_or_else(|| bounded("resp", &prev));
    }
    format!("conv:{:016x}", xxh3_64(wire.opening(body).as_bytes()))
}

/// `prefix:value`, or `prefix:#<hash>` for a value longer than [`MAX_ID`].
pub fn bounded(prefix: &str, v: &str) -> String {
    if v.len() <= MAX_ID {
        format!("{prefix}:{v}")
    } else {
        format!("{prefix}:#{:016x}", xxh3_64(v.as_bytes()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;
    use serde_json::{Value, json};

    fn body(extra: &[Value]) -> Value {
        let mut messages = vec![
            json!({"role": "system", "content": "You are a coder."}),
            json!({"role": "user", "content": "Fix the build."}),
        ];
        messages.extend(extra.iter().cloned());
        json!({"model": "m", "messages": messages})
    }

    fn id(h: &HeaderMap, b: &Value) -> String {
        let mut body = Body::from_value(b, "messages").unwrap();
        identify(h, Wire::Chat, &mut body, |_| None)
    }

    #[test]
    fn header_then_user_then_hash() {
        let mut h = HeaderMap::new();
        let mut b = body(&[]);
        b["user"] = json!("alice");
        h.insert(HEADER, HeaderValue::from_static("run-42"));
        assert_eq!(id(&h, &b), "hdr:run-42");
        assert_eq!(id(&HeaderMap::new(), &b), "user:alice");
        let id = id(&HeaderMap::new(), &body(&[]));
        assert!(id.starts_with("conv:") && id.len() == 21, "{id}");
    }

    #[test]
    fn a_growing_conversation_keeps_its_session() {
        let h = HeaderMap::new();
        let first = id(&h, &body(&[]));
        let later = id(
            &h,
            &body(&[
                json!({"role": "assistant", "content": null, "tool_calls": []}),
                json!({"role": "tool", "tool_call_id": "c1", "content": "ok"}),
            ]),
        );
        assert_eq!(first, later);
        let other = id(
            &h,
            &json!({"messages": [{"role": "user", "content": "Write docs."}]}),
        );
        assert_ne!(first, other);
    }

    #[test]
    fn long_ids_are_hashed_and_blank_ones_ignored() {
        let mut h = HeaderMap::new();
        h.insert(HEADER, HeaderValue::from_static("   "));
        let long = "x".repeat(MAX_ID + 1);
        let b = json!({"user": long, "messages": []});
        let id = id(&h, &b);
        assert!(id.starts_with("user:#"), "{id}");
        assert!(id.len() < 30);
    }

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (name, value) in pairs {
            h.append(*name, HeaderValue::from_static(value));
        }
        h
    }

    #[test]
    fn the_credential_is_the_first_header_that_holds_a_key() {
        assert_eq!(
            credential(&headers(&[("authorization", "Bearer sk-a")])),
            Some("sk-a")
        );
        // A key sent without a scheme is still a key.
        assert_eq!(
            credential(&headers(&[("authorization", "sk-raw")])),
            Some("sk-raw")
        );
        assert_eq!(
            credential(&headers(&[("x-api-key", " sk-ant ")])),
            Some("sk-ant")
        );
        assert_eq!(
            credential(&headers(&[("api-key", "azure-key")])),
            Some("azure-key")
        );
        assert_eq!(
            credential(&headers(&[
                ("authorization", "Bearer sk-a"),
                ("x-api-key", "sk-ant")
            ])),
            Some("sk-a")
        );
    }

    #[test]
    fn an_empty_key_or_a_scheme_alone_is_no_credential_and_hides_no_other() {
        for empty in [
            "",
            "   ",
            "Bearer",
            "bearer ",
            "Bearer    ",
            "BASIC",
            "Token",
        ] {
            let h = headers(&[("authorization", empty)]);
            assert_eq!(credential(&h), None, "{empty:?}");
            assert_eq!(caller(&h, 7), "anon", "{empty:?}");
            let h = headers(&[("authorization", empty), ("x-api-key", "sk-ant")]);
            assert_eq!(credential(&h), Some("sk-ant"), "{empty:?}");
        }
        let h = headers(&[("x-api-key", " "), ("api-key", "azure-key")]);
        assert_eq!(credential(&h), Some("azure-key"));
        assert_eq!(credential(&HeaderMap::new()), None);
        let mut h = HeaderMap::new();
        h.insert(
            "authorization",
            HeaderValue::from_bytes(b"Bearer \xff\xfe").unwrap(),
        );
        assert_eq!(credential(&h), None, "not text: no key");
    }

    #[test]
    fn a_continued_response_names_its_session() {
        let b = json!({"previous_response_id": "resp_9", "input": []});
        let mut b = Body::from_value(&b, "input").unwrap();
        let h = HeaderMap::new();
        assert_eq!(
            identify(&h, Wire::Responses, &mut b, |p| Some(format!(
                "conv:of-{p}"
            ))),
            "conv:of-resp_9"
        );
        assert_eq!(
            identify(&h, Wire::Responses, &mut b, |_| None),
            "resp:resp_9"
        );
    }
}
