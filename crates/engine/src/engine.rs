//! The [`Engine`]: many sessions, usable from many threads.
//!
//! Sessions live in shards (maps behind mutexes, held only to find or add a session), and each
//! session has its own mutex, held while one of its events is observed. So one session's slow
//! event (a slow plugin) never holds up another session's.
//!
//! # Configuration tiers
//!
//! Lowest first: the policy file → server-level settings (`LOOPGUARD_*`, give them to
//! [`crate::EngineBuilder::server_settings`]) → the
//! policy's overrides matched by (backend, model) → the session's own settings
//! ([`Engine::set_session_settings`]). A key a tier leaves unset falls through to the tier below.
//! The (backend, model) is the engine's (from its builder) unless a session names its own
//! ([`Engine::set_session_target`]), so one engine serves every model a host talks to.
//! The effective configuration is resolved when a session starts or its target or settings
//! change, never per event: the engine compiles the rules once per distinct list of matching
//! overrides and session [`Settings`] (not once per model name), and each session holds the
//! compiled rules of its tier.
//!
//! # Scopes
//!
//! Sessions are the default scope. A session may also be a worker of a group (a swarm on one
//! task, [`Engine::join_group`]): each of its calls is then recorded in the engine's
//! [`GroupStore`] (in memory by default; Redis with the `redis` feature, see [`crate::store`]),
//! and a fingerprint repeated `group.threshold` times by at least `group.min_workers` workers is
//! a `group_loop` that climbs the policy's `group.ladder` for every worker that continues it.

use std::cell::RefCell;
use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use loopguard_rules::{Config, Settings};
use loopguard_store::{GroupStore, MemoryStore, StoreStatus};

use crate::compiled::CompiledRules;
use crate::event::Event;
use crate::hash::{MapHasher, hash_str};
use crate::session::Session;
use crate::snapshot::{self, SnapshotError};
use crate::verdict::Verdict;

const SHARDS: usize = 16;

/// A session behind its own lock, with its id.
#[derive(Debug)]
struct Entry {
    id: Box<str>,
    /// Set when the engine lets go of the session (removed, evicted, replaced by a restored
    /// one): the per-thread caches must not hand it out again.
    gone: AtomicBool,
    session: Mutex<Session>,
}

type Handle = Arc<Entry>;

fn entry(id: &str, session: Session) -> Handle {
    Arc::new(Entry {
        id: id.into(),
        gone: AtomicBool::new(false),
        session: Mutex::new(session),
    })
}

/// Marks a session the engine let go of.
fn gone(handle: Option<Handle>) {
    if let Some(h) = handle {
        h.gone.store(true, Ordering::Release);
    }
}

thread_local! {
    /// The session this thread observed last, and the number of its engine: a host's thread
    /// mostly serves one session at a time, whose events then skip the shard's lock and map.
    static LAST_SESSION: RefCell<Option<(u64, Weak<Entry>)>> = const { RefCell::new(None) };
}

/// Numbers engines for [`LAST_SESSION`] (a number is never reused).
static ENGINES: AtomicU64 = AtomicU64::new(1);

type Shard = HashMap<Box<str>, Handle, BuildHasherDefault<MapHasher>>;

/// Locks a session. A panic while observing it leaves a poisoned lock, which is taken over as
/// is (as the shards' locks are).
fn lock(session: &Mutex<Session>) -> MutexGuard<'_, Session> {
    session.lock().unwrap_or_else(|e| e.into_inner())
}

/// Distinct session settings whose compiled rules no session uses any more are dropped once
/// the engine holds more than this many.
const MAX_VARIANTS: usize = 32;

/// Most distinct lists of matching overrides compiled; sessions whose target matches another
/// list beyond this run the engine's own rules (a client naming many models cannot make the
/// engine compile without bound).
const MAX_TARGETS: usize = 64;

/// The backend and model a session talks to: what the policy's `overrides` match.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Target {
    /// The backend (e.g. the model server's host); `None`: the engine's.
    pub backend: Option<String>,
    /// The model; `None`: the engine's.
    pub model: Option<String>,
}

/// What an engine built from a policy keeps to resolve a session's own target.
#[derive(Debug)]
struct Resolver {
    policy: loopguard_rules::Policy,
    /// The engine's own target (the builder's backend and model).
    target: Target,
    server: Settings,
    /// The overrides matching the engine's own target.
    overrides: Vec<usize>,
}

