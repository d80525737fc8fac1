//! The [`Engine`]: many sessions, sharded behind mutexes, usable from many threads.

use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::sync::{Arc, Mutex, MutexGuard};

use loopguard_rules::{Config, Policy};

use crate::compiled::CompiledRules;
use crate::event::Event;
use crate::hash::{StreamHasher, hash_str};
use crate::session::Session;
use crate::verdict::Verdict;

const SHARDS: usize = 16;

type Shard = HashMap<Box<str>, Session, BuildHasherDefault<StreamHasher>>;

/// Sessions by id, each observed under its shard's lock.
#[derive(Debug)]
pub struct Engine {
    rules: Arc<CompiledRules>,
    shards: Box<[Mutex<Shard>]>,
}

impl Engine {
    pub fn new(config: Config) -> Engine {
        Engine {
            rules: Arc::new(CompiledRules::new(config)),
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
        }
    }

    /// An engine for a policy with no backend or model override applied.
    pub fn from_policy(policy: &Policy) -> Engine {
        Engine::new(policy.resolve(None, None))
    }

    pub fn rules(&self) -> &Arc<CompiledRules> {
        &self.rules
    }

    fn shard(&self, session: &str) -> MutexGuard<'_, Shard> {
        let i = hash_str(session) as usize % self.shards.len();
        self.shards[i].lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Observes one event of its session (created on first sight).
    pub fn observe(&self, event: &Event<'_>) -> Verdict {
        let id = event.session();
        let mut shard = self.shard(id);
        if let Some(s) = shard.get_mut(id) {
            return s.observe(event);
        }
        if matches!(event, Event::Reset { .. }) {
            return Verdict::allow();
        }
        let mut s = Session::new(Arc::clone(&self.rules));
        let v = s.observe(event);
        shard.insert(id.into(), s);
        v
    }

    /// Runs `f` on a session's state, if the session exists.
    pub fn with_session<T>(&self, id: &str, f: impl FnOnce(&Session) -> T) -> Option<T> {
        self.shard(id).get(id).map(f)
    }

    pub fn session_count(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(|e| e.into_inner()).len())
            .sum()
    }

    /// Drops sessions with no event for `time.session_idle_seconds` (event time); returns how
    /// many were dropped.
    pub fn evict_idle(&self, now_ms: u64) -> usize {
        let idle = self
            .rules
            .config()
            .time
            .session_idle_seconds
            .saturating_mul(1000);
        let mut evicted = 0;
        for shard in self.shards.iter() {
            let mut map = shard.lock().unwrap_or_else(|e| e.into_inner());
            let before = map.len();
            map.retain(|_, s| now_ms.saturating_sub(s.last_event_ms()) < idle);
            evicted += before - map.len();
        }
        evicted
    }
}
