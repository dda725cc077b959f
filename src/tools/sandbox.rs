//! The sandbox every command tool call and every stdio MCP server runs in
//! (Linux), set up in the child between `fork` and `exec`.
//!
//! tool file / mcp.toml ──[`Sandbox::policy`] (once per tool or server)──▶ [`Policy`]
//!     call ──[`Policy::prepare`]──▶ [`Jail`] (scratch dir, Landlock ruleset)
//!          ──[`Jail::command`]──▶ child: [`enter`] in `pre_exec` ──exec──▶ the tool
//!     call ends (or the MCP server's transport is dropped) ──▶ scratch dir removed
//!
//! **How, and why this way.** Kernel interfaces only, through `libc` (already
//! in the tree), applied in the forked child before `exec`: no helper
//! binary, no extra package, so `cargo run --release -- serve` sandboxes
//! its shipped tool on a stock Linux (5.x user namespaces, Landlock ABI 6
//! from Linux 6.12). `bubblewrap` was the other choice: a Debian package
//! a newcomer would have to install, and one more `exec` per call. The
//! `landlock`/`seccompiler` crates were not taken either: the child may
//! not allocate between `fork` and `exec` (another thread may hold the
//! allocator's lock), so everything is built in the parent and the child
//! makes bare syscalls, which is what the four Landlock and one seccomp
//! calls here are. In order, the child:
//! 1. as root only: sets its *real* uid to [`NOBODY`] (65534), keeping
//!    effective uid 0 for file access. The kernel exempts real uid 0 from
//!    `RLIMIT_NPROC` whatever its capabilities, so without this the
//!    process limit would not bind under root (CI runs as root). Files stay
//!    reachable as before (tool folders under a 0700 temp dir included);
//!    Landlock decides which.
//! 2. `unshare(CLONE_NEWUSER | CLONE_NEWIPC | CLONE_NEWNS)`: a user
//!    namespace of its own, so it holds no capability over anything of the
//!    host (root's included) and what `exec` gives is nothing; its own
//!    SysV IPC; its own mounts, where the scratch dir is bound on `/tmp`
//!    (what it must see under the host's `/tmp`, its tool folder or a
//!    declared path, is bound back in place first, read-only ones
//!    remounted read-only). Its processes are counted in that namespace,
//!    so `RLIMIT_NPROC`, set next, bounds this call's processes and
//!    threads, not every process of the uid. Under root the `exec` that
//!    follows is a "secure" one (real uid 65534, effective 0): the
//!    dynamic loader drops `LD_*` and `TMPDIR`, which is why `/tmp`
//!    itself is the scratch dir.
//!
//!    Then **every mount of its namespace is made read-only**
//!    (`mount_setattr(MOUNT_ATTR_RDONLY, AT_RECURSIVE)` on `/`), but for
//!    detached writable clones (`open_tree(OPEN_TREE_CLONE)`, taken just
//!    before) of the scratch dir and of each declared writable path
//!    outside `/tmp` ([`MAX_WRITABLE`] at most), which `move_mount` puts
//!    back in place. Landlock (step 4) does not cover `chmod`, `chown`,
//!    `utimes`, extended attributes, nor `truncate` on an fd opened
//!    before (nor any truncate below ABI 3): under root, whose files these
//!    mostly are, a tool could otherwise make a file it may only read
//!    world-writable or empty it; a read-only mount answers `EROFS` to
//!    all of them. The working directory, set before, is looked up again
//!    by name afterwards (else it would stay on the read-only mount under
//!    a writable clone); an MCP server's is `/tmp`. Device nodes
//!    (`/dev/null`) stay writable: a read-only mount does not cover them.
//!    These calls need Linux 5.12 (`mount_setattr`), below the 6.12 that
//!    Landlock ABI 6 needs, so they add no kernel requirement; the probe
//!    ([`support`]) runs them like every other step, and their failure
//!    refuses tools like any other missing piece: no weaker fallback,
//!    decided because a sandbox that silently loses a guarantee on some
//!    machines is worse than one that says it cannot start.
//! 3. rlimits from [`Limits`]: `RLIMIT_DATA` (memory), `RLIMIT_CPU`,
//!    `RLIMIT_NPROC`, `RLIMIT_NOFILE`, `RLIMIT_FSIZE`; `RLIMIT_CORE` 0.
//! 4. `PR_SET_NO_NEW_PRIVS`, then `landlock_restrict_self`: the filesystem
//!    view below; TCP bind and connect denied unless `network: true`
//!    (ABI 4); signals and abstract unix sockets scoped to the sandbox
//!    (ABI 6: it cannot kill cadre, which runs as the same uid); ptrace
//!    of anything outside it denied (every ABI; so `/proc/<cadre>/environ`
//!    and `mem` are closed).
//! 5. a seccomp filter: `socket()` of any family refused (`EACCES`) unless
//!    `network: true`, and then only `AF_INET`, `AF_INET6` and
//!    `AF_NETLINK` (never `AF_UNIX`: Landlock does not stop a `connect` to
//!    a socket file such as a Docker socket); `io_uring` refused (it makes
//!    sockets without `socket()`); a foreign syscall ABI (x32, i386) kills.
//!
//! **Network**: no network namespace. Measured here, `unshare -n` adds
//! about 2 ms per call against about 0.2 ms for the user namespace; the
//! seccomp rule and Landlock's TCP rule already leave a tool without
//! `network: true` no socket to send on. With `network: true` the host's
//! network is open: "only to the hosts it names" is not done (it needs a
//! proxy or a netns with routes per host).
//!
//! **Filesystem** (Landlock, allow-list): read and execute on the system
//! ([`SYSTEM_READ`]: `/usr`, `/bin`, `/sbin`, `/lib*`, `/etc`, `/opt`)
//! less the protected paths; `/proc` read (other processes' secrets in it
//! are behind the ptrace rule); `/dev/null`, `/dev/zero`, `/dev/full`
//! read-write, `/dev/random`, `/dev/urandom` read; the tool's own folder
//! read and execute; a scratch directory (made under cadre's temp dir,
//! seen as `/tmp`, also `$HOME` and `$TMPDIR`) read-write, one per call
//! (per server for MCP), removed when the call ends; the entry's `paths`
//! (read, or read-write with `write: true`; one that holds a protected
//! path, or a write inside one, is refused: [`Refused::Protected`]).
//! Nothing else: not `/tmp`, not `/home` or `/root`, not `/run`. The protected paths (cadre's data dir, agents dir, config
//! file, and [`SECRETS`] such as `/etc/shadow`) are cut out of the system
//! part: a system folder that holds one is opened child by child instead
//! ([`readable_roots`]). The tool's folder is the agents dir's `tools/`,
//! which every tool file shares: a tool sees the other tool files (not
//! the agent files, `mcp.toml` or the data dir). `PATH` is
//! [`SANDBOX_PATH`], not cadre's.
//!
//! **Refusal.** Whether the kernel can do all of this is probed once per
//! process ([`support`]: a forked child runs steps 1-5 and exits). When it
//! cannot, [`Sandbox::policy`] fails with [`Unavailable`] naming what is
//! missing and the tool (or MCP server) is refused, unless `[tools]
//! sandbox = "off"`, which runs them as before and is logged at WARN at
//! startup ([`Sandbox::warn_if_off`]).
//!
//! **Not protected**: the kernel itself (a kernel bug is a way out);
//! memory is bounded per process, not per call (`processes` ×
//! `memory_mb` at most); CPU time per process; what a tool does with
//! `network: true` (any host), with its declared `paths`, or with what it
//! reads in the system folders (`/etc` is readable, less [`SECRETS`]);
//! reading the other tool files of its folder; the wall clock (the
//! executor's timeout does that); disk use in the scratch dir beyond
//! `file_mb` per file. A process that leaves the sandbox's process group
//! still runs in the sandbox.

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use serde::{Deserialize, Serialize};

