//! What the proxy remembers per session besides the engine's state, and where sessions live
//! between requests.
//!
//! Every session has a [`Book`] under its own lock in a bounded table (least recently used
//! first out). With a shared store ([`Shared`], Redis), a session's whole state — the engine's
//! snapshot of it and its book — is also kept in Redis, so that several proxy replicas behind
//! one load balancer, and a replica that restarts, judge the same conversation the same way:
//!
//! - when a request starts, the replica reads the session's version from Redis (one round
//!   trip); when it differs from the version it holds, it reads the state too and restores
//!   the session from it;
//! - when the request's events are judged, the replica writes the state back under a new
//!   version (one round trip), before the client gets the response.
//!
//! A conversation's requests come one after another, so each finds the state its previous
//! request left, whichever replica served that. Two requests of one session at once on two
//! replicas both judge from the same state and the later write wins (counted in
//! `loopguard_proxy_session_store_total{op="conflict"}` when a write finds a version it did
//! not read). A Redis that cannot be reached is logged and counted; the replica goes on with
//! what it holds (fail open). Plugins keep their own per-session state, which is not shared.

use std::borrow::Cow;
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use lru::LruCache;
use serde::{Deserialize, Serialize};

/// Tool-result ids remembered per session, so a retried request is not counted twice.
const MAX_SEEN: usize = 512;
/// Nudges remembered per session (each is re-applied to its tool result in later requests).
const MAX_NUDGES: usize = 64;
/// Call ids remembered with their tool names per session.
const MAX_CALLS: usize = 64;
/// Withheld calls of stored responses remembered per session.
const MAX_WITHHELD: usize = 64;

/// What the proxy remembers about a session besides the engine's state.
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct Book {
    /// When the session was last used (wall clock, ms).
    pub last_ms: u64,
    /// Ids of tool results already judged.
    pub results_seen: VecDeque<String>,
    /// Hash of the previous request's tail and its position (a retried request has the same).
    pub tail_hash: Option<u64>,
    /// (call id, note): applied to that call's result in every later request.
    pub nudges: VecDeque<(String, String)>,
    /// Notes about no call, for the next request only.
    pub loose: Vec<String>,
    /// (call id, tool name) of recent calls, for results whose calls are not in the request
    /// (a Responses request continuing a stored response).
    pub calls: VecDeque<(String, String)>,
    /// (response id, call id, note): calls of a response the upstream stored that the client
    /// never saw; the request continuing that response answers them with the note.
    pub withheld: VecDeque<(String, String, String)>,
    /// Assistant turns judged, for requests that carry only part of the conversation.
    pub turns: u64,
    /// (assistant turn, note, whether it replaces): notes for the observation answering the
    /// call that turn wrote in its text, in every later request.
    pub text_notes: VecDeque<(u64, String, bool)>,
    /// The version of the shared state this book and the engine's session reflect.
    #[serde(skip)]
    pub version: Option<String>,
    /// Changed since it was last written to the shared store.
    #[serde(skip)]
    pub dirty: bool,
}

/// Longest text a book keeps in one entry (an id, a note).
const MAX_ENTRY: usize = 64 << 10;

/// Longest id a live book keeps as written.
const MAX_ID: usize = crate::session::MAX_ID;

/// An id as the proxy keeps it: as written up to [`MAX_ID`] bytes, else `#` and its hash, so
/// that long ids — a client's, remembered hundreds of times per session, or an upstream's
/// response and call ids — cost little.
pub(crate) fn kept(id: &str) -> Cow<'_, str> {
    if id.len() <= MAX_ID {
        Cow::Borrowed(id)
    } else {
        Cow::Owned(format!("#{:016x}", loopguard_hash::xxh3(id.as_bytes())))
    }
}

