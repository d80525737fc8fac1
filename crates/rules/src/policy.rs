//! Loading a policy: read, parse, follow `extends`, check, merge defaults, build.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use crate::check::NameGlob;
use serde_saphyr::Spanned;

use crate::check::{Budget, check_section, compile_glob};
use crate::config::{Config, PluginSpec};
use crate::diagnostic::{Diagnostic, SourceMap};
use crate::node::{Node, SourceId, Span, Value};
use crate::param::section_defaults;
use crate::schema::POLICY;
use crate::semantic;

/// Largest policy file accepted.
pub(crate) const MAX_FILE_BYTES: usize = 1 << 20;
/// Deepest nesting accepted in a policy file.
pub(crate) const MAX_DEPTH: usize = 32;
/// Longest `extends` chain accepted.
pub(crate) const MAX_EXTENDS: usize = 16;

/// A policy could not be loaded at all (as opposed to loaded and found invalid).
#[derive(Debug, thiserror::Error, miette::Diagnostic)]
#[non_exhaustive]
pub enum LoadError {
    #[error("cannot read `{path}`: {source}")]
    #[diagnostic(code(loopguard::unreadable))]
    /// The file could not be read (missing, unreadable, too large, not a regular file).
    Read {
        /// The file as given.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// A compiled policy: the effective configuration for every (backend, model).
#[derive(Clone, Debug)]
pub struct Policy {
    /// The policy's `name`, or the file stem when it has none.
    pub name: String,
    /// The policy's `description`; empty when it has none.
    pub description: String,
    /// The file it was loaded from, if any.
    pub path: Option<PathBuf>,
    root: Node,
    base: Config,
    overrides: Vec<Override>,
    /// The detector plugins the policy names, in order (loaded by the host, not here).
    pub plugins: Vec<PluginSpec>,
}

#[derive(Clone, Debug)]
struct Override {
    backend: Option<NameGlob>,
    model: Option<NameGlob>,
    node: Node,
}

/// The outcome of loading: the policy when it has no errors, every diagnostic, and the sources
/// needed to render them.
#[derive(Debug)]
pub struct Loaded {
    /// The policy; `None` when any diagnostic is an error.
    pub policy: Option<Policy>,
    /// Every error and warning, in the order found.
    pub diagnostics: Vec<Diagnostic>,
    /// The files read, to render `diagnostics` with [`SourceMap::render`].
    pub sources: SourceMap,
}

impl Loaded {
    /// Whether any diagnostic is an error (then `policy` is `None`).
    pub fn has_errors(&self) -> bool {
        self.diagnostics.iter().any(Diagnostic::is_error)
    }

    /// Every error, rendered against the sources as `loopctl validate` prints it
    /// (`file:line:col`, the snippet underlined, the help).
    pub fn rendered_errors(&self) -> Vec<String> {
        self.diagnostics
            .iter()
            .filter(|d| d.is_error())
            .map(|d| self.sources.render(d))
            .collect()
    }
}

impl Policy {
    /// Loads a policy file and every file it extends.
    pub fn load(path: &Path) -> Result<Loaded, LoadError> {
        let text = read_limited(path)?;
        Ok(Self::load_text(path, text))
    }

    /// Loads a policy from text; `path` names it and anchors relative `extends` and plugin paths.
    pub fn load_text(path: &Path, text: String) -> Loaded {
        let mut sources = SourceMap::default();
        let mut diagnostics = Vec::new();
        let mut chain = Vec::new();
        let mut budget = Budget::default();
        let merged = load_chain(
            path,
            text,
            &mut sources,
            &mut diagnostics,
            &mut chain,
            &mut budget,
        );
        let policy = merged.and_then(|tree| {
            let mut root = defaults().clone();
            root.merge(&tree);
            // Semantic checks read the tree defensively, so they run even when some values
            // have the wrong type: every problem is reported at once.
            semantic::check(&root, &mut diagnostics);
            if diagnostics.iter().any(Diagnostic::is_error) {
                return None;
            }
            Policy::build(path, root, &sources, &mut diagnostics)
        });
        dedup(&mut diagnostics);
        Loaded {
            policy,
            diagnostics,
            sources,
        }
    }

    /// The shipped default policy, embedded in the binary.
    pub fn builtin_default() -> Loaded {
        Self::load_text(Path::new("rules/default.yaml"), DEFAULT_POLICY.to_owned())
    }

    /// The policy of a checked tree; `None` (with an error) when the tree holds a value the
    /// checks should have refused, rather than a policy with made-up values.
    fn build(
        path: &Path,
        root: Node,
        sources: &SourceMap,
        diagnostics: &mut Vec<Diagnostic>,
    ) -> Option<Policy> {
        let Some(mut params) = (POLICY.read)(&root) else {
            diagnostics.push(unreadable(&root));
            return None;
        };
        let file_stem = path.file_stem().map(|s| s.to_string_lossy().into_owned());
        let name = params.name.take().or(file_stem).unwrap_or_default();
        let description = std::mem::take(&mut params.description);
        let plugins = std::mem::take(&mut params.plugins)
            .into_iter()
            .map(|p| {
                // `plugins:` lists are replaced, not merged, by `extends`: the file that wrote
                // the entry may be a parent file.
                let file = sources
                    .get(p.value.path.span.source)
                    .map_or(path, |s| s.path.as_path());
                PluginSpec::from_params(p, file)
            })
            .collect();
        let Some(base) = Config::from_params(params) else {
            diagnostics.push(unreadable(&root));
            return None;
        };
        let overrides = root
            .get("overrides")
            .and_then(Node::as_seq)
            .unwrap_or_default()
            .iter()
            .map(|o| {
                let m = o.get("match");
                let glob = |key: &str| {
                    m.and_then(|m| m.get(key))
                        .and_then(Node::as_str)
                        .and_then(|p| compile_glob(p).ok())
                };
                let mut node = o.clone();
                if let Value::Map(entries) = &mut node.value {
                    entries.retain(|(k, _)| k.as_str() != Some("match"));
                }
                Override {
                    backend: glob("backend"),
                    model: glob("model"),
                    node,
                }
            })
            .collect();
        Some(Policy {
            name,
            description,
            path: Some(path.to_path_buf()),
            root,
            base,
            overrides,
            plugins,
        })
    }

    /// The configuration with no override applied.
    pub fn base(&self) -> &Config {
        &self.base
    }

    /// The effective configuration for a backend and model with server-level settings (the
    /// `LOOPGUARD_*` tier) applied beneath the policy's overrides: a knob that a matching
    /// override sets keeps the override's value. An override counts as setting `max_repeats`
    /// when it sets any `exact_repeat.threshold`, `ttl_seconds` when it sets `time.ttl_seconds`,
    /// and `mode` when it sets `escalation.ladder`.
    pub fn resolve_with(
        &self,
        backend: Option<&str>,
        model: Option<&str>,
        server: &crate::tiers::Settings,
    ) -> Config {
        self.resolve_matching(&self.matching_overrides(backend, model), server)
    }

    /// The effective configuration when the overrides at `overrides` (positions from
    /// [`Policy::matching_overrides`]) apply, with server-level settings beneath them (see
    /// [`Policy::resolve_with`]).
    pub fn resolve_matching(&self, overrides: &[usize], server: &crate::tiers::Settings) -> Config {
        let matching: Vec<&Override> = overrides
            .iter()
            .filter_map(|&i| self.overrides.get(i))
            .collect();
        let mut config = if matching.is_empty() {
            self.base.clone()
        } else {
            let mut root = self.root.clone();
            for o in &matching {
                root.merge(&o.node);
            }
            // The overrides were checked merged over the policy, as here: reading cannot fail.
            Config::from_node(&root).unwrap_or_else(|| self.base.clone())
        };
        if server.is_empty() {
            return config;
        }
        let mut server = server.clone();
        for o in matching {
            if sets_exact_threshold(&o.node) {
                server.max_repeats = None;
            }
            if o.node
                .get("time")
                .and_then(|t| t.get("ttl_seconds"))
                .is_some()
            {
                server.ttl_seconds = None;
            }
            if o.node
                .get("escalation")
                .and_then(|e| e.get("ladder"))
                .is_some()
            {
                server.mode = None;
            }
        }
        server.apply(&mut config);
        config
    }

    /// Which of the policy's overrides apply to (backend, model), as a list of their positions.
    /// Two targets with the same list resolve to the same configuration, so a host can compile
    /// the rules once per list rather than once per model name.
    pub fn matching_overrides(&self, backend: Option<&str>, model: Option<&str>) -> Vec<usize> {
        let fits = |m: &Option<NameGlob>, v: Option<&str>| match (m, v) {
            (None, _) => true,
            (Some(m), Some(v)) => m.is_match(v),
            (Some(_), None) => false,
        };
        self.overrides
            .iter()
            .enumerate()
            .filter(|(_, o)| fits(&o.backend, backend) && fits(&o.model, model))
            .map(|(i, _)| i)
            .collect()
    }

    /// The effective configuration for a backend and model: every matching override is applied
    /// over the policy, in order. Call once per session, not per event.
    pub fn resolve(&self, backend: Option<&str>, model: Option<&str>) -> Config {
        self.resolve_matching(
            &self.matching_overrides(backend, model),
            &crate::tiers::Settings::default(),
        )
    }

    /// The merged policy tree (defaults, extended files, this file) as JSON.
    pub fn to_json(&self) -> serde_json::Value {
        self.root.to_json()
    }
}

/// The text of `rules/default.yaml`, embedded so the engine and `loopctl` work from anywhere.
pub(crate) const DEFAULT_POLICY: &str = include_str!("../../../rules/default.yaml");

/// The shipped policies (`rules/*.yaml`), embedded: `extends: builtin:NAME` names one from any
/// directory. Inside them, relative `extends` (`default.yaml`) stay among the built-ins.
pub(crate) const BUILTIN_POLICIES: &[(&str, &str)] = &[
    ("default", DEFAULT_POLICY),
    ("strict", include_str!("../../../rules/strict.yaml")),
    ("lenient", include_str!("../../../rules/lenient.yaml")),
    ("nudge", include_str!("../../../rules/nudge.yaml")),
    ("proxy", include_str!("../../../rules/proxy.yaml")),
    ("categories", include_str!("../../../rules/categories.yaml")),
];

/// The prefix of the built-in policies' paths (`builtin:/default.yaml`).
const BUILTIN_DIR: &str = "builtin:/";

/// Where `extends: rel` leads from a file at `path`: `builtin:NAME` is a built-in policy;
/// anything else is relative to the extending file's directory.
fn extended_path(path: &Path, rel: &str) -> PathBuf {
    match rel.strip_prefix("builtin:") {
        Some(name) => PathBuf::from(format!(
            "{BUILTIN_DIR}{}.yaml",
            name.trim_start_matches('/')
        )),
        None => path.parent().unwrap_or(Path::new(".")).join(rel),
    }
}

fn read_limited(path: &Path) -> Result<String, LoadError> {
    if let Some(file) = path.to_str().and_then(|p| p.strip_prefix(BUILTIN_DIR)) {
        let name = file.strip_suffix(".yaml").unwrap_or(file);
        return BUILTIN_POLICIES
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, text)| (*text).to_owned())
            .ok_or_else(|| LoadError::Read {
                path: path.into(),
                source: std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    format!(
                        "no built-in policy `{name}` (built-ins: {})",
                        BUILTIN_POLICIES
                            .iter()
                            .map(|(n, _)| format!("builtin:{n}"))
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                ),
            });
    }
    crate::read::read_text(path, MAX_FILE_BYTES, "policy files").map_err(|source| LoadError::Read {
        path: path.into(),
        source,
    })
}

