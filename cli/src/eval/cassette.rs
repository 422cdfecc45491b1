//! Recorded provider answers for the learning-quality harness: with `--record-cassettes DIR`
//! every model request of a run goes through a local proxy that forwards it to the configured
//! provider and stores the answer; with `--replay-cassettes DIR` the proxy answers from the
//! recordings and nothing leaves the machine. A regression test can so pin the pipeline's
//! behaviour on one set of model answers, and a user can measure their model once and replay it.
//!
//! With `--answers-from DIR` (and `--record-cassettes`) no provider is called at all: every request
//! without a recording is written to `DIR/<key>.request.json` and the run waits for
//! `DIR/<key>.answer.json`, the model's answer text, written by whoever answers (a person, or a
//! language model that sees only the request file: the *blind* recordings of
//! `docs/learning-eval.md`). The answer is stored as a recording in the provider's wire format
//! and given back, so the pipeline goes on; a maintenance plan, which rests on the extraction
//! answers before it, is asked only when its turn comes, and answered as it comes.
//!
//! A recording is keyed by the provider, the path and the request body with every generated id
//! (`exp_…`, `job_…`: a prefix and 32 hex digits) replaced by its order of first appearance, so a
//! maintenance plan that cites this run's experience ids replays in the next run; the answer is
//! stored with the same placeholders and given back with the current run's ids.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use regex::Regex;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use zuno_shared::config::ProviderConfig;

use super::error::EvalError;

/// What the proxy does with a request.
#[derive(Debug, Clone)]
pub enum CassetteMode {
    /// Forward to the real provider and store its answer in the directory.
    Record(PathBuf),
    /// Answer from the directory; a request without a recording gets a 400 naming it.
    Replay(PathBuf),
    /// Answer from `cassettes` when a recording exists; otherwise write the request to
    /// `exchange`, wait (at most `wait`) for its answer file there, and record it.
    AwaitAnswers {
        cassettes: PathBuf,
        exchange: PathBuf,
        wait: Duration,
    },
}

impl CassetteMode {
    /// The directory holding the recordings.
    pub fn cassettes(&self) -> &Path {
        match self {
            CassetteMode::Record(dir)
            | CassetteMode::Replay(dir)
            | CassetteMode::AwaitAnswers { cassettes: dir, .. } => dir,
        }
    }
}

/// The provider the harness uses when cassettes answer and the configuration names none: an
/// OpenAI-compatible one that only ever reaches the cassette proxy.
pub const RECORDED_PROVIDER: &str = "recorded";
/// Its model (part of every request body, so part of every recording's key).
pub const RECORDED_MODEL: &str = "recorded-model";

/// One stored answer (the request is not stored: its digest is the file name, and requests
/// carry the transcripts' text).
#[derive(Debug, Serialize, Deserialize)]
struct Recording {
    provider: String,
    path: String,
    status: u16,
    content_type: String,
    body: String,
}

struct Proxy {
    mode: CassetteMode,
    /// Provider name → its real base URL.
    upstream: BTreeMap<String, String>,
    http: reqwest::Client,
}

/// A running proxy; dropping it stops the server.
pub struct Cassettes {
    server: tokio::task::JoinHandle<()>,
}

impl Drop for Cassettes {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl Cassettes {
    /// Starts the proxy and returns it with `providers` pointed at it.
    pub async fn start(
        mode: CassetteMode,
        providers: &BTreeMap<String, ProviderConfig>,
    ) -> Result<(Cassettes, BTreeMap<String, ProviderConfig>), EvalError> {
        let dir = mode.cassettes().to_path_buf();
        let mut writable = vec![];
        match &mode {
            CassetteMode::Record(dir) => writable.push(dir.clone()),
            CassetteMode::AwaitAnswers {
                cassettes,
                exchange,
                ..
            } => writable.extend([cassettes.clone(), exchange.clone()]),
            CassetteMode::Replay(_) => {}
        }
        for dir in &writable {
            std::fs::create_dir_all(dir).map_err(|source| EvalError::Read {
                path: dir.clone(),
                source,
            })?;
        }
        if !dir.is_dir() {
            return Err(EvalError::Read {
                path: dir,
                source: std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    "no such cassette directory",
                ),
            });
        }
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(EvalError::store)?;
        let address = listener.local_addr().map_err(EvalError::store)?;
        let upstream = providers
            .iter()
            .map(|(name, provider)| {
                (
                    name.clone(),
                    provider.base_url.trim_end_matches('/').to_owned(),
                )
            })
            .collect();
        let proxy = Arc::new(Proxy {
            mode,
            upstream,
            http: reqwest::Client::new(),
        });
        let router = axum::Router::new().fallback(handle).with_state(proxy);
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, router).await;
        });
        let rewritten = providers
            .iter()
            .map(|(name, provider)| {
                let mut provider = provider.clone();
                provider.base_url = format!("http://{address}/p/{name}");
                (name.clone(), provider)
            })
            .collect();
        Ok((Cassettes { server }, rewritten))
    }
}

