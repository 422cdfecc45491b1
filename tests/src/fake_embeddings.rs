//! An in-process fake embeddings server: `POST /v1/embeddings` in the OpenAI wire format,
//! answered deterministically by [`fake_embedding`] (a hashed bag of concepts, where a small
//! synonyms table maps "install"/"add" and "packages"/"dependencies"/"pnpm" to shared concepts),
//! so a paraphrase that shares no word with a lesson still lands near it, and unrelated text
//! does not. Scripted failures ([`FakeEmbeddings::push_failure`]) are answered first, in order;
//! every request is recorded.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

/// Vector length the fake answers with unless told otherwise.
pub const DIMENSIONS: u32 = 256;

/// Words that carry no concept.
const STOP_WORDS: &[&str] = &[
    "a", "an", "the", "to", "of", "in", "on", "for", "with", "and", "or", "is", "are", "be", "it",
    "this", "that", "i", "we", "you", "do", "does", "how", "what", "should", "can", "please", "my",
    "our", "here", "when", "use", "run", "not", "never", "always", "instead", "by", "from",
];

/// Word → concept. Words not listed are their own concept.
const SYNONYMS: &[(&str, &str)] = &[
    ("install", "install"),
    ("installs", "install"),
    ("installing", "install"),
    ("add", "install"),
    ("adds", "install"),
    ("adding", "install"),
    ("package", "package"),
    ("packages", "package"),
    ("dependency", "package"),
    ("dependencies", "package"),
    ("deps", "package"),
    ("pnpm", "package"),
    ("npm", "package"),
    ("yarn", "package"),
    ("library", "package"),
    ("libraries", "package"),
    ("module", "package"),
    ("modules", "package"),
];

/// The deterministic vector of `text`: each concept adds ±1 at a hashed position.
pub fn fake_embedding(text: &str, dimensions: u32) -> Vec<f32> {
    let mut vector = vec![0.0_f32; dimensions as usize];
    for word in text
        .split(|c: char| !c.is_alphanumeric())
        .map(str::to_lowercase)
        .filter(|w| !w.is_empty() && !STOP_WORDS.contains(&w.as_str()))
    {
        let concept = SYNONYMS
            .iter()
            .find(|(from, _)| *from == word)
            .map_or(word.as_str(), |(_, to)| to);
        let hash = fnv1a(concept.as_bytes());
        let index = (hash % u64::from(dimensions)) as usize;
        let sign = if (hash >> 32) & 1 == 0 { 1.0 } else { -1.0 };
        vector[index] += sign;
    }
    vector
}

/// FNV-1a, 64 bits: stable across runs and platforms.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// A scripted failure: status, optional `Retry-After`, and an OpenAI-style error body.
#[derive(Debug, Clone)]
struct Failure {
    status: u16,
    retry_after: Option<String>,
}

#[derive(Default)]
struct Script {
    failures: VecDeque<Failure>,
    received: Vec<Value>,
    /// The `Authorization` header of each request (`None` when absent).
    authorizations: Vec<Option<String>>,
}

