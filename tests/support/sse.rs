//! Server-Sent Events as a test reads them: frames with their `id:`,
//! event name and JSON data (tests/resumable_streams.rs, tests/cluster.rs).

use std::time::Duration;

use futures::StreamExt;
use serde_json::Value;

const PATIENCE: Duration = Duration::from_secs(20);

/// One SSE frame: its id, event name and JSON data.
#[derive(Debug, Clone)]
pub struct Frame {
    pub id: Option<String>,
    pub name: String,
    pub data: Value,
}

/// Parses complete frames out of `buffer`, leaving an incomplete tail.
pub fn parse(buffer: &mut String) -> Vec<Frame> {
    let mut frames = Vec::new();
    while let Some(end) = buffer.find("\n\n") {
        let block: String = buffer.drain(..end + 2).collect();
        let (mut id, mut name, mut data) = (None, None, Vec::new());
        for line in block.lines() {
            if let Some(v) = line.strip_prefix("id:") {
                id = Some(v.trim().to_string());
            } else if let Some(v) = line.strip_prefix("event:") {
                name = Some(v.trim().to_string());
            } else if let Some(v) = line.strip_prefix("data:") {
                data.push(v.strip_prefix(' ').unwrap_or(v).to_string());
            }
        }
        if let Some(name) = name {
            let data = serde_json::from_str(&data.join("\n")).unwrap_or(Value::Null);
            frames.push(Frame { id, name, data });
        }
    }
    frames
}

/// Reads frames from `response` until `stop` says so or the stream ends.
pub async fn read_until(
    response: reqwest::Response,
    mut stop: impl FnMut(&Frame) -> bool,
) -> (Vec<Frame>, bool) {
    let mut body = response.bytes_stream();
    let mut buffer = String::new();
    let mut frames = Vec::new();
    let read = async {
        while let Some(chunk) = body.next().await {
            buffer.push_str(&String::from_utf8_lossy(&chunk.expect("a chunk")));
            for frame in parse(&mut buffer) {
                let done = stop(&frame);
                frames.push(frame);
                if done {
                    return true;
                }
            }
        }
        false
    };
    let stopped = tokio::time::timeout(PATIENCE, read)
        .await
        .expect("the stream went on in time");
    (frames, stopped)
}

/// The frames' ids, in order.
pub fn ids(frames: &[Frame]) -> Vec<String> {
    frames.iter().filter_map(|f| f.id.clone()).collect()
}