/// One request to the proxy, keyed for its recording.
struct Exchange {
    provider: String,
    path: String,
    /// The request body with generated ids replaced by placeholders.
    normalized: String,
    key: String,
    ids: Ids,
}

impl Exchange {
    /// The recorded answer, with this run's ids put back.
    fn replayed(&self, recording: &Recording) -> Response {
        answer(
            recording.status,
            &recording.content_type,
            self.ids.show(&recording.body),
        )
    }
}

async fn handle(
    State(proxy): State<Arc<Proxy>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let Some((provider, path)) = uri
        .path()
        .strip_prefix("/p/")
        .and_then(|rest| rest.split_once('/'))
        .map(|(provider, path)| (provider.to_owned(), format!("/{path}")))
    else {
        return problem(StatusCode::NOT_FOUND, "not a provider path");
    };
    let request: serde_json::Value =
        serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null);
    let mut ids = Ids::default();
    let normalized = ids.hide(&request.to_string());
    let exchange = Exchange {
        key: key(&provider, &path, &normalized),
        provider,
        path,
        normalized,
        ids,
    };
    match &proxy.mode {
        CassetteMode::AwaitAnswers {
            cassettes,
            exchange: answers,
            wait,
        } => match read(cassettes, &exchange.key) {
            Some(recording) => exchange.replayed(&recording),
            None => match await_answer(cassettes, answers, *wait, &exchange).await {
                Ok(recording) => exchange.replayed(&recording),
                Err(message) => problem(StatusCode::GATEWAY_TIMEOUT, &message),
            },
        },
        CassetteMode::Replay(dir) => match read(dir, &exchange.key) {
            Some(recording) => exchange.replayed(&recording),
            None => problem(
                StatusCode::BAD_REQUEST,
                &format!(
                    "no recorded answer for this request (cassette {}.json is missing)",
                    exchange.key
                ),
            ),
        },
        CassetteMode::Record(dir) => record(&proxy, dir, method, &headers, body, exchange).await,
    }
}

/// Forwards the request to the real provider and stores its answer.
async fn record(
    proxy: &Proxy,
    dir: &Path,
    method: Method,
    headers: &HeaderMap,
    body: Bytes,
    mut exchange: Exchange,
) -> Response {
    let Some(base) = proxy.upstream.get(&exchange.provider) else {
        return problem(StatusCode::NOT_FOUND, "unknown provider");
    };
    let mut outgoing = proxy
        .http
        .request(method, format!("{base}{}", exchange.path))
        .body(body);
    for (name, value) in headers {
        if !matches!(
            name.as_str(),
            "host" | "content-length" | "connection" | "accept-encoding"
        ) {
            outgoing = outgoing.header(name, value);
        }
    }
    let response = match outgoing.send().await {
        Ok(response) => response,
        Err(error) => return problem(StatusCode::BAD_GATEWAY, &error.to_string()),
    };
    let status = response.status().as_u16();
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/json")
        .to_owned();
    let text = response.text().await.unwrap_or_default();
    let recording = Recording {
        provider: exchange.provider,
        path: exchange.path,
        status,
        content_type: content_type.clone(),
        body: exchange.ids.hide(&text),
    };
    if let Err(error) = write(dir, &exchange.key, &recording) {
        return problem(StatusCode::INTERNAL_SERVER_ERROR, &error.to_string());
    }
    answer(status, &content_type, text)
}

