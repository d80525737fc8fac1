//! Checks a node tree against the parameter declarations: unknown keys, wrong types, values out
//! of range, invalid regexes, globs and templates. Every problem is collected.

use crate::diagnostic::{Diagnostic, did_you_mean};
use crate::node::{Node, Value};
use crate::schema::{Field, Kind, PLACEHOLDERS, kind_name};

/// Largest compiled size accepted for one regex, so a hostile pattern cannot eat memory.
pub(crate) const REGEX_SIZE_LIMIT: usize = 1 << 20;
/// Largest compiled size (of the regexes' automata, in bytes) accepted for all the regexes of
/// one policy, the files it extends included: each regex is bounded by [`REGEX_SIZE_LIMIT`],
/// and this bounds how many such regexes a policy may hold, so a policy cannot take minutes and
/// gigabytes to compile.
pub(crate) const REGEX_TOTAL_LIMIT: usize = 4 << 20;
/// Longest tool-name glob accepted, in bytes.
pub(crate) const GLOB_MAX_LEN: usize = 1024;
/// Most wildcards (`*`, `?`, `[`, `{`) accepted in one glob.
pub(crate) const GLOB_MAX_WILDCARDS: usize = 64;
/// Most globs (patterns with glob syntax; plain names do not count) one policy may hold, the
/// files it extends included: each is compiled into an automaton, so a policy cannot take
/// seconds to load by listing thousands.
pub(crate) const GLOB_TOTAL_LIMIT: usize = 512;
/// Largest compiled size accepted for one glob's automaton; globs within the length and
/// wildcard limits stay far below it.
const GLOB_SIZE_LIMIT: usize = 1 << 20;

/// Compiles a policy regex with the limits every user of policy regexes applies.
pub(crate) fn compile_regex(pattern: &str) -> Result<regex::Regex, regex::Error> {
    regex::RegexBuilder::new(pattern)
        .size_limit(REGEX_SIZE_LIMIT)
        .dfa_size_limit(REGEX_SIZE_LIMIT)
        .build()
}

/// A glob that was not compiled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum GlobError {
    /// Not a glob: an unclosed bracket, say.
    Invalid(String),
    /// Over [`GLOB_MAX_LEN`] or [`GLOB_MAX_WILDCARDS`], or an automaton too large.
    TooComplex(String),
}

impl std::fmt::Display for GlobError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GlobError::Invalid(m) | GlobError::TooComplex(m) => f.write_str(m),
        }
    }
}

/// A compiled name pattern (a tool, a backend, a model): a name without glob syntax is
/// compared as a string, anything else matched by its glob's automaton. Policies list many
/// plain names, and a string comparison costs nothing to build.
#[derive(Clone, Debug)]
pub enum NameGlob {
    /// A plain name, matched by equality.
    Literal(Box<str>),
    /// A pattern with glob syntax.
    Glob(globset::GlobMatcher),
}

impl NameGlob {
    /// Whether `name` matches.
    pub fn is_match(&self, name: &str) -> bool {
        match self {
            NameGlob::Literal(l) => **l == *name,
            NameGlob::Glob(g) => g.is_match(name),
        }
    }

    /// The pattern as written.
    pub fn pattern(&self) -> &str {
        match self {
            NameGlob::Literal(l) => l,
            NameGlob::Glob(g) => g.glob().glob(),
        }
    }
}

/// Whether `pattern` holds glob syntax (anything other than a plain name).
pub(crate) fn has_glob_syntax(pattern: &str) -> bool {
    pattern.contains(['*', '?', '[', ']', '{', '}', ',', '\\'])
}

