//! Building an [`Engine`] for a policy: one way in, which never drops the policy's plugins
//! silently.
//!
//! ```
//! use loopguard_engine::Engine;
//! use loopguard_rules::{Policy, Settings};
//!
//! let policy = Policy::builtin_default().policy.expect("the default policy is valid");
//! let engine = Engine::builder(&policy)
//!     .backend("openai")
//!     .model("gpt-4o")
//!     .server_settings(Settings::default())
//!     .build()
//!     .expect("the default policy names no plugins");
//! # let _ = engine;
//! ```

use std::sync::Arc;

use loopguard_rules::{Policy, Settings};
use loopguard_store::{GroupStore, MemoryStore};

use crate::compiled::CompiledRules;
use crate::engine::Engine;

/// Which detector plugins the engine runs.
#[derive(Debug, Default)]
enum PluginChoice {
    /// Every enabled plugin the policy names, loaded at [`EngineBuilder::build`].
    #[default]
    FromPolicy,
    /// None, whatever the policy names (the caller said so).
    Skip,
    /// These, already loaded.
    #[cfg(feature = "plugins")]
    Loaded(Vec<crate::plugins::LoadedPlugin>),
}

/// Where group (swarm) counters live.
#[derive(Default)]
enum StoreChoice {
    /// In the engine's own memory (part of its snapshots).
    #[default]
    Own,
    Shared(Arc<dyn GroupStore>),
    Memory(Arc<MemoryStore>),
}

impl std::fmt::Debug for StoreChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            StoreChoice::Own => "Own",
            StoreChoice::Shared(_) => "Shared",
            StoreChoice::Memory(_) => "Memory",
        })
    }
}

/// Why an engine could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    /// Plugins the policy names could not be loaded (every failure is listed).
    #[cfg(feature = "plugins")]
    #[error("{} plugin(s) named by the policy could not be loaded: {}", .0.len(), join(.0))]
    Plugins(Vec<crate::plugins::PluginLoadError>),
    /// The policy names plugins but this build of the engine cannot run them.
    #[error(
        "the policy names {count} plugin(s), but this engine is built without the `plugins` \
         feature: build with it, or call `without_plugins()` to run the built-in detectors only"
    )]
    PluginsNotSupported {
        /// How many enabled plugins the policy names.
        count: usize,
    },
}

#[cfg(feature = "plugins")]
fn join(errors: &[crate::plugins::PluginLoadError]) -> String {
    errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// Builds an [`Engine`]: the policy resolved for a backend, a model and server-level settings,
/// the policy's plugins (or others, or none, said explicitly), and a group store.
#[derive(Debug)]
pub struct EngineBuilder<'p> {
    policy: &'p Policy,
    backend: Option<String>,
    model: Option<String>,
    server: Settings,
    plugins: PluginChoice,
    store: StoreChoice,
}

impl Engine {
    /// Starts building an engine for `policy`.
    pub fn builder(policy: &Policy) -> EngineBuilder<'_> {
        EngineBuilder {
            policy,
            backend: None,
            model: None,
            server: Settings::default(),
            plugins: PluginChoice::FromPolicy,
            store: StoreChoice::Own,
        }
    }
}

