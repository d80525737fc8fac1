//! Run-time settings tiers over a policy.
//!
//! Precedence, lowest first:
//!
//! 1. declared defaults (see [`crate::schema`]);
//! 2. the policy file and the files it extends;
//! 3. server-level defaults from the environment (`LOOPGUARD_*`, read by `loopctl`);
//! 4. the policy's `overrides` matched by (backend, model);
//! 5. session settings made at run time through the engine API (or the proxy's in-chat commands).
//!
//! Tiers 3 and 5 are [`Settings`]: each key is either set or falls through to the tier below;
//! `unset` makes it fall through again.

use std::fmt;

use crate::config::Config;

/// A few high-level knobs a server or a session may change without editing the policy.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Settings {
    /// Whether detection runs at all; `false` makes every event allowed at next to no cost.
    pub enabled: Option<bool>,
    /// The exact-repeat threshold, everywhere (top level and every category).
    pub max_repeats: Option<u32>,
    /// Past calls older than this many seconds are forgotten (0: never).
    pub ttl_seconds: Option<u64>,
    /// The ladder every detection goes through (`break`, `chance_then_break`, or any ladder the
    /// policy defines).
    pub mode: Option<String>,
}

/// A key of [`Settings`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SettingKey {
    /// [`Settings::enabled`].
    Enabled,
    /// [`Settings::max_repeats`].
    MaxRepeats,
    /// [`Settings::ttl_seconds`].
    TtlSeconds,
    /// [`Settings::mode`].
    Mode,
}

impl SettingKey {
    /// Every key, in the order they are listed to users.
    pub const ALL: [SettingKey; 4] = [
        SettingKey::Enabled,
        SettingKey::MaxRepeats,
        SettingKey::TtlSeconds,
        SettingKey::Mode,
    ];

    /// The environment variable of this key.
    pub(crate) fn env_var(self) -> &'static str {
        match self {
            SettingKey::Enabled => "LOOPGUARD_ENABLED",
            SettingKey::MaxRepeats => "LOOPGUARD_MAX_REPEATS",
            SettingKey::TtlSeconds => "LOOPGUARD_TTL_SECONDS",
            SettingKey::Mode => "LOOPGUARD_MODE",
        }
    }

    /// The in-chat name of this key (`!/set(tool-loop-max-repeats=4)`).
    pub fn chat_name(self) -> &'static str {
        match self {
            SettingKey::Enabled => "tool-loop-detection",
            SettingKey::MaxRepeats => "tool-loop-max-repeats",
            SettingKey::TtlSeconds => "tool-loop-ttl",
            SettingKey::Mode => "tool-loop-mode",
        }
    }

    /// The key with this in-chat name (exact match), if any.
    pub fn from_chat_name(name: &str) -> Option<SettingKey> {
        SettingKey::ALL.into_iter().find(|k| k.chat_name() == name)
    }
}

/// A value that does not fit its setting.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid value `{value}` for {name}: {expected}")]
pub struct SettingError {
    /// The setting as the user wrote it (an environment variable or in-chat name).
    pub name: String,
    /// The rejected value, as given.
    pub value: String,
    /// What would have been accepted, such as `expected true or false`.
    pub expected: String,
}

impl Settings {
    /// Sets one key from text, as it comes from an environment variable or a chat command.
    /// `ladders` are the ladder names the policy defines, for checking `mode`.
    pub fn set(
        &mut self,
        key: SettingKey,
        value: &str,
        ladders: &[&str],
        name: &str,
    ) -> Result<(), SettingError> {
        let err = |expected: &str| SettingError {
            name: name.to_owned(),
            value: value.to_owned(),
            expected: expected.to_owned(),
        };
        let v = value.trim();
        match key {
            SettingKey::Enabled => {
                self.enabled = Some(match v.to_ascii_lowercase().as_str() {
                    "true" | "1" | "yes" | "on" => true,
                    "false" | "0" | "no" | "off" => false,
                    _ => return Err(err("expected true or false")),
                });
            }
            SettingKey::MaxRepeats => {
                let n: u32 = v
                    .parse()
                    .map_err(|_| err("expected a whole number from 2 to 1000"))?;
                if !(2..=1000).contains(&n) {
                    return Err(err("expected a whole number from 2 to 1000"));
                }
                self.max_repeats = Some(n);
            }
            SettingKey::TtlSeconds => {
                let n: u64 = v
                    .parse()
                    .map_err(|_| err("expected a number of seconds (0 for no expiry)"))?;
                self.ttl_seconds = Some(n);
            }
            SettingKey::Mode => {
                if !ladders.contains(&v) {
                    return Err(err(&format!("expected one of {}", ladders.join(", "))));
                }
                self.mode = Some(v.to_owned());
            }
        }
        Ok(())
    }

    /// Makes a key fall through to the tier below.
    pub fn unset(&mut self, key: SettingKey) {
        match key {
            SettingKey::Enabled => self.enabled = None,
            SettingKey::MaxRepeats => self.max_repeats = None,
            SettingKey::TtlSeconds => self.ttl_seconds = None,
            SettingKey::Mode => self.mode = None,
        }
    }

