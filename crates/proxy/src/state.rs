//! The proxy's state: the policy in force with its engine, the sessions, and the judging of
//! requests and responses of every wire format against both.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{MutexGuard, RwLock};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::http::{HeaderMap, StatusCode};
use loopguard_engine::{Action, Arguments, Call, Engine, Event, Text, UserMessage, Verdict};
use loopguard_hash::xxh3 as xxh3_64;
use loopguard_rules::{Policy, Settings};
use loopguard_transcript::Kind;
use serde_json::{Value, json};

use crate::body::{Body, Messages};
use crate::commands;
use crate::error::ApiError;
use crate::judge::{CallIn, Intervention, Judge, Judged};
use crate::metrics::Metrics;
use crate::redact::Secrets;
use crate::session;
use crate::sessions::{self, Book, BookRef, Books, Loaded, Shared, Stored, lock};
use crate::wire::{self, MARK, Seen, Wire};
use crate::{Loader, Options, Setup};

/// Milliseconds since the Unix epoch: event time for the engine.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// A policy in force: the policy, the server tier, and its one engine (every session resolved
/// for its own model inside it).
#[derive(Debug)]
pub struct Guard {
    /// The policy.
    pub policy: Policy,
    engine: Arc<Engine>,
}

impl Guard {
    /// The engine for `setup`. The plugins were checked when the policy was loaded; one that
    /// fails now (its file changed since) is logged and the engine runs the built-in
    /// detectors.
    pub fn new(setup: Setup, backend: Option<String>) -> Guard {
        let build = |plugins: bool| {
            let mut b = Engine::builder(&setup.policy).server_settings(setup.server.clone());
            if let Some(backend) = &backend {
                b = b.backend(backend);
            }
            if !plugins {
                b = b.without_plugins();
            }
            b.build()
        };
        let engine = match build(true) {
            Ok(e) => e,
            Err(error) => {
                tracing::error!(%error, "the policy's plugins cannot be loaded; running the built-in detectors");
                match build(false) {
                    Ok(e) => e,
                    Err(_) => Engine::new(setup.policy.base().clone()),
                }
            }
        };
        Guard {
            policy: setup.policy,
            engine: Arc::new(engine),
        }
    }

    /// The policy's ladder names (the values `tool-loop-mode` accepts).
    pub fn ladders(&self) -> Vec<&str> {
        self.policy
            .base()
            .ladders
            .keys()
            .map(String::as_str)
            .collect()
    }

    fn idle_ms(&self) -> u64 {
        self.policy
            .base()
            .time
            .session_idle_seconds
            .saturating_mul(1000)
    }
}

/// One request's place: its format, session, model and the engine judging it.
#[derive(Debug, Clone)]
pub struct Turn {
    /// The wire format.
    pub wire: Wire,
    /// The session id (scoped to the caller).
    pub session: String,
    /// The model the request names.
    pub model: Option<String>,
    /// Whether the client asked for a stream.
    pub stream: bool,
    /// The engine of the policy in force when the request came.
    pub engine: Arc<Engine>,
    /// Whether this caller may use in-chat commands (and is told about them).
    pub commands: bool,
    /// The client's `x-request-id`, else one the proxy made (for the decision log).
    pub request_id: String,
    /// Assistant messages before the response: the response is the next one.
    pub assistant_turns: u64,
    /// A Responses request whose responses the upstream stores (`store` not false).
    pub stored: bool,
    /// Whether the session's ladder gives repeated calls a second chance
    /// (`chance_then_break`): a stream is then held whole until its calls are judged.
    pub second_chances: bool,
    /// The stored response a Responses request continues (`previous_response_id`).
    pub continues: Option<String>,
    /// The proxy changed the request body (commands taken out, notes added): it is sent
    /// upstream re-serialized; otherwise the client's bytes go as they came.
    pub body_changed: bool,
}

/// What to do with a request once read.
#[derive(Debug)]
pub enum Prepared {
    /// Send it upstream (its body was rewritten in place).
    Forward(Box<Turn>),
    /// Answer it ourselves with this assistant text (in-chat commands).
    Reply(Box<Turn>, String),
    /// Answer with this error.
    Fail(ApiError),
}

/// Everything the handlers share.
pub struct State {
    /// How the proxy runs.
    pub options: Options,
    /// The upstream base URL.
    pub upstream: crate::upstream::Upstream,
    /// The backend the policy's overrides match.
    pub backend: Option<String>,
    /// The counters of `/metrics`.
    pub metrics: Metrics,
    /// The HTTP client for the upstream.
    pub client: reqwest::Client,
    guard: RwLock<Arc<Guard>>,
    /// Per-session books, at most `options.max_sessions`, grouped by caller for eviction.
    books: Books,
    /// Sessions shared with other replicas, when the operator named a store.
    shared: Option<Shared>,
    /// Response id → session, for Responses requests continuing a stored response (when no
    /// store is shared; with one, the store keeps them).
    aliases: std::sync::Mutex<lru::LruCache<String, String>>,
    loader: Option<Arc<dyn Loader>>,
    next_id: AtomicU64,
    /// The key of the credential hashes in session ids: chosen at random at start, shared by
    /// the replicas of one store, or the one saved with restored sessions.
    seed: AtomicU64,
    /// Keyed hashes of the keys allowed in-chat commands (`ChatCommands::Keys`), with their
    /// own key (never saved).
    command_seed: u64,
    command_keys: Vec<u64>,
    /// The decision log, when the operator asked for one.
    decisions: Option<crate::decisions::Log>,
}

impl std::fmt::Debug for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("State")
            .field("upstream", &self.upstream)
            .field("backend", &self.backend)
            .finish_non_exhaustive()
    }
}

/// Most response ids remembered with their session (without a shared store).
const MAX_ALIASES: usize = 100_000;

impl State {
    /// The state for a policy; sessions shared through `shared` when given.
    pub fn new(
        options: Options,
        upstream: crate::upstream::Upstream,
        backend: Option<String>,
        client: reqwest::Client,
        setup: Setup,
        loader: Option<Arc<dyn Loader>>,
    ) -> State {
        use std::hash::BuildHasher;
        let seed = std::collections::hash_map::RandomState::new().hash_one(0x5eed_u64);
        let command_seed = std::collections::hash_map::RandomState::new().hash_one(0xc0de_u64);
        let mut options = options;
        // The operator's keys are kept only as keyed hashes.
        let command_keys = match &mut options.chat_commands {
            crate::ChatCommands::Keys(keys) => {
                let hashed = keys
                    .iter()
                    .map(|k| session::key_hash(k.trim(), command_seed))
                    .collect();
                keys.iter_mut().for_each(|k| *k = "<redacted>".to_owned());
                hashed
            }
            _ => Vec::new(),
        };
        let max_sessions = options.max_sessions;
        State {
            guard: RwLock::new(Arc::new(Guard::new(setup, backend.clone()))),
            seed: AtomicU64::new(seed),
            command_seed,
            command_keys,
            options,
            upstream,
            backend,
            metrics: Metrics::default(),
            client,
            books: Books::new(max_sessions),
            shared: None,
            aliases: std::sync::Mutex::new(lru::LruCache::unbounded()),
            loader,
            next_id: AtomicU64::new(1),
            decisions: None,
        }
    }

    /// Logs every intervention to `log` from now on.
    pub fn with_decisions(mut self, log: Option<crate::decisions::Log>) -> State {
        self.decisions = log;
        self
    }

    /// Shares sessions through `shared` from now on, with the replicas' common key of
    /// credential hashes (read from the store, or stored there by the first replica).
    pub fn with_shared(mut self, shared: Option<Shared>) -> Result<State, sessions::StoreError> {
        if let Some(store) = &shared {
            let seed = store.shared_seed(self.seed.load(Ordering::Relaxed))?;
            self.seed.store(seed, Ordering::Relaxed);
        }
        self.shared = shared;
        Ok(self)
    }

    /// Whether judging may block the thread (plugins may take their time; a shared store is a
    /// network round trip): the server then runs it off the async workers.
    pub fn blocks(&self) -> bool {
        self.shared.is_some() || !self.guard().engine.rules().plugins().is_empty()
    }

