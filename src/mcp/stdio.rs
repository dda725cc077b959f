//! The stdio transport of an MCP server that cadre runs as a child process.
//!
//! client supervisor ──spawn──▶ [`ChildTransport`] ──rmcp `Transport`──▶ rmcp client service
//!     child stdout ──bounded lines──▶ messages (or an error answer of our own) ──▶ rmcp
//!     rmcp ──JSON lines──▶ child stdin
//!
//! rmcp's own `TokioChildProcess` is not used, for three things it does not do:
//! - **Bounded lines that answer.** rmcp drops a line over its 16 MiB cap and
//!   ignores one it cannot parse (a schema nested deeper than serde_json's
//!   recursion limit), so the request it answered waits forever (or for the
//!   call's timeout). Here a dropped line whose JSON-RPC `id` can be read (a
//!   scan that keeps no nesting and so has no depth limit: the head of the
//!   line, then its tail) becomes an error answer to that request,
//!   [`RESULT_TOO_LARGE`] or [`UNREADABLE`], which the client turns into a
//!   clear error. An oversized line without a readable id ends the
//!   connection: every call waiting on it fails at once as unavailable and
//!   the server is restarted.
//! - **The process, not the pipe, is the server.** The child is the leader
//!   of its own process group. When it exits, the group is killed (a forked
//!   child that kept stdout open would otherwise keep the connection "up"
//!   while nothing answers), what is left on stdout is read for at most
//!   [`EXIT_GRACE`], and the connection ends.
//! - **No orphans.** Closing or dropping the transport kills the whole group
//!   (SIGKILL after stdin is closed and [`CLOSE_GRACE`] passed) and reaps the
//!   child; [`Groups`] holds every live group so the runtime's shutdown kills
//!   them synchronously even if no task runs again. A process that leaves the
//!   group (`setsid`, `setpgid`) escapes this; and a cadre killed with
//!   SIGKILL kills nothing.
//! - **A blocked write never blocks the supervisor.** The bounds on the
//!   server's own requests and on every send are the transport-independent
//!   [`super::bounded`] wrapper's (a write to a server that stopped reading
//!   fails at its deadline, which releases the stdin lock); `close` kills
//!   the process group when it cannot take that lock within
//!   [`CLOSE_GRACE`].

