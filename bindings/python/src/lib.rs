//! The native module of the `loopguard` Python package (`loopguard._loopguard`): the engine
//! in-process for Python hosts.
//!
//! The Python API mirrors the Rust one: a `Policy` loaded from YAML (errors carry the same
//! `file:line:col` report as `loopctl validate`), an `Engine` built from it (with the plugins it
//! names), one method per event kind returning a `Verdict`, and `simulate`, which replays a
//! message list exactly as `loopctl simulate --json` does (both call
//! `loopguard_transcript::replay`). Observing releases the GIL, so Python threads driving
//! different sessions run the engine in parallel.
//!
//! Arguments given as a `dict` are converted to JSON values directly (no `json.dumps`); given as
//! a `str`, they are fingerprinted from the text, as the proxy does.
//!
//! ```python
//! import loopguard
//!
//! engine = loopguard.Engine(loopguard.Policy.default())
//! verdict = engine.call("run-1", "call-1", "bash", {"command": "cargo build"})
//! assert verdict.action == loopguard.Action.ALLOW
//! ```

#![warn(missing_docs)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use loopguard_engine::{
    Arguments, Call, Engine as CoreEngine, Event, Text, ToolResult, UserMessage,
    Verdict as CoreVerdict,
};
use loopguard_rules::{Policy as CorePolicy, Settings, SourceMap};
use loopguard_transcript::Kind;
use loopguard_transcript::replay::{self, Worker};
use pyo3::exceptions::{PyException, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};
use serde_json::{Map, Number, Value};

pyo3::create_exception!(
    loopguard,
    PolicyError,
    PyException,
    "A policy that cannot be used: its message is the report `loopctl validate` prints."
);
pyo3::create_exception!(
    loopguard,
    SnapshotError,
    PyException,
    "A snapshot that cannot be restored (another version, or damaged)."
);

/// Deepest nesting of argument values taken from Python.
const MAX_DEPTH: u32 = 128;

/// Milliseconds since the Unix epoch: the event time when the host gives none.
fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// A validated policy.
#[pyclass(frozen, module = "loopguard")]
struct Policy {
    policy: CorePolicy,
    sources: Arc<SourceMap>,
}

impl Policy {
    fn from_loaded(loaded: loopguard_rules::Loaded, name: &str) -> PyResult<Policy> {
        match loaded.policy {
            Some(policy) => Ok(Policy {
                policy,
                sources: Arc::new(loaded.sources),
            }),
            None => {
                let mut report = loaded.rendered_errors();
                report.push(format!("error: the policy {name} is invalid"));
                Err(PolicyError::new_err(report.join("\n")))
            }
        }
    }
}

#[pymethods]
impl Policy {
    /// The built-in default policy (`rules/default.yaml`).
    #[staticmethod]
    fn default() -> PyResult<Policy> {
        Policy::from_loaded(CorePolicy::builtin_default(), "rules/default.yaml")
    }

    /// Loads a policy file; raises `PolicyError` with every error rendered as
    /// `file:line:col` reports, or `OSError` when the file cannot be read.
    #[staticmethod]
    fn load(path: PathBuf) -> PyResult<Policy> {
        let loaded = CorePolicy::load(&path)
            .map_err(|e| pyo3::exceptions::PyOSError::new_err(e.to_string()))?;
        Policy::from_loaded(loaded, &path.display().to_string())
    }

    /// Reads a policy from YAML text; `path` names it in reports (and resolves relative
    /// `extends:` and plugin paths).
    #[staticmethod]
    #[pyo3(signature = (text, path = "policy.yaml".into()))]
    fn parse(text: String, path: PathBuf) -> PyResult<Policy> {
        Policy::from_loaded(
            CorePolicy::load_text(&path, text),
            &path.display().to_string(),
        )
    }

    /// The policy's name.
    #[getter]
    fn name(&self) -> String {
        self.policy.name.clone()
    }

    fn __repr__(&self) -> String {
        format!("<loopguard.Policy {:?}>", self.policy.name)
    }
}

