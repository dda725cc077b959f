//! External tool entries: a command or an HTTP endpoint outside cadre.
//!
//! executor ──params (JSON)──▶ ExternalHandler ──stdin──▶ command ──stdout (JSON)──▶ output
//!                                            └─POST──▶ GuardedClient ──▶ url ──JSON body──▶ output
//!
//! Commands run sandboxed ([`super::sandbox`]: a scratch dir per call,
//! dropped with the call) with a clean environment (`PATH`, `HOME`, `LANG`, and
//! what the tool file names: `env` by name, `env_set` by value;
//! [`super::process`]), without a shell (argv as written), in their tool file's
//! folder (so `["python3", "count.py"]` finds the script beside the file
//! wherever the server was started; a program written as a relative path,
//! `./count.sh`, is taken from that folder too, since the standard library
//! leaves which folder it resolves against unspecified), with the
//! parameters as JSON on stdin; stdout must be one JSON value. Output beyond the cap is a
//! failure, a non-zero exit is a failure carrying the first lines of stderr,
//! and the child is killed when the call is dropped (the executor's timeout
//! aborts the task). Each runs in its own process group
//! ([`super::process`]): stdin, stdout and stderr are served at once (a
//! command writing stderr first, or not reading its input, cannot stall),
//! a command past its output cap is killed at once, and when the command
//! exits (or the call is dropped) what it forked is killed with it, within
//! 200 ms if it still holds a pipe. Endpoints get the parameters as a JSON POST; 5xx and
//! transport errors are retryable.
//!
//! The operator writes the URL, but not what answers it: an upstream may
//! redirect anywhere, and the POST body would follow a 307. So endpoints go
//! through `http_request`'s [`GuardedClient`] (no loopback, private or
//! metadata address, after DNS and on every hop, unless allowlisted: the
//! server's `[tools] http_allowlist` plus the entry's own `allowlist`), and
//! redirects stay on the URL's origin unless the entry says
//! `redirects: any` (`none`: a 3xx is a failure). Both paths read at most
//! the output cap (plus one chunk) before failing, never the whole body.
//!
//! The call's idempotency key (`ctx.idempotency_key`, the same on every
//! attempt and after a resume) reaches both, when the call has one: a
//! command finds it in its input object as `idempotency_key` (the loader
//! refuses a command tool declaring a parameter of that name, so it never
//! hides one of the model's), an endpoint in the `Idempotency-Key` header.
//! A call without a key sends neither, so the input is the parameters
//! exactly as before.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;

use reqwest::Method;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use url::Url;

use super::builtin::http::{IDEMPOTENCY_KEY, read_capped};
use super::builtin::net_guard::{self, GuardedClient};
use super::definition::Redirects;
use super::process::GroupGuard;
use super::sandbox::Policy;
use super::{ExecutionContext, ToolError, ToolHandler};

pub const DEFAULT_MAX_OUTPUT: usize = 1 << 20;
/// Where a command finds the call's idempotency key in its input.
pub const IDEMPOTENCY_KEY_FIELD: &str = "idempotency_key";

/// What a command reads on stdin: the parameters, plus the call's
/// idempotency key when it has one.
fn command_input(params: &Value, ctx: &ExecutionContext) -> Vec<u8> {
    match (params, ctx.idempotency_key.as_deref()) {
        (Value::Object(fields), Some(key)) => {
            let mut fields = fields.clone();
            fields.insert(IDEMPOTENCY_KEY_FIELD.into(), Value::String(key.into()));
            serde_json::to_vec(&fields)
        }
        _ => serde_json::to_vec(params),
    }
    .expect("JSON values serialize")
}

enum Target {
    Command {
        argv: Vec<String>,
        /// The working directory: the tool file's folder.
        dir: PathBuf,
        /// Variables of cadre's passed by name (`env`).
        pass: Vec<String>,
        /// Variables set (`env_set`).
        set: std::collections::BTreeMap<String, String>,
        /// The sandbox each call runs in; `None`: `[tools] sandbox = "off"`.
        sandbox: Option<Arc<Policy>>,
    },
    Http {
        url: Url,
        client: GuardedClient,
        /// `redirects: none`: the client hands 3xx back; they fail here.
        refuse_3xx: bool,
    },
}

