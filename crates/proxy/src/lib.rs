//! `loopguard-proxy`: an HTTP proxy that stops the tool-call loops of any agent. Point the
//! agent's base URL at the proxy; it forwards model requests to the real model server and
//! judges every tool call the model issues (and every tool result and user message the agent
//! sends back) with the loopguard engine. `loopctl proxy` runs it.
//!
//! It speaks OpenAI chat completions (`POST /v1/chat/completions`), Anthropic Messages
//! (`POST /v1/messages`) and OpenAI Responses (`POST /v1/responses`), each plain and streamed,
//! with the same enforcement (see [`wire`]).
//!
//! # Key design decision
//!
//! The proxy changes the conversation only in ways the protocol already allows, so any client
//! keeps working:
//!
//! - **warn**: the call goes through; the nudge reaches the model with that call's tool result
//!   in the next request (appended to its content by default, or as a note of its own:
//!   [`NudgePlacement`]), and stays attached to it in every later request so the history the
//!   model sees does not change from turn to turn.
//! - **block**: the call is taken out of the response. Calls that remain keep their ids (so
//!   every call id the client gets is one it can answer) and, when streaming, dense indices;
//!   the refusal reaches the model with the first remaining call's result. When no call
//!   remains, the refusal becomes the assistant's text and the turn ends.
//! - **ask**: every call of the turn is withheld and the question ends the turn, so the user
//!   answers it.
//! - **terminate**: the format's error envelope, HTTP 400 with type `loop_detected` and code
//!   `tool_loop_terminated` (or, in a stream already under way, a final error event).
//!
//! Every response the proxy changed says so in `x-loopguard-*` headers and a `loopguard` body
//! field ([`judge`]). Streaming: text passes through at once; calls are assembled and
//! released, whole, only once judged. Sessions: see [`session`] and [`sessions`] (which also
//! shares them between replicas through Redis). In-chat commands: see [`commands`].
//!
//! # Dependencies
//!
//! tokio (the runtime, signals, timers); axum with only `http1` + `tokio` (routing over
//! hyper 1, no JSON/form/query extractors: bodies are read raw and bounded); reqwest with
//! `rustls-tls` only (HTTPS upstreams with the ring backend and webpki roots, no OpenSSL, no
//! system proxy lookup, no HTTP/2, no decompression — `accept-encoding` is not forwarded);
//! futures-util without default features (one stream adapter); redis, the sync client, for
//! sessions shared by replicas. Metrics are hand-rolled (a dozen series need no registry).
//!
//! # Example
//!
//! ```no_run
//! use loopguard_proxy::{Options, Proxy, Setup};
//! use loopguard_rules::{Policy, Settings};
//!
//! # async fn run() -> Result<(), loopguard_proxy::ProxyError> {
//! let policy = Policy::builtin_default().policy.expect("the default policy is valid");
//! let options = Options::new("https://api.openai.com/v1");
//! let setup = Setup { policy, server: Settings::default() };
//! let proxy = Proxy::bind("127.0.0.1:8080".parse().unwrap(), options, setup, None).await?;
//! proxy.serve(std::future::pending()).await
//! # }
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod body;
pub mod commands;
pub mod decisions;
pub mod error;
#[doc(hidden)]
pub mod fuzzing;
pub mod judge;
mod listen;
pub mod metrics;
mod redact;
mod scan;
mod server;
pub mod session;
pub mod sessions;
pub mod sse;
mod state;
pub mod upstream;
pub mod wire;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use loopguard_rules::{Policy, Settings};
use tokio::net::TcpListener;

pub use wire::{NudgePlacement, Wire};

/// What the proxy enforces: a policy and the server-level settings tier over it (the
/// `LOOPGUARD_*` variables, read by `loopctl`).
#[derive(Debug)]
pub struct Setup {
    /// The policy.
    pub policy: Policy,
    /// The server-level settings tier over it.
    pub server: Settings,
}

/// Loads the policy again on SIGHUP. An error (with every diagnostic rendered) keeps the
/// policy in force.
pub trait Loader: Send + Sync {
    /// The policy, or every diagnostic rendered.
    fn load(&self) -> Result<Setup, String>;
}

impl<F: Fn() -> Result<Setup, String> + Send + Sync> Loader for F {
    fn load(&self) -> Result<Setup, String> {
        self()
    }
}

