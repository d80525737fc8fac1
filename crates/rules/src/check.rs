//! Checks a node tree against the parameter declarations: unknown keys, wrong types, values out
//! of range, invalid regexes, globs and templates. Every problem is collected.

use crate::diagnostic::{Diagnostic, did_you_mean};
use crate::node::{Node, Value};
use crate::schema::{Field, Kind, PLACEHOLDERS, kind_name};

/// Largest compiled size accepted for one regex, so a hostile pattern cannot eat memory.
pub const REGEX_SIZE_LIMIT: usize = 1 << 20;

/// Compiles a policy regex with the limits every user of policy regexes applies.
pub fn compile_regex(pattern: &str) -> Result<regex::Regex, regex::Error> {
    regex::RegexBuilder::new(pattern)
        .size_limit(REGEX_SIZE_LIMIT)
        .dfa_size_limit(REGEX_SIZE_LIMIT)
        .build()
}

/// Compiles a tool-name glob.
pub fn compile_glob(pattern: &str) -> Result<globset::GlobMatcher, globset::Error> {
    globset::GlobBuilder::new(pattern)
        .literal_separator(false)
        .build()
        .map(|g| g.compile_matcher())
}

/// Checks a mapping against the fields of a section.
pub fn check_section(node: &Node, fields: &'static [Field], path: &str, out: &mut Vec<Diagnostic>) {
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
            Some(field) => check_value(value, &field.kind, &child_path, out),
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
pub fn check_value(node: &Node, kind: &'static Kind, path: &str, out: &mut Vec<Diagnostic>) {
    match (kind, &node.value) {
        (Kind::Any, _) => {}
        (Kind::Bool, Value::Bool(_)) => {}
        (Kind::Int { min, max }, Value::Int(i)) => {
            if i < min || i > max {
                out.push(range_error(node, path, *i as f64, *min as f64, *max as f64));
            }
        }
        (Kind::Float { min, max }, Value::Int(i)) => {
            if (*i as f64) < *min || (*i as f64) > *max {
                out.push(range_error(node, path, *i as f64, *min, *max));
            }
        }
        (Kind::Float { min, max }, Value::Float(x)) => {
            if x < min || x > max || x.is_nan() {
                out.push(range_error(node, path, *x, *min, *max));
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
        (Kind::Regex, Value::Str(s)) => {
            if let Err(e) = compile_regex(s) {
                out.push(
                    Diagnostic::error(
                        "invalid-regex",
                        node.span,
                        format!("invalid regex{}", in_path(path)),
                    )
                    .with_label(first_line_of_regex_error(&e))
                    .with_help(
                        "regexes use Rust `regex` syntax; escape special characters with `\\`",
                    ),
                );
            }
        }
        (Kind::Glob, Value::Str(s)) => {
            if let Err(e) = compile_glob(s) {
                out.push(
                    Diagnostic::error(
                        "invalid-glob",
                        node.span,
                        format!("invalid glob `{s}`{}", in_path(path)),
                    )
                    .with_label(e.kind().to_string())
                    .with_help(
                        "globs use `*`, `?`, `[abc]` and `{a,b}`; close every bracket and brace",
                    ),
                );
            }
        }
        (Kind::Template, Value::Str(s)) => check_template(node, s, path, out),
        (Kind::List(inner), Value::Seq(items)) => {
            for (i, item) in items.iter().enumerate() {
                check_value(item, inner, &format!("{path}[{i}]"), out);
            }
        }
        (Kind::List(_), Value::Null) => {}
        (Kind::Section(fields), Value::Map(_) | Value::Null) => {
            check_section(node, fields, path, out)
        }
        (Kind::Map(inner), Value::Map(entries)) => {
            for (key, value) in entries {
                match key.as_str() {
                    Some(name) => check_value(value, inner, &join(path, name), out),
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
            if matches!(kind, Kind::Int { .. } | Kind::Float { .. } | Kind::Bool)
                && matches!(found, Value::Str(_))
            {
                diag = diag.with_help("remove the quotes");
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
        if !PLACEHOLDERS.contains(&name) {
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
            diag = match did_you_mean(name, PLACEHOLDERS.iter().copied()) {
                Some(near) => diag.with_help(format!("did you mean `{{{near}}}`?")),
                None => diag.with_help(format!(
                    "placeholders: {}",
                    PLACEHOLDERS
                        .iter()
                        .map(|p| format!("{{{p}}}"))
                        .collect::<Vec<_>>()
                        .join(" ")
                )),
            };
            out.push(diag);
        }
        rest = &rest[open + close + 1..];
    }
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