pub struct ExternalHandler {
    target: Target,
    max_output: usize,
}

impl ExternalHandler {
    /// A command entry: `argv` run without a shell, in `dir` (the tool
    /// file's folder).
    pub fn command(argv: Vec<String>, dir: PathBuf, max_output: usize) -> Self {
        ExternalHandler {
            target: Target::Command {
                argv,
                dir,
                pass: Vec::new(),
                set: Default::default(),
                sandbox: None,
            },
            max_output,
        }
    }

    /// A command entry's environment beyond `PATH`, `HOME` and `LANG`:
    /// the variables of cadre's it names and the values it sets
    /// ([`super::process::clean_env`]). No effect on an HTTP entry.
    pub fn with_env(
        mut self,
        names: Vec<String>,
        values: std::collections::BTreeMap<String, String>,
    ) -> Self {
        if let Target::Command { pass, set, .. } = &mut self.target {
            *pass = names;
            *set = values;
        }
        self
    }

    /// Runs each call of a command entry in `policy`'s sandbox
    /// ([`super::sandbox`]); `None` runs it unsandboxed. No effect on an
    /// HTTP entry.
    pub fn sandboxed(mut self, policy: Option<Arc<Policy>>) -> Self {
        if let Target::Command { sandbox, .. } = &mut self.target {
            *sandbox = policy;
        }
        self
    }

    /// An HTTP entry: `url` may reach private addresses only when listed
    /// in `allowlist`; `redirects` says which hops are followed.
    pub fn http(
        url: Url,
        allowlist: &[String],
        redirects: Redirects,
        max_output: usize,
    ) -> Result<Self, reqwest::Error> {
        let mode = match redirects {
            Redirects::SameOrigin => net_guard::Redirects::SameOrigin,
            Redirects::Any => net_guard::Redirects::Checked,
            Redirects::None => net_guard::Redirects::Manual,
        };
        Ok(ExternalHandler {
            target: Target::Http {
                url,
                client: GuardedClient::new(allowlist, mode)?,
                refuse_3xx: redirects == Redirects::None,
            },
            max_output,
        })
    }

