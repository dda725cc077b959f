//! A real PostgreSQL for tests: the machine's binaries, a temp data dir, a
//! free loopback port.
//!
//! test ──Postgres::shared()──▶ one server per test binary while tests hold it
//!      ──database("name")──▶ a fresh database's URL (a database per test)
//!
//! - Binaries: `/usr/lib/postgresql/<newest>/bin`, else `initdb` on PATH.
//!   Missing: the test panics saying what to install (never skipped).
//! - PostgreSQL refuses to run as root, and CI runs as root: then initdb and
//!   the server run as the `postgres` user (uid/gid set at exec; the temp
//!   dir is chowned to it). As any other user they run as that user.
//! - Defaults kept (fsync on: crash and kill proofs need real durability);
//!   only `shared_buffers` is small. `initdb --no-sync` skips the fsync of
//!   the fresh cluster's files by initdb itself, nothing of the server.
//! - Ready when the server logs "ready to accept connections" (its stderr
//!   is read, and kept in `postgres.log` of the temp dir), not by polling.
//! - Stopped on drop of the last holder: a fast shutdown (SIGINT), then
//!   SIGKILL to its process group. The server is started by a thread that
//!   lives as long as it, with a parent-death signal, so a test binary
//!   that dies leaves no server behind either.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak, mpsc};
use std::time::Duration;

use super::ports::free_port;

pub struct Postgres {
    pub port: u16,
    bin: PathBuf,
    dir: tempfile::TempDir,
    pid: i32,
    /// Dropped to stop the server; the thread answers once it has exited.
    stop: Option<mpsc::Sender<()>>,
    stopped: Option<std::thread::JoinHandle<()>>,
}

static SHARED: Mutex<Weak<Postgres>> = Mutex::new(Weak::new());
static DATABASES: AtomicU64 = AtomicU64::new(0);

/// Where the PostgreSQL binaries are.
fn bin_dir() -> PathBuf {
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let v = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").exists().then_some((v, bin))
        })
        .collect();
    versions.sort();
    if let Some((_, bin)) = versions.pop() {
        return bin;
    }
    let on_path = std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p).find(|d| d.join("initdb").exists() && d.join("postgres").exists())
    });
    on_path.unwrap_or_else(|| {
        panic!(
            "PostgreSQL's server binaries (initdb, postgres) were not found in \
             /usr/lib/postgresql/*/bin or on PATH: install them (Debian: \
             `apt-get install postgresql`) to run the PostgreSQL store tests"
        )
    })
}

/// (uid, gid) of the `postgres` user when running as root.
fn run_as() -> Option<(u32, u32)> {
    if unsafe { libc::geteuid() } != 0 {
        return None;
    }
    let name = std::ffi::CString::new("postgres").unwrap();
    let pw = unsafe { libc::getpwnam(name.as_ptr()) };
    assert!(
        !pw.is_null(),
        "running as root, and PostgreSQL refuses root: the `postgres` user is \
         missing (Debian's postgresql package creates it)"
    );
    let pw = unsafe { &*pw };
    Some((pw.pw_uid, pw.pw_gid))
}

fn command(bin: &Path, name: &str, user: Option<(u32, u32)>) -> Command {
    use std::os::unix::process::CommandExt;
    let mut cmd = Command::new(bin.join(name));
    if let Some((uid, gid)) = user {
        cmd.uid(uid).gid(gid);
    }
    cmd
}

impl Postgres {
    /// The server this test binary shares, started if no test holds one.
    pub fn shared() -> Arc<Postgres> {
        let mut slot = SHARED.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(pg) = slot.upgrade() {
            return pg;
        }
        let pg = Arc::new(Postgres::start());
        *slot = Arc::downgrade(&pg);
        pg
    }

    /// A server of its own (for tests that stop or kill it).
    pub fn start() -> Postgres {
        Self::start_with(None)
    }

    /// A server of its own that also takes TLS (`ssl = on`) with this
    /// certificate chain and key (PEM).
    #[allow(dead_code)]
    pub fn start_tls(cert_pem: &str, key_pem: &str) -> Postgres {
        Self::start_with(Some((cert_pem, key_pem)))
    }