/// Compiles a tool-name glob, refusing one over the length and wildcard limits before it
/// reaches `globset` (which panics when the automaton of a glob is too large).
pub(crate) fn compile_glob(pattern: &str) -> Result<NameGlob, GlobError> {
    if pattern.len() > GLOB_MAX_LEN {
        return Err(GlobError::TooComplex(format!(
            "longer than {GLOB_MAX_LEN} bytes"
        )));
    }
    if !has_glob_syntax(pattern) {
        return Ok(NameGlob::Literal(pattern.into()));
    }
    let wildcards = pattern
        .bytes()
        .filter(|b| matches!(b, b'*' | b'?' | b'[' | b'{'))
        .count();
    if wildcards > GLOB_MAX_WILDCARDS {
        return Err(GlobError::TooComplex(format!(
            "more than {GLOB_MAX_WILDCARDS} wildcards"
        )));
    }
    let glob = globset::GlobBuilder::new(pattern)
        .literal_separator(false)
        .build()
        .map_err(|e| GlobError::Invalid(e.kind().to_string()))?;
    // The automaton is built here first, with a limit and an error instead of a panic.
    if wildcards > 0 {
        let config = regex_automata::nfa::thompson::Config::new()
            .nfa_size_limit(Some(GLOB_SIZE_LIMIT))
            .which_captures(regex_automata::nfa::thompson::WhichCaptures::None);
        regex_automata::nfa::thompson::Compiler::new()
            .syntax(regex_automata::util::syntax::Config::new().utf8(false))
            .configure(config)
            .build(glob.regex())
            .map_err(|e| GlobError::TooComplex(format!("its automaton is too large: {e}")))?;
    }
    Ok(NameGlob::Glob(glob.compile_matcher()))
}

/// What the regexes of one policy (its extended files included) may still use of
/// [`REGEX_TOTAL_LIMIT`].
#[derive(Debug)]
pub(crate) struct Budget {
    regex_left: usize,
    /// The regex that went over the budget was reported.
    regex_reported: bool,
    /// How many more globs the policy may hold ([`GLOB_TOTAL_LIMIT`]).
    globs_left: usize,
    /// The glob that went over the budget was reported.
    glob_reported: bool,
}

impl Default for Budget {
    fn default() -> Self {
        Budget {
            regex_left: REGEX_TOTAL_LIMIT,
            regex_reported: false,
            globs_left: GLOB_TOTAL_LIMIT,
            glob_reported: false,
        }
    }
}

/// Size of the automaton `pattern` compiles to, built with at most `limit` bytes: the same
/// automaton `regex` builds (and bounds by its size limit) before searching. The error says
/// whether the limit was what stopped it.
fn regex_size(pattern: &str, limit: usize) -> Result<usize, OverLimit> {
    let config = regex_automata::nfa::thompson::Config::new().nfa_size_limit(Some(limit));
    regex_automata::nfa::thompson::Compiler::new()
        .configure(config)
        .build(pattern)
        .map(|nfa| nfa.memory_usage())
        .map_err(|e| OverLimit(e.size_limit().is_some()))
}

/// Why [`regex_size`] failed: over its limit (`true`), or not a valid regex (`false`).
struct OverLimit(bool);

/// Checks one regex of the policy against its own limit and what is left of the policy's
/// budget.
fn check_regex(
    node: &Node,
    pattern: &str,
    path: &str,
    out: &mut Vec<Diagnostic>,
    budget: &mut Budget,
) {
    if budget.regex_reported {
        return; // the policy is refused already; the rest is not compiled
    }
    let limit = REGEX_SIZE_LIMIT.min(budget.regex_left);
    let over_budget = match regex_size(pattern, limit) {
        Ok(size) => {
            budget.regex_left = budget.regex_left.saturating_sub(size);
            false
        }
        Err(OverLimit(over)) => over && limit < REGEX_SIZE_LIMIT,
    };
    if over_budget {
        budget.regex_reported = true;
        out.push(
            Diagnostic::error(
                "too-complex",
                node.span,
                format!("the policy's regexes are too large together{}", in_path(path)),
            )
            .with_label(format!(
                "over the {REGEX_TOTAL_LIMIT}-byte limit for all regexes of a policy"
            ))
            .with_help(format!(
                "the regexes of a policy (its extended files included) may compile to {REGEX_TOTAL_LIMIT} bytes in all; \
                 this one and the ones after it are over: use fewer or simpler regexes (`\\w{{20}}` is large, `[a-z]{{20}}` small)"
            )),
        );
        return;
    }
    if let Err(e) = compile_regex(pattern) {
        out.push(
            Diagnostic::error(
                "invalid-regex",
                node.span,
                format!("invalid regex{}", in_path(path)),
            )
            .with_label(first_line_of_regex_error(&e))
            .with_help("regexes use Rust `regex` syntax; escape special characters with `\\`"),
        );
    }
}