/// The engine's answer to one event.
#[pyclass(frozen, get_all, module = "loopguard")]
struct Verdict {
    /// `Action.ALLOW`, `WARN`, `ASK`, `BLOCK` or `TERMINATE` (a `str` enum).
    action: Py<PyAny>,
    /// What to tell the model (empty for `allow`).
    message: String,
    /// The detector (or plugin) that fired.
    detector: Option<String>,
    /// The policy rule that decided the action.
    rule: Option<String>,
    /// How many times the loop has been seen.
    count: u32,
    /// The call ids that make up the loop.
    calls: Vec<String>,
    /// The call id where the loop started (a host may rewind to it).
    loop_start: Option<String>,
    /// Remarks about the engine itself (a plugin that failed), for logs.
    notes: Vec<String>,
}

/// The members of the `loopguard.Action` enum, looked up once, by [`action_index`].
static ACTIONS: PyOnceLock<[Py<PyAny>; 5]> = PyOnceLock::new();

/// Where an action's member is in [`ACTIONS`].
fn action_index(a: loopguard_engine::Action) -> usize {
    use loopguard_engine::Action::*;
    match a {
        Allow => 0,
        Warn => 1,
        Ask => 2,
        Block => 3,
        Terminate => 4,
    }
}

fn verdict(py: Python<'_>, v: CoreVerdict) -> PyResult<Verdict> {
    let members = ACTIONS.get_or_try_init(py, || -> PyResult<[Py<PyAny>; 5]> {
        let class = py.import("loopguard")?.getattr("Action")?;
        let member = |name: &str| class.call1((name,)).map(Bound::unbind);
        Ok([
            member("allow")?,
            member("warn")?,
            member("ask")?,
            member("block")?,
            member("terminate")?,
        ])
    })?;
    let action = members
        .get(action_index(v.action))
        .ok_or_else(|| PyException::new_err("unknown action"))?
        .clone_ref(py);
    Ok(Verdict {
        action,
        message: v.message,
        detector: v.detector.map(|d| d.into_owned()),
        rule: v.rule,
        count: v.count,
        calls: v.calls.into_iter().map(|c| c.call_id).collect(),
        loop_start: v.loop_start.map(|c| c.call_id),
        notes: v
            .notes
            .into_iter()
            .map(|n| format!("{} ({}): {}", n.code, n.plugin, n.message))
            .collect(),
    })
}

#[pymethods]
impl Verdict {
    /// Whether the event may go on untouched.
    #[getter]
    fn is_allow(&self, py: Python<'_>) -> PyResult<bool> {
        self.action.bind(py).eq("allow")
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let action: String = self.action.bind(py).str()?.extract()?;
        Ok(format!(
            "<loopguard.Verdict {action} detector={:?} rule={:?} count={}>",
            self.detector, self.rule, self.count
        ))
    }
}

/// Converts a JSON-like Python value (dict, list, tuple, str, int, float, bool, None) into a
/// JSON value.
/// Whether a message makes structured tool calls (chat `tool_calls` or `function_call`,
/// Anthropic `tool_use` blocks), as opposed to calls written in its text.
fn calls_in(m: &Value) -> bool {
    let listed = |k: &str| match m.get(k) {
        Some(Value::Array(a)) => !a.is_empty(),
        Some(Value::Null) | None => false,
        Some(_) => true,
    };
    let blocks = m.get("content").and_then(Value::as_array).is_some_and(|c| {
        c.iter()
            .any(|b| b.get("type").and_then(Value::as_str) == Some("tool_use"))
    });
    listed("tool_calls") || listed("function_call") || blocks
}

