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
//! the engine links no `unsafe` code at all. With it, `plugins/enabled.rs` loads and runs the
//! plugins and `plugins/view.rs` writes what they are shown of an event.
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

use crate::compiled::ToolInfo;
use crate::detect::{Record, Window};
use crate::escalation::{Found, PluginFound};
use crate::event::{Call, Text, ToolResult, UserMessage};
use crate::fingerprint::CallKeys;
use crate::verdict::Note;

#[cfg(feature = "plugins")]
pub use enabled::{LoadedPlugin, PluginLoadError, load_plugins};
/// The plugin host (re-exported so that hosts and `loopctl` need one dependency).
#[cfg(feature = "plugins")]
pub use loopguard_plugin_host as host;

/// The plugins of an engine, shared by its sessions (they live in
/// [`CompiledRules`](crate::CompiledRules)).
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
            return view::with_scratch(|s| {
                // Arguments are written out only when some plugin reads them.
                let args = match c.arguments {
                    crate::Arguments::Raw(text) => text,
                    crate::Arguments::Json(_) if !self.reads_arguments() => "",
                    crate::Arguments::Json(v) => {
                        view::canonical(&mut s.args, v, &tool.keys.volatile)
                    }
                };
                let window = view::window(&mut s.window, w, 1);
                let view = host::EventView::new(host::EventKind::Call, c.session, c.time_ms)
                    .call_id(c.call_id)
                    .tool(c.tool)
                    .shell(tool.keys.shell)
                    // The window's newest record is this call.
                    .batched(w.get(0).is_some_and(|r| r.has(crate::detect::flag::BATCH)))
                    .changes(w.get(0).is_some_and(|r| r.has(crate::detect::flag::MODIFY)))
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
            return view::with_scratch(|s| {
                let window = view::window(&mut s.window, w, 0);
                let view = host::EventView::new(host::EventKind::Result, r.session, r.time_ms)
                    .call_id(r.call_id)
                    .tool(tool.map_or("", |t| &*t.name))
                    .result(r.output, r.is_error, r.exit_code)
                    .shell(rec.has(crate::detect::flag::SHELL))
                    .batched(rec.has(crate::detect::flag::BATCH))
                    .changes(rec.has(crate::detect::flag::MODIFY))
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
            return view::with_scratch(|s| {
                let window = view::window(&mut s.window, w, 0);
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
    /// The plugins' detections, as escalation takes them (in policy order).
    pub(crate) fn found<'a>(&'a self, plugins: &'a Plugins) -> impl Iterator<Item = Found<'a>> {
        self.detections.iter().filter_map(move |h| {
            let (ladder, tag) = plugins.ladder_and_tag(h.plugin)?;
            Some(Found::Plugin(PluginFound {
                name: plugins.name(h.plugin),
                ladder,
                loop_key: loop_key(h.key, tag),
                count: h.count,
                tool: self.tool,
                message: &h.message,
                pattern: &h.pattern,
            }))
        })
    }
}

/// Mixes a plugin's loop key with the plugin's tag, so plugins never share a loop counter with
/// each other or with a built-in detector.
fn loop_key(key: u64, tag: u64) -> u64 {
    crate::hash::fmix(key ^ tag.rotate_left(29))
}

#[cfg(feature = "plugins")]
mod enabled;
#[cfg(all(test, feature = "plugins"))]
mod tests;
#[cfg(feature = "plugins")]
mod view;