/// Parses YAML text into a node tree, with limits against hostile input.
pub(crate) fn parse_yaml(text: &str, source: SourceId) -> Result<Node, Box<Diagnostic>> {
    let start = Span {
        source,
        offset: 0,
        len: 0,
        line: 1,
        column: 1,
    };
    if text.len() > MAX_FILE_BYTES {
        return Err(Box::new(
            Diagnostic::error("too-large", start, "policy file is too large").with_help(format!(
                "policy files are limited to {MAX_FILE_BYTES} bytes"
            )),
        ));
    }
    let options = serde_saphyr::options! {
        budget: serde_saphyr::budget! {
            max_depth: MAX_DEPTH,
            max_nodes: 200_000,
            max_aliases: 1_000,
            max_anchors: 1_000,
            max_documents: 1,
            max_total_scalar_bytes: MAX_FILE_BYTES * 2,
        },
        alias_limits: serde_saphyr::alias_limits! {
            max_total_replayed_events: 100_000,
            max_replay_stack_depth: 16,
            max_alias_expansions_per_anchor: 1_000,
        },
        with_snippet: false,
        strict_booleans: true,
    };
    match serde_saphyr::from_str_with_options::<Spanned<Value>>(text, options) {
        Ok(doc) => {
            let mut node = Node::from(doc);
            node.set_source(source);
            if matches!(node.value, Value::Null) && text.trim().is_empty() {
                return Err(Box::new(
                    Diagnostic::error("empty", start, "policy file is empty")
                        .with_help("start with `version: 1`"),
                ));
            }
            Ok(node)
        }
        Err(e) => Err(Box::new(yaml_error(text, source, &e))),
    }
}

