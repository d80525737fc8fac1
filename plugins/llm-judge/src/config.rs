//! The judge's configuration: the `config:` block of its entry in a policy's `plugins:` list.

use serde::Deserialize;
use serde_json::{Value, json};

use crate::history::Limits;
use crate::schedule::Schedule;

/// One OpenAI-compatible chat-completions endpoint and model.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    /// Base URL up to and including the API version, e.g. `https://api.openai.com/v1`;
    /// `/chat/completions` is appended.
    pub base_url: String,
    /// The model's name, as the server knows it.
    pub model: String,
    /// The environment variable holding the API key (never the key itself).
    #[serde(default)]
    pub api_key_env: Option<String>,
}

/// Where the cost and error log goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LogTarget {
    /// Nowhere.
    Off,
    /// Standard error.
    Stderr,
    /// Appended to this file.
    File(String),
}

/// The judge's configuration (defaults as in docs/plugins.md).
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// The model asked first, at every check.
    pub fast: ModelConfig,
    /// The model asked to confirm a loop the fast one reports; without it the fast verdict
    /// stands.
    #[serde(default)]
    pub strong: Option<ModelConfig>,
    /// Confidence (0 to 1) from which a verdict is a loop.
    #[serde(default = "d_threshold")]
    pub threshold: f64,
    /// No check before this assistant turn of the current prompt.
    #[serde(default = "d_first_turn")]
    pub first_turn: u64,
    /// Turns between checks until one answers.
    #[serde(default = "d_initial_interval")]
    pub initial_interval: u64,
    /// Turns to the next check after an answer of full confidence.
    #[serde(default = "d_min_interval")]
    pub min_interval: u64,
    /// Turns to the next check after an answer of no confidence.
    #[serde(default = "d_max_interval")]
    pub max_interval: u64,
    /// History entries sent with a check.
    #[serde(default = "d_history_entries")]
    pub history_entries: usize,
    /// Most characters of one entry sent.
    #[serde(default = "d_entry_chars")]
    pub entry_chars: usize,
    /// Most characters of the whole history sent.
    #[serde(default = "d_history_chars")]
    pub history_chars: usize,
    /// How long one model request may take.
    #[serde(default = "d_timeout_ms")]
    pub timeout_ms: u64,
    /// Requests per model and check (1 or 2).
    #[serde(default = "d_max_attempts")]
    pub max_attempts: u32,
    /// Wait before the second attempt.
    #[serde(default = "d_backoff_ms")]
    pub backoff_ms: u64,
    /// Checks in flight at once.
    #[serde(default = "d_max_concurrent")]
    pub max_concurrent: usize,
    /// Sessions remembered at once; the least recently seen is forgotten first.
    #[serde(default = "d_max_sessions")]
    pub max_sessions: usize,
    /// Ask for the answer with `response_format: json_schema`.
    #[serde(default = "d_true")]
    pub structured_output: bool,
    /// Most tokens of an answer.
    #[serde(default = "d_max_tokens")]
    pub max_tokens: u32,
    /// Wait for a check's verdict (up to `blocking_deadline_ms`) on the event that started it,
    /// instead of applying it at the next event after it arrives.
    #[serde(default)]
    pub blocking: bool,
    /// How long `blocking` waits for a verdict.
    #[serde(default = "d_deadline")]
    pub blocking_deadline_ms: u64,
    /// `stderr`, `off`, or a file path: one JSON line per check (tokens, latency, outcome).
    #[serde(default = "d_log")]
    pub log: String,
}

fn d_threshold() -> f64 {
    0.9
}
fn d_first_turn() -> u64 {
    30
}
fn d_initial_interval() -> u64 {
    3
}
fn d_min_interval() -> u64 {
    5
}
fn d_max_interval() -> u64 {
    15
}
fn d_history_entries() -> usize {
    20
}
fn d_entry_chars() -> usize {
    2_000
}
fn d_history_chars() -> usize {
    24_000
}
fn d_timeout_ms() -> u64 {
    20_000
}
fn d_max_attempts() -> u32 {
    2
}
fn d_backoff_ms() -> u64 {
    500
}
fn d_max_concurrent() -> usize {
    4
}
fn d_max_sessions() -> usize {
    1024
}
fn d_true() -> bool {
    true
}
fn d_max_tokens() -> u32 {
    400
}
fn d_deadline() -> u64 {
    5_000
}
fn d_log() -> String {
    "stderr".into()
}