/// Checks one glob of the policy: valid, and within the limits of one glob.
fn check_glob(node: &Node, s: &str, path: &str, out: &mut Vec<Diagnostic>) {
    match compile_glob(s) {
            Ok(_) => {}
            Err(GlobError::Invalid(e)) => out.push(
                Diagnostic::error(
                    "invalid-glob",
                    node.span,
                    format!("invalid glob `{s}`{}", in_path(path)),
                )
                .with_label(e)
                .with_help("globs use `*`, `?`, `[abc]` and `{a,b}`; close every bracket and brace"),
            ),
            Err(GlobError::TooComplex(e)) => out.push(
                Diagnostic::error(
                    "too-complex",
                    node.span,
                    format!("glob too long or complex{}", in_path(path)),
                )
                .with_label(e)
                .with_help(format!(
                    "a glob may be {GLOB_MAX_LEN} bytes long with {GLOB_MAX_WILDCARDS} wildcards (`*`, `?`, `[`, `{{`); list tool names instead"
                )),
            ),
        }
}

/// Checks a mapping against the fields of a section.
pub(crate) fn check_section(
    node: &Node,
    fields: &'static [Field],
    path: &str,
    out: &mut Vec<Diagnostic>,
    budget: &mut Budget,
) {
    let entries = match &node.value {
        Value::Map(entries) => entries.as_slice(),
        Value::Null => &[],
        other => {
            out.push(type_error(node, path, "a mapping", other));
            return;
        }
    };
    for (key, value) in entries {
        let Some(name) = key.as_str() else {
            out.push(
                Diagnostic::error(
                    "invalid-key",
                    key.span,
                    format!("key `{}` is not a name", key.scalar_text()),
                )
                .with_label("expected a name")
                .with_help("keys are plain words such as `threshold`"),
            );
            continue;
        };
        let child_path = join(path, name);
        match fields.iter().find(|f| f.key == name) {
            Some(field) => check_value(value, &field.kind, &child_path, out, budget),
            None => {
                let mut diag = Diagnostic::error(
                    "unknown-key",
                    key.span,
                    format!("unknown key `{name}`{}", in_path(path)),
                )
                .with_label("not a known key");
                diag = match did_you_mean(name, fields.iter().map(|f| f.key)) {
                    Some(near) => diag.with_help(format!("did you mean `{near}`?")),
                    None => diag.with_help(format!(
                        "known keys here: {}",
                        fields
                            .iter()
                            .map(|f| format!("`{}`", f.key))
                            .collect::<Vec<_>>()
                            .join(", ")
                    )),
                };
                out.push(diag);
            }
        }
    }
    for field in fields.iter().filter(|f| f.required) {
        if !entries.iter().any(|(k, _)| k.as_str() == Some(field.key)) {
            out.push(
                Diagnostic::error(
                    "missing-key",
                    node.span,
                    format!("missing required key `{}`{}", field.key, in_path(path)),
                )
                .with_label("in this mapping")
                .with_help(format!("add `{}`: {}", field.key, field.doc)),
            );
        }
    }
}

