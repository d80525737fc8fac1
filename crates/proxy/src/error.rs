//! Protocol-shaped errors: one [`ApiError`] the proxy decides, rendered the way each wire
//! format's clients expect it, as a JSON body or as the last event of a stream.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::wire::Wire;

/// The code of a request refused for carrying no API key ([`ApiError::missing_key`]).
pub const MISSING_API_KEY: &str = "missing_api_key";

/// An error the proxy answers with.
///
/// `kind` and `code` follow OpenAI's conventions where one exists (`invalid_request_error`);
/// the proxy's own are `upstream_error` (502/504: the model server failed) and `loop_detected`
/// (the policy stopped the session, code `tool_loop_terminated`).
#[derive(Clone, Debug, PartialEq)]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// What happened, for people.
    pub message: String,
    /// The error type (`invalid_request_error`, `upstream_error`, `loop_detected`, …).
    pub kind: &'static str,
    /// The machine-readable code.
    pub code: &'static str,
    /// Extra machine-readable detail, under `error.loopguard` (tool, count, detector, …).
    pub detail: Option<Value>,
}

impl ApiError {
    /// An error with no detail.
    pub fn new(
        status: StatusCode,
        kind: &'static str,
        code: &'static str,
        message: impl Into<String>,
    ) -> ApiError {
        ApiError {
            status,
            message: message.into(),
            kind,
            code,
            detail: None,
        }
    }

    /// A 400 for a request the proxy cannot read.
    pub fn invalid_request(code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            code,
            message,
        )
    }

    /// A 401 for a request that carries no API key where the operator requires one
    /// (`--require-key`), code `missing_api_key`, with the type `wire`'s own API gives a
    /// request without a key: Anthropic's `authentication_error`, OpenAI's
    /// `invalid_request_error`. The message is fixed: nothing of the request is quoted.
    pub fn missing_key(wire: Wire) -> ApiError {
        let kind = match wire {
            Wire::Messages => "authentication_error",
            Wire::Chat | Wire::Responses | Wire::Gemini => "invalid_request_error",
        };
        let message = match wire {
            Wire::Gemini => {
                "this proxy requires an API key: send it in the `x-goog-api-key` header or the \
                 `key` query parameter"
            }
            _ => {
                "this proxy requires an API key: send it in the `Authorization` header \
                 (`Bearer <key>`), or in `x-api-key` or `api-key`"
            }
        };
        ApiError::new(StatusCode::UNAUTHORIZED, kind, MISSING_API_KEY, message)
    }

    /// A 5xx: the upstream failed.
    pub fn upstream(
        status: StatusCode,
        code: &'static str,
        message: impl Into<String>,
    ) -> ApiError {
        ApiError::new(status, "upstream_error", code, message)
    }

    /// Whether the policy stopped the session.
    pub fn is_stop(&self) -> bool {
        self.kind == "loop_detected"
    }

    /// The error object inside every envelope: `message`, `type`, `code`, and `loopguard`
    /// when there is detail.
    fn object(&self) -> Value {
        let mut error = json!({
            "message": self.message,
            "type": self.kind,
            "param": null,
            "code": self.code,
        });
        if let (Some(detail), Some(obj)) = (&self.detail, error.as_object_mut()) {
            obj.insert("loopguard".into(), detail.clone());
        }
        error
    }

    /// Google's error object: the HTTP status as `code`, `message`, the RPC `status`, the
    /// proxy's code as the `reason` of an `ErrorInfo` detail, and `loopguard` when there is
    /// detail.
    fn google(&self) -> Value {
        let mut error = json!({
            "code": self.status.as_u16(),
            "message": self.message,
            "status": self.rpc_status(),
            "details": [{
                "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                "reason": self.code,
                "domain": "loopguard",
                "metadata": {"type": self.kind},
            }],
        });
        if let (Some(detail), Some(obj)) = (&self.detail, error.as_object_mut()) {
            obj.insert("loopguard".into(), detail.clone());
        }
        error
    }

    /// The `google.rpc.Code` name Google's APIs pair with the error's status; a stopped
    /// session is `FAILED_PRECONDITION` (the request is fine, the session's state refuses it).
    fn rpc_status(&self) -> &'static str {
        if self.is_stop() {
            return "FAILED_PRECONDITION";
        }
        match self.status.as_u16() {
            400 | 413 => "INVALID_ARGUMENT",
            401 => "UNAUTHENTICATED",
            403 => "PERMISSION_DENIED",
            404 => "NOT_FOUND",
            405 | 501 => "UNIMPLEMENTED",
            408 | 504 => "DEADLINE_EXCEEDED",
            409 => "ABORTED",
            429 => "RESOURCE_EXHAUSTED",
            499 => "CANCELLED",
            500 => "INTERNAL",
            502 | 503 => "UNAVAILABLE",
            _ => "UNKNOWN",
        }
    }

    /// The envelope as a JSON body, shaped for `wire`: OpenAI's `{"error": {…}}`,
    /// Anthropic's `{"type": "error", "error": {…}}`, or Google's `{"error": {"code": 400,
    /// "message", "status", …}}`.
    pub fn body(&self, wire: Wire) -> Value {
        match wire {
            Wire::Chat | Wire::Responses => json!({ "error": self.object() }),
            Wire::Messages => json!({ "type": "error", "error": self.object() }),
            Wire::Gemini => json!({ "error": self.google() }),
        }
    }

    /// The envelope as the last event of a stream, shaped for `wire`. OpenAI clients raise an
    /// error for any event whose data has an `error` object; Anthropic clients for an `error`
    /// event (Gemini's, the data of an event, as its API sends one). A Responses stream's `error` event also carries `code` and `message` at the top,
    /// as that API's own error events do.
    pub fn sse_event(&self, wire: Wire) -> String {
        match wire {
            Wire::Chat | Wire::Gemini => format!("data: {}\n\n", self.body(wire)),
            Wire::Messages => format!("event: error\ndata: {}\n\n", self.body(wire)),
            Wire::Responses => format!(
                "event: error\ndata: {}\n\n",
                json!({
                    "type": "error",
                    "code": self.code,
                    "message": self.message,
                    "param": null,
                    "error": self.object(),
                })
            ),
        }
    }

    /// The response for `wire`: the envelope with the error's status; a stop also carries the
    /// `x-loopguard-*` headers every other intervention has.
    pub fn response(&self, wire: Wire) -> Response {
        let mut out = json_response(self.status, &self.body(wire));
        if self.is_stop() {
            let detail = self.detail.as_ref();
            let field = |k: &str| {
                detail
                    .and_then(|d| d.get(k))
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned()
            };
            for (name, value) in [
                (crate::judge::ACTION_HEADER, "terminate".to_owned()),
                (crate::judge::DETECTOR_HEADER, field("detector")),
                (crate::judge::RULE_HEADER, field("rule")),
            ] {
                if let Ok(v) = HeaderValue::from_str(&value) {
                    out.headers_mut().insert(name, v);
                }
            }
        }
        out
    }
}

