//! The host against real plugins: the workspace's plugin crates, built as shared libraries and
//! loaded from the target directory.

// Test helpers outside `#[test]` functions are test code too.
#![allow(clippy::expect_used, clippy::panic, clippy::unwrap_used)]

use std::path::PathBuf;
use std::process::Command;
use std::sync::{Arc, OnceLock};

use loopguard_plugin_host::{EventKind, EventView, HostError, Outcome, PluginHost, abi};
use serde_json::{Value, json};

const PLUGINS: &[&str] = &[
    "loopguard-plugin-noop",
    "loopguard-plugin-panicky",
    "loopguard-plugin-wrong-abi",
    "loopguard-plugin-bad-status",
    "loopguard-plugin-similarity",
    "loopguard-plugin-results",
];

/// `$CARGO_TARGET_DIR` (relative to the workspace root, where cargo resolves it), else the
/// workspace's `target/`.
fn target_dir() -> PathBuf {
    let workspace = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => workspace.join(dir),
        None => workspace.join("target"),
    }
}

/// Builds every test plugin once (cargo makes this a no-op when they are fresh), in the profile
/// the tests themselves were built in.
fn build_plugins() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let release = !cfg!(debug_assertions);
        let mut cmd = Command::new(env!("CARGO"));
        cmd.arg("build").arg("--quiet");
        for p in PLUGINS {
            cmd.args(["-p", p]);
        }
        if release {
            cmd.arg("--release");
        }
        let status = cmd.status().expect("run cargo build for the test plugins");
        assert!(status.success(), "building the test plugins failed");
        target_dir().join(if release { "release" } else { "debug" })
    })
}

fn plugin_path(package: &str) -> PathBuf {
    let file = format!(
        "{}{}{}",
        std::env::consts::DLL_PREFIX,
        package.replace('-', "_"),
        std::env::consts::DLL_SUFFIX
    );
    let path = build_plugins().join(file);
    assert!(path.is_file(), "{} was not built", path.display());
    path
}

fn load(package: &str, config: Value) -> loopguard_plugin_host::Plugin {
    PluginHost::load(&plugin_path(package), &config)
        .unwrap_or_else(|e| panic!("loading {package}: {e}"))
}

fn call<'a>(tool: &'a str, args: &'a str, exact: u64) -> EventView<'a> {
    EventView::new(EventKind::Call, "session-1", exact * 1000)
        .tool(tool)
        .arguments(args)
        .fingerprints(exact, exact ^ 0xf00d)
}

/// The call `id` and its failed result with outcome digest `digest`, as the engine sends them;
/// returns what the plugin said about each.
fn failing_call(
    plugin: &loopguard_plugin_host::Plugin,
    id: &str,
    tool: &str,
    args: &str,
    exact: u64,
    digest: u64,
) -> (Outcome, Outcome) {
    let c = plugin.on_event(&call(tool, args, exact).call_id(id));
    let r = EventView::new(EventKind::Result, "session-1", exact * 1000 + 1)
        .call_id(id)
        .tool(tool)
        .fingerprints(exact, exact ^ 0xf00d)
        .result("Error: index unavailable", true, None)
        .result_digest(digest);
    (c, plugin.on_event(&r))
}