/// How the proxy runs.
#[derive(Clone, Debug)]
pub struct Options {
    /// The upstream's base URL as OpenAI clients take it (`https://api.openai.com/v1`,
    /// `https://api.anthropic.com/v1`): the proxy appends `/chat/completions`, `/messages`,
    /// `/responses` and `/models`.
    pub upstream: String,
    /// The backend name matched by the policy's `overrides`; default: the upstream's host.
    pub backend: Option<String>,
    /// Where nudges go; `None`: as the policy says (`escalation.nudge`, per model).
    pub nudge: Option<NudgePlacement>,
    /// Largest request body accepted (413 beyond it).
    pub max_body_bytes: usize,
    /// Upstream time limit: for the response headers and the whole of a non-streaming body,
    /// and for the longest silence inside a stream.
    pub timeout: Duration,
    /// How long connecting to the upstream may take.
    pub connect_timeout: Duration,
    /// How long a shutdown waits for open requests before closing them.
    pub shutdown_grace: Duration,
    /// Most client connections open at once; more wait in the kernel's backlog.
    pub max_connections: usize,
    /// How long a client may take to start a request, to send its headers, or to pause inside
    /// its body.
    pub header_timeout: Duration,
    /// Who may change their session's settings with in-chat commands.
    pub chat_commands: ChatCommands,
    /// Refuse every request bound for the upstream (the model routes and the routes passed
    /// through beside them) that carries no API key (`Authorization`, `x-api-key`, `api-key`;
    /// see [`session::credential`]): a 401 with code `missing_api_key` in the route's error
    /// shape, answered before the body is read, so that no session is made, nothing is judged
    /// and nothing is forwarded. `/healthz`, `/metrics` and paths the proxy does not serve
    /// are answered as without it. The key is not checked, only required: keyless callers,
    /// who would all share one caller (`anon`), are turned away.
    pub require_key: bool,
    /// Most sessions kept; a new one beyond evicts the least recently used.
    pub max_sessions: usize,
    /// Where sessions are saved at shutdown and restored from at start, so that a restart
    /// does not forget a loop already warned or refused.
    pub state_file: Option<std::path::PathBuf>,
    /// The decision log: one JSON line per intervention (see [`decisions`]).
    pub decisions: Option<std::path::PathBuf>,
    /// A Redis URL (`redis://host:port/db`) where sessions are kept for every replica of the
    /// proxy (see [`sessions`]).
    pub session_store: Option<String>,
    /// The name under which this proxy's sessions are kept in the store: replicas of one
    /// deployment share it; other deployments on the same Redis use their own.
    pub session_namespace: String,
}

/// Who may use in-chat commands (`!/set(…)`, `!/unset(…)`). For anyone else they are plain
/// text, forwarded as written.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum ChatCommands {
    /// No one (the default: end users cannot switch protection off).
    #[default]
    Off,
    /// Every caller.
    Everyone,
    /// Callers whose API key is one of these (the operator's keys).
    Keys(Vec<String>),
}

impl Options {
    /// The defaults, for an upstream base URL.
    pub fn new(upstream: impl Into<String>) -> Options {
        Options {
            upstream: upstream.into(),
            backend: None,
            nudge: None,
            max_body_bytes: 16 << 20,
            timeout: Duration::from_secs(300),
            connect_timeout: Duration::from_secs(10),
            shutdown_grace: server::DEFAULT_GRACE,
            max_connections: 1024,
            header_timeout: Duration::from_secs(30),
            chat_commands: ChatCommands::Off,
            require_key: false,
            max_sessions: 100_000,
            state_file: None,
            decisions: None,
            session_store: None,
            session_namespace: "default".to_owned(),
        }
    }
}

/// The ranges the proxy accepts for its options: a value outside would be refused by the
/// clock or the allocator later, on a request.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(24 * 3600);
/// The largest `max_connections` (Tokio's semaphore counts up to about 2^61; this bound keeps
/// the limit a number of sockets).
pub const MAX_CONNECTIONS: usize = 1 << 20;
/// The largest `max_sessions` (at about 2 KB each, 20 GB).
pub const MAX_SESSIONS: usize = 10_000_000;
/// The largest `max_body_bytes`.
pub const MAX_BODY_LIMIT: usize = 1 << 30;