/// Checks one value against its declared kind.
pub(crate) fn check_value(
    node: &Node,
    kind: &'static Kind,
    path: &str,
    out: &mut Vec<Diagnostic>,
    budget: &mut Budget,
) {
    match (kind, &node.value) {
        (Kind::Any, _) => {}
        (Kind::Bool, Value::Bool(_)) => {}
        (Kind::Int { min, max }, Value::Int(i)) => {
            if i < min || i > max {
                out.push(range_error(node, path, *i as f64, *min as f64, *max as f64));
            }
        }
        (Kind::Str, Value::Str(_)) => {}
        (Kind::Enum(words), Value::Str(s)) => {
            if !words.contains(&s.as_str()) {
                let what = if path.ends_with("action") {
                    "action"
                } else {
                    "value"
                };
                let mut diag = Diagnostic::error(
                    "unknown-value",
                    node.span,
                    format!("unknown {what} `{s}`{}", in_path(path)),
                )
                .with_label(format!("not one of {}", words.join(", ")));
                diag = match did_you_mean(s, words.iter().copied()) {
                    Some(near) => diag.with_help(format!("did you mean `{near}`?")),
                    None => diag.with_help(format!("use one of: {}", words.join(", "))),
                };
                out.push(diag);
            }
        }
        (Kind::Regex, Value::Str(s)) => check_regex(node, s, path, out, budget),
        (Kind::Glob, Value::Str(s)) if has_glob_syntax(s) && budget.globs_left == 0 => {
            if !budget.glob_reported {
                budget.glob_reported = true;
                out.push(
                    Diagnostic::error(
                        "too-complex",
                        node.span,
                        format!("too many globs in the policy{}", in_path(path)),
                    )
                    .with_label(format!("over the limit of {GLOB_TOTAL_LIMIT} globs per policy"))
                    .with_help(format!(
                        "a policy (its extended files included) may hold {GLOB_TOTAL_LIMIT} patterns with `*`, `?`, `[` or `{{`; plain names are not counted: list tool names, or join globs with `{{a,b}}`"
                    )),
                );
            }
        }
        (Kind::Glob, Value::Str(s)) => {
            budget.globs_left -= usize::from(has_glob_syntax(s));
            check_glob(node, s, path, out);
        }
        (Kind::Template, Value::Str(s)) => check_template(node, s, path, out),
        (Kind::List(inner), Value::Seq(items)) => {
            for (i, item) in items.iter().enumerate() {
                check_value(item, inner, &format!("{path}[{i}]"), out, budget);
            }
        }
        (Kind::List(_), Value::Null) => {}
        (Kind::Section(fields), Value::Map(_) | Value::Null) => {
            check_section(node, fields, path, out, budget)
        }
        (Kind::Map(inner), Value::Map(entries)) => {
            for (key, value) in entries {
                match key.as_str() {
                    Some(name) => check_value(value, inner, &join(path, name), out, budget),
                    None => out.push(
                        Diagnostic::error(
                            "invalid-key",
                            key.span,
                            format!("name `{}` must be a string", key.scalar_text()),
                        )
                        .with_label("expected a name")
                        .with_help("quote it to make it a string"),
                    ),
                }
            }
        }
        (Kind::Map(_), Value::Null) => {}
        (kind, found) => {
            let mut diag = type_error(node, path, &with_article(&kind_name(kind)), found);
            if let (Kind::Int { .. } | Kind::Bool, Value::Str(text)) = (kind, found) {
                // Quotes are the mistake only when the text inside is a value of the kind.
                let t = text.trim();
                let unquoted = match kind {
                    Kind::Int { .. } => t.parse::<i64>().is_ok(),
                    _ => matches!(t, "true" | "false"),
                };
                diag = diag.with_help(match (unquoted, kind) {
                    (true, _) => "remove the quotes",
                    (false, Kind::Bool) => "write `true` or `false`, without quotes",
                    (false, _) => "write the number in digits, without quotes",
                });
            } else if matches!(kind, Kind::List(_)) && !matches!(found, Value::Map(_)) {
                diag = diag.with_help("write a list: `[a, b]` or one `- item` per line");
            } else if matches!(
                kind,
                Kind::Str | Kind::Glob | Kind::Regex | Kind::Template | Kind::Enum(_)
            ) && !matches!(found, Value::Seq(_) | Value::Map(_))
            {
                diag = diag.with_help("quote the value to make it a string");
            }
            out.push(diag);
        }
    }
}

fn check_template(node: &Node, text: &str, path: &str, out: &mut Vec<Diagnostic>) {
    let mut rest = text;
    while let Some(open) = rest.find('{') {
        if rest[open..].starts_with("{{") {
            rest = &rest[open + 2..];
            continue;
        }
        let Some(close) = rest[open..].find('}') else {
            out.push(
                Diagnostic::error(
                    "invalid-template",
                    node.span,
                    format!("unclosed `{{` in message template{}", in_path(path)),
                )
                .with_label("this template")
                .with_help("close the placeholder with `}`, or write `{{` for a literal brace"),
            );
            return;
        };
        let name = &rest[open + 1..open + close];
        if !PLACEHOLDERS.iter().any(|p| p.name == name) {
            let mut diag = Diagnostic::error(
                "unknown-placeholder",
                node.span,
                format!(
                    "unknown placeholder `{{{name}}}` in message template{}",
                    in_path(path)
                ),
            )
            .with_label(format!("`{{{name}}}` is not a placeholder"))
            .with_focus(format!("{{{name}}}"));
            diag = match did_you_mean(name, PLACEHOLDERS.iter().map(|p| p.name)) {
                Some(near) => diag.with_help(format!("did you mean `{{{near}}}`?")),
                None => diag.with_help(format!("placeholders: {}", placeholder_list())),
            };
            out.push(diag);
        }
        rest = &rest[open + close + 1..];
    }
}

