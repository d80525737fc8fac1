//! Counters and a latency histogram, rendered in the Prometheus text exposition format.
//!
//! Hand-rolled rather than a metrics crate: a dozen series, read by one endpoint, need no
//! registry. Label values come from a closed set (routes, actions, detector and plugin names,
//! error kinds), so the series count stays bounded.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Upper bounds of the latency buckets, in seconds (model calls take from milliseconds to
/// minutes).
const BUCKETS: [f64; 15] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
];

/// A counter with labels.
#[derive(Debug, Default)]
struct Labeled {
    values: Mutex<BTreeMap<Vec<String>, u64>>,
}

impl Labeled {
    fn inc(&self, labels: &[&str]) {
        let mut map = self.values.lock().unwrap_or_else(|e| e.into_inner());
        *map.entry(labels.iter().map(|s| (*s).to_owned()).collect())
            .or_default() += 1;
    }

    fn render(&self, out: &mut String, name: &str, help: &str, keys: &[&str]) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
        let map = self.values.lock().unwrap_or_else(|e| e.into_inner());
        for (values, n) in map.iter() {
            let labels: Vec<String> = keys
                .iter()
                .zip(values)
                .map(|(k, v)| format!("{k}=\"{}\"", escape(v)))
                .collect();
            let _ = writeln!(out, "{name}{{{}}} {n}", labels.join(","));
        }
    }
}

#[derive(Debug)]
struct Histogram {
    buckets: [AtomicU64; BUCKETS.len()],
    count: AtomicU64,
    /// Sum in microseconds.
    sum_us: AtomicU64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
            count: AtomicU64::new(0),
            sum_us: AtomicU64::new(0),
        }
    }
}

/// What the proxy counts.
#[derive(Debug, Default)]
pub struct Metrics {
    requests: Labeled,
    refused: Labeled,
    tool_calls: AtomicU64,
    tool_results: AtomicU64,
    interventions: Labeled,
    upstream_errors: Labeled,
    client_disconnects: AtomicU64,
    connection_waits: AtomicU64,
    sessions_evicted: Labeled,
    slow_clients: AtomicU64,
    commands: Labeled,
    reloads: Labeled,
    second_chances: Labeled,
    session_store: Labeled,
    latency: Histogram,
}

impl Metrics {
    /// A request arrived on `route` (`chat_completions`, `messages`, `responses`, `models`,
    /// `passthrough`, `healthz`, `metrics`, `other`).
    pub fn request(&self, route: &str) {
        self.requests.inc(&[route]);
    }

    /// A request on `route` was refused before anything was done with it; `reason`:
    /// `missing_api_key` (`--require-key` and no key), or the code of the error that refused
    /// an unreadable request (`request_too_large`, `request_timeout`, `unreadable_body`,
    /// `invalid_json`, `invalid_messages`, `invalid_path`, …).
    pub fn refused(&self, route: &str, reason: &str) {
        self.refused.inc(&[route, reason]);
    }

    /// A tool call the model issued.
    pub fn tool_call(&self) {
        self.tool_calls.fetch_add(1, Ordering::Relaxed);
    }

    /// A tool result the agent sent back.
    pub fn tool_result(&self) {
        self.tool_results.fetch_add(1, Ordering::Relaxed);
    }

    /// The proxy acted on a verdict other than `allow`.
    pub fn intervention(&self, action: &str, detector: &str) {
        self.interventions.inc(&[action, detector]);
    }

    /// `kind`: `unreachable`, `timeout`, `status`, `malformed`, `interrupted`.
    pub fn upstream_error(&self, kind: &str) {
        self.upstream_errors.inc(&[kind]);
    }

    /// A client went away before the end of a stream.
    pub fn client_disconnect(&self) {
        self.client_disconnects.fetch_add(1, Ordering::Relaxed);
    }

    /// A session was forgotten: `capacity` (the table was full) or `idle`.
    pub fn session_evicted(&self, reason: &str) {
        self.sessions_evicted.inc(&[reason]);
    }

    /// A connection had to wait for a free slot: the connection limit was reached.
    pub fn connection_wait(&self) {
        self.connection_waits.fetch_add(1, Ordering::Relaxed);
    }

    /// A client was cut off for sending its request headers or body too slowly.
    pub fn slow_client(&self) {
        self.slow_clients.fetch_add(1, Ordering::Relaxed);
    }

    /// `result`: `applied` or `invalid`.
    pub fn command(&self, result: &str) {
        self.commands.inc(&[result]);
    }

    /// A repeated call was withheld and the upstream asked once more; `outcome`: `changed`
    /// (the model made another call), `repeated` (the same call: refused), `failed` (the retry
    /// could not be made; the warned call went to the client).
    pub fn second_chance(&self, outcome: &str) {
        self.second_chances.inc(&[outcome]);
    }

    /// The shared session store was used; `op`: `hit` (the replica held the latest state),
    /// `load` (it read a newer one), `miss` (none stored), `save`, `conflict` (a write replaced
    /// a version it had not read), `error`.
    pub fn session_store(&self, op: &str) {
        self.session_store.inc(&[op]);
    }

    /// `result`: `ok` or `failed`.
    pub fn reload(&self, result: &str) {
        self.reloads.inc(&[result]);
    }

