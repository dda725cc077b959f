//! The real `cadre serve` binary as a child process, for tests about the
//! process itself: signals, exit codes, OS-level faults (a file size limit
//! set from outside with `prlimit`), `kill -9` and a restart on the same
//! data dir. The server's stderr is a log file (next to the data dir,
//! truncated by each start, so it holds the current process's log) whose
//! tail a failing assertion can print; it is a regular file on purpose, so a
//! file size limit hits the logs too, as a full disk would.
//!
//! The child starts with SIGXFSZ ignored (an ignored disposition survives
//! `exec`), so a write past `RLIMIT_FSIZE` fails with EFBIG, as a full disk
//! fails with ENOSPC, instead of killing the process.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

pub struct Server {
    child: Child,
    pub base: String,
    log: PathBuf,
    _stdout: BufReader<ChildStdout>,
}

impl Server {
    /// Starts `cadre serve` on a free loopback port with the model at
    /// `model_url`; `env` adds or overrides variables (server config keys).
    /// Returns once it printed its address.
    pub fn start(data_dir: &Path, agents: &Path, model_url: &str, env: &[(&str, &str)]) -> Server {
        Self::spawn(
            data_dir,
            agents,
            Some(model_url),
            "127.0.0.1:0",
            &[],
            env,
            None,
        )
    }

    /// Like [`Self::start`] with no model endpoint configured: the built-in
    /// offline provider answers, as for a newcomer's `cadre serve`.
    #[allow(dead_code)]
    pub fn start_offline(data_dir: &Path, agents: &Path) -> Server {
        Self::spawn(data_dir, agents, None, "127.0.0.1:0", &[], &[], None)
    }

    /// [`Self::start_offline`] with server config variables (`CADRE_*`).
    #[allow(dead_code)]
    pub fn start_offline_with(data_dir: &Path, agents: &Path, env: &[(&str, &str)]) -> Server {
        Self::spawn(data_dir, agents, None, "127.0.0.1:0", &[], env, None)
    }

    /// [`Self::start_offline_with`], with `confine` run in the child before
    /// `exec` (a seccomp filter that takes a kernel feature away). It runs
    /// between `fork` and `exec`: bare syscalls only.
    #[allow(dead_code)]
    pub fn start_offline_confined(
        data_dir: &Path,
        agents: &Path,
        env: &[(&str, &str)],
        confine: fn() -> std::io::Result<()>,
    ) -> Server {
        Self::spawn(
            data_dir,
            agents,
            None,
            "127.0.0.1:0",
            &[],
            env,
            Some(confine),
        )
    }

    /// The general form, for a node of a cluster: listens on `addr` (a fixed
    /// port, so a restarted node comes back where its balancer looks for
    /// it), with `args` appended to `cadre serve` (the cluster flags) and
    /// the model at `model_url` (`None`: offline).
    #[allow(dead_code)]
    pub fn start_with_args(
        data_dir: &Path,
        agents: &Path,
        model_url: Option<&str>,
        addr: &str,
        args: &[String],
        env: &[(&str, &str)],
    ) -> Server {
        Self::spawn(data_dir, agents, model_url, addr, args, env, None)
    }

