//! Loading the plugins a policy names, and running them on an event.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use loopguard_plugin_host::{EventView, HostError, Outcome, Plugin, PluginHost};
use loopguard_rules::config::PluginSpec;
use loopguard_rules::{Diagnostic, Policy};

use super::{Hit, Hits, Plugins};
use crate::verdict::Note;

/// A loaded plugin instance with the policy's settings for it.
#[derive(Debug)]
pub struct LoadedPlugin {
    plugin: Plugin,
    name: String,
    ladder: Option<String>,
    /// Mixed into its loop keys; set when the engine is built.
    pub(super) tag: u64,
    noted_poison: AtomicBool,
    noted_error: AtomicBool,
    errors: AtomicU64,
}

impl LoadedPlugin {
    /// A plugin under its own name, climbing the category's (or the policy's) ladder.
    pub fn new(plugin: Plugin) -> LoadedPlugin {
        LoadedPlugin {
            name: plugin.name().to_owned(),
            plugin,
            ladder: None,
            tag: 0,
            noted_poison: AtomicBool::new(false),
            noted_error: AtomicBool::new(false),
            errors: AtomicU64::new(0),
        }
    }

    /// A plugin with the settings of the policy entry that named it (`name`, `ladder`).
    pub fn from_spec(plugin: Plugin, spec: &PluginSpec) -> LoadedPlugin {
        let mut p = LoadedPlugin::new(plugin);
        if let Some(name) = &spec.name {
            p.name.clone_from(name);
        }
        p.ladder.clone_from(&spec.ladder);
        p
    }

    /// Shows it in verdicts under another name.
    pub fn named(mut self, name: impl Into<String>) -> LoadedPlugin {
        self.name = name.into();
        self
    }

    /// Escalates its detections through the named ladder (an unknown name falls back to the
    /// policy's default ladder).
    pub fn with_ladder(mut self, ladder: impl Into<String>) -> LoadedPlugin {
        self.ladder = Some(ladder.into());
        self
    }

    /// The name verdicts show as their `detector`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The ladder named for it, if any.
    pub fn ladder(&self) -> Option<&str> {
        self.ladder.as_deref()
    }

    /// The plugin instance.
    pub fn plugin(&self) -> &Plugin {
        &self.plugin
    }

    /// Whether it panicked (it is skipped from then on).
    pub fn is_poisoned(&self) -> bool {
        self.plugin.is_poisoned()
    }

    /// How many events it answered with an error status.
    pub fn errors(&self) -> u64 {
        self.errors.load(Ordering::Relaxed)
    }
}

/// A plugin a policy names could not be loaded.
#[derive(Debug, thiserror::Error)]
#[error("cannot load plugin `{}` (`plugins[{index}]`): {error}", spec.written_path)]
pub struct PluginLoadError {
    index: usize,
    spec: PluginSpec,
    #[source]
    error: HostError,
}

impl PluginLoadError {
    /// The entry's index in the policy's `plugins:` list.
    pub fn index(&self) -> usize {
        self.index
    }

    /// The policy entry.
    pub fn spec(&self) -> &PluginSpec {
        &self.spec
    }

    /// What the host said.
    pub fn host_error(&self) -> &HostError {
        &self.error
    }

