//! Detector plugins beside the built-in detectors.
//!
//! With the `plugins` cargo feature the engine runs the plugins a policy names (shared libraries
//! speaking `loopguard-plugin-abi`, loaded by `loopguard-plugin-host`) on every call, result,
//! text and user event, and feeds what they detect into the **same escalation** as the built-in
//! detectors: the plugin entry's `ladder` (else the tool category's, else the policy's), one
//! loop counter per plugin loop key, the most severe outcome of the event winning (ties go to
//! the built-in detectors, then to plugins in policy order). The verdict's `detector` is the
//! plugin's name (the policy's `name:` for it, else the plugin's own) and its `{pattern}` the
//! plugin's pattern; the plugin's message follows the ladder step's (`Details: …`), or stands alone,
//! worded for the action, when the step has no message of its own.
//!
//! Without the feature this module only holds the empty shapes the session code calls into, and
//! the engine links no `unsafe` code at all.
//!
//! # What a plugin sees
//!
//! One borrowed view per event, built once and shown to every plugin in turn: no JSON is parsed
//! or built for plugins, except that arguments the host gave as a parsed JSON value are written
//! out once, compactly, with keys sorted and the policy's volatile keys dropped (arguments the
//! host gave as text are passed as they are). The view's window is the session's live window of
//! calls, oldest first, as fingerprints (for a call event, without the call itself).
//!
//! # Failures
//!
//! A plugin that panics is poisoned by the host: the verdict of that event carries a
//! `plugin_poisoned` [`Note`] (once), and the plugin is skipped from then on while the engine
//! goes on with the others. A plugin that returns an error status is ignored for that event;
//! its first error adds a `plugin_error` note and `LoadedPlugin::errors` counts them all.
//!
//! ```no_run
//! # #[cfg(feature = "plugins")] {
//! use loopguard_engine::{Engine, load_plugins};
//! use loopguard_rules::Policy;
//!
//! let loaded = Policy::load("policy.yaml".as_ref()).expect("readable");
//! let policy = loaded.policy.expect("valid");
//! let plugins = match load_plugins(&policy) {
//!     Ok(p) => p,
//!     Err(errors) => {
//!         for e in &errors {
//!             eprintln!("{}", loaded.sources.render(&e.diagnostic()));
//!         }
//!         std::process::exit(1);
//!     }
//! };
//! let engine = Engine::builder(&policy).plugins(plugins).build().expect("plugins given");
//! # }
//! ```

use std::borrow::Cow;

use loopguard_rules::{Action, Step};

use crate::compiled::{CompiledRules, ToolInfo};
use crate::detect::{Record, Window};
use crate::escalation::{Loops, Vars};
use crate::event::{Call, Text, ToolResult, UserMessage};
use crate::fingerprint::CallKeys;
use crate::verdict::{CallRef, Note, Verdict};

#[cfg(feature = "plugins")]
pub use enabled::{LoadedPlugin, PluginLoadError, load_plugins};
/// The plugin host (re-exported so that hosts and `loopctl` need one dependency).
#[cfg(feature = "plugins")]
pub use loopguard_plugin_host as host;

/// The plugins of an engine, shared by its sessions (they live in [`CompiledRules`]).
#[derive(Debug, Default)]
pub struct Plugins {
    #[cfg(feature = "plugins")]
    list: Vec<LoadedPlugin>,
}

/// What the plugins said about one event.
#[derive(Debug, Default)]
pub(crate) struct Hits {
    /// The tool of the call the event is about, if any.
    pub(crate) tool: Option<u16>,
    pub(crate) detections: Vec<Hit>,
    pub(crate) notes: Vec<Note>,
}

/// One plugin's detection.
#[derive(Debug)]
#[cfg_attr(not(feature = "plugins"), allow(dead_code))]
pub(crate) struct Hit {
    /// Index into the engine's plugins.
    plugin: usize,
    count: u32,
    key: u64,
    message: String,
    pattern: String,
}

/// A plugin detection with the ladder step it takes.
#[derive(Debug)]
pub(crate) struct PluginDecision<'r> {
    /// Index into [`Hits::detections`].
    hit: usize,
    pub(crate) loop_key: u64,
    pub(crate) action: Action,
    ladder: &'r str,
    step: Option<(usize, &'r Step)>,
}