fn to_json(obj: &Bound<'_, PyAny>, depth: u32) -> PyResult<Value> {
    if depth > MAX_DEPTH {
        return Err(PyValueError::new_err("arguments are nested too deeply"));
    }
    if obj.is_none() {
        Ok(Value::Null)
    } else if let Ok(b) = obj.cast::<PyBool>() {
        Ok(Value::Bool(b.is_true()))
    } else if let Ok(i) = obj.cast::<PyInt>() {
        if let Ok(v) = i.extract::<i64>() {
            Ok(Value::from(v))
        } else if let Ok(v) = i.extract::<u64>() {
            Ok(Value::from(v))
        } else {
            // Beyond 64 bits: as JSON would carry it, a float.
            let f: f64 = i.extract()?;
            Ok(Number::from_f64(f).map_or(Value::Null, Value::Number))
        }
    } else if let Ok(f) = obj.cast::<PyFloat>() {
        Ok(Number::from_f64(f.value()).map_or(Value::Null, Value::Number))
    } else if let Ok(s) = obj.cast::<PyString>() {
        Ok(Value::String(s.to_cow()?.into_owned()))
    } else if let Ok(d) = obj.cast::<PyDict>() {
        let mut map = Map::new();
        for (k, v) in d.iter() {
            let key = match k.cast::<PyString>() {
                Ok(s) => s.to_cow()?.into_owned(),
                Err(_) => k.str()?.to_cow()?.into_owned(),
            };
            map.insert(key, to_json(&v, depth + 1)?);
        }
        Ok(Value::Object(map))
    } else if let Ok(l) = obj.cast::<PyList>() {
        l.iter()
            .map(|x| to_json(&x, depth + 1))
            .collect::<PyResult<Vec<_>>>()
            .map(Value::Array)
    } else if let Ok(t) = obj.cast::<PyTuple>() {
        t.iter()
            .map(|x| to_json(&x, depth + 1))
            .collect::<PyResult<Vec<_>>>()
            .map(Value::Array)
    } else {
        Err(PyTypeError::new_err(format!(
            "arguments must be JSON-like (dict, list, str, int, float, bool, None), not {}",
            obj.get_type().name()?
        )))
    }
}

/// Writes a JSON-like Python value as JSON text, as [`to_json`] would convert it and
/// `serde_json` print it, without building the value: the engine fingerprints the text in one
/// pass. `Ok(false)` when the text would not mean the same as the converted value: a dict with a
/// key that is not a string (two keys may then print alike; the conversion keeps the last).
fn write_json(obj: &Bound<'_, PyAny>, depth: u32, out: &mut String) -> PyResult<bool> {
    use std::fmt::Write as _;
    if depth > MAX_DEPTH {
        return Err(PyValueError::new_err("arguments are nested too deeply"));
    }
    if obj.is_none() {
        out.push_str("null");
    } else if let Ok(b) = obj.cast::<PyBool>() {
        out.push_str(if b.is_true() { "true" } else { "false" });
    } else if let Ok(i) = obj.cast::<PyInt>() {
        if let Ok(v) = i.extract::<i64>() {
            let _ = write!(out, "{v}");
        } else if let Ok(v) = i.extract::<u64>() {
            let _ = write!(out, "{v}");
        } else {
            write_float(i.extract()?, out);
        }
    } else if let Ok(f) = obj.cast::<PyFloat>() {
        write_float(f.value(), out);
    } else if let Ok(s) = obj.cast::<PyString>() {
        write_str(&s.to_cow()?, out);
    } else if let Ok(d) = obj.cast::<PyDict>() {
        out.push('{');
        for (n, (k, v)) in d.iter().enumerate() {
            let Ok(key) = k.cast::<PyString>() else {
                return Ok(false);
            };
            if n > 0 {
                out.push(',');
            }
            write_str(&key.to_cow()?, out);
            out.push(':');
            if !write_json(&v, depth + 1, out)? {
                return Ok(false);
            }
        }
        out.push('}');
    } else if let Ok(l) = obj.cast::<PyList>() {
        return write_items(l.iter(), depth, out);
    } else if let Ok(t) = obj.cast::<PyTuple>() {
        return write_items(t.iter(), depth, out);
    } else {
        // The conversion names the type in its error.
        to_json(obj, depth)?;
    }
    Ok(true)
}

fn write_items<'py>(
    items: impl Iterator<Item = Bound<'py, PyAny>>,
    depth: u32,
    out: &mut String,
) -> PyResult<bool> {
    out.push('[');
    for (n, x) in items.enumerate() {
        if n > 0 {
            out.push(',');
        }
        if !write_json(&x, depth + 1, out)? {
            return Ok(false);
        }
    }
    out.push(']');
    Ok(true)
}

/// A float as `serde_json` prints it; not finite (no JSON number) as `null`.
fn write_float(f: f64, out: &mut String) {
    use std::fmt::Write as _;
    match Number::from_f64(f) {
        Some(n) => {
            let _ = write!(out, "{n}");
        }
        None => out.push_str("null"),
    }
}