impl Options {
    /// Checks every value against its range (see [`MAX_TIMEOUT`], [`MAX_BODY_LIMIT`]).
    pub fn check(&self) -> Result<(), ProxyError> {
        let within = |name: &str, d: Duration| {
            if d.is_zero() || d > MAX_TIMEOUT {
                Err(ProxyError::Option(format!(
                    "{name} must be between 1 ms and {} s, not {} s",
                    MAX_TIMEOUT.as_secs(),
                    d.as_secs_f64()
                )))
            } else {
                Ok(())
            }
        };
        within("the upstream timeout", self.timeout)?;
        within("the connect timeout", self.connect_timeout)?;
        within("the header timeout", self.header_timeout)?;
        if self.max_connections == 0 || self.max_connections > MAX_CONNECTIONS {
            return Err(ProxyError::Option(format!(
                "the connection limit must be between 1 and {MAX_CONNECTIONS}, not {}",
                self.max_connections
            )));
        }
        if self.shutdown_grace > MAX_TIMEOUT {
            return Err(ProxyError::Option(format!(
                "the shutdown grace must be at most {} s",
                MAX_TIMEOUT.as_secs()
            )));
        }
        if self.max_sessions == 0 || self.max_sessions > MAX_SESSIONS {
            return Err(ProxyError::Option(format!(
                "the session limit must be between 1 and {MAX_SESSIONS}, not {}",
                self.max_sessions
            )));
        }
        if self.max_body_bytes == 0 || self.max_body_bytes > MAX_BODY_LIMIT {
            return Err(ProxyError::Option(format!(
                "the request body limit must be between 1 and {MAX_BODY_LIMIT} bytes, not {}",
                self.max_body_bytes
            )));
        }
        Ok(())
    }
}

