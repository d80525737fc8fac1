//! Snapshots of session and group state, so that a host can checkpoint and resume.
//!
//! [`Engine::snapshot_session`](crate::Engine::snapshot_session) writes one session as a JSON
//! object; [`Engine::snapshot`](crate::Engine::snapshot) writes every session and, when the engine
//! keeps group counters in memory, the group state too. Restoring either into a new engine (with
//! the same policy) and observing the rest of the events gives the same verdicts as an engine that
//! was never interrupted.
//!
//! # Format
//!
//! Every snapshot is a JSON object whose `version` field is read first, by the scheme every
//! loopguard snapshot shares ([`loopguard_store::format`], with the format [`SNAPSHOT`]): a
//! version newer than this build writes is refused, an older one is migrated, one older than
//! the oldest it reads is refused ([`SnapshotError::Version`]). The rest is then read strictly
//! (unknown fields are errors) and
//! checked for consistency, so a corrupted snapshot is rejected with a message saying what is
//! wrong, and nothing is half restored. Restored state is held to the bounds of live state: a
//! window longer than any policy's (1,000 calls), more call ids than a session keeps, a call id
//! over 4 KiB, a waiting refusal whose message or names exceed 64 KiB or that names more calls
//! than a window holds, and names (tools, groups, workers) over 64 KiB are refused with the
//! bound named; a window longer than this policy's keeps its newest calls. 64-bit hashes are written as 16 hex digits (JSON numbers
//! above 2^53 do not survive every JSON reader).
//!
//! A session snapshot holds the session's settings tier, its group membership (group, worker and
//! the group loops' escalation counters), its window of calls (fingerprints, result digests and
//! flags, with tool *names*, so that the snapshot does not depend on the order in which an engine
//! first saw its tools), the ids of its last few calls, its loop counters, its text state between
//! turns, what its last writes left in their files, and a refusal waiting for the next call. Not in it: a streamed text turn still being
//! written (a snapshot taken mid-stream restarts that turn) and the per-session state of detector
//! plugins (plugins start over).

use std::collections::BTreeMap;

use loopguard_store::format::{Format, VersionError, hex64, hex64_vec};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// The format of session and engine snapshots: the version this build writes, the oldest it
/// reads and the migrations between them.
pub const SNAPSHOT: Format = Format {
    what: "snapshot",
    current: 3,
    oldest: 1,
    migrations: &[v1_to_v2, v2_to_v3],
};

/// Version 2 keys a failure's near-duplicate sketch by the error line it names
/// ([`crate::normalize`]): a version-1 failure's sketch compares with none of them, so it is
/// dropped (its record's `SKETCH` flag cleared; the record then matches failures by digest
/// alone). The body is otherwise the same.
fn v1_to_v2(mut fields: Map<String, Value>) -> Result<Map<String, Value>, String> {
    use crate::detect::flag::{ERROR, SKETCH};
    fn window(session: &mut Map<String, Value>) {
        let Some(Value::Array(records)) = session.get_mut("window") else {
            return;
        };
        for r in records {
            if let Some(Value::Number(n)) = r.get_mut("flags")
                && let Some(f) = n.as_u64()
                && f & u64::from(ERROR) != 0
                && f & u64::from(SKETCH) != 0
            {
                *n = (f & !u64::from(SKETCH)).into();
            }
        }
    }
    match fields.get_mut("sessions") {
        Some(Value::Object(sessions)) => {
            for s in sessions.values_mut() {
                if let Value::Object(s) = s {
                    window(s);
                }
            }
        }
        _ => window(&mut fields),
    }
    Ok(fields)
}

/// Version 3 knows a failure that ends with an exception by that exception alone
/// ([`crate::normalize`]). A version-2 failure keeps its digest: it still matches the failures
/// restored with it, and its sketch (keyed as before) the near-duplicate failures that follow;
/// only an exact match of a version-2 failure ending with an exception and the same failure
/// after the restore is lost. Version 3 also sketches failures only (a success's `sketch` is 0:
/// successes are never compared by sketch); a version-2 success keeps the value it has, which
/// nothing reads. The body is the same.
fn v2_to_v3(fields: Map<String, Value>) -> Result<Map<String, Value>, String> {
    Ok(fields)
}

/// Why a snapshot could not be read or restored.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SnapshotError {
    /// Not shaped like a snapshot (a field missing, unknown, of the wrong type).
    #[error("malformed snapshot: {0}")]
    Malformed(String),
    /// Not a JSON object with a `version`, a version newer than this build reads, or one too
    /// old to migrate.
    #[error(transparent)]
    Version(#[from] VersionError),
    /// Well-formed but inconsistent: corrupted or edited by hand.
    #[error("invalid snapshot of session `{session}`: {reason}")]
    Invalid {
        /// The session at fault.
        session: String,
        /// What is wrong.
        reason: String,
    },
    /// The group state in the snapshot is invalid.
    #[error(transparent)]
    Group(#[from] loopguard_store::SnapshotError),
    /// The snapshot holds group state, but this engine keeps its group counters in a shared store
    /// (which keeps them itself), not in memory.
    #[error(
        "the snapshot holds the state of {groups} group(s), but this engine keeps group counters in \
         a shared store, not in memory; restore it into an engine with the in-memory store"
    )]
    GroupStoreNotInMemory {
        /// Groups in the snapshot.
        groups: usize,
    },
}

