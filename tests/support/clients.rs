//! The official clients the open-doors tests drive (issue #32): the OpenAI
//! SDK, the A2A SDK, an SSE client that reconnects, generated clients.
//!
//! Python: every package of `tests/clients/requirements.txt` (all pinned,
//! the whole `pip freeze`) goes into one venv under `target/`
//! ([`CARGO_TARGET_TMPDIR`]/`clients-venv`), made with the machine's Python
//! 3.10 or later (`python3.11`, else `python3`, or `CADRE_CLIENTS_PYTHON`)
//! from PyPI on the first run (about 15 s) and reused while the
//! requirements file is unchanged. Node: `tests/clients/package.json` with
//! its lock, `npm ci` into `target/clients-node` (about 3 s), the same way.
//! If either cannot be installed the test fails saying why: it never skips.
//!
//! Tests in one process share one install ([`python`] and [`node_modules`]
//! hold a lock while installing); cargo runs test binaries one at a time.
//!
//! [`CARGO_TARGET_TMPDIR`]: https://doc.rust-lang.org/cargo/reference/environment-variables.html#environment-variables-cargo-sets-for-crates

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Mutex;

fn source() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients")
}

fn target_dir() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .expect("target/tmp has a parent")
        .to_path_buf()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn must(command: &mut Command, what: &str) -> Output {
    let out = command.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed:\n{}\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    out
}

/// The venv's `python`, with every pinned client installed.
pub fn python() -> PathBuf {
    static INSTALL: Mutex<()> = Mutex::new(());
    let _once = INSTALL.lock().unwrap_or_else(|e| e.into_inner());
    let requirements =
        std::fs::read(source().join("requirements.txt")).expect("tests/clients/requirements.txt");
    let venv = Path::new(env!("CARGO_TARGET_TMPDIR")).join("clients-venv");
    let python = venv.join("bin").join("python");
    // The requirements the venv was made from, written once it was.
    let stamp = venv.join("requirements.txt");
    if python.exists() && std::fs::read(&stamp).ok().as_ref() == Some(&requirements) {
        return python;
    }
    let _ = std::fs::remove_dir_all(&venv);
    let started = std::time::Instant::now();
    must(
        Command::new(system_python("CADRE_CLIENTS_PYTHON"))
            .arg("-m")
            .arg("venv")
            .arg(&venv),
        "create the clients' venv",
    );
    must(
        Command::new(&python)
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "-r",
            ])
            .arg(source().join("requirements.txt")),
        "pip install -r tests/clients/requirements.txt (PyPI must be reachable)",
    );
    std::fs::write(&stamp, &requirements).unwrap();
    eprintln!("installed the Python clients in {:.0?}", started.elapsed());
    python
}

/// The machine's Python 3.10 or later: `$override_var` if set, else
/// `python3.11`, else `python3` (also what tests/contract.rs installs
/// schemathesis with).
pub fn system_python(override_var: &str) -> String {
    let candidates: Vec<String> = match std::env::var(override_var) {
        Ok(p) => vec![p],
        Err(_) => vec!["python3.11".into(), "python3".into()],
    };
    for candidate in &candidates {
        let recent = Command::new(candidate)
            .args(["-c", "import sys; sys.exit(sys.version_info < (3, 10))"])
            .output()
            .is_ok_and(|out| out.status.success());
        if recent {
            return candidate.clone();
        }
    }
    panic!("no Python 3.10 or later among {candidates:?}: these tests need one")
}

/// Runs `script` (Python source) with the clients' venv, `args` after it
/// and `env` set; its output, whatever its exit status.
pub async fn run_python(script: &str, args: &[&str], env: &[(&str, &str)]) -> Output {
    let python = tokio::task::spawn_blocking(python).await.unwrap();
    let mut command = tokio::process::Command::new(python);
    command.arg("-c").arg(script).args(args).kill_on_drop(true);
    for (k, v) in env {
        command.env(k, v);
    }
    command.output().await.expect("the venv's python runs")
}

/// [`run_python`], failing the test (with both outputs) unless it exits 0;
/// its standard output.
pub async fn python_ok(script: &str, args: &[&str], env: &[(&str, &str)]) -> String {
    let out = run_python(script, args, env).await;
    assert!(
        out.status.success(),
        "the Python client failed ({}):\nstdout:\n{}\nstderr:\n{}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// `node_modules` of `tests/clients/package.json`, installed with `npm ci`
/// into `target/clients-node/`; that directory (scripts run from it find
/// the packages).
pub fn node_modules() -> PathBuf {
    static INSTALL: Mutex<()> = Mutex::new(());
    let _once = INSTALL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = target_dir().join("clients-node");
    std::fs::create_dir_all(&dir).unwrap();
    let lock = std::fs::read(source().join("package-lock.json")).unwrap();
    let installed = dir.join("node_modules/.package-lock.json").exists()
        && std::fs::read(dir.join("package-lock.json")).ok().as_ref() == Some(&lock);
    if !installed {
        for file in ["package.json", "package-lock.json"] {
            std::fs::copy(source().join(file), dir.join(file)).unwrap();
        }
        must(
            Command::new("npm")
                .args(["ci", "--no-audit", "--no-fund", "--ignore-scripts"])
                .current_dir(&dir),
            "npm ci in target/clients-node (Node.js 20 and npm, and the npm registry)",
        );
    }
    dir
}

/// Runs `script` (an ES module) with Node from [`node_modules`]'s directory,
/// `args` after it and `env` set; fails the test unless it exits 0; its
/// standard output.
pub async fn node_ok(script: &str, args: &[&str], env: &[(&str, &str)]) -> String {
    let dir = tokio::task::spawn_blocking(node_modules).await.unwrap();
    let file = tempfile::Builder::new()
        .suffix(".mjs")
        .tempfile_in(&dir)
        .unwrap();
    std::fs::write(file.path(), script).unwrap();
    let mut command = tokio::process::Command::new("node");
    command
        .arg(file.path())
        .args(args)
        .current_dir(&dir)
        .kill_on_drop(true);
    for (k, v) in env {
        command.env(k, v);
    }
    let out = command.output().await.expect("node runs");
    assert!(
        out.status.success(),
        "the Node client failed ({}):\nstdout:\n{}\nstderr:\n{}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}
