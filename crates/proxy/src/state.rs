//! The proxy's state: the policy in force with its engines, what the proxy remembers per
//! session, and the judging of requests and responses against both.

use std::collections::{HashMap, VecDeque};

use lru::LruCache;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::http::{HeaderMap, StatusCode};
use loopguard_engine::{
    Action, Arguments, Call, Engine, Event, Text, ToolResult, UserMessage, Verdict,
};
use loopguard_rules::{Policy, Settings};
use serde_json::{Value, json};
use xxhash_rust::xxh3::xxh3_64;

use crate::commands;
use crate::error::ApiError;
use crate::judge::{CallIn, Intervention, Judge, Judged};
use crate::metrics::Metrics;
use crate::request::{self, MARK};
use crate::session;
use crate::{Loader, Options, Setup};

/// Distinct models with an engine of their own; requests for further models share the engine
/// resolved with no model (a client cannot make the proxy compile unbounded engines).
const MAX_ENGINES: usize = 64;
/// Tool-result ids remembered per session, so a retried request is not counted twice.
const MAX_SEEN: usize = 512;
/// Nudges remembered per session (each is re-applied to its tool result in later requests).
const MAX_NUDGES: usize = 64;

/// Milliseconds since the Unix epoch: event time for the engine.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// A policy in force: the policy, the server tier, and one engine per model seen.
#[derive(Debug)]
pub struct Guard {
    pub policy: Policy,
    pub server: Settings,
    backend: Option<String>,
    engines: Mutex<HashMap<Option<String>, Arc<Engine>>>,
}

impl Guard {
    pub fn new(setup: Setup, backend: Option<String>) -> Guard {
        Guard {
            policy: setup.policy,
            server: setup.server,
            backend,
            engines: Mutex::new(HashMap::new()),
        }
    }

    fn engines_map(&self) -> MutexGuard<'_, HashMap<Option<String>, Arc<Engine>>> {
        self.engines.lock().unwrap_or_else(|e| e.into_inner())
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

    /// The engine for a model: the policy resolved for (backend, model) over the server tier.
    pub fn engine(&self, model: Option<&str>) -> Arc<Engine> {
        let mut map = self.engines_map();
        let mut key = model.map(str::to_owned);
        if !map.contains_key(&key) && map.len() >= MAX_ENGINES {
            tracing::warn!(
                model = ?model,
                "more than {MAX_ENGINES} models seen; this one shares the engine without model overrides"
            );
            key = None;
        }
        if let Some(e) = map.get(&key) {
            return Arc::clone(e);
        }
        // The plugins were checked when the policy was loaded; one that fails now (its file
        // changed since) is logged and the engine runs the built-in detectors.
        let plugins = match loopguard_engine::load_plugins(&self.policy) {
            Ok(p) => p,
            Err(errors) => {
                for e in errors {
                    tracing::error!(error = %e.host_error(), "a detector plugin failed to load; running without it");
                }
                Vec::new()
            }
        };
        let mut b = Engine::builder(&self.policy)
            .server_settings(self.server.clone())
            .plugins(plugins);
        if let Some(backend) = &self.backend {
            b = b.backend(backend);
        }
        if let Some(model) = &key {
            b = b.model(model);
        }
        let engine = match b.build() {
            Ok(e) => Arc::new(e),
            Err(error) => {
                tracing::error!(%error, "cannot build an engine; running the built-in detectors");
                let config =
                    self.policy
                        .resolve_with(self.backend.as_deref(), key.as_deref(), &self.server);
                Arc::new(Engine::new(config))
            }
        };
        map.insert(key, Arc::clone(&engine));
        engine
    }

    fn all_engines(&self) -> Vec<Arc<Engine>> {
        self.engines_map().values().cloned().collect()
    }

    fn idle_ms(&self) -> u64 {
        self.policy
            .base()
            .time
            .session_idle_seconds
            .saturating_mul(1000)
    }
}

/// A session's book, under its own lock.
type BookRef = Arc<Mutex<Book>>;

/// Locks a book (a panic while it was held leaves it as it was: every field stays valid).
fn lock(book: &Mutex<Book>) -> MutexGuard<'_, Book> {
    book.lock().unwrap_or_else(|e| e.into_inner())
}

