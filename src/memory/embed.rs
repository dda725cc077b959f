//! Optional semantic ranking: vectors from an OpenAI-compatible
//! `/embeddings` endpoint (`[memory] embeddings_url`), stored beside the
//! items and fused with BM25.
//!
//! [`super::Memory::put`] ──[`Embedder::embed`] (the value's text)──▶ POST <embeddings_url>/embeddings
//!                       ──▶ `memory_vectors/<item key>` (same transaction as the item) ──▶ the index's entry
//! [`super::Memory::search`] ──[`Embedder::embed`] (the query)──▶ [`super::index::TenantIndex::ranked`]: BM25 ⊕ cosine
//!
//! Off by default: with no `embeddings_url` nothing here runs and search
//! is BM25 alone, offline.
//!
//! Decided:
//! - **Stored**: one document per item under [`VECTORS`], keyed like the
//!   item, `{model, v}` where `v` is the vector as little-endian `f32`s in
//!   base64 (a 1,536-dimension vector is 8 KiB, not the 30 KiB of JSON
//!   numbers), normalised to unit length, so a cosine is a dot product.
//!   Written and deleted in the item's own transactions (a put, a delete,
//!   the sweep, the tenant erase). Not counted in the quota (`max_mb`
//!   counts the items).
//! - **In RAM**: the index keeps each item's vector (dimensions × 4 bytes
//!   per item: 6 KiB at 1,536), so scoring needs no read; a vector of
//!   another model than the one configured is ignored (the item ranks by
//!   BM25 alone until it is put again).
//! - **Fusion**: reciprocal rank fusion (k = 60, as Elasticsearch and
//!   most hybrid searches use), because BM25 scores and cosines are on
//!   scales that do not add up: an item's score is `1/(60 + its BM25
//!   rank)` (if BM25 found it) `+ 1/(60 + its vector rank)` (if its
//!   cosine with the query is at least `[memory] embeddings_min_similarity`,
//!   default 0.3), best first. So an item that shares no word with the
//!   query is still found when it means the same, and one both lists
//!   rank high ranks first.
//! - **Failures**: an embedding call that fails (5 s timeout, a non-2xx,
//!   a malformed answer) never fails the put or the search: the item is
//!   stored without a vector, the search ranks by BM25 alone, and a
//!   warning is logged. Texts are cut to [`MAX_INPUT_CHARS`]; an answer
//!   is read up to [`MAX_ANSWER_BYTES`] (an 8,192-dimension vector in JSON
//!   is ~200 KB) and one longer is a failed call, so a broken or hostile
//!   endpoint costs at most that much memory per call.
//! - **The endpoint is the operator's**, like `[model] base_url`: it is
//!   not passed through the outbound guard of `http_request` (a local
//!   embedding server on loopback or a private address is the common
//!   case), and no tenant or model chooses it. Redirects are not followed.

use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Value, json};

/// The store's namespace of the vectors.
pub const VECTORS: &str = "memory_vectors";
/// Longest text sent to be embedded, in characters.
pub const MAX_INPUT_CHARS: usize = 8_000;
/// Time allowed to one embedding call.
const TIMEOUT: Duration = Duration::from_secs(5);
/// Most dimensions accepted from the endpoint.
const MAX_DIMENSIONS: usize = 8_192;
/// Most bytes of an answer read from the endpoint.
pub const MAX_ANSWER_BYTES: usize = 1 << 20;

/// The client of the `/embeddings` endpoint.
#[derive(Clone)]
pub struct Embedder {
    http: reqwest::Client,
    url: String,
    model: String,
    key: Option<String>,
    pub min_similarity: f32,
}

impl std::fmt::Debug for Embedder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Embedder")
            .field("url", &self.url)
            .field("model", &self.model)
            .finish_non_exhaustive()
    }
}

impl Embedder {
    /// The embedder `config` asks for; `None` when `embeddings_url` is unset.
    pub fn of(config: &super::MemoryConfig) -> Option<Embedder> {
        let base = config.embeddings_url.as_deref()?.trim_end_matches('/');
        let key = config
            .embeddings_api_key_env
            .as_deref()
            .and_then(|v| std::env::var(v).ok())
            .filter(|k| !k.is_empty());
        let http = reqwest::Client::builder()
            .timeout(TIMEOUT)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .expect("build the HTTP client");
        Some(Embedder {
            http,
            url: format!("{base}/embeddings"),
            model: config.embeddings_model.clone(),
            key,
            min_similarity: config.embeddings_min_similarity,
        })
    }

    pub fn model(&self) -> &str {
        &self.model
    }