fn yaml_error(text: &str, source: SourceId, e: &serde_saphyr::Error) -> Diagnostic {
    let mut span = Span {
        source,
        offset: 0,
        len: 0,
        line: 1,
        column: 1,
    };
    if let Some(loc) = e.location() {
        span.line = u32::try_from(loc.line()).unwrap_or(1).max(1);
        span.column = u32::try_from(loc.column()).unwrap_or(1).max(1);
        span.offset = loc
            .span()
            .byte_offset()
            .and_then(|o| usize::try_from(o).ok())
            .unwrap_or_else(|| offset_of(text, span.line, span.column));
    }
    let raw = e.to_string();
    let first = raw.lines().next().unwrap_or("invalid YAML").trim();
    // The parser's own position suffix repeats what the span already says.
    let first = first
        .find(" at line ")
        .map_or(first, |i| &first[..i])
        .trim_end_matches('.');
    let lower = first.to_lowercase();
    let (code, message, help) = if let Some(rest) = lower.strip_prefix("duplicate mapping key: ") {
        let key = first.get(first.len() - rest.len()..).unwrap_or(rest);
        let key = key.split(',').next().unwrap_or(key).trim();
        (
            "duplicate-key",
            format!("duplicate key `{key}`"),
            "each key may appear once in a mapping; remove or merge the repeated one",
        )
    } else if lower.contains("alias") {
        (
            "too-complex",
            "too many alias expansions".to_owned(),
            "aliases may expand to a bounded number of nodes; write the values out instead",
        )
    } else if lower.contains("depth") {
        (
            "too-complex",
            format!("nesting deeper than {MAX_DEPTH} levels"),
            "policies need only a few levels of nesting; flatten this value",
        )
    } else if lower.contains("budget") || lower.contains("limit") {
        (
            "too-complex",
            "document too large or complex".to_owned(),
            "policy files are limited in node count, aliases and size",
        )
    } else if !crate::diagnostic::declares_policy(text) {
        // The parser's message may quote the text (a character, a name); a file that does not
        // declare itself a policy is never quoted.
        (
            "yaml-syntax",
            "invalid YAML".to_owned(),
            "check that this file is the policy meant",
        )
    } else {
        (
            "yaml-syntax",
            format!("invalid YAML: {}", lowercase_first(first)),
            "check indentation, quoting and that `:` separates keys from values",
        )
    };
    Diagnostic::error(code, span, message)
        .with_label("here")
        .with_help(help)
}

