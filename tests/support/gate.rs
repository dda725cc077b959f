//! A "gate" tool for tests: a call reports its label when it starts and
//! finishes only when the test opens the gate, so a test can hold a
//! concurrency slot or a turn deterministically, without sleeps.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use cadre::tools::{FnHandler, ToolDefinition, ToolError, ToolHandler};
use serde_json::{Value, json};
use tokio::sync::{Semaphore, mpsc};

/// How long a test waits for a gate call to start before it fails loudly.
const PATIENCE: Duration = Duration::from_secs(10);

/// The test's side of a gate tool.
pub struct Gate {
    started: mpsc::UnboundedReceiver<String>,
    open: Arc<Semaphore>,
    /// Gate calls running now, and the most that ever ran at once.
    pub running: Arc<AtomicUsize>,
    pub peak: Arc<AtomicUsize>,
}

impl Gate {
    /// The label of the next gate call that started running.
    pub async fn started(&mut self) -> String {
        tokio::time::timeout(PATIENCE, self.started.recv())
            .await
            .expect("a gate call started in time")
            .expect("the gate tool is registered")
    }

    /// Lets `calls` gate calls (running or still to come) finish.
    pub fn open(&self, calls: usize) {
        self.open.add_permits(calls);
    }

    /// Lets one gate call finish.
    pub fn open_one(&self) {
        self.open(1);
    }

    /// No gate call started that the test has not seen.
    pub fn none_started(&mut self) -> bool {
        self.started.try_recv().is_err()
    }
}

/// A tool `name {label}` of `category` that reports its label when it
/// starts and answers `{"label"}` once the gate opens. Never cached.
pub fn gate_tool(name: &str, category: &str) -> (ToolDefinition, Arc<dyn ToolHandler>, Gate) {
    let (tx, started) = mpsc::unbounded_channel();
    let open = Arc::new(Semaphore::new(0));
    let running = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    let (permits, now, most) = (open.clone(), running.clone(), peak.clone());
    let handler = FnHandler(move |params: Value| {
        let (tx, permits, now, most) = (tx.clone(), permits.clone(), now.clone(), most.clone());
        async move {
            let label = params["label"].as_str().unwrap_or_default().to_owned();
            let n = now.fetch_add(1, Ordering::SeqCst) + 1;
            most.fetch_max(n, Ordering::SeqCst);
            let _ = tx.send(label.clone());
            permits.acquire().await.expect("gate open").forget();
            now.fetch_sub(1, Ordering::SeqCst);
            Ok::<Value, ToolError>(json!({ "label": label }))
        }
    });
    let def = ToolDefinition::new(
        name,
        "Holds until the test opens the gate.",
        json!({
            "type": "object",
            "properties": {"label": {"type": "string"}},
            "required": ["label"]
        }),
    )
    .with_category(category)
    .with_cache_ttl(0);
    let gate = Gate {
        started,
        open,
        running,
        peak,
    };
    (def, Arc::new(handler), gate)
}
