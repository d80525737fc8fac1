//! What `loopctl proxy` adds to a request: the same client calls an upstream that answers at
//! once, directly and through the real proxy binary (built-in default policy, every detector
//! on), all on 127.0.0.1.
//!
//! Run: `cargo bench -p loopguard-benches --bench proxy`
//!
//! - `proxy/{direct,proxied}_{plain,stream}` (criterion): one request at a time, a ~20-message
//!   history ending in a tool result, answered with one tool call (as JSON, or as SSE with the
//!   arguments in fragments). The proxied figure minus the direct one is the added latency.
//! - A load table (printed after them): 32 clients at once, 8192 requests each way in four
//!   alternating rounds; every request's latency is recorded and p50/p99 and requests/s are
//!   printed for direct and proxied, with the added p50/p99 (proxied minus direct percentile)
//!   and the change in requests/s. Criterion reports no p99, so this is a plain measured loop.
//!   `-- load` runs only the table; any other filter skips it. Under `--test` (and
//!   `cargo test --benches`) it is a short smoke run.
//!
//! Each client is one agent session that never loops (a new file read every turn), so the
//! proxy judges every call and result but never intervenes; the bench checks that at the end.
//!
//! The proxy is built by the bench (`cargo build -p loopctl`, `--release` unless the bench
//! itself is a debug build; a no-op when fresh) and run from `$CARGO_TARGET_DIR` or `target/`,
//! unless `LOOPGUARD_BENCH_LOOPCTL` names the `loopctl` binary to run.
//! The upstream (TCP_NODELAY on, as model servers have it) and the clients share one 2-thread
//! runtime in the bench process; the proxy runs as its own process. On a small machine the three
//! compete for the same cores, as they would on one host.
//!
//! `LOOPGUARD_BENCH_CORES=split` gives the proxy a core of its own, as a deployment does where
//! the agents and the model server run on other machines: the bench process (clients and
//! upstream) is pinned to CPU 0 and the proxy to CPU 1 (`taskset`, every thread), for the direct
//! and the proxied runs alike, so both ways have the same one core for clients and upstream.

#![allow(clippy::expect_used, clippy::panic)] // benchmark setup: a broken setup should stop the run

use std::convert::Infallible;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::http::header;
use axum::response::Response;
use axum::routing::post;
use axum::serve::ListenerExt;
use criterion::{Criterion, SamplingMode, Throughput};
use serde_json::{Value, json};

/// Clients in flight in the load table, the requests each sends per round, and the rounds.
const CLIENTS: usize = 32;
const REQUESTS_PER_CLIENT: usize = 64;
const ROUNDS: usize = 4;
/// Pairs of (assistant call, tool result) kept in a conversation: with the system and user
/// messages, 20 messages.
const PAIRS: usize = 9;

// --- the upstream ------------------------------------------------------------------------------

use loopguard_benches::agent::{call, completion, opening, result, stream as sse_events};

/// The model: answers with the call after the last one it sees a result for.
async fn model(body: Bytes) -> Response {
    let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let last = request["messages"]
        .as_array()
        .and_then(|m| m.last())
        .and_then(|m| m["tool_call_id"].as_str())
        .and_then(|id| id.strip_prefix("call_"))
        .and_then(|n| n.parse::<u64>().ok())
        .unwrap_or(0);
    let next = call(last + 1);
    let (content_type, body) = if request["stream"] == json!(true) {
        let frames = sse_events(&next)
            .into_iter()
            .map(|e| Ok::<_, Infallible>(Bytes::from(e)));
        (
            "text/event-stream",
            Body::from_stream(futures_util::stream::iter(frames)),
        )
    } else {
        (
            "application/json",
            Body::from(completion(&next).to_string()),
        )
    };
    let mut r = Response::new(body);
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(content_type),
    );
    r
}

// --- the proxy ---------------------------------------------------------------------------------

/// Builds `loopctl` with the bench's own optimization and returns its path; or the binary
/// `LOOPGUARD_BENCH_LOOPCTL` names (to compare two builds on the same clients and upstream).
fn loopctl() -> PathBuf {
    if let Some(path) = std::env::var_os("LOOPGUARD_BENCH_LOOPCTL") {
        return PathBuf::from(path);
    }
    let release = !cfg!(debug_assertions);
    let path = loopguard_tests::build(&["loopctl"], release)
        .join(format!("loopctl{}", std::env::consts::EXE_SUFFIX));
    assert!(path.is_file(), "{} was not built", path.display());
    path
}

/// `loopctl proxy` with the built-in default policy, killed when dropped.
struct Proxy {
    child: Child,
    base: String,
}

