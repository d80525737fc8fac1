//! Judging an assistant turn, whatever its wire format: the turn's text and calls in, what to
//! release and what to tell the client out.
//!
//! The judging itself (engine, session book, metrics) sits behind the [`Judge`] trait, so each
//! wire format's response rewriting ([`crate::wire`]) is tested without a server.

use serde_json::Value;

use crate::error::ApiError;

/// One tool call of an assistant turn, assembled.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CallIn {
    /// The call's id (`tool_calls[].id`, `tool_use.id`, `function_call.call_id`).
    pub id: String,
    /// The tool's name.
    pub name: String,
    /// The arguments as the model wrote them (a JSON text, normally).
    pub arguments: String,
}

/// What to do with an assistant turn.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Judged {
    /// Indices of the calls released to the client, in order.
    pub released: Vec<usize>,
    /// What the proxy did in this turn (warned, refused, asked), for the client to see.
    pub interventions: Vec<Intervention>,
    /// Calls were withheld and none released: the turn ends here (the format's "stop" reason),
    /// and `note` is added to the assistant's text.
    pub stop: bool,
    /// The refusal or question the client sees when the turn stops.
    pub note: Option<String>,
    /// The session is stopped: answer with this error instead.
    pub terminate: Option<ApiError>,
}

impl Judged {
    /// Everything released, nothing to add.
    pub fn allow_all(n: usize) -> Judged {
        Judged {
            released: (0..n).collect(),
            ..Judged::default()
        }
    }

    /// Whether call `i` is released.
    pub fn releases(&self, i: usize) -> bool {
        self.released.contains(&i)
    }
}

/// One intervention, as clients see it: in the `x-loopguard-*` headers and the `loopguard` body
/// field of the response it changed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Intervention {
    /// `warn`, `block`, `ask` or `terminate`.
    pub action: &'static str,
    /// The detector that found the loop.
    pub detector: String,
    /// The ladder step that decided the action.
    pub rule: String,
    /// How many times the loop was seen.
    pub count: u32,
    /// The call it is about (`None` for text loops).
    pub tool_call_id: Option<String>,
}

impl Intervention {
    /// The intervention as a JSON object.
    pub fn to_json(&self) -> Value {
        serde_json::json!({
            "action": self.action,
            "detector": self.detector,
            "rule": self.rule,
            "count": self.count,
            "tool_call_id": self.tool_call_id,
        })
    }
}

/// The `loopguard` body field of a response carrying `interventions`.
pub fn body_field(interventions: &[Intervention]) -> Value {
    serde_json::json!({
        "interventions": interventions.iter().map(Intervention::to_json).collect::<Vec<_>>(),
    })
}

/// The header that says what the proxy did to a response (the most severe intervention).
pub const ACTION_HEADER: &str = "x-loopguard-action";
/// The header naming the detector of the most severe intervention.
pub const DETECTOR_HEADER: &str = "x-loopguard-detector";
/// The header naming the ladder step of the most severe intervention.
pub const RULE_HEADER: &str = "x-loopguard-rule";

/// The header values for `interventions`: the most severe one's action, detector and rule.
pub fn headers(interventions: &[Intervention]) -> Option<[(&'static str, String); 3]> {
    let rank = |a: &str| match a {
        "warn" => 1,
        "ask" => 2,
        "block" => 3,
        "terminate" => 4,
        _ => 0,
    };
    let top = interventions.iter().max_by_key(|i| rank(i.action))?;
    Some([
        (ACTION_HEADER, top.action.to_owned()),
        (DETECTOR_HEADER, top.detector.clone()),
        (RULE_HEADER, top.rule.clone()),
    ])
}

/// Judges the turns of one response, in order.
pub trait Judge: Send {
    /// `text` is the turn's assistant text, `calls` its tool calls in order.
    fn judge(&mut self, text: &str, calls: &[CallIn]) -> Judged;

    /// The id of the response about to be judged, told by formats whose clients continue from
    /// a stored response (Responses' `previous_response_id`), whole or streamed. Ignored by
    /// default.
    fn set_response_id(&mut self, _id: &str) {}

    /// How many model answers the conversation held before the one being judged: Gemini
    /// names a call that has no id by its answer's place (see
    /// [`crate::wire::gemini::synthetic_id`]). 0 by default.
    fn answer_turn(&self) -> u64 {
        0
    }

    /// Takes the request's credentials out of an error the upstream sent in its stream (some
    /// upstreams quote the key they were sent); returns whether anything was replaced. Nothing
    /// is by default.
    fn redact(&self, _error: &mut Value) -> bool {
        false
    }

    /// Whether an event as the upstream wrote it quotes the request's credentials: then it is
    /// sent as parsed and redacted, never as written (a duplicate key's earlier copy, which
    /// the parsed event no longer holds, may quote one). None does by default.
    fn quotes_secret(&self, _raw: &str) -> bool {
        false
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Blocks calls whose name is in `block`, terminates on `stop`, warns on `warn`, records
    /// what it saw (and the response ids it was told).
    #[derive(Debug, Default)]
    pub struct Scripted {
        pub block: Vec<&'static str>,
        pub stop: Vec<&'static str>,
        pub warn: Vec<&'static str>,
        pub seen: Vec<(String, Vec<CallIn>)>,
        pub response_ids: Vec<String>,
    }

    impl Judge for Scripted {
        fn set_response_id(&mut self, id: &str) {
            self.response_ids.push(id.to_owned());
        }

        fn judge(&mut self, text: &str, calls: &[CallIn]) -> Judged {
            self.seen.push((text.to_owned(), calls.to_vec()));
            if calls.iter().any(|c| self.stop.contains(&c.name.as_str())) {
                let mut e = ApiError::new(
                    axum::http::StatusCode::BAD_REQUEST,
                    "loop_detected",
                    "tool_loop_terminated",
                    "stopped",
                );
                e.detail = Some(serde_json::json!({"detector": "scripted"}));
                return Judged {
                    terminate: Some(e),
                    ..Judged::default()
                };
            }
            let released: Vec<usize> = (0..calls.len())
                .filter(|&i| !self.block.contains(&calls[i].name.as_str()))
                .collect();
            let withheld = released.len() < calls.len();
            let interventions = calls
                .iter()
                .filter_map(|c| {
                    let action = if self.block.contains(&c.name.as_str()) {
                        "block"
                    } else if self.warn.contains(&c.name.as_str()) {
                        "warn"
                    } else {
                        return None;
                    };
                    Some(Intervention {
                        action,
                        detector: "scripted".to_owned(),
                        rule: "ladders.test[1]".to_owned(),
                        count: 2,
                        tool_call_id: Some(c.id.clone()),
                    })
                })
                .collect();
            Judged {
                stop: withheld && released.is_empty(),
                note: withheld.then(|| "[loopguard] Refused".to_owned()),
                released,
                interventions,
                terminate: None,
            }
        }
    }

    #[test]
    fn the_most_severe_intervention_names_the_headers() {
        let i = |action| Intervention {
            action,
            detector: action.to_owned(),
            rule: String::new(),
            count: 1,
            tool_call_id: None,
        };
        let h = headers(&[i("warn"), i("block"), i("warn")]).unwrap();
        assert_eq!(h[0].1, "block");
        assert!(headers(&[]).is_none());
    }
}