impl Book {
    /// Holds a book read from elsewhere (a shared store, a state file) to the bounds of a live
    /// one: at most as many entries of each kind, none longer than 64 KiB.
    pub fn bound(&mut self) {
        fn keep<T>(q: &mut VecDeque<T>, max: usize, fits: impl Fn(&T) -> bool) {
            q.retain(|x| fits(x));
            while q.len() > max {
                q.pop_front();
            }
        }
        let short = |s: &String| s.len() <= MAX_ENTRY;
        keep(&mut self.results_seen, MAX_SEEN, short);
        keep(&mut self.nudges, MAX_NUDGES, |(a, b)| short(a) && short(b));
        keep(&mut self.calls, MAX_CALLS, |(a, b)| short(a) && short(b));
        keep(&mut self.withheld, MAX_WITHHELD, |(a, b, c)| {
            short(a) && short(b) && short(c)
        });
        self.loose.retain(short);
        self.loose.truncate(MAX_NUDGES);
        keep(&mut self.text_notes, MAX_NUDGES, |(_, n, _)| short(n));
    }

    /// A note for the observation answering the call that assistant turn `turn` wrote in its
    /// text, in this request and every later one: added to it, or (`replaces`) instead of it.
    pub fn text_note(&mut self, turn: u64, text: String, replaces: bool) {
        if self.text_notes.len() >= MAX_NUDGES {
            self.text_notes.pop_front();
        }
        self.text_notes.push_back((turn, text, replaces));
    }

    /// Whether the result `id` is seen for the first time (and remembers it).
    pub fn first_sight(&mut self, id: &str) -> bool {
        let id = kept(id);
        if self.results_seen.iter().any(|s| *s == id) {
            return false;
        }
        if self.results_seen.len() >= MAX_SEEN {
            self.results_seen.pop_front();
        }
        self.results_seen.push_back(id.into_owned());
        true
    }

    /// A note for the result of call `anchor`, in this request and every later one; for the
    /// next request only when `anchor` is too long to keep (it is matched as written).
    pub fn nudge(&mut self, anchor: &str, text: String) {
        if anchor.len() > MAX_ID {
            if self.loose.len() >= MAX_NUDGES {
                self.loose.remove(0);
            }
            self.loose.push(text);
            return;
        }
        if self.nudges.len() >= MAX_NUDGES {
            self.nudges.pop_front();
        }
        self.nudges.push_back((anchor.to_owned(), text));
    }

    /// Remembers a released call's tool.
    pub fn called(&mut self, id: &str, tool: &str) {
        if id.is_empty() {
            return;
        }
        if self.calls.len() >= MAX_CALLS {
            self.calls.pop_front();
        }
        self.calls
            .push_back((kept(id).into_owned(), tool.to_owned()));
    }

    /// The tool of a remembered call.
    pub fn tool_of(&self, id: &str) -> Option<&str> {
        let id = kept(id);
        self.calls
            .iter()
            .rev()
            .find(|(c, _)| *c == id)
            .map(|(_, t)| t.as_str())
    }

    /// Remembers a call the upstream stored in `response` that the client never saw (the
    /// response's id as [`kept`]). A call whose id is longer than [`MAX_ID`] is not remembered:
    /// its answer must name it as written, and the upstream chose an id too long to keep.
    pub fn withhold(&mut self, response: &str, call: &str, note: String) {
        if call.len() > MAX_ID {
            return;
        }
        if self.withheld.len() >= MAX_WITHHELD {
            self.withheld.pop_front();
        }
        self.withheld
            .push_back((kept(response).into_owned(), call.to_owned(), note));
    }

    /// The withheld calls of `response`, taken out.
    pub fn take_withheld(&mut self, response: &str) -> Vec<(String, String)> {
        let response = kept(response);
        let mut out = Vec::new();
        self.withheld.retain(|(r, c, n)| {
            if *r == response {
                out.push((c.clone(), n.clone()));
                false
            } else {
                true
            }
        });
        out
    }
}

/// A session's book, under its own lock.
pub type BookRef = Arc<Mutex<Book>>;

/// Locks a book (a panic while it was held leaves it as it was: every field stays valid).
pub fn lock(book: &Mutex<Book>) -> MutexGuard<'_, Book> {
    book.lock().unwrap_or_else(|e| e.into_inner())
}

