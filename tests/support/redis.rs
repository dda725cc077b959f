//! A real redis-server for the cluster tests, on a free loopback port.
//!
//! `RedisServer::start()` runs the machine's `redis-server` (installing the
//! Debian package first when it is missing and we are root; otherwise it
//! panics saying what to install: never skipped) with no persistence
//! (`--save ''`, `--appendonly no`), so a restart comes back empty, as a
//! lost Redis does. Ready means the server printed "Ready to accept
//! connections" (no polling). `stop()` / `restart()` keep the port, for the
//! "Redis lost" proofs; Drop kills it.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// How long redis-server may take to say it is ready.
const STARTUP: Duration = Duration::from_secs(20);

pub struct RedisServer {
    port: u16,
    child: Option<Child>,
    dir: tempfile::TempDir,
}

impl RedisServer {
    pub fn start() -> RedisServer {
        super::packages::ensure_installed("redis-server", "redis-server");
        let port = super::haproxy::free_port();
        let mut server = RedisServer {
            port,
            child: None,
            dir: tempfile::tempdir().expect("temp dir"),
        };
        server.run();
        server
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Kills the server (as a crash would) and waits until it is gone.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same port, empty.
    pub fn restart(&mut self) {
        self.stop();
        self.run();
    }

    fn run(&mut self) {
        let mut child = Command::new("redis-server")
            .args([
                "--port",
                &self.port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                &self.dir.path().display().to_string(),
                "--loglevel",
                "notice",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server starts");
        let stdout = child.stdout.take().expect("piped stdout");
        let (ready_tx, ready) = mpsc::channel();
        std::thread::spawn(move || {
            let mut ready_tx = Some(ready_tx);
            // Keeps reading to the end so the pipe never fills.
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if line.contains("Ready to accept connections")
                    && let Some(tx) = ready_tx.take()
                {
                    let _ = tx.send(());
                }
            }
        });
        self.child = Some(child);
        ready
            .recv_timeout(STARTUP)
            .unwrap_or_else(|_| panic!("redis-server on port {} did not become ready", self.port));
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
    }
}
