#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)] // test code

//! Server-level settings (the `LOOPGUARD_*` tier) sit beneath the policy's overrides.

use std::path::Path;

use loopguard_rules::{Policy, Settings};

const POLICY: &str = r#"
version: 1
detectors:
  exact_repeat: { threshold: 3 }
time: { ttl_seconds: 0 }
overrides:
  - match: { model: "gpt-4o*" }
    detectors:
      exact_repeat: { threshold: 7 }
  - match: { model: "claude*" }
    time: { ttl_seconds: 60 }
    escalation: { ladder: chance_then_break }
"#;

fn policy() -> Policy {
    let loaded = Policy::load_text(Path::new("p.yaml"), POLICY.to_owned());
    assert!(!loaded.has_errors(), "{:?}", loaded.diagnostics);
    loaded.policy.unwrap()
}

fn server() -> Settings {
    Settings::from_env(
        |k| match k {
            "LOOPGUARD_MAX_REPEATS" => Some("5".into()),
            "LOOPGUARD_TTL_SECONDS" => Some("300".into()),
            "LOOPGUARD_MODE" => Some("break".into()),
            _ => None,
        },
        &["default", "break", "chance_then_break"],
    )
    .unwrap()
}

#[test]
fn server_settings_apply_where_no_override_speaks() {
    let c = policy().resolve_with(None, Some("llama-3"), &server());
    assert_eq!(c.detectors.exact_repeat.threshold, 5);
    assert_eq!(c.time.ttl_seconds, 300);
    assert_eq!(c.ladder, "break");
    assert!(c.enabled);
}

#[test]
fn a_matching_override_beats_the_server_tier_key_by_key() {
    let p = policy();
    let gpt = p.resolve_with(None, Some("gpt-4o-mini"), &server());
    assert_eq!(
        gpt.detectors.exact_repeat.threshold, 7,
        "the override's threshold"
    );
    assert_eq!(
        gpt.time.ttl_seconds, 300,
        "the server's TTL: the override does not set one"
    );
    let claude = p.resolve_with(None, Some("claude-sonnet"), &server());
    assert_eq!(claude.detectors.exact_repeat.threshold, 5);
    assert_eq!(claude.time.ttl_seconds, 60);
    assert_eq!(claude.ladder, "chance_then_break");
}

#[test]
fn no_server_settings_is_plain_resolution() {
    let p = policy();
    let plain = p.resolve(None, Some("gpt-4o"));
    let tiered = p.resolve_with(None, Some("gpt-4o"), &Settings::default());
    assert_eq!(
        plain.detectors.exact_repeat.threshold,
        tiered.detectors.exact_repeat.threshold
    );
    assert_eq!(plain.ladder, tiered.ladder);
}

#[test]
fn bad_environment_values_are_all_reported() {
    let errors = Settings::from_env(
        |k| match k {
            "LOOPGUARD_ENABLED" => Some("maybe".into()),
            "LOOPGUARD_MAX_REPEATS" => Some("0".into()),
            "LOOPGUARD_MODE" => Some("explode".into()),
            _ => None,
        },
        &["default", "break", "chance_then_break"],
    )
    .unwrap_err();
    assert_eq!(errors.len(), 3, "{errors:?}");
    let text = errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("\n");
    assert!(text.contains("LOOPGUARD_ENABLED"), "{text}");
    assert!(text.contains("LOOPGUARD_MODE"), "{text}");
}