/// What the proxy remembers about a session besides the engine's state.
#[derive(Debug, Default)]
struct Book {
    last_ms: u64,
    /// The session's run-time settings (also held by the engine; kept here so they survive a
    /// policy reload and a change of model).
    settings: Settings,
    results_seen: VecDeque<String>,
    tail_hash: Option<u64>,
    /// (tool_call_id, note): applied to that tool result in every later request.
    nudges: VecDeque<(String, String)>,
    /// Notes about no call, for the next request only.
    loose: Vec<String>,
}

impl Book {
    fn first_sight(&mut self, id: &str) -> bool {
        if self.results_seen.iter().any(|s| s == id) {
            return false;
        }
        if self.results_seen.len() >= MAX_SEEN {
            self.results_seen.pop_front();
        }
        self.results_seen.push_back(id.to_owned());
        true
    }

    fn nudge(&mut self, anchor: &str, text: String) {
        if self.nudges.len() >= MAX_NUDGES {
            self.nudges.pop_front();
        }
        self.nudges.push_back((anchor.to_owned(), text));
    }
}

/// One request's place: its session, model and the engine judging it.
#[derive(Debug, Clone)]
pub struct Turn {
    pub session: String,
    pub model: Option<String>,
    pub stream: bool,
    pub engine: Arc<Engine>,
    /// Whether this caller may use in-chat commands (and is told about them).
    pub commands: bool,
    /// The client's `x-request-id`, else one the proxy made (for the decision log).
    pub request_id: String,
    /// Assistant messages in the request: the response is the next one.
    pub assistant_turns: u64,
}

/// What to do with a request once read.
#[derive(Debug)]
pub enum Prepared {
    /// Send it upstream (its body was rewritten in place).
    Forward(Turn),
    /// Answer it ourselves with this assistant text (in-chat commands).
    Reply(Turn, String),
    Fail(ApiError),
}

/// Everything the handlers share.
pub struct State {
    pub options: Options,
    /// The upstream base URL.
    pub upstream: crate::upstream::Upstream,
    pub backend: Option<String>,
    pub metrics: Metrics,
    pub client: reqwest::Client,
    guard: RwLock<Arc<Guard>>,
    /// Per-session bookkeeping, at most `options.max_sessions`, least recently used first out.
    /// This lock is held only to find (or make) a session's book; each book has its own lock,
    /// held while the engine judges that session's events, so sessions never wait on each
    /// other.
    books: Mutex<LruCache<String, BookRef>>,
    loader: Option<Arc<dyn Loader>>,
    next_id: AtomicU64,
    /// The key of the credential hashes in session ids: chosen at random at start, or the
    /// one saved with restored sessions (whose ids were made with it).
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

impl State {
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
            books: Mutex::new(LruCache::unbounded()),
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

    pub fn guard(&self) -> Arc<Guard> {
        Arc::clone(&self.guard.read().unwrap_or_else(|e| e.into_inner()))
    }

    fn books(&self) -> MutexGuard<'_, LruCache<String, BookRef>> {
        self.books.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The book of `session`, made the most recently used; a new session beyond
    /// `max_sessions` evicts the least recently used one (its engine state too). The books'
    /// lock is held only for this.
    fn book(&self, session: &str, now: u64) -> BookRef {
        let mut books = self.books();
        self.book_in(&mut books, session, now)
    }

    fn book_in(&self, books: &mut LruCache<String, BookRef>, session: &str, now: u64) -> BookRef {
        if !books.contains(session) {
            while books.len() >= self.options.max_sessions.max(1) {
                let Some((old, _)) = books.pop_lru() else {
                    break;
                };
                for e in self.guard().all_engines() {
                    e.remove_session(&old, now);
                }
                self.metrics.session_evicted("capacity");
            }
        }
        Arc::clone(books.get_or_insert_ref(session, BookRef::default))
    }

    pub fn session_count(&self) -> usize {
        self.books().len()
    }

    /// A fresh id for a completion the proxy writes itself.
    pub fn completion_id(&self) -> String {
        format!(
            "chatcmpl-loopguard-{}",
            self.next_id.fetch_add(1, Ordering::Relaxed)
        )
    }

    /// Every session of every engine, as one JSON document: `{"version": 1, "key": …,
    /// "engines": [{"model": …, "snapshot": …}]}` (the engine snapshots of
    /// [`Engine::snapshot`], and the key of the credential hashes in their ids).
    pub fn sessions_document(&self) -> Value {
        let guard = self.guard();
        let engines: Vec<Value> = guard
            .engines_map()
            .iter()
            .map(|(model, e)| json!({"model": model, "snapshot": e.snapshot()}))
            .collect();
        // The session ids' key goes with them: restored sessions keep their ids.
        json!({
            "version": 1,
            "key": self.seed.load(Ordering::Relaxed).to_string(),
            "engines": engines,
        })
    }