/// A string as a JSON string literal, escaped as `serde_json` escapes it.
fn write_str(s: &str, out: &mut String) {
    out.push('"');
    let mut start = 0;
    for (i, b) in s.bytes().enumerate() {
        let escape = match b {
            b'"' => "\\\"",
            b'\\' => "\\\\",
            b'\n' => "\\n",
            b'\r' => "\\r",
            b'\t' => "\\t",
            0x08 => "\\b",
            0x0c => "\\f",
            0..=0x1f => "",
            _ => continue,
        };
        // Every byte escaped is ASCII, so `i` is a character boundary.
        out.push_str(&s[start..i]);
        if escape.is_empty() {
            use std::fmt::Write as _;
            let _ = write!(out, "\\u{b:04x}");
        } else {
            out.push_str(escape);
        }
        start = i + 1;
    }
    out.push_str(&s[start..]);
    out.push('"');
}

/// Arguments as the host gave them: JSON text, or a value converted from Python.
enum Args {
    Text(String),
    Value(Value),
}

impl Args {
    fn from_py(obj: &Bound<'_, PyAny>) -> PyResult<Args> {
        match obj.cast::<PyString>() {
            Ok(s) => Ok(Args::Text(s.to_cow()?.into_owned())),
            Err(_) => {
                let mut text = String::with_capacity(256);
                if write_json(obj, 0, &mut text)? {
                    Ok(Args::Text(text))
                } else {
                    Ok(Args::Value(to_json(obj, 0)?))
                }
            }
        }
    }

    fn arguments(&self) -> Arguments<'_> {
        match self {
            Args::Text(s) => Arguments::Raw(s),
            Args::Value(v) => Arguments::Json(v),
        }
    }
}

/// The loop detector: sessions, their windows and escalation, for one policy.
#[pyclass(frozen, module = "loopguard")]
struct Engine {
    engine: CoreEngine,
    /// Per session, how many messages `observe_messages` has read.
    read: Mutex<HashMap<String, usize>>,
}

impl Engine {
    fn observe(&self, py: Python<'_>, event: &Event<'_>) -> PyResult<Verdict> {
        let v = py.detach(|| self.engine.observe(event));
        verdict(py, v)
    }

    fn forget_read(&self, session: &str) {
        if let Ok(mut read) = self.read.lock() {
            read.remove(session);
        }
    }
}

/// Builds an engine for a policy, with the plugins it names.
fn build_engine(
    policy: &Policy,
    backend: Option<&str>,
    model: Option<&str>,
) -> PyResult<CoreEngine> {
    let plugins = loopguard_engine::load_plugins(&policy.policy).map_err(|errors| {
        let report: Vec<String> = errors
            .iter()
            .map(|e| policy.sources.render(&e.diagnostic()))
            .collect();
        PolicyError::new_err(report.join("\n"))
    })?;
    let mut b = CoreEngine::builder(&policy.policy).plugins(plugins);
    if let Some(backend) = backend {
        b = b.backend(backend);
    }
    if let Some(model) = model {
        b = b.model(model);
    }
    b.build()
        .map_err(|e| PolicyError::new_err(format!("error: {e}")))
}

#[pymethods]
impl Engine {
    /// An engine for `policy` (the built-in default when `None`), with the overrides of
    /// `backend` and `model` applied and the policy's plugins loaded.
    #[new]
    #[pyo3(signature = (policy = None, backend = None, model = None))]
    fn new(
        policy: Option<&Policy>,
        backend: Option<&str>,
        model: Option<&str>,
    ) -> PyResult<Engine> {
        let default;
        let policy = match policy {
            Some(p) => p,
            None => {
                default = Policy::default()?;
                &default
            }
        };
        Ok(Engine {
            engine: build_engine(policy, backend, model)?,
            read: Mutex::new(HashMap::new()),
        })
    }

    /// The model asked for a tool call. `arguments` is the model's JSON text or a dict.
    #[pyo3(signature = (session, call_id, tool, arguments, time_ms = None))]
    fn call(
        &self,
        py: Python<'_>,
        session: &str,
        call_id: &str,
        tool: &str,
        arguments: &Bound<'_, PyAny>,
        time_ms: Option<u64>,
    ) -> PyResult<Verdict> {
        let args = Args::from_py(arguments)?;
        self.observe(
            py,
            &Event::Call(Call {
                session,
                call_id,
                tool,
                arguments: args.arguments(),
                time_ms: time_ms.unwrap_or_else(now_ms),
            }),
        )
    }

