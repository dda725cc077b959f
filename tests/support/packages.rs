//! The Debian packages a test needs, made present before it runs.
//!
//! `scripts/test` installs every package of the suite up front with
//! `scripts/test-packages`; a test run some other way (`cargo test --test
//! haproxy`) falls back to [`ensure_installed`], which runs the same script
//! for the one package it misses. The script holds a file lock, so tests
//! installing in parallel threads or processes wait for each other instead
//! of failing on apt's lock, and it waits for apt's own locks. Without root
//! nothing is installed and the test fails saying what to install: it is
//! never skipped.

use std::path::Path;
use std::process::Command;

/// Makes sure `command` is on the PATH, installing Debian's `package`
/// (through `scripts/test-packages`) when it is missing; panics saying what
/// to install when that is not possible.
pub fn ensure_installed(command: &str, package: &str) {
    let has = || {
        Command::new("sh")
            .args(["-c", &format!("command -v {command}")])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if has() {
        return;
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/test-packages");
    let out = Command::new(&script)
        .arg(package)
        .output()
        .unwrap_or_else(|e| panic!("{} runs: {e}", script.display()));
    assert!(
        has(),
        "these tests need `{command}`: install Debian's `{package}` package \
         (scripts/test-packages as root installs every package the tests need). \
         {} said: {}{}",
        script.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