    /// How long a model request took, from its arrival to the end of the response.
    pub fn observe_latency(&self, d: Duration) {
        let secs = d.as_secs_f64();
        for (bound, bucket) in BUCKETS.iter().zip(&self.latency.buckets) {
            if secs <= *bound {
                bucket.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.latency.count.fetch_add(1, Ordering::Relaxed);
        let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        self.latency.sum_us.fetch_add(us, Ordering::Relaxed);
    }

    /// Every series in the Prometheus text format; `sessions` is the current session count.
    pub fn render(&self, sessions: usize) -> String {
        let mut out = String::new();
        self.requests.render(
            &mut out,
            "loopguard_proxy_requests_total",
            "HTTP requests received, by route.",
            &["route"],
        );
        self.refused.render(
            &mut out,
            "loopguard_proxy_requests_refused_total",
            "Requests refused before anything was done with them, by route and reason (missing_api_key: --require-key and no key; request_too_large, request_timeout, invalid_json, …: an unreadable request).",
            &["route", "reason"],
        );
        counter(
            &mut out,
            "loopguard_proxy_tool_calls_total",
            "Tool calls the model issued, seen in upstream responses.",
            self.tool_calls.load(Ordering::Relaxed),
        );
        counter(
            &mut out,
            "loopguard_proxy_tool_results_total",
            "Tool results the agent sent back, seen in requests.",
            self.tool_results.load(Ordering::Relaxed),
        );
        self.interventions.render(
            &mut out,
            "loopguard_proxy_interventions_total",
            "Verdicts the proxy acted on, by action and detector.",
            &["action", "detector"],
        );
        self.second_chances.render(
            &mut out,
            "loopguard_proxy_second_chances_total",
            "Repeated calls withheld while the upstream was asked once more (chance_then_break), by outcome (changed, repeated, failed).",
            &["outcome"],
        );
        self.upstream_errors.render(
            &mut out,
            "loopguard_proxy_upstream_errors_total",
            "Upstream failures, by kind (unreachable, timeout, status, malformed, interrupted).",
            &["kind"],
        );
        counter(
            &mut out,
            "loopguard_proxy_client_disconnects_total",
            "Streaming responses the client abandoned before the end.",
            self.client_disconnects.load(Ordering::Relaxed),
        );
        self.sessions_evicted.render(
            &mut out,
            "loopguard_proxy_sessions_evicted_total",
            "Sessions forgotten, by reason (capacity: the table was full, least recently used first; idle).",
            &["reason"],
        );
        counter(
            &mut out,
            "loopguard_proxy_connection_limit_waits_total",
            "Connections accepted only after waiting for a free slot (--max-connections reached).",
            self.connection_waits.load(Ordering::Relaxed),
        );
        counter(
            &mut out,
            "loopguard_proxy_slow_clients_total",
            "Connections closed because the request headers or body came too slowly (--header-timeout).",
            self.slow_clients.load(Ordering::Relaxed),
        );
        self.commands.render(
            &mut out,
            "loopguard_proxy_commands_total",
            "In-chat settings commands, by result (applied, invalid).",
            &["result"],
        );
        self.session_store.render(
            &mut out,
            "loopguard_proxy_session_store_total",
            "Uses of the shared session store (--session-store), by operation (hit, load, miss, save, conflict, error).",
            &["op"],
        );
        self.reloads.render(
            &mut out,
            "loopguard_proxy_policy_reloads_total",
            "Policy reloads on SIGHUP, by result (ok, failed).",
            &["result"],
        );
        let _ = writeln!(
            out,
            "# HELP loopguard_proxy_sessions Sessions the proxy currently tracks.\n\
             # TYPE loopguard_proxy_sessions gauge\nloopguard_proxy_sessions {sessions}"
        );
        let name = "loopguard_proxy_request_duration_seconds";
        let _ = writeln!(
            out,
            "# HELP {name} Model requests (every wire format), from arrival to the end of the response.\n\
             # TYPE {name} histogram"
        );
        for (bound, bucket) in BUCKETS.iter().zip(&self.latency.buckets) {
            let _ = writeln!(
                out,
                "{name}_bucket{{le=\"{bound}\"}} {}",
                bucket.load(Ordering::Relaxed)
            );
        }
        let count = self.latency.count.load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {count}");
        let sum = self.latency.sum_us.load(Ordering::Relaxed) as f64 / 1e6;
        let _ = writeln!(out, "{name}_sum {sum}\n{name}_count {count}");
        out
    }
}

fn counter(out: &mut String, name: &str, help: &str, value: u64) {
    let _ = writeln!(
        out,
        "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}"
    );
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counters_labels_and_histogram() {
        let m = Metrics::default();
        m.request("chat_completions");
        m.request("chat_completions");
        m.tool_call();
        m.refused("messages", "missing_api_key");
        m.intervention("warn", "exact_repeat");
        m.upstream_error("unreachable");
        m.observe_latency(Duration::from_millis(30));
        let text = m.render(3);
        assert!(text.contains("loopguard_proxy_requests_total{route=\"chat_completions\"} 2"));
        assert!(text.contains("loopguard_proxy_tool_calls_total 1"));
        assert!(text.contains(
            "loopguard_proxy_requests_refused_total{route=\"messages\",reason=\"missing_api_key\"} 1"
        ));
        assert!(text.contains(
            "loopguard_proxy_interventions_total{action=\"warn\",detector=\"exact_repeat\"} 1"
        ));
        assert!(text.contains("loopguard_proxy_upstream_errors_total{kind=\"unreachable\"} 1"));
        assert!(text.contains("loopguard_proxy_sessions 3"));
        assert!(text.contains("loopguard_proxy_request_duration_seconds_bucket{le=\"0.025\"} 0"));
        assert!(text.contains("loopguard_proxy_request_duration_seconds_bucket{le=\"0.05\"} 1"));
        assert!(text.contains("loopguard_proxy_request_duration_seconds_bucket{le=\"+Inf\"} 1"));
        assert!(text.contains("loopguard_proxy_request_duration_seconds_count 1"));
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}