impl Plugins {
    /// No plugin runs.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// How many plugins run.
    pub fn len(&self) -> usize {
        #[cfg(feature = "plugins")]
        return self.list.len();
        #[cfg(not(feature = "plugins"))]
        0
    }

    /// The ladder a plugin's detections climb (its own, if the policy gave one) and the tag mixed
    /// into its loop keys.
    fn ladder_and_tag(&self, i: usize) -> Option<(Option<&str>, u64)> {
        #[cfg(feature = "plugins")]
        return self.list.get(i).map(|p| (p.ladder(), p.tag));
        #[cfg(not(feature = "plugins"))]
        {
            let _ = i;
            None
        }
    }

    /// Whether any plugin reads call arguments.
    #[cfg(feature = "plugins")]
    fn reads_arguments(&self) -> bool {
        self.list.iter().any(|p| p.plugin().reads_arguments())
    }

    /// A plugin's name as verdicts show it.
    fn name(&self, i: usize) -> &str {
        #[cfg(feature = "plugins")]
        return self.list.get(i).map_or("plugin", LoadedPlugin::name);
        #[cfg(not(feature = "plugins"))]
        {
            let _ = i;
            "plugin"
        }
    }

    /// Shows the plugins a call. `w` is the session's window, this call included (newest).
    pub(crate) fn on_call(
        &self,
        c: &Call<'_>,
        keys: &CallKeys,
        tool: &ToolInfo,
        w: &Window<'_>,
    ) -> Hits {
        #[cfg(feature = "plugins")]
        if !self.list.is_empty() {
            return enabled::with_scratch(|s| {
                // Arguments are written out only when some plugin reads them.
                let args = match c.arguments {
                    crate::Arguments::Raw(text) => text,
                    crate::Arguments::Json(_) if !self.reads_arguments() => "",
                    crate::Arguments::Json(v) => {
                        enabled::canonical(&mut s.args, v, &tool.keys.volatile)
                    }
                };
                let window = enabled::window(&mut s.window, w, 1);
                let view = host::EventView::new(host::EventKind::Call, c.session, c.time_ms)
                    .call_id(c.call_id)
                    .tool(c.tool)
                    .arguments(args)
                    .fingerprints(u64::from(keys.exact as u32), u64::from(keys.fuzzy as u32))
                    .window(window);
                self.run(&view, Some(tool.id))
            });
        }
        let _ = (c, keys, tool, w);
        Hits::default()
    }

    /// Shows the plugins a result. `rec` is the call it answers, `tool` that call's tool.
    pub(crate) fn on_result(
        &self,
        r: &ToolResult<'_>,
        tool: Option<&ToolInfo>,
        rec: &Record,
        digest: u64,
        w: &Window<'_>,
    ) -> Hits {
        #[cfg(feature = "plugins")]
        if !self.list.is_empty() {
            return enabled::with_scratch(|s| {
                let window = enabled::window(&mut s.window, w, 0);
                let view = host::EventView::new(host::EventKind::Result, r.session, r.time_ms)
                    .call_id(r.call_id)
                    .tool(tool.map_or("", |t| &*t.name))
                    .result(r.output, r.is_error, r.exit_code)
                    .fingerprints(u64::from(rec.exact), u64::from(rec.fuzzy))
                    .result_digest(digest)
                    .window(window);
                self.run(&view, tool.map(|t| t.id))
            });
        }
        let _ = (r, tool, rec, digest, w);
        Hits::default()
    }

    /// Shows the plugins assistant text (a turn or a chunk of one).
    pub(crate) fn on_text(&self, t: &Text<'_>, w: &Window<'_>) -> Hits {
        #[cfg(feature = "plugins")]
        if !self.list.is_empty() {
            return enabled::with_scratch(|s| {
                let window = enabled::window(&mut s.window, w, 0);
                let view = host::EventView::new(host::EventKind::Text, t.session, t.time_ms)
                    .text(t.text)
                    .window(window);
                self.run(&view, None)
            });
        }
        let _ = (t, w);
        Hits::default()
    }

    /// Shows the plugins a user message; returns their notes. They may reset state on it; what
    /// they detect on it is not escalated (a person's message is never refused).
    pub(crate) fn on_user(&self, u: &UserMessage<'_>) -> Vec<Note> {
        #[cfg(feature = "plugins")]
        if !self.list.is_empty() {
            let view =
                host::EventView::new(host::EventKind::User, u.session, u.time_ms).text(u.text);
            return self.run(&view, None).notes;
        }
        let _ = u;
        Vec::new()
    }