impl EngineBuilder<'_> {
    /// The backend the policy's `overrides` match (e.g. the upstream's host).
    pub fn backend(mut self, backend: impl Into<String>) -> Self {
        self.backend = Some(backend.into());
        self
    }

    /// The model the policy's `overrides` match.
    pub fn model(mut self, model: impl Into<String>) -> Self {
        self.model = Some(model.into());
        self
    }

    /// Server-level settings (the `LOOPGUARD_*` tier, e.g. from [`Settings::from_env`]),
    /// beneath the policy's matching overrides.
    pub fn server_settings(mut self, server: Settings) -> Self {
        self.server = server;
        self
    }

    /// Runs the built-in detectors only, whatever plugins the policy names.
    pub fn without_plugins(mut self) -> Self {
        self.plugins = PluginChoice::Skip;
        self
    }

    /// Runs these plugins (already loaded, e.g. with [`crate::load_plugins`]) instead of loading
    /// the ones the policy names.
    #[cfg(feature = "plugins")]
    pub fn plugins(mut self, loaded: Vec<crate::plugins::LoadedPlugin>) -> Self {
        self.plugins = PluginChoice::Loaded(loaded);
        self
    }

    /// Keeps group counters in `store` (e.g. a `RedisStore` shared by several hosts).
    pub fn store(mut self, store: Arc<dyn GroupStore>) -> Self {
        self.store = StoreChoice::Shared(store);
        self
    }

    /// Keeps group counters in this in-memory store (e.g. one with other bounds); its state is
    /// part of [`Engine::snapshot`].
    pub fn memory_store(mut self, store: Arc<MemoryStore>) -> Self {
        self.store = StoreChoice::Memory(store);
        self
    }

    /// The engine. Fails when the policy's plugins cannot be loaded, or when it names plugins
    /// and this build cannot run them; never runs without them silently.
    pub fn build(self) -> Result<Engine, BuildError> {
        let config =
            self.policy
                .resolve_with(self.backend.as_deref(), self.model.as_deref(), &self.server);
        let enabled = self.policy.plugins.iter().filter(|p| p.enabled).count();
        let rules = match self.plugins {
            PluginChoice::Skip => CompiledRules::new(config),
            #[cfg(feature = "plugins")]
            PluginChoice::Loaded(loaded) => CompiledRules::with_plugins(config, loaded),
            #[cfg(feature = "plugins")]
            PluginChoice::FromPolicy => {
                let loaded =
                    crate::plugins::load_plugins(self.policy).map_err(BuildError::Plugins)?;
                CompiledRules::with_plugins(config, loaded)
            }
            #[cfg(not(feature = "plugins"))]
            PluginChoice::FromPolicy if enabled > 0 => {
                return Err(BuildError::PluginsNotSupported { count: enabled });
            }
            #[cfg(not(feature = "plugins"))]
            PluginChoice::FromPolicy => CompiledRules::new(config),
        };
        let _ = enabled;
        let target = crate::engine::Target {
            backend: self.backend,
            model: self.model,
        };
        let engine = Engine::from_rules(rules).set_resolver(self.policy, target, self.server);
        Ok(match self.store {
            StoreChoice::Own => engine,
            StoreChoice::Shared(store) => engine.set_store(store, None),
            StoreChoice::Memory(memory) => {
                engine.set_store(Arc::clone(&memory) as Arc<dyn GroupStore>, Some(memory))
            }
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn naming_a_plugin() -> Policy {
        let text = "version: 1\nplugins:\n  - path: /nonexistent/libloopguard_plugin_x.so\n";
        Policy::load_text(std::path::Path::new("p.yaml"), text.to_owned())
            .policy
            .expect("valid")
    }

    #[test]
    fn a_policy_without_plugins_builds() {
        let policy = Policy::builtin_default().policy.unwrap();
        let engine = Engine::builder(&policy).model("gpt-4o").build().unwrap();
        assert_eq!(engine.session_count(), 0);
    }

    #[cfg(feature = "plugins")]
    #[test]
    fn a_plugin_that_cannot_load_fails_the_build() {
        let err = Engine::builder(&naming_a_plugin()).build().unwrap_err();
        assert!(
            matches!(err, BuildError::Plugins(ref e) if e.len() == 1),
            "{err}"
        );
        assert!(err.to_string().contains("libloopguard_plugin_x"), "{err}");
    }

    #[cfg(not(feature = "plugins"))]
    #[test]
    fn plugins_are_never_dropped_silently_without_the_feature() {
        let err = Engine::builder(&naming_a_plugin()).build().unwrap_err();
        assert!(
            matches!(err, BuildError::PluginsNotSupported { count: 1 }),
            "{err}"
        );
    }

    #[test]
    fn without_plugins_says_so_explicitly() {
        let engine = Engine::builder(&naming_a_plugin())
            .without_plugins()
            .build()
            .unwrap();
        assert_eq!(engine.session_count(), 0);
    }
}
