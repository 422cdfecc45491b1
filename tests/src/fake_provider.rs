//! An in-process fake model provider speaking the three wire formats learning uses:
//! `POST /v1/chat/completions`, `/v1/responses` and `/v1/messages`.
//!
//! Each server plays a FIFO script of [`Reply`]s, one per request, whatever the endpoint:
//! an answer text wrapped in the success envelope of the endpoint that was called, a raw
//! status/headers/body, a hang that never answers, or a response replayed from the recorded
//! cassettes in `shared/corpus/provider-fixtures` (read in place). Every request is recorded
//! for assertions. With the script used up it answers 500 saying so.
//!
//! Requests are told apart by what they ask for ([`RequestKind`]: extraction, maintenance plan,
//! project or global pattern grouping, evaluation step or grade), read from the schema name of
//! native structured output or else from the system prompt. A test may script replies for one
//! kind ([`FakeProvider::push_for`]); those come before the shared script.
//!
//! In *auto-answer* mode ([`FakeProvider::start_auto`], the `zuno-fake-provider` binary the
//! docker-compose stack runs) a request without a scripted reply is answered with a valid answer
//! of its own kind derived from the request itself ([`auto_answer`]), so a stack with no real
//! model learns through every stage: extraction, maintenance, mining and evaluation.

use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

/// Where the shared acceptance corpus lives: `ZUNO_CORPUS_DIR`, else `shared/corpus` beside the
/// repository checkout.
pub fn corpus_dir() -> PathBuf {
    std::env::var_os("ZUNO_CORPUS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/corpus"))
}

/// A configuration whose learning model is the fake provider at `base_url` (provider `fake`,
/// OpenAI Chat wire format, model `fake/fake-model`), each call bounded by `timeout_ms`.
pub fn learning_config(base_url: &str, timeout_ms: u64) -> zuno_shared::config::Config {
    use zuno_shared::config::{Config, ProviderApi, ProviderConfig};
    let mut config = Config::default();
    config.providers.insert(
        "fake".into(),
        ProviderConfig {
            api: ProviderApi::OpenaiChat,
            base_url: base_url.to_owned(),
            api_key_env: None,
            header_envs: Default::default(),
            small_model: None,
            models: Default::default(),
        },
    );
    config.learning.extractor_model = Some("fake/fake-model".into());
    config.learning.execution.timeout_ms = timeout_ms;
    config
}

/// One scripted reply.
#[derive(Debug, Clone)]
pub struct Reply {
    kind: ReplyKind,
    extra_headers: Vec<(String, String)>,
}

#[derive(Debug, Clone)]
enum ReplyKind {
    Answer {
        text: String,
        input_tokens: u64,
        output_tokens: u64,
    },
    Raw {
        status: u16,
        headers: Vec<(String, String)>,
        body: String,
    },
    Hang,
    /// `then`, once the gate is opened (a test holds a request in flight while it acts).
    Held {
        gate: Gate,
        then: Box<Reply>,
    },
    /// The answer of the request's kind [`auto_answer`] derives from the request.
    Auto,
}

impl Reply {
    /// `text` as the model's answer, in the called endpoint's success envelope, with usage
    /// 100 input / 20 output tokens.
    pub fn answer(text: impl Into<String>) -> Reply {
        Reply::answer_with_usage(text, 100, 20)
    }

    pub fn answer_with_usage(
        text: impl Into<String>,
        input_tokens: u64,
        output_tokens: u64,
    ) -> Reply {
        Reply::from_kind(ReplyKind::Answer {
            text: text.into(),
            input_tokens,
            output_tokens,
        })
    }

    /// A JSON body with the given status.
    pub fn json(status: u16, body: Value) -> Reply {
        Reply::from_kind(ReplyKind::Raw {
            status,
            headers: vec![(
                String::from("content-type"),
                String::from("application/json"),
            )],
            body: body.to_string(),
        })
    }

    /// Any body with the given status and content type.
    pub fn raw(status: u16, content_type: &str, body: impl Into<String>) -> Reply {
        Reply::from_kind(ReplyKind::Raw {
            status,
            headers: vec![(String::from("content-type"), content_type.to_owned())],
            body: body.into(),
        })
    }

    /// Accepts the request and never answers (until the server is dropped).
    pub fn hang() -> Reply {
        Reply::from_kind(ReplyKind::Hang)
    }

    /// Receives the request, then waits for `gate` to open before answering with `then`.
    pub fn held(gate: &Gate, then: Reply) -> Reply {
        Reply::from_kind(ReplyKind::Held {
            gate: gate.clone(),
            then: Box::new(then),
        })
    }

    /// The answer of the request's kind that [`auto_answer`] derives from the request, in the
    /// called endpoint's success envelope.
    pub fn auto() -> Reply {
        Reply::from_kind(ReplyKind::Auto)
    }

    /// Every recorded response of a cassette, in order. `cassette` is relative to
    /// `provider-fixtures/`, e.g. `"openai-chat/error_400_unsupported_value.yaml"`.
    pub fn cassette(cassette: &str) -> Vec<Reply> {
        load_cassette(cassette)
            .interactions
            .into_iter()
            .map(|interaction| interaction.response.into_reply())
            .collect()
    }

