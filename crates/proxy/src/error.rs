//! Protocol-shaped errors: the OpenAI error envelope, as a JSON body or as a final SSE event.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

/// An error the proxy answers with: `{"error": {"message", "type", "param", "code"}}`.
///
/// `type` and `code` follow OpenAI's conventions where one exists (`invalid_request_error`);
/// the proxy's own are `upstream_error` (502/504: the model server failed) and `loop_detected`
/// (the policy stopped the session).
#[derive(Clone, Debug, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub kind: &'static str,
    pub code: &'static str,
    /// Extra machine-readable detail, under `error.loopguard` (tool, count, detector, …).
    pub detail: Option<Value>,
}

impl ApiError {
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

    pub fn invalid_request(code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            code,
            message,
        )
    }

    pub fn upstream(
        status: StatusCode,
        code: &'static str,
        message: impl Into<String>,
    ) -> ApiError {
        ApiError::new(status, "upstream_error", code, message)
    }

    /// The envelope as a JSON value.
    pub fn body(&self) -> Value {
        let mut error = json!({
            "message": self.message,
            "type": self.kind,
            "param": null,
            "code": self.code,
        });
        if let (Some(detail), Some(obj)) = (&self.detail, error.as_object_mut()) {
            obj.insert("loopguard".into(), detail.clone());
        }
        json!({ "error": error })
    }

    /// The envelope as the last event of an SSE stream.
    pub fn sse_event(&self) -> String {
        format!("data: {}\n\n", self.body())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut out = json_response(self.status, &self.body());
        // A stop says so in the same headers as the proxy's other interventions.
        if self.kind == "loop_detected" {
            let detail = self.detail.as_ref();
            let field = |k: &str| {
                detail
                    .and_then(|d| d.get(k))
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned()
            };
            for (name, value) in [
                ("x-loopguard-action", "terminate".to_owned()),
                ("x-loopguard-detector", field("detector")),
                ("x-loopguard-rule", field("rule")),
            ] {
                if let Ok(v) = HeaderValue::from_str(&value) {
                    out.headers_mut().insert(name, v);
                }
            }
        }
        out
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
    use super::*;

    #[test]
    fn envelope_has_every_openai_field() {
        let mut e = ApiError::upstream(
            StatusCode::BAD_GATEWAY,
            "upstream_unreachable",
            "upstream is down",
        );
        e.detail = Some(json!({"tool": "bash"}));
        let body = e.body();
        assert_eq!(body["error"]["message"], "upstream is down");
        assert_eq!(body["error"]["type"], "upstream_error");
        assert_eq!(body["error"]["code"], "upstream_unreachable");
        assert!(body["error"]["param"].is_null());
        assert_eq!(body["error"]["loopguard"]["tool"], "bash");
        let event = e.sse_event();
        assert!(event.starts_with("data: {\"error\":"));
        assert!(event.ends_with("\n\n"));
    }
}
