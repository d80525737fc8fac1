//! What the judge is asked and how its answers become a verdict.

use serde_json::{Value, json};

/// The system prompt: what an unproductive state is, and what is not one.
pub const SYSTEM_PROMPT: &str = "You review the recent history of an AI agent that uses tools to \
carry out a user's request, and judge whether the agent is stuck in an unproductive state.

Unproductive states:
- Repetitive actions: the same tool call, or the same few calls in alternation (A, B, A, B), \
repeated without new information; retrying the same failing approach with cosmetic changes.
- Cognitive loops: restating the same plan, analysis or apology turn after turn without acting \
on it; going back and forth between the same options; claiming progress that the tool results \
contradict.

NOT unproductive:
- Incremental edits to one file, each changing something different.
- The same operation applied in a batch across many different files or items.
- Sequential reads of different files or of successive parts of one file.
- Retries that vary meaningfully (different arguments that test a new hypothesis), or retries of \
infrastructure errors (rate limits, timeouts) with backoff.
- Waiting for or polling a long-running process whose output changes.

Answer with JSON only: {\"unproductive_state_analysis\": string, \
\"unproductive_state_confidence\": number between 0 and 1}. The analysis says briefly what the \
agent is doing and why it is or is not stuck; the confidence is how sure you are that it is stuck.";

/// The JSON Schema the answer must follow, sent as `response_format`.
pub fn answer_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "unproductive_state_analysis": {"type": "string"},
            "unproductive_state_confidence": {"type": "number", "minimum": 0, "maximum": 1}
        },
        "required": ["unproductive_state_analysis", "unproductive_state_confidence"],
        "additionalProperties": false
    })
}

/// The chat-completions request body of one check.
pub fn request_body(model: &str, history_text: &str, structured: bool, max_tokens: u32) -> Value {
    let mut body = json!({
        "model": model,
        "temperature": 0,
        "max_tokens": max_tokens,
        "messages": [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": history_text},
        ],
    });
    if structured {
        body["response_format"] = json!({
            "type": "json_schema",
            "json_schema": {
                "name": "unproductive_state",
                "strict": true,
                "schema": answer_schema(),
            }
        });
    }
    body
}

/// A judge's answer.
#[derive(Clone, Debug, PartialEq)]
pub struct Answer {
    pub analysis: String,
    pub confidence: f64,
}

/// Why an answer could not be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AnswerError {
    /// The response has no message content.
    #[error("the response has no message content")]
    Content,
    /// The answer holds no JSON object.
    #[error("no JSON object in the answer")]
    Json,
    /// The answer's JSON has no usable confidence.
    #[error("the answer has no usable `unproductive_state_confidence`")]
    Confidence,
}

/// Reads the content of a chat-completions response body.
pub fn content_of(response: &Value) -> Result<&str, AnswerError> {
    response
        .pointer("/choices/0/message/content")
        .and_then(Value::as_str)
        .ok_or(AnswerError::Content)
}

/// Parses an answer robustly: bare JSON, JSON in a code fence or surrounded by prose; the
/// confidence as a number, a numeric string or a percentage.
pub fn parse_answer(content: &str) -> Result<Answer, AnswerError> {
    let obj = first_json_object(content).ok_or(AnswerError::Json)?;
    let confidence = match obj.get("unproductive_state_confidence") {
        Some(Value::Number(n)) => n.as_f64(),
        Some(Value::String(s)) => {
            let s = s.trim();
            match s.strip_suffix('%') {
                Some(p) => p.trim().parse::<f64>().ok().map(|p| p / 100.0),
                None => s.parse::<f64>().ok(),
            }
        }
        _ => None,
    }
    .filter(|c| c.is_finite())
    .ok_or(AnswerError::Confidence)?;
    // Some models answer on a 0–100 scale.
    let confidence = if confidence > 1.0 && confidence <= 100.0 {
        confidence / 100.0
    } else {
        confidence
    }
    .clamp(0.0, 1.0);
    let analysis = obj
        .get("unproductive_state_analysis")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    Ok(Answer {
        analysis,
        confidence,
    })
}

/// The first JSON object in `text` that parses.
fn first_json_object(text: &str) -> Option<serde_json::Map<String, Value>> {
    for (start, _) in text.match_indices('{') {
        let mut stream = serde_json::Deserializer::from_str(&text[start..]).into_iter::<Value>();
        if let Some(Ok(Value::Object(map))) = stream.next() {
            return Some(map);
        }
    }
    None
}

/// How a check ended.
#[derive(Clone, Debug, PartialEq)]
pub enum Verdict {
    /// Both models (or the fast one alone, when the strong one is absent or failed) reached the
    /// threshold.
    Loop {
        analysis: String,
        fast: f64,
        strong: Option<f64>,
    },
    /// No loop; `confidence` drives the next interval.
    NoLoop { confidence: f64 },
    /// The check failed (error, timeout, unusable answer): no loop, fail open; the cadence stays.
    Failed { reason: String },
}

