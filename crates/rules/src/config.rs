//! The typed, effective configuration: what the engine compiles into its rule set.
//!
//! A [`Config`] is built from a node tree that has already passed [`crate::check`] and has the
//! declared defaults merged under it, so every value is present and of the right type.

use std::collections::BTreeMap;

use globset::GlobMatcher;
use regex::Regex;

use crate::check::{compile_glob, compile_regex};
use crate::node::{Node, Value};

/// What the host should do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum Action {
    #[default]
    Allow,
    Warn,
    Ask,
    Block,
    Terminate,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Allow => "allow",
            Action::Warn => "warn",
            Action::Ask => "ask",
            Action::Block => "block",
            Action::Terminate => "terminate",
        }
    }

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

/// One step of an escalation ladder.
#[derive(Clone, Debug, PartialEq)]
pub struct Step {
    /// Applies from the Nth detection of the same loop on.
    pub repeat: Option<u32>,
    /// Applies once the session was flagged at least this many times before.
    pub flags: Option<u32>,
    pub action: Action,
    pub message: Option<String>,
}

/// Steps in ascending order; the last one whose conditions hold is taken.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Ladder {
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

#[derive(Clone, Debug)]
pub struct ExactRepeat {
    pub enabled: bool,
    pub ladder: Option<String>,
    pub threshold: u32,
    pub consecutive: bool,
    pub reset_on_changed_result: bool,
}

#[derive(Clone, Debug)]
pub struct FuzzyRepeat {
    pub enabled: bool,
    pub ladder: Option<String>,
    pub threshold: u32,
    pub reset_on_changed_result: bool,
}

#[derive(Clone, Debug)]
pub struct Cycle {
    pub enabled: bool,
    pub ladder: Option<String>,
    pub min_period: u32,
    pub max_period: u32,
    pub repetitions: u32,
    /// Flag only once the first call of the next turn arrives.
    pub confirm: bool,
}

#[derive(Clone, Debug)]
pub struct Interleaved {
    pub enabled: bool,
    pub ladder: Option<String>,
    pub threshold: u32,
    pub failures_only: bool,
}

/// A detector with only a threshold.
#[derive(Clone, Debug)]
pub struct Counted {
    pub enabled: bool,
    pub ladder: Option<String>,
    pub threshold: u32,
}

#[derive(Clone, Debug)]
pub struct SameOutcome {
    pub enabled: bool,
    pub ladder: Option<String>,
    pub threshold: u32,
    pub include_empty: bool,
}

#[derive(Clone, Debug)]
pub struct TestFix {
    pub enabled: bool,
    pub ladder: Option<String>,
    pub threshold: u32,
    pub test_commands: Vec<Regex>,
}

#[derive(Clone, Debug)]
pub struct TextRepeat {
    pub enabled: bool,
    pub ladder: Option<String>,
    pub threshold: u32,
    pub min_chars: u32,
}

#[derive(Clone, Debug)]
pub struct Chanting {
    pub enabled: bool,
    pub ladder: Option<String>,
    pub threshold: u32,
    pub min_unit_chars: u32,
    pub max_unit_chars: u32,
    pub max_message_chars: u32,
}

#[derive(Clone, Debug)]
pub struct UnknownTool {
    pub enabled: bool,
    pub ladder: Option<String>,
    pub threshold: u32,
    pub known_tools: Vec<GlobMatcher>,
    pub error_patterns: Vec<Regex>,
}

/// Parameters of every built-in detector.
#[derive(Clone, Debug)]
pub struct Detectors {
    pub exact_repeat: ExactRepeat,
    pub fuzzy_repeat: FuzzyRepeat,
    pub cycle: Cycle,
    pub interleaved: Interleaved,
    pub no_progress: Counted,
    pub same_outcome: SameOutcome,
    pub error_cascade: Counted,
    pub test_fix: TestFix,
    pub monologue: Counted,
    pub text_repeat: TextRepeat,
    pub chanting: Chanting,
    pub unknown_tool: UnknownTool,
}

