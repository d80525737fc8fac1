//! Which session a request belongs to.
//!
//! In order:
//!
//! 1. the `X-Session-Id` header (`hdr:<value>`), when present and non-empty;
//! 2. the request's `user` field (`user:<value>`), which OpenAI clients send per end user;
//! 3. a stable hash of the conversation's first messages (`conv:<16 hex digits>`): every leading
//!    `system`/`developer` message and the first `user` message, role and content, as the
//!    client sent them. A conversation keeps its first messages as it grows, so every request of
//!    it lands in the same session; two conversations that open with exactly the same prompts
//!    share one — send `X-Session-Id` when that can happen (the same task run many times).
//!
//! Ids longer than [`MAX_ID`] bytes are hashed, so a client cannot make the proxy keep
//! arbitrarily long keys.
//!
//! Every id is scoped to the caller's credential ([`caller`]): a keyed hash of the API key the
//! request carries (`key:<16 hex digits>/…`, the key itself is never kept), or `anon/…`. Two
//! callers with different keys never share a session, whatever header, `user` value or opening
//! prompts they send.

use axum::http::HeaderMap;
use serde_json::Value;
use xxhash_rust::xxh3::xxh3_64;

/// The session header.
pub const HEADER: &str = "x-session-id";
/// Longest id kept as written.
pub const MAX_ID: usize = 200;

/// The API key a request carries: `Authorization: Bearer …` (or any other scheme), `x-api-key`
/// (Anthropic) or `api-key` (Azure OpenAI).
pub fn credential(headers: &HeaderMap) -> Option<&str> {
    let auth = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .map(|v| v.split_once(' ').map_or(v, |(_, k)| k).trim());
    auth.or_else(|| {
        ["x-api-key", "api-key"]
            .iter()
            .find_map(|h| headers.get(*h).and_then(|v| v.to_str().ok()))
            .map(str::trim)
    })
    .filter(|k| !k.is_empty())
}

/// The keyed hash of a credential (`seed` is the proxy's secret, chosen at start).
pub fn key_hash(key: &str, seed: u64) -> u64 {
    xxhash_rust::xxh3::xxh3_64_with_seed(key.as_bytes(), seed)
}

/// The caller part of a session id: `key:<keyed hash>` or `anon`.
pub fn caller(headers: &HeaderMap, seed: u64) -> String {
    credential(headers).map_or_else(
        || "anon".to_owned(),
        |k| format!("key:{:016x}", key_hash(k, seed)),
    )
}

/// The session id of a chat-completions request, scoped to its caller.
pub fn identify_scoped(headers: &HeaderMap, body: &Value, seed: u64) -> String {
    format!("{}/{}", caller(headers, seed), identify(headers, body))
}

/// The session id of a chat-completions request, within one caller.
pub fn identify(headers: &HeaderMap, body: &Value) -> String {
    if let Some(v) = headers.get(HEADER).and_then(|v| v.to_str().ok()) {
        let v = v.trim();
        if !v.is_empty() {
            return bounded("hdr", v);
        }
    }
    if let Some(u) = body.get("user").and_then(Value::as_str) {
        let u = u.trim();
        if !u.is_empty() {
            return bounded("user", u);
        }
    }
    format!("conv:{:016x}", conversation_hash(body))
}

fn bounded(prefix: &str, v: &str) -> String {
    if v.len() <= MAX_ID {
        format!("{prefix}:{v}")
    } else {
        format!("{prefix}:#{:016x}", xxh3_64(v.as_bytes()))
    }
}

/// Hash of the leading system/developer messages and the first user message.
fn conversation_hash(body: &Value) -> u64 {
    let mut text = String::new();
    if let Some(messages) = body.get("messages").and_then(Value::as_array) {
        for m in messages {
            let role = m.get("role").and_then(Value::as_str).unwrap_or_default();
            // `serde_json` maps keep their keys sorted, so equal content prints equally.
            let content = m.get("content").map(Value::to_string).unwrap_or_default();
            text.push_str(role);
            text.push('\u{1f}');
            text.push_str(&content);
            text.push('\u{1e}');
            if role != "system" && role != "developer" {
                break;
            }
        }
    }
    xxh3_64(text.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;
    use serde_json::json;

    fn body(extra: &[Value]) -> Value {
        let mut messages = vec![
            json!({"role": "system", "content": "You are a coder."}),
            json!({"role": "user", "content": "Fix the build."}),
        ];
        messages.extend(extra.iter().cloned());
        json!({"model": "m", "messages": messages})
    }

    #[test]
    fn header_then_user_then_hash() {
        let mut h = HeaderMap::new();
        let mut b = body(&[]);
        b["user"] = json!("alice");
        h.insert(HEADER, HeaderValue::from_static("run-42"));
        assert_eq!(identify(&h, &b), "hdr:run-42");
        assert_eq!(identify(&HeaderMap::new(), &b), "user:alice");
        let id = identify(&HeaderMap::new(), &body(&[]));
        assert!(id.starts_with("conv:") && id.len() == 21, "{id}");
    }

    #[test]
    fn a_growing_conversation_keeps_its_session() {
        let h = HeaderMap::new();
        let first = identify(&h, &body(&[]));
        let later = identify(
            &h,
            &body(&[
                json!({"role": "assistant", "content": null, "tool_calls": []}),
                json!({"role": "tool", "tool_call_id": "c1", "content": "ok"}),
            ]),
        );
        assert_eq!(first, later);
        let other = identify(
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
        let id = identify(&h, &b);
        assert!(id.starts_with("user:#"), "{id}");
        assert!(id.len() < 30);
    }
}
