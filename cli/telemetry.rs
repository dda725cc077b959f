//! The process's tracing subscriber: log lines (text or JSON) on stderr,
//! filtered by `RUST_LOG` (or the command's default), and, in a build with
//! the `otlp` feature and `CADRE_OTLP_ENDPOINT` set, every span exported
//! over OTLP.
//!
//! spans (turn > gen_ai.chat, turn > tool_batch > tool_call > execute_tool)
//!   ──▶ EnvFilter ──▶ fmt layer (stderr)
//!                 └─▶ tracing-opentelemetry layer ──▶ batch processor (own thread) ──OTLP/HTTP──▶ collector
//!
//! Decisions:
//! - OTLP over HTTP with protobuf bodies (`POST {endpoint}/v1/traces`, the
//!   collector's port 4318), not gRPC: it reuses the reqwest 0.13 cadre
//!   already has instead of pulling in tonic, and any collector accepts it.
//!   `CADRE_OTLP_ENDPOINT` is the collector's base URL, as
//!   `OTEL_EXPORTER_OTLP_ENDPOINT` would be; `/v1/traces` is appended
//!   unless it is there already. The standard `OTEL_SERVICE_NAME`,
//!   `OTEL_RESOURCE_ATTRIBUTES` and `OTEL_BSP_*` variables apply.
//! - The crates are the OpenTelemetry project's own (`opentelemetry`,
//!   `opentelemetry_sdk`, `opentelemetry-otlp` 0.33.1) and the tokio
//!   project's bridge `tracing-opentelemetry` 0.34.0, the release built on
//!   opentelemetry 0.33. They sit behind the `otlp` feature (off by
//!   default), so the default build and CI compile none of them. None has a
//!   build script that fetches anything.
//! - The batch processor runs on its own thread with the blocking reqwest
//!   client, so exporting never needs (or blocks) cadre's tokio runtime.
//!   [`Telemetry`]'s drop flushes what is left when the command ends.
//! - Exported span names follow the GenAI conventions through `otel.name`
//!   (`invoke_agent {agent}`, `chat {model}`, `execute_tool {tool}`); the
//!   model call is a `client` span (`otel.kind`).
//! - A bad endpoint fails the command at start; without the feature a set
//!   `CADRE_OTLP_ENDPOINT` is reported once as ignored.
//! - What a peer can make cadre log is bounded (issue #29: an MCP server
//!   sending request after request made rmcp log one WARN line each, with
//!   the request's id: 20,000 requests, 63 MB of log). rmcp's own lines
//!   ([`RateLimited`]) pass a burst of [`RMCP_BURST`], then
//!   [`RMCP_PER_SECOND`] a second; the rest are dropped (cadre's own lines
//!   about its MCP servers are not limited: they say what cadre did). And
//!   every line is cut at [`MAX_LINE_BYTES`] ([`CappedStderr`]): a text
//!   line keeps its head and says how long it was; a JSON line is replaced
//!   by a valid JSON line holding the head (`fields.head`).

use std::io::Write;
use std::sync::Mutex;
use std::time::Instant;

