//! The typed, effective configuration: what the engine compiles into its rule set.
//!
//! A [`Config`] is built from a node tree that has already passed the checks and has the
//! declared defaults merged under it, so every value is present and of the right type.

use std::collections::BTreeMap;

use globset::GlobMatcher;
use regex::Regex;

use crate::check::{compile_glob, compile_regex};
use crate::node::{Node, Value};

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

/// One step of an escalation ladder.
#[derive(Clone, Debug, PartialEq)]
pub struct Step {
    /// Applies from the Nth detection of the same loop on.
    pub repeat: Option<u32>,
    /// Applies once the session was flagged at least this many times before.
    pub flags: Option<u32>,
    /// What the host does when this step is taken.
    pub action: Action,
    /// The message for the model or user, with `{placeholder}`s not yet filled in.
    pub message: Option<String>,
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

/// Parameters of the `exact_repeat` detector.
#[derive(Clone, Debug)]
pub struct ExactRepeat {
    /// Whether the detector runs.
    pub enabled: bool,
    /// The ladder its detections go through; `None`: the category's or the policy's.
    pub ladder: Option<String>,
    /// The Nth identical call (same tool, same canonical arguments) is flagged.
    pub threshold: u32,
    /// Count only back-to-back repeats instead of repeats anywhere in the window.
    pub consecutive: bool,
    /// A repeat whose normalized result differs from the previous one restarts the count.
    pub reset_on_changed_result: bool,
}

/// Parameters of the `fuzzy_repeat` detector.
#[derive(Clone, Debug)]
pub struct FuzzyRepeat {
    /// Whether the detector runs.
    pub enabled: bool,
    /// The ladder its detections go through; `None`: the category's or the policy's.
    pub ladder: Option<String>,
    /// The Nth call with the same tool and primary keys (after shell normalization) is flagged.
    pub threshold: u32,
    /// A repeat whose normalized result differs from the previous one restarts the count.
    pub reset_on_changed_result: bool,
}

/// Parameters of the `cycle` detector.
#[derive(Clone, Debug)]
pub struct Cycle {
    /// Whether the detector runs.
    pub enabled: bool,
    /// The ladder its detections go through; `None`: the category's or the policy's.
    pub ladder: Option<String>,
    /// Shortest cycle looked for, in calls (2: A→B→A→B).
    pub min_period: u32,
    /// Longest cycle looked for, in calls.
    pub max_period: u32,
    /// How many full turns of the cycle are flagged.
    pub repetitions: u32,
    /// Flag only once the first call of the next turn arrives.
    pub confirm: bool,
}

/// Parameters of the `interleaved` detector.
#[derive(Clone, Debug)]
pub struct Interleaved {
    /// Whether the detector runs.
    pub enabled: bool,
    /// The ladder its detections go through; `None`: the category's or the policy's.
    pub ladder: Option<String>,
    /// The Nth failing run of the same call, with other calls between, is flagged.
    pub threshold: u32,
    /// Count only runs whose result was an error.
    pub failures_only: bool,
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

/// Parameters of the `same_outcome` detector.
#[derive(Clone, Debug)]
pub struct SameOutcome {
    /// Whether the detector runs.
    pub enabled: bool,
    /// The ladder its detections go through; `None`: the category's or the policy's.
    pub ladder: Option<String>,
    /// The Nth different call in a row with the same error or empty result is flagged.
    pub threshold: u32,
    /// Count empty results (`results.empty_patterns`), not only errors.
    pub include_empty: bool,
}

/// Parameters of the `test_fix` detector.
#[derive(Clone, Debug)]
pub struct TestFix {
    /// Whether the detector runs.
    pub enabled: bool,
    /// The ladder its detections go through; `None`: the category's or the policy's.
    pub ladder: Option<String>,
    /// The Nth consecutive test run failing the same way is flagged.
    pub threshold: u32,
    /// Commands that run tests.
    pub test_commands: Vec<Regex>,
}

/// Parameters of the `text_repeat` detector.
#[derive(Clone, Debug)]
pub struct TextRepeat {
    /// Whether the detector runs.
    pub enabled: bool,
    /// The ladder its detections go through; `None`: the category's or the policy's.
    pub ladder: Option<String>,
    /// The Nth assistant turn with the same normalized text is flagged.
    pub threshold: u32,
    /// Turns shorter than this many characters are ignored.
    pub min_chars: u32,
}

/// Parameters of the `chanting` detector.
#[derive(Clone, Debug)]
pub struct Chanting {
    /// Whether the detector runs.
    pub enabled: bool,
    /// The ladder its detections go through; `None`: the category's or the policy's.
    pub ladder: Option<String>,
    /// A unit repeated this many times in one assistant message is flagged.
    pub threshold: u32,
    /// Shortest repeated unit considered, in characters.
    pub min_unit_chars: u32,
    /// Longest repeated unit considered, in characters.
    pub max_unit_chars: u32,
    /// Characters beyond this in one message are not scanned.
    pub max_message_chars: u32,
}

/// Parameters of the `unknown_tool` detector.
#[derive(Clone, Debug)]
pub struct UnknownTool {
    /// Whether the detector runs.
    pub enabled: bool,
    /// The ladder its detections go through; `None`: the category's or the policy's.
    pub ladder: Option<String>,
    /// The Nth call of a tool that does not exist is flagged.
    pub threshold: u32,
    /// Tools the agent has; when empty, a tool is unknown once a result says so.
    pub known_tools: Vec<GlobMatcher>,
    /// Result text saying that a tool does not exist.
    pub error_patterns: Vec<Regex>,
}

/// Parameters of every built-in detector.
#[derive(Clone, Debug)]
pub struct Detectors {
    /// Same tool and canonical arguments, consecutive or within the window.
    pub exact_repeat: ExactRepeat,
    /// Same tool and primary keys, after shell normalization.
    pub fuzzy_repeat: FuzzyRepeat,
    /// A→B→A→B and longer periods.
    pub cycle: Cycle,
    /// A failing call run again with other calls between.
    pub interleaved: Interleaved,
    /// The same call returning the same normalized result.
    pub no_progress: Counted,
    /// Different calls producing the same error or the same empty result.
    pub same_outcome: SameOutcome,
    /// Consecutive failures of one tool.
    pub error_cascade: Counted,
    /// Consecutive failing test runs.
    pub test_fix: TestFix,
    /// Assistant turns with no tool call, one after another.
    pub monologue: Counted,
    /// The same assistant turn repeated.
    pub text_repeat: TextRepeat,
    /// A unit of text repeated inside one assistant message.
    pub chanting: Chanting,
    /// A tool that does not exist called again and again.
    pub unknown_tool: UnknownTool,
}

/// A named group of tools with its own detector parameters and ladder.
#[derive(Clone, Debug)]
pub struct Category {
    /// The key under `categories`; `default` holds every tool listed nowhere else.
    pub name: String,
    /// The tool patterns as written.
    pub tools: Vec<String>,
    /// The compiled `tools` patterns, in the same order.
    pub matchers: Vec<GlobMatcher>,
    /// Detector parameters for these tools: the top-level ones with the category's over them.
    pub detectors: Detectors,
    /// The ladder for these tools; `None`: the policy's.
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

/// Argument keys of one tool (`fingerprint.tools.<name>`).
#[derive(Clone, Debug, Default)]
pub struct ToolKeys {
    /// Argument keys that identify a call of this tool (replacing the global list); `None`: the global list.
    pub primary_keys: Option<Vec<String>>,
    /// Argument keys ignored for this tool, added to the global list.
    pub volatile_keys: Vec<String>,
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

/// Shell-command normalization (`shell`).
#[derive(Clone, Debug)]
pub struct Shell {
    /// Tools whose calls are shell commands.
    pub tools: Vec<GlobMatcher>,
    /// Argument keys holding the command.
    pub command_keys: Vec<String>,
    /// Commands that read a file: with one file operand they collapse to one file-read key per file.
    pub file_read_commands: Vec<String>,
    /// Commands that do what file tools do; their failures point the model at the file tools.
    pub file_operation_commands: Vec<String>,
    /// Commands that wait (`sleep 30`): repeating them is not a loop.
    pub wait_commands: Vec<String>,
    /// Commands that change files or the environment (`git apply`, `sed -i`, `pip install`).
    pub modify_commands: Vec<String>,
    /// Operators that make a command complex; such commands are kept verbatim.
    pub complex_operators: Vec<String>,
}

/// A regex masked in results before they are compared, and its replacement.
#[derive(Clone, Debug)]
pub struct MaskPattern {
    /// What is masked.
    pub regex: Regex,
    /// What it is replaced with.
    pub replace: String,
}

/// What is masked before results are compared (`results`).
#[derive(Clone, Debug)]
pub struct Results {
    /// Built-in maskers by name (`counters`, `ids` and the others the rule reference lists).
    pub mask: Vec<String>,
    /// Extra regexes masked before results are compared.
    pub patterns: Vec<MaskPattern>,
    /// Results that count as empty.
    pub empty_patterns: Vec<Regex>,
    /// Results without an error flag or exit code that still mean a failure.
    pub error_patterns: Vec<Regex>,
    /// Failures that are worth retrying (rate limits, 5xx).
    pub retryable_patterns: Vec<Regex>,
    /// Only this many bytes from each end of a result are normalized and hashed.
    pub max_bytes: usize,
}

/// How user messages change detection.
#[derive(Clone, Debug)]
pub struct User {
    /// Messages asking for a repeat (`run it 3 times`).
    pub repeat_requests: Vec<Regex>,
    /// Extra repeats tolerated after a repeat request that names no number (a number N allows N).
    pub repeat_allowance: u32,
    /// Messages asking to retry: the counts restart for good.
    pub retry_requests: Vec<Regex>,
    /// User-role messages a host or framework sent, not a person: they change no count.
    pub automated_patterns: Vec<Regex>,
}

/// Event-time expiry and resets (`time`).
#[derive(Clone, Debug)]
pub struct Time {
    /// 0 means no expiry.
    pub ttl_seconds: u64,
    /// A message from a person sets the calls before it aside until a repeated call's outcome shows whether it changed anything.
    pub reset_on_user_message: bool,
    /// Sessions with no event for this many seconds are evicted.
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

/// Group (swarm) scope: one fingerprint repeated across the sessions of a group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Group {
    /// Whether fingerprints are counted across the sessions of a group.
    pub enabled: bool,
    /// A fingerprint seen this many times across the group is a group-wide loop.
    pub threshold: u32,
    /// Only when at least this many different workers produced it.
    pub min_workers: u32,
    /// The ladder for group-wide loops.
    pub ladder: String,
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
    pub(crate) fn clear_ladders(&mut self) {
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