    /// The unit vector of `text`.
    pub async fn embed(&self, text: &str) -> Result<Vec<f32>, String> {
        let input: String = text.chars().take(MAX_INPUT_CHARS).collect();
        let mut request = self
            .http
            .post(&self.url)
            .json(&json!({ "model": self.model, "input": [input] }));
        if let Some(key) = &self.key {
            request = request.bearer_auth(key);
        }
        let response = request.send().await.map_err(|e| e.to_string())?;
        let status = response.status();
        if !status.is_success() {
            return Err(format!("the embeddings endpoint answered {status}"));
        }
        let (bytes, over) = crate::tools::builtin::http::read_capped(response, MAX_ANSWER_BYTES)
            .await
            .map_err(|e| e.to_string())?;
        if over {
            return Err(format!(
                "the endpoint's answer is over {MAX_ANSWER_BYTES} bytes"
            ));
        }
        let body: Value = serde_json::from_slice(&bytes).map_err(|e| e.to_string())?;
        let vector: Vec<f32> = body["data"][0]["embedding"]
            .as_array()
            .ok_or("the answer has no data[0].embedding")?
            .iter()
            .map(|x| x.as_f64().map(|x| x as f32))
            .collect::<Option<_>>()
            .ok_or("an embedding holds something other than numbers")?;
        if vector.is_empty() || vector.len() > MAX_DIMENSIONS {
            return Err(format!(
                "an embedding of {} dimensions (1 to {MAX_DIMENSIONS})",
                vector.len()
            ));
        }
        normalised(vector).ok_or_else(|| "an embedding of length 0".to_string())
    }
}

/// `v` scaled to unit length; `None` for a zero (or not finite) vector.
pub fn normalised(mut v: Vec<f32>) -> Option<Vec<f32>> {
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if !norm.is_finite() || norm == 0.0 {
        return None;
    }
    v.iter_mut().for_each(|x| *x /= norm);
    Some(v)
}

/// The stored document of a vector.
pub fn to_doc(model: &str, v: &[f32]) -> Value {
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    json!({ "model": model, "v": STANDARD.encode(bytes) })
}

/// The vector of a stored document, when it is of `model`.
pub fn from_doc(doc: &Value, model: &str) -> Option<Vec<f32>> {
    if doc["model"].as_str() != Some(model) {
        return None;
    }
    let bytes = STANDARD.decode(doc["v"].as_str()?).ok()?;
    if bytes.len() % 4 != 0 {
        return None;
    }
    Some(
        bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_vector_round_trips_through_its_document_of_its_model_only() {
        let v = normalised(vec![3.0, 4.0]).unwrap();
        assert_eq!(v, [0.6, 0.8]);
        let doc = to_doc("m", &v);
        assert_eq!(from_doc(&doc, "m").unwrap(), v);
        assert_eq!(from_doc(&doc, "other"), None);
        assert_eq!(normalised(vec![0.0, 0.0]), None);
    }

    /// An endpoint on loopback that answers every request with `body`.
    async fn endpoint(body: Vec<u8>) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                let body = body.clone();
                tokio::spawn(async move {
                    let mut request = Vec::new();
                    let mut buf = [0u8; 4096];
                    // The headers and the small JSON body, then the answer.
                    while let Ok(n) = socket.read(&mut buf).await {
                        request.extend_from_slice(&buf[..n]);
                        if n == 0 || request.ends_with(b"}") {
                            break;
                        }
                    }
                    let head = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
                        body.len()
                    );
                    let _ = socket.write_all(head.as_bytes()).await;
                    let _ = socket.write_all(&body).await;
                });
            }
        });
        format!("http://{addr}")
    }

    fn embedder(url: String) -> Embedder {
        let config = crate::memory::MemoryConfig {
            embeddings_url: Some(url),
            ..Default::default()
        };
        Embedder::of(&config).unwrap()
    }

    /// A well-formed answer is read; the same answer padded past
    /// [`MAX_ANSWER_BYTES`] is a failed call, not a buffer that grows with
    /// whatever the endpoint sends.
    #[tokio::test]
    async fn an_answer_over_the_cap_is_a_failed_call() {
        let answer = br#"{"data": [{"embedding": [3.0, 4.0]}]}"#.to_vec();
        let ok = embedder(endpoint(answer.clone()).await);
        assert_eq!(ok.embed("dog").await.unwrap(), [0.6, 0.8]);

        let mut padded = b"{\"pad\": \"".to_vec();
        padded.extend(std::iter::repeat_n(b'x', MAX_ANSWER_BYTES));
        padded.extend_from_slice(br#"", "data": [{"embedding": [3.0, 4.0]}]}"#);
        let big = embedder(endpoint(padded).await);
        let err = big.embed("dog").await.unwrap_err();
        assert!(err.contains("over"), "{err}");
    }
}
