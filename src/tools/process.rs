//! Child processes cadre starts for tools: a tool file's command
//! ([`super::external`]) and an MCP server on stdio (`mcp::stdio`).
//!
//! **Environment** ([`clean_env`]): a child starts with an empty
//! environment, then gets [`BASE_ENV`] (`PATH`, `HOME`, `LANG`) from
//! cadre's, the variables its tool file names (`env: [NAME, ...]`, copied
//! from cadre's environment when set) and the values it sets (`env_set:
//! {K: V}`; an MCP server's `env` table in `mcp.toml`, where `K =
//! "${K}"` passes one of cadre's through). Nothing else of cadre's
//! reaches it: a reference MCP server's `get-env` tool returned
//! `CADRE_MODEL_API_KEY`, which then reached the model and the history.
//! Sandboxed, `PATH`, `HOME` and `TMPDIR` are the sandbox's own
//! ([`clean_env_with`]); the rest of the sandbox, filesystem, network and
//! resource limits, is [`super::sandbox`].
//!
//! Each runs as the leader of its own process group, so what it forks
//! goes with it: [`kill_group`] ends the whole group, and a
//! [`GroupGuard`] does it when the call that owns the process is dropped
//! (finished, timed out, or its task aborted). Decision: the group is
//! killed even after a command exited cleanly: a tool call does not leave
//! processes behind (one that wants a daemon must not be a tool file
//! command). Linux does not hand out a pid that is still some group's id,
//! so killing a group whose leader is gone cannot hit another program
//! while a member of the group lives.

/// The variables every child gets from cadre's environment, when set.
pub const BASE_ENV: [&str; 3] = ["PATH", "HOME", "LANG"];

/// Empties `command`'s environment, then gives it [`BASE_ENV`] and the
/// variables `pass` names (from cadre's environment, when set), then the
/// values of `set` (which win).
pub fn clean_env(
    command: &mut tokio::process::Command,
    pass: &[String],
    set: &std::collections::BTreeMap<String, String>,
) {
    clean_env_with(command, &[], pass, set);
}

/// [`clean_env`] where `base` gives some of [`BASE_ENV`] (and others)
/// their values instead of cadre's; `pass` and `set` still win.
pub fn clean_env_with(
    command: &mut tokio::process::Command,
    base: &[(&str, &std::ffi::OsStr)],
    pass: &[String],
    set: &std::collections::BTreeMap<String, String>,
) {
    command.env_clear();
    for name in BASE_ENV {
        if base.iter().any(|(n, _)| *n == name) {
            continue;
        }
        if let Some(value) = std::env::var_os(name) {
            command.env(name, value);
        }
    }
    for (name, value) in base {
        command.env(name, value);
    }
    for name in pass {
        if let Some(value) = std::env::var_os(name) {
            command.env(name, value);
        }
    }
    command.envs(set);
}

/// Whether `name` is a variable name a tool file may pass or set:
/// letters, digits and `_`, not starting with a digit, 1 to 128 bytes.
pub fn is_env_name(name: &str) -> bool {
    (1..=128).contains(&name.len())
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// SIGKILLs every process of group `pgid`; a group that is gone is no
/// error (ESRCH).
pub fn kill_group(pgid: i32) {
    if pgid <= 0 {
        return;
    }
    // SAFETY: killpg only sends a signal.
    unsafe {
        libc::killpg(pgid, libc::SIGKILL);
    }
}

/// Kills its process group when dropped, once.
pub struct GroupGuard {
    pgid: i32,
}

impl GroupGuard {
    /// Guards the group led by `pid` (a child spawned with
    /// `process_group(0)`); `None` (the child's id is unknown: it was
    /// already reaped) guards nothing.
    pub fn new(pid: Option<u32>) -> GroupGuard {
        GroupGuard {
            pgid: pid.and_then(|p| i32::try_from(p).ok()).unwrap_or(0),
        }
    }

    /// Kills the group now (a command past its output cap).
    pub fn kill(&mut self) {
        kill_group(std::mem::take(&mut self.pgid));
    }
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        self.kill();
    }
}
