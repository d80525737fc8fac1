//! Test plugin: claims an ABI version no host speaks. The host must refuse it before reading
//! anything else, naming the file and both versions.

#![warn(missing_docs)]

use loopguard_plugin_sdk::{Detection, Detector, Event, export_plugin};

/// The version this plugin claims.
pub const WRONG_ABI_VERSION: u32 = 9999;

/// Otherwise a no-op detector.
#[derive(Debug)]
pub struct WrongAbi;

impl Detector for WrongAbi {
    fn name() -> &'static str {
        "wrong-abi"
    }

    fn version() -> &'static str {
        env!("CARGO_PKG_VERSION")
    }

    fn config_schema() -> serde_json::Value {
        serde_json::json!({})
    }

    fn new(_config: serde_json::Value) -> Result<Self, String> {
        Ok(WrongAbi)
    }

    fn on_event(&mut self, _ev: &Event<'_>) -> Option<Detection> {
        None
    }
}

export_plugin!(@testing WrongAbi, abi_version = WRONG_ABI_VERSION, tweak = |_| {});

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claims_the_wrong_version() {
        assert_eq!(loopguard_plugin_abi_version(), WRONG_ABI_VERSION);
        assert_ne!(
            WRONG_ABI_VERSION,
            loopguard_plugin_sdk::abi::LOOPGUARD_ABI_VERSION
        );
    }
}