/// The uid a sandbox started by root counts its processes as.
pub const NOBODY: libc::uid_t = 65534;

/// The `PATH` inside the sandbox (a tool may pass cadre's with `env: [PATH]`).
pub const SANDBOX_PATH: &str = "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin";

/// System folders readable (and executable) inside the sandbox, those that exist.
pub const SYSTEM_READ: [&str; 10] = [
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt", "/nix",
];

/// System files never readable inside the sandbox, whatever [`SYSTEM_READ`] says.
pub const SECRETS: [&str; 9] = [
    "/etc/shadow",
    "/etc/shadow-",
    "/etc/gshadow",
    "/etc/gshadow-",
    "/etc/sudoers",
    "/etc/sudoers.d",
    "/etc/ssh",
    "/etc/ssl/private",
    "/etc/security/opasswd",
];

/// The lowest Landlock ABI the sandbox needs: 6 (Linux 6.12) scopes signals.
pub const MIN_LANDLOCK_ABI: u32 = 6;

/// `[tools] sandbox`: whether command tools and stdio MCP servers are sandboxed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    #[default]
    On,
    /// Run them unsandboxed (environment still cleaned), logged at WARN.
    Off,
}

/// What one sandboxed process may use; 0 is no limit. `[tools]
/// sandbox_limits` holds the defaults, a tool file's or server's
/// `sandbox_limits` overrides some keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// MiB of data memory (heap and other private writable mappings) per
    /// process (`RLIMIT_DATA`).
    pub memory_mb: u64,
    /// Seconds of CPU time per process (`RLIMIT_CPU`; SIGXCPU, then SIGKILL).
    /// An MCP server's count runs over its whole life.
    pub cpu_s: u64,
    /// Processes and threads in the sandbox at once (`RLIMIT_NPROC`).
    pub processes: u64,
    /// Open files per process (`RLIMIT_NOFILE`).
    pub open_files: u64,
    /// MiB of one file written (`RLIMIT_FSIZE`).
    pub file_mb: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            memory_mb: 1024,
            cpu_s: 60,
            processes: 64,
            open_files: 256,
            file_mb: 256,
        }
    }
}

/// Some keys of [`Limits`], for one tool or server.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LimitsOverride {
    pub memory_mb: Option<u64>,
    pub cpu_s: Option<u64>,
    pub processes: Option<u64>,
    pub open_files: Option<u64>,
    pub file_mb: Option<u64>,
}

impl LimitsOverride {
    pub fn is_empty(&self) -> bool {
        *self == LimitsOverride::default()
    }

    /// `self`'s keys where set, `base`'s elsewhere.
    pub fn over(&self, base: Limits) -> Limits {
        Limits {
            memory_mb: self.memory_mb.unwrap_or(base.memory_mb),
            cpu_s: self.cpu_s.unwrap_or(base.cpu_s),
            processes: self.processes.unwrap_or(base.processes),
            open_files: self.open_files.unwrap_or(base.open_files),
            file_mb: self.file_mb.unwrap_or(base.file_mb),
        }
    }
}

/// A path a tool file or server declares beside the sandbox's own view.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PathGrant {
    /// Absolute; a file or a folder (and what is under it).
    pub path: String,
    /// Read-write; read-only when false.
    #[serde(default)]
    pub write: bool,
}

/// Checks declared paths: absolute, and present.
pub fn check_grants(grants: &[PathGrant]) -> Result<(), String> {
    for g in grants {
        if !Path::new(&g.path).is_absolute() {
            return Err(format!("paths: `{}` is not an absolute path", g.path));
        }
    }
    Ok(())
}

/// The kernel cannot sandbox: what is missing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the sandbox cannot start here, missing {missing}; command tools and stdio MCP servers are refused (set [tools] sandbox = \"off\" to run them unsandboxed)"
)]
pub struct Unavailable {
    pub missing: String,
}

/// Why a tool or server gets no sandbox, and so does not run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error(transparent)]
    Unavailable(#[from] Unavailable),
    /// A declared path would open cadre's own files: one holding a
    /// protected path (read or write), or a write inside one (a tool that
    /// may write tool files may write itself a sandbox-free tool).
    #[error(
        "paths: `{path}` would open cadre's own files ({protected}) to the tool; declare a path outside them"
    )]
    Protected { path: String, protected: String },
    #[error("paths: {count} writable paths outside /tmp; at most 16")]
    TooManyWritable { count: usize },
}

/// The server-wide sandbox settings (`[tools] sandbox`, `sandbox_limits`)
/// and the paths no sandboxed process may see.
#[derive(Debug, Clone)]
pub struct Sandbox {
    pub mode: Mode,
    pub limits: Limits,
    /// Cadre's data dir, agents dir, config file: cut out of the view.
    pub protected: Vec<PathBuf>,
}

impl Default for Sandbox {
    fn default() -> Self {
        Sandbox {
            mode: Mode::On,
            limits: Limits::default(),
            protected: Vec::new(),
        }
    }
}

impl Sandbox {
    /// Sandboxing off: commands run with a clean environment only.
    pub fn off() -> Sandbox {
        Sandbox {
            mode: Mode::Off,
            ..Sandbox::default()
        }
    }