/// Why the proxy could not start or stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProxyError {
    /// The upstream URL cannot be used.
    #[error("invalid upstream URL `{url}`: {reason}")]
    Upstream {
        /// The URL, credentials redacted.
        url: String,
        /// What is wrong.
        reason: String,
    },
    /// An option is out of its range.
    #[error("invalid option: {0}")]
    Option(String),
    /// The listening address cannot be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The HTTP client cannot be built.
    #[error("cannot set up the HTTP client: {0}")]
    Client(#[source] reqwest::Error),
    /// The async runtime cannot start.
    #[error("cannot start the async runtime: {0}")]
    Runtime(#[source] std::io::Error),
    /// A signal handler cannot be installed.
    #[error("cannot install a signal handler: {0}")]
    Signal(#[source] std::io::Error),
    /// The server failed.
    #[error("the server failed: {0}")]
    Serve(#[source] std::io::Error),
    /// The decision log cannot be opened.
    #[error("cannot open the decision log {path}: {source}")]
    Decisions {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The shared session store cannot be used.
    #[error("cannot use the session store: {0}")]
    SessionStore(#[source] sessions::StoreError),
}

/// A bound proxy, ready to serve.
#[derive(Debug)]
pub struct Proxy {
    state: Arc<state::State>,
    listener: TcpListener,
    addr: SocketAddr,
    signals: Signals,
}

impl Proxy {
    /// Checks the options, binds `listen` and installs the signal handlers (SIGHUP reloads
    /// through `loader`; SIGINT and SIGTERM shut down), so signals sent once this returns are
    /// handled.
    pub async fn bind(
        listen: SocketAddr,
        options: Options,
        setup: Setup,
        loader: Option<Arc<dyn Loader>>,
    ) -> Result<Proxy, ProxyError> {
        let upstream = upstream::Upstream::parse(&options.upstream).map_err(|reason| {
            ProxyError::Upstream {
                url: upstream::Upstream::parse(&options.upstream)
                    .map_or_else(|_| "(not shown)".to_owned(), |u| u.shown().to_owned()),
                reason,
            }
        })?;
        options.check()?;
        let backend = options
            .backend
            .clone()
            .or_else(|| upstream.host().map(str::to_owned));
        let client = reqwest::Client::builder()
            .connect_timeout(options.connect_timeout)
            // An upstream's redirect is not followed: it would carry the client's `x-api-key`
            // or `api-key` to wherever it points. The client gets its status, and not its
            // `location` (response headers are passed back from a short list).
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(ProxyError::Client)?;
        let signals = Signals::install()?;
        let listener = TcpListener::bind(listen)
            .await
            .map_err(|source| ProxyError::Bind {
                addr: listen,
                source,
            })?;
        let addr = listener.local_addr().map_err(|source| ProxyError::Bind {
            addr: listen,
            source,
        })?;
        let decisions = match &options.decisions {
            Some(path) => {
                Some(
                    decisions::Log::open(path).map_err(|source| ProxyError::Decisions {
                        path: path.display().to_string(),
                        source,
                    })?,
                )
            }
            None => None,
        };
        let shared = match &options.session_store {
            Some(url) => {
                let prefix = format!("loopguard:proxy:{}:", options.session_namespace);
                let ttl =
                    Duration::from_secs(setup.policy.base().time.session_idle_seconds.max(60));
                Some(sessions::Shared::new(url, &prefix, ttl).map_err(ProxyError::SessionStore)?)
            }
            None => None,
        };
        // A store that cannot be reached at start stops the proxy rather than leaving it to
        // judge alone.
        let state = Arc::new(
            state::State::new(options, upstream, backend, client, setup, loader)
                .with_decisions(decisions)
                .with_shared(shared)
                .map_err(ProxyError::SessionStore)?,
        );
        if let Some(path) = state.options.state_file.clone() {
            restore_state(&state, &path);
        }
        Ok(Proxy {
            state,
            listener,
            addr,
            signals,
        })
    }

    /// The address the proxy listens on (useful with port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Serves until SIGINT/SIGTERM or `shutdown` completes, then stops taking connections and
    /// waits up to [`Options::shutdown_grace`] for open ones.
    pub async fn serve(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), ProxyError> {
        let Proxy {
            state,
            listener,
            addr,
            signals,
        } = self;
        let grace = state.options.shutdown_grace;
        tracing::info!(
            %addr,
            upstream = %state.upstream.shown(),
            backend = state.backend.as_deref().unwrap_or("-"),
            policy = ?state.guard().policy.name,
            "loopguard proxy listening"
        );
        let (hup, stop) = signals.split();
        let reloader = tokio::spawn(reload_on(hup, Arc::clone(&state)));
        let evictor = tokio::spawn(evict_idle(Arc::clone(&state)));
        let notify = Arc::new(tokio::sync::Notify::new());
        let notified = Arc::clone(&notify);
        let signal = async move {
            tokio::select! {
                () = stop.wait() => {}
                () = shutdown => {}
            }
            tracing::info!("shutting down: no new connections; waiting for open requests");
            notified.notify_one();
        };
        let limits = listen::Limits {
            max_connections: state.options.max_connections,
            header_timeout: state.options.header_timeout,
        };
        let server = listen::serve(
            listener,
            server::router(Arc::clone(&state)),
            limits,
            Arc::clone(&state),
            signal,
        );
        let result = tokio::select! {
            () = server => Ok(()),
            () = async { notify.notified().await; tokio::time::sleep(grace).await } => {
                tracing::warn!(grace_seconds = grace.as_secs_f64(), "requests still open after the grace period are closed");
                Ok(())
            }
        };
        reloader.abort();
        evictor.abort();
        if let Some(path) = &state.options.state_file {
            save_state(&state, path);
        }
        tracing::info!("loopguard proxy stopped");
        result
    }
}

/// Binds and serves on a runtime of its own until SIGINT/SIGTERM; `ready` is told the address
/// once the proxy accepts connections and handles signals. For `loopctl proxy`.
pub fn run(
    listen: SocketAddr,
    options: Options,
    setup: Setup,
    loader: Option<Arc<dyn Loader>>,
    ready: impl FnOnce(SocketAddr),
) -> Result<(), ProxyError> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(ProxyError::Runtime)?;
    runtime.block_on(async move {
        let proxy = Proxy::bind(listen, options, setup, loader).await?;
        ready(proxy.local_addr());
        proxy.serve(std::future::pending()).await
    })
}

/// Largest state file read at start.
pub const MAX_STATE_BYTES: usize = 256 << 20;

/// Restores the sessions saved in `path`, if it exists. A file that cannot be read or is not a
/// state file is logged and left alone: the proxy starts with no sessions.
fn restore_state(state: &state::State, path: &std::path::Path) {
    if !path.exists() {
        tracing::info!(path = %path.display(), "no saved sessions yet");
        return;
    }
    let restored = loopguard_rules::read::read_text(path, MAX_STATE_BYTES, "state files")
        .map_err(|e| e.to_string())
        .and_then(|text| serde_json::from_str(&text).map_err(|e| e.to_string()))
        .and_then(|doc| state.restore_sessions(&doc));
    match restored {
        Ok(n) => tracing::info!(path = %path.display(), sessions = n, "sessions restored"),
        Err(error) => tracing::error!(
            path = %path.display(),
            %error,
            "the saved sessions cannot be restored; starting with none"
        ),
    }
}

/// Saves every session to `path` (written whole to a temporary file, readable by the owner
/// only, then renamed over it).
fn save_state(state: &state::State, path: &std::path::Path) {
    let doc = state.sessions_document();
    let tmp = path.with_extension("tmp");
    let written = (|| -> std::io::Result<()> {
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create(true).truncate(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        let mut file = options.open(&tmp)?;
        serde_json::to_writer(&mut file, &doc)?;
        std::io::Write::flush(&mut file)?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    match written {
        Ok(()) => tracing::info!(path = %path.display(), "sessions saved"),
        Err(error) => tracing::error!(path = %path.display(), %error, "cannot save the sessions"),
    }
}

async fn reload_on(mut hup: Hangup, state: Arc<state::State>) {
    while hup.recv().await {
        tracing::info!("SIGHUP: reloading the policy");
        let st = Arc::clone(&state);
        match tokio::task::spawn_blocking(move || st.reload()).await {
            Ok(Ok((name, sessions))) => {
                state.metrics.reload("ok");
                tracing::info!(policy = ?name, sessions, "policy reloaded; sessions carried over");
            }
            Ok(Err(message)) => {
                state.metrics.reload("failed");
                tracing::error!(
                    policy = ?state.guard().policy.name,
                    "policy reload failed; the previous policy stays in force:\n{message}"
                );
            }
            Err(e) => {
                state.metrics.reload("failed");
                tracing::error!(error = %e, "policy reload failed; the previous policy stays in force");
            }
        }
    }
}

async fn evict_idle(state: Arc<state::State>) {
    let mut tick = tokio::time::interval(Duration::from_secs(60));
    loop {
        tick.tick().await;
        let n = state.evict_idle(state::now_ms());
        if n > 0 {
            tracing::debug!(evicted = n, "idle sessions forgotten");
        }
    }
}

/// The process signals the proxy handles.
#[derive(Debug)]
struct Signals {
    hup: Hangup,
    stop: Stop,
}

impl Signals {
    fn split(self) -> (Hangup, Stop) {
        (self.hup, self.stop)
    }
}

#[cfg(unix)]
mod signals {
    use tokio::signal::unix::{Signal, SignalKind, signal};

    #[derive(Debug)]
    pub struct Hangup(Signal);

    impl Hangup {
        pub async fn recv(&mut self) -> bool {
            self.0.recv().await.is_some()
        }
    }

    #[derive(Debug)]
    pub struct Stop {
        int: Signal,
        term: Signal,
    }

    impl Stop {
        pub async fn wait(mut self) {
            tokio::select! {
                _ = self.int.recv() => tracing::info!("SIGINT received"),
                _ = self.term.recv() => tracing::info!("SIGTERM received"),
            }
        }
    }

    impl super::Signals {
        pub(super) fn install() -> Result<super::Signals, super::ProxyError> {
            let sig = |k| signal(k).map_err(super::ProxyError::Signal);
            Ok(super::Signals {
                hup: Hangup(sig(SignalKind::hangup())?),
                stop: Stop {
                    int: sig(SignalKind::interrupt())?,
                    term: sig(SignalKind::terminate())?,
                },
            })
        }
    }
}

#[cfg(not(unix))]
mod signals {
    #[derive(Debug)]
    pub struct Hangup;

    impl Hangup {
        pub async fn recv(&mut self) -> bool {
            std::future::pending::<()>().await;
            false
        }
    }

    #[derive(Debug)]
    pub struct Stop;

    impl Stop {
        pub async fn wait(self) {
            let _ = tokio::signal::ctrl_c().await;
        }
    }

    impl super::Signals {
        pub(super) fn install() -> Result<super::Signals, super::ProxyError> {
            Ok(super::Signals {
                hup: Hangup,
                stop: Stop,
            })
        }
    }
}

use signals::{Hangup, Stop};
