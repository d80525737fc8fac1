//! Versioned snapshots of group state.
//!
//! A [`GroupSnapshot`] is plain serde data (JSON by [`GroupSnapshot::to_json`], or embedded in a
//! host's own snapshot). Its first field is the format `version`. Reading a snapshot checks the
//! version before anything else: a newer version than this build knows is refused
//! ([`SnapshotError::TooNew`]); an older one is migrated by the reader kept for it, or refused
//! ([`SnapshotError::TooOld`]) when it is older than [`OLDEST_READABLE_VERSION`]. The content is
//! then validated, so a corrupted snapshot is rejected with a message that names the group and the
//! fingerprint, never half restored.
//!
//! Fingerprints and worker ids are written as 16 lowercase hex digits: JSON numbers above 2^53
//! do not survive every JSON reader.

use std::collections::HashSet;
use std::fmt;

use serde::de::{self, Deserializer};
use serde::ser::Serializer;
use serde::{Deserialize, Serialize};

use crate::WorkerId;

/// The snapshot format this build writes.
pub const SNAPSHOT_VERSION: u32 = 1;

/// The oldest snapshot format this build reads (migrating it to [`SNAPSHOT_VERSION`]).
pub const OLDEST_READABLE_VERSION: u32 = 1;

/// The state of every group of a store: what [`MemoryStore::snapshot`](crate::MemoryStore::snapshot)
/// takes and [`MemoryStore::restore`](crate::MemoryStore::restore) puts back.
///
/// Groups are sorted by name and fingerprints by value, so equal states give equal snapshots.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "Envelope")]
pub struct GroupSnapshot {
    version: u32,
    groups: Vec<SnapshotGroup>,
}

/// One group of a [`GroupSnapshot`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnapshotGroup {
    /// The group's name.
    pub group: String,
    /// Event time of the group's last record, in milliseconds.
    pub last_seen_ms: u64,
    /// Its fingerprints.
    pub fingerprints: Vec<SnapshotFingerprint>,
}

/// One fingerprint of a [`SnapshotGroup`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnapshotFingerprint {
    /// The fingerprint.
    #[serde(with = "hex64")]
    pub fingerprint: u64,
    /// How many times the group produced it (at least 1).
    pub count: u64,
    /// The distinct workers that produced it (at most `count` of them).
    pub workers: Vec<WorkerId>,
    /// Event time of the last record, in milliseconds.
    pub last_seen_ms: u64,
}

impl GroupSnapshot {
    /// A snapshot in the current format, validated.
    pub fn new(groups: Vec<SnapshotGroup>) -> Result<Self, SnapshotError> {
        let snapshot = Self::from_store(groups);
        snapshot.validate()?;
        Ok(snapshot)
    }

    /// A snapshot of what a store holds, sorted, not validated (a store's contents are valid by
    /// construction).
    pub(crate) fn from_store(mut groups: Vec<SnapshotGroup>) -> Self {
        groups.sort_by(|a, b| a.group.cmp(&b.group));
        for g in &mut groups {
            g.fingerprints.sort_by_key(|f| f.fingerprint);
        }
        Self {
            version: SNAPSHOT_VERSION,
            groups,
        }
    }

    /// The format version (always [`SNAPSHOT_VERSION`] once read: older ones are migrated).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// The groups, sorted by name.
    pub fn groups(&self) -> &[SnapshotGroup] {
        &self.groups
    }

    /// The snapshot as compact JSON.
    pub fn to_json(&self) -> String {
        // Serializing plain structs of strings and integers into a string cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Reads a snapshot from JSON: checks the version, migrates an older format, validates.
    pub fn from_json(json: &str) -> Result<Self, SnapshotError> {
        let envelope: Envelope = serde_json::from_str(json).map_err(SnapshotError::Malformed)?;
        Self::try_from(envelope)
    }

    /// Checks what serde cannot: names present and unique, counts consistent.
    pub(crate) fn validate(&self) -> Result<(), SnapshotError> {
        let invalid = |group: &str, fingerprint: Option<u64>, reason: String| {
            SnapshotError::Invalid(InvalidSnapshot {
                group: group.to_owned(),
                fingerprint,
                reason,
            })
        };
        let mut names = HashSet::new();
        for g in &self.groups {
            if g.group.is_empty() {
                return Err(invalid("", None, "a group has an empty name".to_owned()));
            }
            if !names.insert(g.group.as_str()) {
                return Err(invalid(
                    &g.group,
                    None,
                    "the group appears twice".to_owned(),
                ));
            }
            let mut fingerprints = HashSet::new();
            for f in &g.fingerprints {
                let fp = Some(f.fingerprint);
                if !fingerprints.insert(f.fingerprint) {
                    return Err(invalid(
                        &g.group,
                        fp,
                        "the fingerprint appears twice".into(),
                    ));
                }
                if f.count == 0 {
                    return Err(invalid(&g.group, fp, "its count is 0".into()));
                }
                if f.workers.is_empty() {
                    return Err(invalid(&g.group, fp, "it has no worker".into()));
                }
                if f.workers.len() as u64 > f.count {
                    let reason = format!(
                        "it lists {} workers but was only counted {} times",
                        f.workers.len(),
                        f.count
                    );
                    return Err(invalid(&g.group, fp, reason));
                }
                let mut workers = HashSet::new();
                if let Some(w) = f.workers.iter().find(|w| !workers.insert(**w)) {
                    return Err(invalid(&g.group, fp, format!("worker `{w}` appears twice")));
                }
            }
        }
        Ok(())
    }
}

/// What every version of the format has: a version, and the rest to be read by that version's
/// reader.
#[derive(Deserialize)]
struct Envelope {
    version: Option<u32>,
    #[serde(flatten)]
    body: serde_json::Map<String, serde_json::Value>,
}

/// The body of format version 1.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BodyV1 {
    groups: Vec<SnapshotGroup>,
}