impl Config {
    /// The configuration from a policy's `config:` block, checked.
    pub fn from_json(v: Value) -> Result<Config, String> {
        let c: Config = serde_json::from_value(v).map_err(|e| format!("llm-judge config: {e}"))?;
        if !(0.0..=1.0).contains(&c.threshold) {
            return Err("llm-judge config: `threshold` must be between 0 and 1".into());
        }
        if c.max_sessions == 0 {
            return Err("llm-judge config: `max_sessions` must be at least 1".into());
        }
        if c.max_attempts == 0 || c.max_attempts > 2 {
            return Err("llm-judge config: `max_attempts` must be 1 or 2".into());
        }
        if c.min_interval == 0 || c.min_interval > c.max_interval {
            return Err("llm-judge config: need 0 < `min_interval` <= `max_interval`".into());
        }
        for m in std::iter::once(&c.fast).chain(c.strong.as_ref()) {
            if !(m.base_url.starts_with("http://") || m.base_url.starts_with("https://")) {
                return Err(format!(
                    "llm-judge config: `base_url` must start with http:// or https://, got `{}`",
                    m.base_url
                ));
            }
        }
        Ok(c)
    }

    /// When checks are due.
    pub(crate) fn schedule(&self) -> Schedule {
        Schedule {
            first_turn: self.first_turn,
            initial_interval: self.initial_interval,
            min_interval: self.min_interval,
            max_interval: self.max_interval,
        }
    }

    /// The size bounds of what a check sends.
    pub(crate) fn limits(&self) -> Limits {
        Limits {
            entries: self.history_entries,
            entry_chars: self.entry_chars,
            total_chars: self.history_chars,
        }
    }

    /// Where the check log goes.
    pub fn log_target(&self) -> LogTarget {
        match self.log.as_str() {
            "off" | "" => LogTarget::Off,
            "stderr" => LogTarget::Stderr,
            path => LogTarget::File(path.to_owned()),
        }
    }
}

/// The JSON Schema of [`Config`], which the host checks a policy's `config` against.
pub fn schema() -> Value {
    let model = json!({
        "type": "object",
        "properties": {
            "base_url": {"type": "string", "pattern": "^https?://"},
            "model": {"type": "string"},
            "api_key_env": {"type": "string", "description": "environment variable holding the API key"}
        },
        "required": ["base_url", "model"],
        "additionalProperties": false
    });
    let int = |min: u64| json!({"type": "integer", "minimum": min});
    json!({
        "type": "object",
        "properties": {
            "fast": model,
            "strong": model,
            "threshold": {"type": "number", "minimum": 0, "maximum": 1},
            "first_turn": int(0),
            "initial_interval": int(1),
            "min_interval": int(1),
            "max_interval": int(1),
            "history_entries": int(1),
            "entry_chars": int(16),
            "history_chars": int(64),
            "timeout_ms": int(1),
            "max_attempts": {"type": "integer", "minimum": 1, "maximum": 2},
            "backoff_ms": int(0),
            "max_concurrent": int(1),
            "max_sessions": int(1),
            "structured_output": {"type": "boolean"},
            "max_tokens": int(16),
            "blocking": {"type": "boolean"},
            "blocking_deadline_ms": int(1),
            "log": {"type": "string", "description": "stderr, off, or a file path"}
        },
        "required": ["fast"],
        "additionalProperties": false
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    #[test]
    fn defaults_follow_the_algorithm() {
        let c =
            Config::from_json(json!({"fast": {"base_url": "http://127.0.0.1:1/v1", "model": "m"}}))
                .unwrap();
        assert_eq!(c.schedule(), Schedule::default());
        assert_eq!(c.limits(), Limits::default());
        assert_eq!(c.threshold, 0.9);
        assert_eq!(c.max_attempts, 2);
        assert!(c.strong.is_none());
    }

    #[test]
    fn bad_configs_are_refused_with_a_reason() {
        for (cfg, word) in [
            (json!({}), "fast"),
            (
                json!({"fast": {"base_url": "ftp://x", "model": "m"}}),
                "base_url",
            ),
            (
                json!({"fast": {"base_url": "http://x", "model": "m"}, "threshold": 2}),
                "threshold",
            ),
            (
                json!({"fast": {"base_url": "http://x", "model": "m"}, "max_attempts": 5}),
                "max_attempts",
            ),
            (
                json!({"fast": {"base_url": "http://x", "model": "m", "api_key": "sk-1"}}),
                "api_key",
            ),
        ] {
            let e = Config::from_json(cfg).unwrap_err();
            assert!(e.contains(word), "{e}");
        }
    }
}
