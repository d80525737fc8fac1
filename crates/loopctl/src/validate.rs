//! `loopctl validate`: load policies and report every diagnostic.

use std::path::{Path, PathBuf};

use loopguard_engine::PluginLoadError;
use loopguard_rules::{Diagnostic, Policy, Severity};

use crate::{EXIT_CANNOT_RUN, EXIT_INVALID, EXIT_OK, ErrorFormat};

/// Expands directories into their policy files (sorted, recursive).
fn expand(paths: &[PathBuf], missing: &mut Vec<(PathBuf, String)>) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for path in paths {
        if path.is_dir() {
            let mut found = Vec::new();
            collect_yaml(path, &mut found, missing);
            if found.is_empty() {
                missing.push((path.clone(), "directory holds no .yaml or .yml file".into()));
            }
            found.sort();
            files.extend(found);
        } else {
            files.push(path.clone());
        }
    }
    files
}

fn collect_yaml(dir: &Path, out: &mut Vec<PathBuf>, missing: &mut Vec<(PathBuf, String)>) {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) => {
            missing.push((dir.to_path_buf(), e.to_string()));
            return;
        }
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            collect_yaml(&path, out, missing);
        } else if path.extension().is_some_and(|e| e == "yaml" || e == "yml") {
            out.push(path);
        }
    }
}

/// Whether `validate` loads the plugins a valid policy names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Plugins {
    /// Load them (running their code) and report those that fail.
    Load,
    /// Leave them alone (`--no-plugins`): an untrusted policy runs no code.
    Skip,
}

impl Plugins {
    pub fn from_flag(no_plugins: bool) -> Plugins {
        if no_plugins {
            Plugins::Skip
        } else {
            Plugins::Load
        }
    }
}

pub fn run(
    paths: &[PathBuf],
    format: ErrorFormat,
    deny_warnings: bool,
    tools: &[String],
    plugins: Plugins,
) -> u8 {
    let mut unreadable = Vec::new();
    let files = expand(paths, &mut unreadable);
    let (mut errors, mut warnings) = (0usize, 0usize);
    let mut json_diags = Vec::new();
    let mut checked = 0usize;
    let mut explained = Vec::new();

    for file in &files {
        let loaded = match Policy::load(file) {
            Ok(l) => l,
            Err(e) => {
                unreadable.push((file.clone(), e.to_string()));
                continue;
            }
        };
        checked += 1;
        // A valid policy's plugins must load too (unless told not to load them): the file
        // exists, speaks this ABI, and accepts its `config`.
        let plugin_diags: Vec<Diagnostic> = match &loaded.policy {
            Some(_) if plugins == Plugins::Skip => Vec::new(),
            Some(policy) => match loopguard_engine::load_plugins(policy) {
                Ok(_) => Vec::new(),
                Err(errors) => errors.iter().map(PluginLoadError::diagnostic).collect(),
            },
            None => Vec::new(),
        };
        if let Some(policy) = &loaded.policy {
            let config = policy.resolve(None, None);
            for tool in tools {
                let placed = explain_tool(&config, tool);
                match format {
                    ErrorFormat::Human => crate::emit(&format!(
                        "{}: tool `{tool}`: {}\n",
                        file.display(),
                        placed.line
                    )),
                    ErrorFormat::Json => {
                        let mut v = placed.json;
                        if let serde_json::Value::Object(m) = &mut v {
                            m.insert("file".into(), file.display().to_string().into());
                        }
                        explained.push(v);
                    }
                }
            }
        }
        for diag in loaded.diagnostics.iter().chain(&plugin_diags) {
            match diag.severity {
                Severity::Error => errors += 1,
                Severity::Warning => warnings += 1,
            }
            match format {
                ErrorFormat::Human => eprintln!("{}", loaded.sources.render(diag)),
                ErrorFormat::Json => json_diags.push(loaded.sources.to_json(diag)),
            }
        }
    }

    let invalid = errors > 0 || (deny_warnings && warnings > 0);
    let code = if !unreadable.is_empty() {
        EXIT_CANNOT_RUN
    } else if invalid {
        EXIT_INVALID
    } else {
        EXIT_OK
    };
    match format {
        ErrorFormat::Human => {
            for (path, why) in &unreadable {
                eprintln!("error: cannot read `{}`: {why}", path.display());
            }
            let verdict = if code == EXIT_OK { "valid" } else { "invalid" };
            eprintln!(
                "{checked} file{} checked: {errors} error{}, {warnings} warning{}{} — {verdict}",
                plural(checked),
                plural(errors),
                plural(warnings),
                if deny_warnings && warnings > 0 {
                    " (warnings denied)"
                } else {
                    ""
                },
            );
        }
        ErrorFormat::Json => {
            let report = serde_json::json!({
                "valid": code == EXIT_OK,
                "files": checked,
                "errors": errors,
                "warnings": warnings,
                "unreadable": unreadable.iter().map(|(p, why)| serde_json::json!({
                    "file": p.display().to_string(), "message": why,
                })).collect::<Vec<_>>(),
                "diagnostics": json_diags,
                "tools": explained,
            });
            crate::emit(&format!("{report}\n"));
        }
    }
    code
}