use std::collections::BTreeSet;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::RoleClient;
use rmcp::service::{RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

/// The error code of our own answer to a request whose answer was over the line cap.
pub const RESULT_TOO_LARGE: i32 = -32_090;
/// The error code of our own answer to a request whose answer could not be parsed.
pub const UNREADABLE: i32 = -32_091;

/// How long stdout is still read after the server process exited.
pub const EXIT_GRACE: Duration = Duration::from_millis(500);
/// How long a closed server gets to exit on its own before its group is killed.
pub const CLOSE_GRACE: Duration = Duration::from_millis(500);

/// Bytes of an oversized line's head and tail kept to find its `id`.
const KEEP: usize = 64 * 1024;

/// The process groups of the running stdio servers.
#[derive(Clone, Default)]
pub struct Groups(Arc<Mutex<BTreeSet<i32>>>);

impl Groups {
    fn add(&self, pgid: i32) {
        self.0.lock().expect("mcp groups").insert(pgid);
    }

    fn remove(&self, pgid: i32) {
        self.0.lock().expect("mcp groups").remove(&pgid);
    }

    /// SIGKILLs every group still running.
    pub fn kill_all(&self) {
        for pgid in std::mem::take(&mut *self.0.lock().expect("mcp groups")) {
            kill_group(pgid);
        }
    }
}

use crate::tools::process::kill_group;

/// One running server process and the two ends of its stdio.
pub struct ChildTransport {
    server: String,
    child: Child,
    pgid: i32,
    groups: Groups,
    stdin: Arc<tokio::sync::Mutex<Option<ChildStdin>>>,
    lines: Lines,
    /// Set once the process exited: the end of [`EXIT_GRACE`].
    exited: Option<tokio::time::Instant>,
    closed: bool,
    /// The group was killed (at most once).
    killed: bool,
    /// The server's sandbox (its scratch dir), while the server runs.
    _jail: Option<crate::tools::sandbox::Jail>,
}

impl ChildTransport {
    /// Starts `command` as the leader of a new process group.
    pub fn spawn(
        server: &str,
        mut command: Command,
        max_line: usize,
        groups: &Groups,
        jail: Option<crate::tools::sandbox::Jail>,
    ) -> std::io::Result<ChildTransport> {
        command
            .process_group(0)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        let mut child = command.spawn()?;
        let pid = child.id().expect("a child that was just spawned has a pid") as i32;
        groups.add(pid);
        let stdin = child.stdin.take().expect("piped stdin");
        let stdout = child.stdout.take().expect("piped stdout");
        Ok(ChildTransport {
            server: server.to_string(),
            child,
            pgid: pid,
            groups: groups.clone(),
            stdin: Arc::new(tokio::sync::Mutex::new(Some(stdin))),
            lines: Lines::new(stdout, max_line),
            exited: None,
            closed: false,
            killed: false,
            _jail: jail,
        })
    }

    /// The server's process id (also its process group id).
    pub fn pid(&self) -> i32 {
        self.pgid
    }

    /// Kills the group once: after the leader is reaped its pid (and group
    /// id) may belong to another process group, which a second kill would
    /// hit.
    fn kill(&mut self) {
        if std::mem::replace(&mut self.killed, true) {
            return;
        }
        kill_group(self.pgid);
        self.groups.remove(self.pgid);
    }
}

impl Drop for ChildTransport {
    fn drop(&mut self) {
        self.kill();
        // `kill_on_drop` and tokio's orphan reaping collect the leader.
    }
}

impl Transport<RoleClient> for ChildTransport {
    type Error = std::io::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleClient>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        let stdin = self.stdin.clone();
        async move {
            let mut line = serde_json::to_vec(&item).map_err(std::io::Error::other)?;
            line.push(b'\n');
            let mut stdin = stdin.lock().await;
            let pipe = stdin.as_mut().ok_or_else(|| {
                std::io::Error::new(std::io::ErrorKind::NotConnected, "transport closed")
            })?;
            pipe.write_all(&line).await?;
            pipe.flush().await
        }
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleClient>> {
        loop {
            if self.closed {
                return None;
            }
            let read = match self.exited {
                None => {
                    let exit = tokio::select! {
                        read = self.lines.next() => Ok(read),
                        status = self.child.wait() => Err(status),
                    };
                    match exit {
                        Ok(read) => read,
                        Err(status) => {
                            tracing::warn!(server = %self.server, "MCP server process exited ({})",
                                status.map(|s| s.to_string()).unwrap_or_else(|e| e.to_string()));
                            // Whatever it forked goes with it, so stdout reaches its end.
                            self.kill();
                            self.exited = Some(tokio::time::Instant::now() + EXIT_GRACE);
                            continue;
                        }
                    }
                }
                Some(deadline) => {
                    match tokio::time::timeout_at(deadline, self.lines.next()).await {
                        Ok(read) => read,
                        Err(_) => return None,
                    }
                }
            };
            match read {
                Read::Line(line) => {
                    if let Some(message) = self.message(&line) {
                        return Some(message);
                    }
                }
                Read::Oversized { head, tail, len } => {
                    let Some(id) = response_id(&head).or_else(|| trailing_id(&tail)) else {
                        tracing::warn!(server = %self.server, bytes = len,
                            "MCP server sent a message over max_message_mb whose id cannot be read; closing the connection");
                        return None;
                    };
                    tracing::warn!(server = %self.server, bytes = len,
                        "MCP server's answer is over max_message_mb; answered as too large");
                    return Some(error_answer(
                        id,
                        RESULT_TOO_LARGE,
                        format!(
                            "result too large: the MCP server's answer is over {} bytes (max_message_mb)",
                            self.lines.max
                        ),
                    ));
                }
                Read::End => return None,
            }
        }
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        self.closed = true;
        // EOF on stdin asks the server to leave; then the group goes. A
        // write blocked on a server that stopped reading holds the lock:
        // then the group goes first (which fails that write).
        let stdin = self.stdin.clone();
        let released = match tokio::time::timeout(CLOSE_GRACE, stdin.lock()).await {
            Ok(mut stdin) => {
                drop(stdin.take());
                true
            }
            Err(_) => false,
        };
        if !released {
            self.kill();
        }
        let _ = tokio::time::timeout(CLOSE_GRACE, self.child.wait()).await;
        self.kill();
        let _ = self.child.wait().await;
        Ok(())
    }
}

impl ChildTransport {
    /// The message of one line; `None` for a line to skip (blank, not JSON,
    /// or not a message and not an answer).
    fn message(&self, line: &[u8]) -> Option<RxJsonRpcMessage<RoleClient>> {
        let line = line.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(line);
        if line.iter().all(u8::is_ascii_whitespace) {
            return None;
        }
        match serde_json::from_slice(line) {
            Ok(message) => Some(message),
            Err(e) => match response_id(line) {
                Some(id) => {
                    tracing::warn!(server = %self.server, "MCP server's answer cannot be read: {e}");
                    Some(error_answer(
                        id,
                        UNREADABLE,
                        format!("the MCP server's answer cannot be read: {e}"),
                    ))
                }
                None => {
                    tracing::debug!(server = %self.server, "MCP server sent a line that is not a message: {e}");
                    None
                }
            },
        }
    }
}

fn error_answer(id: Value, code: i32, message: String) -> RxJsonRpcMessage<RoleClient> {
    serde_json::from_value(json!({
        "jsonrpc": "2.0",
        "id": id,
        "error": {"code": code, "message": message},
    }))
    .expect("a JSON-RPC error answer parses")
}

enum Read {
    Line(Vec<u8>),
    /// A line over the cap: dropped but for its first and last [`KEEP`] bytes.
    Oversized {
        head: Vec<u8>,
        tail: Vec<u8>,
        len: usize,
    },
    End,
}

/// Newline-delimited reading that never holds more than `max` bytes of a
/// line. Cancel-safe: a read dropped in the middle leaves its bytes in
/// `buf` (or its discarding state) for the next call.
struct Lines {
    reader: BufReader<ChildStdout>,
    max: usize,
    buf: Vec<u8>,
    /// Set while the rest of an oversized line is skipped.
    over: Option<(Vec<u8>, Vec<u8>, usize)>,
}

impl Lines {
    fn new(stdout: ChildStdout, max: usize) -> Lines {
        Lines {
            reader: BufReader::new(stdout),
            max,
            buf: Vec::new(),
            over: None,
        }
    }

    async fn next(&mut self) -> Read {
        loop {
            let available = match self.reader.fill_buf().await {
                Ok([]) | Err(_) => return Read::End,
                Ok(bytes) => bytes,
            };
            let newline = available.iter().position(|b| *b == b'\n');
            let take = newline.map_or(available.len(), |i| i + 1);
            let chunk = &available[..take];
            if let Some((_, tail, len)) = self.over.as_mut() {
                *len += chunk.len();
                tail.extend_from_slice(chunk);
                if tail.len() > KEEP {
                    tail.drain(..tail.len() - KEEP);
                }
            } else if self.buf.len() + chunk.len() > self.max {
                let mut head = std::mem::take(&mut self.buf);
                head.extend_from_slice(chunk);
                let len = head.len();
                let tail = head[head.len().saturating_sub(KEEP)..].to_vec();
                head.truncate(KEEP);
                self.over = Some((head, tail, len));
            } else {
                self.buf.extend_from_slice(chunk);
            }
            self.reader.consume(take);
            if newline.is_some() {
                return match self.over.take() {
                    Some((head, tail, len)) => Read::Oversized { head, tail, len },
                    None => Read::Line(std::mem::take(&mut self.buf)),
                };
            }
        }
    }
}

/// The `id` of a JSON-RPC answer (an object with a top-level `id` and no
/// `method`), read from the start of its text without parsing it: the scan
/// keeps only the nesting depth, so any depth and any truncation are fine.
fn response_id(text: &[u8]) -> Option<Value> {
    let mut depth = 0usize;
    let mut i = 0;
    let mut id = None;
    while i < text.len() {
        match text[i] {
            b'{' | b'[' => depth += 1,
            b'}' | b']' => depth = depth.saturating_sub(1),
            b'"' => {
                // A string cut by the truncation ends the scan.
                let Some(end) = string_end(text, i) else {
                    break;
                };
                if depth == 1 {
                    let mut j = end + 1;
                    while j < text.len() && text[j].is_ascii_whitespace() {
                        j += 1;
                    }
                    if text.get(j) == Some(&b':') {
                        match &text[i + 1..end] {
                            b"method" => return None,
                            b"id" if id.is_none() => id = scalar_at(text, j + 1),
                            _ => {}
                        }
                    }
                }
                i = end;
            }
            _ => {}
        }
        i += 1;
    }
    id
}

/// The index of the quote closing the string that opens at `start`.
fn string_end(text: &[u8], start: usize) -> Option<usize> {
    let mut i = start + 1;
    while i < text.len() {
        match text[i] {
            b'\\' => i += 2,
            b'"' => return Some(i),
            _ => i += 1,
        }
    }
    None
}

/// A number or string value starting at `from` (after whitespace).
fn scalar_at(text: &[u8], from: usize) -> Option<Value> {
    let rest = &text[from..];
    let start = rest.iter().position(|b| !b.is_ascii_whitespace())?;
    let rest = &rest[start..];
    let len = if rest.first() == Some(&b'"') {
        string_end(rest, 0)? + 1
    } else {
        rest.iter()
            .position(|b| !(b.is_ascii_digit() || *b == b'-'))
            .unwrap_or(rest.len())
    };
    serde_json::from_slice(&rest[..len])
        .ok()
        .filter(|v: &Value| v.is_number() || v.is_string())
}

/// The `id` of an answer whose text ends with `"id": <scalar>}` (servers
/// that write the id after the result).
fn trailing_id(tail: &[u8]) -> Option<Value> {
    // The kept tail may start inside a UTF-8 character: skip to the first
    // boundary (at most 3 bytes) rather than give up on the whole tail.
    let start = (0..tail.len().min(4))
        .find(|&i| std::str::from_utf8(&tail[i..]).is_ok())
        .unwrap_or(tail.len());
    let text = std::str::from_utf8(&tail[start..]).ok()?.trim_end();
    let text = text.strip_suffix('}')?.trim_end();
    let (before, value) = if let Some(inner) = text.strip_suffix('"') {
        let open = inner.rfind('"')?;
        (&text[..open], &text[open..])
    } else {
        let start = text.trim_end_matches(|c: char| c.is_ascii_digit() || c == '-');
        (start, &text[start.len()..])
    };
    let before = before.trim_end().strip_suffix(':')?.trim_end();
    let before = before.strip_suffix("\"id\"")?.trim_end();
    if !(before.ends_with(',') || before.ends_with('{')) {
        return None;
    }
    serde_json::from_str(value)
        .ok()
        .filter(|v: &Value| v.is_number() || v.is_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tail_cut_inside_a_character_still_yields_its_id() {
        let answer = r#"{"jsonrpc":"2.0","result":{"text":"ééé"},"id":9}"#.as_bytes();
        let inside = answer.iter().position(|&b| b == 0xc3).unwrap() + 1;
        assert_eq!(trailing_id(&answer[inside..]), Some(json!(9)));
    }

    #[test]
    fn the_id_of_an_answer_is_read_at_any_depth_and_from_either_end() {
        let deep = format!(
            "{{\"jsonrpc\":\"2.0\",\"id\":7,\"result\":{}1{}}}",
            "[".repeat(500),
            "]".repeat(500)
        );
        assert_eq!(response_id(deep.as_bytes()), Some(json!(7)));
        // Truncated in the middle of the result, or of a string: still found.
        assert_eq!(response_id(&deep.as_bytes()[..40]), Some(json!(7)));
        assert_eq!(
            response_id(br#"{"jsonrpc": "2.0", "id": 2, "result": {"text": "xxxx"#),
            Some(json!(2))
        );
        // A nested "id" is not the answer's.
        assert_eq!(
            response_id(br#"{"result":{"id":3},"id":"a\"b"}"#),
            Some(json!("a\"b"))
        );
        // A request is not an answer.
        assert_eq!(response_id(br#"{"id":1,"method":"ping"}"#), None);
        assert_eq!(trailing_id(br#"...xxxx"]},"id": 12 }"#), Some(json!(12)));
        assert_eq!(trailing_id(br#"...","id":"k"}"#), Some(json!("k")));
        assert_eq!(trailing_id(br#"..."x":{"id":1}}"#), None);
    }
}