/// A named group of tools with its own detector parameters and ladder.
#[derive(Clone, Debug)]
pub struct Category {
    pub name: String,
    /// The tool patterns as written.
    pub tools: Vec<String>,
    pub matchers: Vec<GlobMatcher>,
    pub detectors: Detectors,
    pub ladder: Option<String>,
    /// A successful call of these tools is progress for the calls around it.
    pub modifies: bool,
    /// `false`: calls and results of these tools are ignored.
    pub enabled: bool,
}

/// One tool named in the policy's `tools` section.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolSetting {
    /// The tool's category, over every category's patterns.
    pub category: Option<String>,
    /// `false`: the tool's calls and results are ignored.
    pub enabled: bool,
    /// Detectors that never fire on this tool.
    pub exempt: Vec<String>,
}

/// Where a tool lands and why ([`Config::place_tool`]).
#[derive(Clone, Debug)]
pub struct Placement<'a> {
    pub category: Option<&'a Category>,
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
    pub fn matches(&self, tool: &str) -> bool {
        self.matchers.iter().any(|m| m.is_match(tool))
    }
}

#[derive(Clone, Debug, Default)]
pub struct ToolKeys {
    pub primary_keys: Option<Vec<String>>,
    pub volatile_keys: Vec<String>,
}

#[derive(Clone, Debug)]
pub struct Fingerprint {
    pub primary_keys: Vec<String>,
    pub volatile_keys: Vec<String>,
    pub tools: BTreeMap<String, ToolKeys>,
    pub sort_keys: bool,
    pub collapse_whitespace: bool,
    pub path_separators: bool,
    pub case_insensitive_tools: bool,
}

#[derive(Clone, Debug)]
pub struct Shell {
    pub tools: Vec<GlobMatcher>,
    pub command_keys: Vec<String>,
    pub file_read_commands: Vec<String>,
    pub file_operation_commands: Vec<String>,
    pub wait_commands: Vec<String>,
    /// Commands that change files or the environment (`git apply`, `sed -i`, `pip install`).
    pub modify_commands: Vec<String>,
    pub complex_operators: Vec<String>,
}

#[derive(Clone, Debug)]
pub struct MaskPattern {
    pub regex: Regex,
    pub replace: String,
}

#[derive(Clone, Debug)]
pub struct Results {
    /// Built-in maskers by name (see [`crate::schema::MASKERS`]).
    pub mask: Vec<String>,
    pub patterns: Vec<MaskPattern>,
    pub empty_patterns: Vec<Regex>,
    /// Results without an error flag or exit code that still mean a failure.
    pub error_patterns: Vec<Regex>,
    pub retryable_patterns: Vec<Regex>,
    pub max_bytes: usize,
}

/// How user messages change detection.
#[derive(Clone, Debug)]
pub struct User {
    pub repeat_requests: Vec<Regex>,
    pub repeat_allowance: u32,
    /// Messages asking to retry: the counts restart for good.
    pub retry_requests: Vec<Regex>,
    /// User-role messages a host or framework sent, not a person: they change no count.
    pub automated_patterns: Vec<Regex>,
}

#[derive(Clone, Debug)]
pub struct Time {
    /// 0 means no expiry.
    pub ttl_seconds: u64,
    pub reset_on_user_message: bool,
    pub session_idle_seconds: u64,
}

/// A plugin named by the policy (loaded by the plugin host, not here).
#[derive(Clone, Debug)]
pub struct PluginSpec {
    /// Resolved against the directory of the file that named it (absolute paths stay as they
    /// are).
    pub path: std::path::PathBuf,
    /// The path as the policy wrote it.
    pub written_path: String,
    pub name: Option<String>,
    pub enabled: bool,
    pub ladder: Option<String>,
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
    pub window_size: usize,
    pub time: Time,
    pub user: User,
    /// The ladder used when neither category nor detector names one.
    pub ladder: String,
    /// Where a host that edits the conversation puts a warning for the model.
    pub nudge: Nudge,
    pub ladders: BTreeMap<String, Ladder>,
    pub categories: Vec<Category>,
    /// Single tools by exact name (the `tools` section).
    pub tools: BTreeMap<String, ToolSetting>,
    pub detectors: Detectors,
    pub fingerprint: Fingerprint,
    pub shell: Shell,
    pub results: Results,
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

/// Group (swarm) scope: one fingerprint repeated across the sessions of a group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Group {
    pub enabled: bool,
    pub threshold: u32,
    pub min_workers: u32,
    pub ladder: String,
}

