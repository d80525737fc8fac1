//! The one versioning scheme of loopguard's snapshots, shared by the group snapshots of this
//! crate and the session and engine snapshots of `loopguard-engine`.
//!
//! A snapshot is a JSON object whose `version` field is read first. A [`Format`] names the
//! version it writes, the oldest version it still reads and one migration per version in
//! between: [`Format::open`] refuses a version newer than it writes
//! ([`VersionError::TooNew`]) or older than the oldest it reads ([`VersionError::TooOld`]),
//! migrates an older one step by step, and returns the other fields in the current form, for
//! the format's own strict reader. [`Format::seal`] writes `version` first, then the body.
//!
//! Changing what a format writes means: bump `current`, and append the migration from the
//! previous version, so that every snapshot already written stays readable.
//!
//! ```
//! use loopguard_store::format::{Format, VersionError};
//! use serde_json::{Map, Value, json};
//!
//! /// Version 2 renamed `n` to `count`.
//! fn v1_to_v2(mut fields: Map<String, Value>) -> Result<Map<String, Value>, String> {
//!     let n = fields.remove("n").ok_or("no `n`")?;
//!     fields.insert("count".into(), n);
//!     Ok(fields)
//! }
//! const COUNTER: Format = Format {
//!     what: "counter snapshot",
//!     current: 2,
//!     oldest: 1,
//!     migrations: &[v1_to_v2],
//! };
//! let fields = COUNTER.open(&json!({"version": 1, "n": 3})).unwrap();
//! assert_eq!(fields.get("count"), Some(&json!(3)));
//! assert_eq!(COUNTER.seal(&json!({"count": 3})), json!({"version": 2, "count": 3}));
//! assert!(matches!(
//!     COUNTER.open(&json!({"version": 3})),
//!     Err(VersionError::TooNew { found: 3, supported: 2, .. })
//! ));
//! ```

use serde::Serialize;
use serde_json::{Map, Value};

/// Turns the fields of one version (without `version`) into the next version's; the error
/// says what is missing or wrong.
pub type Migration = fn(Map<String, Value>) -> Result<Map<String, Value>, String>;

/// A versioned snapshot format.
#[derive(Clone, Copy, Debug)]
pub struct Format {
    /// What the snapshot is, for messages (`snapshot`, `group snapshot`).
    pub what: &'static str,
    /// The version this build writes.
    pub current: u32,
    /// The oldest version this build reads (migrating it to `current`).
    pub oldest: u32,
    /// `migrations[i]` turns version `oldest + i` into version `oldest + i + 1`; there are
    /// `current - oldest` of them.
    pub migrations: &'static [Migration],
}

/// A snapshot whose version could not be read, or not migrated to the current format.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum VersionError {
    /// Not a JSON object.
    #[error("malformed {what}: expected a JSON object with a `version` field")]
    NotAnObject {
        /// The format's [`Format::what`].
        what: &'static str,
    },
    /// No `version` field.
    #[error("{what} has no `version` field")]
    Missing {
        /// The format's [`Format::what`].
        what: &'static str,
    },
    /// A `version` that is not a whole number.
    #[error("malformed {what}: `version` must be a whole number, found `{found}`")]
    NotANumber {
        /// The format's [`Format::what`].
        what: &'static str,
        /// The value found, as JSON.
        found: String,
    },
    /// Written by a newer loopguard.
    #[error(
        "{what} format version {found} is newer than this build reads (up to {supported}); \
         restore it with the loopguard version that wrote it or a newer one"
    )]
    TooNew {
        /// The format's [`Format::what`].
        what: &'static str,
        /// The snapshot's version.
        found: u64,
        /// The newest version this build reads.
        supported: u32,
    },
    /// Older than any version this build can migrate.
    #[error(
        "{what} format version {found} is too old to migrate (this build reads versions \
         {oldest} and later)"
    )]
    TooOld {
        /// The format's [`Format::what`].
        what: &'static str,
        /// The snapshot's version.
        found: u64,
        /// The oldest version this build reads.
        oldest: u32,
    },
    /// A migration refused the snapshot.
    #[error("{what} format version {from} cannot be migrated: {reason}")]
    Migration {
        /// The format's [`Format::what`].
        what: &'static str,
        /// The version the failing migration reads.
        from: u32,
        /// What is wrong.
        reason: String,
    },
}

impl Format {
    /// Checks the `version` of a snapshot and returns its other fields, migrated to the current
    /// version.
    pub fn open(&self, snapshot: &Value) -> Result<Map<String, Value>, VersionError> {
        let what = self.what;
        let Value::Object(fields) = snapshot else {
            return Err(VersionError::NotAnObject { what });
        };
        let found = match fields.get("version") {
            None => return Err(VersionError::Missing { what }),
            Some(v) => v.as_u64().ok_or_else(|| VersionError::NotANumber {
                what,
                found: v.to_string(),
            })?,
        };
        if found > u64::from(self.current) {
            return Err(VersionError::TooNew {
                what,
                found,
                supported: self.current,
            });
        }
        if found < u64::from(self.oldest) {
            return Err(VersionError::TooOld {
                what,
                found,
                oldest: self.oldest,
            });
        }
        let mut fields = fields.clone();
        fields.remove("version");
        // `oldest <= found <= current`, so both conversions hold.
        let from = u32::try_from(found).unwrap_or(self.current);
        let skip = (from - self.oldest) as usize;
        for (i, migrate) in self.migrations.iter().enumerate().skip(skip) {
            fields = migrate(fields).map_err(|reason| VersionError::Migration {
                what,
                from: self.oldest + i as u32,
                reason,
            })?;
        }
        Ok(fields)
    }

