//! The one declaration of every policy parameter.
//!
//! Each key is declared once here with its type, default and documentation. The defaults the
//! engine runs with, the "unknown key, did you mean" suggestions, the JSON Schema printed by
//! `loopctl schema` and the rule reference (docs/reference.md) are all derived from these tables.

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

const fn f(
    key: &'static str,
    kind: Kind,
    default: Option<&'static str>,
    doc: &'static str,
) -> Field {
    Field {
        key,
        kind,
        default,
        required: false,
        doc,
    }
}

const fn req(key: &'static str, kind: Kind, doc: &'static str) -> Field {
    Field {
        key,
        kind,
        default: None,
        required: true,
        doc,
    }
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

/// Names of the built-in detectors, in the order the engine runs them.
pub const DETECTOR_NAMES: &[&str] = &[
    "exact_repeat",
    "fuzzy_repeat",
    "cycle",
    "interleaved",
    "no_progress",
    "same_outcome",
    "error_cascade",
    "test_fix",
    "monologue",
    "text_repeat",
    "chanting",
    "unknown_tool",
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

const ENABLED: Field = f("enabled", BOOL, Some("true"), "run this detector");
const LADDER: Field = f(
    "ladder",
    STR,
    None,
    "ladder for this detector's detections (default: the category's, else `escalation.ladder`)",
);

macro_rules! detector {
    ($name:ident, [$($extra:expr),* $(,)?]) => {
        const $name: &[Field] = &[ENABLED, LADDER, $($extra),*];
    };
}

detector!(
    EXACT_REPEAT,
    [
        f(
            "threshold",
            COUNT,
            Some("3"),
            "the Nth identical call (same tool, same canonical arguments) is flagged"
        ),
        f(
            "consecutive",
            BOOL,
            Some("false"),
            "count only back-to-back repeats instead of repeats anywhere in the window"
        ),
        f(
            "reset_on_changed_result",
            BOOL,
            Some("true"),
            "a repeat whose normalized result differs from the previous one is progress and restarts the count (polling, paging)"
        ),
    ]
);
detector!(
    FUZZY_REPEAT,
    [
        f(
            "threshold",
            COUNT,
            Some("4"),
            "the Nth call with the same tool and primary keys (after shell normalization) is flagged"
        ),
        f(
            "reset_on_changed_result",
            BOOL,
            Some("true"),
            "a repeat whose normalized result differs from the previous one restarts the count"
        ),
    ]
);
detector!(
    CYCLE,
    [
        f(
            "min_period",
            int(2, 10),
            Some("2"),
            "shortest cycle looked for (2 = A→B→A→B)"
        ),
        f(
            "max_period",
            int(2, 10),
            Some("5"),
            "longest cycle looked for"
        ),
        f(
            "repetitions",
            int(2, 100),
            Some("2"),
            "how many full turns of the cycle are flagged"
        ),
        f(
            "confirm",
            BOOL,
            Some("true"),
            "wait for the first call of the next turn before flagging (A→B→A→B→A), so that a pair of steps done twice is not yet a loop; `false` flags at the end of the last full turn"
        ),
    ]
);
detector!(
    INTERLEAVED,
    [
        f(
            "threshold",
            COUNT,
            Some("3"),
            "the Nth failing run of the same call, with other calls between, is flagged"
        ),
        f(
            "failures_only",
            BOOL,
            Some("true"),
            "count only runs whose result was an error"
        ),
    ]
);
detector!(
    NO_PROGRESS,
    [f(
        "threshold",
        COUNT,
        Some("3"),
        "the Nth identical call returning the same normalized result is flagged"
    ),]
);
detector!(
    SAME_OUTCOME,
    [
        f(
            "threshold",
            COUNT,
            Some("3"),
            "the Nth different call in a row returning the same error or the same empty result is flagged"
        ),
        f(
            "include_empty",
            BOOL,
            Some("true"),
            "count empty results (see `results.empty_patterns`), not only errors"
        ),
    ]
);
detector!(
    ERROR_CASCADE,
    [f(
        "threshold",
        COUNT,
        Some("4"),
        "the Nth consecutive failure of the same tool is flagged"
    ),]
);
detector!(
    TEST_FIX,
    [
        f(
            "threshold",
            COUNT,
            Some("5"),
            "the Nth consecutive test run failing the same way (the same error signature) is flagged"
        ),
        f(
            "test_commands",
            REGEXES,
            Some(
                r#"['\b(cargo (test|nextest)|pytest|py\.test|go test|npm (run )?test|yarn test|pnpm test|jest|vitest|mvn test|gradle test|make test|rspec|phpunit|tox|ctest)\b']"#
            ),
            "regexes matched against shell commands to recognize test runs"
        ),
    ]
);
detector!(
    MONOLOGUE,
    [f(
        "threshold",
        COUNT,
        Some("6"),
        "the Nth consecutive assistant turn without a tool call is flagged"
    ),]
);
detector!(
    TEXT_REPEAT,
    [
        f(
            "threshold",
            COUNT,
            Some("3"),
            "the Nth assistant turn with the same normalized text is flagged"
        ),
        f(
            "min_chars",
            int(1, 100_000),
            Some("12"),
            "turns shorter than this are ignored"
        ),
    ]
);
detector!(
    CHANTING,
    [
        f(
            "threshold",
            COUNT,
            Some("5"),
            "a unit repeated N times in one assistant message is flagged"
        ),
        f(
            "min_unit_chars",
            int(1, 100_000),
            Some("16"),
            "shortest repeated unit considered"
        ),
        f(
            "max_unit_chars",
            int(1, 100_000),
            Some("2000"),
            "longest repeated unit considered (long paragraphs included)"
        ),
        f(
            "max_message_chars",
            int(1, 10_000_000),
            Some("200000"),
            "text beyond this in one message is not scanned"
        ),
    ]
);
detector!(
    UNKNOWN_TOOL,
    [
        f(
            "threshold",
            COUNT,
            Some("2"),
            "the Nth call of a tool that does not exist is flagged"
        ),
        f(
            "known_tools",
            GLOBS,
            Some("[]"),
            "tools the agent has; when empty, a tool is unknown once a result says so"
        ),
        f(
            "error_patterns",
            REGEXES,
            Some(
                r#"['(?i)\b(unknown|invalid|unrecognized|unsupported) tool\b', '(?i)\btool\b.{0,80}\b(not found|does not exist|is not available|not registered)', '(?i)\bno such tool\b']"#
            ),
            "regexes on error results that mean the tool does not exist"
        ),
    ]
);

/// Every detector, with its parameters.
pub(crate) const DETECTORS: &[Field] = &[
    f(
        "exact_repeat",
        Kind::Section(EXACT_REPEAT),
        None,
        "same tool and canonical arguments, consecutive or within the window",
    ),
    f(
        "fuzzy_repeat",
        Kind::Section(FUZZY_REPEAT),
        None,
        "same tool and primary keys, with shell normalization (`cat f`, `head f` → one file read)",
    ),
    f(
        "cycle",
        Kind::Section(CYCLE),
        None,
        "A→B→A→B and longer periods",
    ),
    f(
        "interleaved",
        Kind::Section(INTERLEAVED),
        None,
        "a failing call re-run with other calls between",
    ),
    f(
        "no_progress",
        Kind::Section(NO_PROGRESS),
        None,
        "the same call returning the same normalized result",
    ),
    f(
        "same_outcome",
        Kind::Section(SAME_OUTCOME),
        None,
        "different calls producing the same error or the same empty result",
    ),
    f(
        "error_cascade",
        Kind::Section(ERROR_CASCADE),
        None,
        "consecutive failures of one tool",
    ),
    f(
        "test_fix",
        Kind::Section(TEST_FIX),
        None,
        "consecutive failing test runs",
    ),
    f(
        "monologue",
        Kind::Section(MONOLOGUE),
        None,
        "assistant turns with no tool call, one after another",
    ),
    f(
        "text_repeat",
        Kind::Section(TEXT_REPEAT),
        None,
        "the same assistant turn repeated",
    ),
    f(
        "chanting",
        Kind::Section(CHANTING),
        None,
        "a unit of text repeated inside one (streamed) message, outside code, tables and lists",
    ),
    f(
        "unknown_tool",
        Kind::Section(UNKNOWN_TOOL),
        None,
        "a tool that does not exist called again and again",
    ),
];

const STEP: &[Field] = &[
    f(
        "repeat",
        COUNT,
        None,
        "applies from the Nth detection of the same loop on (1 = when the detector first fires)",
    ),
    f(
        "flags",
        int(0, 1_000),
        None,
        "applies once the session has already been flagged at least N times (any loop)",
    ),
    req(
        "action",
        Kind::Enum(ACTIONS),
        "what the host does: `allow`, `warn` (run, nudge the model), `ask` (ask the user), `block` (refuse the call), `terminate` (stop the run)",
    ),
    f(
        "message",
        Kind::Template,
        None,
        "message for the model or user",
    ),
];

const CATEGORY: &[Field] = &[
    f(
        "tools",
        GLOBS,
        None,
        "tool names and globs (`mcp__*`) in this category; the category named `default` holds every tool not listed elsewhere",
    ),
    f(
        "enabled",
        BOOL,
        Some("true"),
        "watch these tools; `false`: their calls and results are ignored (a debugger's `next`, a job poller)",
    ),
    f(
        "detectors",
        Kind::Section(DETECTORS),
        None,
        "detector parameters for these tools, over the top-level `detectors`",
    ),
    f(
        "ladder",
        STR,
        None,
        "ladder for these tools (default: `escalation.ladder`)",
    ),
    f(
        "modifies",
        BOOL,
        Some("false"),
        "these tools change the world (writes, edits): a successful call of one of them between two identical calls of another tool is progress and restarts that call's count (re-running tests after an edit)",
    ),
];

/// Names of the built-in detectors as a kind (for lists of detectors).
const DETECTOR: Kind = Kind::Enum(DETECTOR_NAMES);

const TOOL: &[Field] = &[
    f(
        "category",
        STR,
        None,
        "the tool's category, over every category's `tools` patterns (a policy that `extends` another moves a tool this way)",
    ),
    f(
        "enabled",
        BOOL,
        Some("true"),
        "watch this tool; `false`: its calls and results are ignored",
    ),
    f(
        "exempt",
        Kind::List(&DETECTOR),
        Some("[]"),
        "detectors that never fire on this tool's calls and results",
    ),
];

const TOOL_KEYS: &[Field] = &[
    f(
        "primary_keys",
        STRS,
        None,
        "argument keys that identify a call of this tool (replaces the global list)",
    ),
    f(
        "volatile_keys",
        STRS,
        None,
        "argument keys ignored for this tool (added to the global list)",
    ),
];

const CANONICALIZE: &[Field] = &[
    f(
        "sort_keys",
        BOOL,
        Some("true"),
        "argument key order does not matter",
    ),
    f(
        "collapse_whitespace",
        BOOL,
        Some("true"),
        "runs of whitespace in string arguments count as one space; ends are trimmed",
    ),
    f(
        "path_separators",
        BOOL,
        Some("true"),
        "`\\` and `/` in path-like arguments are the same; `./` prefixes and doubled separators are dropped",
    ),
    f(
        "case_insensitive_tools",
        BOOL,
        Some("false"),
        "tool names compare without case",
    ),
];

const FINGERPRINT: &[Field] = &[
    f(
        "primary_keys",
        STRS,
        Some(
            "[path, file_path, filepath, absolute_path, file, filename, command, cmd, pattern, query, q, sql, url, uri, content, offset, limit, line, start_line, end_line, old_string, old_str, old_text, insert_line, patch, input, action, selector, coordinate]",
        ),
        "argument keys that identify a call for the fuzzy fingerprint (an edit is identified by its file and by what it replaces)",
    ),
    f(
        "volatile_keys",
        STRS,
        Some(
            "[id, request_id, requestId, call_id, tool_call_id, trace_id, span_id, nonce, timestamp, ts, time, date, progress, attempt, retry, seed, session_id]",
        ),
        "argument keys ignored by every fingerprint",
    ),
    f(
        "tools",
        Kind::Map(&Kind::Section(TOOL_KEYS)),
        Some("{}"),
        "per-tool key lists, by exact tool name",
    ),
    f(
        "canonicalize",
        Kind::Section(CANONICALIZE),
        None,
        "how arguments are canonicalized before hashing",
    ),
];

const SHELL: &[Field] = &[
    f(
        "tools",
        GLOBS,
        Some(
            "[bash, sh, shell, zsh, run_shell_command, execute_bash, execute_command, exec_command, run_command, terminal, run_terminal_cmd, run_in_terminal, local_shell, container.exec]",
        ),
        "tools whose calls are shell commands",
    ),
    f(
        "command_keys",
        STRS,
        Some("[command, cmd, script, commands, input]"),
        "argument keys holding the command",
    ),
    f(
        "file_read_commands",
        STRS,
        Some("[cat, head, tail, less, more, bat, nl, view]"),
        "commands that read a file: with one file operand they collapse to one file-read key per file",
    ),
    f(
        "file_operation_commands",
        STRS,
        Some("[cat, echo, printf, sed, awk, tee, head, tail, touch, cp, mv]"),
        "commands that do what file tools do; their failures point the model at the file tools",
    ),
    f(
        "wait_commands",
        STRS,
        Some("[sleep, wait, timeout, watch]"),
        "commands that wait (`sleep 30`): repeating them is not a loop",
    ),
    f(
        "modify_commands",
        STRS,
        Some(
            r#"[apply_patch, patch, tee, mv, cp, rm, mkdir, touch, ln, chmod, "sed -i", "perl -i", "git apply", "git am", "git checkout", "git restore", "git switch", "git reset", "git stash", "git commit", "git merge", "git rebase", "git cherry-pick", "git revert", "git pull", "git mv", "git rm", "npm install", "npm i", "npm ci", "npm uninstall", "pnpm install", "pnpm add", "yarn add", "yarn install", "pip install", "pip3 install", "pip uninstall", "uv add", "uv pip", "poetry add", "cargo add", "cargo fix", "cargo fmt", "go get", "go mod"]"#,
        ),
        "shell commands that change files or the environment (a first word, or a first word and the next word or a flag); a successful one, or a command writing to a file with `>`, is progress like a write tool's call",
    ),
    f(
        "complex_operators",
        STRS,
        Some(r#"['|', '>', '<', ';', '&&', '||', '$(', '`']"#),
        "operators that make a command complex: such commands are kept verbatim",
    ),
];

const MASK_PATTERN: &[Field] = &[
    req("regex", REGEX, "what to mask"),
    f(
        "replace",
        STR,
        Some("'<masked>'"),
        "what it is replaced with",
    ),
];

const RESULTS: &[Field] = &[
    f(
        "mask",
        Kind::List(&Kind::Enum(MASKERS)),
        Some("[ansi, timestamps, uuids, hex_ids, pids, durations, counters, temp_paths, ids]"),
        "built-in maskers applied before results are compared (`counters`: `attempt 3`, `#7`, `(3/10)`; `ids`: opaque tokens of 6+ letters and digits such as `msg_01H8XK2`)",
    ),
    f(
        "patterns",
        Kind::List(&Kind::Section(MASK_PATTERN)),
        Some("[]"),
        "extra regexes masked before results are compared",
    ),
    f(
        "empty_patterns",
        REGEXES,
        Some(
            r#"['^\s*$', '^\s*(\[\s*\]|\{\s*\}|null|none)\s*$', '(?i)^\s*(no (matches|results|files|entries)( found)?|0 (matches|results)|nothing found|not found)\.?\s*$']"#,
        ),
        "regexes (on the masked result) that mean an empty result",
    ),
    f(
        "error_patterns",
        REGEXES,
        Some(
            r#"['(?i)^[^\n0-9]{0,120}?\b(error|fatal|exception|traceback|panic|panicked|failed|failure)\b', '(?i)^[^\n]{0,200}?\b(command not found|no such file or directory|permission denied|not recognized as|does not exist|no such (function|method|tool|endpoint|table|column|command)|unknown (command|function|tool|method|endpoint))\b', '(?i)\b(exit(ed)?( with)? (code|status)|exit_code|exitcode|returncode)"?\s*[:=]?\s*[1-9]', '(?i)^\W{0,3}"?(status|status_?code|http_?status)"?\s*[:=]\s*"?[45]\d\d\b', '(?i)^\s*HTTP/[0-9.]+ [45]\d\d\b']"#,
        ),
        "regexes on the start of a result (its first 512 bytes, masked) that mean the call failed, for results that carry no error flag or exit code (chat transcripts, the proxy)",
    ),
    f(
        "retryable_patterns",
        REGEXES,
        Some(
            r#"['(?i)\b(rate.?limit|too many requests|429|50[0234]|service unavailable|bad gateway|gateway time-?out|overloaded|temporarily unavailable|try again later|ECONNRESET|ETIMEDOUT|connection (reset|refused))\b']"#,
        ),
        "errors that are infrastructure trouble: retrying them is not a loop",
    ),
    f(
        "max_bytes",
        int(256, 16_777_216),
        Some("65536"),
        "only this many bytes from each end of a result are normalized and hashed",
    ),
];

const WINDOW: &[Field] = &[f(
    "size",
    int(2, 1_000),
    Some("30"),
    "past calls kept per session; every detector reads only this window",
)];

const TIME: &[Field] = &[
    f(
        "ttl_seconds",
        int(0, 31_536_000),
        Some("0"),
        "past calls older than this (event time) are forgotten; 0 keeps them while they are in the window",
    ),
    f(
        "reset_on_user_message",
        BOOL,
        Some("true"),
        "a message from a person sets the calls before it aside until a repeated call's outcome shows whether it changed anything (see docs/progress.md); `false`: people's messages change no count",
    ),
    f(
        "session_idle_seconds",
        int(1, 31_536_000),
        Some("3600"),
        "sessions with no event for this long are evicted",
    ),
];

const USER: &[Field] = &[
    f(
        "repeat_requests",
        REGEXES,
        Some(
            r#"['(?i)\b(\d{1,3}|twice|thrice|two|three|four|five|six|seven|eight|nine|ten|several|multiple)( more)? times\b', '(?i)\b(repeatedly|again and again|over and over|keep (running|checking|polling|trying|retrying)|every \d+ ?(s|sec|secs|seconds|m|min|minutes)|in a loop|until it (passes|succeeds|finishes|completes))\b']"#,
        ),
        "regexes on a user message that mean the user asks for repeated actions",
    ),
    f(
        "repeat_allowance",
        int(0, 10_000),
        Some("10"),
        "extra repeats tolerated after such a request when it names no number (a number N allows N)",
    ),
    f(
        "retry_requests",
        REGEXES,
        Some(
            r#"['(?i)\b(again|once more|one more time|another (try|attempt|look|go)|last try)\b', '(?i)\b(retry|re-?run|re-?try|re-?check|re-?test)\b']"#,
        ),
        "regexes on a user message that ask the agent to retry: counts restart for good after such a message",
    ),
    f(
        "automated_patterns",
        REGEXES,
        Some(
            r#"['(?i)^\W*(please\s+)?(continue|proceed|go on|keep going|carry on)(\s+(working|with the task|on the task))?\W*$', '(?i)^\W*(please\s+)?continue working on the task\b', '(?i)\byou (did not|didn''t|have not|haven''t|must|should) (call|use|invoke) (a|any) (tool|function)', '(?i)^\W*(please\s+)?use (a|the) (tool|tools|function)', '(?s)^\s*<(system-reminder|system_reminder|environment_details)>.*</(system-reminder|system_reminder|environment_details)>\s*$', '(?i)^\s*(observation|tool (output|result|response)|function (output|result))\s*:', '(?i)^\s*\[?(automated|auto-generated|system) (message|reminder|notice)\b', '(?i)^\s*background task (completed|finished|done)\W*$', '(?i)^\W*your (output|response) was not formatted correctly']"#,
        ),
        "regexes on a user-role message that mean the host or framework sent it, not a person (a \"continue\" prompt, an observation, a reminder): such a message changes no count",
    ),
];

const ESCALATION: &[Field] = &[
    f(
        "ladder",
        STR,
        Some("default"),
        "ladder used when neither the category nor the detector names one (the mode: e.g. `break`, `chance_then_break`)",
    ),
    f(
        "nudge",
        Kind::Enum(NUDGE_PLACES),
        Some("context"),
        "where a host that edits the conversation (`loopctl proxy`) puts a warning for the model: `context` appends it to the warned call's result, `system` adds a system message after it",
    ),
];

const GROUP: &[Field] = &[
    f(
        "enabled",
        BOOL,
        Some("true"),
        "count fingerprints across the sessions of a group (a swarm of workers on one task)",
    ),
    f(
        "threshold",
        int(2, 1_000_000),
        Some("10"),
        "a fingerprint seen this many times across the group is a group-wide loop",
    ),
    f(
        "min_workers",
        int(1, 10_000),
        Some("2"),
        "only when at least this many different workers produced it",
    ),
    f(
        "ladder",
        STR,
        Some("group"),
        "ladder for group-wide loops; its messages go to every worker that continues the loop",
    ),
];

const MATCH: &[Field] = &[
    f(
        "backend",
        GLOB,
        None,
        "backend (provider) name glob, e.g. `openai`",
    ),
    f("model", GLOB, None, "model name glob, e.g. `gpt-4o*`"),
];

const PLUGIN: &[Field] = &[
    req("path", STR, "shared library, relative to the policy file"),
    f(
        "name",
        STR,
        None,
        "name used in verdicts (default: the plugin's own)",
    ),
    f("enabled", BOOL, Some("true"), "load and run this plugin"),
    f("ladder", STR, None, "ladder for this plugin's detections"),
    f(
        "config",
        Kind::Any,
        None,
        "configuration passed to the plugin, checked against its schema",
    ),
];

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

/// Sections that a `overrides` entry may change (everything but metadata, extends and plugins).
const OVERRIDE: &[Field] = &[
    f(
        "match",
        Kind::Section(MATCH),
        None,
        "which requests this override applies to; absent keys match anything",
    ),
    f("window", Kind::Section(WINDOW), None, "see `window`"),
    f("time", Kind::Section(TIME), None, "see `time`"),
    f(
        "escalation",
        Kind::Section(ESCALATION),
        None,
        "see `escalation`",
    ),
    f("user", Kind::Section(USER), None, "see `user`"),
    f(
        "ladders",
        Kind::Map(&Kind::List(&Kind::Section(STEP))),
        None,
        "see `ladders`",
    ),
    f(
        "categories",
        Kind::Map(&Kind::Section(CATEGORY)),
        None,
        "see `categories`",
    ),
    f(
        "tools",
        Kind::Map(&Kind::Section(TOOL)),
        None,
        "see `tools`",
    ),
    f(
        "detectors",
        Kind::Section(DETECTORS),
        None,
        "see `detectors`",
    ),
    f(
        "fingerprint",
        Kind::Section(FINGERPRINT),
        None,
        "see `fingerprint`",
    ),
    f("shell", Kind::Section(SHELL), None, "see `shell`"),
    f("results", Kind::Section(RESULTS), None, "see `results`"),
    f("group", Kind::Section(GROUP), None, "see `group`"),
];

/// The top level of a policy file.
pub(crate) const POLICY: &[Field] = &[
    req(
        "version",
        int(1, 1_000_000),
        "policy format version; this build knows `1`",
    ),
    f(
        "name",
        STR,
        None,
        "policy name shown in reports (default: the file name)",
    ),
    f("description", STR, Some("''"), "what this policy is for"),
    f(
        "extends",
        STR,
        None,
        "another policy file (relative to this one) whose settings this file overrides",
    ),
    f(
        "window",
        Kind::Section(WINDOW),
        None,
        "the bounded history every detector reads",
    ),
    f(
        "time",
        Kind::Section(TIME),
        None,
        "event-time expiry and resets",
    ),
    f(
        "escalation",
        Kind::Section(ESCALATION),
        None,
        "how detections become actions",
    ),
    f(
        "user",
        Kind::Section(USER),
        None,
        "how user messages change detection",
    ),
    f(
        "ladders",
        Kind::Map(&Kind::List(&Kind::Section(STEP))),
        Some(DEFAULT_LADDERS),
        "named escalation ladders (`default`, `break` and `chance_then_break` are built in; a ladder of the same name replaces them): steps in ascending order, the last step that applies is taken",
    ),
    f(
        "categories",
        Kind::Map(&Kind::Section(CATEGORY)),
        Some("{}"),
        "named groups of tools with their own thresholds and ladder",
    ),
    f(
        "tools",
        Kind::Map(&Kind::Section(TOOL)),
        Some("{}"),
        "single tools, by exact name: their category, switched off, or exempt from chosen detectors",
    ),
    f(
        "detectors",
        Kind::Section(DETECTORS),
        None,
        "the built-in detectors",
    ),
    f(
        "fingerprint",
        Kind::Section(FINGERPRINT),
        None,
        "which arguments identify a call",
    ),
    f(
        "shell",
        Kind::Section(SHELL),
        None,
        "shell-command normalization",
    ),
    f(
        "results",
        Kind::Section(RESULTS),
        None,
        "what is masked before results are compared",
    ),
    f(
        "group",
        Kind::Section(GROUP),
        None,
        "group (swarm) scope: loops spread across the sessions of one group",
    ),
    f(
        "overrides",
        Kind::List(&Kind::Section(OVERRIDE)),
        Some("[]"),
        "settings applied over the above for matching backends and models, in order",
    ),
    f(
        "plugins",
        Kind::List(&Kind::Section(PLUGIN)),
        Some("[]"),
        "detector plugins loaded from shared libraries",
    ),
];

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
