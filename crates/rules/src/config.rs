//! The typed, effective configuration: what the engine compiles into its rule set.
//!
//! A [`Config`] is built from a node tree that has already passed the checks and has the
//! declared defaults merged under it. The sections that map one to one onto the policy format
//! (the detectors' parameters, `time`, `user`, `shell`, `results`, `group`, ladder steps, …)
//! are generated, fields and readers, from their declarations in [`crate::schema`] and
//! re-exported here; this module assembles the rest from those typed sections.

use std::collections::BTreeMap;

use crate::check::NameGlob;

use crate::node::{Node, Value};
use crate::param::{Param, Spanned};
use crate::schema::{CategoryParams, DETECTORS, FingerprintParams, PluginParams, PolicyParams};

pub use crate::schema::{
    Chanting, Cycle, Detector, Detectors, ExactRepeat, FuzzyRepeat, Group, Interleaved,
    MaskPattern, Results, SameOutcome, Shell, Step, TestFix, TextRepeat, Time, ToolKeys,
    ToolSetting, UnknownTool, User,
};

/// What the host should do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum Action {
    /// Let the call run.
    #[default]
    Allow,
    /// Let the call run and warn the model.
    Warn,
    /// Ask the user whether the call may run.
    Ask,
    /// Refuse the call; the session goes on.
    Block,
    /// Stop the run.
    Terminate,
}

impl Action {
    /// The policy word for the action (`allow`, `warn`, `ask`, `block`, `terminate`).
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Allow => "allow",
            Action::Warn => "warn",
            Action::Ask => "ask",
            Action::Block => "block",
            Action::Terminate => "terminate",
        }
    }

    /// The action a policy word names (exact, lowercase); `None` for any other word.
    pub fn parse(word: &str) -> Option<Action> {
        Some(match word {
            "allow" => Action::Allow,
            "warn" => Action::Warn,
            "ask" => Action::Ask,
            "block" => Action::Block,
            "terminate" => Action::Terminate,
            _ => return None,
        })
    }
}

/// Steps in ascending order; the last one whose conditions hold is taken.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Ladder {
    /// The steps, in ascending order.
    pub steps: Vec<Step>,
}

impl Ladder {
    /// The step for the `repeat`-th detection of a loop in a session flagged `flags` times before.
    pub fn step(&self, repeat: u32, flags: u32) -> Option<&Step> {
        self.steps
            .iter()
            .rev()
            .find(|s| s.repeat.is_none_or(|r| repeat >= r) && s.flags.is_none_or(|f| flags >= f))
    }
}

/// A detector with only a threshold.
#[derive(Clone, Debug)]
pub struct Counted {
    /// Whether the detector runs.
    pub enabled: bool,
    /// The ladder its detections go through; `None`: the category's or the policy's.
    pub ladder: Option<String>,
    /// The detector's count at which it flags (see the rule reference for what it counts).
    pub threshold: u32,
}

/// A named group of tools with its own detector parameters and ladder.
#[derive(Clone, Debug)]
pub struct Category {
    /// The key under `categories`; `default` holds every tool listed nowhere else.
    pub name: String,
    /// The tool patterns as written.
    pub tools: Vec<String>,
    /// The compiled `tools` patterns, in the same order.
    pub matchers: Vec<NameGlob>,
    /// Detector parameters for these tools: the top-level ones with the category's over them.
    pub detectors: Detectors,
    /// The ladder for these tools; `None`: the policy's.
    pub ladder: Option<String>,
    /// A successful call of these tools is progress for the calls around it.
    pub modifies: bool,
    /// These tools wait: their calls are never counted by the repeat detectors, and the call
    /// after one polls.
    pub waits: bool,
    /// `false`: calls and results of these tools are ignored.
    pub enabled: bool,
}

/// Where a tool lands and why ([`Config::place_tool`]).
#[derive(Clone, Debug)]
pub struct Placement<'a> {
    /// The category; `None`: the top-level detector parameters apply.
    pub category: Option<&'a Category>,
    /// Why the tool is there.
    pub reason: PlacementReason<'a>,
    /// The tool's own entry in the `tools` section, if any.
    pub setting: Option<&'a ToolSetting>,
}