    /// Logs the startup line: WARN when off, the refusal when the kernel
    /// cannot, else what is used.
    pub fn warn_if_off(&self) {
        match (self.mode, support()) {
            (Mode::Off, _) => tracing::warn!(
                "[tools] sandbox = \"off\": command tools and stdio MCP servers run unsandboxed (cadre's user, its network and files)"
            ),
            (Mode::On, Err(e)) => {
                tracing::error!("command tools and stdio MCP servers will be refused: {e}")
            }
            (Mode::On, Ok(abi)) => tracing::info!(
                landlock_abi = abi,
                "command tools and stdio MCP servers run sandboxed"
            ),
        }
    }

    /// The policy of one tool or server whose own folder is `folder`;
    /// `None` when sandboxing is off. Fails when the kernel cannot sandbox.
    pub fn policy(
        &self,
        folders: &[PathBuf],
        grants: &[PathGrant],
        network: bool,
        limits: &LimitsOverride,
    ) -> Result<Option<Arc<Policy>>, Refused> {
        if self.mode == Mode::Off {
            return Ok(None);
        }
        let abi = support()?;
        let mut protected: Vec<PathBuf> = self
            .protected
            .iter()
            .map(|p| canonical(p))
            .chain(SECRETS.iter().map(|s| canonical(Path::new(s))))
            .collect();
        protected.sort();
        protected.dedup();
        for g in grants {
            let real = canonical(Path::new(&g.path));
            if let Some(p) = protected
                .iter()
                .find(|p| p.starts_with(&real) || (g.write && real.starts_with(p)))
            {
                return Err(Refused::Protected {
                    path: g.path.clone(),
                    protected: p.display().to_string(),
                });
            }
        }
        let mut rules = Vec::new();
        let mut roots = Vec::new();
        for root in SYSTEM_READ {
            readable_roots(Path::new(root), &protected, &mut roots);
        }
        roots.extend(folders.iter().cloned());
        for root in roots {
            rules.push((root, Access::Read));
        }
        rules.push(("/proc".into(), Access::Read));
        for dev in ["/dev/null", "/dev/zero", "/dev/full"] {
            rules.push((dev.into(), Access::Write));
        }
        for dev in ["/dev/random", "/dev/urandom"] {
            rules.push((dev.into(), Access::Read));
        }
        for g in grants {
            let access = if g.write { Access::Write } else { Access::Read };
            rules.push((PathBuf::from(&g.path), access));
        }
        // What lies under /tmp is hidden by the scratch dir mounted there:
        // the tool's folders and declared paths are bound back in place.
        let mut tmp_binds = Vec::new();
        for (path, access) in &rules {
            let real = canonical(path);
            if let Ok(rel) = real.strip_prefix("/tmp")
                && !rel.as_os_str().is_empty()
                && real.exists()
            {
                let source = CString::new(real.as_os_str().as_bytes()).expect("a path has no NUL");
                tmp_binds.push(TmpBind {
                    rel: rel.to_path_buf(),
                    remount: matches!(access, Access::Read).then(|| read_only_remount(&source)),
                    source,
                    is_dir: real.is_dir(),
                });
            }
        }
        let writable: Vec<CString> = grants
            .iter()
            .filter(|g| g.write)
            .map(|g| canonical(Path::new(&g.path)))
            .filter(|p| !p.starts_with("/tmp") && p.exists())
            .map(|p| CString::new(p.as_os_str().as_bytes()).expect("a path has no NUL"))
            .collect();
        if writable.len() > MAX_WRITABLE {
            return Err(Refused::TooManyWritable {
                count: writable.len(),
            });
        }
        // Kept as paths, opened by each call's `prepare` for the time of
        // its ruleset: an fd held per rule would keep a few hundred open
        // per tool (`/etc` is opened child by child), enough to starve a
        // server of files.
        let rules = rules
            .into_iter()
            .filter_map(|(path, access)| {
                let is_dir = std::fs::metadata(&path).ok()?.is_dir();
                Some(Rule {
                    path: CString::new(path.as_os_str().as_bytes()).ok()?,
                    access: access.rights(abi, is_dir),
                })
            })
            .collect();
        Ok(Some(Arc::new(Policy {
            rules,
            writable: writable.into(),
            tmp_binds,
            abi,
            network,
            limits: limits.over(self.limits),
            filter: filter(network),
        })))
    }
}

/// The canonical form of `p` when it exists, else `p`.
fn canonical(p: &Path) -> PathBuf {
    std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf())
}

/// Pushes `root` (canonical) when no protected path is in it, else its
/// children that are not protected, recursively. A child that is a
/// symlink is judged by where it points.
pub fn readable_roots(root: &Path, protected: &[PathBuf], out: &mut Vec<PathBuf>) {
    let Ok(real) = std::fs::canonicalize(root) else {
        return;
    };
    if protected.iter().any(|p| real.starts_with(p)) {
        return;
    }
    if !protected.iter().any(|p| p.starts_with(&real)) {
        out.push(real);
        return;
    }
    let Ok(entries) = std::fs::read_dir(&real) else {
        return;
    };
    for entry in entries.flatten() {
        readable_roots(&entry.path(), protected, out);
    }
}

fn open_path(path: &Path) -> Option<OwnedFd> {
    open_cpath(&CString::new(path.as_os_str().as_bytes()).ok()?)
}

fn open_cpath(c: &CString) -> Option<OwnedFd> {
    // SAFETY: a valid C string; the fd returned is owned below.
    let fd = unsafe { libc::open(c.as_ptr(), libc::O_PATH | libc::O_CLOEXEC) };
    // SAFETY: a fresh fd we own.
    (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd) })
}

#[derive(Debug, Clone, Copy)]
enum Access {
    Read,
    Write,
}

// Landlock's access rights (include/uapi/linux/landlock.h).
const FS_EXECUTE: u64 = 1 << 0;
const FS_WRITE_FILE: u64 = 1 << 1;
const FS_READ_FILE: u64 = 1 << 2;
const FS_READ_DIR: u64 = 1 << 3;
const FS_TRUNCATE: u64 = 1 << 14;
const FS_IOCTL_DEV: u64 = 1 << 15;
const NET_BIND_TCP: u64 = 1 << 0;
const NET_CONNECT_TCP: u64 = 1 << 1;
const SCOPE_ABSTRACT_UNIX_SOCKET: u64 = 1 << 0;
const SCOPE_SIGNAL: u64 = 1 << 1;
const CREATE_RULESET_VERSION: u32 = 1 << 0;
const RULE_PATH_BENEATH: libc::c_int = 1;