    /// Restores the sessions of a [`State::sessions_document`] into this policy's engines;
    /// returns how many sessions came back. A session the policy cannot take is skipped (and
    /// logged); a document of another shape is an error.
    pub fn restore_sessions(&self, doc: &Value) -> Result<usize, String> {
        if doc.get("version").and_then(Value::as_u64) != Some(1) {
            return Err("not a loopguard proxy state file of version 1".to_owned());
        }
        let Some(engines) = doc.get("engines").and_then(Value::as_array) else {
            return Err("the state file has no `engines` list".to_owned());
        };
        let Some(key) = doc
            .get("key")
            .and_then(Value::as_str)
            .and_then(|k| k.parse::<u64>().ok())
        else {
            return Err("the state file has no session-id `key`".to_owned());
        };
        self.seed.store(key, Ordering::Relaxed);
        let guard = self.guard();
        let now = now_ms();
        let mut restored = 0;
        for entry in engines {
            let model = entry.get("model").and_then(Value::as_str);
            let Some(snapshot) = entry.get("snapshot") else {
                continue;
            };
            let engine = guard.engine(model);
            let (ids, skipped) = engine
                .restore_sessions(snapshot)
                .map_err(|e| format!("a saved engine cannot be read: {e}"))?;
            for error in skipped {
                tracing::warn!(%error, "a saved session cannot be restored; it starts over");
            }
            for id in ids {
                restored += 1;
                let settings = engine.session_settings(&id);
                let book = self.book(&id, now);
                let mut book = lock(&book);
                book.last_ms = now;
                book.settings = settings;
            }
        }
        Ok(restored)
    }

    /// Loads the policy again; on success it replaces the one in force. Sessions carry over:
    /// each is moved into the new policy's engines through its snapshot (counts, escalation,
    /// settings); one the new policy cannot take (its settings name a ladder that is gone)
    /// starts over, logged. Events of requests already in flight during the reload are judged
    /// by the old policy and not carried. On failure nothing changes. Returns the new policy's
    /// name and how many sessions carried over.
    pub fn reload(&self) -> Result<(String, usize), String> {
        let loader = self
            .loader
            .as_ref()
            .ok_or_else(|| "this proxy has no policy source to reload".to_owned())?;
        let setup = loader.load()?;
        let guard = Arc::new(Guard::new(setup, self.backend.clone()));
        let ladders = guard.ladders();
        for (id, book) in self.books().iter() {
            let mut book = lock(book);
            if let Some(mode) = book.settings.mode.clone()
                && !ladders.contains(&mode.as_str())
            {
                tracing::warn!(session = ?id, mode = ?mode, "the reloaded policy has no such ladder; the session's tool-loop-mode is unset");
                book.settings.mode = None;
            }
        }
        let old = self.guard();
        let mut kept = 0;
        let olds: Vec<(Option<String>, Arc<Engine>)> = old
            .engines_map()
            .iter()
            .map(|(k, e)| (k.clone(), Arc::clone(e)))
            .collect();
        for (model, engine) in olds {
            let target = guard.engine(model.as_deref());
            for id in engine.session_ids() {
                let Some(snapshot) = engine.snapshot_session(&id) else {
                    continue;
                };
                match target.restore_session(&id, &snapshot) {
                    Ok(()) => kept += 1,
                    Err(error) => tracing::warn!(
                        session = ?id,
                        %error,
                        "the reloaded policy cannot take this session; it starts over"
                    ),
                }
            }
        }
        let name = guard.policy.name.clone();
        *self.guard.write().unwrap_or_else(|e| e.into_inner()) = guard;
        Ok((name, kept))
    }

    /// Forgets sessions idle longer than the policy's `time.session_idle_seconds`.
    pub fn evict_idle(&self, now: u64) -> usize {
        let guard = self.guard();
        for e in guard.all_engines() {
            e.evict_idle(now);
        }
        let idle = guard.idle_ms();
        let mut books = self.books();
        // Least recently used first: every use stamps `last_ms`, so the idle ones are at the end.
        // A book in use right now (its lock taken) is not idle.
        let mut evicted = 0;
        while books.peek_lru().is_some_and(|(_, b)| {
            b.try_lock()
                .is_ok_and(|b| now.saturating_sub(b.last_ms) >= idle)
        }) {
            books.pop_lru();
            evicted += 1;
            self.metrics.session_evicted("idle");
        }
        evicted
    }

