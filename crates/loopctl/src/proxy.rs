//! `loopctl proxy`: run the loop-stopping proxy (`loopguard-proxy`): OpenAI chat completions,
//! Anthropic Messages and OpenAI Responses.
//!
//! The binary's share: arguments, loading and rendering the policy (at start and on SIGHUP),
//! the `LOOPGUARD_*` server tier, and logging to standard error.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use clap::ValueEnum;
use loopguard_proxy::{ChatCommands, NudgePlacement, Options, Setup};

use crate::policy::{self, Failure};
use crate::{EXIT_CANNOT_RUN, EXIT_OK, emit};

/// The environment variable setting the log level (`error`, `warn`, `info`, `debug`, `trace`).
pub const LOG_ENV: &str = "LOOPGUARD_LOG";

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Nudge {
    /// Appended to the tool result of the call the nudge is about.
    Context,
    /// A `system` message after that tool result.
    System,
}

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Address to listen on; port 0 picks a free one. The address is printed on standard output
    /// once the proxy accepts connections.
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// The model server's base URL as its clients take it, e.g. `https://api.openai.com/v1` or
    /// `https://api.anthropic.com/v1`: the proxy appends `/chat/completions`, `/responses`,
    /// `/messages` and `/models`.
    #[arg(long)]
    upstream: String,
    /// The policy file; default: $LOOPGUARD_RULES, else the built-in `rules/default.yaml`.
    /// SIGHUP reloads it; a policy that does not validate leaves the running one in force.
    #[arg(long, value_name = "FILE")]
    rules: Option<PathBuf>,
    /// The backend name the policy's `overrides` match; default: the upstream's host.
    #[arg(long)]
    backend: Option<String>,
    /// Where the model reads nudges; default: the policy's `escalation.nudge` (per model).
    #[arg(long, value_enum)]
    nudge: Option<Nudge>,
    /// Seconds the upstream may take to start answering, to send a whole non-streaming answer,
    /// or stay silent inside a stream.
    #[arg(long, value_name = "SECONDS", default_value_t = 300)]
    timeout: u64,
    /// Largest request body accepted, in bytes.
    #[arg(long, value_name = "BYTES", default_value_t = 16 << 20)]
    max_body_bytes: usize,
    /// Most client connections open at once; more wait until one closes (logged, and counted
    /// in `/metrics`).
    #[arg(long, value_name = "N", default_value_t = 1024)]
    max_connections: usize,
    /// Seconds a client may take to start a request, to send its headers, or to pause inside
    /// its body; slower connections are closed (a paused body gets a 408, and so does a body
    /// arriving slower than 64 KiB/s once this time has passed).
    #[arg(long, value_name = "SECONDS", default_value_t = 30)]
    header_timeout: u64,
    /// Let callers change their session's settings with in-chat commands (`!/set(…)`,
    /// `!/unset(…)`); off by default, so an end user cannot switch protection off. Commands
    /// are read only from a person's own messages, never from tool output a host pasted.
    #[arg(long)]
    allow_chat_commands: bool,
    /// Refuse every request bound for the model server that carries no API key (in
    /// `Authorization`, `x-api-key` or `api-key`): a 401 with code `missing_api_key` in the
    /// format's error shape, before any session, judging or forwarding (counted in
    /// `/metrics`). Callers without a key would otherwise all share one set of sessions; the
    /// key is required, not checked. `/healthz` and `/metrics` need none.
    #[arg(long)]
    require_key: bool,
    /// Most sessions kept (about 2 KB each); a new session beyond evicts the least recently
    /// used session of the caller (API key) holding the most, so that one caller cannot push
    /// out another's sessions; callers whose key the upstream never accepted count as one
    /// (counted in `/metrics`).
    #[arg(long, value_name = "N", default_value_t = 100_000)]
    max_sessions: usize,
    /// Save every session to FILE when the proxy stops (SIGTERM, SIGINT) and restore them
    /// from it at start, so that a restart does not forget a loop already warned or refused.
    #[arg(long, value_name = "FILE")]
    state: Option<PathBuf>,
    /// Append one JSON line per intervention to FILE (the decision log: session, model, turn,
    /// detector, rule, action, count, request id); see docs/proxy.md.
    #[arg(long, value_name = "FILE")]
    decisions: Option<PathBuf>,
    /// Allow in-chat commands only to callers whose API key is listed in FILE (one per line;
    /// implies --allow-chat-commands). The keys are kept only as keyed hashes.
    #[arg(long, value_name = "FILE")]
    chat_command_keys: Option<PathBuf>,
    /// Keep sessions in Redis (`redis://host:port/db`) so that every replica of the proxy, and a
    /// restarted one, judges a conversation the same way; see docs/proxy.md.
    #[arg(long, value_name = "URL")]
    session_store: Option<String>,
    /// The name of this deployment's sessions in the store (replicas of one deployment share
    /// it).
    #[arg(long, value_name = "NAME", default_value = "default")]
    session_namespace: String,
}

