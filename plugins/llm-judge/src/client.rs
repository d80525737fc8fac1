//! Asking one model: an OpenAI-compatible chat-completions request with a timeout, at most
//! `max_attempts` attempts with backoff, structured output where the server supports it.

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::config::{Config, ModelConfig};
use crate::judge::{Answer, content_of, parse_answer, request_body};

/// Tokens a check used, when the server reports them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
}

/// One model's reply to one check.
#[derive(Debug)]
pub struct Reply {
    pub result: Result<Answer, String>,
    pub usage: Usage,
    pub attempts: u32,
    pub elapsed: Duration,
}

/// Asks `model` about `history_text`.
pub async fn ask(
    http: &reqwest::Client,
    model: &ModelConfig,
    cfg: &Config,
    history_text: &str,
) -> Reply {
    let started = Instant::now();
    let url = format!("{}/chat/completions", model.base_url.trim_end_matches('/'));
    let key = model
        .api_key_env
        .as_deref()
        .and_then(|var| std::env::var(var).ok())
        .filter(|k| !k.is_empty());
    let mut structured = cfg.structured_output;
    let mut usage = Usage::default();
    let mut last_error = String::new();
    let mut attempts = 0;
    while attempts < cfg.max_attempts {
        if attempts > 0 {
            tokio::time::sleep(Duration::from_millis(cfg.backoff_ms << (attempts - 1))).await;
        }
        attempts += 1;
        let body = request_body(&model.model, history_text, structured, cfg.max_tokens);
        let mut req = http
            .post(&url)
            .timeout(Duration::from_millis(cfg.timeout_ms))
            .header("content-type", "application/json")
            .body(body.to_string());
        if let Some(k) = &key {
            req = req.bearer_auth(k);
        }
        let resp = match req.send().await {
            Ok(r) => r,
            Err(e) => {
                last_error = if e.is_timeout() {
                    format!("timed out after {} ms", cfg.timeout_ms)
                } else {
                    format!("request failed: {e}")
                };
                continue;
            }
        };
        let status = resp.status();
        let text = match resp.text().await {
            Ok(t) => t,
            Err(e) => {
                last_error = format!("reading the response failed: {e}");
                continue;
            }
        };
        if !status.is_success() {
            last_error = format!("HTTP {status}: {}", crate::history::clip(&text, 300));
            // A server that does not support structured output: ask again without it, at once.
            if structured && status.as_u16() == 400 && text.contains("response_format") {
                structured = false;
                attempts -= 1;
                continue;
            }
            // Client errors other than throttling will not get better by retrying.
            if status.is_client_error() && status.as_u16() != 429 && status.as_u16() != 408 {
                break;
            }
            continue;
        }
        let json: Value = match serde_json::from_str(&text) {
            Ok(v) => v,
            Err(e) => {
                last_error = format!("malformed JSON from the server: {e}");
                continue;
            }
        };
        if let Some(u) = json.get("usage") {
            usage.prompt_tokens += u.get("prompt_tokens").and_then(Value::as_u64).unwrap_or(0);
            usage.completion_tokens += u
                .get("completion_tokens")
                .and_then(Value::as_u64)
                .unwrap_or(0);
        }
        match content_of(&json).and_then(parse_answer) {
            Ok(a) => {
                return Reply {
                    result: Ok(a),
                    usage,
                    attempts,
                    elapsed: started.elapsed(),
                };
            }
            Err(e) => last_error = format!("unusable answer: {e}"),
        }
    }
    Reply {
        result: Err(last_error),
        usage,
        attempts,
        elapsed: started.elapsed(),
    }
}
