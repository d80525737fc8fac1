//! The LLM judge: a detector plugin that asks a model whether the agent is still making progress.
//!
//! The pieces, each a policy parameter ([`config`]): `schedule.rs` decides when to ask (not
//! before turn 30 of the current prompt, then every 3 turns, then at an interval that adapts to
//! the last answer's confidence); `history.rs` keeps what the judge reads, bounded and with
//! secrets masked (`mask.rs`); `judge.rs` builds the request, parses the answer and combines the
//! fast and the strong model's verdicts; [`plugin`] runs checks on the plugin's own runtime.

#![warn(missing_docs)]

mod client;
pub mod config;
mod history;
mod judge;
mod mask;
pub mod plugin;
mod schedule;

use loopguard_plugin_sdk::{Detection, Detector, Event, export_plugin};

/// The exported detector: the [`plugin::Judge`] behind the SDK's trait.
#[derive(Debug)]
pub struct LlmJudge(plugin::Judge);

impl Detector for LlmJudge {
    fn name() -> &'static str {
        "llm_judge"
    }

    fn version() -> &'static str {
        env!("CARGO_PKG_VERSION")
    }

    fn config_schema() -> serde_json::Value {
        config::schema()
    }

    fn new(config: serde_json::Value) -> Result<Self, String> {
        Ok(LlmJudge(plugin::Judge::new(config::Config::from_json(
            config,
        )?)?))
    }

    fn on_event(&mut self, ev: &Event<'_>) -> Option<Detection> {
        self.0.on_event(ev)
    }

    const BACKGROUND: bool = true;

    fn wait_idle(&mut self, timeout_ms: u64) {
        self.0
            .wait_idle(std::time::Duration::from_millis(timeout_ms));
    }
}

export_plugin!(LlmJudge);