use tracing::subscriber::Interest;
use tracing::{Event, Metadata};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::Layer;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::{Context, Filter, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;

/// rmcp's log lines that pass at once, before the rate applies.
pub const RMCP_BURST: f64 = 50.0;
/// rmcp's log lines that pass per second after the burst.
pub const RMCP_PER_SECOND: f64 = 10.0;
/// The longest log line written, in bytes (its newline aside).
pub const MAX_LINE_BYTES: usize = 8 * 1024;

/// Passes rmcp's events through a token bucket; everything else passes.
pub struct RateLimited {
    /// (tokens, last refill).
    bucket: Mutex<(f64, Instant)>,
}

impl Default for RateLimited {
    fn default() -> Self {
        RateLimited {
            bucket: Mutex::new((RMCP_BURST, Instant::now())),
        }
    }
}

fn is_rmcp(meta: &Metadata<'_>) -> bool {
    meta.target() == "rmcp" || meta.target().starts_with("rmcp::")
}

impl<S> Filter<S> for RateLimited {
    fn enabled(&self, _meta: &Metadata<'_>, _cx: &Context<'_, S>) -> bool {
        true
    }

    fn callsite_enabled(&self, meta: &'static Metadata<'static>) -> Interest {
        if meta.is_event() && is_rmcp(meta) {
            Interest::sometimes()
        } else {
            Interest::always()
        }
    }

    fn event_enabled(&self, event: &Event<'_>, _cx: &Context<'_, S>) -> bool {
        if !is_rmcp(event.metadata()) {
            return true;
        }
        let mut bucket = self.bucket.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        let refill = now.duration_since(bucket.1).as_secs_f64() * RMCP_PER_SECOND;
        *bucket = ((bucket.0 + refill).min(RMCP_BURST), now);
        if bucket.0 >= 1.0 {
            bucket.0 -= 1.0;
            true
        } else {
            false
        }
    }
}

/// stderr, one line per event, cut at [`MAX_LINE_BYTES`].
pub struct CappedStderr {
    json: bool,
}

impl<'a> MakeWriter<'a> for CappedStderr {
    type Writer = CappedLine;

    fn make_writer(&'a self) -> CappedLine {
        CappedLine {
            json: self.json,
            head: Vec::new(),
            len: 0,
        }
    }
}

/// One event's line: its head is kept, written to stderr when dropped.
pub struct CappedLine {
    json: bool,
    head: Vec<u8>,
    /// Every byte written, kept or not.
    len: usize,
}

impl Write for CappedLine {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let room = (MAX_LINE_BYTES + 1).saturating_sub(self.head.len());
        self.head.extend_from_slice(&buf[..buf.len().min(room)]);
        self.len += buf.len();
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for CappedLine {
    fn drop(&mut self) {
        if self.len == 0 {
            return;
        }
        let line = capped(std::mem::take(&mut self.head), self.len, self.json);
        // A line that cannot be written (stderr on a full disk) is dropped.
        let _ = std::io::stderr().lock().write_all(&line);
    }
}

/// The line to write for an event of `len` bytes whose first bytes are
/// `head` (at most [`MAX_LINE_BYTES`] + 1 kept).
fn capped(head: Vec<u8>, len: usize, json: bool) -> Vec<u8> {
    if len <= MAX_LINE_BYTES + 1 {
        head
    } else {
        let mut cut = MAX_LINE_BYTES;
        while cut > 0 && (head[cut] & 0b1100_0000) == 0b1000_0000 {
            cut -= 1;
        }
        let head = String::from_utf8_lossy(&head[..cut]);
        let mut out = if json {
            serde_json::to_vec(&serde_json::json!({
                "timestamp": jiff::Timestamp::now().to_string(),
                "level": "WARN",
                "target": "cadre::log",
                "fields": {
                    "message": format!("a log line of {len} bytes was cut to its first {cut}"),
                    "head": head,
                },
            }))
            .unwrap_or_default()
        } else {
            format!("{head} … (log line cut: {len} bytes)").into_bytes()
        };
        out.push(b'\n');
        out
    }
}

#[cfg(test)]
mod capped_tests {
    use super::*;

    /// What [`CappedLine`] writes for `line`.
    fn written(line: &[u8], json: bool) -> Vec<u8> {
        let mut w = CappedStderr { json }.make_writer();
        w.write_all(line).unwrap();
        let out = capped(std::mem::take(&mut w.head), w.len, json);
        w.len = 0;
        out
    }

    #[test]
    fn a_long_line_is_cut_at_a_char_boundary_and_says_so() {
        let short = b"short line\n";
        assert_eq!(written(short, false), short);
        let mut long = "é".repeat(MAX_LINE_BYTES).into_bytes();
        long.push(b'\n');
        let out = String::from_utf8(written(&long, false)).expect("UTF-8");
        assert!(out.len() <= MAX_LINE_BYTES + 64, "{}", out.len());
        assert!(out.ends_with(&format!("(log line cut: {} bytes)\n", long.len())));
        let out = written(&long, true);
        let v: serde_json::Value = serde_json::from_slice(&out).expect("a valid JSON line");
        assert!(v["fields"]["head"].as_str().unwrap().starts_with("éé"));
        assert!(out.ends_with(b"\n"));
    }
}

/// The environment variable that turns OTLP export on.
pub const ENDPOINT_VAR: &str = "CADRE_OTLP_ENDPOINT";

/// Flushes and stops the span exporter (if any) when dropped.
#[derive(Default)]
pub struct Telemetry {
    #[cfg(feature = "otlp")]
    provider: Option<opentelemetry_sdk::trace::SdkTracerProvider>,
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        #[cfg(feature = "otlp")]
        if let Some(provider) = self.provider.take()
            && let Err(e) = provider.shutdown()
        {
            eprintln!("warning: flushing spans to the OTLP endpoint failed: {e}");
        }
    }
}

/// Installs the global subscriber; keep the returned value alive until
/// the command ends.
pub fn init(json: bool, default_filter: &str) -> anyhow::Result<Telemetry> {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter));
    // rmcp logs each new MCP session's id at INFO; the id is what a client
    // presents to use the session, so it never reaches a log line.
    let filter = filter.add_directive(
        "rmcp::transport::streamable_http_server::session=warn"
            .parse()
            .expect("a valid directive"),
    );
    // rmcp logs each message an MCP peer sends at INFO: a server flooding
    // `tools/list_changed` would be a flood of log lines (cadre logs what it
    // does about them, once, in `mcp::client`).
    let filter = filter.add_directive("rmcp::service=warn".parse().expect("a valid directive"));
    // A log line that cannot be written (stderr on a full disk) is dropped:
    // the default reports it with `eprintln!`, which panics when stderr
    // fails, and would take down whichever thread was logging.
    // Colours only on a terminal: a log file or a pipe gets plain text.
    let logs = tracing_subscriber::fmt::layer()
        .with_writer(CappedStderr { json })
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .log_internal_errors(false);
    let logs = if json {
        logs.json()
            .with_current_span(true)
            .with_span_list(true)
            .with_filter(RateLimited::default())
            .boxed()
    } else {
        logs.with_filter(RateLimited::default()).boxed()
    };
    let endpoint = std::env::var(ENDPOINT_VAR)
        .ok()
        .filter(|e| !e.trim().is_empty());
    let subscriber = tracing_subscriber::registry().with(filter).with(logs);

    #[cfg(feature = "otlp")]
    {
        let mut telemetry = Telemetry::default();
        let otel = match endpoint {
            Some(endpoint) => {
                let (layer, provider) = otlp::layer(&endpoint)?;
                telemetry.provider = Some(provider);
                Some(layer)
            }
            None => None,
        };
        subscriber.with(otel).init();
        Ok(telemetry)
    }
    #[cfg(not(feature = "otlp"))]
    {
        subscriber.init();
        if endpoint.is_some() {
            tracing::warn!(
                "{ENDPOINT_VAR} is set but this cadre was built without the `otlp` feature: spans are not exported"
            );
        }
        Ok(Telemetry::default())
    }
}

