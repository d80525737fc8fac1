//! The decision log (`--decisions FILE`): one JSON line per intervention, so an operator can
//! audit what the proxy did and replay the conversation with `loopctl simulate` to see the same
//! decisions.
//!
//! A record: `time_ms`, `request_id` (the client's `x-request-id`, else one the proxy made),
//! `session`, `model`, `turn` (the 1-based assistant message the event belongs to, counted as
//! `loopctl simulate` counts it), `kind` (`call`, `result`, `text`, `user`), `tool`,
//! `tool_call_id`, `action`, `detector`, `rule`, `count`. Interventions are rare, so each is
//! written at once, whole, with one `write` on a file opened for appending; a failed write is
//! logged (once) and never fails the request.

use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use loopguard_engine::Verdict;
use serde_json::json;

/// An open decision log.
#[derive(Debug)]
pub struct Log {
    file: Mutex<File>,
    failed: AtomicBool,
}

/// Where an intervention happened.
#[derive(Debug, Clone, Copy)]
pub struct At<'a> {
    /// The client's `x-request-id`, else one the proxy made.
    pub request_id: &'a str,
    /// The session.
    pub session: &'a str,
    /// The model the request named.
    pub model: Option<&'a str>,
    /// The 1-based assistant message the event belongs to.
    pub turn: u64,
    /// `call`, `result`, `text` or `user`.
    pub kind: &'static str,
    /// The tool, when the event is about a call.
    pub tool: Option<&'a str>,
    /// The call's id.
    pub tool_call_id: Option<&'a str>,
    /// For a warning that gave a repeated call a second chance (`chance_then_break`), how it
    /// went: `changed`, `repeated` or `failed`.
    pub second_chance: Option<&'static str>,
}

impl Log {
    /// Opens (creating, readable by the owner only) `path` for appending.
    pub fn open(path: &Path) -> std::io::Result<Log> {
        let mut options = std::fs::OpenOptions::new();
        options.append(true).create(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        Ok(Log {
            file: Mutex::new(options.open(path)?),
            failed: AtomicBool::new(false),
        })
    }

    /// Appends the record of one intervention.
    pub fn write(&self, at: At<'_>, v: &Verdict, time_ms: u64) {
        let mut record = json!({
            "time_ms": time_ms,
            "request_id": at.request_id,
            "session": at.session,
            "model": at.model,
            "turn": at.turn,
            "kind": at.kind,
            "tool": at.tool,
            "tool_call_id": at.tool_call_id,
            "action": v.action.as_str(),
            "detector": v.detector.as_deref(),
            "rule": v.rule.as_deref(),
            "count": v.count,
        });
        if let (Some(outcome), Some(obj)) = (at.second_chance, record.as_object_mut()) {
            obj.insert("second_chance".into(), json!(outcome));
        }
        let mut line = record.to_string();
        line.push('\n');
        let written = self
            .file
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .write_all(line.as_bytes());
        if let Err(error) = written
            && !self.failed.swap(true, Ordering::Relaxed)
        {
            tracing::error!(%error, "cannot write to the decision log; interventions go on unlogged");
        }
    }
}