    /// A tool's result. `error` marks a failure the tool reported; `exit_code` is a command's.
    #[pyo3(signature = (session, call_id, output, error = false, exit_code = None, time_ms = None))]
    #[allow(clippy::too_many_arguments)]
    fn result(
        &self,
        py: Python<'_>,
        session: &str,
        call_id: &str,
        output: &str,
        error: bool,
        exit_code: Option<i32>,
        time_ms: Option<u64>,
    ) -> PyResult<Verdict> {
        self.observe(
            py,
            &Event::Result(ToolResult {
                session,
                call_id,
                output,
                is_error: error,
                exit_code,
                time_ms: time_ms.unwrap_or_else(now_ms),
            }),
        )
    }

    /// Assistant text with no tool call: a whole turn, or one streamed chunk of it
    /// (`chunk=True`, the last with `end_of_turn=True`). `narration` marks text said beside a
    /// tool call; `reasoning` marks thinking.
    #[pyo3(signature = (session, text, chunk = false, end_of_turn = true, reasoning = false, narration = false, time_ms = None))]
    #[allow(clippy::too_many_arguments)]
    fn text(
        &self,
        py: Python<'_>,
        session: &str,
        text: &str,
        chunk: bool,
        end_of_turn: bool,
        reasoning: bool,
        narration: bool,
        time_ms: Option<u64>,
    ) -> PyResult<Verdict> {
        self.observe(
            py,
            &Event::Text(Text {
                session,
                text,
                chunk,
                end_of_turn,
                reasoning,
                narration,
                time_ms: time_ms.unwrap_or_else(now_ms),
            }),
        )
    }

    /// A user-role message. `automated=True` marks one the framework wrote itself (a
    /// "continue" prompt, an observation): it is no new instruction.
    #[pyo3(signature = (session, text, automated = false, time_ms = None))]
    fn user(
        &self,
        py: Python<'_>,
        session: &str,
        text: &str,
        automated: bool,
        time_ms: Option<u64>,
    ) -> PyResult<Verdict> {
        self.observe(
            py,
            &Event::User(UserMessage {
                session,
                text,
                injected: automated,
                time_ms: time_ms.unwrap_or_else(now_ms),
            }),
        )
    }

    /// Starts the session over: its window, counters and escalation are forgotten.
    #[pyo3(signature = (session, time_ms = None))]
    fn reset(&self, py: Python<'_>, session: &str, time_ms: Option<u64>) -> PyResult<Verdict> {
        self.forget_read(session);
        self.observe(
            py,
            &Event::Reset {
                session,
                time_ms: time_ms.unwrap_or_else(now_ms),
            },
        )
    }

