//! Test plugin: its `on_event` returns a status code the ABI does not define. The host must
//! report an error, not guess.

#![warn(missing_docs)]

use loopguard_plugin_sdk::abi::{DetectionOut, EventView, PluginDescriptor};
use loopguard_plugin_sdk::{Detection, Detector, Event, export_plugin};

/// The status this plugin returns: not one of `abi::status`.
pub const BAD_STATUS: i32 = 77;

/// Otherwise a no-op detector.
#[derive(Debug)]
pub struct BadStatus;

impl Detector for BadStatus {
    fn name() -> &'static str {
        "bad-status"
    }

    fn version() -> &'static str {
        env!("CARGO_PKG_VERSION")
    }

    fn config_schema() -> serde_json::Value {
        serde_json::json!({})
    }

    fn new(_config: serde_json::Value) -> Result<Self, String> {
        Ok(BadStatus)
    }

    fn on_event(&mut self, _ev: &Event<'_>) -> Option<Detection> {
        None
    }
}

/// Replaces the SDK's `on_event`: touches nothing, returns [`BAD_STATUS`].
pub extern "C" fn bad_on_event(
    _instance: *mut std::ffi::c_void,
    _event: *const EventView,
    _out: *mut DetectionOut,
) -> i32 {
    BAD_STATUS
}

fn swap_on_event(d: &mut PluginDescriptor) {
    d.on_event = Some(bad_on_event);
}

export_plugin!(
    @testing BadStatus,
    abi_version = loopguard_plugin_sdk::abi::LOOPGUARD_ABI_VERSION,
    tweak = swap_on_event
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn returns_an_unknown_status() {
        let status = bad_on_event(std::ptr::null_mut(), std::ptr::null(), std::ptr::null_mut());
        assert_eq!(status, BAD_STATUS);
        assert!(!loopguard_plugin_descriptor().is_null());
    }
}
