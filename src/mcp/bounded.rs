//! The bound every MCP server connection runs under, whatever its transport.
//!
//! client supervisor ──▶ [`Bounded`]`<`stdio [`super::stdio::ChildTransport`] | rmcp streamable HTTP`>` ──▶ rmcp client service
//!
//! A server may send cadre requests of its own (`ping`, sampling, roots...),
//! and rmcp answers each. A server that sends them without reading the
//! answers made cadre hold every answer (issue #29: 1,000,000 `ping`s over
//! stdio took cadre from 147 to 943 MB, 200,000 over streamable HTTP from
//! 105 to 911 MB in 8 s, and the server stayed "available"). So:
//! - At most [`MAX_SERVER_REQUESTS`] of the server's requests may wait for
//!   their answers to be sent; one more ends the connection. The reason is
//!   kept ([`Bounded::why`]): the supervisor marks the server down with it
//!   (`GET /v1/tools`, the `mcp_server_down` event) and reconnects with
//!   backoff, as for any connection that ended.
//! - Every send has a deadline ([`SEND_DEADLINE`]): an answer (or a call)
//!   the server does not take fails instead of waiting forever.
//!
//! Closing is the inner transport's, within [`CLOSE_DEADLINE`]: a stdio
//! server's process group is killed (it does not wait on a blocked write),
//! an HTTP connection's worker is cancelled, which drops its requests in
//! flight; a worker stuck past the deadline ends when rmcp drops the
//! transport. And once a bound ended the connection nothing more is sent:
//! rmcp would otherwise send every queued answer, one deadline each,
//! before it closes.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::RoleClient;
use rmcp::model::JsonRpcMessage;
use rmcp::service::{RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;

/// The server's own requests that may wait for cadre's answers at once;
/// one more ends the connection.
pub const MAX_SERVER_REQUESTS: usize = 64;
/// The longest one message to the server may take to send.
pub const SEND_DEADLINE: Duration = Duration::from_secs(10);

/// The longest closing the inner transport may take before it is dropped.
pub const CLOSE_DEADLINE: Duration = Duration::from_secs(2);

/// Why a connection ended, when a bound ended it (read by the supervisor).
pub type Why = Arc<Mutex<Option<String>>>;

/// A transport to one MCP server under the bounds above.
pub struct Bounded<T> {
    inner: T,
    server: String,
    /// The server's requests received and not yet answered.
    waiting: Arc<AtomicUsize>,
    /// A bound ended the connection: nothing more is sent (rmcp would
    /// otherwise send every queued answer, one deadline each, before it
    /// closes).
    cut: Arc<AtomicBool>,
    why: Why,
}

impl<T> Bounded<T> {
    pub fn new(server: &str, inner: T) -> Self {
        Bounded {
            inner,
            server: server.to_string(),
            waiting: Arc::default(),
            cut: Arc::default(),
            why: Why::default(),
        }
    }

    /// Where the reason a bound ended the connection will be.
    pub fn why(&self) -> Why {
        self.why.clone()
    }
}

impl<T> Transport<RoleClient> for Bounded<T>
where
    T: Transport<RoleClient>,
{
    type Error = std::io::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleClient>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        let answers = matches!(item, JsonRpcMessage::Response(_) | JsonRpcMessage::Error(_));
        let waiting = self.waiting.clone();
        let cut = self.cut.load(Ordering::Acquire);
        let sent = (!cut).then(|| self.inner.send(item));
        async move {
            let Some(sent) = sent else {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::NotConnected,
                    "the connection was closed: the MCP server broke a bound",
                ));
            };
            let result = match tokio::time::timeout(SEND_DEADLINE, sent).await {
                Ok(r) => r.map_err(std::io::Error::other),
                Err(_) => Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("the MCP server did not take a message within {SEND_DEADLINE:?}"),
                )),
            };
            if answers {
                let _ = waiting.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                    Some(n.saturating_sub(1))
                });
            }
            result
        }
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleClient>> {
        let message = self.inner.receive().await?;
        if matches!(message, JsonRpcMessage::Request(_))
            && self.waiting.fetch_add(1, Ordering::AcqRel) >= MAX_SERVER_REQUESTS
        {
            let reason = format!(
                "it sent more than {MAX_SERVER_REQUESTS} requests whose answers it did not take; \
                 the connection was closed"
            );
            tracing::warn!(server = %self.server, max = MAX_SERVER_REQUESTS,
                "MCP server sent more requests than cadre may answer at once (it does not read the answers); closing the connection");
            *self.why.lock().expect("mcp why lock") = Some(reason);
            self.cut.store(true, Ordering::Release);
            return None;
        }
        Some(message)
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        match tokio::time::timeout(CLOSE_DEADLINE, self.inner.close()).await {
            Ok(closed) => closed.map_err(std::io::Error::other),
            // rmcp's HTTP worker can be stuck handing the handler a message
            // nobody receives any more; dropping the transport (what rmcp
            // does next) ends it.
            Err(_) => Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("the transport did not close within {CLOSE_DEADLINE:?}; dropped"),
            )),
        }
    }
}