/// How a policy treats one tool, as a line and as JSON.
struct Explained {
    line: String,
    json: serde_json::Value,
}

/// Where `tool` lands in `config` (its category and why), whether it is watched, and what it
/// is exempt from: what the engine decides once per tool name.
fn explain_tool(config: &loopguard_rules::Config, tool: &str) -> Explained {
    use loopguard_rules::config::PlacementReason;
    let lookup = if config.fingerprint.case_insensitive_tools {
        tool.to_lowercase()
    } else {
        tool.to_owned()
    };
    let placed = config.place_tool(&lookup);
    let category = placed.category.map(|c| c.name.as_str());
    let (why, pattern) = match &placed.reason {
        PlacementReason::Named => {
            // The pattern it would have matched otherwise, if any.
            let over = config
                .categories
                .iter()
                .filter(|c| Some(c.name.as_str()) != category && c.name != "default")
                .find_map(|c| {
                    c.matchers
                        .iter()
                        .position(|m| m.is_match(&lookup))
                        .map(|i| (c.name.as_str(), c.tools.get(i).map_or("", String::as_str)))
                });
            match over {
                Some((c, p)) => (
                    format!(
                        "named by `tools.{tool}.category`, over pattern `{p}` of category `{c}`"
                    ),
                    None,
                ),
                None => (format!("named by `tools.{tool}.category`"), None),
            }
        }
        PlacementReason::Pattern(p) => (format!("matches pattern `{p}`"), Some(*p)),
        PlacementReason::Default => ("listed nowhere: the `default` category".to_owned(), None),
        PlacementReason::None => (
            "listed nowhere, and there is no `default` category: the top-level settings".to_owned(),
            None,
        ),
    };
    let watched = placed.enabled();
    let exempt: Vec<&str> = placed
        .setting
        .map(|t| t.exempt.iter().map(String::as_str).collect())
        .unwrap_or_default();
    let mut line = match category {
        Some(c) => format!("category `{c}` ({why})"),
        None => format!("no category ({why})"),
    };
    if !watched {
        let by = if placed.setting.is_some_and(|t| !t.enabled) {
            format!("`tools.{tool}.enabled: false`")
        } else {
            format!("`categories.{}.enabled: false`", category.unwrap_or(""))
        };
        line.push_str(&format!("; ignored ({by})"));
    } else if !exempt.is_empty() {
        line.push_str(&format!("; exempt from {}", exempt.join(", ")));
    }
    Explained {
        line,
        json: serde_json::json!({
            "tool": tool,
            "category": category,
            "reason": match placed.reason {
                PlacementReason::Named => "tools",
                PlacementReason::Pattern(_) => "pattern",
                PlacementReason::Default => "default",
                PlacementReason::None => "none",
            },
            "pattern": pattern,
            "watched": watched,
            "exempt": exempt,
        }),
    }
}

fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}