/// The books of every session, at most `max` of them.
///
/// Sessions are grouped by caller for eviction, so that one caller cannot push out another's
/// sessions by opening new ones: a new session beyond the bound evicts the least recently used
/// session of the largest group (its own on a tie). A caller has its own group once the
/// upstream has accepted its key (answered one of its requests with a success); until then its
/// sessions are in one group shared by every such caller, so keys the upstream refuses, however
/// many, compete as a single caller. With `k` callers holding sessions, each keeps at least
/// about `max / (k + 1)` of its most recently used sessions, whatever the others send.
#[derive(Debug)]
pub struct Books {
    table: Mutex<Table>,
    max: usize,
}

/// The group of sessions whose caller the upstream has not (yet) accepted.
const UNVERIFIED: &str = "";

#[derive(Debug)]
struct Table {
    /// Sessions by group, each least recently used first; no group is empty.
    groups: HashMap<String, LruCache<String, BookRef>>,
    /// (size, group) of every group, the largest last.
    sizes: BTreeSet<(usize, String)>,
    /// Callers the upstream accepted, at most as many as sessions.
    accepted: LruCache<String, ()>,
    len: usize,
}

/// The caller part of a session id (`key:…` or `anon`), before its first `/`.
fn caller_of(session: &str) -> &str {
    session
        .split_once('/')
        .map_or(session, |(caller, _)| caller)
}

impl Table {
    fn resize(&mut self, group: &str, from: usize, to: usize) {
        if from > 0 {
            self.sizes.remove(&(from, group.to_owned()));
        }
        if to > 0 {
            self.sizes.insert((to, group.to_owned()));
        }
    }

    fn insert(&mut self, group: &str, session: &str, book: BookRef) {
        let g = self
            .groups
            .entry(group.to_owned())
            .or_insert_with(LruCache::unbounded);
        g.put(session.to_owned(), book);
        let n = g.len();
        self.len += 1;
        self.resize(group, n - 1, n);
    }

    fn remove(&mut self, group: &str, session: &str) -> Option<BookRef> {
        let book = self.groups.get_mut(group)?.pop(session)?;
        self.shrunk(group);
        Some(book)
    }

    /// Removes the least recently used session of `group`.
    fn pop_lru(&mut self, group: &str) -> Option<String> {
        let (id, _) = self.groups.get_mut(group)?.pop_lru()?;
        self.shrunk(group);
        Some(id)
    }

    /// Accounts for one session taken out of `group` (dropped when it is left empty).
    fn shrunk(&mut self, group: &str) {
        let n = self.size(group);
        if n == 0 {
            self.groups.remove(group);
        }
        self.len -= 1;
        self.resize(group, n + 1, n);
    }

    fn size(&self, group: &str) -> usize {
        self.groups.get(group).map_or(0, LruCache::len)
    }
}

impl Books {
    /// An empty table of at most `max` sessions.
    pub fn new(max: usize) -> Books {
        let max = max.max(1);
        Books {
            table: Mutex::new(Table {
                groups: HashMap::new(),
                sizes: BTreeSet::new(),
                accepted: LruCache::new(NonZeroUsize::MIN.saturating_add(max - 1)),
                len: 0,
            }),
            max,
        }
    }

