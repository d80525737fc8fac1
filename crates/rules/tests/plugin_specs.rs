#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)] // test code

//! `plugins:` entries: paths are resolved against the file that wrote them, and each entry keeps
//! the spans that load errors point at.

use std::path::{Path, PathBuf};

use loopguard_rules::Policy;

/// A fresh directory under the system's temp dir.
fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("loopguard-rules-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("sub")).unwrap();
    dir
}

#[test]
fn plugin_paths_are_relative_to_the_file_that_names_them() {
    let dir = temp_dir("plugins");
    std::fs::write(
        dir.join("base.yaml"),
        "version: 1\nplugins:\n  - path: lib/libsim.so\n    name: near\n    ladder: break\n    config: { threshold: 0.9 }\n  - path: /abs/libres.so\n    enabled: false\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("sub/child.yaml"),
        "version: 1\nextends: ../base.yaml\n",
    )
    .unwrap();

    let loaded = Policy::load(&dir.join("sub/child.yaml")).unwrap();
    let policy = loaded.policy.expect("valid");
    let [sim, res] = policy.plugins.as_slice() else {
        panic!("two plugins: {:?}", policy.plugins);
    };
    // Written in base.yaml, so relative to the directory of base.yaml, not of child.yaml.
    assert_eq!(
        sim.path,
        dir.join("sub/../base.yaml")
            .parent()
            .unwrap()
            .join("lib/libsim.so")
    );
    assert_eq!(sim.written_path, "lib/libsim.so");
    assert_eq!(sim.name.as_deref(), Some("near"));
    assert_eq!(sim.ladder.as_deref(), Some("break"));
    assert_eq!(sim.config, serde_json::json!({"threshold": 0.9}));
    assert!(sim.enabled);
    let source = loaded.sources.get(sim.path_span.source).unwrap();
    assert!(
        source.path.ends_with("base.yaml"),
        "{}",
        source.path.display()
    );
    assert_eq!((sim.path_span.line, sim.path_span.column), (3, 11));
    assert_eq!(sim.config_span.map(|s| s.line), Some(6));
    assert_eq!(sim.span.line, 3);

    assert_eq!(res.path, Path::new("/abs/libres.so"), "absolute paths stay");
    assert!(!res.enabled);
    assert_eq!(res.config, serde_json::Value::Null);
    assert_eq!(res.config_span, None);
    let _ = std::fs::remove_dir_all(&dir);
}