    /// The policy in force.
    pub fn guard(&self) -> Arc<Guard> {
        Arc::clone(&self.guard.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// How many sessions the proxy holds.
    pub fn session_count(&self) -> usize {
        self.books.len()
    }

    /// Records that the upstream answered a request of `session` with a success: its caller's
    /// key is one the upstream accepts, and its sessions get a group of their own for eviction.
    pub fn upstream_accepted(&self, session: &str) {
        self.books.accepted(session);
    }

    /// A fresh number for an id the proxy makes itself.
    pub fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// The book of `session`, made the most recently used and brought up to date from the
    /// shared store; evicted sessions leave the engine too.
    fn book(&self, session: &str, engine: &Engine) -> BookRef {
        let (book, evicted) = self.books.get(session);
        let now = now_ms();
        for old in evicted {
            engine.remove_session(&old, now);
            self.metrics.session_evicted("capacity");
        }
        book
    }

    /// Brings a locked book and its engine session up to the shared store's version.
    fn sync(&self, session: &str, engine: &Engine, book: &mut Book) {
        let Some(shared) = &self.shared else {
            return;
        };
        match shared.load(session, book.version.as_deref()) {
            Ok(Loaded::Unchanged) => self.metrics.session_store("hit"),
            Ok(Loaded::Missing) => {
                self.metrics.session_store("miss");
                if book.version.is_some() {
                    // The shared state expired: the session starts over everywhere.
                    engine.remove_session(session, now_ms());
                    *book = Book::default();
                }
            }
            Ok(Loaded::Changed(version, stored)) => {
                self.metrics.session_store("load");
                let Stored {
                    engine: snapshot,
                    book: stored_book,
                } = *stored;
                match snapshot {
                    Some(s) => {
                        if let Err(error) = engine.restore_session(session, &s) {
                            tracing::warn!(session = ?session, %error, "a shared session cannot be restored; it starts over");
                            engine.remove_session(session, now_ms());
                        }
                    }
                    None => {
                        engine.remove_session(session, now_ms());
                    }
                }
                *book = stored_book;
                book.bound();
                book.version = Some(version);
            }
            Err(error) => {
                self.metrics.session_store("error");
                tracing::warn!(%error, "the session store cannot be read; judging with what this replica holds");
            }
        }
    }

    /// Writes a changed session to the shared store.
    fn settle(&self, session: &str, engine: &Engine, book: &mut Book) {
        if !book.dirty {
            return;
        }
        book.dirty = false;
        let Some(shared) = &self.shared else {
            return;
        };
        let version = sessions::new_version();
        let stored = Stored {
            engine: engine.snapshot_session(session),
            book: book.clone(),
        };
        match shared.save(session, &version, book.version.as_deref(), &stored) {
            Ok(clean) => {
                self.metrics
                    .session_store(if clean { "save" } else { "conflict" });
                book.version = Some(version);
            }
            Err(error) => {
                book.dirty = true;
                self.metrics.session_store("error");
                tracing::warn!(%error, "the session store cannot be written; other replicas will not see this request");
            }
        }
    }

    /// Writes the session of `turn` to the shared store if the request changed it (for a
    /// request that ends without its response being judged).
    pub fn settle_turn(&self, turn: &Turn) {
        if self.shared.is_none() {
            return;
        }
        let book = self.book(&turn.session, &turn.engine);
        let mut book = lock(&book);
        self.settle(&turn.session, &turn.engine, &mut book);
    }

    /// The key under which the session of the stored response `id` (an id the upstream chose,
    /// or a client names) is remembered for `caller`: the id as [`sessions::kept`], so that an
    /// upstream's long ids cost little however many are remembered.
    fn alias_key(caller: &str, id: &str) -> String {
        format!("{caller}/{}", sessions::kept(id))
    }

    /// The session of the stored response remembered under `key` ([`State::alias_key`]).
    fn alias(&self, key: &str) -> Option<String> {
        match &self.shared {
            Some(shared) => shared.alias(key).unwrap_or_else(|error| {
                self.metrics.session_store("error");
                tracing::warn!(%error, "the session store cannot be read");
                None
            }),
            None => self
                .aliases
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(key)
                .cloned(),
        }
    }

    /// Remembers `session` under `key` ([`State::alias_key`]).
    fn set_alias(&self, key: &str, session: &str) {
        match &self.shared {
            Some(shared) => {
                if let Err(error) = shared.set_alias(key, session) {
                    self.metrics.session_store("error");
                    tracing::warn!(%error, "the session store cannot be written");
                }
            }
            None => {
                let mut aliases = self.aliases.lock().unwrap_or_else(|e| e.into_inner());
                if aliases.len() >= MAX_ALIASES {
                    aliases.pop_lru();
                }
                aliases.put(key.to_owned(), session.to_owned());
            }
        }
    }

    /// Every session, as one JSON document: `{"version": 2, "key": …, "snapshot": …,
    /// "books": {…}}` (the engine's snapshot of [`Engine::snapshot`], the proxy's books, and the
    /// key of the credential hashes in their ids).
    pub fn sessions_document(&self) -> Value {
        let guard = self.guard();
        let books: serde_json::Map<String, Value> = self
            .books
            .all()
            .into_iter()
            .filter_map(|(id, b)| Some((id, serde_json::to_value(&*lock(&b)).ok()?)))
            .collect();
        // The session ids' key goes with them: restored sessions keep their ids, and the
        // callers the upstream accepted (keyed hashes) keep their own groups.
        json!({
            "version": 2,
            "key": self.seed.load(Ordering::Relaxed).to_string(),
            "snapshot": guard.engine.snapshot(),
            "books": books,
            "accepted": self.books.accepted_callers(),
        })
    }

    /// Restores the sessions of a [`State::sessions_document`] (or of the version 1 document,
    /// one engine snapshot per model); returns how many sessions came back. A session the
    /// policy cannot take is skipped (and logged); a document of another shape is an error.
    pub fn restore_sessions(&self, doc: &Value) -> Result<usize, String> {
        let version = doc.get("version").and_then(Value::as_u64);
        let Some(key) = doc
            .get("key")
            .and_then(Value::as_str)
            .and_then(|k| k.parse::<u64>().ok())
        else {
            return Err("the state file has no session-id `key`".to_owned());
        };
        let guard = self.guard();
        let engine = &guard.engine;
        let snapshots: Vec<(Option<&str>, &Value)> = match version {
            Some(2) => vec![(None, doc.get("snapshot").ok_or("no `snapshot`")?)],
            Some(1) => doc
                .get("engines")
                .and_then(Value::as_array)
                .ok_or("the state file has no `engines` list")?
                .iter()
                .filter_map(|e| Some((e.get("model").and_then(Value::as_str), e.get("snapshot")?)))
                .collect(),
            _ => return Err("not a loopguard proxy state file of version 1 or 2".to_owned()),
        };
        self.seed.store(key, Ordering::Relaxed);
        for caller in doc
            .get("accepted")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .filter(|c| c.len() <= crate::session::MAX_ID && !c.contains('/'))
        {
            self.books.accepted(caller);
        }
        let mut restored = 0;
        for (model, snapshot) in snapshots {
            let (ids, skipped) = engine
                .restore_sessions(snapshot)
                .map_err(|e| format!("a saved engine cannot be read: {e}"))?;
            for error in skipped {
                tracing::warn!(%error, "a saved session cannot be restored; it starts over");
            }
            for id in ids {
                restored += 1;
                if model.is_some() {
                    engine.set_session_target(&id, None, model);
                }
                let book = self.book(&id, engine);
                let mut book = lock(&book);
                let saved = doc
                    .get("books")
                    .and_then(|b| b.get(&id))
                    .and_then(|b| serde_json::from_value::<Book>(b.clone()).ok());
                if let Some(mut saved) = saved {
                    saved.bound();
                    *book = saved;
                }
                book.last_ms = now_ms();
            }
        }
        Ok(restored)
    }

    /// Loads the policy again; on success it replaces the one in force. Sessions carry over:
    /// each is moved into the new policy's engine through its snapshot (counts, escalation,
    /// settings, model); one the new policy cannot take (its settings name a ladder that is
    /// gone) starts over, logged. Events of requests already in flight during the reload are
    /// judged by the old policy and not carried. On failure nothing changes. Returns the new
    /// policy's name and how many sessions carried over.
    pub fn reload(&self) -> Result<(String, usize), String> {
        let loader = self
            .loader
            .as_ref()
            .ok_or_else(|| "this proxy has no policy source to reload".to_owned())?;
        let setup = loader.load()?;
        let guard = Arc::new(Guard::new(setup, self.backend.clone()));
        let old = self.guard();
        let mut kept = 0;
        for id in old.engine.session_ids() {
            let Some(snapshot) = old.engine.snapshot_session(&id) else {
                continue;
            };
            match guard.engine.restore_session(&id, &snapshot) {
                Ok(()) => kept += 1,
                Err(error) => {
                    // Most often a session tier naming a ladder the new policy lacks: the
                    // session keeps its counts without that setting.
                    let mut s = snapshot.clone();
                    if let Some(obj) = s.as_object_mut() {
                        obj.remove("settings");
                    }
                    match guard.engine.restore_session(&id, &s) {
                        Ok(()) => {
                            kept += 1;
                            tracing::warn!(session = ?id, %error, "the reloaded policy cannot take this session's settings; they are unset");
                        }
                        Err(error) => tracing::warn!(
                            session = ?id,
                            %error,
                            "the reloaded policy cannot take this session; it starts over"
                        ),
                    }
                }
            }
        }
        let name = guard.policy.name.clone();
        *self.guard.write().unwrap_or_else(|e| e.into_inner()) = guard;
        Ok((name, kept))
    }

    /// Forgets sessions idle longer than the policy's `time.session_idle_seconds` (by the last
    /// request that used them: the books decide, and an evicted session leaves the engine too;
    /// a session whose settings were just changed in chat has no event yet, and is not idle).
    pub fn evict_idle(&self, now: u64) -> usize {
        let guard = self.guard();
        let evicted = self.books.evict_idle(
            now.saturating_sub(guard.idle_ms()).saturating_add(1),
            self.shared.is_some(),
        );
        for id in &evicted {
            guard.engine.remove_session(id, now);
            self.metrics.session_evicted("idle");
        }
        evicted.len()
    }

    /// The session of a request: the `X-Session-Id` header, else the client's own name for
    /// the conversation, else the session of the stored response it continues, else a hash of
    /// its opening; always scoped to the caller's credential.
    fn identify(&self, wire: Wire, headers: &HeaderMap, body: &mut Body<'_>) -> String {
        let caller = session::caller(headers, self.seed.load(Ordering::Relaxed));
        let id = session::identify(headers, wire, body, |prev| {
            self.alias(&State::alias_key(&caller, prev))
        });
        format!("{caller}/{id}")
    }

    /// Reads a request of any wire format: session, commands, tail events, nudges. Rewrites
    /// `body` into what goes upstream (see [`Turn::body_changed`]).
    pub fn prepare(&self, wire: Wire, headers: &HeaderMap, body: &mut Body<'_>) -> Prepared {
        self.prepare_for(wire, headers, body, None)
    }

    /// [`State::prepare`] for a request whose path names its model and whether it streams
    /// (`routed`: Gemini's), instead of its body.
    pub fn prepare_for(
        &self,
        wire: Wire,
        headers: &HeaderMap,
        body: &mut Body<'_>,
        routed: Option<(Option<String>, bool)>,
    ) -> Prepared {
        let session = self.identify(wire, headers, body);
        let honour = match &self.options.chat_commands {
            crate::ChatCommands::Off => false,
            crate::ChatCommands::Everyone => true,
            crate::ChatCommands::Keys(_) => session::credential(headers).is_some_and(|k| {
                self.command_keys
                    .contains(&session::key_hash(k, self.command_seed))
            }),
        };
        let (model, stream) = match routed {
            Some(given) => given,
            None => (wire.model(body), wire.wants_stream(body)),
        };
        let previous = wire.previous_response(body);
        let stored =
            wire == Wire::Responses && body.get("store").and_then(Value::as_bool) != Some(false);
        let guard = self.guard();
        let engine = Arc::clone(&guard.engine);
        let Some(msgs) = body.messages.as_mut() else {
            return Prepared::Fail(ApiError::invalid_request(
                "invalid_messages",
                match wire {
                    Wire::Responses => "the request needs `input`, a string or a list of items",
                    Wire::Gemini => "the request needs `contents`, an array of contents",
                    _ => "the request needs `messages`, an array of messages",
                },
            ));
        };
        let request_id = request_id(headers).unwrap_or_else(|| format!("lg-{}", self.next_id()));
        let stripped = wire::strip_commands(wire, msgs, honour);
        let now = now_ms();
        let book_ref = self.book(&session, &engine);
        let mut book = lock(&book_ref);
        self.sync(&session, &engine, &mut book);
        book.last_ms = now;
        engine.set_session_target(&session, None, model.as_deref());
        let in_request = assistant_messages(wire, msgs);
        let assistant_turns = if previous.is_some() {
            book.turns.max(in_request)
        } else {
            in_request
        };
        let second_chances = uses_second_chances(&engine, &session);
        let mut turn = Box::new(Turn {
            wire,
            session,
            model,
            stream,
            engine: Arc::clone(&engine),
            commands: honour,
            request_id,
            assistant_turns,
            stored,
            second_chances,
            continues: previous.clone(),
            body_changed: false,
        });
        let ladders = guard.ladders();
        if !stripped.errors.is_empty() {
            self.metrics.command("invalid");
            tracing::info!(session = ?turn.session, errors = ?stripped.errors, "invalid in-chat command; not forwarded");
            return Prepared::Reply(turn, invalid_reply(&stripped.errors, &ladders));
        }
        if !stripped.commands.is_empty() {
            let current = engine.session_settings(&turn.session);
            match commands::apply(&stripped.commands, &current, &ladders) {
                Err(errors) => {
                    self.metrics.command("invalid");
                    tracing::info!(session = ?turn.session, ?errors, "invalid in-chat setting; not forwarded");
                    return Prepared::Reply(turn, invalid_reply(&errors, &ladders));
                }
                Ok((settings, changes)) => {
                    self.metrics.command("applied");
                    tracing::info!(session = ?turn.session, changes = ?changes, now = ?settings.to_string(), "session settings changed in chat");
                    engine.set_session_settings(&turn.session, settings.clone());
                    book.dirty = true;
                    if stripped.reply_needed {
                        self.settle(&turn.session, &engine, &mut book);
                        let text = applied_reply(&changes, &settings, &guard.policy.name);
                        return Prepared::Reply(turn, text);
                    }
                }
            }
        }
        if let Err(e) = self.observe_tail(&turn, &mut book, msgs, now) {
            self.settle(&turn.session, &engine, &mut book);
            return Prepared::Fail(*e);
        }
        if let Some(prev) = &previous {
            // Calls of the continued response that the client never saw are answered here,
            // after the tail was judged: these answers are the proxy's, not tool results.
            let withheld = book.take_withheld(prev);
            if !withheld.is_empty() {
                book.dirty = true;
                for (call, note) in withheld.iter().rev() {
                    msgs.insert(0, wire::responses::withheld_output(call, note));
                }
            }
        }
        let text_notes: Vec<(u64, String, bool)> = book.text_notes.iter().cloned().collect();
        wire::apply_text_notes(wire, msgs, &text_notes);
        let anchored: Vec<(String, String)> = book.nudges.iter().cloned().collect();
        let loose = std::mem::take(&mut book.loose);
        if !loose.is_empty() {
            book.dirty = true;
        }
        let placement = self
            .options
            .nudge
            .unwrap_or(engine.session_rules(&turn.session).config().nudge);
        wire::apply_nudges(wire, msgs, &anchored, &loose, placement);
        turn.body_changed = body.changed();
        Prepared::Forward(turn)
    }

    /// Feeds the new tool results and user messages to the engine.
    fn observe_tail(
        &self,
        turn: &Turn,
        book: &mut Book,
        msgs: &mut Messages<'_>,
        now: u64,
    ) -> Result<(), Box<ApiError>> {
        let wire = turn.wire;
        let tail = wire::tail_start(wire, msgs);
        let tail_values = msgs.values(tail);
        // A retried request has the same tail at the same place; a user who says the same
        // thing again says it further down the conversation.
        let text: String = tail_values.iter().map(Value::to_string).collect();
        let hash = xxh3_64(format!("{tail}\u{1e}{text}").as_bytes());
        let repeated = book.tail_hash == Some(hash);
        if book.tail_hash != Some(hash) {
            book.tail_hash = Some(hash);
            book.dirty = true;
        }
        // The tail's events, read as `loopctl simulate` reads them (the tail alone: what came
        // before it was judged by earlier requests). They all belong to the turn after the
        // last assistant message.
        //
        // An assistant message before the tail that made no structured call may have written
        // one in its text (a ReAct action, XML tool use, a JSON action, a shell block): it is
        // read with the tail, so that the observation the framework sent back (a user message)
        // answers that call instead of reading as a person's words. The call ran already; it
        // is judged now, under an id of its turn's number, and its verdict goes with the
        // observation (`Book::text_note`).
        let written = tail > 0 && wire.may_write_call_in_text(msgs, tail - 1);
        let items = if written {
            wire.read(&msgs.values(tail - 1))
        } else {
            wire.read_tail(msgs, tail)
        };
        let at_turn = turn.assistant_turns;
        let text_id = format!("text-{at_turn}");
        let mut written_id: Option<&str> = None;
        for item in &items {
            if written && item.line == 1 {
                // The assistant message's own text was judged with the response it came in.
                if let Kind::Call {
                    id,
                    tool,
                    arguments,
                } = &item.kind
                    && written_id.is_none()
                {
                    written_id = Some(id);
                    if !book.first_sight(&format!("{text_id}/call")) {
                        continue;
                    }
                    book.dirty = true;
                    self.metrics.tool_call();
                    let v = turn.engine.observe(&Event::Call(Call {
                        session: &turn.session,
                        call_id: &text_id,
                        tool,
                        arguments: match arguments {
                            loopguard_transcript::Args::Json(v) => Arguments::Json(v),
                            loopguard_transcript::Args::Raw(s) => Arguments::Raw(s),
                        },
                        time_ms: now,
                    }));
                    if v.is_allow() {
                        log_notes(&v, &turn.session);
                        book.called(&text_id, tool);
                        continue;
                    }
                    self.record(&v, turn, at_turn, "call", Some(tool), Some(&text_id));
                    match v.action {
                        Action::Terminate => {
                            return Err(Box::new(stop_error(&v, Some(tool), turn)));
                        }
                        // Too late to keep the call from running: its output is kept from
                        // the model instead.
                        Action::Block | Action::Ask => {
                            book.called(&text_id, tool);
                            book.text_note(at_turn, note(&v), true);
                        }
                        _ => {
                            book.called(&text_id, tool);
                            book.text_note(at_turn, note(&v), false);
                        }
                    }
                }
                continue;
            }
            match &item.kind {
                Kind::Result {
                    id, output, error, ..
                } => {
                    let id = if written_id == Some(id.as_str()) {
                        &text_id
                    } else {
                        id
                    };
                    if id.is_empty() || !book.first_sight(id) {
                        continue;
                    }
                    book.dirty = true;
                    self.metrics.tool_result();
                    let v = turn
                        .engine
                        .observe(&Event::Result(loopguard_engine::ToolResult {
                            session: &turn.session,
                            call_id: id,
                            output,
                            is_error: *error,
                            exit_code: None,
                            time_ms: now,
                        }));
                    if v.is_allow() {
                        log_notes(&v, &turn.session);
                        continue;
                    }
                    let tool = wire
                        .call_name(msgs, id)
                        .or_else(|| book.tool_of(id).map(str::to_owned));
                    self.record(&v, turn, at_turn, "result", tool.as_deref(), Some(id));
                    if v.action == Action::Terminate {
                        return Err(Box::new(stop_error(&v, tool.as_deref(), turn)));
                    }
                    if *id == text_id {
                        book.text_note(at_turn, note(&v), false);
                    } else {
                        book.nudge(id, note(&v));
                    }
                }
                Kind::User { text, injected } if !repeated => {
                    if text.trim().is_empty() {
                        continue;
                    }
                    book.dirty = true;
                    let v = turn.engine.observe(&Event::User(UserMessage {
                        session: &turn.session,
                        text,
                        injected: *injected,
                        time_ms: now,
                    }));
                    if !v.is_allow() {
                        self.record(&v, turn, at_turn, "user", None, None);
                        if v.action == Action::Terminate {
                            return Err(Box::new(stop_error(&v, None, turn)));
                        }
                        book.loose.push(note(&v));
                    } else {
                        log_notes(&v, &turn.session);
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Counts and logs a verdict the proxy acts on, and writes it to the decision log.
    fn record(
        &self,
        v: &Verdict,
        turn: &Turn,
        at_turn: u64,
        kind: &'static str,
        tool: Option<&str>,
        tool_call_id: Option<&str>,
    ) {
        self.record_with(v, turn, at_turn, kind, tool, tool_call_id, None, now_ms());
    }

    #[allow(clippy::too_many_arguments)]
    fn record_with(
        &self,
        v: &Verdict,
        turn: &Turn,
        at_turn: u64,
        kind: &'static str,
        tool: Option<&str>,
        tool_call_id: Option<&str>,
        second_chance: Option<&'static str>,
        time_ms: u64,
    ) {
        let session = turn.session.as_str();
        if let Some(log) = &self.decisions {
            log.write(
                crate::decisions::At {
                    request_id: &turn.request_id,
                    session,
                    model: turn.model.as_deref(),
                    turn: at_turn,
                    kind,
                    tool,
                    tool_call_id,
                    second_chance,
                },
                v,
                time_ms,
            );
        }
        let detector = v.detector.as_deref().unwrap_or("unknown");
        self.metrics.intervention(v.action.as_str(), detector);
        // Client-given text (session ids, tool names) is logged escaped (`?`): a newline in
        // it cannot forge a log line. The message, which may quote the call, is for debug.
        tracing::info!(
            session = ?session,
            action = v.action.as_str(),
            detector = ?detector,
            tool = ?tool.unwrap_or("-"),
            count = v.count,
            rule = ?v.rule.as_deref().unwrap_or("-"),
            "loop intervention"
        );
        tracing::debug!(session = ?session, message = ?v.message, "loop intervention message");
        log_notes(v, session);
    }
}

/// How many assistant messages a conversation holds, as `loopctl simulate` counts them: each
/// assistant message, and (Responses) each run of output items one model turn wrote (a
/// message, reasoning, calls), and (Gemini) each run of `model` contents.
fn assistant_messages(wire: Wire, msgs: &mut Messages<'_>) -> u64 {
    let mut count = 0;
    let mut previous = false;
    for i in 0..msgs.len() {
        let assistant = wire.seen(msgs, i) == Seen::Assistant;
        if assistant && !(previous && matches!(wire, Wire::Responses | Wire::Gemini)) {
            count += 1;
        }
        previous = assistant;
    }
    count
}

/// Whether the session's ladders include `chance_then_break` (its policy's, a category's, or
/// its own mode).
fn uses_second_chances(engine: &Engine, session: &str) -> bool {
    let rules = engine.session_rules(session);
    let c = rules.config();
    c.ladder == SECOND_CHANCE_LADDER
        || c.categories
            .iter()
            .any(|cat| cat.ladder.as_deref() == Some(SECOND_CHANCE_LADDER))
}

/// The ladder that gives a repeated call a second chance.
const SECOND_CHANCE_LADDER: &str = "chance_then_break";

/// The client's `x-request-id`: printable ASCII, at most 128 bytes (anything else is ignored).
fn request_id(headers: &HeaderMap) -> Option<String> {
    let id = headers.get("x-request-id")?.to_str().ok()?.trim();
    (!id.is_empty() && id.len() <= 128 && id.bytes().all(|b| b.is_ascii_graphic()))
        .then(|| id.to_owned())
}

fn log_notes(v: &Verdict, session: &str) {
    for n in &v.notes {
        // A plugin's message may quote arguments or output: only at debug.
        tracing::warn!(session = ?session, code = n.code, plugin = ?n.plugin, "a detector plugin reported a problem");
        tracing::debug!(session = ?session, plugin = ?n.plugin, message = ?n.message, "plugin note");
    }
}

/// The note the model sees for a verdict.
fn note(v: &Verdict) -> String {
    format!("{MARK} {}", v.message)
}

/// The error a terminate verdict answers with.
pub fn stop_error(v: &Verdict, tool: Option<&str>, turn: &Turn) -> ApiError {
    let session = turn.session.as_str();
    let detector = v.detector.as_deref().unwrap_or("loop");
    let tool_text = tool.map_or("a tool".to_owned(), |t| format!("`{t}`"));
    let commands = if turn.commands {
        "; to change the limit for this session, send `!/set(tool-loop-max-repeats=N)`, \
         `!/set(tool-loop-mode=chance_then_break)` or `!/set(tool-loop-detection=false)` as a \
         user message"
    } else {
        ""
    };
    let message = format!(
        "loopguard stopped this agent run: {} (tool {tool_text}, {} times, detector `{detector}`). \
         To go on, change the approach (other arguments or another tool) or send a new user \
         message{commands}.",
        v.message.trim_end_matches('.'),
        v.count
    );
    let mut e = ApiError::new(
        StatusCode::BAD_REQUEST,
        "loop_detected",
        "tool_loop_terminated",
        message,
    );
    e.detail = Some(json!({
        "action": v.action.as_str(),
        "tool": tool,
        "count": v.count,
        "detector": v.detector.as_deref(),
        "rule": v.rule.as_deref(),
        "session": session,
        "loop_start_call": v.loop_start.as_ref().map(|c| c.seq),
        "loop_start_call_id": v.loop_start.as_ref().map(|c| c.call_id.as_str()).filter(|s| !s.is_empty()),
    }));
    e
}

fn describe(settings: &Settings) -> String {
    let mut parts = Vec::new();
    if let Some(v) = settings.enabled {
        parts.push(format!("tool-loop-detection={v}"));
    }
    if let Some(v) = settings.max_repeats {
        parts.push(format!("tool-loop-max-repeats={v}"));
    }
    if let Some(v) = settings.ttl_seconds {
        parts.push(format!("tool-loop-ttl={v}"));
    }
    if let Some(v) = &settings.mode {
        parts.push(format!("tool-loop-mode={v}"));
    }
    parts.join(", ")
}

fn applied_reply(changes: &[String], settings: &Settings, policy: &str) -> String {
    let now = if settings.is_empty() {
        format!("none: everything comes from the policy `{policy}`")
    } else {
        format!(
            "{} (the rest from the policy `{policy}`)",
            describe(settings)
        )
    };
    format!(
        "{MARK} Done: {}. Loop-detection settings of this session: {now}.",
        changes.join(", ")
    )
}

fn invalid_reply(errors: &[String], ladders: &[&str]) -> String {
    format!(
        "{MARK} Not sent to the model, nothing changed: {}. The commands are {}.",
        errors.join("; "),
        commands::usage(ladders)
    )
}

/// The tool result the upstream sees for a repeated call it is given a second chance on.
pub const SECOND_CHANCE: &str = "This exact call was just made and failed the same way: change \
     the arguments or the approach.";

/// Judges the turns of one upstream response for one request.
#[derive(Debug, Clone)]
pub struct TurnJudge {
    /// The proxy's state.
    pub state: Arc<State>,
    /// The request.
    pub turn: Turn,
    /// A lone call warned by the `chance_then_break` ladder's first step: the call and the
    /// guidance. The server withholds it and asks the upstream once more (see
    /// [`TurnJudge::second_chance`]).
    pub chance: Option<(CallIn, String)>,
    /// This judge is judging the upstream's second answer: no further chance.
    pub retried: bool,
    /// The id of the response being judged (Responses: the client continues from it).
    pub response_id: Option<String>,
    /// The warn verdict given the second chance (and when), recorded once the second answer
    /// says how it went.
    pending_chance: Option<(Verdict, CallIn, u64)>,
    /// The request's credentials, taken out of errors the upstream streams back.
    secrets: Secrets,
}

impl TurnJudge {
    /// A judge for a turn of `turn`.
    pub fn new(state: Arc<State>, turn: Turn) -> TurnJudge {
        TurnJudge {
            state,
            turn,
            chance: None,
            retried: false,
            response_id: None,
            pending_chance: None,
            secrets: Secrets::default(),
        }
    }

    /// The judge with the request's credentials, to take out of errors the upstream streams.
    pub fn with_secrets(mut self, secrets: Secrets) -> TurnJudge {
        self.secrets = secrets;
        self
    }

    /// The request's credentials, taken out of what the upstream says back.
    pub fn secrets(&self) -> &Secrets {
        &self.secrets
    }

    /// The call to withhold and the tool result to answer it with, when the upstream's answer
    /// was a lone repeated call under `chance_then_break` and no second chance was given yet.
    pub fn second_chance(&mut self) -> Option<(CallIn, String)> {
        if self.retried {
            return None;
        }
        self.chance.take()
    }

    /// The second chance was taken: the next answer is judged as the upstream's last.
    pub fn retrying(&mut self) {
        self.retried = true;
    }

    /// How the second chance went (`changed`, `repeated`, `failed`): counted, and the warning
    /// given for it written to the decision log with the outcome.
    pub fn chance_outcome(&mut self, outcome: &'static str) {
        self.state.metrics.second_chance(outcome);
        self.record_chance(outcome);
    }

    /// Writes the warning that gave the second chance, with how it went (once).
    fn record_chance(&mut self, outcome: &'static str) {
        if let Some((v, call, time_ms)) = self.pending_chance.take() {
            self.state.record_with(
                &v,
                &self.turn,
                self.turn.assistant_turns + 1,
                "call",
                Some(&call.name),
                Some(&call.id),
                Some(outcome),
                time_ms,
            );
        }
    }

    /// Runs `f` with the session's book locked and brought up to date; the book is written to
    /// the shared store afterwards when it changed.
    fn with_book<T>(&self, f: impl FnOnce(&mut Book) -> T) -> T {
        let state = &self.state;
        let turn = &self.turn;
        let book = state.book(&turn.session, &turn.engine);
        let mut book: MutexGuard<'_, Book> = lock(&book);
        let out = f(&mut book);
        state.settle(&turn.session, &turn.engine, &mut book);
        out
    }
}

impl Judge for TurnJudge {
    fn set_response_id(&mut self, id: &str) {
        self.response_id = Some(id.to_owned());
    }

    fn redact(&self, error: &mut Value) -> bool {
        self.secrets.value(error)
    }

    fn quotes_secret(&self, raw: &str) -> bool {
        self.secrets.quoted_in(raw)
    }

    fn answer_turn(&self) -> u64 {
        self.turn.assistant_turns
    }

    fn judge(&mut self, text: &str, calls: &[CallIn]) -> Judged {
        let state = Arc::clone(&self.state);
        let turn = self.turn.clone();
        let retried = self.retried;
        let response_id = self.response_id.clone();
        let mut records = Vec::new();
        let (judged, chance) = self.with_book(|book| {
            let now = now_ms();
            book.last_ms = now;
            book.dirty = true;
            book.turns = turn.assistant_turns + 1;
            let judged = judge_turn(&state, &turn, book, text, calls, retried, now, &mut records);
            if let Some(id) = &response_id
                && turn.wire == Wire::Responses
            {
                if let Some((caller, within)) = turn.session.split_once('/') {
                    state.set_alias(&State::alias_key(caller, id), within);
                }
                if turn.stored && judged.0.terminate.is_none() {
                    // Calls the upstream stored and the client never sees are answered with
                    // the refusal when the client continues from this response.
                    let note = judged
                        .0
                        .note
                        .clone()
                        .unwrap_or_else(|| format!("{MARK} This call was not run."));
                    for (i, c) in calls.iter().enumerate() {
                        if !judged.0.releases(i) && !c.id.is_empty() {
                            book.withhold(id, &c.id, note.clone());
                        }
                    }
                }
            }
            judged
        });
        if retried && self.pending_chance.is_some() {
            // The second answer's decisions follow the warning that gave it its chance.
            let outcome = if judged
                .interventions
                .iter()
                .any(|i| i.tool_call_id.is_some() && i.action != "warn")
                || judged.terminate.is_some()
            {
                "repeated"
            } else {
                "changed"
            };
            self.record_chance(outcome);
        }
        for r in records {
            state.record_with(
                &r.verdict,
                &turn,
                r.at_turn,
                r.kind,
                r.tool.as_deref(),
                r.call_id.as_deref(),
                None,
                r.time_ms,
            );
        }
        if let Some((call, guidance, v)) = chance {
            self.chance = Some((call.clone(), guidance));
            self.pending_chance = Some((v, call, now_ms()));
        }
        judged
    }
}

/// A decision of a turn, written to the log once the turn is judged.
#[derive(Debug)]
struct Record {
    verdict: Verdict,
    at_turn: u64,
    kind: &'static str,
    tool: Option<String>,
    call_id: Option<String>,
    time_ms: u64,
}

/// A judged turn, and the second chance to offer when its lone call was warned by the first
/// step of `chance_then_break`.
type Decided = (Judged, Option<(CallIn, String, Verdict)>);

#[allow(clippy::too_many_arguments)]
fn judge_turn(
    state: &State,
    turn: &Turn,
    book: &mut Book,
    text: &str,
    calls: &[CallIn],
    retried: bool,
    now: u64,
    records: &mut Vec<Record>,
) -> Decided {
    let mut done = Vec::new();
    let seen = |v: &Verdict, call: Option<&CallIn>| Intervention {
        action: v.action.as_str(),
        detector: v.detector.as_deref().unwrap_or("loop").to_owned(),
        rule: v.rule.clone().unwrap_or_default(),
        count: v.count,
        tool_call_id: call.map(|c| c.id.clone()),
    };
    let at_turn = turn.assistant_turns + 1;
    // A call written in the text (a ReAct action, XML tool use, a JSON action) is judged when
    // its observation comes back (`observe_tail`); what the turn says beside it is narration.
    let written = if calls.is_empty() {
        loopguard_transcript::prose_beside_text_call(text)
    } else {
        None
    };
    let (text, narration) = match written {
        Some(prose) => (prose, true),
        None => (text, !calls.is_empty()),
    };
    if (calls.is_empty() && written.is_none()) || !text.trim().is_empty() {
        let v = turn.engine.observe(&Event::Text(Text {
            session: &turn.session,
            text,
            chunk: false,
            end_of_turn: true,
            reasoning: false,
            narration,
            time_ms: now,
        }));
        if !v.is_allow() {
            records.push(Record {
                verdict: v.clone(),
                at_turn,
                kind: "text",
                tool: None,
                call_id: None,
                time_ms: now,
            });
            if v.action == Action::Terminate {
                return (
                    Judged {
                        terminate: Some(stop_error(&v, None, turn)),
                        ..Judged::default()
                    },
                    None,
                );
            }
            book.loose.push(note(&v));
            done.push(seen(&v, None));
        } else {
            log_notes(&v, &turn.session);
        }
    }
    let mut released = Vec::new();
    let mut refused = Vec::new();
    let mut asked = Vec::new();
    let mut chance = None;
    for (i, c) in calls.iter().enumerate() {
        state.metrics.tool_call();
        let v = turn.engine.observe(&Event::Call(Call {
            session: &turn.session,
            call_id: &c.id,
            tool: &c.name,
            arguments: Arguments::Raw(&c.arguments),
            time_ms: now,
        }));
        if v.is_allow() {
            log_notes(&v, &turn.session);
            book.called(&c.id, &c.name);
            released.push(i);
            continue;
        }
        let offered = v.action == Action::Warn
            && calls.len() == 1
            && !retried
            && v.rule
                .as_deref()
                .is_some_and(|r| r.ends_with("ladders.chance_then_break[0]"));
        if offered {
            // Written to the decision log once the second answer says how it went.
            chance = Some((
                c.clone(),
                format!("{MARK} {SECOND_CHANCE} {}", v.message),
                v.clone(),
            ));
        } else {
            records.push(Record {
                verdict: v.clone(),
                at_turn,
                kind: "call",
                tool: Some(c.name.clone()),
                call_id: Some(c.id.clone()),
                time_ms: now,
            });
        }
        if v.action != Action::Terminate {
            done.push(seen(&v, Some(c)));
        }
        match v.action {
            Action::Allow => released.push(i),
            Action::Warn => {
                released.push(i);
                book.called(&c.id, &c.name);
                book.nudge(&c.id, note(&v));
            }
            Action::Block => refused.push(note(&v)),
            Action::Ask => asked.push(note(&v)),
            Action::Terminate => {
                return (
                    Judged {
                        terminate: Some(stop_error(&v, Some(&c.name), turn)),
                        ..Judged::default()
                    },
                    None,
                );
            }
        }
    }
    if !asked.is_empty() {
        // `ask`: the turn goes back to the user with the question; no call runs meanwhile.
        asked.extend(refused);
        asked.push(format!(
            "{MARK} The tool calls of this turn were not run; reply to go on."
        ));
        return (
            Judged {
                released: Vec::new(),
                interventions: done,
                stop: true,
                note: Some(asked.join("\n")),
                terminate: None,
            },
            chance,
        );
    }
    if refused.is_empty() {
        return (
            Judged {
                released,
                interventions: done,
                ..Judged::default()
            },
            chance,
        );
    }
    if released.is_empty() {
        return (
            Judged {
                released,
                interventions: done,
                stop: true,
                note: Some(refused.join("\n")),
                terminate: None,
            },
            chance,
        );
    }
    // Some calls go through: the refusals reach the model with the first one's result.
    if let Some(anchor) = released.first().and_then(|&i| calls.get(i)) {
        for r in refused {
            book.nudge(&anchor.id, r);
        }
    }
    (
        Judged {
            released,
            interventions: done,
            ..Judged::default()
        },
        chance,
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]

    use super::*;
    use crate::wire::NudgePlacement;
    use std::time::Duration;

    fn policy(text: &str) -> Policy {
        Policy::load_text(std::path::Path::new("t.yaml"), text.to_owned())
            .policy
            .unwrap()
    }

    const TEST_POLICY: &str = "version: 1\nname: t\nescalation: { ladder: default }\n\
        ladders:\n  default:\n    - { repeat: 1, action: warn, message: 'warned {tool}' }\n\
        \x20   - { repeat: 2, action: block, message: 'refused {tool}' }\n\
        \x20   - { repeat: 3, action: terminate, message: 'stopped {tool}' }\n\
        detectors:\n  exact_repeat: { threshold: 3 }\n";

    fn state(nudge: NudgePlacement) -> Arc<State> {
        state_with(Some(nudge), TEST_POLICY)
    }

    fn state_with(nudge: Option<NudgePlacement>, policy_text: &str) -> Arc<State> {
        let options = Options {
            nudge,
            chat_commands: crate::ChatCommands::Everyone,
            ..Options::new("http://127.0.0.1:9")
        };
        Arc::new(State::new(
            options,
            crate::upstream::Upstream::parse("http://127.0.0.1:9").unwrap(),
            None,
            reqwest::Client::new(),
            Setup {
                policy: policy(policy_text),
                server: Settings::default(),
            },
            None,
        ))
    }

    fn call(id: &str) -> CallIn {
        CallIn {
            id: id.into(),
            name: "bash".into(),
            arguments: "{\"command\":\"make\"}".into(),
        }
    }

    fn request(extra: Vec<Value>) -> Value {
        let mut messages = vec![json!({"role": "user", "content": "build"})];
        messages.extend(extra);
        json!({"model": "m", "messages": messages})
    }

    /// Prepares a request given as a value; `body` becomes what goes upstream.
    fn prep(s: &State, wire: Wire, h: &HeaderMap, body: &mut Value) -> Prepared {
        let text = serde_json::to_vec(&*body).unwrap();
        let mut lazy = Body::parse(&text, wire.list_key()).unwrap();
        let out = s.prepare(wire, h, &mut lazy);
        *body = serde_json::from_slice(&lazy.to_bytes()).unwrap();
        out
    }

    fn judge(s: &Arc<State>, body: &mut Value) -> TurnJudge {
        match prep(s, Wire::Chat, &HeaderMap::new(), body) {
            Prepared::Forward(turn) => TurnJudge::new(Arc::clone(s), *turn),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn warn_then_block_then_terminate_with_nudges_in_context() {
        let s = state(NudgePlacement::Context);
        let mut history = Vec::new();
        let mut outcomes = Vec::new();
        for n in 1..=5 {
            let mut body = request(history.clone());
            let mut j = judge(&s, &mut body);
            let id = format!("c{n}");
            let out = j.judge("", &[call(&id)]);
            if let Some(e) = &out.terminate {
                assert!(e.message.contains("stopped bash"), "{}", e.message);
                assert!(e.message.contains("`bash`, 5 times"), "{}", e.message);
                outcomes.push("terminate");
                break;
            }
            if out.stop {
                assert_eq!(out.note.as_deref(), Some("[loopguard] refused bash"));
                outcomes.push("block");
                history.push(json!({"role": "assistant", "content": out.note}));
                continue;
            }
            outcomes.push("release");
            history.push(json!({"role": "assistant", "content": null, "tool_calls": [
                {"id": id, "type": "function", "function": {"name": "bash", "arguments": "{}"}}]}));
            history.push(json!({"role": "tool", "tool_call_id": id, "content": "failed"}));
        }
        assert_eq!(
            outcomes,
            ["release", "release", "release", "block", "terminate"]
        );
        // The warned call's result carries the nudge in the request after it.
        let mut body = request(history);
        let _ = prep(&s, Wire::Chat, &HeaderMap::new(), &mut body);
        let c3 = body["messages"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["tool_call_id"] == "c3")
            .unwrap();
        assert_eq!(c3["content"], "failed\n\n[loopguard] warned bash");
    }

    /// Three identical calls of model `model` (a session of its own); the request after them,
    /// as forwarded.
    fn nudged_request(s: &Arc<State>, model: &str) -> Vec<Value> {
        let mut history = Vec::new();
        for n in 1..=3 {
            let mut body = request(history.clone());
            body["model"] = json!(model);
            body["user"] = json!(model);
            let mut j = judge(s, &mut body);
            let id = format!("c{n}");
            let _ = j.judge("", &[call(&id)]);
            history.push(json!({"role": "assistant", "content": null, "tool_calls": [
                {"id": id, "type": "function", "function": {"name": "bash", "arguments": "{}"}}]}));
            history.push(json!({"role": "tool", "tool_call_id": id, "content": "failed"}));
        }
        let mut body = request(history);
        body["model"] = json!(model);
        body["user"] = json!(model);
        let _ = prep(s, Wire::Chat, &HeaderMap::new(), &mut body);
        body["messages"].as_array().unwrap().clone()
    }

    #[test]
    fn the_policy_places_nudges_per_model_unless_the_flag_does() {
        let text = TEST_POLICY.replace(
            "escalation: { ladder: default }",
            "escalation: { ladder: default, nudge: system }\n\
             overrides:\n  - match: { model: 'ctx-*' }\n    escalation: { nudge: context }",
        );
        let s = state_with(None, &text);
        // The policy says `system`: the result is untouched, a system message follows it.
        let m = nudged_request(&s, "m");
        let at = m.iter().position(|m| m["tool_call_id"] == "c3").unwrap();
        assert_eq!(m[at]["content"], "failed");
        assert_eq!(m[at + 1]["role"], "system", "{m:?}");
        assert!(
            m[at + 1]["content"]
                .as_str()
                .unwrap()
                .contains("warned bash")
        );
        // Its override for `ctx-*` models says `context`: the one engine resolves it for the
        // session's model.
        let m = nudged_request(&s, "ctx-1");
        let c3 = m.iter().find(|m| m["tool_call_id"] == "c3").unwrap();
        assert_eq!(c3["content"], "failed\n\n[loopguard] warned bash");
        // `--nudge context` wins over the policy.
        let s = state_with(Some(NudgePlacement::Context), &text);
        let m = nudged_request(&s, "m");
        let c3 = m.iter().find(|m| m["tool_call_id"] == "c3").unwrap();
        assert_eq!(c3["content"], "failed\n\n[loopguard] warned bash");
        assert!(m.iter().all(|m| m["role"] != "system"), "{m:?}");
    }

    #[test]
    fn a_retried_request_does_not_count_twice() {
        let s = state(NudgePlacement::Context);
        let history = vec![
            json!({"role": "assistant", "tool_calls": [{"id": "c1", "function": {"name": "bash"}}]}),
            json!({"role": "tool", "tool_call_id": "c1", "content": "x"}),
        ];
        for _ in 0..3 {
            let mut body = request(history.clone());
            let _ = prep(&s, Wire::Chat, &HeaderMap::new(), &mut body);
        }
        assert_eq!(
            s.metrics
                .render(0)
                .lines()
                .find(|l| l.starts_with("loopguard_proxy_tool_results_total "))
                .unwrap(),
            "loopguard_proxy_tool_results_total 1"
        );
    }

    #[test]
    fn commands_reply_and_change_the_session() {
        let s = state(NudgePlacement::System);
        let mut body =
            json!({"messages": [{"role": "user", "content": "!/set(tool-loop-max-repeats=5)"}]});
        let Prepared::Reply(turn, text) = prep(&s, Wire::Chat, &HeaderMap::new(), &mut body) else {
            panic!("a pure command is answered by the proxy")
        };
        assert!(text.contains("tool-loop-max-repeats=5"), "{text}");
        assert_eq!(
            turn.engine.session_settings(&turn.session).max_repeats,
            Some(5)
        );
        let mut body =
            json!({"messages": [{"role": "user", "content": "!/set(tool-loop-mode=nope)"}]});
        let Prepared::Reply(_, text) = prep(&s, Wire::Chat, &HeaderMap::new(), &mut body) else {
            panic!("an invalid command is answered by the proxy")
        };
        assert!(text.contains("expected one of"), "{text}");
        assert!(text.contains("Not sent to the model"), "{text}");
    }

    #[test]
    fn a_partial_block_sends_the_refusal_with_a_released_result() {
        let s = state(NudgePlacement::Context);
        let mut body = request(vec![]);
        let mut j = judge(&s, &mut body);
        for id in ["a", "b", "c"] {
            let _ = j.judge("", &[call(id)]);
        }
        let other = CallIn {
            id: "r1".into(),
            name: "read".into(),
            arguments: "{}".into(),
        };
        let out = j.judge("", &[other, call("d")]);
        assert_eq!(out.released, [0]);
        assert!(!out.stop);
        let mut body = request(vec![
            json!({"role": "assistant", "tool_calls": [{"id": "r1", "function": {"name": "read"}}]}),
            json!({"role": "tool", "tool_call_id": "r1", "content": "data"}),
        ]);
        let _ = prep(&s, Wire::Chat, &HeaderMap::new(), &mut body);
        assert_eq!(
            body["messages"][2]["content"],
            "data\n\n[loopguard] refused bash"
        );
    }

    #[test]
    fn the_same_user_words_later_reset_counts() {
        // Regression: a tail hash without its position took a user repeating "go" for a
        // retried request, so the new instruction did not restart the counts.
        let s = state(NudgePlacement::Context);
        let go = json!({"role": "user", "content": "go"});
        let mut body = json!({"messages": [go]});
        let mut j = judge(&s, &mut body);
        for id in ["c1", "c2"] {
            assert_eq!(j.judge("", &[call(id)]), Judged::allow_all(1));
        }
        // A retry of the first request changes nothing: the 3rd call would be warned.
        let mut body = json!({"messages": [go]});
        let _ = prep(&s, Wire::Chat, &HeaderMap::new(), &mut body);
        let history = json!([go, {"role": "assistant", "content": "Shall I go on?"}, go]);
        let mut body = json!({"messages": history});
        let _ = prep(&s, Wire::Chat, &HeaderMap::new(), &mut body);
        let _ = j.judge("", &[call("c3")]);
        let warned = s.metrics.render(0).contains("action=\"warn\"");
        assert!(!warned, "the 2nd `go` restarted the counts");
    }

    // What broke: the engine's own idle eviction took a session whose settings an in-chat
    // command had just set (no event yet, so idle since the epoch) when it ran between the
    // command and the next request.
    #[test]
    fn a_session_with_settings_and_no_event_yet_is_not_idle() {
        let s = state(NudgePlacement::Context);
        let mut body =
            json!({"messages": [{"role": "user", "content": "!/set(tool-loop-mode=break)"}]});
        let Prepared::Reply(turn, _) = prep(&s, Wire::Chat, &HeaderMap::new(), &mut body) else {
            panic!("a command is answered by the proxy")
        };
        assert_eq!(s.evict_idle(now_ms()), 0);
        assert_eq!(
            turn.engine.session_settings(&turn.session).mode.as_deref(),
            Some("break")
        );
    }

    #[test]
    fn idle_sessions_are_evicted() {
        let s = state(NudgePlacement::Context);
        let mut body = request(vec![]);
        let _ = prep(&s, Wire::Chat, &HeaderMap::new(), &mut body);
        assert_eq!(s.session_count(), 1);
        assert_eq!(s.evict_idle(now_ms()), 0);
        let later = now_ms() + Duration::from_secs(7200).as_millis() as u64;
        assert_eq!(s.evict_idle(later), 1);
        assert_eq!(s.session_count(), 0);
    }

    #[test]
    fn a_state_file_keeps_the_callers_the_upstream_accepted() {
        let s = state(NudgePlacement::Context);
        let mut body = request(vec![]);
        let _ = prep(&s, Wire::Chat, &HeaderMap::new(), &mut body);
        s.upstream_accepted("key:00000000000000aa/x");
        let doc = s.sessions_document();
        assert_eq!(doc["accepted"], json!(["key:00000000000000aa"]), "{doc}");
        let again = state(NudgePlacement::Context);
        assert_eq!(again.restore_sessions(&doc), Ok(1));
        assert_eq!(again.sessions_document()["accepted"], doc["accepted"]);
    }

    #[test]
    fn reload_without_a_source_keeps_the_policy() {
        let s = state(NudgePlacement::Context);
        assert!(s.reload().is_err());
        assert_eq!(s.guard().policy.name, "t");
    }

    /// Regression: the answer the proxy writes for a call it withheld from a stored response
    /// was read as that call's tool result, a new outcome, and the loop's count started over.
    #[test]
    fn a_withheld_call_s_answer_does_not_restart_the_loop() {
        let s = state(NudgePlacement::Context);
        let headers = HeaderMap::new();
        let mut outcomes: Vec<&str> = Vec::new();
        for n in 1..=5 {
            let mut body = match outcomes.last() {
                None => json!({"model": "m", "input": "build"}),
                Some(&"block") => {
                    json!({"model": "m", "previous_response_id": format!("resp_{}", n - 1),
                    "input": [{"role": "user", "content": "go on"}]})
                }
                Some(_) => json!({"model": "m", "previous_response_id": format!("resp_{}", n - 1),
                    "input": [{"type": "function_call_output", "call_id": format!("c{}", n - 1),
                        "output": "failed"}]}),
            };
            let Prepared::Forward(turn) = prep(&s, Wire::Responses, &headers, &mut body) else {
                panic!()
            };
            let mut j = TurnJudge::new(Arc::clone(&s), *turn);
            j.set_response_id(&format!("resp_{n}"));
            let out = j.judge("", &[call(&format!("c{n}"))]);
            outcomes.push(if out.terminate.is_some() {
                "terminate"
            } else if out.stop {
                "block"
            } else if out.interventions.is_empty() {
                "allow"
            } else {
                "warn"
            });
        }
        assert_eq!(outcomes, ["allow", "allow", "warn", "block", "terminate"]);
    }

    /// Regression: with the whole Responses input, each output item (a message and the call
    /// beside it) was counted as an assistant message of its own, so the decision log's `turn`
    /// was not the one `loopctl simulate` gives the same conversation.
    #[test]
    fn a_run_of_responses_output_items_is_one_assistant_turn() {
        let s = state(NudgePlacement::Context);
        let headers = HeaderMap::new();
        let turn_of = |input: Value| {
            let mut body = json!({"model": "m", "store": false, "input": input});
            match prep(&s, Wire::Responses, &headers, &mut body) {
                Prepared::Forward(turn) => turn.assistant_turns,
                other => panic!("{other:?}"),
            }
        };
        let answer = |n: u64| {
            vec![
                json!({"type": "reasoning", "id": format!("rs_{n}"), "summary": []}),
                json!({"type": "message", "role": "assistant",
                    "content": [{"type": "output_text", "text": "Building."}]}),
                json!({"type": "function_call", "call_id": format!("c{n}"), "name": "bash",
                    "arguments": "{}"}),
                json!({"type": "function_call_output", "call_id": format!("c{n}"),
                    "output": "failed"}),
            ]
        };
        let mut input = vec![json!({"role": "user", "content": "build"})];
        assert_eq!(turn_of(json!(input.clone())), 0);
        input.extend(answer(1));
        input.extend(answer(2));
        assert_eq!(turn_of(json!(input.clone())), 2);
        // Chat messages are one turn each, even one after another.
        let mut body = request(vec![
            json!({"role": "assistant", "content": "a"}),
            json!({"role": "assistant", "content": "b"}),
        ]);
        let Prepared::Forward(turn) = prep(&s, Wire::Chat, &headers, &mut body) else {
            panic!()
        };
        assert_eq!(turn.assistant_turns, 2);
    }

    #[test]
    fn a_stored_response_s_withheld_call_is_answered_in_the_request_continuing_it() {
        withheld_calls_are_answered(|n| format!("resp_{n}"));
    }

    /// Regression: the response ids an upstream chose were remembered as written (up to
    /// 100,000 of them, and 64 withheld calls per session), so an upstream answering with ids
    /// of megabytes made the proxy keep gigabytes.
    #[test]
    fn upstream_response_ids_are_kept_bounded_and_still_followed() {
        let s = withheld_calls_are_answered(|n| format!("resp_{n}_{}", "r".repeat(1 << 20)));
        let aliases = s.aliases.lock().unwrap();
        assert_eq!(aliases.len(), 4);
        let bound = "anon/".len() + crate::session::MAX_ID;
        assert!(
            aliases
                .iter()
                .all(|(k, v)| k.len() <= bound && v.len() <= bound)
        );
        drop(aliases);
        for (_, book) in s.books.all() {
            let book = lock(&book);
            assert!(book.withheld.iter().all(|(r, c, n)| {
                r.len() <= crate::session::MAX_ID
                    && c.len() <= crate::session::MAX_ID
                    && n.len() < 1024
            }));
        }
    }

    /// Plays a Responses conversation continuing stored responses (the `n`th named
    /// `response(n)`) until a call is refused, and checks that the request continuing the
    /// refusal answers the withheld call and lands in the conversation's session.
    fn withheld_calls_are_answered(response: impl Fn(u64) -> String) -> Arc<State> {
        let s = state(NudgePlacement::Context);
        let headers = HeaderMap::new();
        let mut prev: Option<String> = None;
        let mut refused_at = None;
        for n in 1..=6 {
            let mut body = json!({"model": "m", "input": []});
            match &prev {
                None => body["input"] = json!("build"),
                Some(p) => {
                    body["previous_response_id"] = json!(p);
                    body["input"] = json!([{"type": "function_call_output",
                        "call_id": format!("c{}", n - 1), "output": "failed"}]);
                }
            }
            if refused_at.is_some() {
                // The request after the refusal continues a response whose call the client
                // never saw: the proxy answers it.
                body["input"] = json!([{"role": "user", "content": "go on"}]);
            }
            let Prepared::Forward(turn) = prep(&s, Wire::Responses, &headers, &mut body) else {
                panic!()
            };
            if refused_at.is_some() {
                let input = body["input"].as_array().unwrap();
                assert_eq!(input[0]["type"], "function_call_output");
                assert_eq!(input[0]["call_id"], "c4");
                assert!(
                    input[0]["output"]
                        .as_str()
                        .unwrap()
                        .contains("refused bash")
                );
                let mut probe =
                    Body::from_value(&json!({"previous_response_id": response(1)}), "input")
                        .unwrap();
                assert_eq!(
                    turn.session,
                    s.identify(Wire::Responses, &headers, &mut probe)
                );
                break;
            }
            let mut j = TurnJudge::new(Arc::clone(&s), *turn);
            let id = response(n);
            j.response_id = Some(id.clone());
            let out = j.judge("", &[call(&format!("c{n}"))]);
            if out.stop {
                refused_at = Some(n);
            }
            prev = Some(id);
        }
        assert_eq!(refused_at, Some(4));
        s
    }
}