/// Writes the request for `key` to the exchange directory, waits for its answer file, and stores
/// the answer as a Chat Completions recording (the only wire format the recorded provider
/// speaks). The request keeps the placeholders of generated ids, so the answer may cite them.
async fn await_answer(
    cassettes: &Path,
    answers: &Path,
    wait: Duration,
    exchange: &Exchange,
) -> Result<Recording, String> {
    let Exchange {
        key,
        normalized,
        provider,
        path,
        ..
    } = exchange;
    let request: serde_json::Value =
        serde_json::from_str(normalized).unwrap_or(serde_json::Value::Null);
    let pretty = serde_json::to_string_pretty(&request).unwrap_or_else(|_| normalized.to_owned());
    let request_path = answers.join(format!("{key}.request.json"));
    write_atomically(&request_path, &pretty).map_err(|e| e.to_string())?;
    let answer_path = answers.join(format!("{key}.answer.json"));
    let deadline = tokio::time::Instant::now() + wait;
    let text = loop {
        match std::fs::read_to_string(&answer_path) {
            Ok(text) if !text.trim().is_empty() => break text,
            _ if tokio::time::Instant::now() >= deadline => {
                return Err(format!(
                    "no answer in {} within {} s",
                    answer_path.display(),
                    wait.as_secs()
                ));
            }
            _ => tokio::time::sleep(Duration::from_millis(250)).await,
        }
    };
    let model = request
        .get("model")
        .and_then(|m| m.as_str())
        .unwrap_or(RECORDED_MODEL);
    let body = serde_json::json!({
        "id": format!("chatcmpl-{key}"),
        "object": "chat.completion",
        "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text.trim()}, "finish_reason": "stop"}],
        // Estimated (four characters a token): the answerer reports none.
        "usage": {
            "prompt_tokens": normalized.len() / 4,
            "completion_tokens": text.len() / 4,
            "total_tokens": (normalized.len() + text.len()) / 4,
        },
    });
    let recording = Recording {
        provider: provider.clone(),
        path: path.clone(),
        status: 200,
        content_type: String::from("application/json"),
        body: body.to_string(),
    };
    write(cassettes, key, &recording).map_err(|e| e.to_string())?;
    Ok(recording)
}

fn write_atomically(path: &Path, text: &str) -> std::io::Result<()> {
    let partial = path.with_extension("partial");
    std::fs::write(&partial, text)?;
    std::fs::rename(partial, path)
}

/// Generated ids and their placeholders, in order of first appearance.
#[derive(Default)]
struct Ids {
    placeholders: HashMap<String, String>,
    ids: HashMap<String, String>,
}

static GENERATED_ID: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"\b[a-z]{2,12}_[0-9a-f]{32}\b").expect("a valid pattern"));
static PLACEHOLDER: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"\{\{id:\d+\}\}").expect("a valid pattern"));

impl Ids {
    fn hide(&mut self, text: &str) -> String {
        GENERATED_ID
            .replace_all(text, |captures: &regex::Captures| {
                let id = &captures[0];
                let next = self.placeholders.len() + 1;
                let placeholder = self
                    .placeholders
                    .entry(id.to_owned())
                    .or_insert_with(|| format!("{{{{id:{next}}}}}"))
                    .clone();
                self.ids.insert(placeholder.clone(), id.to_owned());
                placeholder
            })
            .into_owned()
    }

    fn show(&self, text: &str) -> String {
        PLACEHOLDER
            .replace_all(text, |captures: &regex::Captures| {
                self.ids
                    .get(&captures[0])
                    .cloned()
                    .unwrap_or_else(|| captures[0].to_owned())
            })
            .into_owned()
    }
}

fn key(provider: &str, path: &str, normalized: &str) -> String {
    let mut hasher = Sha256::new();
    for part in [provider, path, normalized] {
        hasher.update(part.as_bytes());
        hasher.update([0]);
    }
    hex::encode(hasher.finalize())[..32].to_owned()
}

fn read(dir: &Path, key: &str) -> Option<Recording> {
    let text = std::fs::read_to_string(dir.join(format!("{key}.json"))).ok()?;
    serde_json::from_str(&text).ok()
}

fn write(dir: &Path, key: &str, recording: &Recording) -> std::io::Result<()> {
    let text = serde_json::to_string_pretty(recording)?;
    std::fs::write(dir.join(format!("{key}.json")), text)
}

fn answer(status: u16, content_type: &str, body: String) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY);
    (status, [("content-type", content_type.to_owned())], body).into_response()
}

/// An error in the providers' own error shape, so the client reports it like any provider error.
fn problem(status: StatusCode, message: &str) -> Response {
    let body = serde_json::json!({ "error": { "type": "cassette", "message": message } });
    (
        status,
        [("content-type", "application/json".to_owned())],
        body.to_string(),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_ids_become_placeholders_and_come_back() {
        let mut ids = Ids::default();
        let request = r#"{"ids":["exp_0123456789abcdef0123456789abcdef","exp_ffffffffffffffffffffffffffffffff","exp_0123456789abcdef0123456789abcdef"]}"#;
        let hidden = ids.hide(request);
        assert_eq!(hidden, r#"{"ids":["{{id:1}}","{{id:2}}","{{id:1}}"]}"#);
        assert_eq!(
            ids.show("cites {{id:2}}"),
            "cites exp_ffffffffffffffffffffffffffffffff"
        );
        // The same request with other ids has the same key.
        let mut other = Ids::default();
        let again = other.hide(&request.replace("0123456789abcdef", "aaaaaaaaaaaaaaaa"));
        assert_eq!(
            key("p", "/chat/completions", &hidden),
            key("p", "/chat/completions", &again)
        );
    }
}