/// Rules keyed by the list of matching overrides (`None`: the engine's own target) and the
/// session settings they were compiled with.
type Variants = Vec<(Option<Vec<usize>>, Settings, Arc<CompiledRules>)>;

/// Sessions by id, each observed under its own lock.
#[derive(Debug)]
pub struct Engine {
    /// The rules of sessions with no settings or target of their own.
    rules: Arc<CompiledRules>,
    /// How to resolve a session's own target (engines built from a policy).
    resolver: Option<Box<Resolver>>,
    /// The rules compiled for each distinct target (by its matching overrides).
    targets: Mutex<Vec<(Vec<usize>, Arc<CompiledRules>)>>,
    /// The rules compiled for each distinct (target, session settings) pair.
    variants: Mutex<Variants>,
    store: Arc<dyn GroupStore>,
    /// The engine's store when it is in memory: its state goes into [`Engine::snapshot`].
    memory: Option<Arc<MemoryStore>>,
    shards: Box<[Mutex<Shard>]>,
    /// This engine's number in [`LAST_SESSION`].
    number: u64,
}

impl Engine {
    /// An engine for an already resolved configuration ([`loopguard_rules::Policy::resolve_with`]), with the
    /// built-in detectors only (a `Config` names no plugins) and group counters in memory. For
    /// a policy, with its plugins and a choice of store, use [`Engine::builder`].
    pub fn new(config: Config) -> Engine {
        Engine::from_rules(CompiledRules::new(config))
    }

    pub(crate) fn from_rules(rules: CompiledRules) -> Engine {
        let memory = Arc::new(MemoryStore::default());
        Engine {
            rules: Arc::new(rules),
            resolver: None,
            targets: Mutex::new(Vec::new()),
            variants: Mutex::new(Vec::new()),
            store: Arc::clone(&memory) as Arc<dyn GroupStore>,
            memory: Some(memory),
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            number: ENGINES.fetch_add(1, Ordering::Relaxed),
        }
    }

    /// The engine with its group counters in `store` (`memory`: when that store is in memory,
    /// so that its state is part of snapshots). Only [`crate::EngineBuilder`] calls it, before
    /// any session exists.
    pub(crate) fn set_store(
        mut self,
        store: Arc<dyn GroupStore>,
        memory: Option<Arc<MemoryStore>>,
    ) -> Engine {
        self.store = store;
        self.memory = memory;
        self
    }

    /// The engine resolves sessions' own targets against `policy` (only [`crate::EngineBuilder`]
    /// calls it, before any session exists).
    pub(crate) fn set_resolver(
        mut self,
        policy: &loopguard_rules::Policy,
        target: Target,
        server: Settings,
    ) -> Engine {
        let overrides =
            policy.matching_overrides(target.backend.as_deref(), target.model.as_deref());
        self.resolver = Some(Box::new(Resolver {
            policy: policy.clone(),
            target,
            server,
            overrides,
        }));
        self
    }

    /// Every session (the shards' locks are held only while the list is taken).
    fn sessions(&self) -> Vec<(Box<str>, Handle)> {
        let mut all = Vec::new();
        for shard in self.shards.iter() {
            let map = shard.lock().unwrap_or_else(|e| e.into_inner());
            all.extend(map.iter().map(|(id, s)| (id.clone(), Arc::clone(s))));
        }
        all
    }

    /// The session `id`, if it exists.
    fn get(&self, id: &str) -> Option<Handle> {
        self.shard(id).get(id).map(Arc::clone)
    }

    /// The session `id`, started if it did not exist.
    fn get_or_start(&self, id: &str) -> Handle {
        let mut shard = self.shard(id);
        match shard.get(id) {
            Some(s) => Arc::clone(s),
            None => {
                let s = entry(id, Session::new(Arc::clone(&self.rules)));
                shard.insert(id.into(), Arc::clone(&s));
                s
            }
        }
    }

    /// The session `id`, started if it did not exist, through the thread's last session when
    /// that is the one.
    #[inline]
    fn session(&self, id: &str) -> Handle {
        let last = LAST_SESSION.with(|cell| {
            let last = cell.try_borrow().ok()?;
            let (engine, weak) = last.as_ref()?;
            if *engine != self.number {
                return None;
            }
            let h = weak.upgrade()?;
            (*h.id == *id && !h.gone.load(Ordering::Acquire)).then_some(h)
        });
        if let Some(h) = last {
            return h;
        }
        let h = self.get_or_start(id);
        LAST_SESSION.with(|cell| {
            if let Ok(mut last) = cell.try_borrow_mut() {
                *last = Some((self.number, Arc::downgrade(&h)));
            }
        });
        h
    }

