//! Versioned snapshots of group state.
//!
//! A [`GroupSnapshot`] is plain serde data (JSON by [`GroupSnapshot::to_json`], or embedded in a
//! host's own snapshot). Its first field is the format `version`, checked and migrated before
//! anything else by the scheme every loopguard snapshot shares ([`crate::format`], with the
//! format [`GROUP_SNAPSHOT`]). The content is then validated, so a corrupted snapshot is rejected
//! with a message that names the group and the fingerprint, never half restored.
//!
//! Fingerprints and worker ids are written as 16 lowercase hex digits ([`crate::format::hex64`]):
//! JSON numbers above 2^53 do not survive every JSON reader.

use std::collections::HashSet;
use std::fmt;

use serde::de::Deserializer;
use serde::ser::Serializer;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::WorkerId;
use crate::format::{Format, VersionError, hex64};

/// The format of group snapshots: the version this build writes, the oldest it reads and the
/// migrations between them.
pub const GROUP_SNAPSHOT: Format = Format {
    what: "group snapshot",
    current: 1,
    oldest: 1,
    migrations: &[],
};

/// The state of every group of a store: what [`MemoryStore::snapshot`](crate::MemoryStore::snapshot)
/// takes and [`MemoryStore::restore`](crate::MemoryStore::restore) puts back.
///
/// Groups are sorted by name and fingerprints by value, so equal states give equal snapshots.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "Value")]
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
            version: GROUP_SNAPSHOT.current,
            groups,
        }
    }

    /// The format version (always [`GROUP_SNAPSHOT`]'s current one once read: older ones are
    /// migrated).
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
        let value: Value = serde_json::from_str(json).map_err(SnapshotError::Malformed)?;
        Self::try_from(value)
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

/// The body of the current format (the fields besides `version`).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BodyV1 {
    groups: Vec<SnapshotGroup>,
}

impl TryFrom<Value> for GroupSnapshot {
    type Error = SnapshotError;

    /// Reads a snapshot from JSON: checks the version, migrates an older format, validates.
    fn try_from(value: Value) -> Result<Self, SnapshotError> {
        let body: BodyV1 = serde_json::from_value(Value::Object(GROUP_SNAPSHOT.open(&value)?))
            .map_err(SnapshotError::Malformed)?;
        let snapshot = Self {
            version: GROUP_SNAPSHOT.current,
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
    /// A version missing, newer than this build reads, or too old to migrate.
    #[error(transparent)]
    Version(#[from] VersionError),
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