    /// Tells the plugins to forget a session (it was reset or evicted); returns their notes.
    pub(crate) fn reset(&self, session: &str, time_ms: u64) -> Vec<Note> {
        #[cfg(feature = "plugins")]
        if !self.list.is_empty() {
            let view = host::EventView::new(host::EventKind::Reset, session, time_ms);
            return self.run(&view, None).notes;
        }
        let _ = (session, time_ms);
        Vec::new()
    }
}

impl Hits {
    /// Nothing detected and nothing to say.
    pub(crate) fn is_empty(&self) -> bool {
        self.detections.is_empty() && self.notes.is_empty()
    }
}

/// Mixes a plugin's loop key with the plugin's tag, so plugins never share a loop counter with
/// each other or with a built-in detector.
fn loop_key(key: u64, tag: u64) -> u64 {
    let mut h = key ^ tag.rotate_left(29);
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

/// The most severe plugin detection, through its ladder, when it is more severe than the best
/// built-in one (`builtin`); `None` when no plugin detection beats it.
pub(crate) fn decide<'r>(
    rules: &'r CompiledRules,
    loops: &Loops,
    flags: u32,
    hits: &Hits,
    category: Option<usize>,
    occasion: u64,
    builtin: Option<Action>,
) -> Option<PluginDecision<'r>> {
    let mut best: Option<PluginDecision<'r>> = None;
    for (i, h) in hits.detections.iter().enumerate() {
        let Some((own, tag)) = rules.plugins.ladder_and_tag(h.plugin) else {
            continue;
        };
        let key = loop_key(h.key, tag);
        let Some(repeat) = loops.prospective(key, occasion) else {
            continue;
        };
        let (ladder, step) = crate::escalation::ladder_step(rules, category, own, repeat, flags);
        let action = step.map_or(Action::Allow, |(_, s)| s.action);
        if best.as_ref().is_none_or(|b| action > b.action) {
            best = Some(PluginDecision {
                hit: i,
                loop_key: key,
                action,
                ladder,
                step,
            });
        }
    }
    best.filter(|b| builtin.is_none_or(|a| b.action > a))
}

/// The verdict for a plugin decision (not `allow`). `this` is the call the event is about.
pub(crate) fn verdict(
    rules: &CompiledRules,
    dec: &PluginDecision<'_>,
    hits: &Hits,
    category: Option<usize>,
    call: Option<&Call<'_>>,
    this: Option<CallRef>,
    flags_before: u32,
) -> Verdict {
    let Some(hit) = hits.detections.get(dec.hit) else {
        return Verdict::allow();
    };
    let name = rules.plugins.name(hit.plugin);
    let tool_info = hits.tool.and_then(|id| rules.tool_by_id(id));
    let tool: &str = match (call, &tool_info) {
        (Some(c), _) => c.tool,
        (None, Some(t)) => &t.name,
        (None, None) => "text",
    };
    let category_name = category
        .and_then(|i| rules.config.categories.get(i))
        .map_or("", |c| c.name.as_str());
    let rule = crate::escalation::rule_name(category_name, dec.ladder, dec.step);
    let file = match (call, &tool_info) {
        (Some(c), Some(t)) => {
            crate::fingerprint::file_of(&rules.fingerprint, &t.keys, &c.arguments)
        }
        _ => String::new(),
    };
    let pattern = if hit.pattern.is_empty() {
        name
    } else {
        &hit.pattern
    };
    let vars = Vars {
        tool,
        count: hit.count,
        detector: name,
        rule: &rule,
        pattern,
        category: category_name,
        threshold: hit.count,
        window: rules.config.window_size,
        file: &file,
        flags: flags_before,
        action: dec.action.as_str(),
        workers: 1,
    };
    let message = crate::escalation::message(dec.step, dec.action, &vars, Some(&hit.message));
    let calls: Vec<CallRef> = this.into_iter().collect();
    Verdict {
        action: dec.action,
        message,
        detector: Some(Cow::Owned(name.to_owned())),
        rule: Some(rule),
        count: hit.count,
        calls,
        // A plugin says that a loop is going on, not where it started.
        loop_start: None,
        notes: Vec::new(),
    }
}

