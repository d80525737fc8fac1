//! Replaying a transcript through an engine as a host that obeys every verdict would: a call
//! that is blocked is not run (its recorded result is not replayed), a terminated session
//! stops. `loopctl simulate` and `loopctl test` print and score what this returns; the Python
//! package returns it as `loopguard.simulate`.

use std::collections::{HashMap, VecDeque};
use std::path::Path;

use loopguard_engine::{
    Action, Arguments, Call, Engine, Event, Note, Text, ToolResult, UserMessage,
};
use serde_json::{Value, json};

use crate::{Args, Item, Kind, Line};

/// How long a replay waits for a plugin's background work after each event.
const PLUGIN_WAIT: std::time::Duration = std::time::Duration::from_secs(120);

/// One transcript of a replay; in a `--group` replay, one worker of the swarm.
#[derive(Debug)]
pub struct Worker<'a> {
    /// The transcript's file, for reports.
    pub file: &'a Path,
    /// The worker's name in a `--group` replay (empty otherwise).
    pub name: String,
    /// The transcript's events.
    pub items: &'a [Item],
}

/// The order in which the workers' events are replayed: by time, ties in worker order, each
/// worker's own order kept (a worker whose clock goes backwards is not reordered). One worker's
/// events are replayed as they are.
pub fn merged(workers: &[Worker<'_>]) -> Vec<(usize, usize)> {
    let mut next = vec![0usize; workers.len()];
    let mut order = Vec::with_capacity(workers.iter().map(|w| w.items.len()).sum());
    while let Some((_, w)) = workers
        .iter()
        .zip(&next)
        .enumerate()
        .filter_map(|(w, (worker, &k))| worker.items.get(k).map(|item| (item.time_ms, w)))
        .min()
    {
        if let Some(k) = next.get_mut(w) {
            order.push((w, *k));
            *k += 1;
        }
    }
    order
}

/// The engine event for one transcript event: the one place where transcript kinds become
/// engine events.
pub fn engine_event<'a>(kind: &'a Kind, session: &'a str, time_ms: u64) -> Event<'a> {
    match kind {
        Kind::Call {
            id,
            tool,
            arguments,
        } => Event::Call(Call {
            session,
            call_id: id,
            tool,
            arguments: match arguments {
                Args::Json(v) => Arguments::Json(v),
                Args::Raw(s) => Arguments::Raw(s),
            },
            time_ms,
        }),
        Kind::Result {
            id,
            output,
            error,
            exit_code,
        } => Event::Result(ToolResult {
            session,
            call_id: id,
            output,
            is_error: *error,
            exit_code: *exit_code,
            time_ms,
        }),
        Kind::Text {
            text,
            chunk,
            end,
            reasoning,
            narration,
        } => Event::Text(Text {
            session,
            text,
            chunk: *chunk,
            end_of_turn: *end,
            reasoning: *reasoning,
            narration: *narration,
            time_ms,
        }),
        Kind::User { text, injected } => Event::User(UserMessage {
            session,
            text,
            injected: *injected,
            time_ms,
        }),
        Kind::Reset => Event::Reset { session, time_ms },
    }
}

/// One intervention of a replay: a verdict other than `allow`, placed in its transcript.
#[derive(Clone, Debug)]
pub struct Intervention {
    /// Index of the worker (transcript) in the replay.
    pub worker: usize,
    /// The session as the transcript names it.
    pub session: String,
    /// 1-based index of the latest tool call of the transcript so far (`None` before any call).
    pub call: Option<usize>,
    /// 1-based assistant message of the event.
    pub turn: u64,
    /// 1-based event of the transcript.
    pub event: usize,
    /// The line of the event's message or event object.
    pub line: Line,
    /// `call`, `result`, `text`, `user` or `reset`.
    pub kind: &'static str,
    /// The tool of the call (or of the call a result answers); `text`/`user` for those events.
    pub tool: Option<String>,
    /// The verdict's action.
    pub action: Action,
    /// The detector (or plugin) that fired.
    pub detector: Option<String>,
    /// The policy rule that decided the action.
    pub rule: Option<String>,
    /// How many times the loop has been seen.
    pub count: u32,
    /// The message for the model.
    pub message: String,
    /// The calls that make up the loop, as transcript call indexes.
    pub calls: Vec<usize>,
    /// The call where the loop started, as a transcript call index.
    pub loop_start: Option<usize>,
}

impl Intervention {
    /// The intervention as one `simulate --json` record.
    pub fn record(&self, file: &Path) -> Value {
        json!({
            "file": file.display().to_string(),
            "session": self.session,
            "call": self.call,
            "turn": self.turn,
            "event": self.event,
            "line": self.line,
            "kind": self.kind,
            "tool": self.tool,
            "action": self.action.as_str(),
            "detector": self.detector,
            "rule": self.rule,
            "count": self.count,
            "message": self.message,
            "calls": self.calls,
            "loop_start": self.loop_start.map(|c| json!({"call": c})).unwrap_or(Value::Null),
        })
    }
}

/// What a replay reports to its sink as it goes, beside the interventions it returns. `worker`
/// is the index of the transcript in the replay; `item` the transcript event.
#[derive(Debug)]
#[allow(missing_docs)] // the fields are named for what they hold (see above)
pub enum Step<'r> {
    /// A tool call was replayed; `call` is its index in its transcript.
    Call {
        worker: usize,
        call: usize,
        item: &'r Item,
    },
    /// The result of the blocked call `id` was not replayed.
    BlockedResult {
        worker: usize,
        item: &'r Item,
        id: &'r str,
    },
    /// A plugin note attached to the verdict of the transcript's `event`-th event.
    Note {
        worker: usize,
        item: &'r Item,
        event: usize,
        note: &'r Note,
    },
    /// A verdict other than `allow`.
    Intervention(&'r Intervention),
    /// After the replay: a session that was terminated, and how many of its events were skipped.
    Terminated {
        worker: usize,
        session: &'r str,
        skipped: usize,
    },
}

/// Per-session bookkeeping of the replay.
#[derive(Default)]
struct SessionState<'a> {
    /// Transcript-wide call index of each call the engine has seen in this session since it
    /// started or was reset, by the engine's 1-based sequence number.
    calls: Vec<usize>,
    /// The calls not answered yet, by call id (the empty id for calls without one), oldest
    /// first: a result answers the oldest unanswered call with its id, so results find their
    /// calls by position when ids are missing or reused.
    pending: HashMap<&'a str, VecDeque<Pending<'a>>>,
    terminated: bool,
    skipped: usize,
}

