//! Test plugin: panics in `on_event` (after `create` succeeded). The host must survive, poison the
//! plugin and stop calling it.

#![warn(missing_docs)]

use loopguard_plugin_sdk::{Detection, Detector, Event, export_plugin};

/// Panics on every event.
#[derive(Debug)]
pub struct Panicky {
    calls: u32,
}

impl Detector for Panicky {
    fn name() -> &'static str {
        "panicky"
    }

    fn version() -> &'static str {
        env!("CARGO_PKG_VERSION")
    }

    fn config_schema() -> serde_json::Value {
        serde_json::json!({})
    }

    fn new(_config: serde_json::Value) -> Result<Self, String> {
        Ok(Panicky { calls: 0 })
    }

    #[allow(clippy::panic)] // panicking is this plugin's whole purpose
    fn on_event(&mut self, _ev: &Event<'_>) -> Option<Detection> {
        self.calls += 1;
        panic!("panicky plugin: call {} panics, as designed", self.calls);
    }
}

export_plugin!(Panicky);

#[cfg(test)]
mod tests {
    use super::*;
    use loopguard_plugin_sdk::EventKind;

    #[test]
    #[should_panic(expected = "as designed")]
    fn panics() {
        let mut p = Panicky::new(serde_json::Value::Null).unwrap();
        p.on_event(&Event::new(EventKind::Call, "s"));
    }
}