impl Proxy {
    fn start(upstream: &str) -> Proxy {
        let mut cmd = loopguard_tests::proxy_command(&loopctl(), upstream);
        cmd.stderr(Stdio::inherit()).env("LOOPGUARD_LOG", "warn");
        let mut child = cmd.spawn().expect("start loopctl proxy");
        let mut line = String::new();
        let stdout = child.stdout.take().expect("piped stdout");
        let _ = BufReader::new(stdout).read_line(&mut line);
        let Some(base) = line.trim().strip_prefix("loopctl proxy listening on ") else {
            let _ = child.kill();
            panic!("the proxy did not start: {line:?}");
        };
        if split_cores() {
            pin(child.id(), 1);
        }
        Proxy {
            base: base.to_owned(),
            child,
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// --- the clients -------------------------------------------------------------------------------

/// One agent session: a system prompt, a task, and the last [`PAIRS`] calls with their results.
struct Conversation {
    session: String,
    last: u64,
    messages: Vec<Value>,
}

impl Conversation {
    fn new(session: String) -> Conversation {
        let mut messages = opening(&session);
        for n in 1..=PAIRS as u64 {
            messages.push(json!({"role": "assistant", "content": null, "tool_calls": [call(n)]}));
            messages.push(result(n));
        }
        Conversation {
            session,
            last: PAIRS as u64,
            messages,
        }
    }

    fn body(&self, stream: bool) -> Vec<u8> {
        serde_json::to_vec(&json!({"model": "bench", "stream": stream, "messages": self.messages}))
            .expect("serializable")
    }

    /// Runs the call the model just made and drops the oldest pair.
    fn advance(&mut self) {
        self.last += 1;
        self.messages
            .push(json!({"role": "assistant", "content": null, "tool_calls": [call(self.last)]}));
        self.messages.push(result(self.last));
        self.messages.drain(2..4);
    }
}

/// One turn: the request, the whole response, a check that it carries the expected call.
async fn turn(http: &reqwest::Client, url: &str, conv: &mut Conversation, stream: bool) {
    let resp = http
        .post(url)
        .header("content-type", "application/json")
        .header("x-session-id", &conv.session)
        .body(conv.body(stream))
        .send()
        .await
        .expect("request sent");
    let status = resp.status();
    let bytes = resp.bytes().await.expect("response read");
    let id = format!("\"id\":\"call_{}\"", conv.last + 1);
    let ok = status.is_success()
        && memchr(&bytes, id.as_bytes())
        && (!stream || bytes.ends_with(b"data: [DONE]\n\n"));
    assert!(
        ok,
        "{url}: unexpected answer ({status}): {}",
        String::from_utf8_lossy(&bytes)
    );
    conv.advance();
}

fn memchr(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

struct Setup {
    rt: tokio::runtime::Runtime,
    http: reqwest::Client,
    direct: String,
    proxied: String,
    proxy: Proxy,
}

impl Setup {
    fn start() -> Setup {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("tokio runtime");
        let listener = rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .expect("bind the upstream");
        let addr = listener.local_addr().expect("upstream address");
        let app = Router::new().route("/v1/chat/completions", post(model));
        // As model servers do: SSE frames go out as written, not held back for an ACK.
        let listener = listener.tap_io(|tcp| {
            let _ = tcp.set_nodelay(true);
        });
        rt.spawn(async move { axum::serve(listener, app).await });
        let upstream = format!("http://{addr}/v1");
        let proxy = Proxy::start(&upstream);
        Setup {
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(30))
                .build()
                .expect("HTTP client"),
            direct: format!("{upstream}/chat/completions"),
            proxied: format!("{}/v1/chat/completions", proxy.base),
            proxy,
            rt,
        }
    }

    /// The proxy's interventions so far: none, or the figures are not those of a clean run.
    fn interventions(&self) -> u64 {
        let url = format!("{}/metrics", self.proxy.base);
        let text = self.rt.block_on(async {
            let r = self.http.get(&url).send().await.expect("metrics");
            r.text().await.expect("metrics body")
        });
        text.lines()
            .filter(|l| l.starts_with("loopguard_proxy_interventions_total{"))
            .filter_map(|l| l.rsplit_once(' ')?.1.parse::<u64>().ok())
            .sum()
    }
}

// --- one request at a time (criterion) -----------------------------------------------------------

fn latency(c: &mut Criterion, s: &Setup) {
    let mut group = c.benchmark_group("proxy");
    group.throughput(Throughput::Elements(1));
    // Requests take milliseconds: the same iteration count in every sample.
    group.sampling_mode(SamplingMode::Flat);
    group.sample_size(50);
    group.warm_up_time(Duration::from_secs(2));
    group.measurement_time(Duration::from_secs(6));
    for stream in [false, true] {
        let kind = if stream { "stream" } else { "plain" };
        for (way, url) in [("direct", &s.direct), ("proxied", &s.proxied)] {
            let mut conv = Conversation::new(format!("bench-{way}-{kind}"));
            group.bench_function(format!("{way}_{kind}"), |b| {
                b.iter_custom(|iters| {
                    s.rt.block_on(async {
                        let start = Instant::now();
                        for _ in 0..iters {
                            turn(&s.http, url, &mut conv, stream).await;
                        }
                        start.elapsed()
                    })
                })
            });
        }
    }
    group.finish();
}

// --- many clients at once (the load table) -------------------------------------------------------

/// CPU time a process has used so far, over all its threads (Linux: `/proc/<pid>/task/*/
/// schedstat`, nanoseconds on the CPU); `None` elsewhere.
fn cpu_time(pid: &str) -> Option<Duration> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let mut ns = 0u64;
    for t in tasks.flatten() {
        let stat = std::fs::read_to_string(t.path().join("schedstat")).unwrap_or_default();
        ns += stat
            .split_whitespace()
            .next()
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or(0);
    }
    Some(Duration::from_nanos(ns))
}

/// Every request's latency in a set of runs, the time the runs took, and the CPU time the
/// bench process (clients and upstream) and the proxy used meanwhile.
#[derive(Default)]
struct Run {
    latencies: Vec<Duration>,
    wall: Duration,
    bench_cpu: Duration,
    proxy_cpu: Duration,
}

impl Run {
    /// Nearest-rank percentile (`latencies` sorted).
    fn percentile(&self, p: f64) -> Duration {
        let i = ((self.latencies.len() as f64 * p).ceil() as usize).saturating_sub(1);
        self.latencies[i.min(self.latencies.len() - 1)]
    }

    fn per_second(&self) -> f64 {
        self.latencies.len() as f64 / self.wall.as_secs_f64()
    }

    /// CPU microseconds per request: (bench process, proxy).
    fn cpu_per_request(&self) -> (f64, f64) {
        let n = self.latencies.len().max(1) as f64;
        (
            self.bench_cpu.as_secs_f64() * 1e6 / n,
            self.proxy_cpu.as_secs_f64() * 1e6 / n,
        )
    }

    /// `clients` sessions at once, each sending `per_client` requests one after the other.
    fn add(&mut self, s: &Setup, url: &str, stream: bool, per_client: usize, tag: &str) {
        let url: Arc<str> = Arc::from(url);
        let proxy_pid = s.proxy.child.id().to_string();
        let cpu_before = (cpu_time("self"), cpu_time(&proxy_pid));
        let (times, wall) = s.rt.block_on(async {
            let start = Instant::now();
            let tasks: Vec<_> = (0..CLIENTS)
                .map(|k| {
                    let (http, url) = (s.http.clone(), Arc::clone(&url));
                    let mut conv = Conversation::new(format!("load-{tag}-{k}"));
                    tokio::spawn(async move {
                        let mut times = Vec::with_capacity(per_client);
                        for _ in 0..per_client {
                            let t = Instant::now();
                            turn(&http, &url, &mut conv, stream).await;
                            times.push(t.elapsed());
                        }
                        times
                    })
                })
                .collect();
            let mut times = Vec::with_capacity(CLIENTS * per_client);
            for t in tasks {
                times.extend(t.await.expect("client task"));
            }
            (times, start.elapsed())
        });
        if let ((Some(b0), Some(p0)), Some(b1), Some(p1)) =
            (cpu_before, cpu_time("self"), cpu_time(&proxy_pid))
        {
            self.bench_cpu += b1.saturating_sub(b0);
            self.proxy_cpu += p1.saturating_sub(p0);
        }
        self.latencies.extend(times);
        self.latencies.sort_unstable();
        self.wall += wall;
    }
}

fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1e3)
}