/// Every filesystem right the kernel's ABI knows.
fn fs_handled(abi: u32) -> u64 {
    let mut all = (1 << 13) - 1; // ABI 1: EXECUTE ... MAKE_SYM
    if abi >= 2 {
        all |= 1 << 13; // REFER
    }
    if abi >= 3 {
        all |= FS_TRUNCATE;
    }
    if abi >= 5 {
        all |= FS_IOCTL_DEV;
    }
    all
}

impl Access {
    fn rights(self, abi: u32, is_dir: bool) -> u64 {
        let file_rights = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV;
        let rights = match self {
            Access::Read => FS_EXECUTE | FS_READ_FILE | FS_READ_DIR,
            Access::Write => fs_handled(abi),
        };
        let rights = rights & fs_handled(abi);
        if is_dir { rights } else { rights & file_rights }
    }
}

#[repr(C)]
struct RulesetAttr {
    handled_access_fs: u64,
    handled_access_net: u64,
    scoped: u64,
}

#[repr(C, packed)]
struct PathBeneathAttr {
    allowed_access: u64,
    parent_fd: i32,
}

struct Rule {
    path: CString,
    access: u64,
}

/// A folder or path under /tmp that the sandbox must still see.
struct TmpBind {
    /// Its path below /tmp.
    rel: PathBuf,
    source: CString,
    is_dir: bool,
    /// The flags to remount it read-only with (the scratch dir's rights
    /// would reach it through the mount it sits in), or `None`.
    remount: Option<libc::c_ulong>,
}

/// `MS_REMOUNT | MS_BIND | MS_RDONLY` plus the flags `path`'s mount has
/// (a mount from the host's namespace has them locked: a remount that
/// dropped one would fail).
fn read_only_remount(path: &CString) -> libc::c_ulong {
    let mut flags = libc::MS_REMOUNT | libc::MS_BIND | libc::MS_RDONLY;
    // SAFETY: a valid C string and a zeroed out-struct.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(path.as_ptr(), &mut st) } == 0 {
        for (st_flag, ms_flag) in [
            (libc::ST_NOSUID, libc::MS_NOSUID),
            (libc::ST_NODEV, libc::MS_NODEV),
            (libc::ST_NOEXEC, libc::MS_NOEXEC),
            (libc::ST_NOATIME, libc::MS_NOATIME),
            (libc::ST_NODIRATIME, libc::MS_NODIRATIME),
            (libc::ST_RELATIME, libc::MS_RELATIME),
        ] {
            if st.f_flag & st_flag != 0 {
                flags |= ms_flag;
            }
        }
    }
    flags
}

/// What one tool's (or server's) processes may do, built once; each call
/// makes a [`Jail`] of it.
pub struct Policy {
    rules: Vec<Rule>,
    /// Declared writable paths outside /tmp.
    writable: Arc<[CString]>,
    /// Folders and paths under /tmp, bound back over the scratch dir.
    tmp_binds: Vec<TmpBind>,
    abi: u32,
    network: bool,
    limits: Limits,
    filter: Arc<[libc::sock_filter]>,
}

impl std::fmt::Debug for Policy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Policy")
            .field("rules", &self.rules.len())
            .field("network", &self.network)
            .field("limits", &self.limits)
            .finish()
    }
}

impl Policy {
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// A scratch dir and a Landlock ruleset for one call (or one server's life).
    pub fn prepare(self: &Arc<Self>) -> std::io::Result<Jail> {
        let scratch = Scratch::new()?;
        let ruleset = ruleset(self.abi, self.network)?;
        for rule in &self.rules {
            // Gone since the policy was built: nothing to allow.
            if let Some(fd) = open_cpath(&rule.path) {
                add_rule(&ruleset, fd.as_raw_fd(), rule.access)?;
            }
        }
        let fd = open_path(&scratch.0).ok_or_else(std::io::Error::last_os_error)?;
        add_rule(&ruleset, fd.as_raw_fd(), fs_handled(self.abi))?;
        // Mount points inside the scratch dir for what lies under /tmp.
        let mut binds = Vec::new();
        for bind in &self.tmp_binds {
            let target = scratch.0.join(&bind.rel);
            if bind.is_dir {
                std::fs::create_dir_all(&target)?;
            } else {
                if let Some(parent) = target.parent() {
                    std::fs::create_dir_all(parent)?;
                }
                std::fs::File::create(&target)?;
            }
            binds.push((
                bind.source.clone(),
                CString::new(target.as_os_str().as_bytes()).expect("a path has no NUL"),
                bind.remount,
            ));
        }
        Ok(Jail {
            scratch,
            ruleset,
            binds: binds.into(),
            policy: self.clone(),
        })
    }
}

fn ruleset(abi: u32, network: bool) -> std::io::Result<OwnedFd> {
    let attr = RulesetAttr {
        handled_access_fs: fs_handled(abi),
        handled_access_net: if network || abi < 4 {
            0
        } else {
            NET_BIND_TCP | NET_CONNECT_TCP
        },
        scoped: SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL,
    };
    // SAFETY: a valid attribute struct of the size given.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            &attr as *const RulesetAttr,
            std::mem::size_of::<RulesetAttr>(),
            0u32,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a fresh fd (O_CLOEXEC) we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

fn add_rule(ruleset: &OwnedFd, parent: RawFd, access: u64) -> std::io::Result<()> {
    let attr = PathBeneathAttr {
        allowed_access: access,
        parent_fd: parent,
    };
    // SAFETY: a valid attribute struct; both fds are open.
    let r = unsafe {
        libc::syscall(
            libc::SYS_landlock_add_rule,
            ruleset.as_raw_fd(),
            RULE_PATH_BENEATH,
            &attr as *const PathBeneathAttr,
            0u32,
        )
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// A private writable directory, removed (with what is in it) when dropped.
pub struct Scratch(PathBuf);

impl Scratch {
    fn new() -> std::io::Result<Scratch> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let base = std::env::temp_dir();
        loop {
            let n = NEXT.fetch_add(1, Ordering::Relaxed);
            let salt: u32 = rand::random();
            let dir = base.join(format!(
                "cadre-sandbox-{}-{n}-{salt:08x}",
                std::process::id()
            ));
            let mut builder = std::fs::DirBuilder::new();
            std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
            match builder.create(&dir) {
                Ok(()) => return Ok(Scratch(dir)),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e),
            }
        }
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let dir = std::mem::take(&mut self.0);
        let remove = move || {
            if let Err(e) = std::fs::remove_dir_all(&dir)
                && e.kind() != std::io::ErrorKind::NotFound
            {
                tracing::warn!(dir = %dir.display(), "cannot remove a sandbox's scratch dir: {e}");
            }
        };
        // A tool may leave many files: not on an async worker when avoidable.
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => drop(handle.spawn_blocking(remove)),
            Err(_) => remove(),
        }
    }
}

