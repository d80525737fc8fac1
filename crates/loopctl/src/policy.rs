//! The one way `loopctl` loads a policy for running it (`simulate`, `test`, `proxy`): the file
//! named by `--rules`, else by `LOOPGUARD_RULES`, else the built-in default; its errors
//! rendered against its sources; its plugins loaded; the `LOOPGUARD_*` server tier read.
//! (`validate` reads policies itself: it reports every diagnostic, not only the errors.)

use std::path::{Path, PathBuf};

use loopguard_engine::LoadedPlugin;
use loopguard_rules::{Policy, Settings, SourceMap};

use crate::{EXIT_CANNOT_RUN, EXIT_INVALID};

/// The environment variable naming the policy file when `--rules` is not given.
pub const RULES_ENV: &str = "LOOPGUARD_RULES";

/// Why a policy could not be used: the rendered report, and the exit code.
#[derive(Debug)]
pub(crate) struct Failure {
    pub message: String,
    pub code: u8,
}

impl Failure {
    /// Prints the report to stderr and gives the exit code.
    pub fn report(self) -> u8 {
        eprintln!("{}", self.message);
        self.code
    }
}

/// A policy loaded and checked.
#[derive(Debug)]
pub(crate) struct Loaded {
    pub policy: Policy,
    pub sources: SourceMap,
}

/// The policy file to use: `--rules`, else `LOOPGUARD_RULES`, else none (the built-in default).
pub(crate) fn rules_path(rules: Option<&Path>) -> Option<PathBuf> {
    rules
        .map(Path::to_path_buf)
        .or_else(|| std::env::var_os(RULES_ENV).map(PathBuf::from))
}

/// Loads the policy at `path` (already resolved with [`rules_path`]), else the built-in
/// default. An unreadable file cannot run (exit 2); an invalid policy is invalid input (exit
/// 1), reported with every error rendered against its sources.
pub(crate) fn load(path: Option<&Path>) -> Result<Loaded, Failure> {
    let loaded = match path {
        Some(p) => Policy::load(p).map_err(|e| Failure {
            message: format!("error: {e}"),
            code: EXIT_CANNOT_RUN,
        })?,
        None => Policy::builtin_default(),
    };
    match loaded.policy {
        Some(policy) => Ok(Loaded {
            policy,
            sources: loaded.sources,
        }),
        None => {
            let mut text = loaded.rendered_errors();
            text.push(format!(
                "error: the policy {} is invalid; run `loopctl validate` on it",
                path.map_or("rules/default.yaml".into(), |p| p.display().to_string())
            ));
            Err(Failure {
                message: text.join("\n"),
                code: EXIT_INVALID,
            })
        }
    }
}

impl Loaded {
    /// Fresh instances of the policy's enabled plugins; every one that fails is reported.
    pub fn plugins(&self) -> Result<Vec<LoadedPlugin>, Failure> {
        loopguard_engine::load_plugins(&self.policy).map_err(|errors| {
            let mut text: Vec<String> = errors
                .iter()
                .map(|e| self.sources.render(&e.diagnostic()))
                .collect();
            text.push(format!(
                "error: {} plugin{} named by the policy could not be loaded; run `loopctl validate` on it",
                errors.len(),
                if errors.len() == 1 { "" } else { "s" }
            ));
            Failure {
                message: text.join("\n"),
                code: EXIT_INVALID,
            }
        })
    }

    /// The server-level settings tier from `LOOPGUARD_ENABLED`, `LOOPGUARD_MAX_REPEATS`,
    /// `LOOPGUARD_TTL_SECONDS` and `LOOPGUARD_MODE`; every bad value is reported.
    pub fn server_settings(&self) -> Result<Settings, Failure> {
        let ladders: Vec<&str> = self
            .policy
            .base()
            .ladders
            .keys()
            .map(String::as_str)
            .collect();
        Settings::from_env(|k| std::env::var(k).ok(), &ladders).map_err(|errors| Failure {
            message: errors
                .iter()
                .map(|e| format!("error: {e}"))
                .collect::<Vec<_>>()
                .join("\n"),
            code: EXIT_INVALID,
        })
    }
}