    async fn run_command(
        &self,
        argv: &[String],
        dir: &Path,
        (pass, set): (&[String], &std::collections::BTreeMap<String, String>),
        sandbox: Option<&Arc<Policy>>,
        input: Vec<u8>,
    ) -> Result<Value, ToolError> {
        let (program, args) = argv
            .split_first()
            .ok_or_else(|| ToolError::failed("external command is empty"))?;
        // A bare name is looked up on PATH; a relative path is the folder's.
        let path = Path::new(program);
        let executable = if path.is_relative() && path.components().count() > 1 {
            dir.join(path)
        } else {
            path.to_path_buf()
        };
        let mut command = tokio::process::Command::new(executable);
        // Held to the end of the call: its scratch dir goes with it.
        let jail = match sandbox {
            Some(policy) => {
                let jail = policy.prepare().map_err(|e| {
                    ToolError::failed(format!("cannot prepare the sandbox of '{program}': {e}"))
                })?;
                jail.command(&mut command, pass, set);
                Some(jail)
            }
            None => {
                super::process::clean_env(&mut command, pass, set);
                None
            }
        };
        command
            .args(args)
            .current_dir(dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        // Its own process group: what it forks is killed with it when the
        // call ends or is dropped (timeout), not left running.
        #[cfg(unix)]
        command.process_group(0);
        let mut child = command
            .spawn()
            .map_err(|e| ToolError::failed(format!("cannot start '{program}': {e}")))?;
        let group = std::sync::Mutex::new(GroupGuard::new(child.id()));
        let stdin = child.stdin.take();
        let out = child.stdout.take().expect("piped stdout");
        let err = child.stderr.take().expect("piped stderr");
        let max = self.max_output;
        // All three pipes at once: a command that writes stderr first, or
        // never reads its input, cannot hold the call until its timeout.
        let write = async move {
            if let Some(mut stdin) = stdin {
                // A command that exits without reading its input is not an error here.
                let _ = stdin.write_all(&input).await;
            }
        };
        let read_out = async {
            let mut stdout = Vec::new();
            let read = out.take(max as u64 + 1).read_to_end(&mut stdout).await;
            if stdout.len() > max {
                // Past the cap: stop it now rather than wait for it to
                // finish writing into a pipe nobody reads.
                group.lock().expect("group guard").kill();
            }
            (stdout, read)
        };
        let read_err = async move {
            // The first 4 KiB are kept for the error; the rest is read
            // and dropped so the command never blocks on a full pipe.
            let mut kept = Vec::new();
            let mut err = err;
            let mut chunk = [0u8; 8192];
            while let Ok(n) = err.read(&mut chunk).await {
                if n == 0 {
                    break;
                }
                let room = 4096usize.saturating_sub(kept.len());
                kept.extend_from_slice(&chunk[..n.min(room)]);
            }
            kept
        };
        // The command's own exit ends the call: a child it forked that
        // still holds a pipe gets a short grace, then the group is killed
        // (its pipes close and the reads end).
        let io_done = tokio::sync::Notify::new();
        let io = async {
            let io = tokio::join!(write, read_out, read_err);
            io_done.notify_one();
            io
        };
        let exited = async {
            let status = child.wait().await;
            tokio::select! {
                _ = io_done.notified() => {}
                _ = tokio::time::sleep(std::time::Duration::from_millis(200)) => {
                    group.lock().expect("group guard").kill();
                }
            }
            status
        };
        let (((), (stdout, read), stderr), status) = tokio::join!(io, exited);
        let status = status
            .map_err(|e| ToolError::failed(format!("'{program}' could not be awaited: {e}")))?;
        drop(group);
        drop(jail);
        if stdout.len() > self.max_output {
            return Err(ToolError::failed(format!(
                "'{program}' printed more than {} bytes",
                self.max_output
            )));
        }
        read.map_err(|e| ToolError::failed(format!("reading the output of '{program}': {e}")))?;
        if !status.success() {
            let err = String::from_utf8_lossy(&stderr);
            let first: String = err.lines().take(5).collect::<Vec<_>>().join(" | ");
            return Err(ToolError::failed(format!(
                "'{program}' exited with {status}: {first}"
            )));
        }
        serde_json::from_slice(&stdout).map_err(|e| {
            let head: String = String::from_utf8_lossy(&stdout).chars().take(120).collect();
            ToolError::failed(format!(
                "'{program}' did not print JSON ({e}); output starts with {head:?}"
            ))
        })
    }

    async fn post(
        &self,
        url: &Url,
        client: &GuardedClient,
        refuse_3xx: bool,
        params: &Value,
        ctx: &ExecutionContext,
    ) -> Result<Value, ToolError> {
        let refused = |r: &net_guard::Refused| {
            tracing::warn!(%url, refused = %r, "tool file HTTP entry refused");
            ToolError::failed(r.to_string())
        };
        let mut request = client
            .request(Method::POST, url.clone())
            .map_err(|r| refused(&r))?;
        // The workflow depth guard, as `http_request` sends it: a run this
        // request starts is the calling run's child.
        if let Some(run) = ctx.workflow_id.as_deref() {
            request = request.header(crate::identity::PARENT_RUN_HEADER, run);
        }
        if let Some(key) = ctx.idempotency_key.as_deref() {
            request = request.header(IDEMPOTENCY_KEY, key);
        }
        let response =
            request
                .json(params)
                .send()
                .await
                .map_err(|e| match net_guard::refusal(&e) {
                    Some(r) => refused(r),
                    None => ToolError::Transient {
                        message: format!("cannot reach {url}: {e}"),
                    },
                })?;
        let status = response.status();
        if refuse_3xx && status.is_redirection() {
            return Err(ToolError::failed(format!(
                "{url} answered HTTP {status}; this entry follows no redirects (redirects: none)"
            )));
        }
        let (body, cut) =
            read_capped(response, self.max_output)
                .await
                .map_err(|e| ToolError::Transient {
                    message: format!("reading the reply of {url}: {e}"),
                })?;
        if cut {
            return Err(ToolError::failed(format!(
                "{url} answered more than {} bytes",
                self.max_output
            )));
        }
        if status.is_server_error() {
            return Err(ToolError::Transient {
                message: format!("{url} answered HTTP {status}"),
            });
        }
        if !status.is_success() {
            return Err(ToolError::failed(format!(
                "{url} answered HTTP {status}: {}",
                String::from_utf8_lossy(&body)
                    .chars()
                    .take(200)
                    .collect::<String>()
            )));
        }
        serde_json::from_slice(&body)
            .map_err(|e| ToolError::failed(format!("{url} did not answer JSON: {e}")))
    }
}

#[async_trait::async_trait]
impl ToolHandler for ExternalHandler {
    async fn call(&self, params: Value, ctx: &ExecutionContext) -> Result<Value, ToolError> {
        match &self.target {
            Target::Command {
                argv,
                dir,
                pass,
                set,
                sandbox,
            } => {
                self.run_command(
                    argv,
                    dir,
                    (pass, set),
                    sandbox.as_ref(),
                    command_input(&params, ctx),
                )
                .await
            }
            Target::Http {
                url,
                client,
                refuse_3xx,
            } => self.post(url, client, *refuse_3xx, &params, ctx).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::CallerType;
    use serde_json::json;

    fn ctx() -> ExecutionContext {
        ExecutionContext::new(CallerType::Direct, "test")
    }

    fn sh(script: &str) -> ExternalHandler {
        let argv = vec!["sh".into(), "-c".into(), script.into()];
        ExternalHandler::command(argv, std::env::temp_dir(), 64)
    }

    #[tokio::test]
    async fn a_command_gets_params_on_stdin_and_answers_json() {
        let h = sh("cat");
        let out = h.call(json!({"a": 1}), &ctx()).await.unwrap();
        assert_eq!(out, json!({"a": 1}));
    }

    #[tokio::test]
    async fn a_command_gets_the_calls_idempotency_key_in_its_input() {
        let mut ctx = ctx();
        ctx.idempotency_key = Some("s1:t1:call_1".into());
        let out = sh("cat").call(json!({"a": 1}), &ctx).await.unwrap();
        assert_eq!(out, json!({"a": 1, "idempotency_key": "s1:t1:call_1"}));
    }

    #[tokio::test]
    async fn non_zero_exit_garbage_and_oversized_output_are_failures() {
        let err = sh("echo oops >&2; exit 3")
            .call(json!({}), &ctx())
            .await
            .unwrap_err();
        assert!(err.to_string().contains("oops"), "{err}");
        let err = sh("echo not json")
            .call(json!({}), &ctx())
            .await
            .unwrap_err();
        assert!(err.to_string().contains("did not print JSON"), "{err}");
        let err = sh("head -c 1000 /dev/zero | tr '\\0' 'a'")
            .call(json!({}), &ctx())
            .await
            .unwrap_err();
        assert!(err.to_string().contains("more than 64 bytes"), "{err}");
        let err = ExternalHandler::command(vec!["/no/such/program".into()], "/".into(), 64)
            .call(json!({}), &ctx())
            .await
            .unwrap_err();
        assert!(err.to_string().contains("cannot start"), "{err}");
    }

    /// The command runs in its tool file's folder, not the server's: a
    /// script named relative to it is found, as a program or an argument.
    #[tokio::test]
    async fn a_command_runs_in_its_tool_files_folder() {
        use std::os::unix::fs::PermissionsExt;
        let folder = tempfile::tempdir().unwrap();
        let script = folder.path().join("answer.sh");
        std::fs::write(
            &script,
            "#!/bin/sh\nprintf '{\"from\": \"%s\"}' \"$(pwd -P)\"\n",
        )
        .unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        let here = std::fs::canonicalize(folder.path()).unwrap();
        let expected = json!({"from": here.to_str().unwrap()});
        assert_ne!(std::env::current_dir().unwrap(), here);

        let as_program = ExternalHandler::command(
            vec!["./answer.sh".into()],
            folder.path().to_path_buf(),
            1024,
        );
        assert_eq!(as_program.call(json!({}), &ctx()).await.unwrap(), expected);
        let as_argument = ExternalHandler::command(
            vec!["sh".into(), "answer.sh".into()],
            folder.path().to_path_buf(),
            1024,
        );
        assert_eq!(as_argument.call(json!({}), &ctx()).await.unwrap(), expected);
    }
}