    /// A snapshot object in the current version: `version` first, then the body's fields.
    pub fn seal<T: Serialize>(&self, body: &T) -> Value {
        let mut out = Map::new();
        out.insert("version".to_owned(), Value::from(self.current));
        // Serializing plain structs of strings, integers and maps with string keys cannot fail.
        if let Ok(Value::Object(fields)) = serde_json::to_value(body) {
            out.extend(fields);
        }
        Value::Object(out)
    }

    /// Whether the format holds together: one migration per version from `oldest` to
    /// `current` (a test of every format calls it).
    pub fn is_consistent(&self) -> bool {
        self.oldest >= 1
            && self.oldest <= self.current
            && self.migrations.len() == (self.current - self.oldest) as usize
    }
}

/// A `u64` as exactly 16 lowercase hex digits, for `#[serde(with = …)]`: JSON numbers above
/// 2^53 do not survive every JSON reader, and hashes use all 64 bits.
pub mod hex64 {
    use serde::de::{self, Deserialize, Deserializer};
    use serde::ser::Serializer;

    /// Writes 16 lowercase hex digits.
    pub fn serialize<S: Serializer>(value: &u64, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(&format_args!("{value:016x}"))
    }

    /// Reads exactly 16 hex digits.
    pub fn parse(text: &str) -> Result<u64, String> {
        if text.len() != 16 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(format!("expected 16 hex digits, found `{text}`"));
        }
        u64::from_str_radix(text, 16).map_err(|e| e.to_string())
    }

    /// Reads 16 hex digits.
    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<u64, D::Error> {
        let text = String::deserialize(deserializer)?;
        parse(&text).map_err(de::Error::custom)
    }
}

/// A list of `u64`s, each as 16 hex digits ([`hex64`]), for `#[serde(with = …)]`.
pub mod hex64_vec {
    use serde::de::{self, Deserialize, Deserializer};
    use serde::ser::{SerializeSeq, Serializer};

    /// Writes each value as 16 lowercase hex digits.
    pub fn serialize<S: Serializer>(values: &[u64], serializer: S) -> Result<S::Ok, S::Error> {
        let mut seq = serializer.serialize_seq(Some(values.len()))?;
        for v in values {
            seq.serialize_element(&format!("{v:016x}"))?;
        }
        seq.end()
    }

    /// Reads a list of 16-hex-digit strings.
    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<u64>, D::Error> {
        let texts = Vec::<String>::deserialize(deserializer)?;
        texts
            .iter()
            .map(|t| super::hex64::parse(t).map_err(de::Error::custom))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use serde_json::json;

    use super::*;

    fn add_b(mut f: Map<String, Value>) -> Result<Map<String, Value>, String> {
        f.insert("b".into(), json!(2));
        Ok(f)
    }

    fn rename_a(mut f: Map<String, Value>) -> Result<Map<String, Value>, String> {
        let a = f.remove("a").ok_or("no `a`")?;
        f.insert("c".into(), a);
        Ok(f)
    }

    const THREE: Format = Format {
        what: "test snapshot",
        current: 3,
        oldest: 1,
        migrations: &[add_b, rename_a],
    };

    #[test]
    fn older_versions_are_migrated_step_by_step() {
        assert!(THREE.is_consistent());
        let from_1 = THREE.open(&json!({"version": 1, "a": 1})).unwrap();
        assert_eq!(Value::Object(from_1), json!({"b": 2, "c": 1}));
        let from_2 = THREE.open(&json!({"version": 2, "a": 1, "b": 5})).unwrap();
        assert_eq!(Value::Object(from_2), json!({"b": 5, "c": 1}));
        let current = THREE.open(&json!({"version": 3, "c": 1})).unwrap();
        assert_eq!(Value::Object(current), json!({"c": 1}));
        assert_eq!(
            THREE.open(&json!({"version": 2})).unwrap_err(),
            VersionError::Migration {
                what: "test snapshot",
                from: 2,
                reason: "no `a`".into()
            }
        );
    }

    #[test]
    fn versions_out_of_reach_are_refused() {
        let err = |v: Value| THREE.open(&v).unwrap_err().to_string();
        assert_eq!(
            err(json!({"version": 4})),
            "test snapshot format version 4 is newer than this build reads (up to 3); restore it \
             with the loopguard version that wrote it or a newer one"
        );
        assert_eq!(
            err(json!({"version": 0})),
            "test snapshot format version 0 is too old to migrate (this build reads versions 1 \
             and later)"
        );
        assert_eq!(err(json!({})), "test snapshot has no `version` field");
        assert_eq!(
            err(json!({"version": "1"})),
            "malformed test snapshot: `version` must be a whole number, found `\"1\"`"
        );
        assert_eq!(
            err(json!([1])),
            "malformed test snapshot: expected a JSON object with a `version` field"
        );
        assert!(matches!(
            THREE.open(&json!({"version": u64::MAX})),
            Err(VersionError::TooNew { .. })
        ));
    }

    #[test]
    fn a_sealed_snapshot_opens_again() {
        let sealed = THREE.seal(&json!({"c": 7}));
        assert_eq!(sealed.get("version"), Some(&json!(3)));
        assert_eq!(Value::Object(THREE.open(&sealed).unwrap()), json!({"c": 7}));
    }

    #[test]
    fn hex64_is_exactly_16_digits() {
        assert_eq!(hex64::parse("00000000000000aa"), Ok(0xaa));
        assert!(hex64::parse("aa").is_err());
        assert!(hex64::parse("000000000000000g").is_err());
        assert!(hex64::parse("+00000000000000a").is_err());
    }
}