    /// Observes the messages of an OpenAI- or Anthropic-style message list that this session
    /// has not seen yet (the engine remembers how many it has read; a list shorter than that is
    /// a new conversation and is read from its start after a reset), with the semantics of
    /// `loopctl simulate`. Returns the verdicts that are not `allow`, in order.
    #[pyo3(signature = (session, messages, time_ms = None))]
    fn observe_messages(
        &self,
        py: Python<'_>,
        session: &str,
        messages: &Bound<'_, PyList>,
        time_ms: Option<u64>,
    ) -> PyResult<Vec<Verdict>> {
        let total = messages.len();
        let start = {
            let read = self
                .read
                .lock()
                .map_err(|_| PyException::new_err("engine state poisoned"))?;
            read.get(session).copied().unwrap_or(0)
        };
        let start = if total < start {
            self.observe(
                py,
                &Event::Reset {
                    session,
                    time_ms: time_ms.unwrap_or_else(now_ms),
                },
            )?;
            0
        } else {
            start
        };
        // An assistant message read before that made no structured call may have written one
        // in its text: it is read again, unobserved, so that the new messages' observation
        // answers that call instead of reading as a person's words.
        let before = start
            .checked_sub(1)
            .map(|i| to_json(&messages.get_item(i)?, 0))
            .transpose()?
            .filter(|m| m.get("role").and_then(Value::as_str) == Some("assistant") && !calls_in(m));
        let base = if before.is_some() { start - 1 } else { start };
        let Value::Array(list) = to_json(messages.get_slice(base, total).as_any(), 0)? else {
            return Err(PyValueError::new_err("messages must be a list"));
        };
        // One message a line: an event's line is its message's place.
        let lines: Vec<String> = list.iter().map(Value::to_string).collect();
        let text = format!("[{}]", lines.join(",\n"));
        let parsed = loopguard_transcript::parse(&text)
            .map_err(|e| PyValueError::new_err(format!("message {}: {}", e.line, e.message)))?;
        let time = time_ms.unwrap_or_else(now_ms);
        let mut out = Vec::new();
        // A call written in text is named by its message's place in the conversation, the
        // same whichever call reads it (the reader numbers such calls from each read's start).
        let mut renamed: HashMap<String, String> = HashMap::new();
        for item in &parsed.items {
            let at = item.line.saturating_sub(1);
            let mut kind = std::borrow::Cow::Borrowed(&item.kind);
            if let Kind::Call { id, .. } = &item.kind
                && list.get(at).is_some_and(|m| !calls_in(m))
            {
                let name = format!("text-{}", base + at);
                renamed.insert(id.clone(), name.clone());
                if let Kind::Call { id, .. } = kind.to_mut() {
                    *id = name;
                }
            } else if let Kind::Result { id, .. } = &item.kind
                && let Some(name) = renamed.get(id)
            {
                let name = name.clone();
                if let Kind::Result { id, .. } = kind.to_mut() {
                    *id = name;
                }
            }
            if before.is_some() && at == 0 {
                continue;
            }
            let event = replay::engine_event(&kind, session, time);
            let v = py.detach(|| self.engine.observe(&event));
            if !v.is_allow() {
                out.push(verdict(py, v)?);
            }
        }
        self.read
            .lock()
            .map_err(|_| PyException::new_err("engine state poisoned"))?
            .insert(session.to_owned(), total);
        Ok(out)
    }

    /// Sets the session's own settings tier (any of `enabled`, `max_repeats`, `ttl_seconds`,
    /// `mode`); `None` leaves a setting to the policy.
    #[pyo3(signature = (session, enabled = None, max_repeats = None, ttl_seconds = None, mode = None))]
    fn set_session_settings(
        &self,
        session: &str,
        enabled: Option<bool>,
        max_repeats: Option<u32>,
        ttl_seconds: Option<u64>,
        mode: Option<String>,
    ) {
        self.engine.set_session_settings(
            session,
            Settings {
                enabled,
                max_repeats,
                ttl_seconds,
                mode,
            },
        );
    }