impl Config {
    /// The category of a tool: the first declared category listing it, else the one named
    /// `default`, else none (top-level detector parameters apply).
    pub fn category_of(&self, tool: &str) -> Option<&Category> {
        self.place_tool(tool).category
    }

    /// The `tools` entry of a tool (by exact name; without case when tool names compare so).
    pub fn tool_setting(&self, tool: &str) -> Option<&ToolSetting> {
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
        for c in self.categories.iter().filter(|c| c.name != "default") {
            if let Some(i) = c.matchers.iter().position(|m| m.is_match(tool)) {
                return Placement {
                    category: Some(c),
                    reason: PlacementReason::Pattern(c.tools.get(i).map_or("", String::as_str)),
                    setting,
                };
            }
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

// --- building from nodes -------------------------------------------------------------------

fn get<'a>(node: &'a Node, key: &str) -> Option<&'a Node> {
    node.get(key).filter(|n| n.value != Value::Null)
}

fn b(node: &Node, key: &str) -> bool {
    matches!(get(node, key).map(|n| &n.value), Some(Value::Bool(true)))
}

/// A boolean that defaults to true in entries of maps (where declared defaults are not merged).
fn not_false(node: &Node, key: &str) -> bool {
    !matches!(get(node, key).map(|n| &n.value), Some(Value::Bool(false)))
}

fn u(node: &Node, key: &str) -> u32 {
    match get(node, key).map(|n| &n.value) {
        Some(Value::Int(i)) => u32::try_from(*i).unwrap_or(0),
        _ => 0,
    }
}

fn u64_(node: &Node, key: &str) -> u64 {
    match get(node, key).map(|n| &n.value) {
        Some(Value::Int(i)) => u64::try_from(*i).unwrap_or(0),
        _ => 0,
    }
}

fn opt_u(node: &Node, key: &str) -> Option<u32> {
    get(node, key).map(|_| u(node, key))
}

fn s(node: &Node, key: &str) -> Option<String> {
    get(node, key).and_then(|n| n.as_str()).map(str::to_owned)
}

fn strs(node: &Node, key: &str) -> Vec<String> {
    get(node, key)
        .and_then(|n| n.as_seq())
        .map(|items| {
            items
                .iter()
                .filter_map(|n| n.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

fn regexes(node: &Node, key: &str) -> Vec<Regex> {
    strs(node, key)
        .iter()
        .filter_map(|p| compile_regex(p).ok())
        .collect()
}

fn globs(node: &Node, key: &str) -> Vec<GlobMatcher> {
    strs(node, key)
        .iter()
        .filter_map(|p| compile_glob(p).ok())
        .collect()
}

fn empty() -> Node {
    Node {
        value: Value::Null,
        span: Default::default(),
    }
}

fn section<'a>(node: &'a Node, key: &str, fallback: &'a Node) -> &'a Node {
    get(node, key).unwrap_or(fallback)
}

impl Detectors {
    /// Drops every detector's own ladder choice, so the category's or the global one applies.
    pub fn clear_ladders(&mut self) {
        self.exact_repeat.ladder = None;
        self.fuzzy_repeat.ladder = None;
        self.cycle.ladder = None;
        self.interleaved.ladder = None;
        self.no_progress.ladder = None;
        self.same_outcome.ladder = None;
        self.error_cascade.ladder = None;
        self.test_fix.ladder = None;
        self.monologue.ladder = None;
        self.text_repeat.ladder = None;
        self.chanting.ladder = None;
        self.unknown_tool.ladder = None;
    }

    /// Builds from a `detectors` section with defaults merged in.
    pub(crate) fn from_node(node: &Node) -> Detectors {
        let none = empty();
        let d = |key: &str| section(node, key, &none).clone();
        let (er, fr, cy, il, np, so, ec, tf, mo, tr, ch, ut) = (
            d("exact_repeat"),
            d("fuzzy_repeat"),
            d("cycle"),
            d("interleaved"),
            d("no_progress"),
            d("same_outcome"),
            d("error_cascade"),
            d("test_fix"),
            d("monologue"),
            d("text_repeat"),
            d("chanting"),
            d("unknown_tool"),
        );
        let counted = |n: &Node| Counted {
            enabled: b(n, "enabled"),
            ladder: s(n, "ladder"),
            threshold: u(n, "threshold"),
        };
        Detectors {
            exact_repeat: ExactRepeat {
                enabled: b(&er, "enabled"),
                ladder: s(&er, "ladder"),
                threshold: u(&er, "threshold"),
                consecutive: b(&er, "consecutive"),
                reset_on_changed_result: b(&er, "reset_on_changed_result"),
            },
            fuzzy_repeat: FuzzyRepeat {
                enabled: b(&fr, "enabled"),
                ladder: s(&fr, "ladder"),
                threshold: u(&fr, "threshold"),
                reset_on_changed_result: b(&fr, "reset_on_changed_result"),
            },
            cycle: Cycle {
                enabled: b(&cy, "enabled"),
                ladder: s(&cy, "ladder"),
                min_period: u(&cy, "min_period"),
                max_period: u(&cy, "max_period"),
                repetitions: u(&cy, "repetitions"),
                confirm: b(&cy, "confirm"),
            },
            interleaved: Interleaved {
                enabled: b(&il, "enabled"),
                ladder: s(&il, "ladder"),
                threshold: u(&il, "threshold"),
                failures_only: b(&il, "failures_only"),
            },
            no_progress: counted(&np),
            same_outcome: SameOutcome {
                enabled: b(&so, "enabled"),
                ladder: s(&so, "ladder"),
                threshold: u(&so, "threshold"),
                include_empty: b(&so, "include_empty"),
            },
            error_cascade: counted(&ec),
            test_fix: TestFix {
                enabled: b(&tf, "enabled"),
                ladder: s(&tf, "ladder"),
                threshold: u(&tf, "threshold"),
                test_commands: regexes(&tf, "test_commands"),
            },
            monologue: counted(&mo),
            text_repeat: TextRepeat {
                enabled: b(&tr, "enabled"),
                ladder: s(&tr, "ladder"),
                threshold: u(&tr, "threshold"),
                min_chars: u(&tr, "min_chars"),
            },
            chanting: Chanting {
                enabled: b(&ch, "enabled"),
                ladder: s(&ch, "ladder"),
                threshold: u(&ch, "threshold"),
                min_unit_chars: u(&ch, "min_unit_chars"),
                max_unit_chars: u(&ch, "max_unit_chars"),
                max_message_chars: u(&ch, "max_message_chars"),
            },
            unknown_tool: UnknownTool {
                enabled: b(&ut, "enabled"),
                ladder: s(&ut, "ladder"),
                threshold: u(&ut, "threshold"),
                known_tools: globs(&ut, "known_tools"),
                error_patterns: regexes(&ut, "error_patterns"),
            },
        }
    }
}

impl Config {
    /// Builds from a whole policy tree with defaults merged in (see [`crate::Policy`]).
    pub(crate) fn from_node(root: &Node) -> Config {
        let none = empty();
        let window = section(root, "window", &none);
        let time = section(root, "time", &none);
        let detectors_node = section(root, "detectors", &none);
        let fp = section(root, "fingerprint", &none);
        let canon = section(fp, "canonicalize", &none);
        let shell = section(root, "shell", &none);
        let user = section(root, "user", &none);
        let results = section(root, "results", &none);
        let group = section(root, "group", &none);

        let ladders = section(root, "ladders", &none)
            .as_map()
            .unwrap_or_default()
            .iter()
            .filter_map(|(k, v)| {
                let steps = v
                    .as_seq()
                    .unwrap_or_default()
                    .iter()
                    .map(|step| Step {
                        repeat: opt_u(step, "repeat"),
                        flags: opt_u(step, "flags"),
                        action: s(step, "action")
                            .as_deref()
                            .and_then(Action::parse)
                            .unwrap_or_default(),
                        message: s(step, "message"),
                    })
                    .collect();
                Some((k.as_str()?.to_owned(), Ladder { steps }))
            })
            .collect();

        let categories = section(root, "categories", &none)
            .as_map()
            .unwrap_or_default()
            .iter()
            .filter_map(|(k, v)| {
                let mut merged = detectors_node.clone();
                if let Some(over) = get(v, "detectors") {
                    merged.merge(over);
                }
                Some(Category {
                    name: k.as_str()?.to_owned(),
                    tools: strs(v, "tools"),
                    matchers: globs(v, "tools"),
                    detectors: Detectors::from_node(&merged),
                    ladder: s(v, "ladder"),
                    modifies: b(v, "modifies"),
                    enabled: not_false(v, "enabled"),
                })
            })
            .collect();

        let tool_settings = section(root, "tools", &none)
            .as_map()
            .unwrap_or_default()
            .iter()
            .filter_map(|(k, v)| {
                Some((
                    k.as_str()?.to_owned(),
                    ToolSetting {
                        category: s(v, "category"),
                        enabled: not_false(v, "enabled"),
                        exempt: strs(v, "exempt"),
                    },
                ))
            })
            .collect();

        let tools = section(fp, "tools", &none)
            .as_map()
            .unwrap_or_default()
            .iter()
            .filter_map(|(k, v)| {
                Some((
                    k.as_str()?.to_owned(),
                    ToolKeys {
                        primary_keys: get(v, "primary_keys").map(|_| strs(v, "primary_keys")),
                        volatile_keys: strs(v, "volatile_keys"),
                    },
                ))
            })
            .collect();

        let patterns = get(results, "patterns")
            .and_then(|n| n.as_seq())
            .unwrap_or_default()
            .iter()
            .filter_map(|p| {
                Some(MaskPattern {
                    regex: compile_regex(&s(p, "regex")?).ok()?,
                    replace: s(p, "replace").unwrap_or_default(),
                })
            })
            .collect();

        Config {
            enabled: true,
            window_size: u(window, "size") as usize,
            time: Time {
                ttl_seconds: u64_(time, "ttl_seconds"),
                reset_on_user_message: b(time, "reset_on_user_message"),
                session_idle_seconds: u64_(time, "session_idle_seconds"),
            },
            user: User {
                repeat_requests: regexes(user, "repeat_requests"),
                repeat_allowance: u(user, "repeat_allowance"),
                retry_requests: regexes(user, "retry_requests"),
                automated_patterns: regexes(user, "automated_patterns"),
            },
            ladder: s(section(root, "escalation", &none), "ladder")
                .unwrap_or_else(|| "default".into()),
            nudge: match s(section(root, "escalation", &none), "nudge").as_deref() {
                Some("system") => Nudge::System,
                _ => Nudge::Context,
            },
            ladders,
            categories,
            tools: tool_settings,
            detectors: Detectors::from_node(detectors_node),
            fingerprint: Fingerprint {
                primary_keys: strs(fp, "primary_keys"),
                volatile_keys: strs(fp, "volatile_keys"),
                tools,
                sort_keys: b(canon, "sort_keys"),
                collapse_whitespace: b(canon, "collapse_whitespace"),
                path_separators: b(canon, "path_separators"),
                case_insensitive_tools: b(canon, "case_insensitive_tools"),
            },
            shell: Shell {
                tools: globs(shell, "tools"),
                command_keys: strs(shell, "command_keys"),
                file_read_commands: strs(shell, "file_read_commands"),
                file_operation_commands: strs(shell, "file_operation_commands"),
                wait_commands: strs(shell, "wait_commands"),
                modify_commands: strs(shell, "modify_commands"),
                complex_operators: strs(shell, "complex_operators"),
            },
            results: Results {
                mask: strs(results, "mask"),
                patterns,
                empty_patterns: regexes(results, "empty_patterns"),
                error_patterns: regexes(results, "error_patterns"),
                retryable_patterns: regexes(results, "retryable_patterns"),
                max_bytes: u(results, "max_bytes") as usize,
            },
            group: Group {
                enabled: b(group, "enabled"),
                threshold: u(group, "threshold"),
                min_workers: u(group, "min_workers"),
                ladder: s(group, "ladder").unwrap_or_else(|| "group".into()),
            },
        }
    }
}
