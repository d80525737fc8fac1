//! The judge as a detector: it keeps each session's history and schedule, starts checks on a
//! background runtime, and reports a verdict at the first event after it arrives (or, with
//! `blocking`, on the event that started the check, within a deadline).

use std::io::Write;
use std::sync::mpsc::{Receiver, RecvTimeoutError, TryRecvError, sync_channel};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use loopguard_plugin_sdk::{Detection, Event, EventKind, Sessions};
use serde_json::json;

use crate::client::{Usage, ask};
use crate::config::{Config, LogTarget};
use crate::history::{Entry, History, render};
use crate::judge::{Strong, Verdict, decide};
use crate::schedule::{Clock, Schedule};

/// Stable key of the judge's loop in every session, so repeated verdicts escalate.
const LOOP_KEY: u64 = 0x6c6c_6d5f_6a75_6467;

/// One finished check.
#[derive(Debug)]
struct Finished {
    turn: u64,
    verdict: Verdict,
}

#[derive(Debug, Default)]
struct SessionState {
    clock: Clock,
    history: History,
    pending: Option<Receiver<Finished>>,
    ready: Option<Finished>,
    /// The previous event was a call (consecutive calls are one assistant turn).
    after_call: bool,
    loops: u32,
}

/// The judge.
#[derive(Debug)]
pub struct Judge {
    cfg: Arc<Config>,
    runtime: tokio::runtime::Runtime,
    http: reqwest::Client,
    permits: Arc<tokio::sync::Semaphore>,
    log: Arc<Mutex<LogSink>>,
    sessions: Sessions<SessionState>,
}

/// Where check records are written.
struct LogSink(Option<Box<dyn Write + Send>>);

impl std::fmt::Debug for LogSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "LogSink(on)"
        } else {
            "LogSink(off)"
        })
    }
}

impl Judge {
    /// A judge with its own runtime and HTTP client; fails when either cannot start or the log
    /// file cannot be opened.
    pub fn new(cfg: Config) -> Result<Judge, String> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("llm-judge")
            .enable_all()
            .build()
            .map_err(|e| format!("llm-judge: cannot start its runtime: {e}"))?;
        let http = reqwest::Client::builder()
            .build()
            .map_err(|e| format!("llm-judge: cannot build an HTTP client: {e}"))?;
        let log: Option<Box<dyn Write + Send>> = match cfg.log_target() {
            LogTarget::Off => None,
            LogTarget::Stderr => Some(Box::new(std::io::stderr())),
            LogTarget::File(path) => Some(Box::new(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&path)
                    .map_err(|e| format!("llm-judge: cannot open log file {path}: {e}"))?,
            )),
        };
        let sessions = Sessions::new(cfg.max_sessions);
        Ok(Judge {
            permits: Arc::new(tokio::sync::Semaphore::new(cfg.max_concurrent.max(1))),
            cfg: Arc::new(cfg),
            runtime,
            http,
            log: Arc::new(Mutex::new(LogSink(log))),
            sessions,
        })
    }

    /// Observes one event: records it in the session's history, starts a check when one is
    /// due, and reports a loop that a check found.
    pub fn on_event(&mut self, ev: &Event<'_>) -> Option<Detection> {
        let cfg = Arc::clone(&self.cfg);
        let schedule = cfg.schedule();
        let limits = cfg.limits();
        if matches!(ev.kind, EventKind::Reset) {
            self.sessions.remove(ev.session);
            return None;
        }
        let state = self.sessions.get(ev.session);
        // A verdict that arrived since the last event applies now.
        poll(state, Duration::ZERO, &schedule);
        let mut detection = take_detection(state);

        let mut new_turn = false;
        match ev.kind {
            EventKind::User => {
                state.clock.new_prompt();
                state.history.new_prompt(ev.text, &limits);
                state.after_call = false;
            }
            EventKind::Text => {
                state
                    .history
                    .push(Entry::Assistant(ev.text.to_owned()), &limits);
                new_turn = true;
                state.after_call = false;
            }
            EventKind::Call => {
                new_turn = !state.after_call;
                state.history.push(
                    Entry::Call {
                        id: ev.call_id.to_owned(),
                        tool: ev.tool.to_owned(),
                        arguments: ev.arguments.to_owned(),
                    },
                    &limits,
                );
                state.after_call = true;
            }
            EventKind::Result => {
                state.history.push(
                    Entry::Result {
                        id: ev.call_id.to_owned(),
                        output: ev.result.to_owned(),
                        error: ev.is_error,
                    },
                    &limits,
                );
                state.after_call = false;
            }
            _ => {}
        }
        if new_turn && state.clock.next_turn(&schedule) && state.pending.is_none() {
            state.clock.started();
            let turn = state.clock.turn;
            let text = render(state.history.request(), &state.history.window(&limits));
            let (tx, rx) = sync_channel(1);
            let (http, permits, log) = (
                self.http.clone(),
                Arc::clone(&self.permits),
                Arc::clone(&self.log),
            );
            let session = ev.session.to_owned();
            self.runtime.spawn(async move {
                let _permit = permits.acquire_owned().await;
                let verdict = check(&http, &cfg, &text, &session, turn, &log).await;
                let _ = tx.send(Finished { turn, verdict });
            });
            state.pending = Some(rx);
            if self.cfg.blocking {
                poll(
                    state,
                    Duration::from_millis(self.cfg.blocking_deadline_ms),
                    &schedule,
                );
                detection = detection.or_else(|| take_detection(state));
            }
        }
        detection
    }

    /// Waits until every started check has answered (or `timeout` passed); their verdicts apply
    /// at the next event of their session. `loopctl simulate` calls this so replays are
    /// deterministic.
    pub fn wait_idle(&mut self, timeout: Duration) {
        let schedule = self.cfg.schedule();
        let deadline = Instant::now() + timeout;
        for state in self.sessions.values_mut() {
            let left = deadline.saturating_duration_since(Instant::now());
            poll(state, left.max(Duration::from_millis(1)), &schedule);
        }
    }
}