/// Why a tool is in its category.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PlacementReason<'a> {
    /// `tools.<name>.category`.
    Named,
    /// A pattern of the category's `tools`.
    Pattern(&'a str),
    /// Listed nowhere: the category named `default`.
    Default,
    /// Listed nowhere and there is no `default` category: the top-level detector settings.
    None,
}

impl Placement<'_> {
    /// Whether loopguard watches the tool at all.
    pub fn enabled(&self) -> bool {
        self.category.is_none_or(|c| c.enabled) && self.setting.is_none_or(|t| t.enabled)
    }
}

impl Category {
    /// Whether one of the category's `tools` patterns matches the tool name.
    pub fn matches(&self, tool: &str) -> bool {
        self.matchers.iter().any(|m| m.is_match(tool))
    }
}

/// Which arguments identify a call (`fingerprint`).
#[derive(Clone, Debug)]
pub struct Fingerprint {
    /// Argument keys that identify a call (for fuzzy matching).
    pub primary_keys: Vec<String>,
    /// Argument keys ignored when hashing a call (ids, timestamps).
    pub volatile_keys: Vec<String>,
    /// Per-tool key lists, by exact tool name.
    pub tools: BTreeMap<String, ToolKeys>,
    /// Argument key order does not matter.
    pub sort_keys: bool,
    /// Runs of whitespace in string arguments count as one space; ends are trimmed.
    pub collapse_whitespace: bool,
    /// `\\` and `/` in path-like arguments are the same; `./` prefixes and doubled separators are dropped.
    pub path_separators: bool,
    /// Tool names compare without case.
    pub case_insensitive_tools: bool,
}

/// A plugin named by the policy (loaded by the plugin host, not here).
#[derive(Clone, Debug)]
pub struct PluginSpec {
    /// Resolved against the directory of the file that named it (absolute paths stay as they
    /// are).
    pub path: std::path::PathBuf,
    /// The path as the policy wrote it.
    pub written_path: String,
    /// The name used in verdicts; `None`: the plugin's own.
    pub name: Option<String>,
    /// Whether the plugin is loaded and called.
    pub enabled: bool,
    /// The ladder its detections go through; `None`: the policy's.
    pub ladder: Option<String>,
    /// The configuration passed to the plugin, checked by the host against the plugin's schema.
    pub config: serde_json::Value,
    /// Where the `plugins:` entry is, for diagnostics about loading it.
    pub span: crate::node::Span,
    /// Where its `path` value is.
    pub path_span: crate::node::Span,
    /// Where its `config` value is, if it has one.
    pub config_span: Option<crate::node::Span>,
}

/// The effective configuration for one (backend, model).
#[derive(Clone, Debug)]
pub struct Config {
    /// Whether detection runs at all (a run-time setting; policies always enable it).
    pub enabled: bool,
    /// How many recent events every detector reads.
    pub window_size: usize,
    /// Event-time expiry and resets.
    pub time: Time,
    /// How user messages change detection.
    pub user: User,
    /// The ladder used when neither category nor detector names one.
    pub ladder: String,
    /// Where a host that edits the conversation puts a warning for the model.
    pub nudge: Nudge,
    /// Every ladder by name, built-in ones included.
    pub ladders: BTreeMap<String, Ladder>,
    /// Categories in declaration order (the first matching pattern wins).
    pub categories: Vec<Category>,
    /// Single tools by exact name (the `tools` section).
    pub tools: BTreeMap<String, ToolSetting>,
    /// Detector parameters for tools in no category.
    pub detectors: Detectors,
    /// Which arguments identify a call.
    pub fingerprint: Fingerprint,
    /// Shell-command normalization.
    pub shell: Shell,
    /// What is masked before results are compared.
    pub results: Results,
    /// Group (swarm) scope.
    pub group: Group,
}

/// Where a host that edits the conversation puts a warning for the model (`escalation.nudge`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Nudge {
    /// Appended to the result of the call it is about.
    #[default]
    Context,
    /// A system message after that result.
    System,
}