/// Loads and checks the policy, its plugins and the server tier; every problem rendered.
fn load(rules: Option<&Path>) -> Result<Setup, Failure> {
    let loaded = policy::load(rules)?;
    loaded.plugins()?;
    let server = loaded.server_settings()?;
    Ok(Setup {
        policy: loaded.policy,
        server,
    })
}

fn init_logging() {
    let level = std::env::var(LOG_ENV)
        .ok()
        .and_then(|v| v.parse::<tracing::Level>().ok())
        .unwrap_or(tracing::Level::INFO);
    let _ = tracing_subscriber::fmt()
        .with_max_level(level)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .try_init();
}

pub fn run(args: Args) -> u8 {
    let rules = policy::rules_path(args.rules.as_deref());
    let setup = match load(rules.as_deref()) {
        Ok(s) => s,
        Err(failure) => return failure.report(),
    };
    init_logging();
    let chat_commands = match &args.chat_command_keys {
        Some(path) => match loopguard_rules::read::read_text(path, 1 << 20, "key files") {
            Ok(text) => {
                let keys: Vec<String> = text
                    .lines()
                    .map(str::trim)
                    .filter(|l| !l.is_empty() && !l.starts_with('#'))
                    .map(str::to_owned)
                    .collect();
                if keys.is_empty() {
                    eprintln!("error: {} lists no keys", path.display());
                    return EXIT_CANNOT_RUN;
                }
                ChatCommands::Keys(keys)
            }
            Err(e) => {
                eprintln!("error: cannot read {}: {e}", path.display());
                return EXIT_CANNOT_RUN;
            }
        },
        None if args.allow_chat_commands => ChatCommands::Everyone,
        None => ChatCommands::Off,
    };
    let options = Options {
        chat_commands,
        require_key: args.require_key,
        backend: args.backend,
        nudge: args.nudge.map(|n| match n {
            Nudge::Context => NudgePlacement::Context,
            Nudge::System => NudgePlacement::System,
        }),
        max_body_bytes: args.max_body_bytes,
        timeout: Duration::from_secs(args.timeout.max(1)),
        max_connections: args.max_connections,
        max_sessions: args.max_sessions,
        state_file: args.state,
        decisions: args.decisions,
        session_store: args.session_store,
        session_namespace: args.session_namespace,
        header_timeout: Duration::from_secs(args.header_timeout.max(1)),
        ..Options::new(args.upstream)
    };
    let loader = move || load(rules.as_deref()).map_err(|f| f.message);
    let ready = |addr: SocketAddr| emit(&format!("loopctl proxy listening on http://{addr}\n"));
    match loopguard_proxy::run(args.listen, options, setup, Some(Arc::new(loader)), ready) {
        Ok(()) => EXIT_OK,
        Err(e) => {
            eprintln!("error: {e}");
            EXIT_CANNOT_RUN
        }
    }
}
