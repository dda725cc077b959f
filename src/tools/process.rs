//! Child processes cadre starts for tools: a tool file's command
//! ([`super::external`]) and an MCP server on stdio (`mcp::stdio`).
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
