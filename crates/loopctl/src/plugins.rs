//! `loopctl plugins`: what a plugin library says about itself.

use std::path::PathBuf;

use loopguard_engine::plugins::host::{PluginHost, PluginInfo};

use crate::{EXIT_CANNOT_RUN, EXIT_OK, emit};

/// Describes each plugin; exit 2 when any file cannot be loaded as a plugin (the others are
/// still described).
pub fn run(paths: &[PathBuf], json: bool) -> u8 {
    let mut code = EXIT_OK;
    let mut described = 0usize;
    for path in paths {
        match PluginHost::describe(path) {
            Ok(info) if json => emit(&format!("{}\n", to_json(&info))),
            Ok(info) => {
                if described > 0 {
                    emit("\n");
                }
                described += 1;
                emit(&human(&info));
            }
            Err(e) => {
                eprintln!("error: {e}");
                code = EXIT_CANNOT_RUN;
            }
        }
    }
    code
}

fn to_json(info: &PluginInfo) -> serde_json::Value {
    serde_json::json!({
        "file": info.path.display().to_string(),
        "name": info.name,
        "version": info.version,
        "abi_version": info.abi_version,
        "thread_safe": info.thread_safe,
        "config_schema": info.config_schema,
    })
}

fn human(info: &PluginInfo) -> String {
    let schema = serde_json::to_string_pretty(&info.config_schema).unwrap_or_default();
    let mut out = format!(
        "{} {}\n  file:          {}\n  ABI version:   {}\n  thread-safe:   {}\n  config schema:\n",
        info.name,
        info.version,
        info.path.display(),
        info.abi_version,
        if info.thread_safe {
            "yes (called concurrently)"
        } else {
            "no (calls are serialized)"
        },
    );
    for line in schema.lines() {
        out.push_str("    ");
        out.push_str(line);
        out.push('\n');
    }
    out
}