/// A call waiting for its result.
struct Pending<'a> {
    tool: &'a str,
    /// The call was blocked: the host never ran it, so its result is not replayed.
    blocked: bool,
}

/// Replays transcripts through one engine like a host that obeys every verdict: one transcript,
/// or with `group` the workers of a swarm (each worker's sessions join the group). Returns the
/// interventions in order; everything else of the timeline goes to `sink`.
pub fn replay(
    workers: &[Worker<'_>],
    group: Option<&str>,
    engine: &Engine,
    sink: &mut dyn FnMut(Step<'_>),
) -> Vec<Intervention> {
    // Sessions in the order they first appear, and where each is in that list.
    let mut sessions: Vec<((usize, &str), SessionState<'_>)> = Vec::new();
    let mut session_index: HashMap<(usize, &str), usize> = HashMap::new();
    // Per transcript: call numbers count the calls of their own file.
    let mut call_counts = vec![0usize; workers.len()];
    let mut interventions = Vec::new();
    let background = engine.has_background_plugins();
    for (w, k) in merged(workers) {
        let (Some(worker), Some(item), Some(call_index)) = (
            workers.get(w),
            workers.get(w).and_then(|x| x.items.get(k)),
            call_counts.get_mut(w),
        ) else {
            continue;
        };
        let event_no = k + 1;
        // Work a plugin started in the background (a model consulted about the previous event)
        // finishes before the next event, so a replay gives the same verdicts every time.
        if background {
            engine.wait_plugins_idle(PLUGIN_WAIT);
        }
        // In a group replay each worker's sessions are its own: the engine sees them as
        // `worker/session`.
        let engine_session = match group {
            Some(_) => format!("{}/{}", worker.name, item.session),
            None => String::new(),
        };
        let session = match group {
            Some(_) => engine_session.as_str(),
            None => item.session.as_str(),
        };
        let key = (w, item.session.as_str());
        let index = *session_index.entry(key).or_insert_with(|| {
            if let Some(g) = group {
                engine.join_group(session, g, &worker.name);
            }
            sessions.push((key, SessionState::default()));
            sessions.len() - 1
        });
        let Some((_, state)) = sessions.get_mut(index) else {
            continue;
        };
        if state.terminated {
            state.skipped += 1;
            continue;
        }
        let tool: Option<&str> = match &item.kind {
            Kind::Call { id, tool, .. } => {
                *call_index += 1;
                state.calls.push(*call_index);
                state
                    .pending
                    .entry(id.as_str())
                    .or_default()
                    .push_back(Pending {
                        tool: tool.as_str(),
                        blocked: false,
                    });
                sink(Step::Call {
                    worker: w,
                    call: *call_index,
                    item,
                });
                Some(tool.as_str())
            }
            Kind::Result { id, .. } => {
                let answered = state
                    .pending
                    .get_mut(id.as_str())
                    .and_then(VecDeque::pop_front);
                if answered.as_ref().is_some_and(|p| p.blocked) {
                    sink(Step::BlockedResult {
                        worker: w,
                        item,
                        id,
                    });
                    continue;
                }
                answered.map(|p| p.tool)
            }
            Kind::Text { .. } => Some("text"),
            Kind::User { .. } => Some("user"),
            Kind::Reset => {
                state.calls.clear();
                state.pending.clear();
                None
            }
        };
        let verdict = engine.observe(&engine_event(&item.kind, session, item.time_ms));
        if let Kind::Call { id, .. } = &item.kind
            && verdict.action >= Action::Block
            && let Some(call) = state
                .pending
                .get_mut(id.as_str())
                .and_then(VecDeque::back_mut)
        {
            call.blocked = true;
        }
        for note in &verdict.notes {
            sink(Step::Note {
                worker: w,
                item,
                event: event_no,
                note,
            });
        }
        if verdict.is_allow() {
            continue;
        }
        let global = |seq: u64| -> Option<usize> {
            usize::try_from(seq)
                .ok()
                .and_then(|s| s.checked_sub(1))
                .and_then(|i| state.calls.get(i).copied())
        };
        let intervention = Intervention {
            worker: w,
            session: item.session.clone(),
            call: (*call_index > 0).then_some(*call_index),
            turn: item.turn,
            event: event_no,
            line: item.line,
            kind: item.kind.name(),
            tool: tool.map(str::to_owned),
            action: verdict.action,
            detector: verdict.detector.as_deref().map(str::to_owned),
            rule: verdict.rule.clone(),
            count: verdict.count,
            calls: verdict.calls.iter().filter_map(|c| global(c.seq)).collect(),
            loop_start: verdict.loop_start.as_ref().and_then(|c| global(c.seq)),
            message: verdict.message,
        };
        if intervention.action == Action::Terminate {
            state.terminated = true;
        }
        sink(Step::Intervention(&intervention));
        interventions.push(intervention);
    }
    for ((w, session), state) in &sessions {
        if state.terminated {
            sink(Step::Terminated {
                worker: *w,
                session,
                skipped: state.skipped,
            });
        }
    }
    interventions
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A transcript that reads the same file again and again is warned, then blocked; the
    /// blocked call's recorded result is not replayed.
    #[test]
    fn a_looping_transcript_is_warned_then_blocked() {
        let lines: Vec<String> = (0..8)
            .flat_map(|i| {
                [
                    format!(r#"{{"type":"call","id":"c{i}","tool":"read_file","arguments":{{"path":"a.txt"}}}}"#),
                    format!(r#"{{"type":"result","id":"c{i}","output":"same text"}}"#),
                ]
            })
            .collect();
        let parsed = crate::parse(&lines.join("\n")).expect("valid events");
        let policy = loopguard_rules::Policy::builtin_default()
            .policy
            .expect("the built-in policy is valid");
        let engine = Engine::builder(&policy).build().expect("no plugins");
        let workers = [Worker {
            file: Path::new("loop.jsonl"),
            name: String::new(),
            items: &parsed.items,
        }];
        let mut blocked_results = 0;
        let found = replay(&workers, None, &engine, &mut |step| {
            if let Step::BlockedResult { .. } = step {
                blocked_results += 1;
            }
        });
        let actions: Vec<Action> = found.iter().map(|i| i.action).collect();
        assert_eq!(actions.first(), Some(&Action::Warn), "{actions:?}");
        assert!(actions.contains(&Action::Block), "{actions:?}");
        assert!(blocked_results > 0);
        let record = found[0].record(Path::new("loop.jsonl"));
        assert_eq!(record["action"], "warn");
        assert_eq!(record["tool"], "read_file");
    }
}