impl Verdict {
    /// The confidence that sets the next interval (`None` for a failed check).
    pub fn confidence(&self) -> Option<f64> {
        match self {
            Verdict::Loop { fast, strong, .. } => Some(strong.unwrap_or(*fast)),
            Verdict::NoLoop { confidence } => Some(*confidence),
            Verdict::Failed { .. } => None,
        }
    }
}

/// The outcome of asking the strong model.
#[derive(Clone, Debug, PartialEq)]
pub enum Strong {
    /// Not configured.
    Absent,
    /// Configured but it failed (error, timeout, unusable answer).
    Unavailable(String),
    Answered(Answer),
}

/// Combines the two models' answers. The strong model is consulted only when the fast one
/// reaches `threshold` (inclusive); a loop is reported only if the strong one does too, or if it
/// is absent or unavailable, in which case the fast verdict stands.
pub fn decide(
    fast: Result<Answer, String>,
    strong: impl FnOnce() -> Strong,
    threshold: f64,
) -> Verdict {
    let fast = match fast {
        Ok(a) => a,
        Err(reason) => return Verdict::Failed { reason },
    };
    if fast.confidence < threshold {
        return Verdict::NoLoop {
            confidence: fast.confidence,
        };
    }
    match strong() {
        Strong::Absent | Strong::Unavailable(_) => Verdict::Loop {
            analysis: fast.analysis,
            fast: fast.confidence,
            strong: None,
        },
        Strong::Answered(s) if s.confidence >= threshold => Verdict::Loop {
            analysis: s.analysis,
            fast: fast.confidence,
            strong: Some(s.confidence),
        },
        Strong::Answered(s) => Verdict::NoLoop {
            confidence: s.confidence,
        },
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;
    use crate::schedule::Schedule;

    fn a(c: f64) -> Answer {
        Answer {
            analysis: format!("at {c}"),
            confidence: c,
        }
    }

    #[test]
    fn exactly_the_threshold_on_both_models_is_a_loop() {
        let v = decide(Ok(a(0.9)), || Strong::Answered(a(0.9)), 0.9);
        assert_eq!(
            v,
            Verdict::Loop {
                analysis: "at 0.9".into(),
                fast: 0.9,
                strong: Some(0.9)
            }
        );
    }

    #[test]
    fn a_strong_model_below_the_threshold_overrules_and_sets_interval_6() {
        let v = decide(Ok(a(0.9)), || Strong::Answered(a(0.89)), 0.9);
        assert_eq!(v, Verdict::NoLoop { confidence: 0.89 });
        assert_eq!(
            Schedule::default().interval_after(v.confidence().unwrap()),
            6
        );
    }

    #[test]
    fn the_fast_verdict_stands_without_a_strong_model() {
        for strong in [Strong::Absent, Strong::Unavailable("timeout".into())] {
            let v = decide(Ok(a(0.95)), || strong, 0.9);
            assert!(matches!(v, Verdict::Loop { strong: None, .. }), "{v:?}");
        }
    }

    #[test]
    fn the_strong_model_is_not_asked_below_the_threshold() {
        let v = decide(Ok(a(0.3)), || panic!("not asked"), 0.9);
        assert_eq!(v, Verdict::NoLoop { confidence: 0.3 });
    }

    #[test]
    fn errors_are_no_loop() {
        let v = decide(Err("connection refused".into()), || Strong::Absent, 0.9);
        assert!(matches!(v, Verdict::Failed { .. }));
        assert_eq!(v.confidence(), None);
    }

    #[test]
    fn answers_are_parsed_robustly() {
        let ok = |s: &str| parse_answer(s).unwrap().confidence;
        assert_eq!(
            ok(r#"{"unproductive_state_analysis":"x","unproductive_state_confidence":0.7}"#),
            0.7
        );
        assert_eq!(
            ok("```json\n{\"unproductive_state_confidence\": \"0.4\"}\n```"),
            0.4
        );
        assert_eq!(
            ok("Sure! {\"unproductive_state_confidence\": 85} hope it helps"),
            0.85
        );
        assert_eq!(ok("{\"unproductive_state_confidence\": \"90%\"}"), 0.9);
        assert_eq!(ok("{\"unproductive_state_confidence\": -3}"), 0.0);
        assert_eq!(parse_answer("no json here"), Err(AnswerError::Json));
        assert_eq!(
            parse_answer("{\"confidence\": 1}"),
            Err(AnswerError::Confidence)
        );
        assert_eq!(
            parse_answer("{\"unproductive_state_confidence\": \"high\"}"),
            Err(AnswerError::Confidence)
        );
    }

    #[test]
    fn the_request_asks_for_structured_output() {
        let body = request_body("small", "history", true, 256);
        assert_eq!(body["response_format"]["type"], "json_schema");
        assert_eq!(body["messages"][0]["role"], "system");
        assert_eq!(body["messages"][1]["content"], "history");
        assert!(
            request_body("small", "h", false, 256)
                .get("response_format")
                .is_none()
        );
    }
}