/// Receives a pending check's result, waiting up to `wait`; applies it to the schedule.
fn poll(state: &mut SessionState, wait: Duration, schedule: &Schedule) {
    let Some(rx) = &state.pending else { return };
    let got = if wait.is_zero() {
        match rx.try_recv() {
            Ok(f) => Some(f),
            Err(TryRecvError::Empty) => return,
            Err(TryRecvError::Disconnected) => None,
        }
    } else {
        match rx.recv_timeout(wait) {
            Ok(f) => Some(f),
            Err(RecvTimeoutError::Timeout) => return,
            Err(RecvTimeoutError::Disconnected) => None,
        }
    };
    state.pending = None;
    if let Some(f) = got {
        state
            .clock
            .answered(schedule, f.turn, f.verdict.confidence());
        state.ready = Some(f);
    }
}

fn take_detection(state: &mut SessionState) -> Option<Detection> {
    let f = state.ready.take()?;
    match f.verdict {
        Verdict::Loop {
            analysis,
            fast,
            strong,
        } => {
            state.loops += 1;
            let confidences = match strong {
                Some(s) => format!("fast model {fast:.2}, strong model {s:.2}"),
                None => format!("fast model {fast:.2}"),
            };
            Some(Detection {
                count: state.loops,
                key: LOOP_KEY,
                message: format!(
                    "A reviewer model judged that the agent is not making progress ({confidences}): {analysis} Step back, state what is blocking you, and change your approach."
                ),
                pattern: "no progress, as judged by a model".into(),
            })
        }
        _ => None,
    }
}

/// Runs one check: the fast model, then the strong one when the fast one reaches the threshold.
async fn check(
    http: &reqwest::Client,
    cfg: &Config,
    text: &str,
    session: &str,
    turn: u64,
    log: &Mutex<LogSink>,
) -> Verdict {
    let fast = ask(http, &cfg.fast, cfg, text).await;
    let mut usage = vec![(
        "fast",
        fast.usage,
        fast.attempts,
        fast.elapsed,
        fast.result.as_ref().err().cloned(),
    )];
    let mut strong_reply = None;
    let fast_result = fast.result;
    let needs_strong = matches!(&fast_result, Ok(a) if a.confidence >= cfg.threshold);
    if needs_strong && let Some(strong_cfg) = &cfg.strong {
        let r = ask(http, strong_cfg, cfg, text).await;
        usage.push((
            "strong",
            r.usage,
            r.attempts,
            r.elapsed,
            r.result.as_ref().err().cloned(),
        ));
        strong_reply = Some(r.result);
    }
    let verdict = decide(
        fast_result,
        || match strong_reply {
            None => Strong::Absent,
            Some(Ok(a)) => Strong::Answered(a),
            Some(Err(e)) => Strong::Unavailable(e),
        },
        cfg.threshold,
    );
    write_log(log, session, turn, &usage, &verdict);
    verdict
}

type UsageRow = (&'static str, Usage, u32, Duration, Option<String>);

fn write_log(log: &Mutex<LogSink>, session: &str, turn: u64, rows: &[UsageRow], verdict: &Verdict) {
    let Ok(mut guard) = log.lock() else { return };
    let Some(out) = guard.0.as_mut() else { return };
    let models: Vec<_> = rows
        .iter()
        .map(|(which, u, attempts, elapsed, error)| {
            json!({
                "model": which,
                "prompt_tokens": u.prompt_tokens,
                "completion_tokens": u.completion_tokens,
                "attempts": attempts,
                "ms": elapsed.as_millis() as u64,
                "error": error,
            })
        })
        .collect();
    let outcome = match verdict {
        Verdict::Loop { fast, strong, .. } => json!({"loop": true, "fast": fast, "strong": strong}),
        Verdict::NoLoop { confidence } => json!({"loop": false, "confidence": confidence}),
        Verdict::Failed { reason } => json!({"loop": false, "failed_open": reason}),
    };
    let line = json!({"llm_judge": {"session": session, "turn": turn, "models": models, "outcome": outcome}});
    let _ = writeln!(out, "{line}");
}