    /// Reads a chat-completions request: session, commands, tail events, nudges. Rewrites
    /// `body` into what goes upstream.
    pub fn prepare(&self, headers: &HeaderMap, body: &mut Value) -> Prepared {
        let session = session::identify_scoped(headers, body, self.seed.load(Ordering::Relaxed));
        let honour = match &self.options.chat_commands {
            crate::ChatCommands::Off => false,
            crate::ChatCommands::Everyone => true,
            crate::ChatCommands::Keys(_) => session::credential(headers).is_some_and(|k| {
                self.command_keys
                    .contains(&session::key_hash(k, self.command_seed))
            }),
        };
        let model = body.get("model").and_then(Value::as_str).map(str::to_owned);
        let stream = body.get("stream").and_then(Value::as_bool) == Some(true);
        let Some(messages) = body.get_mut("messages").and_then(Value::as_array_mut) else {
            return Prepared::Fail(ApiError::invalid_request(
                "invalid_messages",
                "the request needs `messages`, an array of chat messages",
            ));
        };
        let guard = self.guard();
        let engine = guard.engine(model.as_deref());
        let request_id = request_id(headers)
            .unwrap_or_else(|| format!("lg-{}", self.next_id.fetch_add(1, Ordering::Relaxed)));
        let assistant_turns = messages
            .iter()
            .filter(|m| m.get("role").and_then(Value::as_str) == Some("assistant"))
            .count() as u64;
        let turn = Turn {
            session,
            model,
            stream,
            engine,
            commands: honour,
            request_id,
            assistant_turns,
        };
        let stripped = request::strip_commands(messages, honour);
        let now = now_ms();
        let book = self.book(&turn.session, now);
        let mut book = lock(&book);
        let book = &mut *book;
        book.last_ms = now;
        let ladders = guard.ladders();
        if !stripped.errors.is_empty() {
            self.metrics.command("invalid");
            tracing::info!(session = ?turn.session, errors = ?stripped.errors, "invalid in-chat command; not forwarded");
            return Prepared::Reply(turn, invalid_reply(&stripped.errors, &ladders));
        }
        if !stripped.commands.is_empty() {
            match commands::apply(&stripped.commands, &book.settings, &ladders) {
                Err(errors) => {
                    self.metrics.command("invalid");
                    tracing::info!(session = ?turn.session, ?errors, "invalid in-chat setting; not forwarded");
                    return Prepared::Reply(turn, invalid_reply(&errors, &ladders));
                }
                Ok((settings, changes)) => {
                    self.metrics.command("applied");
                    tracing::info!(session = ?turn.session, changes = ?changes, now = ?settings.to_string(), "session settings changed in chat");
                    book.settings = settings;
                    turn.engine
                        .set_session_settings(&turn.session, book.settings.clone());
                    if stripped.reply_needed {
                        let text = applied_reply(&changes, &book.settings, &guard.policy.name);
                        return Prepared::Reply(turn, text);
                    }
                }
            }
        }
        if turn.engine.session_settings(&turn.session) != book.settings {
            // A reloaded policy or another model's engine: give it the session's settings.
            turn.engine
                .set_session_settings(&turn.session, book.settings.clone());
        }
        if let Err(e) = self.observe_tail(&turn, book, messages, &stripped.in_tail, now) {
            return Prepared::Fail(*e);
        }
        let anchored: Vec<(String, String)> = book.nudges.iter().cloned().collect();
        let loose = std::mem::take(&mut book.loose);
        let placement = self
            .options
            .nudge
            .unwrap_or(turn.engine.rules().config().nudge);
        request::apply_nudges(messages, &anchored, &loose, placement);
        Prepared::Forward(turn)
    }