impl Config {
    /// The `tools` entry of a tool (by exact name; without case when tool names compare so).
    pub(crate) fn tool_setting(&self, tool: &str) -> Option<&ToolSetting> {
        self.tools.get(tool).or_else(|| {
            self.fingerprint
                .case_insensitive_tools
                .then(|| {
                    self.tools
                        .iter()
                        .find(|(k, _)| k.eq_ignore_ascii_case(tool))
                        .map(|(_, v)| v)
                })
                .flatten()
        })
    }

    /// Where a tool lands: its `tools` entry's category, else the first declared category with
    /// a matching pattern, else the category named `default`; and why.
    pub fn place_tool(&self, tool: &str) -> Placement<'_> {
        let setting = self.tool_setting(tool);
        if let Some(name) = setting.and_then(|t| t.category.as_deref())
            && let Some(c) = self.categories.iter().find(|c| c.name == name)
        {
            return Placement {
                category: Some(c),
                reason: PlacementReason::Named,
                setting,
            };
        }
        // The first declared category (but `default`) with a pattern `hit` accepts, and where.
        let placed = |hit: &dyn Fn(&crate::check::NameGlob) -> bool| {
            self.categories
                .iter()
                .filter(|c| c.name != "default")
                .find_map(|c| c.matchers.iter().position(hit).map(|i| (c, i)))
        };
        let fold = self.fingerprint.case_insensitive_tools;
        let bare = bare_name(tool);
        // The name as it is; without case, a listed name spelled with other word breaks
        // (`ReadFile`, `read-file` for `read_file`): the same tool in another framework's
        // style; a name written as words (`Delegate work to coworker`, `Web Search Tool`) as
        // the snake-case name those words make, matched by names and patterns alike; then, for
        // a name in a namespace (`functions.shell`, `default_api:read_file`, `tools/grep`)
        // listed nowhere whole, its own part, both ways.
        let found = placed(&|m| m.is_match(tool))
            .or_else(|| {
                let folded = fold.then(|| fold_name(tool))?;
                placed(&|m| literal_folded_as(m, &folded))
            })
            .or_else(|| {
                let snake = fold.then(|| words_name(tool)).flatten()?;
                placed(&|m| m.is_match(&snake))
            })
            .or_else(|| {
                if bare.len() == tool.len() {
                    return None;
                }
                let folded = fold.then(|| fold_name(bare));
                placed(&|m| {
                    m.is_match(bare) || folded.as_deref().is_some_and(|f| literal_folded_as(m, f))
                })
            });
        if let Some((c, i)) = found {
            return Placement {
                category: Some(c),
                reason: PlacementReason::Pattern(c.tools.get(i).map_or("", String::as_str)),
                setting,
            };
        }
        match self.categories.iter().find(|c| c.name == "default") {
            Some(c) => Placement {
                category: Some(c),
                reason: PlacementReason::Default,
                setting,
            },
            None => Placement {
                category: None,
                reason: PlacementReason::None,
                setting,
            },
        }
    }
}

/// The part of a tool name after its namespace (`functions.shell`, `default_api:read_file`,
/// `tools/grep`): what follows the last `.`, `:` or `/`; the whole name when it has none.
pub fn bare_name(tool: &str) -> &str {
    tool.rsplit(['.', ':', '/']).next().unwrap_or(tool)
}

/// A literal name (no glob) that folds ([`fold_name`]) to `folded`.
fn literal_folded_as(m: &crate::check::NameGlob, folded: &str) -> bool {
    match m {
        crate::check::NameGlob::Literal(l) => fold_name(l) == folded,
        crate::check::NameGlob::Glob(_) => false,
    }
}

/// A tool name without case and without the `_` and `-` between its words: `ReadFile`,
/// `read_file` and `read-file` fold alike.
fn fold_name(name: &str) -> String {
    name.bytes()
        .filter(|b| !matches!(b, b'_' | b'-'))
        .map(|b| char::from(b.to_ascii_lowercase()))
        .collect()
}