    /// The session's own settings tier, as a dict of the settings it sets.
    fn session_settings<'py>(
        &self,
        py: Python<'py>,
        session: &str,
    ) -> PyResult<Bound<'py, PyDict>> {
        let s = self.engine.session_settings(session);
        let d = PyDict::new(py);
        if let Some(v) = s.enabled {
            d.set_item("enabled", v)?;
        }
        if let Some(v) = s.max_repeats {
            d.set_item("max_repeats", v)?;
        }
        if let Some(v) = s.ttl_seconds {
            d.set_item("ttl_seconds", v)?;
        }
        if let Some(v) = s.mode {
            d.set_item("mode", v)?;
        }
        Ok(d)
    }

    /// Resolves the session for the backend and model it talks to: the policy's `overrides`
    /// matching them apply to it from now on. `None` keeps the engine's own `backend`/`model`.
    /// Cheap when nothing changes, so a host may call it before every model request.
    #[pyo3(signature = (session, backend = None, model = None))]
    fn set_session_target(&self, session: &str, backend: Option<&str>, model: Option<&str>) {
        self.engine.set_session_target(session, backend, model);
    }

    /// The backend and model the session is resolved for, as a dict of those known.
    fn session_target<'py>(&self, py: Python<'py>, session: &str) -> PyResult<Bound<'py, PyDict>> {
        let t = self.engine.session_target(session);
        let d = PyDict::new(py);
        if let Some(v) = t.backend {
            d.set_item("backend", v)?;
        }
        if let Some(v) = t.model {
            d.set_item("model", v)?;
        }
        Ok(d)
    }

    /// Makes the session a worker of a group (swarm): its calls also count for the group.
    fn join_group(&self, session: &str, group: &str, worker: &str) {
        self.engine.join_group(session, group, worker);
    }

    /// Takes the session out of its group.
    fn leave_group(&self, session: &str) {
        self.engine.leave_group(session);
    }

    /// Forgets a group's counters (the swarm is done).
    fn clear_group(&self, group: &str) {
        self.engine.clear_group(group);
    }

    /// A session's state as JSON text, or `None` when there is no such session.
    fn snapshot_session(&self, session: &str) -> Option<String> {
        self.engine.snapshot_session(session).map(|v| v.to_string())
    }

    /// Restores a session from `snapshot_session` text, replacing the session of that id;
    /// raises `SnapshotError` (and changes nothing) when the snapshot cannot be used.
    fn restore_session(&self, session: &str, snapshot: &str) -> PyResult<()> {
        let v: Value =
            serde_json::from_str(snapshot).map_err(|e| SnapshotError::new_err(e.to_string()))?;
        self.forget_read(session);
        self.engine
            .restore_session(session, &v)
            .map_err(|e| SnapshotError::new_err(e.to_string()))
    }

    /// Every session's state as JSON text.
    fn snapshot(&self) -> String {
        self.engine.snapshot().to_string()
    }

    /// Restores every session of `snapshot` text; returns how many came back.
    fn restore(&self, snapshot: &str) -> PyResult<usize> {
        let v: Value =
            serde_json::from_str(snapshot).map_err(|e| SnapshotError::new_err(e.to_string()))?;
        if let Ok(mut read) = self.read.lock() {
            read.clear();
        }
        self.engine
            .restore(&v)
            .map_err(|e| SnapshotError::new_err(e.to_string()))
    }

    /// The ids of the sessions the engine holds.
    fn session_ids(&self) -> Vec<String> {
        self.engine.session_ids()
    }

    /// Drops a session and everything kept for it; returns whether it existed.
    #[pyo3(signature = (session, time_ms = None))]
    fn remove_session(&self, session: &str, time_ms: Option<u64>) -> bool {
        self.forget_read(session);
        self.engine
            .remove_session(session, time_ms.unwrap_or_else(now_ms))
    }
}

/// Replays a message list (OpenAI or Anthropic messages, or loopguard events) through a fresh
/// engine as a host obeying every verdict would, and returns the interventions as the records
/// `loopctl simulate --json` prints (with `file` set to `"<messages>"`).
#[pyfunction]
#[pyo3(signature = (messages, policy = None, backend = None, model = None))]
fn simulate<'py>(
    py: Python<'py>,
    messages: &Bound<'py, PyAny>,
    policy: Option<&Policy>,
    backend: Option<&str>,
    model: Option<&str>,
) -> PyResult<Bound<'py, PyAny>> {
    let text = match messages.cast::<PyString>() {
        Ok(s) => s.to_cow()?.into_owned(),
        Err(_) => serde_json::to_string(&to_json(messages, 0)?)
            .map_err(|e| PyValueError::new_err(e.to_string()))?,
    };
    let parsed = loopguard_transcript::parse(&text)
        .map_err(|e| PyValueError::new_err(format!("line {}: {}", e.line, e.message)))?;
    let default;
    let policy = match policy {
        Some(p) => p,
        None => {
            default = Policy::default()?;
            &default
        }
    };
    let engine = build_engine(policy, backend, model)?;
    let file = Path::new("<messages>");
    let records: Vec<Value> = py.detach(|| {
        let workers = [Worker {
            file,
            name: String::new(),
            items: &parsed.items,
        }];
        replay::replay(&workers, None, &engine, &mut |_| {})
            .iter()
            .map(|i| i.record(file))
            .collect()
    });
    let json = serde_json::to_string(&records).map_err(|e| PyValueError::new_err(e.to_string()))?;
    py.import("json")?.call_method1("loads", (json,))
}

/// The native module.
#[pymodule]
fn _loopguard(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Policy>()?;
    m.add_class::<Engine>()?;
    m.add_class::<Verdict>()?;
    m.add_function(wrap_pyfunction!(simulate, m)?)?;
    m.add("PolicyError", m.py().get_type::<PolicyError>())?;
    m.add("SnapshotError", m.py().get_type::<SnapshotError>())?;
    Ok(())
}