    /// Feeds the new tool results and user messages to the engine.
    fn observe_tail(
        &self,
        turn: &Turn,
        book: &mut Book,
        messages: &[Value],
        in_tail: &[bool],
        now: u64,
    ) -> Result<(), Box<ApiError>> {
        // Each tail message with its turn: the assistant messages before it, as `loopctl
        // simulate` counts them.
        let mut assistants = 0u64;
        let tail: Vec<(&Value, u64)> = messages
            .iter()
            .zip(in_tail)
            .filter_map(|(m, t)| {
                if m.get("role").and_then(Value::as_str) == Some("assistant") {
                    assistants += 1;
                }
                t.then_some((m, assistants))
            })
            .collect();
        // A retried request has the same tail at the same place; a user who says the same
        // thing again says it further down the conversation.
        let position = in_tail.iter().position(|t| *t).unwrap_or(messages.len());
        let text: String = tail.iter().map(|(m, _)| m.to_string()).collect();
        let hash = xxh3_64(format!("{position}\u{1e}{text}").as_bytes());
        let repeated = book.tail_hash == Some(hash);
        book.tail_hash = Some(hash);
        let mut after_results = false;
        for (m, at_turn) in tail {
            let role = m.get("role").and_then(Value::as_str).unwrap_or_default();
            // A user message right after tool results was appended by the host (a framework's
            // observation or "continue" prompt), not written by a person: it resets nothing.
            let host_prompt = role == "user" && after_results;
            after_results = matches!(role, "tool" | "function");
            match role {
                "tool" | "function" => {
                    let id = m
                        .get("tool_call_id")
                        .and_then(Value::as_str)
                        .unwrap_or_default();
                    if id.is_empty() || !book.first_sight(id) {
                        continue;
                    }
                    self.metrics.tool_result();
                    let output = request::text_of(m.get("content"));
                    let v = turn.engine.observe(&Event::Result(ToolResult {
                        session: &turn.session,
                        call_id: id,
                        output: &output,
                        is_error: false,
                        exit_code: None,
                        time_ms: now,
                    }));
                    if v.is_allow() {
                        log_notes(&v, &turn.session);
                        continue;
                    }
                    let tool = request::tool_name_for(messages, id);
                    self.record(&v, turn, at_turn, "result", tool, Some(id));
                    if v.action == Action::Terminate {
                        return Err(Box::new(stop_error(&v, tool, turn)));
                    }
                    book.nudge(id, note(&v));
                }
                "user" if !repeated => {
                    let text = request::text_of(m.get("content"));
                    if text.trim().is_empty() {
                        continue;
                    }
                    let v = turn.engine.observe(&Event::User(UserMessage {
                        session: &turn.session,
                        text: &text,
                        injected: host_prompt,
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
                },
                v,
                now_ms(),
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

/// Judges the turns of one upstream response for one request.
#[derive(Debug, Clone)]
pub struct TurnJudge {
    pub state: Arc<State>,
    pub turn: Turn,
    /// A lone call warned by the `chance_then_break` ladder's first step: the call and the
    /// guidance. The server withholds it and asks the upstream once more (see
    /// [`TurnJudge::second_chance`]).
    pub chance: Option<(CallIn, String)>,
    /// This judge is judging the upstream's second answer: no further chance.
    pub retried: bool,
}

/// The tool result the upstream sees for a repeated call it is given a second chance on.
pub const SECOND_CHANCE: &str = "This exact call was just made and failed the same way: change \
     the arguments or the approach.";

impl TurnJudge {
    /// A judge for a turn of `turn`.
    pub fn new(state: Arc<State>, turn: Turn) -> TurnJudge {
        TurnJudge {
            state,
            turn,
            chance: None,
            retried: false,
        }
    }

    /// The call to withhold and the tool result to answer it with, when the upstream's answer
    /// was a lone repeated call under `chance_then_break` and no second chance was given yet.
    pub fn second_chance(&mut self) -> Option<(CallIn, String)> {
        if self.retried {
            return None;
        }
        self.chance.take()
    }
}

impl Judge for TurnJudge {
    fn judge(&mut self, text: &str, calls: &[CallIn]) -> Judged {
        let state = &self.state;
        let turn = &self.turn;
        let now = now_ms();
        let book = state.book(&turn.session, now);
        let mut book = lock(&book);
        let book = &mut *book;
        book.last_ms = now;
        let mut done = Vec::new();
        let seen = |v: &Verdict, call: Option<&CallIn>| Intervention {
            action: v.action.as_str(),
            detector: v.detector.as_deref().unwrap_or("loop").to_owned(),
            rule: v.rule.clone().unwrap_or_default(),
            count: v.count,
            tool_call_id: call.map(|c| c.id.clone()),
        };
        if calls.is_empty() || !text.trim().is_empty() {
            let v = turn.engine.observe(&Event::Text(Text {
                session: &turn.session,
                text,
                chunk: false,
                end_of_turn: true,
                reasoning: false,
                narration: !calls.is_empty(),
                time_ms: now,
            }));
            if !v.is_allow() {
                state.record(&v, turn, turn.assistant_turns + 1, "text", None, None);
                if v.action == Action::Terminate {
                    return Judged {
                        terminate: Some(stop_error(&v, None, turn)),
                        ..Judged::default()
                    };
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
                released.push(i);
                continue;
            }
            state.record(
                &v,
                turn,
                turn.assistant_turns + 1,
                "call",
                Some(&c.name),
                Some(&c.id),
            );
            if v.action != Action::Terminate {
                done.push(seen(&v, Some(c)));
            }
            match v.action {
                Action::Allow => released.push(i),
                Action::Warn => {
                    released.push(i);
                    book.nudge(&c.id, note(&v));
                    if calls.len() == 1
                        && !self.retried
                        && v.rule
                            .as_deref()
                            .is_some_and(|r| r.ends_with("ladders.chance_then_break[0]"))
                    {
                        self.chance =
                            Some((c.clone(), format!("{MARK} {SECOND_CHANCE} {}", v.message)));
                    }
                }
                Action::Block => refused.push(note(&v)),
                Action::Ask => asked.push(note(&v)),
                Action::Terminate => {
                    return Judged {
                        terminate: Some(stop_error(&v, Some(&c.name), turn)),
                        ..Judged::default()
                    };
                }
            }
        }
        if !asked.is_empty() {
            // `ask`: the turn goes back to the user with the question; no call runs meanwhile.
            asked.extend(refused);
            asked.push(format!(
                "{MARK} The tool calls of this turn were not run; reply to go on."
            ));
            return Judged {
                released: Vec::new(),
                interventions: done,
                stop: true,
                note: Some(asked.join("\n")),
                terminate: None,
            };
        }
        if refused.is_empty() {
            return Judged {
                released,
                interventions: done,
                ..Judged::default()
            };
        }
        if released.is_empty() {
            return Judged {
                released,
                interventions: done,
                stop: true,
                note: Some(refused.join("\n")),
                terminate: None,
            };
        }
        // Some calls go through: the refusals reach the model with the first one's result.
        let anchor = calls[released[0]].id.clone();
        for r in refused {
            book.nudge(&anchor, r);
        }
        Judged {
            released,
            interventions: done,
            ..Judged::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::NudgePlacement;
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

    fn judge(s: &Arc<State>, body: &mut Value) -> TurnJudge {
        match s.prepare(&HeaderMap::new(), body) {
            Prepared::Forward(turn) => TurnJudge::new(Arc::clone(s), turn),
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
        let _ = s.prepare(&HeaderMap::new(), &mut body);
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
        let _ = s.prepare(&HeaderMap::new(), &mut body);
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
        // Its override for `ctx-*` models says `context`.
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
            let _ = s.prepare(&HeaderMap::new(), &mut body);
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
        let Prepared::Reply(turn, text) = s.prepare(&HeaderMap::new(), &mut body) else {
            panic!("a pure command is answered by the proxy")
        };
        assert!(text.contains("tool-loop-max-repeats=5"), "{text}");
        assert_eq!(
            turn.engine.session_settings(&turn.session).max_repeats,
            Some(5)
        );
        let mut body =
            json!({"messages": [{"role": "user", "content": "!/set(tool-loop-mode=nope)"}]});
        let Prepared::Reply(_, text) = s.prepare(&HeaderMap::new(), &mut body) else {
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
        let _ = s.prepare(&HeaderMap::new(), &mut body);
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
        let _ = s.prepare(&HeaderMap::new(), &mut body);
        let history = json!([go, {"role": "assistant", "content": "Shall I go on?"}, go]);
        let mut body = json!({"messages": history});
        let _ = s.prepare(&HeaderMap::new(), &mut body);
        let _ = j.judge("", &[call("c3")]);
        let warned = s.metrics.render(0).contains("action=\"warn\"");
        assert!(!warned, "the 2nd `go` restarted the counts");
    }

    #[test]
    fn idle_sessions_are_evicted() {
        let s = state(NudgePlacement::Context);
        let mut body = request(vec![]);
        let _ = s.prepare(&HeaderMap::new(), &mut body);
        assert_eq!(s.session_count(), 1);
        assert_eq!(s.evict_idle(now_ms()), 0);
        let later = now_ms() + Duration::from_secs(7200).as_millis() as u64;
        assert_eq!(s.evict_idle(later), 1);
        assert_eq!(s.session_count(), 0);
    }

    #[test]
    fn reload_without_a_source_keeps_the_policy() {
        let s = state(NudgePlacement::Context);
        assert!(s.reload().is_err());
        assert_eq!(s.guard().policy.name, "t");
    }
}