    fn start_with(tls: Option<(&str, &str)>) -> Postgres {
        let bin = bin_dir();
        let user = run_as();
        let dir = tempfile::tempdir().expect("temp dir");
        if let Some((uid, gid)) = user {
            let path = std::ffi::CString::new(dir.path().as_os_str().as_encoded_bytes()).unwrap();
            assert_eq!(unsafe { libc::chown(path.as_ptr(), uid, gid) }, 0, "chown");
        }
        let data = dir.path().join("data");
        let out = command(&bin, "initdb", user)
            .arg("-D")
            .arg(&data)
            .args([
                "-U",
                "postgres",
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",
            ])
            .output()
            .expect("run initdb");
        assert!(
            out.status.success(),
            "initdb failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        if let Some((cert, key)) = tls {
            use std::os::unix::fs::PermissionsExt;
            for (name, pem) in [("server.crt", cert), ("server.key", key)] {
                let path = data.join(name);
                std::fs::write(&path, pem).expect("write the TLS files");
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
                if let Some((uid, gid)) = user {
                    std::os::unix::fs::chown(&path, Some(uid), Some(gid)).expect("chown");
                }
            }
            let mut conf = std::fs::OpenOptions::new()
                .append(true)
                .open(data.join("postgresql.conf"))
                .expect("postgresql.conf");
            writeln!(
                conf,
                "ssl = on\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'"
            )
            .unwrap();
        }
        let port = free_port();
        let (ready_tx, ready_rx) = mpsc::channel();
        let (stop, stop_rx) = mpsc::channel::<()>();
        let (bin2, dir_path) = (bin.clone(), dir.path().to_path_buf());
        let stopped = std::thread::Builder::new()
            .name("test-postgres".into())
            .spawn(move || serve(&bin2, &dir_path, port, user, ready_tx, stop_rx))
            .expect("spawn the postgres thread");
        let pid = match ready_rx.recv_timeout(Duration::from_secs(60)) {
            Ok(Ok(pid)) => pid,
            Ok(Err(log)) => panic!("PostgreSQL did not start:\n{log}"),
            Err(_) => panic!("PostgreSQL did not start within 60 s"),
        };
        Postgres {
            port,
            bin,
            dir,
            pid,
            stop: Some(stop),
            stopped: Some(stopped),
        }
    }

    /// The server's main process.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// A URL of the server's `postgres` database (no password: trust).
    pub fn url(&self, database: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{database}", self.port)
    }

    /// Creates a fresh database (its name starts with `name`) and returns its URL.
    pub fn database(&self, name: &str) -> String {
        let n = DATABASES.fetch_add(1, Ordering::Relaxed);
        let db: String = format!("{name}_{n}")
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() {
                    c.to_ascii_lowercase()
                } else {
                    '_'
                }
            })
            .collect();
        let out = Command::new(self.bin.join("psql"))
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-U",
                "postgres",
            ])
            .args(["-v", "ON_ERROR_STOP=1", "-q", "-c"])
            .arg(format!("CREATE DATABASE {db}"))
            .output()
            .expect("run psql");
        assert!(
            out.status.success(),
            "CREATE DATABASE {db}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        self.url(&db)
    }

    /// Runs `statement` on the database of `url` (with psql), for tests
    /// that set a row as another node or time would have.
    pub fn sql(&self, url: &str, statement: &str) -> String {
        let out = Command::new(self.bin.join("psql"))
            .args([
                "-v",
                "ON_ERROR_STOP=1",
                "-q",
                "-A",
                "-t",
                "-d",
                url,
                "-c",
                statement,
            ])
            .output()
            .expect("run psql");
        assert!(
            out.status.success(),
            "{statement}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// The server's log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("postgres.log")).unwrap_or_default()
    }
}

/// Runs the server until told to stop; sends its pid once it is ready.
fn serve(
    bin: &Path,
    dir: &Path,
    port: u16,
    user: Option<(u32, u32)>,
    ready: mpsc::Sender<Result<i32, String>>,
    stop: mpsc::Receiver<()>,
) {
    use std::os::unix::process::CommandExt;
    let mut cmd = command(bin, "postgres", user);
    cmd.arg("-D")
        .arg(dir.join("data"))
        .args(["-p", &port.to_string(), "-c", "listen_addresses=127.0.0.1"])
        .arg("-c")
        .arg(format!("unix_socket_directories={}", dir.display()))
        .args(["-c", "shared_buffers=16MB", "-c", "max_connections=300"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .process_group(0);
    unsafe {
        // Set after the uid change (which clears it): this thread's end,
        // or the test binary's death, kills the server.
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            let _ = ready.send(Err(format!("spawn postgres: {e}")));
            return;
        }
    };
    let pid = child.id() as i32;
    let stderr = child.stderr.take().expect("piped stderr");
    let log_path = dir.join("postgres.log");
    let reader = std::thread::spawn(move || {
        let mut log = std::fs::File::create(&log_path).ok();
        let mut ready = Some(ready);
        let mut seen = String::new();
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(f) = log.as_mut() {
                let _ = writeln!(f, "{line}");
            }
            if ready.is_some() {
                seen.push_str(&line);
                seen.push('\n');
                if line.contains("ready to accept connections") {
                    let _ = ready.take().map(|r| r.send(Ok(pid)));
                }
            }
        }
        if let Some(r) = ready {
            let _ = r.send(Err(seen));
        }
    });
    // Returns when the Postgres value is dropped (its sender goes).
    let _ = stop.recv();
    unsafe { libc::kill(pid, libc::SIGINT) };
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20))
            }
            _ => break,
        }
    }
    unsafe { libc::kill(-pid, libc::SIGKILL) };
    let _ = child.wait();
    let _ = reader.join();
}

impl Drop for Postgres {
    fn drop(&mut self) {
        self.stop.take();
        if let Some(t) = self.stopped.take() {
            let _ = t.join();
        }
    }
}