/// One call's (or one MCP server's) sandbox: its scratch dir lives as
/// long as this does.
pub struct Jail {
    scratch: Scratch,
    ruleset: OwnedFd,
    /// (source under /tmp, its mount point in the scratch dir, read-only remount flags).
    binds: Arc<[(CString, CString, Option<libc::c_ulong>)]>,
    policy: Arc<Policy>,
}

impl Jail {
    pub fn scratch(&self) -> &Path {
        self.scratch.path()
    }

    /// Gives `command` a clean environment (`PATH` [`SANDBOX_PATH`],
    /// `HOME` and `TMPDIR` the scratch dir, `LANG`, then `pass` from
    /// cadre's and `set`) and makes it enter the sandbox before `exec`.
    /// The ruleset must outlive the spawn: keep the jail until the child runs.
    pub fn command(
        &self,
        command: &mut tokio::process::Command,
        pass: &[String],
        set: &std::collections::BTreeMap<String, String>,
    ) {
        self.command_in(command, pass, set, false)
    }

    /// [`Self::command`], in /tmp (the scratch dir) as its working
    /// directory when `chdir_tmp` (an MCP server's), else where
    /// `command` says.
    pub fn command_in(
        &self,
        command: &mut tokio::process::Command,
        pass: &[String],
        set: &std::collections::BTreeMap<String, String>,
        chdir_tmp: bool,
    ) {
        super::process::clean_env_with(
            command,
            &[
                ("PATH", SANDBOX_PATH.as_ref()),
                ("HOME", "/tmp".as_ref()),
                ("TMPDIR", "/tmp".as_ref()),
            ],
            pass,
            set,
        );
        let setup = Setup {
            ruleset: self.ruleset.as_raw_fd(),
            scratch: CString::new(self.scratch.path().as_os_str().as_bytes())
                .expect("a temp dir path has no NUL"),
            binds: self.binds.clone(),
            writable: self.policy.writable.clone(),
            chdir_tmp,
            limits: self.policy.limits,
            root: is_root(),
            filter: self.policy.filter.clone(),
        };
        // SAFETY: `enter` makes bare syscalls only and allocates nothing
        // (its io::Error is the errno variant).
        unsafe {
            command.pre_exec(move || enter(&setup));
        }
    }
}

fn is_root() -> bool {
    // SAFETY: no arguments, cannot fail.
    unsafe { libc::geteuid() == 0 }
}

struct Setup {
    ruleset: RawFd,
    /// The scratch dir, bound on /tmp.
    scratch: CString,
    /// Declared writable paths outside /tmp: writable clones over the
    /// read-only tree.
    writable: Arc<[CString]>,
    /// The working directory is /tmp (an MCP server's), set after the mounts.
    chdir_tmp: bool,
    /// Bound into the scratch dir first: (source, target, read-only remount flags).
    binds: Arc<[(CString, CString, Option<libc::c_ulong>)]>,
    limits: Limits,
    root: bool,
    filter: Arc<[libc::sock_filter]>,
}

// The new mount API (Linux 5.2; mount_setattr 5.12), from <linux/mount.h>.
const OPEN_TREE_CLONE: libc::c_uint = 1;
const AT_RECURSIVE: libc::c_uint = 0x8000;
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x04;
const MOUNT_ATTR_RDONLY: u64 = 0x01;

#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// Most declared writable paths outside /tmp one tool may have (the child
/// holds their clones in a fixed array: it may not allocate).
pub const MAX_WRITABLE: usize = 16;

/// Which step of [`enter`] failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    Uid = 1,
    UserNamespace,
    Mount,
    ReadOnly,
    Limits,
    NoNewPrivs,
    Landlock,
    Seccomp,
}

impl Step {
    fn what(self) -> &'static str {
        match self {
            Step::Uid => "a change of real uid to 65534 (setresuid)",
            Step::UserNamespace => {
                "user namespaces (unshare(CLONE_NEWUSER) failed: see user.max_user_namespaces, kernel.unprivileged_userns_clone or AppArmor's apparmor_restrict_unprivileged_userns)"
            }
            Step::Mount => {
                "bind mounts in a mount namespace (open_tree and move_mount, Linux 5.2: the scratch dir on /tmp)"
            }
            Step::ReadOnly => "mount_setattr (Linux 5.12: every mount read-only)",
            Step::Limits => "resource limits (setrlimit)",
            Step::NoNewPrivs => "no_new_privs (prctl)",
            Step::Landlock => "Landlock (landlock_restrict_self)",
            Step::Seccomp => "seccomp filters (prctl(PR_SET_SECCOMP))",
        }
    }
}

/// In the child, between `fork` and `exec`: bare syscalls, no allocation.
fn enter(setup: &Setup) -> std::io::Result<()> {
    enter_steps(setup).map_err(|(_, e)| e)
}

