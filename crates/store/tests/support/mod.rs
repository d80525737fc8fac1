//! A real `redis-server` for the tests: started on a free loopback port, without persistence,
//! killed when dropped. If it cannot be started the test fails loudly — it never skips.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct RedisServer {
    port: u16,
    child: Option<Child>,
    log: PathBuf,
}

impl RedisServer {
    /// Starts a server on a free port (retrying a few ports, in case another process takes the
    /// port between our probe and the server's bind).
    pub fn start() -> Self {
        let mut failures = Vec::new();
        for _ in 0..5 {
            let port = free_port();
            let mut server = Self {
                port,
                child: None,
                log: std::env::temp_dir().join(format!(
                    "loopguard-store-redis-{}-{port}.log",
                    std::process::id()
                )),
            };
            match server.spawn() {
                Ok(()) => return server,
                // Not a port race: another port will not help.
                Err(e) if e.contains("could not be run") => {
                    failures.push(e);
                    break;
                }
                Err(e) => failures.push(e),
            }
        }
        panic!(
            "could not start redis-server for the Redis store tests (install the Debian package \
             `redis-server`; .ci/run does):\n{}",
            failures.join("\n")
        );
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// A direct connection, for looking at keys.
    pub fn connection(&self) -> redis::Connection {
        redis::Client::open(self.url())
            .and_then(|c| c.get_connection_with_timeout(Duration::from_secs(2)))
            .unwrap_or_else(|e| panic!("cannot connect to the test redis-server: {e}"))
    }

    /// Kills the server (SIGKILL: no goodbye to clients) and waits for it to exit.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Freezes the server (SIGSTOP): connections stay open and the kernel still accepts new
    /// ones, but nothing is answered until [`resume`](Self::resume).
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// Thaws a server frozen by [`pause`](Self::pause) (SIGCONT).
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, signal: &str) {
        let pid = self
            .child
            .as_ref()
            .map(Child::id)
            .unwrap_or_else(|| panic!("redis-server on port {} is not running", self.port));
        let status = Command::new("kill")
            .args([signal, &pid.to_string()])
            .status()
            .unwrap_or_else(|e| panic!("could not run `kill {signal} {pid}`: {e}"));
        assert!(status.success(), "`kill {signal} {pid}` failed: {status}");
    }

    /// Starts the server again on the same port, empty (there is no persistence).
    pub fn restart(&mut self) {
        self.kill();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match self.spawn() {
                Ok(()) => return,
                Err(e) if Instant::now() > deadline => {
                    panic!("could not restart redis-server on port {}: {e}", self.port)
                }
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }

    fn spawn(&mut self) -> Result<(), String> {
        let port = self.port.to_string();
        let log = self.log.to_string_lossy().into_owned();
        let child = Command::new("redis-server")
            .args([
                "--port",
                &port,
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .args(["--logfile", &log])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("`redis-server` could not be run: {e}"))?;
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                self.child = None;
                return Err(format!(
                    "redis-server exited with {status} on port {}; its log:\n{}",
                    self.port,
                    std::fs::read_to_string(&self.log).unwrap_or_default()
                ));
            }
            if self.ping() {
                return Ok(());
            }
            if Instant::now() > deadline {
                self.kill();
                return Err(format!(
                    "redis-server on port {} did not answer PING within 10 s; its log:\n{}",
                    self.port,
                    std::fs::read_to_string(&self.log).unwrap_or_default()
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn ping(&self) -> bool {
        redis::Client::open(self.url())
            .and_then(|c| c.get_connection_with_timeout(Duration::from_millis(200)))
            .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c))
            .is_ok_and(|pong| pong == "PONG")
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_file(&self.log);
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or_else(|e| panic!("no free loopback port: {e}"))
}

/// Waits until `condition` holds, failing the test with `what` after 10 seconds.
pub fn eventually(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}
