//! The loopguard engine: it watches the events of agent sessions (tool calls, results, text,
//! user messages) and says, for each one, whether the agent is stuck in a loop and what the host
//! should do: allow, warn, ask, block or terminate.
//!
//! # Key design decision
//!
//! Everything expensive happens once. The policy is compiled once into [`CompiledRules`]; each
//! tool name is classified once (category, key lists, shell or not); each call is fingerprinted
//! once into two 64-bit keys in one pass over its arguments, hashing each (already canonical)
//! string as it is rather than building a canonical form; each result is masked and hashed once
//! into a digest. Sessions then keep only a bounded ring of 32-byte records, and every detector
//! compares integers over that window (the repeat detectors in a single pass). The hot path
//! (`observe` for a call) allocates nothing in steady state, and an `allow` verdict is free.
//!
//! Detector plugins (shared libraries a policy names) run beside the built-in detectors with the
//! `plugins` cargo feature, through the same ladders: see [`plugins`]. Without the feature the
//! engine links no `unsafe` code.
//!
//! Configuration comes in tiers (policy → server settings → the policy's (backend, model)
//! overrides → per-session settings, [`Engine::set_session_settings`]), resolved when a session
//! starts or its settings change. Sessions may be workers of a group (a swarm,
//! [`Engine::join_group`]) whose loops are counted across workers in a [`store`] (in memory, or
//! in Redis with the `redis` feature), and sessions and group state can be
//! [snapshotted](snapshot). See [`engine`].
//!
//! # Example
//!
//! ```
//! use loopguard_engine::{Action, Arguments, Call, Engine, Event};
//! use loopguard_rules::Policy;
//!
//! let policy = Policy::builtin_default().policy.expect("the default policy is valid");
//! let engine = Engine::builder(&policy).build().expect("the default policy names no plugins");
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
#![warn(missing_docs)]
#![forbid(unsafe_code)]

mod builder;
pub(crate) mod compiled;
pub(crate) mod detect;
pub mod engine;
pub(crate) mod escalation;
pub mod event;
pub(crate) mod fingerprint;
mod hash;
pub(crate) mod message;
pub(crate) mod normalize;
pub mod plugins;
pub mod session;
pub mod snapshot;
pub mod verdict;

#[cfg(test)]
mod scope_tests;
#[cfg(test)]
mod tests;

pub use builder::{BuildError, EngineBuilder};
pub use compiled::CompiledRules;
pub use engine::Engine;
pub use event::{Arguments, Call, Event, Text, ToolResult, UserMessage};
#[cfg(feature = "plugins")]
pub use plugins::{LoadedPlugin, PluginLoadError, load_plugins};
pub use session::Session;
pub use snapshot::SnapshotError;
pub use verdict::{Action, CallRef, Note, Verdict};

pub use loopguard_rules::Settings;
/// The group (swarm) state stores (`MemoryStore`; `RedisStore` with the `redis` feature),
/// re-exported so that hosts need one dependency.
pub use loopguard_store as store;
