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

pub fn run(paths: &[PathBuf], format: ErrorFormat, deny_warnings: bool) -> u8 {
    let mut unreadable = Vec::new();
    let files = expand(paths, &mut unreadable);
    let (mut errors, mut warnings) = (0usize, 0usize);
    let mut json_diags = Vec::new();
    let mut checked = 0usize;

    for file in &files {
        let loaded = match Policy::load(file) {
            Ok(l) => l,
            Err(e) => {
                unreadable.push((file.clone(), e.to_string()));
                continue;
            }
        };
        checked += 1;
        // A valid policy's plugins must load too: the file exists, speaks this ABI, and
        // accepts its `config`.
        let plugin_diags: Vec<Diagnostic> = match &loaded.policy {
            Some(policy) => match loopguard_engine::load_plugins(policy) {
                Ok(_) => Vec::new(),
                Err(errors) => errors.iter().map(PluginLoadError::diagnostic).collect(),
            },
            None => Vec::new(),
        };
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
            });
            crate::emit(&format!("{report}\n"));
        }
    }
    code
}

fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}
