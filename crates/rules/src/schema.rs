//! The one declaration of every policy parameter.
//!
//! Each key is declared once here, in one row of a `section!` table: its key (the field
//! name), the Rust type it is read into, its kind (what the checks accept), its default and
//! its documentation (the row's doc comment). From that row come the typed configuration's field
//! and its doc, the reader that fills the field from the checked node tree (under the same
//! key, so a misspelt key cannot compile into a silent zero), the default, the "unknown key,
//! did you mean" suggestions, the JSON Schema printed by `loopctl schema` and the rule reference
//! (docs/reference.md). Rows without a type are checked and documented but read elsewhere
//! (`version`, `extends`, `overrides`: they steer loading and merging).
//!
//! The built-in detectors are listed once, in `detectors!`: their names, what their loops are
//! called in messages, and their parameter sections.

use std::collections::BTreeMap;

use crate::check::NameGlob;
use regex::Regex;

use crate::config::{Action, Counted, Ladder, Nudge};
use crate::node::Node;
use crate::param::{Ordered, Section, Spanned};

/// The type of a policy value.
#[derive(Debug)]
pub(crate) enum Kind {
    Bool,
    /// An integer in `min..=max`.
    Int {
        min: i64,
        max: i64,
    },
    Str,
    /// One of a fixed set of words.
    Enum(&'static [&'static str]),
    /// A regular expression (Rust `regex` syntax).
    Regex,
    /// A tool-name glob such as `mcp__*`.
    Glob,
    /// A message template with `{placeholder}`s from [`PLACEHOLDERS`].
    Template,
    List(&'static Kind),
    /// A mapping with the fixed keys of its fields.
    Section(&'static [Field]),
    /// A mapping from names the operator chooses to values of one kind.
    Map(&'static Kind),
    /// Any YAML value (plugin configuration, checked by the plugin).
    Any,
}

/// One key of a section.
#[derive(Debug)]
pub(crate) struct Field {
    pub key: &'static str,
    pub kind: Kind,
    /// The default as YAML text; `None` when the key has no default (optional or required).
    pub default: Option<&'static str>,
    pub required: bool,
    pub doc: &'static str,
}

/// The only policy format version this build understands.
pub(crate) const FORMAT_VERSION: i64 = 1;

/// Actions a ladder step may take, mildest first.
pub(crate) const ACTIONS: &[&str] = &["allow", "warn", "ask", "block", "terminate"];

/// Where a host puts a warning for the model (`escalation.nudge`).
pub(crate) const NUDGE_PLACES: &[&str] = &["context", "system"];

/// A placeholder a message template may use.
#[derive(Debug)]
pub struct Placeholder {
    /// Its name, written `{name}` in a template.
    pub name: &'static str,
    /// What it stands for.
    pub doc: &'static str,
}

/// Placeholders a message template may use: the one list, which the engine's message renderer
/// fills exactly (a test there holds it to that).
pub const PLACEHOLDERS: &[Placeholder] = &[
    Placeholder {
        name: "tool",
        doc: "the tool called (`text` for assistant text)",
    },
    Placeholder {
        name: "count",
        doc: "how many times the loop repeated",
    },
    Placeholder {
        name: "detector",
        doc: "the detector (or plugin) that found it",
    },
    Placeholder {
        name: "rule",
        doc: "the deciding ladder step, `[categories.<name>/]ladders.<ladder>[<i>]`",
    },
    Placeholder {
        name: "pattern",
        doc: "what repeats, in words (`the same call`, a plugin's pattern)",
    },
    Placeholder {
        name: "category",
        doc: "the tool's category (empty when it has none)",
    },
    Placeholder {
        name: "threshold",
        doc: "the detector's threshold",
    },
    Placeholder {
        name: "window",
        doc: "the window size",
    },
    Placeholder {
        name: "file",
        doc: "the file the call is about, if any",
    },
    Placeholder {
        name: "flags",
        doc: "how many times the session was flagged before",
    },
    Placeholder {
        name: "action",
        doc: "the step's action",
    },
    Placeholder {
        name: "workers",
        doc: "the workers of a swarm that made the call (group loops; 1 otherwise)",
    },
];

/// Result maskers that can be listed in `results.mask`.
pub(crate) const MASKERS: &[&str] = &[
    "ansi",
    "timestamps",
    "uuids",
    "hex_ids",
    "pids",
    "durations",
    "counters",
    "temp_paths",
    "ids",
];

const BOOL: Kind = Kind::Bool;
const STR: Kind = Kind::Str;
const GLOB: Kind = Kind::Glob;
const REGEX: Kind = Kind::Regex;
const STRS: Kind = Kind::List(&STR);
const GLOBS: Kind = Kind::List(&GLOB);
const REGEXES: Kind = Kind::List(&REGEX);
const fn int(min: i64, max: i64) -> Kind {
    Kind::Int { min, max }
}
const COUNT: Kind = int(1, 1_000);

/// Declares a section: one row per key,
///
/// ```text
/// /// documentation (lowercase, no final period: it is the rule reference's description)
/// key: RustType = KIND, default;
/// ```
///
/// where the default is YAML text, `required`, or left out. The section comes with a new
/// struct (`pub struct Name in TABLE { … }`), fills an existing one (`Name in TABLE { … }`: a
/// struct literal, so the rows must name its fields exactly), or is only checked and
/// documented (`in TABLE { … }`, rows without types). `TABLE` is a [`Section`]: the rows
/// for the checks, the schema and the reference, and the reader. A row without a type is
/// checked and documented but not read.
macro_rules! section {
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident in $table:ident { $($rows:tt)* }
    ) => {
        section!(@rows [node defaults] { $(#[$meta])* $vis struct $name } $name $table
            [] [] [] $($rows)*);
        impl $crate::param::Param for $name {
            fn read(node: &Node) -> Option<Self> {
                ($table.read)(node)
            }

            fn absent() -> Option<Self> {
                ($table.read)($crate::param::null())
            }
        }
    };
    ($name:ident in $table:ident { $($rows:tt)* }) => {
        section!(@rows [node defaults] {} $name $table [] [] [] $($rows)*);
    };
    (in $table:ident { $($rows:tt)* }) => {
        section!(@rows [node defaults] {} () $table [] [] [] $($rows)*);
    };

    // Every row munched: the struct, if new, and the table with its reader. The reader's
    // variables are named once, above, so that the rows' reads and the reader see the same
    // names.
    (@rows $vars:tt { $(#[$meta:meta])* $vis:vis struct $new:ident } $name:ident
        $table:ident [$($fields:tt)*] [$($reads:tt)*] [$($schema:tt)*]
    ) => {
        $(#[$meta])*
        $vis struct $name {
            $($fields)*
        }
        section!(@table $vars $name $table [$($reads)*] [$($schema)*]);
    };
    (@rows $vars:tt {} $name:tt $table:ident [$($fields:tt)*] [$($reads:tt)*]
        [$($schema:tt)*]
    ) => {
        section!(@table $vars $name $table [$($reads)*] [$($schema)*]);
    };
    // A row read into a field.
    (@rows [$node:ident $defaults:ident] $head:tt $name:tt $table:ident [$($fields:tt)*]
        [$($reads:tt)*] [$($schema:tt)*]
        $(#[doc = $doc:literal])*
        $key:ident : $ty:ty = $kind:expr $(, $default:tt)?;
        $($rest:tt)*
    ) => {
        section!(@rows [$node $defaults] $head $name $table
            [$($fields)* $(#[doc = $doc])* pub $key: $ty,]
            [$($reads)* $key: $crate::param::field::<$ty>($node, $defaults, stringify!($key))?,]
            [$($schema)* field!($key, $kind, [$($doc)*] $($default)?),]
            $($rest)*
        );
    };
    // A row only checked and documented.
    (@rows $vars:tt $head:tt $name:tt $table:ident [$($fields:tt)*] [$($reads:tt)*]
        [$($schema:tt)*]
        $(#[doc = $doc:literal])*
        $key:ident = $kind:expr $(, $default:tt)?;
        $($rest:tt)*
    ) => {
        section!(@rows $vars $head $name $table
            [$($fields)*]
            [$($reads)*]
            [$($schema)* field!($key, $kind, [$($doc)*] $($default)?),]
            $($rest)*
        );
    };
    (@table $vars:tt () $table:ident [] [$($schema:tt)*]) => {
        pub(crate) const $table: Section<()> = Section {
            fields: &[$($schema)*],
            read: {
                fn read(_: &Node) -> Option<()> {
                    Some(())
                }
                read
            },
        };
    };
    (@table [$node:ident $defaults:ident] $name:ident $table:ident [$($reads:tt)*]
        [$($schema:tt)*]
    ) => {
        pub(crate) const $table: Section<$name> = Section {
            fields: &[$($schema)*],
            read: {
                fn read($node: &Node) -> Option<$name> {
                    static DEFAULTS: std::sync::OnceLock<Node> = std::sync::OnceLock::new();
                    let $defaults = $crate::param::defaults_in(&DEFAULTS, $table.fields);
                    Some($name { $($reads)* })
                }
                read
            },
        };
    };
}

/// One schema row of [`section!`].
macro_rules! field {
    ($key:ident, $kind:expr, [$($doc:literal)*] required) => {
        field!(@ $key, $kind, [$($doc)*], None, true)
    };
    ($key:ident, $kind:expr, [$($doc:literal)*] $default:tt) => {
        field!(@ $key, $kind, [$($doc)*], Some($default), false)
    };
    ($key:ident, $kind:expr, [$($doc:literal)*]) => {
        field!(@ $key, $kind, [$($doc)*], None, false)
    };
    (@ $key:ident, $kind:expr, [$($doc:literal)*], $default:expr, $required:expr) => {
        Field {
            key: $crate::param::key_of(stringify!($key)),
            kind: $kind,
            default: $default,
            required: $required,
            // Doc lines are ` text`: joined, they are the one-line description.
            doc: concat!($($doc),*).trim_ascii(),
        }
    };
}

/// A detector's parameter section: [`section!`] with the keys every detector has first.
macro_rules! detector_section {
    ($(#[$meta:meta])* $vis:vis struct $name:ident in $table:ident { $($rows:tt)* }) => {
        detector_section!(@ [$(#[$meta])* $vis struct $name in $table] $($rows)*);
    };
    ($name:ident in $table:ident { $($rows:tt)* }) => {
        detector_section!(@ [$name in $table] $($rows)*);
    };
    (@ [$($head:tt)*] $($rows:tt)*) => {
        section! {
            $($head)* {
                /// run this detector
                enabled: bool = BOOL, "true";
                /// ladder for this detector's detections (default: the category's, else
                /// `escalation.ladder`)
                ladder: Option<String> = STR;
                $($rows)*
            }
        }
    };
}

/// Declares the built-in detectors, each once, in the order the engine runs them:
///
/// ```text
/// /// what it finds (the rule reference's description)
/// Variant name: ParamsType = PARAMS_TABLE, "its loops in a message's {pattern}" [, windowed];
/// ```
///
/// (`windowed`: its count must fit in the window), then the group loop, which is not a policy
/// detector (its parameters are the `group` section). Generates [`Detector`],
/// [`DETECTOR_NAMES`], [`Detectors`] and the `detectors` section.
macro_rules! detectors {
    (
        $(
            $(#[doc = $doc:literal])*
            $variant:ident $name:ident : $ty:ty = $table:ident, $pattern:literal $(, $windowed:ident)?;
        )*
        ;
        $(#[doc = $gdoc:literal])*
        $gvariant:ident $gname:ident, $gpattern:literal;
    ) => {
        /// A built-in detector: those of the policy, in the order the engine runs them, then the
        /// group (swarm) loop.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub enum Detector {
            $($(#[doc = $doc])* $variant,)*
            $(#[doc = $gdoc])*
            $gvariant,
        }

        impl Detector {
            /// The detectors of a policy (all but the group loop), in order.
            pub const POLICY: &'static [Detector] = &[$(Detector::$variant),*];

            /// Its name in policies and verdicts (`exact_repeat`, …, `group_loop`).
            pub fn name(self) -> &'static str {
                match self {
                    $(Detector::$variant => stringify!($name),)*
                    Detector::$gvariant => stringify!($gname),
                }
            }

            /// What its loops are, in words (a message's `{pattern}`).
            pub fn pattern(self) -> &'static str {
                match self {
                    $(Detector::$variant => $pattern,)*
                    Detector::$gvariant => $gpattern,
                }
            }

            /// Whether its count must fit in the window (it counts calls kept there).
            pub fn windowed(self) -> bool {
                match self {
                    $(Detector::$variant => windowed!($($windowed)?),)*
                    Detector::$gvariant => false,
                }
            }

            /// The policy detector of that name.
            pub fn named(name: &str) -> Option<Detector> {
                Detector::POLICY.iter().copied().find(|d| d.name() == name)
            }
        }

        /// Names of the detectors of a policy, in the order the engine runs them.
        pub const DETECTOR_NAMES: &[&str] = &[$(stringify!($name)),*];

        /// Parameters of every built-in detector.
        #[derive(Clone, Debug)]
        pub struct Detectors {
            $($(#[doc = $doc])* pub $name: $ty,)*
        }

        impl Detectors {
            /// The ladder a detector names for its detections, if any (the group loop's is the
            /// `group` section's).
            pub fn ladder(&self, detector: Detector) -> Option<&str> {
                match detector {
                    $(Detector::$variant => self.$name.ladder.as_deref(),)*
                    Detector::$gvariant => None,
                }
            }

            /// Drops every detector's own ladder choice, so the category's or the global one
            /// applies.
            pub(crate) fn clear_ladders(&mut self) {
                $(self.$name.ladder = None;)*
            }
        }

        /// The `detectors` section: one section per detector.
        pub(crate) const DETECTORS: Section<Detectors> = Section {
            fields: &[$(field!($name, Kind::Section($table.fields), [$($doc)*])),*],
            read: {
                fn read(node: &Node) -> Option<Detectors> {
                    let section = |key: &str| node.get(key).unwrap_or($crate::param::null());
                    Some(Detectors {
                        $($name: ($table.read)(section(stringify!($name)))?,)*
                    })
                }
                read
            },
        };
    };
}

/// Whether a detector row says `windowed`.
macro_rules! windowed {
    (windowed) => {
        true
    };
    () => {
        false
    };
}

detectors! {
    /// same tool and canonical arguments, consecutive or within the window
    ExactRepeat exact_repeat: ExactRepeat = EXACT_REPEAT, "the same call", windowed;
    /// same tool and primary keys, with shell normalization (`cat f`, `head f` → one file read)
    FuzzyRepeat fuzzy_repeat: FuzzyRepeat = FUZZY_REPEAT, "nearly the same call", windowed;
    /// A→B→A→B and longer periods
    Cycle cycle: Cycle = CYCLE, "a cycle of calls";
    /// a failing call re-run with other calls between
    Interleaved interleaved: Interleaved = INTERLEAVED,
        "the same failing call between other calls", windowed;
    /// the same call returning the same normalized result
    NoProgress no_progress: Counted = NO_PROGRESS, "the same call with the same result", windowed;
    /// different calls producing the same error or the same empty result
    SameOutcome same_outcome: SameOutcome = SAME_OUTCOME, "different calls with the same outcome";
    /// consecutive failures of one tool
    ErrorCascade error_cascade: Counted = ERROR_CASCADE, "one tool failing again and again";
    /// consecutive failing test runs
    TestFix test_fix: TestFix = TEST_FIX, "failing test runs";
    /// assistant turns with no tool call, one after another
    Monologue monologue: Monologue = MONOLOGUE, "turns without a tool call";
    /// the same assistant turn repeated
    TextRepeat text_repeat: TextRepeat = TEXT_REPEAT, "the same text";
    /// a unit of text repeated inside one (streamed) message, outside code, tables and lists
    Chanting chanting: Chanting = CHANTING, "a repeated sentence or paragraph";
    /// a tool that does not exist called again and again
    UnknownTool unknown_tool: UnknownTool = UNKNOWN_TOOL, "a tool that does not exist";
    /// calls that do no work, one after another with nothing done between them and nothing new
    /// shown: shell commands that only look at the state of the work (`shell.state_queries`:
    /// `git status`, `git diff`, …), waits, and command lines that do nothing (`echo alive`,
    /// `pwd`, a typed `C-c`), at least two of them no wait
    Stagnation stagnation: Counted = STAGNATION, "looking at the same state again and again";
    ;
    /// one fingerprint repeated across the workers of a group (a swarm); its parameters are the
    /// policy's `group` section
    GroupLoop group_loop, "the same call across the workers of a swarm";
}

/// Names of the built-in detectors as a kind (for lists of detectors).
const DETECTOR: Kind = Kind::Enum(DETECTOR_NAMES);

detector_section! {
    /// Parameters of the `exact_repeat` detector.
    #[derive(Clone, Debug)]
    pub struct ExactRepeat in EXACT_REPEAT {
        /// the Nth identical call (same tool, same canonical arguments) is flagged
        threshold: u32 = COUNT, "3";
        /// count only back-to-back repeats instead of repeats anywhere in the window
        consecutive: bool = BOOL, "false";
        /// a repeat whose normalized result differs from the previous one is progress and restarts
        /// the count (polling, paging)
        reset_on_changed_result: bool = BOOL, "true";
    }
}

detector_section! {
    /// Parameters of the `fuzzy_repeat` detector.
    #[derive(Clone, Debug)]
    pub struct FuzzyRepeat in FUZZY_REPEAT {
        /// the Nth call with the same tool and primary keys (after shell normalization) is flagged
        threshold: u32 = COUNT, "4";
        /// a repeat whose normalized result differs from the previous one restarts the count
        reset_on_changed_result: bool = BOOL, "true";
    }
}

detector_section! {
    /// Parameters of the `cycle` detector.
    #[derive(Clone, Debug)]
    pub struct Cycle in CYCLE {
        /// shortest cycle looked for (2 = A→B→A→B)
        min_period: u32 = int(2, 10), "2";
        /// longest cycle looked for
        max_period: u32 = int(2, 10), "5";
        /// how many full turns of the cycle are flagged
        repetitions: u32 = int(2, 100), "2";
        /// wait for the first call of the next turn before flagging (A→B→A→B→A), so that a pair of
        /// steps done twice is not yet a loop; `false` flags at the end of the last full turn
        confirm: bool = BOOL, "true";
        /// a step whose normalized result differs from the same call's one turn before is
        /// progress and breaks the cycle (`false` for tools whose answers vary by themselves)
        reset_on_changed_result: bool = BOOL, "true";
    }
}

detector_section! {
    /// Parameters of the `interleaved` detector.
    #[derive(Clone, Debug)]
    pub struct Interleaved in INTERLEAVED {
        /// the Nth failing run of the same call, with other calls between, is flagged
        threshold: u32 = COUNT, "3";
        /// count only runs whose result was an error
        failures_only: bool = BOOL, "true";
    }
}

detector_section! {
    Counted in NO_PROGRESS {
        /// the Nth identical call returning the same normalized result is flagged
        threshold: u32 = COUNT, "3";
    }
}

detector_section! {
    /// Parameters of the `same_outcome` detector.
    #[derive(Clone, Debug)]
    pub struct SameOutcome in SAME_OUTCOME {
        /// the Nth different call in a row returning the same error or the same empty result is
        /// flagged
        threshold: u32 = COUNT, "3";
        /// count empty results (see `results.empty_patterns`), not only errors
        include_empty: bool = BOOL, "true";
        /// the Nth different call in a row answered with the same empty result is flagged
        /// (searching for what is not there takes a few tries)
        empty_threshold: u32 = COUNT, "5";
        /// count the same answer (of 32 words or more) from different calls too, not only errors
        /// and empty results (for tools that look: different searches with the same hits learn
        /// nothing new; an editing tool's fixed acknowledgement repeats in healthy work)
        include_success: bool = BOOL, "false";
        /// with `include_success`, the Nth different call in a row with the same answer is
        /// flagged
        success_threshold: u32 = COUNT, "4";
    }
}

detector_section! {
    Counted in ERROR_CASCADE {
        /// the Nth consecutive failure of the same tool is flagged
        threshold: u32 = COUNT, "4";
    }
}

detector_section! {
    /// Parameters of the `test_fix` detector.
    #[derive(Clone, Debug)]
    pub struct TestFix in TEST_FIX {
        /// the Nth consecutive test run failing the same way (the same error signature) is flagged
        threshold: u32 = COUNT, "5";
        /// regexes matched against shell commands to recognize test runs
        test_commands: Vec<Regex> = REGEXES,
            r#"['\b(cargo (test|nextest)|pytest|py\.test|go test|npm (run )?test|yarn test|pnpm test|bun test|deno test|dotnet test|swift test|mix test|manage\.py test|jest|vitest|mvn test|gradle test|make test|rspec|phpunit|tox|ctest|runtests)\b', '\b(python[0-9.]*|node|ruby|bun|deno)\s+(-m\s+unittest\b|\S*(test|repro)\w*\.(py|js|mjs|ts|rb)\b)']"#;
        /// tools whose every call runs tests (a harness's `run_tests`), whatever their arguments
        test_tools: Vec<NameGlob> = GLOBS,
            r#"[run_tests, run_test, runtests, run_test_suite, test, tests, pytest, "run_*_tests", "*_run_tests", "mcp__*__run_tests", "mcp__*__run_test"]"#;
    }
}

detector_section! {
    Counted in STAGNATION {
        /// the Nth idle call in a row (state queries, waits, command lines that do nothing), with no
        /// other call between them, is flagged
        threshold: u32 = COUNT, "8";
    }
}

detector_section! {
    /// Parameters of the `monologue` detector.
    #[derive(Clone, Debug)]
    pub struct Monologue in MONOLOGUE {
        /// the Nth consecutive assistant turn without a tool call is flagged
        threshold: u32 = COUNT, "6";
        /// the Nth consecutive assistant turn without a tool call is flagged sooner when the
        /// turns before it were each answered by the same automated reply: a framework's fixed
        /// prompt to go on (`Please continue on whatever approach you think is suitable`), or
        /// one failing or refusing them the same way (`exitcode: 1 … unknown language`,
        /// `Invalid or incomplete response`)
        same_reply_threshold: u32 = COUNT, "3";
        /// regexes on an automated reply (its first and last 4 KiB) that mean it rejects the
        /// turn it answers: such replies are compared by the error they name, as failures are,
        /// so a clock or a cost in one makes it no other reply
        reject_patterns: Vec<Regex> = REGEXES,
            r#"['(?i)\b(error|errors|exception|failed|failure|invalid|incomplete|unknown|unsupported|unrecognized|not (allowed|supported|recognized|found|valid|permitted)|did not|didn''t|could not|couldn''t|cannot|can''t|must|missing|no such|does not exist|doesn''t exist)\b', '(?i)^\s*exitcode: [1-9]']"#;
    }
}

detector_section! {
    /// Parameters of the `text_repeat` detector.
    #[derive(Clone, Debug)]
    pub struct TextRepeat in TEXT_REPEAT {
        /// the Nth assistant turn with the same normalized text is flagged
        threshold: u32 = COUNT, "3";
        /// turns shorter than this are ignored
        min_chars: u32 = int(1, 100_000), "12";
    }
}

detector_section! {
    /// Parameters of the `chanting` detector.
    #[derive(Clone, Debug)]
    pub struct Chanting in CHANTING {
        /// a unit repeated N times in one assistant message is flagged
        threshold: u32 = COUNT, "5";
        /// shortest repeated unit considered
        min_unit_chars: u32 = int(1, 100_000), "16";
        /// longest repeated unit considered (long paragraphs included)
        max_unit_chars: u32 = int(1, 100_000), "2000";
        /// text beyond this in one message is not scanned
        max_message_chars: u32 = int(1, 10_000_000), "200000";
    }
}

detector_section! {
    /// Parameters of the `unknown_tool` detector.
    #[derive(Clone, Debug)]
    pub struct UnknownTool in UNKNOWN_TOOL {
        /// the Nth call of a tool that does not exist is flagged
        threshold: u32 = COUNT, "2";
        /// tools the agent has; when empty, a tool is unknown once a result says so
        known_tools: Vec<NameGlob> = GLOBS, "[]";
        /// regexes on error results (their first and last 512 bytes) that mean the tool does not
        /// exist
        error_patterns: Vec<Regex> = REGEXES,
            r#"['(?i)\b(unknown|invalid|unrecognized|unsupported) tool\b', '(?i)\btool\b.{0,80}\b(not found|does not exist|is not available|not registered)', '(?i)\bno such tool\b']"#;
    }
}

section! {
    /// One step of an escalation ladder.
    #[derive(Clone, Debug, PartialEq)]
    pub struct Step in STEP {
        /// applies from the Nth detection of the same loop on (1 = when the detector first fires)
        repeat: Option<u32> = COUNT;
        /// applies once the session has already been flagged at least N times (any loop)
        flags: Option<u32> = int(0, 1_000);
        /// what the host does: `allow`, `warn` (run, nudge the model), `ask` (ask the user),
        /// `block` (refuse the call), `terminate` (stop the run)
        action: Action = Kind::Enum(ACTIONS), required;
        /// message for the model or user
        message: Option<String> = Kind::Template;
    }
}

section! {
    /// A `categories` entry as written (see [`crate::config::Category`] for what it becomes).
    #[derive(Debug)]
    pub(crate) struct CategoryParams in CATEGORY {
        /// tool names and globs (`mcp__*`) in this category; the category named `default` holds
        /// every tool not listed elsewhere
        tools: Vec<String> = GLOBS;
        /// watch these tools; `false`: their calls and results are ignored (a debugger's `next`, a
        /// job poller)
        enabled: bool = BOOL, "true";
        /// detector parameters for these tools, over the top-level `detectors`
        detectors: Node = Kind::Section(DETECTORS.fields);
        /// ladder for these tools (default: `escalation.ladder`)
        ladder: Option<String> = STR;
        /// these tools change the world (writes, edits): a successful call of one of them between
        /// two identical calls of another tool is progress and restarts that call's count
        /// (re-running tests after an edit)
        modifies: bool = BOOL, "false";
        /// these tools wait (`browser_wait_for`, `sleep`): their calls are never counted by the
        /// repeat detectors (only one that keeps showing the same thing is, by `no_progress`,
        /// at twice its threshold), and the call right after one of them polls (see
        /// `shell.wait_commands`)
        waits: bool = BOOL, "false";
    }
}

section! {
    /// One tool named in the policy's `tools` section.
    #[derive(Clone, Debug, PartialEq, Eq)]
    pub struct ToolSetting in TOOL {
        /// the tool's category, over every category's `tools` patterns (a policy that `extends`
        /// another moves a tool this way)
        category: Option<String> = STR;
        /// watch this tool; `false`: its calls and results are ignored
        enabled: bool = BOOL, "true";
        /// detectors that never fire on this tool's calls and results
        exempt: Vec<String> = Kind::List(&DETECTOR), "[]";
    }
}

section! {
    /// Argument keys of one tool (`fingerprint.tools.<name>`).
    #[derive(Clone, Debug, Default)]
    pub struct ToolKeys in TOOL_KEYS {
        /// argument keys that identify a call of this tool (replaces the global list)
        primary_keys: Option<Vec<String>> = STRS;
        /// argument keys ignored for this tool (added to the global list)
        volatile_keys: Vec<String> = STRS;
    }
}

section! {
    /// `fingerprint.canonicalize` as written (its values are fields of [`crate::config::Fingerprint`]).
    #[derive(Debug)]
    pub(crate) struct Canonicalize in CANONICALIZE {
        /// argument key order does not matter
        sort_keys: bool = BOOL, "true";
        /// runs of whitespace in string arguments count as one space; ends are trimmed
        collapse_whitespace: bool = BOOL, "true";
        /// `\` and `/` in path-like arguments are the same; `./` prefixes and doubled separators
        /// are dropped
        path_separators: bool = BOOL, "true";
        /// tool names compare without case; a tool no category lists by its name is also
        /// placed by a listed name spelled with other word breaks (`ReadFile` and `read-file`
        /// as `read_file`), and a name written in words by the snake-case name they make
        /// (`Delegate work to coworker` as `delegate_work_to_coworker`, for names and patterns)
        case_insensitive_tools: bool = BOOL, "false";
    }
}

section! {
    /// `fingerprint` as written (see [`crate::config::Fingerprint`] for what it becomes).
    #[derive(Debug)]
    pub(crate) struct FingerprintParams in FINGERPRINT {
        /// argument keys that identify a call for the fuzzy fingerprint (an edit is identified by
        /// its file and by what it replaces)
        primary_keys: Vec<String> = STRS,
            "[path, file_path, filepath, absolute_path, file, filename, command, cmd, pattern, query, q, sql, url, uri, content, offset, limit, page, page_number, page_token, cursor, line, start_line, end_line, old_string, old_str, old_text, insert_line, patch, input, action, selector, coordinate]";
        /// argument keys ignored by every fingerprint: ids and times, and the model's narration
        /// of why it makes the call (`explanation`, `thought`, `reason`, …; a shell tool's
        /// `description` too)
        volatile_keys: Vec<String> = STRS,
            "[id, request_id, requestId, call_id, tool_call_id, trace_id, span_id, nonce, timestamp, ts, time, date, progress, attempt, retry, seed, session_id, explanation, thought, thoughts, reasoning, reason, rationale, justification]";
        /// per-tool key lists, by exact tool name
        tools: BTreeMap<String, ToolKeys> = Kind::Map(&Kind::Section(TOOL_KEYS.fields)), "{}";
        /// how arguments are canonicalized before hashing
        canonicalize: Canonicalize = Kind::Section(CANONICALIZE.fields);
    }
}

section! {
    /// Shell-command normalization (`shell`).
    #[derive(Clone, Debug)]
    pub struct Shell in SHELL {
        /// tools whose calls are shell commands
        tools: Vec<NameGlob> = GLOBS,
            "[bash, sh, shell, zsh, run_shell_command, execute_bash, execute_command, exec_command, run_command, terminal, run_terminal_cmd, run_in_terminal, local_shell, container.exec, developer__shell, shell_command, exec, run_shell, execute_shell, shell_exec, run_bash, bash_command, powershell]";
        /// argument keys holding the command
        command_keys: Vec<String> = STRS, "[command, cmd, script, commands, input, keystrokes]";
        /// commands that read a file: with one file operand they collapse to one file-read key per
        /// file
        file_read_commands: Vec<String> = STRS, "[cat, head, tail, less, more, bat, nl, view]";
        /// commands that do what file tools do; their failures point the model at the file tools
        file_operation_commands: Vec<String> = STRS,
            "[cat, echo, printf, sed, awk, tee, head, tail, touch, cp, mv]";
        /// commands that wait (`sleep 30`): repeating them is not a loop; a command line that
        /// waits and then looks (`sleep 30 && gh run view 42`) polls something that changes by
        /// itself, and the repeat detectors (`exact_repeat`, `fuzzy_repeat`, `interleaved`,
        /// `no_progress`, `error_cascade`) flag it only at twice their threshold
        wait_commands: Vec<String> = STRS, "[sleep, wait, watch]";
        /// shell commands that change files or the environment (a first word, or a first word and
        /// the next word or a flag); a successful one, or a command writing to a file with `>`, is
        /// progress like a write tool's call (`edit`, `create`, `insert`: SWE-agent's editor commands)
        modify_commands: Vec<String> = STRS,
            r#"[apply_patch, patch, tee, mv, cp, rm, mkdir, touch, ln, chmod, "sed -i", "perl -i", "git apply", "git am", "git checkout", "git restore", "git switch", "git reset", "git stash", "git add", "git commit", "git merge", "git rebase", "git cherry-pick", "git revert", "git pull", "git mv", "git rm", "npm install", "npm i", "npm ci", "npm uninstall", "pnpm install", "pnpm add", "yarn add", "yarn install", "pip install", "pip3 install", "pip uninstall", "uv add", "uv pip", "poetry add", "cargo add", "cargo fix", "cargo fmt", "go get", "go mod", "go fmt", "gofmt -w", rustfmt, black, isort, "ruff format", "prettier --write", "eslint --fix", "perl -pi", "dotnet format", edit, create, insert]"#;
        /// commands that only show the state of the work (a first word, or a first word and its
        /// subcommand, found past options such as `git -C dir`): with nothing done between them,
        /// such queries in a row learn nothing new (`stagnation`); a command is one when every
        /// command of its line is
        state_queries: Vec<String> = STRS, r#"["git status", "git diff", "git ls-files"]"#;
        /// operators that make a command complex: such commands are kept verbatim
        complex_operators: Vec<String> = STRS, r#"['|', '>', '<', ';', '&&', '||', '$(', '`']"#;
    }
}

section! {
    /// A regex masked in results before they are compared, and its replacement.
    #[derive(Clone, Debug)]
    pub struct MaskPattern in MASK_PATTERN {
        /// what to mask
        regex: Regex = REGEX, required;
        /// what it is replaced with
        replace: String = STR, "'<masked>'";
    }
}

section! {
    /// What is masked before results are compared (`results`).
    #[derive(Clone, Debug)]
    pub struct Results in RESULTS {
        /// built-in maskers applied before results are compared (`counters`: `attempt 3`, `#7`,
        /// `(3/10)`; `ids`: opaque tokens of 6+ letters and digits such as `msg_01H8XK2`, and a
        /// local host's ephemeral port; `pids`: `pid 7`, a log tag's `app[2211]:`; `durations`:
        /// `45 ms`, `2 hours`, `4m55s`, and rates: `12.3 MB/s`, `9.52it/s`)
        mask: Vec<String> = Kind::List(&Kind::Enum(MASKERS)),
            "[ansi, timestamps, uuids, hex_ids, pids, durations, counters, temp_paths, ids]";
        /// extra regexes masked before results are compared
        patterns: Vec<MaskPattern> = Kind::List(&Kind::Section(MASK_PATTERN.fields)), "[]";
        /// regexes (on the masked result, when it is at most 4 KiB once trimmed: an answer that
        /// found nothing is short) that mean an empty result: nothing found, however worded and
        /// whatever it echoes of the request (every empty answer is one outcome)
        empty_patterns: Vec<Regex> = REGEXES,
            r#"['^\s*$', '^\s*(\[\s*\]|\{\s*\}|null|none)\s*$', '(?i)^\s*(no (matches|results|files|entries)( found)?|0 (matches|results)|nothing found|not found)\.?\s*$', '(?i)^\s*((no|0|zero) (match|matches|result|results|file|files|entries|documents|items|records|hits|pages|occurrences)( were| was)? found|no (matches|results) for|found (0|no|zero) (matches|results|files|entries|occurrences|documents|items|records|hits))\b[^\n]{0,240}$']"#;
        /// regexes on the start of a result (its first 512 bytes, masked) that mean the call
        /// failed, for results that carry no error flag or exit code (chat transcripts, the proxy)
        error_patterns: Vec<Regex> = REGEXES,
            r#"['(?i)^[^\n0-9]{0,120}?\b(error|fatal|exception|traceback|panic|panicked|failed|failure)\b', '(?i)^[^\n]{0,200}?\b(command not found|no such file or directory|permission denied|not recognized as|does not exist|no such (function|method|tool|endpoint|table|column|command)|unknown (command|function|tool|method|endpoint))\b', '(?i)\b(exit(ed)?( with)? (code|status)|exit_code|exitcode|returncode)"?\s*[:=]?\s*[1-9]', '(?i)^\s*<(returncode|exit_code)>\s*[1-9]', '(?i)^\W{0,3}"?(status|status_?code|http_?status)"?\s*[:=]\s*"?[45]\d\d\b', '(?i)^\s*HTTP/[0-9.]+ [45]\d\d\b', '(?i)^[^\n]{0,200}?\b((string|text|old_str|old_string|search text|search block) to replace (was )?not found|(string|text|old_str|old_string|old_text) (was )?not found in|no replacement was performed|did not appear verbatim|no sufficiently similar match|found 0 occurrences|0 occurrences found)', '(?i)^\W*the search block\b[\s\S]{0,400}?\bdoes not match anything in the file\b', '(?m)^[^\n]{0,80}\bTraceback \(most recent call last\)']"#;
        /// regexes on either end of a successful result (its first and last 512 bytes, as it
        /// came) that mean the work it looks at is still under way (a background job `running`,
        /// a rollout `in progress`): the same call made next polls it (flagged only at three
        /// times the repeat thresholds, each further step as many polls later)
        pending_patterns: Vec<Regex> = REGEXES,
            r#"['(?i)<status>\s*(running|pending|queued|in[_ -]?progress|started|starting)\s*</status>', '(?i)\bstill (running|in progress|pending|queued|processing|building|deploying|starting|executing|waiting)\b', '(?i)"(status|state|phase)"\s*:\s*"(running|pending|queued|in_progress|in-progress|processing|started|starting|waiting|creating|provisioning)"', '(?im)^\W{0,3}(status|state|phase)\s*[:=]\s*(running|pending|queued|in[_ -]?progress|processing|waiting|starting)\b', '(?i)\b(running|started|launched) in (the )?background\b', '(?i)\bwaiting for [^\n]{1,80}\bto (finish|complete|be ready|become ready|start)\b', '(?im)^process running with session id\b']"#;
        /// regexes on the start of a result (its first 512 bytes, as it came) that mean the host
        /// refused to run the call because the agent repeats it (a framework's own repeat guard,
        /// such as CrewAI's `I tried reusing the same input`, Claude Code's `Wasted call — file
        /// unchanged since your last Read` in place of a file read again, or loopguard's
        /// refusal in a recorded conversation): the call did not run, so its result is no new
        /// outcome, and the call still counts as one more attempt
        refused_patterns: Vec<Regex> = REGEXES,
            r#"['(?i)^\W*I tried reusing the same input, I must stop using this action input', '(?i)^\W*(wasted call\W+)?((the )?file (is )?)?unchanged since (your |the )?last read\b', '^\s*\[loopguard(: refused\]|\]\s*Refused\b)']"#;
        /// regexes on the end of a result (its last 512 bytes, as it came) that mean the call
        /// failed, for results that carry no error flag or exit code: the summaries test runners
        /// and builds end with (`1 failed, 11 passed`, `test result: FAILED`, `--- FAIL:`,
        /// `FAIL: name`, `FAILED (failures=1)`, `Tests: 2 failed`, `npm ERR!`, `BUILD FAILED`)
        error_tail_patterns: Vec<Regex> = REGEXES,
            r#"['(?m)^[=_ -]*[1-9]\d* (failed|errors?)\b', '(?m)^FAILED \S+::', '(?m)^test result: FAILED\b', '(?m)^error: (could not compile|test failed|aborting due to)', '(?m)^(FAIL:?|--- FAIL:)\s', '(?m)^FAILED \((failures|errors)=', '(?m)^\s*Tests?:?\s+[1-9]\d* failed\b', '(?m)^\s*[1-9]\d* failing\b', '(?m)^npm (ERR!|error) ', '(?m)^make(\[\d+\])?: \*\*\* ', '(?m)^(BUILD FAILED|FAILURE: Build failed|\[ERROR\] BUILD FAILURE)', '(?mi)^\W{0,3}(exit(ed)?( with)? (code|status)|exit_code|returncode)"?\s*[:=]?\s*[1-9]']"#;
        /// regexes on either end of a failure (its first and last 512 bytes, masked) that mean
        /// infrastructure trouble (a rate limit, a 5xx status, a dropped connection): retrying
        /// the call is not a loop until `exact_repeat` counts three times its threshold. A status is read with what says it is one (`HTTP 503`,
        /// `status: 429`, `503 Service Unavailable`), not as a bare number (`assert 503 == 200`).
        /// A refused connection is no such trouble: nothing listens there (a server the agent
        /// has not started, another port), and trying again changes nothing
        retryable_patterns: Vec<Regex> = REGEXES,
            r#"['(?i)\b(rate.?limit(ed|s)?|too many requests|service unavailable|bad gateway|gateway time-?out|overloaded|temporarily unavailable|try again later|ECONNRESET|ETIMEDOUT|connection (reset|timed out))\b', '(?i)\b(HTTP(/[0-9.]+)?|status( code)?|error( code)?|code)\W{0,3}(429|50[0234])\b']"#;
        /// only this many bytes from each end of a result are normalized and hashed
        max_bytes: usize = int(256, 16_777_216), "65536";
    }
}

section! {
    /// `window` as written (its size is [`crate::config::Config::window_size`]).
    #[derive(Debug)]
    pub(crate) struct Window in WINDOW {
        /// past calls kept per session; every detector reads only this window
        size: usize = int(2, 1_000), "30";
    }
}

section! {
    /// Event-time expiry and resets (`time`).
    #[derive(Clone, Debug)]
    pub struct Time in TIME {
        /// past calls older than this (event time) are forgotten; 0 keeps them while they are in
        /// the window
        ttl_seconds: u64 = int(0, 31_536_000), "0";
        /// a message from a person sets the calls before it aside until a repeated call's outcome
        /// shows whether it changed anything (see docs/progress.md); `false`: people's messages
        /// change no count
        reset_on_user_message: bool = BOOL, "true";
        /// sessions with no event for this long are evicted
        session_idle_seconds: u64 = int(1, 31_536_000), "3600";
    }
}

section! {
    /// How user messages change detection (`user`).
    #[derive(Clone, Debug)]
    pub struct User in USER {
        /// regexes on a user message (its first and last 4 KiB) that mean the user asks for
        /// repeated actions
        repeat_requests: Vec<Regex> = REGEXES,
            r#"['(?i)\b(\d{1,3}|twice|thrice|two|three|four|five|six|seven|eight|nine|ten|several|multiple)( more)? times\b', '(?i)\b(repeatedly|again and again|over and over|keep (running|checking|polling|trying|retrying)|every \d+ ?(s|sec|secs|seconds|m|min|minutes)|in a loop|until it (passes|succeeds|finishes|completes))\b']"#;
        /// extra repeats tolerated after such a request when it names no number (a number N allows
        /// N)
        repeat_allowance: u32 = int(0, 10_000), "10";
        /// regexes on a user message (its first and last 4 KiB) that ask the agent to retry:
        /// counts restart for good after such a message
        retry_requests: Vec<Regex> = REGEXES,
            r#"['(?i)\b(again|once more|one more time|another (try|attempt|look|go)|last try)\b', '(?i)\b(retry|re-?run|re-?try|re-?check|re-?test)\b']"#;
        /// regexes on a user-role message (its first and last 4 KiB) that mean the host or
        /// framework sent it, not a person (a "continue" prompt, an observation, a reminder):
        /// such a message changes no count
        automated_patterns: Vec<Regex> = REGEXES,
            r#"['(?i)^\W*(please\s+)?(continue|proceed|go on|keep going|carry on)(\s+(working|with the task|on the task))?\W*$', '(?i)^\W*(please\s+)?continue working on the task\b', '(?i)\byou (did not|didn''t|have not|haven''t|must|should) (call|use|invoke) (a|any) (tool|function)', '(?i)^\W*(please\s+)?use (a|the) (tool|tools|function)', '(?s)^\s*<(system-reminder|system_reminder|environment_details)>.*</(system-reminder|system_reminder|environment_details)>\s*$', '(?i)^\s*(observation|tool (output|result|response)|function (output|result))\s*:', '(?i)^\s*\[?(automated|auto-generated|system) (message|reminder|notice)\b', '(?i)^\s*background task (completed|finished|done)\W*$', '(?i)^\W*your (output|response) was not formatted correctly', '(?i)^\W*please always provide exactly one action\b', '(?i)^\W*please continue on whatever approach you think is suitable\b', '(?i)^\s*call id\s*:', '(?i)\bnow let''s retry: take care not to repeat previous errors', '(?i)^\W*now proceed and carry out this plan\W*$', '\(Open file: [^\n]*\)\s*\n\(Current directory: [^\n]*\)\s*\n\s*bash-\$\s*$', '(?i)^\s*exitcode: -?\d+ \(execution (succeeded|failed)\)', '(?i)^\s*previous response had (parsing errors|warnings)\s*:', '(?i)^\W*error!* none of the actions you just requested were performed\b', '(?i)^\W*determine (exactly one|which next) command to use\b']"#;
    }
}

section! {
    /// `escalation` as written (its values are fields of [`crate::config::Config`]).
    #[derive(Debug)]
    pub(crate) struct Escalation in ESCALATION {
        /// ladder used when neither the category nor the detector names one (the mode: e.g.
        /// `break`, `chance_then_break`)
        ladder: String = STR, "default";
        /// where a host that edits the conversation (`loopctl proxy`) puts a warning for the model:
        /// `context` appends it to the warned call's result, `system` adds a system message after
        /// it
        nudge: Nudge = Kind::Enum(NUDGE_PLACES), "context";
    }
}

section! {
    /// Group (swarm) scope: one fingerprint repeated across the sessions of a group.
    #[derive(Clone, Debug, PartialEq, Eq)]
    pub struct Group in GROUP {
        /// count fingerprints across the sessions of a group (a swarm of workers on one task)
        enabled: bool = BOOL, "true";
        /// a fingerprint seen this many times across the group is a group-wide loop
        threshold: u32 = int(2, 1_000_000), "10";
        /// only when at least this many different workers produced it
        min_workers: u32 = int(1, 10_000), "2";
        /// ladder for group-wide loops; its messages go to every worker that continues the loop
        ladder: String = STR, "group";
    }
}

section! {
    in MATCH {
        /// backend (provider) name glob, e.g. `openai`
        backend = GLOB;
        /// model name glob, e.g. `gpt-4o*`
        model = GLOB;
    }
}

section! {
    /// A `plugins` entry as written (see [`crate::config::PluginSpec`] for what it becomes).
    #[derive(Debug)]
    pub(crate) struct PluginParams in PLUGIN {
        /// shared library, relative to the policy file
        path: Spanned<String> = STR, required;
        /// name used in verdicts (default: the plugin's own)
        name: Option<String> = STR;
        /// load and run this plugin
        enabled: bool = BOOL, "true";
        /// ladder for this plugin's detections
        ladder: Option<String> = STR;
        /// configuration passed to the plugin, checked against its schema
        config: Option<Node> = Kind::Any;
    }
}

const DEFAULT_LADDERS: &str = r#"
default:
  - repeat: 1
    action: warn
    message: "Loop detected: {pattern} ({detector}, {count} times; latest call: {tool}). Stop repeating it: change the arguments, try a different tool, or explain what is blocking you."
  - repeat: 2
    action: block
    message: "Refused: the loop goes on, {pattern} ({detector}, {count} times; latest call: {tool}). The call was not run. Change your approach."
  - repeat: 3
    action: terminate
    message: "Stopped: the agent kept repeating {pattern} ({detector}, {count} times; latest call: {tool}) after being warned and refused."
break:
  - repeat: 1
    action: block
    message: "Refused: {tool} was called {count} times with the same arguments. The call was not run."
  - repeat: 3
    action: terminate
    message: "Stopped: {tool} kept being called with the same arguments ({count} times)."
chance_then_break:
  - repeat: 1
    action: warn
    message: "{tool} was called {count} times with the same arguments. A different call will go through; the same call again will be refused."
  - repeat: 2
    action: block
    message: "Refused: {tool} was called again with the same arguments ({count} times). The call was not run."
  - repeat: 4
    action: terminate
    message: "Stopped: {tool} kept being called with the same arguments ({count} times)."
group:
  - repeat: 1
    action: warn
    message: "The whole swarm is stuck on this approach: {workers} workers have made this {tool} call {count} times between them. Stop repeating it and try a different approach."
  - repeat: 3
    action: block
    message: "Refused: the swarm has made this {tool} call {count} times across {workers} workers without progress. The call was not run. Take a different approach."
  - repeat: 10
    action: terminate
    message: "Stopped: the swarm kept repeating this {tool} call ({count} times across {workers} workers) after being warned and refused."
"#;

// Sections that an `overrides` entry may change (everything but metadata, extends and plugins).
section! {
    in OVERRIDE {
        /// which requests this override applies to; absent keys match anything
        r#match = Kind::Section(MATCH.fields);
        /// see `window`
        window = Kind::Section(WINDOW.fields);
        /// see `time`
        time = Kind::Section(TIME.fields);
        /// see `escalation`
        escalation = Kind::Section(ESCALATION.fields);
        /// see `user`
        user = Kind::Section(USER.fields);
        /// see `ladders`
        ladders = Kind::Map(&Kind::List(&Kind::Section(STEP.fields)));
        /// see `categories`
        categories = Kind::Map(&Kind::Section(CATEGORY.fields));
        /// see `tools`
        tools = Kind::Map(&Kind::Section(TOOL.fields));
        /// see `detectors`
        detectors = Kind::Section(DETECTORS.fields);
        /// see `fingerprint`
        fingerprint = Kind::Section(FINGERPRINT.fields);
        /// see `shell`
        shell = Kind::Section(SHELL.fields);
        /// see `results`
        results = Kind::Section(RESULTS.fields);
        /// see `group`
        group = Kind::Section(GROUP.fields);
    }
}

section! {
    /// A whole policy file as written (see [`crate::config::Config`] for what it becomes).
    #[derive(Debug)]
    pub(crate) struct PolicyParams in POLICY {
        /// policy format version; this build knows `1`
        version = int(1, 1_000_000), required;
        /// policy name shown in reports (default: the file name)
        name: Option<String> = STR;
        /// what this policy is for
        description: String = STR, "''";
        /// another policy file (relative to this one) whose settings this file overrides
        extends = STR;
        /// the bounded history every detector reads
        window: Window = Kind::Section(WINDOW.fields);
        /// event-time expiry and resets
        time: Time = Kind::Section(TIME.fields);
        /// how detections become actions
        escalation: Escalation = Kind::Section(ESCALATION.fields);
        /// how user messages change detection
        user: User = Kind::Section(USER.fields);
        /// named escalation ladders (`default`, `break` and `chance_then_break` are built in; a
        /// ladder of the same name replaces them): steps in ascending order, the last step that
        /// applies is taken
        ladders: BTreeMap<String, Ladder> = Kind::Map(&Kind::List(&Kind::Section(STEP.fields))),
            DEFAULT_LADDERS;
        /// named groups of tools with their own thresholds and ladder
        categories: Ordered<CategoryParams> = Kind::Map(&Kind::Section(CATEGORY.fields)), "{}";
        /// single tools, by exact name: their category, switched off, or exempt from chosen
        /// detectors
        tools: BTreeMap<String, ToolSetting> = Kind::Map(&Kind::Section(TOOL.fields)), "{}";
        /// the built-in detectors
        detectors: Node = Kind::Section(DETECTORS.fields);
        /// which arguments identify a call
        fingerprint: FingerprintParams = Kind::Section(FINGERPRINT.fields);
        /// shell-command normalization
        shell: Shell = Kind::Section(SHELL.fields);
        /// what is masked before results are compared
        results: Results = Kind::Section(RESULTS.fields);
        /// group (swarm) scope: loops spread across the sessions of one group
        group: Group = Kind::Section(GROUP.fields);
        /// settings applied over the above for matching backends and models, in order
        overrides = Kind::List(&Kind::Section(OVERRIDE.fields)), "[]";
        /// detector plugins loaded from shared libraries
        plugins: Vec<Spanned<PluginParams>> = Kind::List(&Kind::Section(PLUGIN.fields)), "[]";
    }
}

/// A human name of a kind, for "expected X" messages and the reference.
pub(crate) fn kind_name(kind: &Kind) -> String {
    match kind {
        Kind::Bool => "boolean".into(),
        Kind::Int { .. } => "integer".into(),
        Kind::Str => "string".into(),
        Kind::Enum(words) => words.join(" \\| "),
        Kind::Regex => "regex".into(),
        Kind::Glob => "glob".into(),
        Kind::Template => "template".into(),
        Kind::List(inner) => format!("list of {}", kind_name(inner)),
        Kind::Section(_) => "mapping".into(),
        Kind::Map(inner) => format!("map of name → {}", kind_name(inner)),
        Kind::Any => "any".into(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use std::path::Path;

    use super::*;
    use crate::Policy;
    use crate::config::Config;

    fn config(yaml: &str) -> Config {
        let loaded = Policy::load_text(Path::new("t.yaml"), yaml.to_owned());
        assert!(!loaded.has_errors(), "{:?}", loaded.diagnostics);
        loaded.policy.unwrap().base().clone()
    }

    /// A row whose Rust type cannot hold its kind or its default fails to read: the declared
    /// defaults alone must read into a whole configuration.
    #[test]
    fn the_declared_defaults_read_into_a_configuration() {
        let defaults = crate::policy::defaults();
        let config = Config::from_node(defaults).expect("the defaults read");
        assert_eq!(config.window_size, 30);
        assert_eq!(config.ladder, "default");
        assert_eq!(config.group.ladder, "group");
        assert_eq!(config.detectors.chanting.max_message_chars, 200_000);
        assert_eq!(config.results.mask.len(), MASKERS.len());
        // Each section also reads from nothing at all, by its own defaults.
        assert!(
            (STEP.read)(crate::param::null()).is_none(),
            "`action` is required"
        );
        assert!((TOOL.read)(crate::param::null()).is_some());
        assert!((DETECTORS.read)(crate::param::null()).is_some());
    }

    #[test]
    fn each_detector_is_declared_once_with_its_section() {
        let names: Vec<&str> = Detector::POLICY.iter().map(|d| d.name()).collect();
        assert_eq!(names, DETECTOR_NAMES);
        let keys: Vec<&str> = DETECTORS.fields.iter().map(|f| f.key).collect();
        assert_eq!(keys, DETECTOR_NAMES);
        for d in Detector::POLICY {
            assert_eq!(Detector::named(d.name()), Some(*d));
            assert!(!d.pattern().is_empty());
        }
        assert_eq!(Detector::GroupLoop.name(), "group_loop");
        assert_eq!(Detector::named("group_loop"), None);
        let windowed: Vec<&str> = Detector::POLICY
            .iter()
            .filter(|d| d.windowed())
            .map(|d| d.name())
            .collect();
        assert_eq!(
            windowed,
            ["exact_repeat", "fuzzy_repeat", "interleaved", "no_progress"]
        );
    }

    #[test]
    fn a_detector_names_its_own_ladder() {
        let c = config("version: 1\ndetectors:\n  cycle: { ladder: break }\n");
        assert_eq!(c.detectors.ladder(Detector::Cycle), Some("break"));
        assert_eq!(c.detectors.ladder(Detector::ExactRepeat), None);
        assert_eq!(c.detectors.ladder(Detector::GroupLoop), None);
    }

    // Regression: entries of lists and maps (`results.patterns`, `categories`, `tools`) are not
    // merged over the declared defaults, and their absent keys were read as empty or zero: a
    // mask pattern without `replace` replaced with nothing instead of the declared `<masked>`.
    #[test]
    fn absent_keys_of_list_and_map_entries_take_their_declared_defaults() {
        let c = config(
            "version: 1\nresults:\n  patterns:\n    - { regex: 'id-\\d+' }\n    - { regex: x, replace: y }\ncategories:\n  reads: { tools: [read] }\ntools:\n  bash: { exempt: [cycle] }\n",
        );
        let replaced: Vec<&str> = c
            .results
            .patterns
            .iter()
            .map(|p| p.replace.as_str())
            .collect();
        assert_eq!(replaced, ["<masked>", "y"]);
        let reads = &c.categories[0];
        assert!(reads.enabled && !reads.modifies);
        // A category without `detectors` has the top-level ones, not the declared defaults.
        assert_eq!(reads.detectors.exact_repeat.threshold, 3);
        let bash = &c.tools["bash"];
        assert!(bash.enabled);
        assert_eq!(bash.exempt, ["cycle"]);
    }

    // Regression: a section written as null (`detectors: ~`, `window:` with nothing after it)
    // was read as an empty mapping, so every value in it was zero or false (no detector ran).
    #[test]
    fn a_null_section_takes_its_declared_defaults() {
        let c = config("version: 1\nwindow: ~\ndetectors: ~\ntime:\n");
        assert_eq!(c.window_size, 30);
        assert!(c.detectors.exact_repeat.enabled);
        assert_eq!(c.detectors.exact_repeat.threshold, 3);
        assert_eq!(c.time.session_idle_seconds, 3600);
    }

    #[test]
    fn a_category_reads_its_detectors_over_the_top_level_ones() {
        let c = config(
            "version: 1\ndetectors:\n  cycle: { max_period: 7 }\ncategories:\n  s:\n    tools: [bash]\n    detectors: { cycle: { repetitions: 3 } }\n",
        );
        let cycle = &c.categories[0].detectors.cycle;
        assert_eq!((cycle.max_period, cycle.repetitions), (7, 3));
    }
}
