//! Tests of loading plugins and of what they are shown.

use super::enabled::*;
use super::view::*;
use loopguard_plugin_host::HostError;
use loopguard_plugin_host::abi::window_flags;
use loopguard_rules::Policy;
use serde_json::Value;

use crate::detect::{Record, Window, flag};
use crate::fingerprint::KeySet;
use serde_json::json;

#[test]
fn arguments_are_written_sorted_without_volatile_keys() {
    let volatile = KeySet::new(["request_id"]);
    let mut buf = String::new();
    let v = json!({"b": [1, {"request_id": "x", "z": "é\""}], "a": null, "request_id": 7});
    assert_eq!(
        canonical(&mut buf, &v, &volatile),
        r#"{"a":null,"b":[1,{"z":"é\""}]}"#
    );
    assert_eq!(canonical(&mut buf, &json!("text"), &volatile), r#""text""#);
    // Every escape, at every position of an 8-byte chunk and in the tail.
    for special in [
        "\"", "\\", "\n", "\r", "\t", "\u{8}", "\u{c}", "\u{1}", "\u{1f}", "\u{7f}", "€",
    ] {
        for at in 0..20 {
            let text = format!("{}{special}{}é", "a".repeat(at), "b".repeat(19 - at));
            let v = Value::String(text);
            assert_eq!(canonical(&mut buf, &v, &volatile), v.to_string(), "{v}");
        }
    }
    let numbers = json!({"f": 0.1, "g": -2.5e-8, "h": 1e300, "i": -7, "u": u64::MAX, "z": [true, false, null]});
    assert_eq!(
        canonical(&mut buf, &numbers, &volatile),
        numbers.to_string()
    );
    let plain = Value::String("αβγ δ ~ \u{7f} ok".to_owned());
    assert_eq!(canonical(&mut buf, &plain, &volatile), plain.to_string());
}

#[test]
fn the_window_is_shown_oldest_first_live_records_only() {
    let rec = |exact: u32| Record {
        exact,
        flags: if exact == 5 {
            flag::RESULT | flag::ERROR
        } else {
            0
        },
        ..Record::default()
    };
    // A ring of 4 that wrapped: seqs 3, 4 at the front, then 5, 6 (6 newest).
    let ring = [rec(5), rec(6), rec(3), rec(4)];
    let exacts = |live: usize, skip: usize| -> Vec<u64> {
        let w = Window {
            buf: &ring,
            start: 2,
            filled: 4,
            live,
            newest_seq: 6,
        };
        // The reference: newest first from `iter`, reversed.
        let mut expected: Vec<u64> = w.iter().skip(skip).map(|r| u64::from(r.exact)).collect();
        expected.reverse();
        let got: Vec<u64> = window(&mut Vec::new(), &w, skip)
            .iter()
            .map(|r| r.exact)
            .collect();
        assert_eq!(got, expected, "live {live}, skip {skip}");
        got
    };
    assert_eq!(exacts(4, 0), [3, 4, 5, 6]);
    assert_eq!(exacts(4, 1), [3, 4, 5]);
    assert_eq!(exacts(3, 1), [4, 5]);
    assert_eq!(exacts(1, 1), Vec::<u64>::new());
    assert_eq!(exacts(0, 0), Vec::<u64>::new());
    assert_eq!(exacts(2, 0), [5, 6]);
    let w = Window {
        buf: &ring,
        start: 2,
        filled: 4,
        live: 4,
        newest_seq: 6,
    };
    let shown = window(&mut Vec::new(), &w, 0).to_vec();
    assert_eq!(
        shown[2].flags,
        window_flags::HAS_RESULT | window_flags::IS_ERROR
    );
    assert_eq!(shown[0].flags, 0);
}

#[test]
fn a_missing_library_is_an_error_pointing_at_its_path() {
    let text = "version: 1\nplugins:\n  - path: no/such/libplugin.so\n    name: x\n  - path: off.so\n    enabled: false\n";
    let loaded = Policy::load_text("dir/policy.yaml".as_ref(), text.to_owned());
    let policy = loaded.policy.unwrap();
    let errors = load_plugins(&policy).unwrap_err();
    assert_eq!(errors.len(), 1, "a disabled plugin is not loaded");
    let e = &errors[0];
    assert_eq!(e.index(), 0);
    assert!(matches!(e.host_error(), HostError::NotFound { .. }));
    assert!(e.to_string().contains("no/such/libplugin.so"), "{e}");
    let d = e.diagnostic();
    assert_eq!(d.code, "plugin-not-found");
    let span = d.span.unwrap();
    assert_eq!((span.line, span.column), (3, 11));
    assert_eq!(
        d.label.as_deref(),
        Some("looked for `dir/no/such/libplugin.so`")
    );
    let rendered = loaded.sources.render(&d);
    assert!(rendered.contains("dir/policy.yaml:3:11"), "{rendered}");
}

#[test]
fn a_file_that_is_not_a_library_is_refused() {
    let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml");
    let text = format!("version: 1\nplugins:\n  - path: {manifest}\n");
    let loaded = Policy::load_text("p.yaml".as_ref(), text);
    let errors = load_plugins(&loaded.policy.unwrap()).unwrap_err();
    let d = errors[0].diagnostic();
    assert_eq!(d.code, "plugin-not-loadable");
    assert!(d.message.contains("Cargo.toml"), "{}", d.message);
}

#[test]
fn an_engine_with_no_plugins_is_an_engine() {
    let loaded = Policy::builtin_default();
    let policy = loaded.policy.unwrap();
    assert!(load_plugins(&policy).unwrap().is_empty());
    let engine = crate::Engine::builder(&policy).build().unwrap();
    assert!(engine.plugins().is_empty());
}