/// A name written as words (`Delegate work to coworker`, `Read a file's content`), as the
/// snake-case name they make (`delegate_work_to_coworker`, `read_a_files_content`): lower
/// case, each run of spaces between words one `_`, an apostrophe inside a word dropped.
/// `None` for a name with no space (an identifier keeps its own spelling) and for a name of
/// other characters than ASCII letters, digits, spaces, `_`, `-` and `'`.
fn words_name(name: &str) -> Option<String> {
    let name = name.trim();
    if !name.contains(' ')
        || name.len() > 128
        || !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b' ' | b'_' | b'-' | b'\''))
    {
        return None;
    }
    let mut out = String::with_capacity(name.len());
    for word in name.split([' ', '-']).filter(|w| !w.is_empty()) {
        if !out.is_empty() {
            out.push('_');
        }
        out.extend(
            word.chars()
                .filter(|&c| c != '\'')
                .map(|c| c.to_ascii_lowercase()),
        );
    }
    Some(out)
}

impl Param for Action {
    fn read(node: &Node) -> Option<Self> {
        Action::parse(node.as_str()?)
    }
}

impl Param for Nudge {
    fn read(node: &Node) -> Option<Self> {
        match node.as_str()? {
            "context" => Some(Nudge::Context),
            "system" => Some(Nudge::System),
            _ => None,
        }
    }
}

/// A ladder is a list of steps.
impl Param for Ladder {
    fn read(node: &Node) -> Option<Self> {
        Vec::<Step>::read(node).map(|steps| Ladder { steps })
    }

    fn absent() -> Option<Self> {
        Some(Ladder::default())
    }
}

impl Config {
    /// Builds from a whole policy tree with defaults merged in (see [`crate::Policy`]); `None`
    /// only when the tree holds a value the checks should have refused.
    pub(crate) fn from_node(root: &Node) -> Option<Config> {
        Config::from_params((crate::schema::POLICY.read)(root)?)
    }

    /// The configuration of a policy as read.
    pub(crate) fn from_params(p: PolicyParams) -> Option<Config> {
        let detectors = &p.detectors;
        let categories = p
            .categories
            .0
            .into_iter()
            .filter_map(|(name, c)| Category::from_params(name, c, detectors))
            .collect();
        let fp: FingerprintParams = p.fingerprint;
        Some(Config {
            enabled: true,
            window_size: p.window.size,
            time: p.time,
            user: p.user,
            ladder: p.escalation.ladder,
            nudge: p.escalation.nudge,
            ladders: p.ladders,
            categories,
            tools: p.tools,
            detectors: (DETECTORS.read)(detectors)?,
            fingerprint: Fingerprint {
                primary_keys: fp.primary_keys,
                volatile_keys: fp.volatile_keys,
                tools: fp.tools,
                sort_keys: fp.canonicalize.sort_keys,
                collapse_whitespace: fp.canonicalize.collapse_whitespace,
                path_separators: fp.canonicalize.path_separators,
                case_insensitive_tools: fp.canonicalize.case_insensitive_tools,
            },
            shell: p.shell,
            results: p.results,
            group: p.group,
        })
    }
}

impl Category {
    /// A category as read, its detector parameters over the top-level ones (`detectors`).
    fn from_params(name: String, c: CategoryParams, detectors: &Node) -> Option<Category> {
        let mut merged = detectors.clone();
        if c.detectors.value != Value::Null {
            merged.merge(&c.detectors);
        }
        Some(Category {
            name,
            matchers: c
                .tools
                .iter()
                .filter_map(|p| crate::check::compile_glob(p).ok())
                .collect(),
            tools: c.tools,
            detectors: (DETECTORS.read)(&merged)?,
            ladder: c.ladder,
            modifies: c.modifies,
            waits: c.waits,
            enabled: c.enabled,
        })
    }
}

impl PluginSpec {
    /// A `plugins:` entry as read; `file` is the policy file that wrote it (relative paths
    /// are resolved against its directory).
    pub(crate) fn from_params(entry: Spanned<PluginParams>, file: &std::path::Path) -> PluginSpec {
        let p = entry.value;
        PluginSpec {
            path: file
                .parent()
                .unwrap_or(std::path::Path::new(""))
                .join(&p.path.value),
            written_path: p.path.value,
            span: entry.span,
            path_span: p.path.span,
            config_span: p.config.as_ref().map(|c| c.span),
            name: p.name,
            enabled: p.enabled,
            ladder: p.ladder,
            config: p.config.map_or(serde_json::Value::Null, |c| c.to_json()),
        }
    }
}
