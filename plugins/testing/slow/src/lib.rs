//! A test plugin that is slow for one session: each event of the session named `block_session`
//! creates the file `<dir>/entered`, then waits until `<dir>/release` exists (at most
//! `max_wait_ms`). Events of other sessions return at once. The tests use it to show that one
//! session's plugin work does not hold up another's: files, not timing, say when the slow event
//! is inside the plugin and when it may leave.

#![warn(missing_docs)]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use loopguard_plugin_sdk::{Detection, Detector, Event, export_plugin};

/// Holds the events of one session.
#[derive(Debug)]
pub struct Slow {
    block_session: String,
    dir: PathBuf,
    max_wait: Duration,
}

impl Detector for Slow {
    fn name() -> &'static str {
        "slow"
    }

    fn version() -> &'static str {
        env!("CARGO_PKG_VERSION")
    }

    fn config_schema() -> serde_json::Value {
        serde_json::json!({
            "type": "object",
            "required": ["block_session", "dir"],
            "properties": {
                "block_session": { "type": "string" },
                "dir": { "type": "string" },
                "max_wait_ms": { "type": "integer", "minimum": 0, "maximum": 600_000 }
            },
            "additionalProperties": false
        })
    }

    fn new(config: serde_json::Value) -> Result<Self, String> {
        let text = |key: &str| {
            config
                .get(key)
                .and_then(serde_json::Value::as_str)
                .map(str::to_owned)
                .ok_or_else(|| format!("`{key}` is required"))
        };
        Ok(Slow {
            block_session: text("block_session")?,
            dir: PathBuf::from(text("dir")?),
            max_wait: Duration::from_millis(
                config
                    .get("max_wait_ms")
                    .and_then(serde_json::Value::as_u64)
                    .unwrap_or(60_000),
            ),
        })
    }

    fn on_event(&mut self, ev: &Event<'_>) -> Option<Detection> {
        if ev.session != self.block_session {
            return None;
        }
        let _ = std::fs::write(self.dir.join("entered"), b"");
        let start = Instant::now();
        while !self.dir.join("release").exists() && start.elapsed() < self.max_wait {
            std::thread::sleep(Duration::from_millis(2));
        }
        None
    }

    // Its state is per session: one instance per shard of sessions, each with its own lock.
    const SESSION_SHARDS: usize = 16;

    const READS_ARGUMENTS: bool = false;
}

export_plugin!(Slow);