fn enter_steps(setup: &Setup) -> Result<(), (Step, std::io::Error)> {
    let fail = |step: Step| (step, std::io::Error::last_os_error());
    // SAFETY (every block below): syscalls on plain values and on
    // pointers to live locals.
    if setup.root && unsafe { libc::setresuid(NOBODY, 0, 0) } != 0 {
        return Err(fail(Step::Uid));
    }
    if unsafe { libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWIPC | libc::CLONE_NEWNS) } != 0 {
        return Err(fail(Step::UserNamespace));
    }
    // The working directory (set before this runs) is held by its mount:
    // once the writable clones are moved over it, it is looked up again
    // by name, or it would stay on the read-only mount below them.
    let mut cwd = [0 as libc::c_char; libc::PATH_MAX as usize];
    let cwd_known = !unsafe { libc::getcwd(cwd.as_mut_ptr(), cwd.len()) }.is_null();
    // The scratch dir is its /tmp, with what it must see under the host's
    // /tmp bound back in place first. The namespace's mounts are slaves of
    // the host's (one made by a lesser user namespace): nothing propagates
    // back.
    for (source, target, remount) in setup.binds.iter() {
        let bind = |flags: libc::c_ulong, source: *const libc::c_char| unsafe {
            libc::mount(
                source,
                target.as_ptr(),
                std::ptr::null(),
                flags,
                std::ptr::null(),
            )
        };
        if bind(libc::MS_BIND | libc::MS_REC, source.as_ptr()) != 0
            || remount.is_some_and(|flags| bind(flags, std::ptr::null()) != 0)
        {
            return Err(fail(Step::Mount));
        }
    }
    // Then every mount read-only (chmod, utimes, xattrs and truncate are
    // not Landlock's: EROFS stops them), after detached writable clones
    // of the scratch dir and of the declared writable paths were taken,
    // which are then moved in place.
    let clone = |path: &CString| unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            libc::AT_FDCWD,
            path.as_ptr(),
            OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint | AT_RECURSIVE,
        ) as libc::c_int
    };
    let scratch = clone(&setup.scratch);
    if scratch < 0 {
        return Err(fail(Step::Mount));
    }
    let mut clones = [-1; MAX_WRITABLE];
    for (fd, path) in clones.iter_mut().zip(setup.writable.iter()) {
        *fd = clone(path);
        if *fd < 0 {
            return Err(fail(Step::Mount));
        }
    }
    let read_only = MountAttr {
        attr_set: MOUNT_ATTR_RDONLY,
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
    };
    if unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            libc::AT_FDCWD,
            c"/".as_ptr(),
            AT_RECURSIVE,
            &read_only as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    } != 0
    {
        return Err(fail(Step::ReadOnly));
    }
    let place = |fd: libc::c_int, target: &std::ffi::CStr| unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            fd,
            c"".as_ptr(),
            libc::AT_FDCWD,
            target.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH,
        )
    };
    if place(scratch, c"/tmp") != 0 {
        return Err(fail(Step::Mount));
    }
    for (fd, path) in clones.iter().zip(setup.writable.iter()) {
        if place(*fd, path) != 0 {
            return Err(fail(Step::Mount));
        }
    }
    if setup.chdir_tmp {
        if unsafe { libc::chdir(c"/tmp".as_ptr()) } != 0 {
            return Err(fail(Step::Mount));
        }
    } else if cwd_known {
        // Not found under its name (a folder under the host's /tmp that
        // is not bound back): it stays where it was, Landlock decides.
        unsafe { libc::chdir(cwd.as_ptr()) };
    }
    let l = setup.limits;
    let mb = 1024 * 1024;
    for (resource, value) in [
        (libc::RLIMIT_DATA, l.memory_mb.saturating_mul(mb)),
        (libc::RLIMIT_CPU, l.cpu_s),
        (libc::RLIMIT_NPROC, l.processes),
        (libc::RLIMIT_NOFILE, l.open_files),
        (libc::RLIMIT_FSIZE, l.file_mb.saturating_mul(mb)),
    ] {
        if value == 0 {
            continue;
        }
        let mut now = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        if unsafe { libc::getrlimit(resource, &mut now) } != 0 {
            return Err(fail(Step::Limits));
        }
        let soft = value.min(now.rlim_max);
        // CPU: SIGXCPU at the soft limit, SIGKILL a second later.
        let hard = if resource == libc::RLIMIT_CPU {
            value.saturating_add(1).min(now.rlim_max)
        } else {
            soft
        };
        let new = libc::rlimit {
            rlim_cur: soft,
            rlim_max: hard,
        };
        if unsafe { libc::setrlimit(resource, &new) } != 0 {
            return Err(fail(Step::Limits));
        }
    }
    let core = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    if unsafe { libc::setrlimit(libc::RLIMIT_CORE, &core) } != 0 {
        return Err(fail(Step::Limits));
    }
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(fail(Step::NoNewPrivs));
    }
    if unsafe { libc::syscall(libc::SYS_landlock_restrict_self, setup.ruleset, 0u32) } != 0 {
        return Err(fail(Step::Landlock));
    }
    let program = libc::sock_fprog {
        len: setup.filter.len() as u16,
        filter: setup.filter.as_ptr() as *mut libc::sock_filter,
    };
    if unsafe {
        libc::prctl(
            libc::PR_SET_SECCOMP,
            libc::SECCOMP_MODE_FILTER,
            &program as *const libc::sock_fprog,
        )
    } != 0
    {
        return Err(fail(Step::Seccomp));
    }
    Ok(())
}

/// The Landlock ABI when the kernel can run the whole sandbox, probed once
/// per process: a forked child runs every step of [`enter`] and exits
/// with the number of the one that failed.
pub fn support() -> Result<u32, Unavailable> {
    static SUPPORT: OnceLock<Result<u32, Unavailable>> = OnceLock::new();
    SUPPORT.get_or_init(probe).clone()
}

fn probe() -> Result<u32, Unavailable> {
    let missing = |m: String| Unavailable { missing: m };
    if !cfg!(any(target_arch = "x86_64", target_arch = "aarch64")) {
        return Err(missing(format!(
            "a seccomp filter for {} (x86_64 and aarch64 only)",
            std::env::consts::ARCH
        )));
    }
    // SAFETY: the version query takes no attribute.
    let abi = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<RulesetAttr>(),
            0usize,
            CREATE_RULESET_VERSION,
        )
    };
    if abi < 0 {
        let e = std::io::Error::last_os_error();
        return Err(missing(match e.raw_os_error() {
            Some(libc::EOPNOTSUPP) => {
                "Landlock (built in but not enabled: add `landlock` to the `lsm=` boot parameter)"
                    .into()
            }
            _ => format!("Landlock (this kernel does not have it: {e})"),
        }));
    }
    let abi = abi as u32;
    if abi < MIN_LANDLOCK_ABI {
        return Err(missing(format!(
            "Landlock ABI {MIN_LANDLOCK_ABI} (Linux 6.12; signal scoping, so a tool cannot kill cadre); this kernel has ABI {abi}"
        )));
    }
    let ruleset = ruleset(abi, false).map_err(|e| missing(format!("a Landlock ruleset ({e})")))?;
    let setup = Setup {
        ruleset: ruleset.as_raw_fd(),
        scratch: c"/tmp".into(),
        binds: Arc::new([]),
        writable: Arc::new([]),
        chdir_tmp: false,
        limits: Limits::default(),
        root: is_root(),
        filter: filter(false),
    };
    // SAFETY: the child makes bare syscalls only, then `_exit`s.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(missing(format!(
            "a probe process ({})",
            std::io::Error::last_os_error()
        )));
    }
    if pid == 0 {
        let code = match enter_steps(&setup) {
            Ok(()) => 0,
            Err((step, _)) => step as i32,
        };
        // SAFETY: leaves the forked child without running any destructor.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    // SAFETY: waits for the child forked above.
    let waited = unsafe { libc::waitpid(pid, &mut status, 0) };
    if waited != pid || !libc::WIFEXITED(status) {
        return Err(missing("a probe process that exits".into()));
    }
    let steps = [
        Step::Uid,
        Step::UserNamespace,
        Step::Mount,
        Step::ReadOnly,
        Step::Limits,
        Step::NoNewPrivs,
        Step::Landlock,
        Step::Seccomp,
    ];
    match libc::WEXITSTATUS(status) {
        0 => Ok(abi),
        n => Err(missing(
            steps
                .iter()
                .find(|s| **s as i32 == n)
                .map(|s| s.what().to_string())
                .unwrap_or_else(|| format!("a sandbox step (probe exit {n})")),
        )),
    }
}