/// Every placeholder, as a template writes it: `{tool} {count} …`.
pub(crate) fn placeholder_list() -> String {
    PLACEHOLDERS
        .iter()
        .map(|p| format!("{{{}}}", p.name))
        .collect::<Vec<_>>()
        .join(" ")
}

fn first_line_of_regex_error(e: &regex::Error) -> String {
    let text = e.to_string();
    text.lines()
        .rev()
        .find(|l| l.starts_with("error:"))
        .map(|l| l.trim_start_matches("error:").trim().to_owned())
        .unwrap_or(text)
}

fn with_article(noun: &str) -> String {
    if noun.starts_with(['a', 'e', 'i', 'o', 'u']) {
        format!("an {noun}")
    } else {
        format!("a {noun}")
    }
}

fn type_error(node: &Node, path: &str, expected: &str, found: &Value) -> Diagnostic {
    Diagnostic::error(
        "wrong-type",
        node.span,
        format!(
            "expected {expected}{}, found {}",
            for_path(path),
            found.type_name()
        ),
    )
    .with_label(format!("expected {expected}"))
}

fn range_error(node: &Node, path: &str, value: f64, min: f64, max: f64) -> Diagnostic {
    let code = if value <= 0.0 && min > 0.0 {
        "non-positive"
    } else {
        "out-of-range"
    };
    let message = if code == "non-positive" {
        format!("`{path}` must be positive, found {value}")
    } else {
        format!("`{path}` is out of range: {value}")
    };
    let help = if max >= 1e15 || max == i64::MAX as f64 {
        format!("use a value of at least {min}")
    } else {
        format!("use a value from {min} to {max}")
    };
    Diagnostic::error(code, node.span, message)
        .with_label(format!("must be from {min} to {max}"))
        .with_help(help)
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_owned()
    } else {
        format!("{path}.{key}")
    }
}

fn in_path(path: &str) -> String {
    if path.is_empty() {
        String::new()
    } else {
        format!(" in `{path}`")
    }
}

fn for_path(path: &str) -> String {
    if path.is_empty() {
        String::new()
    } else {
        format!(" for `{path}`")
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    /// `globset` panics when a glob's automaton is too large; the limits come first.
    #[test]
    fn globs_over_the_limits_are_errors_not_panics() {
        let at_limit = format!("{}{}", "*a".repeat(GLOB_MAX_WILDCARDS), "b".repeat(896));
        assert_eq!(at_limit.len(), GLOB_MAX_LEN);
        assert!(
            compile_glob(&at_limit)
                .unwrap()
                .is_match(&("a".repeat(64) + &"b".repeat(896)))
        );
        let too_many = "*a".repeat(GLOB_MAX_WILDCARDS + 1);
        assert!(matches!(
            compile_glob(&too_many),
            Err(GlobError::TooComplex(_))
        ));
        let too_long = "a".repeat(GLOB_MAX_LEN + 1);
        assert!(matches!(
            compile_glob(&too_long),
            Err(GlobError::TooComplex(_))
        ));
        assert!(matches!(
            compile_glob(&"*a".repeat(75_000)),
            Err(GlobError::TooComplex(_))
        ));
        for odd in [
            "[".repeat(64),
            "{a,b}".repeat(64),
            "{".repeat(2) + "a}}",
            "[!a-z][^0-9]**?".repeat(12),
            "{a,b,c,d,e,f,g,h,i,j,k,l,m,n,o,p,q,r,s,t,u,v,w,x,y,z}".repeat(19),
        ] {
            let _ = compile_glob(&odd);
        }
    }

    #[test]
    fn the_regex_budget_is_shared_and_reported_once() {
        let node = crate::policy::parse_default("'\\w{20}x'");
        let mut out = Vec::new();
        let mut budget = Budget::default();
        for _ in 0..100 {
            check_value(&node, &Kind::Regex, "p", &mut out, &mut budget);
        }
        assert_eq!(out.len(), 1, "{out:?}");
        assert_eq!(out[0].code, "too-complex");
        assert!(out[0].help.as_deref().unwrap().contains("4194304 bytes"));
        // Small regexes stay far inside it.
        let node = crate::policy::parse_default("'(?i)error|failed'");
        let (mut out, mut budget) = (Vec::new(), Budget::default());
        for _ in 0..1000 {
            check_value(&node, &Kind::Regex, "p", &mut out, &mut budget);
        }
        assert!(out.is_empty(), "{out:?}");
    }
}
