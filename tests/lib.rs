//! Helpers shared by the end-to-end tests in `tests/`: where the workspace is, and the real
//! artifacts the tests run — the `loopctl` binary and the plugins as shared libraries.
//!
//! Cargo only hands a test the path of a binary from its own package, so the artifacts of other
//! packages are built here, once per test process, with the same cargo and profile as the tests
//! themselves (a no-op when they are fresh). Everything is built by one `cargo build` so features
//! unify the same way every time and nothing is rebuilt twice.

#![warn(missing_docs)]
#![allow(clippy::expect_used, clippy::panic)] // test support: failing loudly is the point

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The plugin packages built for the tests, as shared libraries.
pub const PLUGINS: &[&str] = &[
    "loopguard-plugin-noop",
    "loopguard-plugin-panicky",
    "loopguard-plugin-wrong-abi",
    "loopguard-plugin-bad-status",
    "loopguard-plugin-slow",
    "loopguard-plugin-similarity",
    "loopguard-plugin-results",
    "loopguard-plugin-llm-judge",
];

/// The workspace root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ lives in the workspace")
        .to_path_buf()
}

/// Builds `packages` with the same cargo (`--release` when `release`) and returns the
/// directory of that profile's artifacts.
///
/// The variables cargo sets for the calling package are removed first: some build scripts
/// rerun when they change, which would rebuild their crates here and again in the next outer
/// build.
pub fn build(packages: &[&str], release: bool) -> PathBuf {
    let mut cmd = Command::new(env!("CARGO"));
    cmd.current_dir(root()).args(["build", "--quiet"]);
    for p in packages {
        cmd.args(["-p", p]);
    }
    if release {
        cmd.arg("--release");
    }
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy();
        if k.starts_with("CARGO_PKG_")
            || k.starts_with("CARGO_MANIFEST_")
            || ["CARGO_CRATE_NAME", "CARGO_PRIMARY_PACKAGE", "OUT_DIR"].contains(&k.as_ref())
        {
            cmd.env_remove(k.as_ref());
        }
    }
    let status = cmd
        .status()
        .unwrap_or_else(|e| panic!("run cargo build for {packages:?}: {e}"));
    assert!(status.success(), "building {packages:?} failed");
    let target = match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => root().join(dir),
        None => root().join("target"),
    };
    target.join(if release { "release" } else { "debug" })
}

/// The directory cargo puts this profile's artifacts in, after building `loopctl` and the
/// test plugins.
pub fn artifacts() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let mut packages = vec!["loopctl"];
        packages.extend_from_slice(PLUGINS);
        build(&packages, !cfg!(debug_assertions))
    })
}

/// The real `loopctl` binary, freshly built.
pub fn loopctl_path() -> PathBuf {
    let path = artifacts().join(format!("loopctl{}", std::env::consts::EXE_SUFFIX));
    assert!(path.is_file(), "{} was not built", path.display());
    path
}

/// The variables `loopctl` reads as its server-level settings and policy path.
pub const LOOPGUARD_ENV: &[&str] = &[
    "LOOPGUARD_RULES",
    "LOOPGUARD_ENABLED",
    "LOOPGUARD_MAX_REPEATS",
    "LOOPGUARD_TTL_SECONDS",
    "LOOPGUARD_MODE",
];

/// `loopctl proxy` (the binary at `loopctl`) on a free loopback port in front of `upstream`,
/// from the workspace root, without the caller's [`LOOPGUARD_ENV`] variables. Its stdout is
/// piped: the first line is `loopctl proxy listening on <base URL>`.
pub fn proxy_command(loopctl: &Path, upstream: &str) -> Command {
    let mut cmd = Command::new(loopctl);
    cmd.current_dir(root())
        .args(["proxy", "--listen", "127.0.0.1:0", "--upstream", upstream])
        .stdout(std::process::Stdio::piped());
    for var in LOOPGUARD_ENV {
        cmd.env_remove(var);
    }
    cmd
}

/// A command running the real `loopctl` binary, from the workspace root.
pub fn loopctl() -> assert_cmd::Command {
    let mut cmd = assert_cmd::Command::new(loopctl_path());
    cmd.current_dir(root());
    cmd
}

/// [`loopctl`] without the caller's [`LOOPGUARD_ENV`] variables, so only the built-in default
/// policy (or the test's `--rules`) decides.
pub fn loopctl_clean() -> assert_cmd::Command {
    let mut cmd = loopctl();
    for var in LOOPGUARD_ENV {
        cmd.env_remove(var);
    }
    cmd
}

/// The shared library of a plugin package, freshly built.
pub fn plugin_path(package: &str) -> PathBuf {
    let file = format!(
        "{}{}{}",
        std::env::consts::DLL_PREFIX,
        package.replace('-', "_"),
        std::env::consts::DLL_SUFFIX
    );
    let path = artifacts().join(file);
    assert!(path.is_file(), "{} was not built", path.display());
    path
}