#[test]
fn noop_loads_and_never_detects() {
    let plugin = load("loopguard-plugin-noop", Value::Null);
    assert_eq!(plugin.name(), "noop");
    assert_eq!(plugin.version(), env!("CARGO_PKG_VERSION"));
    assert!(
        !PluginHost::describe(&plugin_path("loopguard-plugin-noop"))
            .unwrap()
            .thread_safe
    );
    assert!(!plugin.is_poisoned());
    assert!(plugin.path().is_absolute());
    let window = [abi::WindowRecord::default(); 3];
    let ev = call("search", r#"{"q":"x"}"#, 1).window(&window);
    assert_eq!(plugin.on_event(&ev), Outcome::NoDetection);
    let ev = EventView::new(EventKind::Result, "session-1", 2).result("out", false, Some(0));
    assert_eq!(plugin.on_event(&ev), Outcome::NoDetection);
}

#[test]
fn noop_is_shared_between_threads() {
    let plugin = Arc::new(load("loopguard-plugin-noop", json!({})));
    let handles: Vec<_> = (0..4)
        .map(|t| {
            let plugin = Arc::clone(&plugin);
            std::thread::spawn(move || {
                let session = format!("s{t}");
                for i in 0..1000 {
                    let ev = EventView::new(EventKind::Call, &session, i).tool("t");
                    assert_eq!(plugin.on_event(&ev), Outcome::NoDetection);
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
}

#[test]
fn loading_twice_gives_two_independent_instances() {
    let a = load("loopguard-plugin-similarity", json!({"min_count": 2}));
    let b = load("loopguard-plugin-similarity", json!({"min_count": 2}));
    let (c, r) = failing_call(&a, "c1", "s", r#"{"q":"foo"}"#, 1, 7);
    assert_eq!((c, r), (Outcome::NoDetection, Outcome::NoDetection));
    let (_, r) = failing_call(&a, "c2", "s", r#"{"q":"fo0"}"#, 2, 7);
    assert!(matches!(r, Outcome::Detection { .. }), "{r:?}");
    let (_, r) = failing_call(&b, "c2", "s", r#"{"q":"fo0"}"#, 2, 7);
    assert_eq!(r, Outcome::NoDetection);
    drop(a);
    // `b` is alive after `a` was destroyed, and saw only its own call.
    let (_, r) = failing_call(&b, "c3", "s", r#"{"q":"something unrelated"}"#, 3, 7);
    assert_eq!(r, Outcome::NoDetection);
}

// A panic inside a plugin must not cross into the host; the plugin is then skipped for good.
#[test]
fn panicky_plugin_is_poisoned_and_the_host_survives() {
    let plugin = load("loopguard-plugin-panicky", Value::Null);
    assert_eq!(plugin.on_event(&call("t", "{}", 1)), Outcome::Poisoned);
    assert!(plugin.is_poisoned());
    for i in 2..5 {
        assert_eq!(plugin.on_event(&call("t", "{}", i)), Outcome::Poisoned);
    }
    // A fresh instance of the same library is not poisoned by its sibling.
    let other = load("loopguard-plugin-panicky", Value::Null);
    assert!(!other.is_poisoned());
}

#[test]
fn wrong_abi_is_refused_naming_the_file_and_both_versions() {
    let path = plugin_path("loopguard-plugin-wrong-abi");
    let err = PluginHost::load(&path, &Value::Null).unwrap_err();
    match &err {
        HostError::AbiMismatch {
            path: p,
            found,
            expected,
        } => {
            assert_eq!(*found, 9999);
            assert_eq!(*expected, abi::LOOPGUARD_ABI_VERSION);
            assert_eq!(p.file_name(), path.file_name());
        }
        other => panic!("expected an ABI mismatch, got {other:?}"),
    }
    let msg = err.to_string();
    assert!(msg.contains("libloopguard_plugin_wrong_abi"), "{msg}");
    assert!(msg.contains("9999"), "{msg}");
    assert!(
        msg.contains(&format!("version {}", abi::LOOPGUARD_ABI_VERSION)),
        "{msg}"
    );
}

#[test]
fn describe_reads_the_descriptor_without_creating_an_instance() {
    let info = PluginHost::describe(&plugin_path("loopguard-plugin-similarity")).unwrap();
    assert_eq!(info.name, "similarity");
    assert_eq!(info.version, env!("CARGO_PKG_VERSION"));
    assert_eq!(info.abi_version, abi::LOOPGUARD_ABI_VERSION);
    assert!(info.path.is_absolute());
    assert!(info.config_schema["properties"]["threshold"].is_object());
    // The same checks as `load` come first.
    let err = PluginHost::describe(&plugin_path("loopguard-plugin-wrong-abi")).unwrap_err();
    assert!(
        matches!(err, HostError::AbiMismatch { found: 9999, .. }),
        "{err:?}"
    );
    let err = PluginHost::describe("/no/such/plugin.so".as_ref()).unwrap_err();
    assert!(matches!(err, HostError::NotFound { .. }), "{err:?}");
}

#[test]
fn unknown_status_is_an_error() {
    let plugin = load("loopguard-plugin-bad-status", Value::Null);
    assert_eq!(plugin.on_event(&call("t", "{}", 1)), Outcome::Error(77));
    assert!(!plugin.is_poisoned(), "an error is not a panic");
    assert_eq!(plugin.on_event(&call("t", "{}", 2)), Outcome::Error(77));
}

#[test]
fn similarity_sees_near_identical_arguments() {
    let plugin = load("loopguard-plugin-similarity", json!({"threshold": 0.8}));
    let mut outcomes = Vec::new();
    for (i, q) in ["foo", "fo0", "f00", "foo "].iter().enumerate() {
        let args = format!(r#"{{"query":"{q}"}}"#);
        // Every call has its own exact fingerprint: exact matching sees no repeat. Each fails
        // the same way; the plugin judges the call when its result arrives.
        let id = format!("c{i}");
        let (c, r) = failing_call(&plugin, &id, "search", &args, 100 + i as u64, 42);
        assert_eq!(c, Outcome::NoDetection);
        outcomes.push(r);
    }
    assert_eq!(outcomes[0], Outcome::NoDetection);
    match outcomes.last().unwrap() {
        Outcome::Detection {
            count,
            message,
            pattern,
            ..
        } => {
            assert!(*count >= 3, "{count}");
            assert!(message.contains("`search`"), "{message}");
            assert!(pattern.starts_with("search("), "{pattern}");
        }
        other => panic!("expected a detection, got {other:?}"),
    }
}

#[test]
fn results_sees_different_searches_with_the_same_empty_result() {
    let plugin = load("loopguard-plugin-results", Value::Null);
    let searches = [
        r#"{"q":"alpha"}"#,
        r#"{"q":"beta gamma"}"#,
        r#"{"q":"delta"}"#,
        r#"{"q":"epsilon"}"#,
        r#"{"q":"zeta eta"}"#,
    ];
    let mut last = Outcome::NoDetection;
    for (i, args) in searches.iter().enumerate() {
        let exact = 500 + i as u64;
        assert_eq!(
            plugin.on_event(&call("search", args, exact)),
            Outcome::NoDetection
        );
        let result = EventView::new(EventKind::Result, "session-1", exact * 1000 + 1)
            .tool("search")
            .arguments(args)
            .fingerprints(exact, exact)
            .result("No results found.", false, None);
        last = plugin.on_event(&result);
    }
    match last {
        Outcome::Detection { count, message, .. } => {
            // Empty answers count from `empty_min_count` (5).
            assert_eq!(count, 5);
            assert!(message.contains("same result"), "{message}");
        }
        other => panic!("expected a detection, got {other:?}"),
    }
}

#[test]
fn config_is_checked_against_the_plugins_schema() {
    let path = plugin_path("loopguard-plugin-similarity");
    let err = PluginHost::load(&path, &json!({"threshold": "high", "treshold": 0.5})).unwrap_err();
    let HostError::BadConfig { errors, plugin, .. } = &err else {
        panic!("expected a config error, got {err:?}");
    };
    assert_eq!(plugin, "similarity");
    assert_eq!(errors.len(), 2, "{errors:?}");
    let msg = err.to_string();
    assert!(msg.contains("config/threshold"), "{msg}");
    assert!(msg.contains("treshold"), "{msg}");
    assert!(msg.contains("libloopguard_plugin_similarity"), "{msg}");
}

#[test]
fn config_the_schema_allows_but_the_plugin_refuses() {
    let path = plugin_path("loopguard-plugin-similarity");
    let err = PluginHost::load(&path, &json!({"min_count": 50, "window": 10})).unwrap_err();
    let HostError::CreateFailed { message, .. } = &err else {
        panic!("expected create to fail, got {err:?}");
    };
    assert!(message.contains("`min_count` (50)"), "{message}");
    assert!(err.to_string().contains("failed to start"), "{err}");
}

#[test]
fn a_library_that_is_not_a_plugin_is_refused() {
    // Any shared library without our symbols: the C math library is everywhere on Linux.
    let candidates = [
        "/lib/x86_64-linux-gnu/libm.so.6",
        "/usr/lib/x86_64-linux-gnu/libm.so.6",
        "/lib/aarch64-linux-gnu/libm.so.6",
        "/usr/lib64/libm.so.6",
    ];
    let libm = candidates
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("no C math library at any of {candidates:?}"));
    let err = PluginHost::load(&libm, &Value::Null).unwrap_err();
    assert!(
        matches!(
            err,
            HostError::MissingSymbol {
                symbol: "loopguard_plugin_abi_version",
                ..
            }
        ),
        "{err:?}"
    );
}

#[test]
fn plugins_declare_whether_they_read_arguments_and_do_background_work() {
    let noop = load("loopguard-plugin-noop", Value::Null);
    assert!(!noop.reads_arguments());
    assert!(!noop.has_background_work());
    // Waiting on a plugin without background work returns at once.
    noop.wait_idle(std::time::Duration::from_secs(60));
    let similarity = load("loopguard-plugin-similarity", json!({}));
    assert!(similarity.reads_arguments());
    assert!(!similarity.has_background_work());
}