fn lowercase_first(s: &str) -> String {
    let mut chars = s.chars();
    match chars.next() {
        Some(c) => c.to_lowercase().collect::<String>() + chars.as_str(),
        None => String::new(),
    }
}

fn offset_of(text: &str, line: u32, column: u32) -> usize {
    let mut offset = 0usize;
    for (i, l) in text.split_inclusive('\n').enumerate() {
        if i + 1 == line as usize {
            let col = l
                .char_indices()
                .nth(column.saturating_sub(1) as usize)
                .map_or(l.len(), |(b, _)| b);
            return offset + col;
        }
        offset += l.len();
    }
    text.len()
}

/// Loads one file and, first, the files it extends; returns the merged tree of the chain.
fn load_chain(
    path: &Path,
    text: String,
    sources: &mut SourceMap,
    diagnostics: &mut Vec<Diagnostic>,
    chain: &mut Vec<PathBuf>,
    budget: &mut Budget,
) -> Option<Node> {
    let id = sources.add(path, text);
    let text = sources.get(id).map(|s| s.text.clone()).unwrap_or_default();
    let node = match parse_yaml(&text, id) {
        Ok(node) => node,
        Err(diag) => {
            diagnostics.push(*diag);
            return None;
        }
    };
    check_section(&node, POLICY.fields, "", diagnostics, budget);
    semantic::check_version(&node, diagnostics);
    chain.push(canonical(path));

    let Some((key, target)) = node.entry("extends") else {
        return Some(node);
    };
    let Some(rel) = target.as_str() else {
        return Some(node); // wrong type, already reported
    };
    let parent_path = extended_path(path, rel);
    let parent_canonical = canonical(&parent_path);
    if chain.contains(&parent_canonical) {
        diagnostics.push(
            Diagnostic::error(
                "cyclic-extends",
                target.span,
                format!("`extends: {rel}` makes a cycle"),
            )
            .with_label("extends a file that extends this one")
            .with_help(format!(
                "the chain is {}; remove one `extends`",
                chain
                    .iter()
                    .chain(std::iter::once(&parent_canonical))
                    .map(|p| format!("`{}`", p.file_name().unwrap_or_default().to_string_lossy()))
                    .collect::<Vec<_>>()
                    .join(" → ")
            )),
        );
        return Some(node);
    }
    if chain.len() >= MAX_EXTENDS {
        diagnostics.push(
            Diagnostic::error(
                "extends-too-deep",
                target.span,
                "`extends` chain is too long",
            )
            .with_help(format!(
                "at most {MAX_EXTENDS} files may extend one another"
            )),
        );
        return Some(node);
    }
    let parent_text = match read_limited(&parent_path) {
        Ok(t) => t,
        Err(LoadError::Read { source, .. }) => {
            let _ = key;
            diagnostics.push(
                Diagnostic::error(
                    "missing-extends",
                    target.span,
                    format!("cannot read extended policy `{rel}`: {source}"),
                )
                .with_label(format!("looked for `{}`", parent_path.display()))
                .with_help(
                    "paths in `extends` are relative to the file that names them; \
                     `builtin:default` names the shipped default from anywhere",
                ),
            );
            return Some(node);
        }
    };
    let parent = load_chain(
        &parent_path,
        parent_text,
        sources,
        diagnostics,
        chain,
        budget,
    );
    chain.pop();
    match parent {
        Some(mut merged) => {
            merged.merge(&node);
            Some(merged)
        }
        None => Some(node),
    }
}