    /// The `index`th recorded response of a cassette.
    pub fn cassette_response(cassette: &str, index: usize) -> Reply {
        let mut interactions = load_cassette(cassette).interactions;
        assert!(
            index < interactions.len(),
            "{cassette} has {} interactions, not {}",
            interactions.len(),
            index + 1
        );
        interactions.swap_remove(index).response.into_reply()
    }

    /// Sets a response header, replacing a scripted or default one of the same name.
    pub fn with_header(mut self, name: &str, value: &str) -> Reply {
        self.extra_headers.push((name.to_owned(), value.to_owned()));
        self
    }

    fn from_kind(kind: ReplyKind) -> Reply {
        Reply {
            kind,
            extra_headers: Vec::new(),
        }
    }
}

/// Holds [`Reply::held`] answers until [`Gate::open`].
#[derive(Debug, Clone)]
pub struct Gate(Arc<tokio::sync::Semaphore>);

impl Default for Gate {
    fn default() -> Gate {
        Gate::new()
    }
}

impl Gate {
    pub fn new() -> Gate {
        Gate(Arc::new(tokio::sync::Semaphore::new(0)))
    }

    /// Lets every held reply (now and later) answer.
    pub fn open(&self) {
        self.0.add_permits(tokio::sync::Semaphore::MAX_PERMITS / 2);
    }
}

/// A request the fake received.
#[derive(Debug, Clone)]
pub struct ReceivedRequest {
    pub method: String,
    pub path: String,
    /// Lower-case names; repeated headers joined with `, `.
    pub headers: BTreeMap<String, String>,
    /// The JSON body (`Value::Null` when it was not JSON).
    pub body: Value,
}

impl ReceivedRequest {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .get(&name.to_ascii_lowercase())
            .map(String::as_str)
    }

    /// What the request asks for.
    pub fn kind(&self) -> RequestKind {
        RequestKind::of(&self.body)
    }
}

/// What a learning request asks the model for; each kind has its own answer schema.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RequestKind {
    /// `zuno_extraction`: experiences and memory hints of one closed turn.
    Extraction,
    /// `zuno_memory_plan`: changes to resident Memory.
    MaintenancePlan,
    /// `zuno_pattern_groups` over one project's experiences.
    ProjectGrouping,
    /// `zuno_pattern_groups` over promoted patterns across projects.
    GlobalGrouping,
    /// `zuno_eval_step`: one step of an offline attempt.
    EvaluationStep,
    /// `zuno_eval_grade`: the grade of one attempt.
    EvaluationGrade,
    /// Anything else (not a request a Zuno worker sends).
    Unknown,
}

impl RequestKind {
    pub const ALL: [RequestKind; 7] = [
        RequestKind::Extraction,
        RequestKind::MaintenancePlan,
        RequestKind::ProjectGrouping,
        RequestKind::GlobalGrouping,
        RequestKind::EvaluationStep,
        RequestKind::EvaluationGrade,
        RequestKind::Unknown,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            RequestKind::Extraction => "extraction",
            RequestKind::MaintenancePlan => "maintenance_plan",
            RequestKind::ProjectGrouping => "project_grouping",
            RequestKind::GlobalGrouping => "global_grouping",
            RequestKind::EvaluationStep => "evaluation_step",
            RequestKind::EvaluationGrade => "evaluation_grade",
            RequestKind::Unknown => "unknown",
        }
    }

    /// Reads the kind of a request body of any of the three wire formats: the schema name of
    /// native structured output when there is one, else the answer shape the system prompt
    /// asks for. Both pattern groupings share a schema; the global one groups `pattern_ids`.
    pub fn of(body: &Value) -> RequestKind {
        let system = system_prompt(body);
        let global_grouping = system.contains("\"pattern_ids\"");
        match schema_name(body) {
            Some("zuno_extraction") => return RequestKind::Extraction,
            Some("zuno_memory_plan") => return RequestKind::MaintenancePlan,
            Some("zuno_pattern_groups") if global_grouping => return RequestKind::GlobalGrouping,
            Some("zuno_pattern_groups") => return RequestKind::ProjectGrouping,
            Some("zuno_eval_step") => return RequestKind::EvaluationStep,
            Some("zuno_eval_grade") => return RequestKind::EvaluationGrade,
            _ => {}
        }
        if system.contains("\"experience_ordinal\"") {
            RequestKind::Extraction
        } else if system.contains("{\"changes\"") {
            RequestKind::MaintenancePlan
        } else if system.contains("{\"groups\"") && global_grouping {
            RequestKind::GlobalGrouping
        } else if system.contains("{\"groups\"") {
            RequestKind::ProjectGrouping
        } else if system.contains("{\"score\"") {
            RequestKind::EvaluationGrade
        } else if system.contains("{\"action\"") {
            RequestKind::EvaluationStep
        } else if framed_sources(body).is_some() {
            RequestKind::Extraction
        } else {
            RequestKind::Unknown
        }
    }
}