#[cfg(feature = "plugins")]
mod enabled {
    use std::cell::Cell;
    use std::fmt::Write;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

    use loopguard_plugin_host::abi::{WindowRecord, window_flags};
    use loopguard_plugin_host::{EventView, HostError, Outcome, Plugin, PluginHost};
    use loopguard_rules::config::PluginSpec;
    use loopguard_rules::{Diagnostic, Policy};
    use serde_json::Value;

    use super::{Hit, Hits, Plugins};
    use crate::detect::{Record, Window, flag};
    use crate::fingerprint::KeySet;
    use crate::verdict::Note;

    /// Nesting beyond this depth is written as `null` (serde_json parses at most 128 levels).
    const MAX_DEPTH: usize = 128;

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
                p.tag = fnv(p.name.as_bytes()) ^ (i as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
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
                                message: format!(
                                    "plugin `{}` panicked and is disabled: it is skipped from now on ({})",
                                    p.name,
                                    p.plugin.path().display()
                                ),
                            });
                        }
                    }
                    Outcome::Error(code) => {
                        p.errors.fetch_add(1, Ordering::Relaxed);
                        if !p.noted_error.swap(true, Ordering::Relaxed) {
                            hits.notes.push(Note {
                                code: "plugin_error",
                                plugin: p.name.clone(),
                                message: format!(
                                    "plugin `{}` failed with status {code}; its answer was ignored (later failures are only counted)",
                                    p.name
                                ),
                            });
                        }
                    }
                }
            }
            hits
        }
    }

    fn fnv(bytes: &[u8]) -> u64 {
        bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        })
    }

    /// Buffers reused across events, so showing plugins an event allocates nothing in steady
    /// state.
    #[derive(Debug, Default)]
    pub(super) struct Scratch {
        pub(super) args: String,
        pub(super) window: Vec<WindowRecord>,
    }

    thread_local! {
        static SCRATCH: Cell<Scratch> = const {
            Cell::new(Scratch {
                args: String::new(),
                window: Vec::new(),
            })
        };
    }

    /// Runs `f` with this thread's scratch buffers (fresh ones if they are in use or gone).
    pub(super) fn with_scratch<T>(f: impl FnOnce(&mut Scratch) -> T) -> T {
        let mut s = SCRATCH.try_with(Cell::take).unwrap_or_default();
        let out = f(&mut s);
        let _ = SCRATCH.try_with(|c| c.set(s));
        out
    }

    /// Arguments as compact JSON: keys sorted (serde_json's maps are ordered), volatile keys
    /// dropped at every level.
    pub(super) fn canonical<'b>(buf: &'b mut String, v: &Value, volatile: &KeySet) -> &'b str {
        buf.clear();
        write_json(buf, v, volatile, 0);
        buf
    }

    /// The live window as fingerprints, oldest first, without the newest `skip` records.
    pub(super) fn window<'b>(
        buf: &'b mut Vec<WindowRecord>,
        w: &Window<'_>,
        skip: usize,
    ) -> &'b [WindowRecord] {
        // Oldest first, the filled records are `older` then `newer`; the live ones are the last
        // `w.len()` of them.
        let (newer, older) = w.parts();
        let total = older.len() + newer.len();
        let from = total.saturating_sub(w.len());
        let to = total.saturating_sub(skip).max(from);
        let o = older
            .get(from.min(older.len())..to.min(older.len()))
            .unwrap_or_default();
        let n = newer
            .get(from.saturating_sub(older.len())..to.saturating_sub(older.len()))
            .unwrap_or_default();
        buf.clear();
        buf.extend(o.iter().map(record));
        buf.extend(n.iter().map(record));
        buf
    }

    fn record(r: &Record) -> WindowRecord {
        let mut flags = 0;
        if r.has(flag::RESULT) && !r.has(flag::BLOCKED) {
            flags |= window_flags::HAS_RESULT;
            if r.has(flag::ERROR) {
                flags |= window_flags::IS_ERROR;
            }
        }
        WindowRecord {
            exact: u64::from(r.exact),
            fuzzy: u64::from(r.fuzzy),
            result_digest: u64::from(r.digest),
            flags,
            reserved: 0,
        }
    }

    fn write_json(out: &mut String, v: &Value, volatile: &KeySet, depth: usize) {
        match v {
            _ if depth >= MAX_DEPTH => out.push_str("null"),
            Value::Null => out.push_str("null"),
            Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            // serde_json prints numbers as it serializes them (itoa, ryu).
            Value::Number(n) => {
                let _ = write!(out, "{n}");
            }
            Value::String(text) => write_str(out, text),
            Value::Array(items) => {
                out.push('[');
                for (i, x) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    write_json(out, x, volatile, depth + 1);
                }
                out.push(']');
            }
            Value::Object(map) => {
                out.push('{');
                let mut first = true;
                for (k, x) in map {
                    if volatile.contains(k) {
                        continue;
                    }
                    if !first {
                        out.push(',');
                    }
                    first = false;
                    write_str(out, k);
                    out.push(':');
                    write_json(out, x, volatile, depth + 1);
                }
                out.push('}');
            }
        }
    }

    /// Whether a string may need escaping in JSON (a control character, `"` or `\\`), eight
    /// bytes at a time; a false alarm only costs the slow path.
    fn may_need_escape(s: &[u8]) -> bool {
        const LO: u64 = 0x0101_0101_0101_0101;
        const HI: u64 = 0x8080_8080_8080_8080;
        let has_zero = |x: u64| x.wrapping_sub(LO) & !x & HI != 0;
        let mut chunks = s.chunks_exact(8);
        for c in &mut chunks {
            let Ok(bytes) = <[u8; 8]>::try_from(c) else {
                return true;
            };
            let x = u64::from_le_bytes(bytes);
            // Bytes below 0x20 (ASCII only; UTF-8 continuation bytes have the high bit set).
            let control = x.wrapping_sub(0x20 * LO) & !x & HI != 0;
            if control
                || has_zero(x ^ (u64::from(b'"') * LO))
                || has_zero(x ^ (u64::from(b'\\') * LO))
            {
                return true;
            }
        }
        chunks
            .remainder()
            .iter()
            .any(|&b| b < 0x20 || b == b'"' || b == b'\\')
    }

    /// A JSON string, escaped as serde_json escapes it.
    fn write_str(out: &mut String, s: &str) {
        out.reserve(s.len() + 2);
        out.push('"');
        if !may_need_escape(s.as_bytes()) {
            out.push_str(s);
        } else {
            let mut from = 0;
            for (i, b) in s.bytes().enumerate() {
                let escaped = match b {
                    b'"' => "\\\"",
                    b'\\' => "\\\\",
                    b'\n' => "\\n",
                    b'\r' => "\\r",
                    b'\t' => "\\t",
                    0x08 => "\\b",
                    0x0c => "\\f",
                    0..0x20 => "",
                    _ => continue,
                };
                out.push_str(s.get(from..i).unwrap_or_default());
                if escaped.is_empty() {
                    let _ = write!(out, "\\u{b:04x}");
                } else {
                    out.push_str(escaped);
                }
                from = i + 1;
            }
            out.push_str(s.get(from..).unwrap_or_default());
        }
        out.push('"');
    }

    #[cfg(test)]
    mod tests {
        use super::*;
        use serde_json::json;

        #[test]
        fn arguments_are_written_sorted_without_volatile_keys() {
            let volatile = KeySet::new(["request_id"]);
            let mut buf = String::new();
            let v = json!({"b": [1, {"request_id": "x", "z": "é\""}], "a": null, "request_id": 7});
            assert_eq!(
                canonical(&mut buf, &v, &volatile),
                r#"{"a":null,"b":[1,{"z":"é\""}]}"#
            );
            assert_eq!(canonical(&mut buf, &json!("text"), &volatile), r#""text""#);
            // Every escape, at every position of an 8-byte chunk and in the tail.
            for special in [
                "\"", "\\", "\n", "\r", "\t", "\u{8}", "\u{c}", "\u{1}", "\u{1f}", "\u{7f}", "€",
            ] {
                for at in 0..20 {
                    let text = format!("{}{special}{}é", "a".repeat(at), "b".repeat(19 - at));
                    let v = Value::String(text);
                    assert_eq!(canonical(&mut buf, &v, &volatile), v.to_string(), "{v}");
                }
            }
            let numbers = json!({"f": 0.1, "g": -2.5e-8, "h": 1e300, "i": -7, "u": u64::MAX, "z": [true, false, null]});
            assert_eq!(
                canonical(&mut buf, &numbers, &volatile),
                numbers.to_string()
            );
            let plain = Value::String("αβγ δ ~ \u{7f} ok".to_owned());
            assert_eq!(canonical(&mut buf, &plain, &volatile), plain.to_string());
        }

        #[test]
        fn the_window_is_shown_oldest_first_live_records_only() {
            let rec = |exact: u32| Record {
                exact,
                flags: if exact == 5 {
                    flag::RESULT | flag::ERROR
                } else {
                    0
                },
                ..Record::default()
            };
            // A ring of 4 that wrapped: seqs 3, 4 at the front, then 5, 6 (6 newest).
            let ring = [rec(5), rec(6), rec(3), rec(4)];
            let exacts = |live: usize, skip: usize| -> Vec<u64> {
                let w = Window {
                    buf: &ring,
                    start: 2,
                    filled: 4,
                    live,
                    newest_seq: 6,
                };
                // The reference: newest first from `iter`, reversed.
                let mut expected: Vec<u64> =
                    w.iter().skip(skip).map(|r| u64::from(r.exact)).collect();
                expected.reverse();
                let got: Vec<u64> = window(&mut Vec::new(), &w, skip)
                    .iter()
                    .map(|r| r.exact)
                    .collect();
                assert_eq!(got, expected, "live {live}, skip {skip}");
                got
            };
            assert_eq!(exacts(4, 0), [3, 4, 5, 6]);
            assert_eq!(exacts(4, 1), [3, 4, 5]);
            assert_eq!(exacts(3, 1), [4, 5]);
            assert_eq!(exacts(1, 1), Vec::<u64>::new());
            assert_eq!(exacts(0, 0), Vec::<u64>::new());
            assert_eq!(exacts(2, 0), [5, 6]);
            let w = Window {
                buf: &ring,
                start: 2,
                filled: 4,
                live: 4,
                newest_seq: 6,
            };
            let shown = window(&mut Vec::new(), &w, 0).to_vec();
            assert_eq!(
                shown[2].flags,
                window_flags::HAS_RESULT | window_flags::IS_ERROR
            );
            assert_eq!(shown[0].flags, 0);
        }

        #[test]
        fn a_missing_library_is_an_error_pointing_at_its_path() {
            let text = "version: 1\nplugins:\n  - path: no/such/libplugin.so\n    name: x\n  - path: off.so\n    enabled: false\n";
            let loaded = Policy::load_text("dir/policy.yaml".as_ref(), text.to_owned());
            let policy = loaded.policy.unwrap();
            let errors = load_plugins(&policy).unwrap_err();
            assert_eq!(errors.len(), 1, "a disabled plugin is not loaded");
            let e = &errors[0];
            assert_eq!(e.index(), 0);
            assert!(matches!(e.host_error(), HostError::NotFound { .. }));
            assert!(e.to_string().contains("no/such/libplugin.so"), "{e}");
            let d = e.diagnostic();
            assert_eq!(d.code, "plugin-not-found");
            let span = d.span.unwrap();
            assert_eq!((span.line, span.column), (3, 11));
            assert_eq!(
                d.label.as_deref(),
                Some("looked for `dir/no/such/libplugin.so`")
            );
            let rendered = loaded.sources.render(&d);
            assert!(rendered.contains("dir/policy.yaml:3:11"), "{rendered}");
        }

        #[test]
        fn a_file_that_is_not_a_library_is_refused() {
            let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml");
            let text = format!("version: 1\nplugins:\n  - path: {manifest}\n");
            let loaded = Policy::load_text("p.yaml".as_ref(), text);
            let errors = load_plugins(&loaded.policy.unwrap()).unwrap_err();
            let d = errors[0].diagnostic();
            assert_eq!(d.code, "plugin-not-loadable");
            assert!(d.message.contains("Cargo.toml"), "{}", d.message);
        }

        #[test]
        fn an_engine_with_no_plugins_is_an_engine() {
            let loaded = Policy::builtin_default();
            let policy = loaded.policy.unwrap();
            assert!(load_plugins(&policy).unwrap().is_empty());
            let engine = crate::Engine::builder(&policy).build().unwrap();
            assert!(engine.plugins().is_empty());
        }
    }
}