// The seccomp filter (classic BPF over `struct seccomp_data`).
#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: u32 = 0xC000_003E;
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: u32 = 0xC000_00B7;
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
const AUDIT_ARCH: u32 = 0;

const BPF_LD_W_ABS: u16 = 0x20; // BPF_LD | BPF_W | BPF_ABS
const BPF_JEQ_K: u16 = 0x15; // BPF_JMP | BPF_JEQ | BPF_K
const BPF_JGE_K: u16 = 0x35; // BPF_JMP | BPF_JGE | BPF_K
const BPF_RET_K: u16 = 0x06; // BPF_RET | BPF_K
const OFFSET_NR: u32 = 0;
const OFFSET_ARCH: u32 = 4;
const OFFSET_ARG0: u32 = 16; // args[0], its low 32 bits (little-endian)

fn stmt(code: u16, k: u32) -> libc::sock_filter {
    libc::sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    }
}

fn jump(code: u16, k: u32, jt: u8, jf: u8) -> libc::sock_filter {
    libc::sock_filter { code, jt, jf, k }
}

/// The filter: a foreign ABI kills; `io_uring_*` fail with ENOSYS;
/// `socket()` fails with EACCES, unless `network` and the family is
/// `AF_INET`, `AF_INET6` or `AF_NETLINK`; the rest is allowed.
pub fn filter(network: bool) -> Arc<[libc::sock_filter]> {
    let errno = |e: i32| libc::SECCOMP_RET_ERRNO | (e as u32 & libc::SECCOMP_RET_DATA);
    let allow = libc::SECCOMP_RET_ALLOW;
    let mut f = vec![
        stmt(BPF_LD_W_ABS, OFFSET_ARCH),
        jump(BPF_JEQ_K, AUDIT_ARCH, 1, 0),
        stmt(BPF_RET_K, libc::SECCOMP_RET_KILL_PROCESS),
        stmt(BPF_LD_W_ABS, OFFSET_NR),
    ];
    if cfg!(target_arch = "x86_64") {
        // x32 syscalls: the same numbers with bit 30 set.
        f.push(jump(BPF_JGE_K, 0x4000_0000, 0, 1));
        f.push(stmt(BPF_RET_K, libc::SECCOMP_RET_KILL_PROCESS));
    }
    for nr in [
        libc::SYS_io_uring_setup,
        libc::SYS_io_uring_enter,
        libc::SYS_io_uring_register,
    ] {
        f.push(jump(BPF_JEQ_K, nr as u32, 0, 1));
        f.push(stmt(BPF_RET_K, errno(libc::ENOSYS)));
    }
    f.push(jump(BPF_JEQ_K, libc::SYS_socket as u32, 1, 0));
    f.push(stmt(BPF_RET_K, allow));
    // socket(): its family.
    if network {
        f.push(stmt(BPF_LD_W_ABS, OFFSET_ARG0));
        for family in [libc::AF_INET, libc::AF_INET6, libc::AF_NETLINK] {
            f.push(jump(BPF_JEQ_K, family as u32, 0, 1));
            f.push(stmt(BPF_RET_K, allow));
        }
    }
    f.push(stmt(BPF_RET_K, errno(libc::EACCES)));
    f.into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_protected_folder_inside_a_system_root_is_cut_out() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        for d in ["a/secret", "a/open", "b"] {
            std::fs::create_dir_all(r.join(d)).unwrap();
        }
        std::fs::write(r.join("a/file"), "x").unwrap();
        let protected = vec![canonical(&r.join("a/secret"))];
        let mut out = Vec::new();
        readable_roots(r, &protected, &mut out);
        out.sort();
        let real = canonical(r);
        assert_eq!(
            out,
            vec![real.join("a/file"), real.join("a/open"), real.join("b")]
        );
        // A root that is itself protected, or inside one, gives nothing.
        let mut out = Vec::new();
        readable_roots(&r.join("a/secret"), &protected, &mut out);
        assert!(out.is_empty());
    }

    #[test]
    fn a_symlink_into_a_protected_folder_is_not_opened() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        std::fs::create_dir_all(r.join("data")).unwrap();
        std::fs::create_dir_all(r.join("sys")).unwrap();
        std::os::unix::fs::symlink(r.join("data"), r.join("sys/link")).unwrap();
        let protected = vec![canonical(&r.join("data"))];
        let mut out = Vec::new();
        readable_roots(&r.join("sys"), &protected, &mut out);
        // `sys` holds no protected path by name, but its link resolves into one.
        assert!(!out.iter().any(|p| p.starts_with(&protected[0])), "{out:?}");
    }

    #[test]
    fn overrides_replace_only_their_keys_and_zero_is_no_limit() {
        let o = LimitsOverride {
            memory_mb: Some(0),
            processes: Some(8),
            ..Default::default()
        };
        let l = o.over(Limits::default());
        assert_eq!(l.memory_mb, 0);
        assert_eq!(l.processes, 8);
        assert_eq!(l.cpu_s, Limits::default().cpu_s);
    }

    #[test]
    fn sandboxing_off_builds_no_policy() {
        let p = Sandbox::off()
            .policy(&[], &[], false, &LimitsOverride::default())
            .unwrap();
        assert!(p.is_none());
    }

    /// Runs `script` with `sh -c` in a sandbox of `policy`; (exit code, stdout).
    async fn run(policy: &Arc<Policy>, script: &str) -> (i32, String, Jail) {
        run_in(policy, script, None).await
    }

    /// [`run`], in `cwd` when given.
    async fn run_in(policy: &Arc<Policy>, script: &str, cwd: Option<&Path>) -> (i32, String, Jail) {
        let jail = policy.prepare().unwrap();
        let mut command = tokio::process::Command::new("sh");
        command.args(["-c", script]);
        if let Some(cwd) = cwd {
            command.current_dir(cwd);
        }
        jail.command(&mut command, &[], &Default::default());
        let out = command.output().await.unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        (
            out.status.code().unwrap_or(-1),
            format!("{stdout}{stderr}"),
            jail,
        )
    }

    #[tokio::test]
    async fn a_sandboxed_shell_sees_its_scratch_and_the_system_only() {
        let secret = tempfile::tempdir().unwrap();
        std::fs::write(secret.path().join("key"), "s3cret").unwrap();
        let sandbox = Sandbox {
            protected: vec![secret.path().to_path_buf()],
            ..Sandbox::default()
        };
        let policy = sandbox
            .policy(&[], &[], false, &LimitsOverride::default())
            .unwrap()
            .unwrap();
        let key = secret.path().join("key");
        let script = format!(
            "echo home=$HOME; echo hi > $HOME/f && echo wrote; cat {key:?} || echo noread; \
             echo x > {dir:?}/new || echo nowrite; ls /usr/bin >/dev/null && echo sys; \
             cat /etc/shadow >/dev/null 2>&1 || echo noshadow",
            key = key,
            dir = secret.path()
        );
        let (code, out, jail) = run(&policy, &script).await;
        let scratch = jail.scratch();
        assert_eq!(code, 0, "{out}");
        assert!(out.contains("home=/tmp"), "{out}");
        assert!(scratch.join("f").exists(), "its /tmp is the scratch dir");
        for word in ["wrote", "noread", "nowrite", "sys", "noshadow"] {
            assert!(out.contains(word), "{word} missing: {out}");
        }
        assert!(!out.contains("s3cret"), "{out}");
        assert!(!secret.path().join("new").exists());
    }

    /// Folders `ro` (holding `file` with `content`) and `rw` under
    /// `parent`, and a policy that grants the first read, the second write.
    fn ro_and_rw(parent: &Path, file: &str, content: &str) -> (PathBuf, PathBuf, Arc<Policy>) {
        let (ro, rw) = (parent.join("ro"), parent.join("rw"));
        std::fs::create_dir_all(&ro).unwrap();
        std::fs::create_dir_all(&rw).unwrap();
        std::fs::write(ro.join(file), content).unwrap();
        let grants = [
            PathGrant {
                path: ro.display().to_string(),
                write: false,
            },
            PathGrant {
                path: rw.display().to_string(),
                write: true,
            },
        ];
        let policy = Sandbox::default()
            .policy(&[], &grants, false, &LimitsOverride::default())
            .unwrap()
            .unwrap();
        (ro, rw, policy)
    }

    /// Paths under the host's /tmp (hidden by the scratch dir mounted
    /// there) are bound back: a read grant read-only, a write grant writable.
    #[tokio::test]
    async fn declared_paths_under_tmp_are_seen_with_their_access() {
        let dir = tempfile::tempdir_in("/tmp").unwrap();
        let (ro, rw, policy) = ro_and_rw(dir.path(), "in", "given");
        let script = format!(
            "cat {ro:?}/in; echo x > {ro:?}/out || echo ro-refused; echo y > {rw:?}/out && echo rw-written",
        );
        let (code, out, _jail) = run(&policy, &script).await;
        assert_eq!(code, 0, "{out}");
        for word in ["given", "ro-refused", "rw-written"] {
            assert!(out.contains(word), "{word} missing: {out}");
        }
        assert!(!ro.join("out").exists());
        assert_eq!(std::fs::read_to_string(rw.join("out")).unwrap(), "y\n");
    }

    #[test]
    fn a_declared_path_over_cadres_own_files_is_refused() {
        let root = tempfile::tempdir().unwrap();
        let agents = root.path().join("agents");
        std::fs::create_dir_all(agents.join("tools")).unwrap();
        let sandbox = Sandbox {
            protected: vec![agents.clone()],
            ..Sandbox::default()
        };
        let grant = |path: &Path, write: bool| {
            [PathGrant {
                path: path.display().to_string(),
                write,
            }]
        };
        let none = LimitsOverride::default();
        // Its parent, read or write; inside it, written.
        for (path, write) in [
            (root.path(), false),
            (agents.as_path(), false),
            (&agents.join("tools"), true),
        ] {
            let err = sandbox
                .policy(&[], &grant(path, write), false, &none)
                .unwrap_err();
            assert!(matches!(err, Refused::Protected { .. }), "{err}");
        }
        // Read inside it is the operator's choice (agents/data).
        assert!(
            sandbox
                .policy(&[], &grant(&agents.join("tools"), false), false, &none)
                .is_ok()
        );
    }

    /// chmod, utimes and truncate are not Landlock's: every mount is
    /// read-only but the scratch dir and the declared writable paths.
    #[tokio::test]
    async fn what_it_may_only_read_it_cannot_chmod_touch_or_truncate() {
        // Outside /tmp, so the read-only tree (not a bind) is what is
        // tested; /var/tmp, so any user can run it.
        let dir = tempfile::tempdir_in("/var/tmp").unwrap();
        let (ro, rw, policy) = ro_and_rw(dir.path(), "f", "keep");
        let f = ro.join("f");
        let script = format!(
            "chmod 777 {f:?} || echo no-chmod; touch -d 2001-01-01 {f:?} || echo no-touch; \
             truncate -s 0 {f:?} || echo no-truncate; echo y > {rw:?}/out && echo rw-written; \
             echo z > /tmp/z && echo tmp-written",
        );
        let (code, out, _jail) = run(&policy, &script).await;
        assert_eq!(code, 0, "{out}");
        for word in [
            "no-chmod",
            "no-touch",
            "no-truncate",
            "rw-written",
            "tmp-written",
        ] {
            assert!(out.contains(word), "{word} missing: {out}");
        }
        let meta = std::fs::metadata(&f).unwrap();
        assert_eq!(std::fs::read_to_string(&f).unwrap(), "keep");
        assert_ne!(
            std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o777,
            0o777
        );
        assert_eq!(std::fs::read_to_string(rw.join("out")).unwrap(), "y\n");
        // Run in a writable path, it writes there by a relative name (its
        // working directory is the writable clone, not the mount below).
        let (code, out, _jail) =
            run_in(&policy, "echo r > rel && echo rel-written", Some(&rw)).await;
        assert_eq!(code, 0, "{out}");
        assert_eq!(std::fs::read_to_string(rw.join("rel")).unwrap(), "r\n");
    }

    #[test]
    fn relative_paths_are_refused() {
        let bad = [PathGrant {
            path: "data/x".into(),
            write: true,
        }];
        assert!(check_grants(&bad).unwrap_err().contains("data/x"));
    }
}