fn canonical(path: &Path) -> PathBuf {
    std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf())
}

/// Every declared default, as a node tree.
pub(crate) fn defaults() -> &'static Node {
    static DEFAULTS: OnceLock<Node> = OnceLock::new();
    DEFAULTS.get_or_init(|| section_defaults(POLICY.fields))
}

/// Parses one declared default (a YAML snippet).
pub(crate) fn parse_default(yaml: &str) -> Node {
    parse_yaml(yaml, SourceId(u32::MAX)).unwrap_or(Node {
        value: Value::Null,
        span: Span::default(),
    })
}

/// The error for a checked tree that cannot be read (a value the checks should have refused).
fn unreadable(root: &Node) -> Diagnostic {
    Diagnostic::error(
        "internal",
        root.span,
        "the policy passed its checks but could not be read",
    )
    .with_help("this is a bug in loopguard's checks: please report it with the policy")
}

fn dedup(diagnostics: &mut Vec<Diagnostic>) {
    let mut seen: Vec<Diagnostic> = Vec::new();
    diagnostics.retain(|d| {
        if seen.contains(d) {
            false
        } else {
            seen.push(d.clone());
            true
        }
    });
}

/// Whether an override sets an `exact_repeat.threshold` anywhere (top level or a category).
fn sets_exact_threshold(node: &Node) -> bool {
    let direct = |n: &Node| {
        n.get("detectors")
            .and_then(|d| d.get(crate::schema::Detector::ExactRepeat.name()))
            .and_then(|e| e.get("threshold"))
            .is_some()
    };
    if direct(node) {
        return true;
    }
    match node.get("categories").map(|c| &c.value) {
        Some(Value::Map(entries)) => entries.iter().any(|(_, c)| direct(c)),
        _ => false,
    }
}