    /// Puts `session` in place of the session `id`.
    fn put(&self, id: &str, session: Session) {
        gone(self.shard(id).insert(id.into(), entry(id, session)));
    }

    /// The store of group counters.
    pub fn store(&self) -> &Arc<dyn GroupStore> {
        &self.store
    }

    /// The health of the group store: for Redis, whether it is reachable, how many exchanges
    /// failed (`errors`), how stale the shared counts may be.
    pub fn store_status(&self) -> StoreStatus {
        self.store.status()
    }

    /// The plugins this engine runs, in policy order.
    #[cfg(feature = "plugins")]
    pub fn plugins(&self) -> &[crate::plugins::LoadedPlugin] {
        self.rules.plugins.list()
    }

    /// Waits until every plugin's background work (e.g. a model consulted asynchronously) has
    /// finished or `timeout` passed; the results apply at each plugin's next event. Replays call
    /// this after every event so they are deterministic. Without the `plugins` feature there
    /// is nothing to wait for.
    pub fn wait_plugins_idle(&self, timeout: std::time::Duration) {
        #[cfg(feature = "plugins")]
        for p in self.plugins() {
            p.plugin().wait_idle(timeout);
        }
        #[cfg(not(feature = "plugins"))]
        let _ = timeout;
    }

    /// Whether any plugin does background work (see [`Engine::wait_plugins_idle`]); never
    /// without the `plugins` feature.
    pub fn has_background_plugins(&self) -> bool {
        #[cfg(feature = "plugins")]
        return self
            .plugins()
            .iter()
            .any(|p| p.plugin().has_background_work());
        #[cfg(not(feature = "plugins"))]
        false
    }