fn added(a: Duration, b: Duration) -> String {
    let d = a.as_secs_f64() - b.as_secs_f64();
    format!("{:+.3} ms", d * 1e3)
}

/// Direct and proxied runs alternate ([`ROUNDS`] of each), so that whatever else the machine
/// does weighs on both alike; each row pools its rounds.
fn load_table(s: &Setup, per_client: usize) {
    let total = ROUNDS * CLIENTS * per_client;
    println!(
        "\nproxy load: {CLIENTS} clients at once, {total} requests each way per row \
         ({ROUNDS} alternating rounds), {}-message history, upstream answers at once",
        PAIRS * 2 + 2
    );
    println!(
        "{:<8} {:<9} {:>12} {:>12} {:>12}",
        "", "", "p50", "p99", "requests/s"
    );
    let mut cpu = Vec::new();
    for stream in [false, true] {
        let kind = if stream { "stream" } else { "plain" };
        // Warm up both ways: connections, pools, the proxy's engine.
        Run::default().add(s, &s.direct, stream, 10, &format!("warm-d-{kind}"));
        Run::default().add(s, &s.proxied, stream, 10, &format!("warm-p-{kind}"));
        let (mut direct, mut proxied) = (Run::default(), Run::default());
        for round in 0..ROUNDS {
            direct.add(
                s,
                &s.direct,
                stream,
                per_client,
                &format!("d-{kind}-{round}"),
            );
            proxied.add(
                s,
                &s.proxied,
                stream,
                per_client,
                &format!("p-{kind}-{round}"),
            );
        }
        for (way, r) in [("direct", &direct), ("proxied", &proxied)] {
            println!(
                "{kind:<8} {way:<9} {:>12} {:>12} {:>12.0}",
                ms(r.percentile(0.50)),
                ms(r.percentile(0.99)),
                r.per_second()
            );
        }
        println!(
            "{kind:<8} {:<9} {:>12} {:>12} {:>12}",
            "added",
            added(proxied.percentile(0.50), direct.percentile(0.50)),
            added(proxied.percentile(0.99), direct.percentile(0.99)),
            format!(
                "{:+.0}%",
                100.0 * (proxied.per_second() / direct.per_second() - 1.0)
            )
        );
        cpu.push((
            kind,
            direct.cpu_per_request(),
            proxied.cpu_per_request(),
            proxied.per_second(),
        ));
    }
    // CPU per request says what the proxy costs whatever else the machine runs: on a machine
    // the clients, the upstream and the proxy share, throughput through the proxy is at most
    // (clients + upstream) / (clients + upstream + proxy) of direct.
    if cpu.iter().any(|(_, d, _, _)| d.0 > 0.0) {
        println!(
            "CPU time per request (µs): clients and upstream (the bench process), and the proxy"
        );
        for (kind, d, p, per_second) in cpu {
            // With a core of its own the proxy bounds nothing until that core is full.
            let last = if split_cores() {
                format!("proxy's core busy {:>4.0}%", p.1 * per_second / 1e4)
            } else {
                format!("bound {:>4.0}% of direct", 100.0 * p.0 / (p.0 + p.1))
            };
            println!(
                "{kind:<8} direct {:>8.1}   proxied {:>8.1} + proxy {:>8.1}   {last}",
                d.0, p.0, p.1,
            );
        }
    }
    println!();
}