impl TryFrom<Envelope> for GroupSnapshot {
    type Error = SnapshotError;

    fn try_from(envelope: Envelope) -> Result<Self, SnapshotError> {
        let version = envelope.version.ok_or(SnapshotError::MissingVersion)?;
        if version > SNAPSHOT_VERSION {
            return Err(SnapshotError::TooNew {
                found: version,
                supported: SNAPSHOT_VERSION,
            });
        }
        if version < OLDEST_READABLE_VERSION {
            return Err(SnapshotError::TooOld {
                found: version,
                oldest: OLDEST_READABLE_VERSION,
            });
        }
        // One reader per version still read, each migrating to the next; version 1 is current.
        let body: BodyV1 = serde_json::from_value(serde_json::Value::Object(envelope.body))
            .map_err(SnapshotError::Malformed)?;
        let snapshot = Self {
            version: SNAPSHOT_VERSION,
            groups: body.groups,
        };
        snapshot.validate()?;
        Ok(snapshot)
    }
}

/// Why a snapshot could not be read or restored.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SnapshotError {
    /// Not JSON, or not shaped like a group snapshot (a field missing, of the wrong type, unknown).
    #[error("malformed group snapshot: {0}")]
    Malformed(#[source] serde_json::Error),
    /// No `version` field.
    #[error("group snapshot has no `version` field")]
    MissingVersion,
    /// Written by a newer loopguard.
    #[error(
        "group snapshot format version {found} is newer than this build reads (up to {supported}); \
         restore it with the loopguard version that wrote it or a newer one"
    )]
    TooNew {
        /// The snapshot's version.
        found: u32,
        /// The newest version this build reads.
        supported: u32,
    },
    /// Older than any format this build can migrate.
    #[error(
        "group snapshot format version {found} is too old to migrate (this build reads versions \
         {oldest} and later)"
    )]
    TooOld {
        /// The snapshot's version.
        found: u32,
        /// The oldest version this build reads.
        oldest: u32,
    },
    /// Well-formed but inconsistent: corrupted or edited by hand.
    #[error("invalid group snapshot: {0}")]
    Invalid(InvalidSnapshot),
}

/// Where a snapshot is inconsistent, and how.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InvalidSnapshot {
    group: String,
    fingerprint: Option<u64>,
    reason: String,
}

impl InvalidSnapshot {
    /// The group at fault (empty when its name is what is wrong).
    pub fn group(&self) -> &str {
        &self.group
    }

    /// The fingerprint at fault, if the fault is in one.
    pub fn fingerprint(&self) -> Option<u64> {
        self.fingerprint
    }
}

impl fmt::Display for InvalidSnapshot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.fingerprint {
            Some(fp) => write!(
                f,
                "group `{}`, fingerprint `{fp:016x}`: {}",
                self.group, self.reason
            ),
            None => write!(f, "group `{}`: {}", self.group, self.reason),
        }
    }
}

impl Serialize for WorkerId {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        hex64::serialize(&self.raw(), serializer)
    }
}

impl<'de> Deserialize<'de> for WorkerId {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        hex64::deserialize(deserializer).map(WorkerId::from_raw)
    }
}

/// A `u64` as exactly 16 lowercase hex digits.
mod hex64 {
    use super::{Deserialize, Deserializer, Serializer, de};

    pub(super) fn serialize<S: Serializer>(value: &u64, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(&format_args!("{value:016x}"))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<u64, D::Error> {
        let text = String::deserialize(deserializer)?;
        if text.len() != 16 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(de::Error::custom(format_args!(
                "expected 16 hex digits, found `{text}`"
            )));
        }
        u64::from_str_radix(&text, 16).map_err(de::Error::custom)
    }
}
