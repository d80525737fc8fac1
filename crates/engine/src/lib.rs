//! The loopguard engine: it watches the events of agent sessions (tool calls, results, text,
//! user messages) and says, for each one, whether the agent is stuck in a loop and what the host
//! should do: allow, warn, ask, block or terminate.
//!
//! # Key design decision
//!
//! Everything expensive happens once. The policy is compiled once into [`CompiledRules`]; each
//! tool name is classified once (category, key lists, shell or not); each call is fingerprinted
//! once into two 64-bit keys by hashing its canonical arguments directly, without building a
//! canonical string; each result is masked and hashed once into a digest. Sessions then keep only
//! a bounded ring of 40-byte records, and every detector compares integers over that window. The
//! hot path (`observe` for a call) allocates nothing in steady state, and an `allow` verdict is
//! free.
//!
//! # Example
//!
//! ```
//! use loopguard_engine::{Action, Arguments, Call, Engine, Event};
//! use loopguard_rules::Policy;
//!
//! let policy = Policy::builtin_default().policy.expect("the default policy is valid");
//! let engine = Engine::from_policy(&policy);
//! let args = serde_json::json!({"command": "cargo build"});
//! let call = |id, t| Event::Call(Call {
//!     session: "s1",
//!     call_id: id,
//!     tool: "bash",
//!     arguments: Arguments::Json(&args),
//!     time_ms: t,
//! });
//! assert!(engine.observe(&call("c1", 0)).is_allow());
//! assert!(engine.observe(&call("c2", 10)).is_allow());
//! let third = engine.observe(&call("c3", 20));
//! assert_eq!(third.action, Action::Warn);
//! assert_eq!(third.detector.as_deref(), Some("exact_repeat"));
//! assert_eq!(engine.observe(&call("c4", 30)).action, Action::Block);
//! ```
#![forbid(unsafe_code)]

pub mod compiled;
pub mod detect;
pub mod engine;
pub mod escalation;
pub mod event;
pub mod fingerprint;
mod hash;
pub mod normalize;
pub mod session;
pub mod verdict;

#[cfg(test)]
mod tests;

pub use compiled::CompiledRules;
pub use engine::Engine;
pub use event::{Arguments, Call, Event, Text, ToolResult, UserMessage};
pub use session::Session;
pub use verdict::{Action, CallRef, Verdict};