/// The schema name of native structured output: Chat `response_format.json_schema.name`,
/// Responses `text.format.name`, or the forced tool of Anthropic Messages.
fn schema_name(body: &Value) -> Option<&str> {
    body.pointer("/response_format/json_schema/name")
        .or_else(|| body.pointer("/text/format/name"))
        .or_else(|| {
            body.get("tool_choice")
                .filter(|choice| choice["type"] == "tool")
                .and_then(|choice| choice.get("name"))
        })
        .and_then(Value::as_str)
}

/// The system prompt: Chat's system message, Responses `instructions` or Anthropic `system`
/// (a string or text blocks); empty when there is none.
fn system_prompt(body: &Value) -> String {
    let text = |value: &Value| match value {
        Value::String(text) => text.clone(),
        Value::Array(blocks) => blocks
            .iter()
            .filter_map(|block| block["text"].as_str())
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    };
    if let Some(system) = body.get("system").or_else(|| body.get("instructions")) {
        return text(system);
    }
    body["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|message| message["role"] == "system" || message["role"] == "developer")
        .map(|message| text(&message["content"]))
        .unwrap_or_default()
}

#[derive(Default)]
struct Script {
    replies: VecDeque<Reply>,
    /// Replies for one kind of request, used before `replies`.
    replies_for: BTreeMap<RequestKind, VecDeque<Reply>>,
    received: Vec<ReceivedRequest>,
    /// Requests received in all (`received` is bounded in auto-answer mode).
    count: usize,
}

#[derive(Clone)]
struct Shared {
    script: Arc<Mutex<Script>>,
    shutdown: CancellationToken,
    /// Answer with [`Reply::auto`] when the script is used up (instead of 500).
    auto: bool,
    /// Milliseconds every request waits before its reply (a provider's own latency).
    delay_ms: Arc<std::sync::atomic::AtomicU64>,
}

/// In auto-answer mode the fake runs as a long-lived service: keep only this many recent
/// requests so memory stays bounded.
const AUTO_MODE_KEPT_REQUESTS: usize = 1000;

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Script> {
        self.script.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A running fake provider; stopped when dropped.
pub struct FakeProvider {
    base_url: String,
    shared: Shared,
    task: tokio::task::JoinHandle<()>,
}

impl FakeProvider {
    /// Binds 127.0.0.1 on a free port and starts serving.
    pub async fn start() -> FakeProvider {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind fake provider");
        FakeProvider::serve(listener, false)
    }

    /// Binds `address` (e.g. `0.0.0.0:8090`) and serves in auto-answer mode: scripted replies
    /// still come first, and every request after them gets [`Reply::auto`]. `GET /healthz`
    /// answers 200 for container health checks.
    pub async fn start_auto(address: &str) -> std::io::Result<FakeProvider> {
        let listener = tokio::net::TcpListener::bind(address).await?;
        Ok(FakeProvider::serve(listener, true))
    }

    fn serve(listener: tokio::net::TcpListener, auto: bool) -> FakeProvider {
        let address = listener.local_addr().expect("fake provider address");
        let shared = Shared {
            script: Arc::default(),
            shutdown: CancellationToken::new(),
            auto,
            delay_ms: Arc::default(),
        };
        let mut app = axum::Router::new();
        if auto {
            app = app.route("/healthz", axum::routing::get(|| async { "ok" }));
        }
        let app = app.fallback(handle).with_state(shared.clone());
        let task =
            crate::serve_until_cancelled(listener, app, shared.shutdown.clone(), "fake provider");
        FakeProvider {
            base_url: format!("http://{address}/v1"),
            shared,
            task,
        }
    }

    /// `http://127.0.0.1:PORT/v1`, the `base_url` to configure.
    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    /// Appends replies to the script.
    pub fn push(&self, replies: impl IntoIterator<Item = Reply>) -> &Self {
        self.shared.lock().replies.extend(replies);
        self
    }

    /// Every request received so far, in arrival order.
    pub fn requests(&self) -> Vec<ReceivedRequest> {
        self.shared.lock().received.clone()
    }

    /// Appends replies to the script of one request kind: a request of that kind takes them
    /// before the shared script.
    pub fn push_for(&self, kind: RequestKind, replies: impl IntoIterator<Item = Reply>) -> &Self {
        self.shared
            .lock()
            .replies_for
            .entry(kind)
            .or_default()
            .extend(replies);
        self
    }

    /// Replies not consumed yet (shared and per kind).
    pub fn remaining(&self) -> usize {
        let script = self.shared.lock();
        script.replies.len()
            + script
                .replies_for
                .values()
                .map(VecDeque::len)
                .sum::<usize>()
    }

    /// How many requests of each kind were received (of those `requests()` still holds).
    pub fn kinds(&self) -> BTreeMap<RequestKind, usize> {
        let mut kinds = BTreeMap::new();
        for request in &self.shared.lock().received {
            *kinds.entry(request.kind()).or_insert(0) += 1;
        }
        kinds
    }

    /// Makes every later request wait `delay` before its reply, as a real model's latency does
    /// (benchmarks whose workers spend their time waiting on the provider).
    pub fn set_delay(&self, delay: Duration) {
        self.shared.delay_ms.store(
            u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
            std::sync::atomic::Ordering::Relaxed,
        );
    }

    /// Requests received since start (in auto-answer mode `requests()` keeps only the latest).
    pub fn request_count(&self) -> usize {
        self.shared.lock().count
    }
}

impl Drop for FakeProvider {
    fn drop(&mut self) {
        // Cancelling releases hanging handlers; aborting does not wait for open connections.
        self.shared.shutdown.cancel();
        self.task.abort();
    }
}

async fn handle(
    State(shared): State<Shared>,
    method: axum::http::Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let request = ReceivedRequest {
        method: method.to_string(),
        path: uri.path().to_owned(),
        headers: header_map(&headers),
        body,
    };
    let (reply, ordinal) = {
        let mut script = shared.lock();
        script.received.push(request.clone());
        script.count += 1;
        if shared.auto && script.received.len() > AUTO_MODE_KEPT_REQUESTS {
            script.received.remove(0);
        }
        let reply = script
            .replies_for
            .get_mut(&request.kind())
            .and_then(VecDeque::pop_front)
            .or_else(|| script.replies.pop_front())
            .or_else(|| shared.auto.then(Reply::auto));
        (reply, script.count)
    };
    let Some(reply) = reply else {
        return error_response(
            StatusCode::INTERNAL_SERVER_ERROR,
            &format!(
                "fake provider: no scripted reply left for {} {} (request {ordinal})",
                request.method, request.path
            ),
        );
    };
    let delay = shared.delay_ms.load(std::sync::atomic::Ordering::Relaxed);
    if delay > 0 {
        tokio::select! {
            () = tokio::time::sleep(Duration::from_millis(delay)) => {}
            () = shared.shutdown.cancelled() => {
                return error_response(StatusCode::SERVICE_UNAVAILABLE, "fake provider stopped");
            }
        }
    }
    let mut reply = reply;
    while let ReplyKind::Held { gate, then } = reply.kind {
        tokio::select! {
            permit = gate.0.acquire() => drop(permit),
            _ = shared.shutdown.cancelled() => {
                return error_response(StatusCode::SERVICE_UNAVAILABLE, "fake provider stopped");
            }
        }
        reply = *then;
    }
    let mut response = match reply.kind {
        ReplyKind::Held { .. } => unreachable!("held replies were released above"),
        ReplyKind::Hang => {
            shared.shutdown.cancelled().await;
            return error_response(StatusCode::SERVICE_UNAVAILABLE, "fake provider stopped");
        }
        ReplyKind::Raw {
            status,
            headers,
            body,
        } => {
            let status = StatusCode::from_u16(status).expect("scripted status");
            let mut response = (status, body).into_response();
            for (name, value) in headers {
                set_header(&mut response, &name, &value);
            }
            response
        }
        ReplyKind::Answer {
            text,
            input_tokens,
            output_tokens,
        } => answer_response(&request, &text, input_tokens, output_tokens, ordinal),
        ReplyKind::Auto => {
            let text = auto_answer(&request.body).to_string();
            answer_response(&request, &text, 100, 20, ordinal)
        }
    };
    for (name, value) in &reply.extra_headers {
        set_header(&mut response, name, value);
    }
    response
}

/// `text` as the called endpoint's success response, or 404 for an endpoint it does not know.
fn answer_response(
    request: &ReceivedRequest,
    text: &str,
    input_tokens: u64,
    output_tokens: u64,
    ordinal: usize,
) -> Response {
    match envelope(request, text, input_tokens, output_tokens, ordinal) {
        Some((request_id_header, envelope)) => {
            let mut response = axum::Json(envelope).into_response();
            set_header(
                &mut response,
                request_id_header,
                &format!("req_fake_{ordinal}"),
            );
            response
        }
        None => error_response(
            StatusCode::NOT_FOUND,
            &format!("fake provider: no endpoint at {}", request.path),
        ),
    }
}

/// The success envelope of the called endpoint, and the header that carries its request id.
fn envelope(
    request: &ReceivedRequest,
    text: &str,
    input_tokens: u64,
    output_tokens: u64,
    ordinal: usize,
) -> Option<(&'static str, Value)> {
    let model = request.body.get("model").cloned().unwrap_or(Value::Null);
    match request.path.as_str() {
        "/v1/chat/completions" => Some((
            "x-request-id",
            json!({
                "id": format!("chatcmpl-fake-{ordinal}"),
                "object": "chat.completion",
                "created": 1_800_000_000,
                "model": model,
                "choices": [{
                    "index": 0,
                    "message": { "role": "assistant", "content": text, "refusal": null },
                    "finish_reason": "stop",
                }],
                "usage": {
                    "prompt_tokens": input_tokens,
                    "completion_tokens": output_tokens,
                    "total_tokens": input_tokens + output_tokens,
                },
            }),
        )),
        "/v1/responses" => Some((
            "x-request-id",
            json!({
                "id": format!("resp_fake_{ordinal}"),
                "object": "response",
                "status": "completed",
                "model": model,
                "output": [
                    { "type": "reasoning", "id": format!("rs_fake_{ordinal}"), "summary": [] },
                    {
                        "type": "message",
                        "id": format!("msg_fake_{ordinal}"),
                        "role": "assistant",
                        "status": "completed",
                        "content": [{ "type": "output_text", "text": text, "annotations": [] }],
                    },
                ],
                "usage": {
                    "input_tokens": input_tokens,
                    "output_tokens": output_tokens,
                    "total_tokens": input_tokens + output_tokens,
                },
            }),
        )),
        "/v1/messages" => {
            // A forced tool call answers through the tool's input, as the real API does; an
            // answer that is not a JSON object cannot be a tool input and stays text.
            let forced_tool = request
                .body
                .get("tool_choice")
                .filter(|choice| choice["type"] == "tool")
                .and_then(|choice| choice["name"].as_str());
            let tool_input = serde_json::from_str::<Value>(text)
                .ok()
                .filter(Value::is_object);
            let (content, stop_reason) = match (forced_tool, tool_input) {
                (Some(name), Some(input)) => (
                    json!([{
                        "type": "tool_use",
                        "id": format!("toolu_fake_{ordinal}"),
                        "name": name,
                        "input": input,
                    }]),
                    "tool_use",
                ),
                _ => (json!([{ "type": "text", "text": text }]), "end_turn"),
            };
            Some((
                "request-id",
                json!({
                    "id": format!("msg_fake_{ordinal}"),
                    "type": "message",
                    "role": "assistant",
                    "model": model,
                    "content": content,
                    "stop_reason": stop_reason,
                    "stop_sequence": null,
                    "usage": { "input_tokens": input_tokens, "output_tokens": output_tokens },
                }),
            ))
        }
        _ => None,
    }
}

/// A valid answer of the request's own kind, derived from the request; deterministic, so the
/// stack's behaviour is repeatable:
/// - extraction: [`extraction_answer`];
/// - maintenance plan: every raw hint in the input becomes the change it proposes, citing its
///   experience (what the no-model rule does);
/// - project grouping: experiences stating the same rule (their resolution, else summary,
///   compared case- and space-insensitively) form one group, continuing an existing pattern
///   that has that rule;
/// - global grouping: promoted patterns with the same rules form one group;
/// - evaluation step: the attempt answers at once; evaluation grade: a pass.
///
/// An unknown request gets an empty object.
pub fn auto_answer(body: &Value) -> Value {
    match RequestKind::of(body) {
        RequestKind::Extraction => extraction_answer(body),
        RequestKind::MaintenancePlan => maintenance_plan_answer(&framed_input(body)),
        RequestKind::ProjectGrouping => project_grouping_answer(&framed_input(body)),
        RequestKind::GlobalGrouping => global_grouping_answer(&framed_input(body)),
        RequestKind::EvaluationStep => json!({
            "action": "answer",
            "answer": "Done: the task was handled as the tools' recorded results allow.",
        }),
        RequestKind::EvaluationGrade => json!({
            "score": 1.0,
            "passed": true,
            "critical": false,
            "reason": "fake provider: every attempt passes",
        }),
        RequestKind::Unknown => json!({}),
    }
}

/// The JSON a worker framed as `<input>…</input>` in the first user message (`Null` without).
fn framed_input(body: &Value) -> Value {
    fn find(value: &Value) -> Option<Value> {
        match value {
            Value::String(text) => {
                let start = text.find("<input>")? + "<input>".len();
                let end = start + text[start..].find("</input>")?;
                serde_json::from_str(text[start..end].trim()).ok()
            }
            Value::Array(items) => items.iter().find_map(find),
            Value::Object(map) => map.values().find_map(find),
            _ => None,
        }
    }
    body.get("messages")
        .or_else(|| body.get("input"))
        .and_then(find)
        .unwrap_or(Value::Null)
}

fn maintenance_plan_answer(input: &Value) -> Value {
    let known: Vec<&str> = input["experiences"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|experience| experience["id"].as_str())
        .collect();
    let changes: Vec<Value> = input["hints"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|hint| {
            hint["experience_id"]
                .as_str()
                .is_some_and(|id| known.contains(&id))
        })
        .take(32)
        .map(|hint| {
            json!({
                "target": hint["target"],
                "action": hint["action"],
                "content": hint["content"],
                "old_text": hint["old_text"],
                "reason": hint["reason"],
                "confidence": 0.8,
                "experience_ids": [hint["experience_id"]],
            })
        })
        .collect();
    json!({ "changes": changes })
}

fn normalized_rule(rule: &str) -> String {
    rule.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .to_lowercase()
}

fn project_grouping_answer(input: &Value) -> Value {
    let mut groups: Vec<(String, Value)> = Vec::new();
    for experience in input["experiences"].as_array().into_iter().flatten() {
        let Some(id) = experience["id"].as_str() else {
            continue;
        };
        let Some(rule) = experience["resolution"]
            .as_str()
            .or_else(|| experience["summary"].as_str())
            .filter(|rule| !rule.trim().is_empty())
        else {
            continue;
        };
        let key = normalized_rule(rule);
        match groups.iter_mut().find(|(existing, _)| *existing == key) {
            Some((_, group)) => group["experience_ids"]
                .as_array_mut()
                .expect("built as an array")
                .push(json!(id)),
            None => {
                let continued = input["patterns"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find(|pattern| {
                        pattern["rules"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .filter_map(Value::as_str)
                            .any(|existing| normalized_rule(existing) == key)
                    })
                    .map(|pattern| pattern["pattern_id"].clone())
                    .unwrap_or(Value::Null);
                let title = experience["title"].as_str().unwrap_or_default().trim();
                let concept = if title.is_empty() { rule.trim() } else { title };
                groups.push((
                    key,
                    json!({
                        "pattern_id": continued,
                        "concept": concept,
                        "rules": [rule.trim()],
                        "experience_ids": [id],
                    }),
                ));
            }
        }
    }
    json!({ "groups": groups.into_iter().map(|(_, group)| group).collect::<Vec<_>>() })
}

fn global_grouping_answer(input: &Value) -> Value {
    let mut groups: Vec<(Vec<String>, Value)> = Vec::new();
    for pattern in input["patterns"].as_array().into_iter().flatten() {
        let Some(id) = pattern["pattern_id"].as_str() else {
            continue;
        };
        let rules: Vec<&str> = pattern["rules"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        if rules.is_empty() {
            continue;
        }
        let key: Vec<String> = rules.iter().map(|rule| normalized_rule(rule)).collect();
        match groups.iter_mut().find(|(existing, _)| *existing == key) {
            Some((_, group)) => group["pattern_ids"]
                .as_array_mut()
                .expect("built as an array")
                .push(json!(id)),
            None => groups.push((
                key,
                json!({
                    "concept": pattern["concept"].as_str().filter(|c| !c.trim().is_empty()).unwrap_or(rules[0]),
                    "rules": rules,
                    "pattern_ids": [id],
                }),
            )),
        }
    }
    json!({ "groups": groups.into_iter().map(|(_, group)| group).collect::<Vec<_>>() })
}

/// A valid extraction answer derived from an extraction request: the `<sources>` JSON framed in
/// the user message is parsed, and the first `user_statement` source becomes one `correction`
/// experience citing its first sentence verbatim (so citation validation accepts it). Without
/// such a source the answer is empty lists, which is also valid.
pub fn extraction_answer(body: &Value) -> Value {
    let statement = framed_sources(body)
        .unwrap_or_default()
        .into_iter()
        .filter(|source| source["verification"] == "user_statement")
        .find_map(|source| {
            let id = source["source_id"].as_str()?.to_owned();
            let excerpt = first_sentence(source["text"].as_str()?)?;
            Some((id, excerpt))
        });
    let Some((source_id, excerpt)) = statement else {
        return json!({ "experiences": [], "memories": [] });
    };
    let title: String = excerpt.chars().take(80).collect();
    json!({
        "experiences": [{
            "kind": "correction",
            "title": format!("User correction: {title}"),
            "summary": format!("The user corrected the agent: {excerpt}"),
            "resolution": null,
            "citations": [{ "source_id": source_id, "excerpt": excerpt }],
            "confidence": 0.8,
        }],
        "memories": [],
    })
}

/// The `sources` array of the first string anywhere in `body` that holds a `<sources>` frame
/// (chat `messages[].content`, Responses `input[]`, Anthropic `messages[]`, plain or as blocks).
fn framed_sources(body: &Value) -> Option<Vec<Value>> {
    match body {
        Value::String(text) => {
            let start = text.find("<sources>")? + "<sources>".len();
            let end = start + text[start..].find("</sources>")?;
            let framed: Value = serde_json::from_str(text[start..end].trim()).ok()?;
            framed.get("sources")?.as_array().cloned()
        }
        Value::Array(items) => items.iter().find_map(framed_sources),
        Value::Object(map) => map.values().find_map(framed_sources),
        _ => None,
    }
}

/// The first sentence of `text`, trimmed, as an exact substring; `None` when it is too short to
/// be a citation (validation wants at least four characters).
fn first_sentence(text: &str) -> Option<String> {
    let end = text
        .char_indices()
        .find(|&(_, c)| matches!(c, '.' | '!' | '?' | '\n' | '。' | '！' | '？'))
        .map_or(text.len(), |(index, c)| index + c.len_utf8());
    let sentence = text[..end].trim();
    (sentence.chars().count() >= 4).then(|| sentence.to_owned())
}

fn error_response(status: StatusCode, message: &str) -> Response {
    (
        status,
        axum::Json(json!({ "error": { "message": message, "type": "fake_provider" } })),
    )
        .into_response()
}

fn set_header(response: &mut Response, name: &str, value: &str) {
    let name = HeaderName::from_bytes(name.as_bytes()).expect("scripted header name");
    let value = HeaderValue::from_str(value).expect("scripted header value");
    response.headers_mut().insert(name, value);
}

fn header_map(headers: &HeaderMap) -> BTreeMap<String, String> {
    let mut map: BTreeMap<String, String> = BTreeMap::new();
    for (name, value) in headers {
        let value = String::from_utf8_lossy(value.as_bytes()).into_owned();
        map.entry(name.as_str().to_owned())
            .and_modify(|joined| {
                joined.push_str(", ");
                joined.push_str(&value);
            })
            .or_insert(value);
    }
    map
}

/// A VCR cassette as pydantic-ai records them.
#[derive(Debug, Deserialize)]
struct Cassette {
    interactions: Vec<Interaction>,
}

#[derive(Debug, Deserialize)]
struct Interaction {
    response: RecordedResponse,
}

#[derive(Debug, Deserialize)]
struct RecordedResponse {
    status: RecordedStatus,
    #[serde(default)]
    headers: BTreeMap<String, Vec<String>>,
    /// JSON bodies are recorded parsed.
    #[serde(default)]
    parsed_body: Option<Value>,
    /// Other bodies verbatim.
    #[serde(default)]
    body: Option<RecordedBody>,
}

#[derive(Debug, Deserialize)]
struct RecordedStatus {
    code: u16,
}

#[derive(Debug, Deserialize)]
struct RecordedBody {
    string: String,
}

/// Headers describing the recorded transfer, not the response; the server sets its own.
const TRANSFER_HEADERS: [&str; 4] = [
    "content-length",
    "transfer-encoding",
    "connection",
    "content-encoding",
];

impl RecordedResponse {
    fn into_reply(self) -> Reply {
        let body = match (self.parsed_body, self.body) {
            (Some(parsed), _) => parsed.to_string(),
            (None, Some(raw)) => raw.string,
            (None, None) => String::new(),
        };
        let headers = self
            .headers
            .into_iter()
            .filter(|(name, _)| !TRANSFER_HEADERS.contains(&name.to_ascii_lowercase().as_str()))
            .filter_map(|(name, values)| Some((name, values.into_iter().next()?)))
            .collect();
        Reply::from_kind(ReplyKind::Raw {
            status: self.status.code,
            headers,
            body,
        })
    }
}

fn load_cassette(cassette: &str) -> Cassette {
    let path = corpus_dir().join("provider-fixtures").join(cassette);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|error| panic!("read cassette {}: {error}", path.display()));
    serde_yaml_ng::from_str(&text)
        .unwrap_or_else(|error| panic!("parse cassette {}: {error}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use zuno_shared::learning::extraction::ExtractionOutput;
    use zuno_shared::learning::manifest::{SourceKind, SourceRecord, Verification, finish};

    fn record(id: &str, verification: Verification, text: &str) -> SourceRecord {
        SourceRecord {
            source_id: id.into(),
            address: format!("message:m:part:{id}"),
            message_id: Some("m".into()),
            part_ordinal: Some(0),
            kind: SourceKind::UserText,
            verification,
            text: text.into(),
            raw_digest: "raw".into(),
            redacted_digest: "red".into(),
            clipped: false,
            context: false,
        }
    }

    /// The auto answer to the real prompt passes the real validation with a verified citation.
    #[test]
    fn auto_answer_cites_the_first_user_statement_verbatim() {
        let manifest = finish(vec![
            record("S1", Verification::AssistantClaim, "I will use npm."),
            record(
                "S2",
                Verification::UserStatement,
                "  No, use pnpm, not npm! It keeps the lockfile.",
            ),
        ]);
        let (system, user) = zuno_worker_extract::prompt::build(&manifest, false);
        let body = json!({ "messages": [
            { "role": "system", "content": system },
            { "role": "user", "content": user },
        ]});
        let answer: ExtractionOutput = serde_json::from_value(auto_answer(&body)).unwrap();
        assert_eq!(answer.experiences.len(), 1);
        let citation = &answer.experiences[0].citations[0];
        assert_eq!(
            (citation.source_id.as_str(), citation.excerpt.as_str()),
            ("S2", "No, use pnpm, not npm!")
        );
        let checked = zuno_shared::learning::validate::validate(&answer, &manifest).unwrap();
        assert!(checked.experiences[0].verified, "{checked:?}");
    }

    #[test]
    fn auto_answer_is_empty_without_a_user_statement() {
        let manifest = finish(vec![record("S1", Verification::ToolSucceeded, "ok")]);
        let (_, user) = zuno_worker_extract::prompt::build(&manifest, true);
        let body = json!({ "input": [{ "role": "user", "content": user }] });
        assert_eq!(
            auto_answer(&body),
            json!({ "experiences": [], "memories": [] })
        );
        assert_eq!(
            extraction_answer(&json!({ "messages": [] })),
            json!({ "experiences": [], "memories": [] })
        );
    }

    /// A native schema name decides; without one the system prompt's answer shape does, on
    /// each wire format's own place for it.
    #[test]
    fn request_kinds_are_read_from_the_schema_name_or_the_system_prompt() {
        let anthropic = json!({
            "system": "anything",
            "tool_choice": { "type": "tool", "name": "zuno_memory_plan" },
            "messages": [],
        });
        assert_eq!(RequestKind::of(&anthropic), RequestKind::MaintenancePlan);
        let responses = json!({
            "instructions": "Answer with one JSON object: {\"groups\": [{\"concept\", \"rules\": [], \"pattern_ids\": []}]}.",
            "text": { "format": { "type": "json_schema", "name": "zuno_pattern_groups" } },
        });
        assert_eq!(RequestKind::of(&responses), RequestKind::GlobalGrouping);
        let chat = |system: &str| {
            json!({ "messages": [
                { "role": "system", "content": system },
                { "role": "user", "content": "<input>\n{}\n</input>" },
            ]})
        };
        assert_eq!(
            RequestKind::of(&chat(
                "Answer with one JSON object: {\"groups\": [{\"pattern_id\": null}]}"
            )),
            RequestKind::ProjectGrouping
        );
        assert_eq!(
            RequestKind::of(&chat("Answer with one JSON object: {\"score\": <0..1>}")),
            RequestKind::EvaluationGrade
        );
        assert_eq!(
            RequestKind::of(&chat("each step, answer with {\"action\": \"call\"}")),
            RequestKind::EvaluationStep
        );
        assert_eq!(RequestKind::of(&chat("Hello")), RequestKind::Unknown);
        let (system, user) = zuno_worker_extract::prompt::build(&finish(vec![]), false);
        assert_eq!(
            RequestKind::of(
                &json!({ "system": system, "messages": [{ "role": "user", "content": user }] })
            ),
            RequestKind::Extraction
        );
    }

    #[test]
    fn default_answers_cite_only_given_ids() {
        let plan = maintenance_plan_answer(&json!({
            "experiences": [{ "id": "exp_a" }],
            "hints": [
                { "experience_id": "exp_a", "target": "project", "action": "add", "content": "Use pnpm.", "old_text": null, "reason": "user rule" },
                { "experience_id": "exp_gone", "target": "project", "action": "add", "content": "x", "old_text": null, "reason": "r" },
            ],
        }));
        assert_eq!(plan["changes"].as_array().unwrap().len(), 1, "{plan}");
        assert_eq!(plan["changes"][0]["experience_ids"], json!(["exp_a"]));
        let groups = project_grouping_answer(&json!({
            "experiences": [
                { "id": "exp_a", "title": "pnpm", "summary": "Use  pnpm.", "resolution": null },
                { "id": "exp_b", "title": "pnpm again", "summary": "use pnpm.", "resolution": null },
                { "id": "exp_c", "title": "uv", "summary": "Use uv.", "resolution": null },
            ],
            "patterns": [{ "pattern_id": "pat_1", "concept": "uv", "rules": ["use UV."] }],
        }));
        assert_eq!(
            groups,
            json!({ "groups": [
                { "pattern_id": null, "concept": "pnpm", "rules": ["Use  pnpm."], "experience_ids": ["exp_a", "exp_b"] },
                { "pattern_id": "pat_1", "concept": "uv", "rules": ["Use uv."], "experience_ids": ["exp_c"] },
            ]})
        );
        let global = global_grouping_answer(&json!({ "patterns": [
            { "pattern_id": "pat_1", "project": "a", "concept": "pnpm", "rules": ["Use pnpm."] },
            { "pattern_id": "pat_2", "project": "b", "concept": "pnpm too", "rules": ["use  pnpm."] },
        ]}));
        assert_eq!(
            global,
            json!({ "groups": [{ "concept": "pnpm", "rules": ["Use pnpm."], "pattern_ids": ["pat_1", "pat_2"] }] })
        );
    }

    /// Replies scripted for one kind answer only requests of that kind, before the shared
    /// script; the rest of the requests take the shared script in order.
    #[tokio::test]
    async fn replies_scripted_for_a_kind_answer_only_that_kind() {
        let provider = FakeProvider::start().await;
        provider.push_for(
            RequestKind::MaintenancePlan,
            [Reply::answer(r#"{"changes": []}"#)],
        );
        provider.push([Reply::answer("shared")]);
        let http = reqwest::Client::new();
        let ask = |system: &'static str| {
            let http = http.clone();
            let url = format!("{}/chat/completions", provider.base_url());
            async move {
                let body: Value = http
                    .post(url)
                    .json(&json!({ "model": "m", "messages": [{ "role": "system", "content": system }] }))
                    .send()
                    .await
                    .unwrap()
                    .json()
                    .await
                    .unwrap();
                body["choices"][0]["message"]["content"].clone()
            }
        };
        assert_eq!(ask("Answer: {\"score\": 1}").await, json!("shared"));
        assert_eq!(
            ask("Answer with one JSON object: {\"changes\": []}").await,
            json!(r#"{"changes": []}"#)
        );
        assert_eq!(provider.remaining(), 0);
        assert_eq!(
            provider.kinds(),
            BTreeMap::from([
                (RequestKind::MaintenancePlan, 1),
                (RequestKind::EvaluationGrade, 1)
            ])
        );
    }
}