#[derive(Clone)]
struct Shared {
    script: Arc<Mutex<Script>>,
    dimensions: u32,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Script> {
        self.script.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A running fake embeddings server; stopped when dropped.
pub struct FakeEmbeddings {
    base_url: String,
    shared: Shared,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl FakeEmbeddings {
    /// Binds 127.0.0.1 on a free port; answers vectors of [`DIMENSIONS`].
    pub async fn start() -> FakeEmbeddings {
        FakeEmbeddings::start_with(DIMENSIONS).await
    }

    pub async fn start_with(dimensions: u32) -> FakeEmbeddings {
        FakeEmbeddings::start_on("127.0.0.1:0", dimensions)
            .await
            .expect("bind fake embeddings")
    }

    /// Binds `address` (e.g. `127.0.0.1:8091`) and serves vectors of `dimensions`.
    pub async fn start_on(address: &str, dimensions: u32) -> std::io::Result<FakeEmbeddings> {
        let listener = tokio::net::TcpListener::bind(address).await?;
        let address = listener.local_addr().expect("fake embeddings address");
        let shared = Shared {
            script: Arc::default(),
            dimensions,
        };
        let app = axum::Router::new()
            .route("/v1/embeddings", axum::routing::post(embeddings))
            .with_state(shared.clone());
        let shutdown = CancellationToken::new();
        let task = crate::serve_until_cancelled(listener, app, shutdown.clone(), "fake embeddings");
        Ok(FakeEmbeddings {
            base_url: format!("http://{address}/v1"),
            shared,
            shutdown,
            task,
        })
    }

    /// `http://127.0.0.1:PORT/v1`, the `embeddings.base_url` to configure.
    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    /// The next request (after earlier scripted failures) answers `status`, with a
    /// `Retry-After` header when given.
    pub fn push_failure(&self, status: u16, retry_after: Option<&str>) -> &Self {
        self.shared.lock().failures.push_back(Failure {
            status,
            retry_after: retry_after.map(str::to_owned),
        });
        self
    }

    /// Requests received so far.
    pub fn request_count(&self) -> usize {
        self.shared.lock().received.len()
    }

    /// The `Authorization` header of every request so far, in arrival order.
    pub fn authorizations(&self) -> Vec<Option<String>> {
        self.shared.lock().authorizations.clone()
    }

    /// Bodies of every request received so far, in arrival order.
    pub fn requests(&self) -> Vec<Value> {
        self.shared.lock().received.clone()
    }

    /// An `embeddings` configuration for this server and `model`, vectors of its length.
    pub fn config(
        &self,
        model: &str,
        min_similarity: f64,
    ) -> zuno_shared::config::EmbeddingsConfig {
        zuno_shared::config::EmbeddingsConfig {
            base_url: self.base_url.clone(),
            model: model.to_owned(),
            dimensions: self.shared.dimensions,
            send_dimensions: false,
            api_key_env: None,
            min_similarity,
            timeout_ms: 5_000,
            query_timeout_ms: 5_000,
            max_scan: 20_000,
        }
    }
}

impl Drop for FakeEmbeddings {
    fn drop(&mut self) {
        self.shutdown.cancel();
        self.task.abort();
    }
}

async fn embeddings(
    State(shared): State<Shared>,
    headers: axum::http::HeaderMap,
    Json(body): Json<Value>,
) -> Response {
    let failure = {
        let mut script = shared.lock();
        script.received.push(body.clone());
        script.authorizations.push(
            headers
                .get("authorization")
                .and_then(|value| value.to_str().ok())
                .map(str::to_owned),
        );
        script.failures.pop_front()
    };
    if let Some(failure) = failure {
        let status = StatusCode::from_u16(failure.status).expect("scripted status");
        let error = json!({"error": {
            "message": format!("fake embeddings: scripted {}", failure.status),
            "type": if failure.status == 429 { "rate_limit_exceeded" } else { "server_error" },
        }});
        let mut response = (status, Json(error)).into_response();
        if let Some(wait) = failure.retry_after {
            response.headers_mut().insert(
                "retry-after",
                wait.parse()
                    .expect("scripted Retry-After is a header value"),
            );
        }
        return response;
    }
    let inputs: Vec<String> = match &body["input"] {
        Value::String(text) => vec![text.clone()],
        Value::Array(items) => items
            .iter()
            .map(|item| item.as_str().unwrap_or_default().to_owned())
            .collect(),
        _ => return (StatusCode::BAD_REQUEST, "input must be text").into_response(),
    };
    let data: Vec<Value> = inputs
        .iter()
        .enumerate()
        .map(|(index, text)| {
            json!({
                "object": "embedding",
                "index": index,
                "embedding": fake_embedding(text, shared.dimensions),
            })
        })
        .collect();
    Json(json!({
        "object": "list",
        "data": data,
        "model": body["model"],
        "usage": {"prompt_tokens": 1, "total_tokens": 1},
    }))
    .into_response()
}