// --- cores ---------------------------------------------------------------------------------------

/// Whether the proxy gets a core of its own (`LOOPGUARD_BENCH_CORES=split`).
fn split_cores() -> bool {
    std::env::var("LOOPGUARD_BENCH_CORES").is_ok_and(|v| v == "split")
}

/// Pins every thread of process `pid` to CPU `cpu` (threads it starts later inherit it).
fn pin(pid: u32, cpu: usize) {
    let status = std::process::Command::new("taskset")
        .args(["-a", "-p", "-c", &cpu.to_string(), &pid.to_string()])
        .stdout(Stdio::null())
        .status()
        .expect("taskset (util-linux) pins the processes for LOOPGUARD_BENCH_CORES=split");
    assert!(status.success(), "taskset could not pin {pid} to CPU {cpu}");
}

// --- main ----------------------------------------------------------------------------------------

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let has = |flag: &str| args.iter().any(|a| a == flag);
    let measuring = has("--bench") && !has("--test") && !has("--list");
    let filter = args.iter().find(|a| !a.starts_with('-'));
    let table = !has("--list") && filter.is_none_or(|f| "proxy/load".contains(f.as_str()));

    if split_cores() {
        // Before the runtime starts: its threads inherit the main thread's CPU.
        pin(std::process::id(), 0);
        println!("cores: the bench (clients and upstream) on CPU 0, the proxy on CPU 1");
    }
    let setup = Setup::start();
    let mut c = Criterion::default().configure_from_args();
    latency(&mut c, &setup);
    if table {
        load_table(&setup, if measuring { REQUESTS_PER_CLIENT } else { 1 });
    }
    let interventions = setup.interventions();
    assert_eq!(
        interventions, 0,
        "the proxy intervened {interventions} times: these sessions must not loop"
    );
    c.final_summary();
}