    /// Reads the `LOOPGUARD_*` variables through `get` (so tests need not touch the process
    /// environment). Every bad value is reported.
    pub fn from_env(
        get: impl Fn(&str) -> Option<String>,
        ladders: &[&str],
    ) -> Result<Settings, Vec<SettingError>> {
        let mut settings = Settings::default();
        let mut errors = Vec::new();
        for key in SettingKey::ALL {
            if let Some(value) = get(key.env_var())
                && let Err(e) = settings.set(key, &value, ladders, key.env_var())
            {
                errors.push(e);
            }
        }
        if errors.is_empty() {
            Ok(settings)
        } else {
            Err(errors)
        }
    }

    /// `self` over `lower`: keys set here win, the rest come from `lower`.
    pub fn over(&self, lower: &Settings) -> Settings {
        Settings {
            enabled: self.enabled.or(lower.enabled),
            max_repeats: self.max_repeats.or(lower.max_repeats),
            ttl_seconds: self.ttl_seconds.or(lower.ttl_seconds),
            mode: self.mode.clone().or_else(|| lower.mode.clone()),
        }
    }

    /// Whether no key is set.
    pub fn is_empty(&self) -> bool {
        *self == Settings::default()
    }

    /// Applies the keys that are set to a resolved configuration.
    pub fn apply(&self, config: &mut Config) {
        if let Some(enabled) = self.enabled {
            config.enabled = enabled;
        }
        if let Some(n) = self.max_repeats {
            config.detectors.exact_repeat.threshold = n;
            for c in &mut config.categories {
                c.detectors.exact_repeat.threshold = n;
            }
            config.window_size = config.window_size.max(n as usize);
        }
        if let Some(ttl) = self.ttl_seconds {
            config.time.ttl_seconds = ttl;
        }
        if let Some(mode) = &self.mode {
            config.ladder.clone_from(mode);
            // The mode is the ladder for every detection: category and detector choices yield.
            for c in &mut config.categories {
                c.ladder = None;
                c.detectors.clear_ladders();
            }
            config.detectors.clear_ladders();
        }
    }
}

impl fmt::Display for Settings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        if let Some(v) = self.enabled {
            parts.push(format!("enabled={v}"));
        }
        if let Some(v) = self.max_repeats {
            parts.push(format!("max_repeats={v}"));
        }
        if let Some(v) = self.ttl_seconds {
            parts.push(format!("ttl_seconds={v}"));
        }
        if let Some(v) = &self.mode {
            parts.push(format!("mode={v}"));
        }
        f.write_str(&parts.join(" "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Policy;

    fn config() -> Config {
        Policy::builtin_default()
            .policy
            .expect("default")
            .base()
            .clone()
    }

    const LADDERS: &[&str] = &["default", "break", "chance_then_break"];

    #[test]
    fn upper_tier_wins_and_unset_falls_through() {
        let mut env = Settings::default();
        env.set(SettingKey::MaxRepeats, "5", LADDERS, "env")
            .expect("valid");
        env.set(SettingKey::Mode, "break", LADDERS, "env")
            .expect("valid");
        let mut session = Settings::default();
        session
            .set(SettingKey::MaxRepeats, "7", LADDERS, "chat")
            .expect("valid");
        let eff = session.over(&env);
        assert_eq!(eff.max_repeats, Some(7));
        assert_eq!(eff.mode.as_deref(), Some("break"));
        session.unset(SettingKey::MaxRepeats);
        assert_eq!(session.over(&env).max_repeats, Some(5));
    }

    #[test]
    fn apply_changes_every_category_and_the_mode() {
        let mut cfg = config();
        let s = Settings {
            enabled: Some(false),
            max_repeats: Some(6),
            ttl_seconds: Some(120),
            mode: Some("chance_then_break".into()),
        };
        s.apply(&mut cfg);
        assert!(!cfg.enabled);
        assert_eq!(cfg.detectors.exact_repeat.threshold, 6);
        assert!(
            cfg.categories
                .iter()
                .all(|c| c.detectors.exact_repeat.threshold == 6)
        );
        assert_eq!(cfg.time.ttl_seconds, 120);
        assert_eq!(cfg.ladder, "chance_then_break");
    }

    #[test]
    fn env_reports_every_bad_value() {
        let env = |k: &str| match k {
            "LOOPGUARD_ENABLED" => Some("maybe".to_owned()),
            "LOOPGUARD_MAX_REPEATS" => Some("1".to_owned()),
            "LOOPGUARD_TTL_SECONDS" => Some("60".to_owned()),
            "LOOPGUARD_MODE" => Some("brake".to_owned()),
            _ => None,
        };
        let errors = Settings::from_env(env, LADDERS).expect_err("invalid");
        assert_eq!(errors.len(), 3);
        assert!(
            errors
                .iter()
                .any(|e| e.name == "LOOPGUARD_MODE" && e.expected.contains("break"))
        );
    }
}