/// `{base}/v1/traces`, unless `base` already names that path.
#[cfg_attr(not(feature = "otlp"), allow(dead_code))]
pub fn traces_url(base: &str) -> String {
    let base = base.trim().trim_end_matches('/');
    if base.ends_with("/v1/traces") {
        base.to_string()
    } else {
        format!("{base}/v1/traces")
    }
}

#[cfg(feature = "otlp")]
mod otlp {
    use anyhow::Context;
    use opentelemetry::trace::TracerProvider as _;
    use opentelemetry_otlp::{SpanExporter, WithExportConfig};
    use opentelemetry_sdk::Resource;
    use opentelemetry_sdk::trace::{SdkTracerProvider, Tracer};
    use tracing_opentelemetry::OpenTelemetryLayer;

    /// The layer that hands spans to an OTLP/HTTP exporter, and its provider.
    pub fn layer<S>(
        endpoint: &str,
    ) -> anyhow::Result<(OpenTelemetryLayer<S, Tracer>, SdkTracerProvider)>
    where
        S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    {
        let url = super::traces_url(endpoint);
        url::Url::parse(&url)
            .with_context(|| format!("{} '{endpoint}' is not a URL", super::ENDPOINT_VAR))?;
        let exporter = SpanExporter::builder()
            .with_http()
            .with_endpoint(url)
            .build()
            .context("building the OTLP span exporter")?;
        // OTEL_SERVICE_NAME, when set, names the service; else "cadre".
        let resource = match std::env::var_os("OTEL_SERVICE_NAME") {
            Some(_) => Resource::builder().build(),
            None => Resource::builder().with_service_name("cadre").build(),
        };
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(resource)
            .build();
        let tracer = provider.tracer("cadre");
        Ok((tracing_opentelemetry::layer().with_tracer(tracer), provider))
    }
}

#[cfg(test)]
mod tests {
    use super::traces_url;

    #[test]
    fn the_traces_path_is_appended_once() {
        assert_eq!(traces_url("http://h:4318"), "http://h:4318/v1/traces");
        assert_eq!(traces_url("http://h:4318/"), "http://h:4318/v1/traces");
        assert_eq!(
            traces_url("http://h:4318/v1/traces"),
            "http://h:4318/v1/traces"
        );
    }
}