    fn table(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The book of `session`, made the most recently used; a new session beyond the bound
    /// evicts others (see [`Books`]), whose ids are returned (their engine state goes too). The
    /// table's lock is held only for this.
    pub fn get(&self, session: &str) -> (BookRef, Vec<String>) {
        let mut table = self.table();
        let caller = caller_of(session);
        let accepted = table.accepted.get(caller).is_some() || table.groups.contains_key(caller);
        let group = if accepted { caller } else { UNVERIFIED };
        if let Some(book) = table.groups.get_mut(group).and_then(|g| g.get(session)) {
            return (Arc::clone(book), Vec::new());
        }
        if accepted {
            // Opened before the upstream accepted its caller: it moves to the caller's group.
            if let Some(book) = table.remove(UNVERIFIED, session) {
                table.insert(group, session, Arc::clone(&book));
                return (book, Vec::new());
            }
        }
        let mut evicted = Vec::new();
        while table.len >= self.max {
            let own = table.size(group);
            let victim = match table.sizes.last() {
                Some((n, _)) if *n <= own => group.to_owned(),
                Some((_, largest)) => largest.clone(),
                None => break,
            };
            match table.pop_lru(&victim) {
                Some(id) => evicted.push(id),
                None => break,
            }
        }
        let book = BookRef::default();
        table.insert(group, session, Arc::clone(&book));
        (book, evicted)
    }

    /// Records that the upstream accepted the key of `session`'s caller (or of the caller
    /// itself, `key:…`): its sessions, from their next request on, are its own group.
    pub fn accepted(&self, session: &str) {
        let caller = caller_of(session);
        let mut table = self.table();
        if table.accepted.get(caller).is_none() {
            table.accepted.put(caller.to_owned(), ());
        }
    }

    /// The callers the upstream accepted, least recently first (for a state file; each is
    /// `key:` and a keyed hash, or `anon`).
    pub fn accepted_callers(&self) -> Vec<String> {
        self.table()
            .accepted
            .iter()
            .rev()
            .map(|(caller, ())| caller.clone())
            .collect()
    }

    /// How many sessions there are.
    pub fn len(&self) -> usize {
        self.table().len
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every session's id and book.
    pub fn all(&self) -> Vec<(String, BookRef)> {
        self.table()
            .groups
            .values()
            .flat_map(|g| g.iter().map(|(k, v)| (k.clone(), Arc::clone(v))))
            .collect()
    }

    /// Forgets the least recently used sessions idle since before `idle_before` (a book in use
    /// right now is not idle, nor one not yet written to a shared store when `keep_unsaved`);
    /// returns their ids.
    pub fn evict_idle(&self, idle_before: u64, keep_unsaved: bool) -> Vec<String> {
        let mut table = self.table();
        let mut evicted = Vec::new();
        let groups: Vec<String> = table.groups.keys().cloned().collect();
        for group in groups {
            while table
                .groups
                .get(&group)
                .and_then(LruCache::peek_lru)
                .is_some_and(|(_, b)| {
                    b.try_lock()
                        .is_ok_and(|b| b.last_ms < idle_before && !(keep_unsaved && b.dirty))
                })
            {
                if let Some(id) = table.pop_lru(&group) {
                    evicted.push(id);
                }
            }
        }
        evicted
    }
}

/// A session's state as the shared store keeps it.
#[derive(Debug, Serialize, Deserialize)]
pub struct Stored {
    /// The engine's snapshot of the session (`None` when the engine holds none).
    pub engine: Option<serde_json::Value>,
    /// The proxy's book.
    pub book: Book,
}

/// Why the shared store could not be used.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The store's URL is not a Redis URL.
    #[error("invalid session store URL: {0}")]
    Url(String),
    /// Redis failed or could not be reached.
    #[error("the session store failed: {0}")]
    Redis(#[from] redis::RedisError),
    /// A stored state is not one this proxy wrote.
    #[error("a stored session cannot be read: {0}")]
    Corrupt(String),
}

/// Largest stored state read (a live session's is a few KB).
const MAX_STORED: usize = 4 << 20;

/// Reads a session's state when its version differs from the one the caller holds.
const LOAD: &str = r"
local v = redis.call('HGET', KEYS[1], 'v')
if not v then return false end
if v == ARGV[1] then return {v} end
return {v, redis.call('HGET', KEYS[1], 's')}
";

/// Writes a session's state under a new version; returns the version it replaced.
const SAVE: &str = r"
local old = redis.call('HGET', KEYS[1], 'v')
redis.call('HSET', KEYS[1], 'v', ARGV[1], 's', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return old
";

/// What a load found.
#[derive(Debug)]
pub enum Loaded {
    /// No state is stored for the session.
    Missing,
    /// The stored version is the one the caller holds.
    Unchanged,
    /// Another version, with its state.
    Changed(String, Box<Stored>),
}

/// Sessions shared through Redis (see the module docs).
pub struct Shared {
    client: redis::Client,
    pool: Mutex<Vec<redis::Connection>>,
    prefix: String,
    ttl: Duration,
    timeout: Duration,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("prefix", &self.prefix)
            .field("ttl", &self.ttl)
            .finish_non_exhaustive()
    }
}

impl Shared {
    /// A store at `url` (`redis://host:port/db`) whose keys start with `prefix`; states expire
    /// `ttl` after their last write. Nothing is connected until first used.
    pub fn new(url: &str, prefix: &str, ttl: Duration) -> Result<Shared, StoreError> {
        let client = redis::Client::open(url).map_err(|e| StoreError::Url(e.to_string()))?;
        Ok(Shared {
            client,
            pool: Mutex::new(Vec::new()),
            prefix: prefix.to_owned(),
            ttl: ttl.max(Duration::from_secs(1)),
            timeout: Duration::from_secs(2),
        })
    }

    /// Runs `f` on a pooled connection (opened when none is free); a connection that failed is
    /// dropped.
    fn with<T>(
        &self,
        f: impl FnOnce(&mut redis::Connection) -> redis::RedisResult<T>,
    ) -> Result<T, StoreError> {
        let pooled = self.pool.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let mut conn = match pooled {
            Some(c) => c,
            None => {
                let c = self.client.get_connection_with_timeout(self.timeout)?;
                c.set_read_timeout(Some(self.timeout))?;
                c.set_write_timeout(Some(self.timeout))?;
                c
            }
        };
        let out = f(&mut conn);
        if out.is_ok() {
            let mut pool = self.pool.lock().unwrap_or_else(|e| e.into_inner());
            if pool.len() < 64 {
                pool.push(conn);
            }
        }
        Ok(out?)
    }

    fn key(&self, session: &str) -> String {
        format!("{}session:{session}", self.prefix)
    }

    /// The session's state if its version is not `held`.
    pub fn load(&self, session: &str, held: Option<&str>) -> Result<Loaded, StoreError> {
        let reply: redis::Value = self.with(|c| {
            redis::cmd("EVAL")
                .arg(LOAD)
                .arg(1)
                .arg(self.key(session))
                .arg(held.unwrap_or(""))
                .query(c)
        })?;
        let items = match reply {
            redis::Value::Nil => return Ok(Loaded::Missing),
            redis::Value::Array(items) => items,
            _ => return Err(StoreError::Corrupt("unexpected reply".into())),
        };
        let text = |v: &redis::Value| match v {
            redis::Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
            redis::Value::SimpleString(s) => Some(s.clone()),
            _ => None,
        };
        match items.as_slice() {
            [_] => Ok(Loaded::Unchanged),
            [v, s] => {
                let version = text(v).ok_or_else(|| StoreError::Corrupt("no version".into()))?;
                let state = text(s).ok_or_else(|| StoreError::Corrupt("no state".into()))?;
                if state.len() > MAX_STORED {
                    return Err(StoreError::Corrupt(format!(
                        "a stored state of {} bytes (at most {MAX_STORED})",
                        state.len()
                    )));
                }
                let stored: Stored =
                    serde_json::from_str(&state).map_err(|e| StoreError::Corrupt(e.to_string()))?;
                Ok(Loaded::Changed(version, Box::new(stored)))
            }
            _ => Err(StoreError::Corrupt("unexpected reply".into())),
        }
    }

    /// Writes the session's state under `version`; returns whether the version it replaced was
    /// `held` (false: another replica wrote in between, or the state had expired).
    pub fn save(
        &self,
        session: &str,
        version: &str,
        held: Option<&str>,
        state: &Stored,
    ) -> Result<bool, StoreError> {
        let text = serde_json::to_string(state).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        let ttl = u64::try_from(self.ttl.as_millis()).unwrap_or(u64::MAX);
        let old: Option<String> = self.with(|c| {
            redis::cmd("EVAL")
                .arg(SAVE)
                .arg(1)
                .arg(self.key(session))
                .arg(version)
                .arg(text)
                .arg(ttl)
                .query(c)
        })?;
        Ok(old.as_deref() == held)
    }

    /// Remembers that the response `id` belongs to `session` (for requests continuing it).
    pub fn set_alias(&self, id: &str, session: &str) -> Result<(), StoreError> {
        let ttl = u64::try_from(self.ttl.as_millis()).unwrap_or(u64::MAX);
        self.with(|c| {
            redis::cmd("SET")
                .arg(format!("{}response:{id}", self.prefix))
                .arg(session)
                .arg("PX")
                .arg(ttl)
                .query::<()>(c)
        })
    }

    /// The session a response belongs to.
    pub fn alias(&self, id: &str) -> Result<Option<String>, StoreError> {
        self.with(|c| {
            redis::cmd("GET")
                .arg(format!("{}response:{id}", self.prefix))
                .query(c)
        })
    }

    /// The key of the credential hashes in session ids, shared by every replica: the one
    /// stored, else `mine` (stored for the others).
    pub fn shared_seed(&self, mine: u64) -> Result<u64, StoreError> {
        let key = format!("{}seed", self.prefix);
        let seed: String = self.with(|c| {
            redis::cmd("SET")
                .arg(&key)
                .arg(mine.to_string())
                .arg("NX")
                .query::<()>(c)?;
            redis::cmd("GET").arg(&key).query(c)
        })?;
        seed.parse()
            .map_err(|_| StoreError::Corrupt(format!("`{key}` is not a number")))
    }
}

/// A fresh version token.
pub fn new_version() -> String {
    use std::hash::BuildHasher;
    let n = std::collections::hash_map::RandomState::new().hash_one(crate::state::now_ms());
    format!("{n:016x}")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn the_table_is_bounded_and_the_least_recently_used_go_first() {
        let books = Books::new(2);
        let (_, e) = books.get("a");
        assert!(e.is_empty());
        books.get("b");
        books.get("a");
        let (_, e) = books.get("c");
        assert_eq!(e, ["b"]);
        assert_eq!(books.len(), 2);
    }

    #[test]
    fn a_caller_opening_sessions_evicts_its_own_before_another_s() {
        let books = Books::new(10);
        for i in 0..6 {
            books.get(&format!("key:a/{i}"));
        }
        books.accepted("key:a/0");
        books.accepted("key:b/0");
        // Alice's sessions move to her group as they are used.
        for i in 0..6 {
            books.get(&format!("key:a/{i}"));
        }
        // Bob opens a thousand sessions: once he holds as many as Alice, he evicts his own.
        let mut evicted = Vec::new();
        for i in 0..1000 {
            evicted.extend(books.get(&format!("key:b/{i}")).1);
        }
        assert_eq!(books.len(), 10);
        assert!(evicted.iter().filter(|id| id.starts_with("key:a/")).count() == 1);
        let kept: Vec<String> = books.all().into_iter().map(|(id, _)| id).collect();
        assert_eq!(kept.iter().filter(|id| id.starts_with("key:a/")).count(), 5);
        // Alice's most recently used are the ones kept.
        assert!(!kept.contains(&"key:a/0".to_owned()), "{kept:?}");
    }

    #[test]
    fn callers_the_upstream_never_accepted_compete_as_one() {
        let books = Books::new(10);
        books.accepted("key:a/0");
        for i in 0..8 {
            books.get(&format!("key:a/{i}"));
        }
        // Ten thousand keys the upstream refuses, a session each: together they are one caller.
        for i in 0..10_000 {
            books.get(&format!("key:x{i}/s"));
        }
        let kept: Vec<String> = books.all().into_iter().map(|(id, _)| id).collect();
        assert_eq!(kept.len(), 10);
        assert_eq!(
            kept.iter().filter(|id| id.starts_with("key:a/")).count(),
            5,
            "{kept:?}"
        );
        // A session the flood did not evict keeps its book.
        let (book, _) = books.get("key:a/7");
        lock(&book).turns = 3;
        assert_eq!(lock(&books.get("key:a/7").0).turns, 3);
    }

    #[test]
    fn a_session_opened_before_its_caller_was_accepted_keeps_its_book() {
        let books = Books::new(4);
        let (book, _) = books.get("key:a/s");
        lock(&book).turns = 2;
        books.accepted("key:a/s");
        let (again, evicted) = books.get("key:a/s");
        assert!(evicted.is_empty());
        assert_eq!(lock(&again).turns, 2);
        assert_eq!(books.len(), 1);
    }

    #[test]
    fn idle_books_go_unless_in_use_or_unsaved() {
        let books = Books::new(10);
        let (a, _) = books.get("a");
        lock(&a).last_ms = 10;
        let (b, _) = books.get("b");
        lock(&b).last_ms = 10;
        lock(&b).dirty = true;
        let (c, _) = books.get("c");
        lock(&c).last_ms = 1000;
        assert_eq!(books.evict_idle(500, true), ["a"]);
        assert_eq!(books.len(), 2);
    }

    #[test]
    fn a_live_book_keeps_long_ids_as_hashes() {
        let mut book = Book::default();
        let long = |i: usize| format!("{i:08}{}", "x".repeat(MAX_ENTRY));
        for i in 0..=MAX_SEEN {
            let id = long(i);
            assert!(book.first_sight(&id));
            assert!(!book.first_sight(&id));
            book.called(&id, "bash");
            assert_eq!(book.tool_of(&id), Some("bash"));
            book.nudge(&id, "[loopguard] note".into());
        }
        assert!(book.first_sight(&long(0)), "the oldest went first");
        assert!(!book.first_sight(&long(MAX_SEEN)));
        assert_eq!(book.tool_of(&long(1)), None);
        let ids = book
            .results_seen
            .iter()
            .chain(book.calls.iter().map(|(c, _)| c))
            .chain(book.nudges.iter().map(|(a, _)| a));
        assert!(ids.map(String::len).max().unwrap() <= crate::session::MAX_ID);
        // A note about a call whose id is too long to keep is shown once instead.
        assert!(book.nudges.is_empty());
        assert_eq!(book.loose.len(), MAX_NUDGES);
    }

    #[test]
    fn a_live_book_keeps_upstream_response_and_call_ids_bounded() {
        let mut book = Book::default();
        let response = |i: usize| format!("resp_{i:08}{}", "r".repeat(1 << 20));
        for i in 0..=MAX_WITHHELD {
            book.withhold(&response(i), &format!("call_{i}"), "refused".into());
            book.withhold(&response(i), &"c".repeat(1 << 20), "refused".into());
        }
        assert_eq!(book.withheld.len(), MAX_WITHHELD);
        assert!(
            book.withheld
                .iter()
                .all(|(r, c, _)| r.len() <= MAX_ID && c.len() <= MAX_ID)
        );
        // A response with a long id is still found by it; only its call of a short id is kept.
        assert_eq!(
            book.take_withheld(&response(MAX_WITHHELD)),
            [(format!("call_{MAX_WITHHELD}"), "refused".into())]
        );
        assert!(
            book.take_withheld(&response(0)).is_empty(),
            "the oldest went first"
        );
    }

    #[test]
    fn withheld_calls_are_taken_once_per_response() {
        let mut book = Book::default();
        book.withhold("r1", "c1", "refused".into());
        book.withhold("r2", "c2", "refused".into());
        assert_eq!(book.take_withheld("r1"), [("c1".into(), "refused".into())]);
        assert!(book.take_withheld("r1").is_empty());
        assert_eq!(book.withheld.len(), 1);
    }

    // A state read from a shared store is held to the bounds of a live book.
    #[test]
    fn a_hostile_book_is_held_to_the_live_bounds() {
        let mut book = Book::default();
        for i in 0..10_000 {
            book.results_seen.push_back(format!("r{i}"));
        }
        book.nudges.push_back(("c".into(), "x".repeat(1 << 20)));
        book.loose = vec!["y".into(); 1000];
        book.bound();
        assert_eq!(book.results_seen.len(), MAX_SEEN);
        assert_eq!(book.results_seen.back().map(String::as_str), Some("r9999"));
        assert!(book.nudges.is_empty());
        assert_eq!(book.loose.len(), MAX_NUDGES);
    }

    #[test]
    fn a_book_round_trips_through_json() {
        let mut book = Book::default();
        book.nudge("c1", "note".into());
        book.called("c1", "bash");
        book.version = Some("v".into());
        let text = serde_json::to_string(&Stored {
            engine: None,
            book: book.clone(),
        })
        .unwrap();
        let back: Stored = serde_json::from_str(&text).unwrap();
        assert_eq!(back.book.nudges, book.nudges);
        assert_eq!(back.book.tool_of("c1"), Some("bash"));
        assert_eq!(
            back.book.version, None,
            "the version is the store's, not the state's"
        );
    }
}
