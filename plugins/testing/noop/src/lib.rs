//! The minimal loopguard plugin: it never detects anything.
//!
//! This is the whole of a plugin: a type implementing
//! [`Detector`] and one [`export_plugin!`] line. Build it with
//! `cargo build -p loopguard-plugin-noop` and point a policy's `plugins:` entry at
//! `target/debug/libloopguard_plugin_noop.so`. The tests use it to check loading, and the benches
//! to measure what the plugin boundary itself costs per event.

#![warn(missing_docs)]

use loopguard_plugin_sdk::{Detection, Detector, Event, export_plugin};

/// Never detects anything; accepts no configuration beyond an empty object.
#[derive(Debug)]
pub struct Noop;

impl Detector for Noop {
    fn name() -> &'static str {
        "noop"
    }

    fn version() -> &'static str {
        env!("CARGO_PKG_VERSION")
    }

    fn config_schema() -> serde_json::Value {
        serde_json::json!({
            "type": ["object", "null"],
            "additionalProperties": false
        })
    }

    fn new(_config: serde_json::Value) -> Result<Self, String> {
        Ok(Noop)
    }

    fn on_event(&mut self, _ev: &Event<'_>) -> Option<Detection> {
        None
    }

    const THREAD_SAFE: bool = false;

    // It reads nothing, so the host need not write the arguments out for it.
    const READS_ARGUMENTS: bool = false;
}

export_plugin!(Noop);

#[cfg(test)]
mod tests {
    use super::*;
    use loopguard_plugin_sdk::EventKind;

    #[test]
    fn never_detects() {
        let mut n = Noop::new(serde_json::Value::Null).unwrap();
        assert!(n.on_event(&Event::new(EventKind::Call, "s")).is_none());
    }

    #[test]
    fn exports_the_abi_version() {
        assert_eq!(
            loopguard_plugin_abi_version(),
            loopguard_plugin_sdk::abi::LOOPGUARD_ABI_VERSION
        );
        assert!(!loopguard_plugin_descriptor().is_null());
    }
}