    /// The compiled rules of sessions with no settings of their own.
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
        let session = if matches!(event, Event::Reset { .. }) {
            match self.get(id) {
                Some(s) => s,
                None => return Verdict::allow(),
            }
        } else {
            self.session(id)
        };
        // The shard's lock is released: only this session waits while its event is observed.
        lock(&session.session).observe(event)
    }

    /// Sets a session's own settings tier, replacing the one it had (the session starts if it
    /// did not exist). Keys left unset fall through to the tiers below (the policy's overrides,
    /// the server settings, the policy), so an empty `Settings` removes the tier. The session's
    /// rules are resolved here, once: compiled once per distinct settings and shared by every
    /// session with the same ones. The window keeps its newest calls and the session its loop
    /// counters.
    ///
    /// A `mode` naming a ladder the policy does not define is ignored, and `max_repeats` is kept
    /// within 2 to 1000 (what [`Settings::set`] accepts).
    pub fn set_session_settings(&self, session: &str, settings: Settings) {
        let settings = self.sanitize(settings);
        let handle = self.get_or_start(session);
        let mut s = lock(&handle.session);
        let overrides = s.target().map(|(_, o)| o.clone());
        let rules = self.rules_for(overrides.as_deref(), &settings);
        s.set_rules(rules, settings);
    }

    /// Resolves a session for the backend and model it talks to: the policy's `overrides` that
    /// match them apply to it from now on (the session starts if it did not exist). `None` for
    /// either keeps the engine's own (the builder's). Cheap when nothing changes, so a host may
    /// call it with every request; rules are compiled once per distinct list of matching
    /// overrides. The window and loop counters stay (tool ids mean the same tools in every
    /// target's rules). An engine not built from a policy ([`Engine::new`]) has no overrides to
    /// apply and ignores it.
    pub fn set_session_target(&self, session: &str, backend: Option<&str>, model: Option<&str>) {
        let Some(r) = &self.resolver else {
            return;
        };
        let target = Target {
            backend: backend
                .map(str::to_owned)
                .or_else(|| r.target.backend.clone()),
            model: model.map(str::to_owned).or_else(|| r.target.model.clone()),
        };
        let overrides = r
            .policy
            .matching_overrides(target.backend.as_deref(), target.model.as_deref());
        let handle = self.get_or_start(session);
        let mut s = lock(&handle.session);
        let current = s.target().map_or(&r.overrides, |(_, o)| o);
        if *current == overrides {
            if s.target().is_some_and(|(t, _)| *t != target) {
                s.set_target(Some((target, overrides)));
            }
            return;
        }
        let settings = s.settings();
        let rules = self.rules_for(Some(&overrides), &settings);
        s.set_rules(rules, settings);
        s.set_target(Some((target, overrides)));
    }

    /// The backend and model a session's rules were resolved for: its own
    /// ([`Engine::set_session_target`]), else the engine's.
    pub fn session_target(&self, session: &str) -> Target {
        let own = self.with_session(session, |s| s.target().map(|(t, _)| t.clone()));
        match (own.flatten(), &self.resolver) {
            (Some(t), _) => t,
            (None, Some(r)) => r.target.clone(),
            (None, None) => Target::default(),
        }
    }

    /// The rules a session runs (its target's and settings'), or the engine's own for a session
    /// that does not exist.
    pub fn session_rules(&self, session: &str) -> Arc<CompiledRules> {
        self.with_session(session, |s| Arc::clone(s.rules()))
            .unwrap_or_else(|| Arc::clone(&self.rules))
    }

    /// A session's own settings tier (empty when it has none, or does not exist).
    pub fn session_settings(&self, session: &str) -> Settings {
        self.with_session(session, Session::settings)
            .unwrap_or_default()
    }

    fn sanitize(&self, mut settings: Settings) -> Settings {
        if settings
            .mode
            .as_ref()
            .is_some_and(|m| !self.rules.config.ladders.contains_key(m))
        {
            settings.mode = None;
        }
        settings.max_repeats = settings.max_repeats.map(|n| n.clamp(2, 1000));
        settings
    }

    /// The rules of a target (by its matching overrides; `None` or the engine's own list: the
    /// engine's rules), compiled once per list.
    fn target_rules(&self, overrides: Option<&[usize]>) -> Arc<CompiledRules> {
        let (Some(overrides), Some(r)) = (overrides, &self.resolver) else {
            return Arc::clone(&self.rules);
        };
        if overrides == r.overrides.as_slice() {
            return Arc::clone(&self.rules);
        }
        let mut targets = self.targets.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, rules)) = targets.iter().find(|(o, _)| o.as_slice() == overrides) {
            return Arc::clone(rules);
        }
        if targets.len() >= MAX_TARGETS {
            return Arc::clone(&self.rules);
        }
        let config = r.policy.resolve_matching(overrides, &r.server);
        let rules = Arc::new(self.rules.sibling(config));
        targets.push((overrides.to_vec(), Arc::clone(&rules)));
        rules
    }

    /// The rules for a target and a session settings tier: the target's own for an empty tier,
    /// else compiled once per distinct (target, settings).
    pub(crate) fn rules_for(
        &self,
        overrides: Option<&[usize]>,
        settings: &Settings,
    ) -> Arc<CompiledRules> {
        let base = self.target_rules(overrides);
        if settings.is_empty() {
            return base;
        }
        // The engine's own target is `None`, whatever list it was asked for with.
        let key = if Arc::ptr_eq(&base, &self.rules) {
            None
        } else {
            overrides.map(<[usize]>::to_vec)
        };
        let mut variants = self.variants.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, _, r)) = variants.iter().find(|(o, s, _)| *o == key && s == settings) {
            return Arc::clone(r);
        }
        if variants.len() >= MAX_VARIANTS {
            // Only the engine holds them: no session uses these settings any more.
            variants.retain(|(_, _, r)| Arc::strong_count(r) > 1);
        }
        let rules = Arc::new(base.with_settings(settings));
        variants.push((key, settings.clone(), Arc::clone(&rules)));
        rules
    }

    /// Makes a session a worker of a group (a swarm on one task); the session starts if it did
    /// not exist. `worker` names the worker across hosts (two sessions with the same worker name
    /// count as one worker); joining another group leaves the first.
    pub fn join_group(&self, session: &str, group: &str, worker: &str) {
        lock(&self.get_or_start(session).session).join(group, worker, Arc::clone(&self.store));
    }

    /// Takes a session out of its group (its calls are no longer counted for the swarm).
    pub fn leave_group(&self, session: &str) {
        if let Some(s) = self.get(session) {
            lock(&s.session).leave();
        }
    }

    /// Forgets a group's counters (the swarm completed), in the store and in the escalation
    /// counters of its workers on this engine.
    pub fn clear_group(&self, group: &str) {
        self.store.clear_group(group);
        for (_, s) in self.sessions() {
            lock(&s.session).group_cleared(group);
        }
    }

    /// A session's state as a JSON snapshot (see [`crate::snapshot`]); `None` when the session
    /// does not exist.
    pub fn snapshot_session(&self, id: &str) -> Option<serde_json::Value> {
        self.with_session(id, |s| snapshot::SNAPSHOT.seal(&s.to_snapshot()))
    }

    /// Restores a session from [`Engine::snapshot_session`], replacing the session of that id.
    /// The snapshot is checked first: an invalid one changes nothing. A session that was a worker
    /// of a group is one again, counting in this engine's store.
    pub fn restore_session(
        &self,
        id: &str,
        snapshot: &serde_json::Value,
    ) -> Result<(), SnapshotError> {
        let body: snapshot::SessionV1 = snapshot::open(snapshot)?;
        let session = self.session_from(id, &body)?;
        self.put(id, session);
        Ok(())
    }

    fn session_from(&self, id: &str, body: &snapshot::SessionV1) -> Result<Session, SnapshotError> {
        let settings = body.settings.to_settings();
        if let Some(mode) = &settings.mode
            && !self.rules.config.ladders.contains_key(mode)
        {
            return Err(SnapshotError::Invalid {
                session: id.to_owned(),
                reason: format!(
                    "its settings name the ladder `{mode}`, which the policy does not define"
                ),
            });
        }
        let settings = self.sanitize(settings);
        let target = match (&body.target, &self.resolver) {
            (Some(t), Some(r)) => {
                let target = Target {
                    backend: t.backend.clone(),
                    model: t.model.clone(),
                };
                let overrides = r
                    .policy
                    .matching_overrides(target.backend.as_deref(), target.model.as_deref());
                Some((target, overrides))
            }
            _ => None,
        };
        let rules = self.rules_for(target.as_ref().map(|(_, o)| o.as_slice()), &settings);
        let mut session = Session::from_snapshot(id, body, rules, settings, &self.store)?;
        session.set_target(target);
        Ok(session)
    }

    /// Every session, and the group state when the engine keeps it in memory, as one JSON
    /// snapshot (see [`crate::snapshot`]).
    pub fn snapshot(&self) -> serde_json::Value {
        let mut sessions = std::collections::BTreeMap::new();
        for (id, s) in self.sessions() {
            sessions.insert(id.to_string(), lock(&s.session).to_snapshot());
        }
        let groups = self
            .memory
            .as_ref()
            .and_then(|m| serde_json::to_value(m.snapshot()).ok());
        snapshot::SNAPSHOT.seal(&snapshot::EngineV1 { sessions, groups })
    }

    /// Restores an [`Engine::snapshot`]: its sessions replace the sessions of the same ids (others
    /// are kept) and its group state replaces the in-memory store's. Everything is checked first:
    /// an invalid snapshot changes nothing. Returns how many sessions were restored.
    pub fn restore(&self, snapshot: &serde_json::Value) -> Result<usize, SnapshotError> {
        let body: snapshot::EngineV1 = snapshot::open(snapshot)?;
        let mut sessions = Vec::with_capacity(body.sessions.len());
        for (id, s) in &body.sessions {
            sessions.push((id.as_str(), self.session_from(id, s)?));
        }
        if let Some(groups) = &body.groups {
            let groups = loopguard_store::GroupSnapshot::try_from(groups.clone())?;
            match &self.memory {
                Some(memory) => {
                    memory.restore(&groups)?;
                }
                None if groups.groups().is_empty() => {}
                None => {
                    return Err(SnapshotError::GroupStoreNotInMemory {
                        groups: groups.groups().len(),
                    });
                }
            }
        }
        let restored = sessions.len();
        for (id, s) in sessions {
            self.put(id, s);
        }
        Ok(restored)
    }

    /// The ids of every session the engine holds.
    pub fn session_ids(&self) -> Vec<String> {
        self.shards
            .iter()
            .flat_map(|s| {
                let map = s.lock().unwrap_or_else(|e| e.into_inner());
                map.keys().map(|k| k.to_string()).collect::<Vec<_>>()
            })
            .collect()
    }

    /// Restores the sessions of an [`Engine::snapshot`] one by one: each valid session replaces
    /// the session of its id, an invalid one is skipped and its error returned (group state is
    /// not restored). Fails only when the snapshot itself cannot be read. Returns the ids
    /// restored and the errors of the sessions skipped.
    pub fn restore_sessions(
        &self,
        snapshot: &serde_json::Value,
    ) -> Result<(Vec<String>, Vec<SnapshotError>), SnapshotError> {
        let body: snapshot::EngineV1 = snapshot::open(snapshot)?;
        let mut restored = Vec::new();
        let mut skipped = Vec::new();
        for (id, s) in &body.sessions {
            match self.session_from(id, s) {
                Ok(session) => {
                    self.put(id, session);
                    restored.push(id.clone());
                }
                Err(e) => skipped.push(e),
            }
        }
        Ok((restored, skipped))
    }

    /// Runs `f` on a session's state, if the session exists.
    pub fn with_session<T>(&self, id: &str, f: impl FnOnce(&Session) -> T) -> Option<T> {
        self.get(id).map(|s| f(&lock(&s.session)))
    }

    /// How many sessions the engine holds.
    pub fn session_count(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(|e| e.into_inner()).len())
            .sum()
    }

    /// Forgets a session (its window, text state, settings and plugin state); returns whether
    /// it existed. Hosts that bound their session tables call this for the sessions they drop.
    pub fn remove_session(&self, id: &str, now_ms: u64) -> bool {
        let handle = self.shard(id).remove(id);
        let removed = handle.is_some();
        gone(handle);
        if removed {
            let _ = self.rules.plugins.reset(id, now_ms);
        }
        removed
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
        let mut evicted = Vec::new();
        for shard in self.shards.iter() {
            let mut map = shard.lock().unwrap_or_else(|e| e.into_inner());
            map.retain(|id, s| {
                // A session busy with an event is not idle (and waiting for it would hold up
                // the shard).
                let keep = match s.session.try_lock() {
                    Ok(s) => now_ms.saturating_sub(s.last_event_ms()) < idle,
                    Err(std::sync::TryLockError::Poisoned(p)) => {
                        now_ms.saturating_sub(p.into_inner().last_event_ms()) < idle
                    }
                    Err(std::sync::TryLockError::WouldBlock) => true,
                };
                if !keep {
                    s.gone.store(true, Ordering::Release);
                    evicted.push(id.clone());
                }
                keep
            });
        }
        // Plugins keep their own per-session state: let them forget it too (outside the shards'
        // locks, since a plugin may take its time).
        for id in &evicted {
            let _ = self.rules.plugins.reset(id, now_ms);
        }
        evicted.len()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // test code

    use super::*;
    use crate::{Arguments, Call};

    fn engine() -> Engine {
        let policy = loopguard_rules::Policy::builtin_default().policy.unwrap();
        Engine::new(policy.resolve(None, None))
    }

    fn call(engine: &Engine, session: &str) {
        let args = serde_json::json!({"path": "a.rs"});
        engine.observe(&Event::Call(Call {
            session,
            call_id: "c",
            tool: "read_file",
            arguments: Arguments::Json(&args),
            time_ms: 1,
        }));
    }

    fn seen(engine: &Engine, session: &str) -> Option<u64> {
        engine.with_session(session, Session::calls_seen)
    }

    /// A session removed after this thread observed it last starts anew: the thread's cached
    /// handle is not used again.
    #[test]
    fn removed_session_is_not_found_through_the_threads_last_session() {
        let e = engine();
        call(&e, "s");
        call(&e, "s");
        assert_eq!(seen(&e, "s"), Some(2));
        assert!(e.remove_session("s", 2));
        call(&e, "s");
        assert_eq!(seen(&e, "s"), Some(1));
    }

    /// A session replaced by a restored one is observed in its restored form.
    #[test]
    fn restored_session_replaces_the_threads_last_session() {
        let e = engine();
        call(&e, "s");
        let snap = e.snapshot_session("s").unwrap();
        call(&e, "s");
        call(&e, "s");
        e.restore_session("s", &snap).unwrap();
        call(&e, "s");
        assert_eq!(seen(&e, "s"), Some(2));
    }

    /// Two engines and two sessions on one thread never see each other's sessions.
    #[test]
    fn threads_last_session_belongs_to_one_engine_and_id() {
        let (a, b) = (engine(), engine());
        call(&a, "s");
        call(&b, "s");
        call(&b, "t");
        call(&b, "s");
        assert_eq!(seen(&a, "s"), Some(1));
        assert_eq!(seen(&b, "s"), Some(2));
        assert_eq!(seen(&b, "t"), Some(1));
    }

    /// An idle session evicted after this thread observed it last starts anew.
    #[test]
    fn evicted_session_is_not_found_through_the_threads_last_session() {
        let e = engine();
        call(&e, "s");
        let idle = e.rules().config().time.session_idle_seconds;
        assert_eq!(e.evict_idle(1 + idle.saturating_mul(1000) + 1), 1);
        call(&e, "s");
        assert_eq!(seen(&e, "s"), Some(1));
    }
}