/// Reads a snapshot: checks and migrates its version, then reads its body strictly.
pub(crate) fn open<T: for<'de> Deserialize<'de>>(snapshot: &Value) -> Result<T, SnapshotError> {
    let fields: Map<String, Value> = SNAPSHOT.open(snapshot)?;
    serde_json::from_value(Value::Object(fields))
        .map_err(|e| SnapshotError::Malformed(e.to_string()))
}

/// A session's state (versions 1 to 3 share this shape; see [`v1_to_v2`], [`v2_to_v3`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SessionV1 {
    #[serde(default, skip_serializing_if = "SettingsV1::is_empty")]
    pub settings: SettingsV1,
    /// The backend and model the session's rules were resolved for, when the host named them
    /// (`Engine::set_session_target`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<TargetV1>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<MemberV1>,
    /// Calls seen since the session started or was reset (the newest window record's seq).
    pub seq: u32,
    /// Event time of the session's first event (records keep times relative to it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epoch_ms: Option<u64>,
    pub last_ms: u64,
    /// The window, oldest first.
    pub window: Vec<RecordV1>,
    /// The ids of the last few calls.
    pub call_ids: Vec<CallIdV1>,
    /// The ids of loops' first calls, kept after they left `call_ids` (oldest first).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub loop_start_ids: Vec<CallIdV1>,
    pub flags: u32,
    pub loops: Vec<LoopV1>,
    pub allowance: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<TextV1>,
    /// Tools a result said do not exist.
    pub unknown_tools: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub armed: Option<ArmedV1>,
    /// The latest message from a person, while calls before it are set aside.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_turn: Option<UserTurnV1>,
    /// What the last writes left in their files, oldest slot first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<FileV1>,
    /// A hash of the last user message judged a person's.
    #[serde(default, with = "hex64", skip_serializing_if = "is_zero_u64")]
    pub last_user: u64,
    /// Hashes of the lines the last shell commands typed, oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub typed: Vec<u32>,
}

/// What a session was resolved for.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TargetV1 {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
}

/// Calls up to `seq` came before a message from a person; `final`: that message changed the
/// situation (or asked for a retry), else it is still undecided.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct UserTurnV1 {
    pub seq: u32,
    #[serde(rename = "final")]
    pub decided: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SettingsV1 {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_repeats: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_seconds: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
}

impl SettingsV1 {
    fn is_empty(&self) -> bool {
        *self == SettingsV1::default()
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct MemberV1 {
    pub group: String,
    pub worker: String,
    pub loops: Vec<LoopV1>,
    pub workers: u32,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RecordV1 {
    #[serde(with = "hex64")]
    pub exact: u64,
    #[serde(with = "hex64")]
    pub fuzzy: u64,
    /// Hash of the host's call id.
    pub call: u32,
    pub digest: u32,
    /// A failure's near-duplicate sketch (meaningful with the `SKETCH` flag; 0 for a success
    /// since version 3).
    #[serde(default, with = "hex64")]
    pub sketch: u64,
    /// Milliseconds since `epoch_ms`.
    pub time: u32,
    /// `None`: a tool beyond the engine's tool table.
    pub tool: Option<String>,
    pub flags: u16,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CallIdV1 {
    pub seq: u32,
    pub id: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct LoopV1 {
    #[serde(with = "hex64")]
    pub key: u64,
    pub repeat: u32,
    #[serde(with = "hex64")]
    pub occasion: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TextV1 {
    /// Digests of the most recent turns, oldest first.
    #[serde(with = "hex64_vec")]
    pub turns: Vec<u64>,
    pub turn_no: u64,
    pub monologue: u32,
    /// The digest of the last automated reply to a turn without a tool call, and how many such
    /// replies in a row were the same.
    #[serde(default, with = "hex64", skip_serializing_if = "is_zero_u64")]
    pub reply: u64,
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub same_replies: u32,
    /// The turns without a tool call the last message taken for a person's ended.
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub ended_by_person: u32,
}

fn is_zero_u64(n: &u64) -> bool {
    *n == 0
}

fn is_zero_u32(n: &u32) -> bool {
    *n == 0
}

/// What a write left in a file (`session/files.rs`): hashes of the file and of its content,
/// and the call that wrote it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct FileV1 {
    pub target: u32,
    pub content: u32,
    pub seq: u32,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ArmedV1 {
    pub tool: Option<String>,
    pub verdict: VerdictV1,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct VerdictV1 {
    pub action: String,
    pub message: String,
    pub detector: Option<String>,
    pub rule: Option<String>,
    pub count: u32,
    pub calls: Vec<CallRefV1>,
    pub loop_start: Option<CallRefV1>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CallRefV1 {
    pub seq: u64,
    pub call_id: String,
}

/// A whole engine (versions 1 to 3): its sessions by id, and its in-memory group state.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct EngineV1 {
    pub sessions: BTreeMap<String, SessionV1>,
    /// A `loopguard_store::GroupSnapshot` (versioned itself); `null` when the engine keeps group
    /// counters in a shared store.
    pub groups: Option<Value>,
}