    /// The failure as a policy diagnostic, pointing at the entry's `path` (or `config`).
    pub fn diagnostic(&self) -> Diagnostic {
        let spec = &self.spec;
        let written = &spec.written_path;
        let resolved = spec.path.display();
        let config_span = spec.config_span.unwrap_or(spec.span);
        match &self.error {
            HostError::NotFound { .. } => Diagnostic::error(
                "plugin-not-found",
                spec.path_span,
                format!("plugin library `{written}` not found"),
            )
            .with_label(format!("looked for `{resolved}`"))
            .with_help(
                "plugin paths are relative to the policy file that names them; build the plugin or fix the path",
            ),
            HostError::AbiMismatch {
                path,
                found,
                expected,
            } => Diagnostic::error(
                "plugin-abi-mismatch",
                spec.path_span,
                format!(
                    "plugin `{}` was built for plugin ABI version {found}, this loopguard speaks version {expected}",
                    path.display()
                ),
            )
            .with_label(format!("ABI version {found}"))
            .with_help(format!(
                "rebuild the plugin against loopguard-plugin-sdk for ABI version {expected}"
            )),
            HostError::BadConfig { plugin, errors, .. } => Diagnostic::error(
                "plugin-config",
                config_span,
                format!(
                    "invalid `config` for plugin `{plugin}`: {}",
                    errors.join("; ")
                ),
            )
            .with_label("does not match the plugin's config schema")
            .with_help(format!(
                "`loopctl plugins {resolved}` prints the schema of its configuration"
            )),
            HostError::CreateFailed {
                plugin, message, ..
            } => Diagnostic::error(
                "plugin-config",
                config_span,
                format!("plugin `{plugin}` refused its configuration: {message}"),
            )
            .with_label("refused by the plugin")
            .with_help(format!(
                "`loopctl plugins {resolved}` prints the schema of its configuration"
            )),
            HostError::Refused { .. } => Diagnostic::error(
                "plugin-refused",
                spec.path_span,
                self.error.to_string(),
            )
            .with_label(format!("`{resolved}`"))
            .with_help(
                "loading a plugin runs its code: it must be a regular file that only its owner can write, in a directory only its owner can write",
            ),
            other => Diagnostic::error("plugin-not-loadable", spec.path_span, other.to_string())
                .with_label(format!("`{resolved}`"))
                .with_help(
                    "point `path` at a loopguard plugin: a shared library built with loopguard-plugin-sdk for this platform",
                ),
        }
    }
}

/// Loads every enabled plugin the policy names (paths are already resolved against the file
/// that named them), each checked against its ABI version and configured with the entry's
/// `config` (validated against the plugin's schema first). Every failure is reported, not
/// only the first.
pub fn load_plugins(policy: &Policy) -> Result<Vec<LoadedPlugin>, Vec<PluginLoadError>> {
    let mut loaded = Vec::new();
    let mut errors = Vec::new();
    for (index, spec) in policy.plugins.iter().enumerate() {
        if !spec.enabled {
            continue;
        }
        match PluginHost::load(&spec.path, &spec.config) {
            Ok(p) => loaded.push(LoadedPlugin::from_spec(p, spec)),
            Err(error) => errors.push(PluginLoadError {
                index,
                spec: spec.clone(),
                error,
            }),
        }
    }
    if errors.is_empty() {
        Ok(loaded)
    } else {
        Err(errors)
    }
}

impl Plugins {
    pub(crate) fn new(mut list: Vec<LoadedPlugin>) -> Plugins {
        for (i, p) in list.iter_mut().enumerate() {
            p.tag = loopguard_hash::fnv1a(p.name.as_bytes())
                ^ (i as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
        Plugins { list }
    }

    pub(crate) fn list(&self) -> &[LoadedPlugin] {
        &self.list
    }

    /// Shows every live plugin the event; collects detections and notes.
    pub(super) fn run(&self, view: &EventView<'_>, tool: Option<u16>) -> Hits {
        let mut hits = Hits {
            tool,
            ..Hits::default()
        };
        for (i, p) in self.list.iter().enumerate() {
            if p.plugin.is_poisoned() && p.noted_poison.load(Ordering::Relaxed) {
                continue;
            }
            match p.plugin.on_event(view) {
                Outcome::NoDetection => {}
                Outcome::Detection {
                    count,
                    key,
                    message,
                    pattern,
                } => hits.detections.push(Hit {
                    plugin: i,
                    count,
                    key,
                    message,
                    pattern,
                }),
                Outcome::Poisoned => {
                    if !p.noted_poison.swap(true, Ordering::Relaxed) {
                        hits.notes.push(Note {
                            code: "plugin_poisoned",
                            plugin: p.name.clone(),
                            message: crate::message::plugin_poisoned(&p.name, p.plugin.path()),
                        });
                    }
                }
                Outcome::Error(code) => {
                    p.errors.fetch_add(1, Ordering::Relaxed);
                    if !p.noted_error.swap(true, Ordering::Relaxed) {
                        hits.notes.push(Note {
                            code: "plugin_error",
                            plugin: p.name.clone(),
                            message: crate::message::plugin_failed(&p.name, code),
                        });
                    }
                }
            }
        }
        hits
    }
}