impl IntoResponse for ApiError {
    /// The OpenAI envelope (routes that are not one of the wire formats: models, 404s).
    fn into_response(self) -> Response {
        self.response(Wire::Chat)
    }
}

/// A JSON response with the given status.
pub fn json_response(status: StatusCode, body: &Value) -> Response {
    let mut resp = (status, body.to_string()).into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn envelopes_have_every_field_their_clients_read() {
        let mut e = ApiError::upstream(
            StatusCode::BAD_GATEWAY,
            "upstream_unreachable",
            "upstream is down",
        );
        e.detail = Some(json!({"tool": "bash"}));
        let body = e.body(Wire::Chat);
        assert_eq!(body["error"]["message"], "upstream is down");
        assert_eq!(body["error"]["type"], "upstream_error");
        assert_eq!(body["error"]["code"], "upstream_unreachable");
        assert!(body["error"]["param"].is_null());
        assert_eq!(body["error"]["loopguard"]["tool"], "bash");
        let event = e.sse_event(Wire::Chat);
        assert!(event.starts_with("data: {\"error\":"));
        assert!(event.ends_with("\n\n"));
        let anthropic = e.body(Wire::Messages);
        assert_eq!(anthropic["type"], "error");
        assert_eq!(anthropic["error"]["type"], "upstream_error");
        assert!(
            e.sse_event(Wire::Messages)
                .starts_with("event: error\ndata: {")
        );
        let responses = e.sse_event(Wire::Responses);
        let data: Value =
            serde_json::from_str(responses.trim().split_once("data: ").unwrap().1).unwrap();
        assert_eq!(data["type"], "error");
        assert_eq!(data["code"], "upstream_unreachable");
        assert_eq!(data["error"]["code"], "upstream_unreachable");
    }

    #[test]
    fn a_google_envelope_has_the_status_as_code_and_the_proxys_code_as_reason() {
        let mut e = ApiError::new(
            StatusCode::BAD_REQUEST,
            "loop_detected",
            "tool_loop_terminated",
            "stopped",
        );
        e.detail = Some(json!({"tool": "bash"}));
        let body = e.body(Wire::Gemini);
        assert_eq!(body["error"]["code"], 400);
        assert_eq!(body["error"]["status"], "FAILED_PRECONDITION");
        assert_eq!(
            body["error"]["details"][0]["reason"],
            "tool_loop_terminated"
        );
        assert_eq!(body["error"]["loopguard"]["tool"], "bash");
        assert!(e.sse_event(Wire::Gemini).starts_with("data: {\"error\":"));
        let key = ApiError::missing_key(Wire::Gemini).body(Wire::Gemini);
        assert_eq!(key["error"]["status"], "UNAUTHENTICATED");
        assert_eq!(key["error"]["details"][0]["reason"], MISSING_API_KEY);
        assert!(
            key["error"]["message"]
                .as_str()
                .unwrap()
                .contains("x-goog-api-key")
        );
    }

    #[test]
    fn a_missing_key_is_a_401_in_each_formats_shape() {
        for wire in [Wire::Chat, Wire::Messages, Wire::Responses] {
            let e = ApiError::missing_key(wire);
            assert_eq!(e.status, StatusCode::UNAUTHORIZED);
            let body = e.body(wire);
            assert_eq!(body["error"]["code"], MISSING_API_KEY);
            assert!(
                body["error"]["message"]
                    .as_str()
                    .unwrap()
                    .contains("requires an API key")
            );
            if wire == Wire::Messages {
                assert_eq!(body["type"], "error");
                assert_eq!(body["error"]["type"], "authentication_error");
            } else {
                assert!(body.get("type").is_none());
                assert_eq!(body["error"]["type"], "invalid_request_error");
            }
        }
    }
}
