//! loopguard policies: YAML files that say which tool-call loops to catch and what to do.
//!
//! The key design decision: a policy is read into a loose, spanned node tree first and only then
//! compiled. Every check — unknown keys, types, ranges, regexes, cross-references — works on that
//! tree, so each problem names its file, line and column and all of them are reported together.
//! Parameters are declared once in [`schema`]; the typed configuration's sections and their
//! readers, the defaults, the JSON Schema and the rule reference are derived from those
//! declarations.
//!
//! ```
//! use loopguard_rules::Policy;
//!
//! let loaded = Policy::load_text(
//!     std::path::Path::new("inline.yaml"),
//!     "version: 1\ndetectors:\n  exact_repeat:\n    threshold: 4\n".to_owned(),
//! );
//! let policy = loaded.policy.expect("valid");
//! assert_eq!(policy.base().detectors.exact_repeat.threshold, 4);
//! ```

#![warn(missing_docs)]

pub(crate) mod check;
pub mod config;
pub mod diagnostic;
pub mod generate;
pub mod node;
mod param;
pub mod policy;
pub mod read;
pub mod schema;
mod semantic;
pub mod tiers;

pub use check::NameGlob;
pub use config::{Action, Category, Config, Detector, Detectors, Group, Ladder, Nudge, Step};
pub use diagnostic::{Diagnostic, Severity, SourceMap};
pub use policy::{LoadError, Loaded, Policy};
pub use tiers::{SettingError, SettingKey, Settings};