    fn spawn(
        data_dir: &Path,
        agents: &Path,
        model_url: Option<&str>,
        addr: &str,
        args: &[String],
        env: &[(&str, &str)],
        confine: Option<fn() -> std::io::Result<()>>,
    ) -> Server {
        let log = data_dir.with_extension("log");
        let stderr = File::create(&log).expect("create the server log");
        let mut command = Command::new(env!("CARGO_BIN_EXE_cadre"));
        command
            .args(["serve", "--addr", addr, "--data-dir"])
            .arg(data_dir)
            .arg("--agents")
            .arg(agents)
            .args(args)
            .env_remove("OPENAI_API_KEY")
            .env_remove("CADRE_CONFIG")
            .env("RUST_LOG", "info")
            // A start-up error prints its cause chain without a backtrace
            // (RUST_BACKTRACE, set in CI, would otherwise push the cause out
            // of `log_tail`); panics keep theirs.
            .env("RUST_LIB_BACKTRACE", "0")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr);
        match model_url {
            Some(url) => command
                .env("CADRE_MODEL_BASE_URL", url)
                .env("CADRE_MODEL_API_KEY", "test-key")
                .env("CADRE_MODEL", "mock-model"),
            None => command
                .env_remove("CADRE_MODEL_BASE_URL")
                .env_remove("CADRE_MODEL_API_KEY")
                .env_remove("CADRE_MODEL"),
        };
        for (k, v) in env {
            command.env(k, v);
        }
        // SAFETY: between fork and exec only async-signal-safe calls are
        // allowed; signal(2) is one.
        unsafe {
            command.pre_exec(move || {
                libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
                match confine {
                    Some(confine) => confine(),
                    None => Ok(()),
                }
            });
        }
        let mut child = command.spawn().expect("the cadre binary starts");
        let mut stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
        let mut line = String::new();
        let read = stdout
            .read_line(&mut line)
            .expect("read the server's stdout");
        let mut server = Server {
            child,
            base: String::new(),
            log,
            _stdout: stdout,
        };
        match line.trim_end().strip_prefix("cadre listening on http://") {
            Some(addr) if read > 0 => server.base = format!("http://{addr}"),
            _ => panic!(
                "cadre did not start; stdout: {line:?}; stderr:\n{}",
                server.log_tail()
            ),
        }
        server
    }

    /// A client of this server that presents no key.
    pub fn client(&self) -> super::Client {
        super::Client::new(&self.base)
    }

    /// `POST /v1/tools/{tool}/invoke` with `params`, as user `u1`, no key.
    pub async fn invoke(
        &self,
        tool: &str,
        params: serde_json::Value,
    ) -> (reqwest::StatusCode, serde_json::Value) {
        self.client()
            .post(
                &format!("/v1/tools/{tool}/invoke"),
                &serde_json::json!({"params": params, "user_id": "u1"}),
            )
            .await
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Sets the process's soft limit on the size of files it writes
    /// (`None`: unlimited), as `prlimit --fsize` would.
    pub fn limit_file_size(&self, bytes: Option<u64>) {
        let mut old = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: plain syscalls on valid pointers.
        let rc =
            unsafe { libc::prlimit(self.pid(), libc::RLIMIT_FSIZE, std::ptr::null(), &mut old) };
        assert_eq!(
            rc,
            0,
            "read RLIMIT_FSIZE: {}",
            std::io::Error::last_os_error()
        );
        let new = libc::rlimit {
            rlim_cur: bytes.unwrap_or(libc::RLIM_INFINITY),
            rlim_max: old.rlim_max,
        };
        let rc =
            unsafe { libc::prlimit(self.pid(), libc::RLIMIT_FSIZE, &new, std::ptr::null_mut()) };
        assert_eq!(
            rc,
            0,
            "set RLIMIT_FSIZE: {}",
            std::io::Error::last_os_error()
        );
    }

    /// SIGKILL, then reap the process: no shutdown code runs.
    pub fn kill_9(&mut self) {
        self.child.kill().expect("kill the server");
        let status = self.child.wait().expect("reap the server");
        assert!(!status.success(), "a killed server does not exit cleanly");
    }

    pub fn sigterm(&self) {
        self.signal(libc::SIGTERM);
    }

    /// Sends `signal` (SIGINT: a Ctrl-C) to the server.
    pub fn signal(&self, signal: libc::c_int) {
        // SAFETY: a signal to our own child.
        let rc = unsafe { libc::kill(self.pid(), signal) };
        assert_eq!(rc, 0, "send signal {signal}");
    }

    /// The whole log of the current process.
    #[allow(dead_code)]
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits for the process to exit, at most `within` (then it panics).
    pub fn wait_exit(&mut self, within: Duration) -> ExitStatus {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().expect("poll the server") {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "cadre did not exit within {within:?}; stderr:\n{}",
                self.log_tail()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        // The last 40 lines, and from `main`'s `Error:` line on when it is
        // further up, so a start-up failure always shows its cause.
        let tail = lines.len().saturating_sub(40);
        let start = lines
            .iter()
            .rposition(|l| l.starts_with("Error: "))
            .map_or(tail, |error| error.min(tail));
        lines[start..].join("\n")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
