//! The learning model client: one JSON answer from the configured provider, within one
//! deadline, with typed failures.
//!
//! # Shape
//!
//! - [`resolve_model`] (`&Config`, the session model; a [`ResolvedModel`] or
//!   [`ModelUnavailable`]) picks the model (`learning.extractor_model`, else the active
//!   provider's `small_model`, else the session model) and its effective request parameters. It
//!   never substitutes a model.
//! - [`LearningModelClient::complete_json`]`(&model, &`[`LearningRequest`]`, timeout)` sends the
//!   request and returns a [`LearningResponse`] (the decoded JSON `value`, the raw answer text,
//!   [`Usage`] summed over every request, the provider request id, whether the answer was
//!   repaired, and how many HTTP requests were sent) or a [`ProviderFailure`] (a
//!   [`ProviderError`] plus the usage and request count spent before failing).
//!   [`LearningModelClient::complete_validated`] adds a caller validator (typically "does it
//!   deserialize into my type"), whose failure also triggers the repair.
//! - [`LearningModelClient::receipt`] describes a request for durable events: parameters,
//!   prompt and digest, response contract, no tools, header names only.
//! - [`parse_retry_after`] reads a provider's requested wait.
//!
//! # Behaviour
//!
//! - Wire formats: Chat Completions (`POST {base}/chat/completions`), Responses
//!   (`POST {base}/responses`), Anthropic Messages (`POST {base}/messages`, `x-api-key`,
//!   `anthropic-version: 2023-06-01`).
//! - Command lines: `claude_cli` and `codex_cli` run the agent's own CLI headless instead of an
//!   HTTP request (provider/cli.rs lists what each relies on). Decoding, the repair, the
//!   deadline (the child is killed) and usage accounting are the same; the CLI retries its own
//!   transient failures, so no in-call retry is added.
//! - Parameters: the model's `params` go into the body as given, except client-owned fields
//!   (conversation, `stream`, tools, response format), token-limit aliases, and sampling
//!   parameters when the model does not support sampling. No temperature is ever added.
//! - Output limit: exactly one field (`max_tokens` for chat and Anthropic — or
//!   `max_completion_tokens` when the chat model is configured with that spelling —
//!   `max_output_tokens` for Responses) carrying the smallest applicable limit
//!   ([`effective_output_limit`]).
//! - Structured output: native JSON-schema output (chat `response_format`, Responses
//!   `text.format`, Anthropic forced tool) only when `learning.execution.structured_output`
//!   is on and the model supports it; otherwise nothing native is sent, the caller's prompt
//!   carries the schema, and the answer is decoded locally (a ```json fence is tolerated).
//! - Repair: an answer that is not JSON, not of the schema's top-level shape, or rejected by
//!   the validator gets exactly one follow-up request (the conversation, the bad answer and a
//!   short instruction). A second bad answer is [`ProviderError::MalformedAnswer`].
//! - Deadline: everything (retries, backoff sleeps, the repair) finishes within `timeout` or
//!   fails with [`ProviderError::Timeout`].
//! - Retries: transient failures (408/409/5xx/529, network) and 429s are retried with
//!   exponential backoff (`backon`); a provider's Retry-After replaces the backoff delay. A
//!   wait that would not end before the deadline is not taken: the error is returned (for a
//!   429 with its `retry_at`, so the job can be rescheduled). Permanent failures return at once.
//! - Credentials: header values are read from the environment (or the lookup given to
//!   [`LearningModelClient::with_env`]) at request time; a missing variable is
//!   [`ProviderError::MissingCredential`] naming the variable. Values never reach receipts or
//!   diagnostics: diagnostics are redacted (including the exact values sent) and clipped.

mod answer;
mod cli;
mod embed;
mod error;
mod resolve;
mod wire;

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use crate::config::ProviderApi;
use backon::{ExponentialBuilder, Retryable};
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tokio::time::Instant;

pub use cli::{CHILD_ENV, CLI_DEFAULT_MODEL};
pub use embed::EmbeddingClient;
pub use error::{
    Diagnostic, MAX_MESSAGE_CHARS, ProviderError, ProviderFailure, parse_retry_after,
    retry_after_from_headers, retry_after_from_text,
};
pub use resolve::{
    LIMIT_ALIASES, ModelSource, ModelUnavailable, ResolvedModel, SAMPLING_PARAMS,
    effective_output_limit, resolve_model,
};

use wire::Turn;

/// The Anthropic API version learning speaks.
pub const ANTHROPIC_VERSION: &str = "2023-06-01";

/// What learning asks the model: a system prompt, a user prompt, and the JSON schema the
/// answer must follow (named, for native structured output).
#[derive(Debug, Clone, PartialEq)]
pub struct LearningRequest {
    pub system: String,
    pub user: String,
    /// `^[A-Za-z0-9_-]{1,64}$`: OpenAI and Anthropic use it as a schema / tool name.
    pub schema_name: String,
    pub schema: Value,
}

/// Provider-reported token counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub input_tokens: u64,
    pub output_tokens: u64,
}

impl Usage {
    pub fn total(&self) -> u64 {
        self.input_tokens.saturating_add(self.output_tokens)
    }
}

impl std::ops::AddAssign for Usage {
    fn add_assign(&mut self, other: Usage) {
        self.input_tokens = self.input_tokens.saturating_add(other.input_tokens);
        self.output_tokens = self.output_tokens.saturating_add(other.output_tokens);
    }
}

/// A usable answer.
#[derive(Debug, Clone, PartialEq)]
pub struct LearningResponse {
    /// The decoded answer; it passed the top-level shape check and the caller's validator.
    pub value: Value,
    /// The answer text it was decoded from (for a forced Anthropic tool, its input as JSON).
    pub raw_text: String,
    /// Summed over every request of the call, retries and repair included.
    pub usage: Usage,
    /// The last request id a provider response carried.
    pub provider_request_id: Option<String>,
    /// Whether the first answer was malformed and this one came from the repair request.
    pub repaired: bool,
    /// HTTP requests sent.
    pub requests: u32,
}

pub(crate) type EnvLookup = Arc<dyn Fn(&str) -> Option<String> + Send + Sync>;

/// Calls learning models. Cheap to clone (the HTTP connection pool is shared).
#[derive(Clone)]
pub struct LearningModelClient {
    http: reqwest::Client,
    env: EnvLookup,
    backoff: ExponentialBuilder,
}

impl std::fmt::Debug for LearningModelClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LearningModelClient")
            .field("backoff", &self.backoff)
            .finish_non_exhaustive()
    }
}

impl Default for LearningModelClient {
    fn default() -> Self {
        Self::new()
    }
}

impl LearningModelClient {
    /// A client reading credentials from the process environment.
    ///
    /// # Panics
    ///
    /// As [`reqwest::Client::new`]: when the TLS backend cannot be initialised. Use
    /// [`LearningModelClient::with_http_client`] to handle that case.
    pub fn new() -> Self {
        Self::with_http_client(reqwest::Client::new())
    }

    pub fn with_http_client(http: reqwest::Client) -> Self {
        LearningModelClient {
            http,
            env: Arc::new(|name| std::env::var(name).ok()),
            backoff: ExponentialBuilder::new()
                .with_min_delay(Duration::from_millis(500))
                .with_max_delay(Duration::from_secs(10))
                .with_max_times(4)
                .with_jitter(),
        }
    }

    /// Replaces the environment lookup for header values (tests inject values this way
    /// instead of mutating the process environment).
    pub fn with_env<F>(mut self, lookup: F) -> Self
    where
        F: Fn(&str) -> Option<String> + Send + Sync + 'static,
    {
        self.env = Arc::new(lookup);
        self
    }

    /// Changes the in-call retry backoff: exponential from `min_delay` to `max_delay`, at most
    /// `max_retries` retries per request. The deadline bounds it regardless.
    pub fn with_retry_delays(
        mut self,
        min_delay: Duration,
        max_delay: Duration,
        max_retries: usize,
    ) -> Self {
        self.backoff = ExponentialBuilder::new()
            .with_min_delay(min_delay)
            .with_max_delay(max_delay)
            .with_max_times(max_retries)
            .with_jitter();
        self
    }

    /// One JSON answer whose top level matches `request.schema` (type, required keys).
    pub async fn complete_json(
        &self,
        model: &ResolvedModel,
        request: &LearningRequest,
        timeout: Duration,
    ) -> Result<LearningResponse, ProviderFailure> {
        self.complete_validated(model, request, timeout, |_| Ok(()))
            .await
    }

    /// Like [`complete_json`](Self::complete_json), with `validate` as a further acceptance
    /// test (e.g. deserializing into the caller's type). An `Err` from it counts as a
    /// malformed answer: it triggers the one repair, and its message goes to the model.
    pub async fn complete_validated<V>(
        &self,
        model: &ResolvedModel,
        request: &LearningRequest,
        timeout: Duration,
        validate: V,
    ) -> Result<LearningResponse, ProviderFailure>
    where
        V: Fn(&Value) -> Result<(), String> + Sync,
    {
        let deadline = Instant::now() + timeout;
        let tally = Tally::default();
        let call = Call {
            client: self,
            model,
            request,
            deadline,
            timeout,
            tally: &tally,
        };
        let outcome = tokio::time::timeout_at(deadline, call.run(&validate)).await;
        let spent = tally.snapshot();
        let error = match outcome {
            Ok(Ok((value, raw_text, repaired))) => {
                return Ok(LearningResponse {
                    value,
                    raw_text,
                    usage: spent.usage,
                    provider_request_id: spent.request_id,
                    repaired,
                    requests: spent.requests,
                });
            }
            Ok(Err(error)) => error,
            Err(_elapsed) => ProviderError::Timeout { deadline: timeout },
        };
        Err(ProviderFailure {
            error,
            usage: spent.usage,
            requests: spent.requests,
            provider_request_id: spent.request_id,
        })
    }

    /// A description of the request `complete_json` would send first, for durable events:
    /// a fresh `requestId`, provider, model, API, the exact body fields except the
    /// conversation (`parameters`), the exact prompt and its SHA-256 (`promptSha256`, over the
    /// compact JSON of `prompt`), the response contract, `tools: []` (the extractor has no
    /// tools; Anthropic's forced answer tool is part of `parameters` and the contract), and the
    /// names of the headers sent — never their values.
    pub fn receipt(model: &ResolvedModel, request: &LearningRequest) -> Value {
        let parameters = receipt_parameters(model, request);
        let prompt = json!({ "system": request.system, "user": request.user });
        let mode = match (model.native_structured_output, model.api) {
            (true, ProviderApi::AnthropicMessages) => "native_tool",
            (true, ProviderApi::OpenaiChat | ProviderApi::OpenaiResponses) => "native_schema",
            _ => "prompt",
        };
        json!({
            "requestId": uuid::Uuid::new_v4().to_string(),
            "provider": model.provider,
            "model": model.model,
            "modelSource": model.source.as_str(),
            "api": model.api,
            "endpoint": wire::endpoint(model.api),
            "parameters": parameters,
            "prompt": prompt,
            "promptSha256": sha256_hex(prompt.to_string().as_bytes()),
            "responseContract": {
                "schemaName": request.schema_name,
                "mode": mode,
                "schemaSha256": sha256_hex(request.schema.to_string().as_bytes()),
            },
            "tools": [],
            "headerNames": model.header_names(),
        })
    }

    /// The headers for `model`, with their values read now, and those values as secrets to
    /// scrub from diagnostics.
    fn prepare_headers(&self, model: &ResolvedModel) -> Result<Prepared, ProviderError> {
        let mut headers = HeaderMap::new();
        let mut secrets = Vec::new();
        let read = |variable: &str| {
            (self.env)(variable)
                .filter(|value| !value.is_empty())
                .ok_or_else(|| ProviderError::MissingCredential {
                    variable: variable.to_owned(),
                })
        };
        if let Some(variable) = &model.credentials.api_key_env {
            let key = read(variable)?;
            match model.api {
                ProviderApi::AnthropicMessages => insert_header(&mut headers, "x-api-key", &key)?,
                _ => insert_header(&mut headers, "authorization", &format!("Bearer {key}"))?,
            }
            secrets.push(key);
        }
        if model.api == ProviderApi::AnthropicMessages {
            insert_header(&mut headers, "anthropic-version", ANTHROPIC_VERSION)?;
        }
        // Configured headers come last so they may override the version header.
        for (name, variable) in &model.credentials.header_envs {
            let value = read(variable)?;
            insert_header(&mut headers, name, &value)?;
            secrets.push(value);
        }
        Ok(Prepared { headers, secrets })
    }
}

/// A receipt's `parameters`: the body without the conversation, or for a command-line kind the
/// command and its arguments without the system prompt (which the receipt keeps as `prompt`).
fn receipt_parameters(
    model: &ResolvedModel,
    request: &LearningRequest,
) -> serde_json::Map<String, Value> {
    if model.api.is_cli() {
        let mut parameters = serde_json::Map::new();
        parameters.insert(String::from("model"), Value::from(model.model.as_str()));
        parameters.insert(String::from("command"), json!(model.command));
        parameters.insert(String::from("args"), json!(cli::args(model, None)));
        return parameters;
    }
    let mut parameters = match wire::build_body(model, request, &[]) {
        Value::Object(map) => map,
        _ => serde_json::Map::new(),
    };
    for key in wire::conversation_keys(model.api) {
        parameters.remove(*key);
    }
    parameters
}

/// Inserts a header whose value is treated as sensitive (kept out of `Debug` output).
fn insert_header(headers: &mut HeaderMap, name: &str, value: &str) -> Result<(), ProviderError> {
    let invalid = || ProviderError::InvalidHeader {
        name: name.to_owned(),
    };
    let header = HeaderName::from_bytes(name.as_bytes()).map_err(|_| invalid())?;
    let mut value = HeaderValue::from_str(value).map_err(|_| invalid())?;
    value.set_sensitive(true);
    headers.insert(header, value);
    Ok(())
}

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

struct Prepared {
    headers: HeaderMap,
    /// Header values sent, scrubbed from any diagnostic text.
    secrets: Vec<String>,
}

/// How a call reaches its model: HTTP requests with these headers, or the command line.
enum Transport {
    Http(Prepared),
    Cli,
}

/// What a call has spent so far, kept outside the call's future so a deadline that drops the
/// future mid-request still reports it.
#[derive(Default)]
struct Tally(Mutex<Spent>);

#[derive(Debug, Clone, Default)]
struct Spent {
    requests: u32,
    usage: Usage,
    request_id: Option<String>,
}

impl Tally {
    fn update(&self, change: impl FnOnce(&mut Spent)) {
        change(&mut self.0.lock().unwrap_or_else(PoisonError::into_inner));
    }

    fn snapshot(&self) -> Spent {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// One `complete_*` call in progress.
struct Call<'a> {
    client: &'a LearningModelClient,
    model: &'a ResolvedModel,
    request: &'a LearningRequest,
    deadline: Instant,
    timeout: Duration,
    tally: &'a Tally,
}

impl Call<'_> {
    /// The first request and, when its answer is unusable, the one repair. Returns the value,
    /// its raw text, and whether it came from the repair.
    async fn run<V>(&self, validate: &V) -> Result<(Value, String, bool), ProviderError>
    where
        V: Fn(&Value) -> Result<(), String> + Sync,
    {
        let transport = match self.model.api.is_cli() {
            true => Transport::Cli,
            false => Transport::Http(self.client.prepare_headers(self.model)?),
        };
        let first = self.ask(&transport, &[]).await?;
        let problem = match self.accept(&first, validate) {
            Ok(value) => return Ok((value, first.text, false)),
            Err(problem) => problem,
        };
        let bad_answer = if first.text.trim().is_empty() {
            // Anthropic rejects empty assistant turns; say what happened instead.
            String::from("(no answer text)")
        } else {
            first.text
        };
        let turns = [
            Turn::Assistant(bad_answer),
            Turn::User(format!(
                "Your previous answer could not be used: {}. Reply again with only one valid \
                 JSON value matching the `{}` schema: no prose, no Markdown fences.",
                error::clip(&problem, 300),
                self.request.schema_name,
            )),
        ];
        let second = self.ask(&transport, &turns).await?;
        match self.accept(&second, validate) {
            Ok(value) => Ok((value, second.text, true)),
            Err(problem) => Err(ProviderError::MalformedAnswer {
                detail: error::clip(&problem, MAX_MESSAGE_CHARS),
            }),
        }
    }

    fn accept<V>(&self, answer: &wire::Answer, validate: &V) -> Result<Value, String>
    where
        V: Fn(&Value) -> Result<(), String>,
    {
        let value = match &answer.structured {
            Some(value) => value.clone(),
            None => answer::decode_json(&answer.text)?,
        };
        answer::check_top_level(&self.request.schema, &value)?;
        validate(&value)?;
        Ok(value)
    }

    /// One answer: an HTTP request (with its retries) or one run of the command line. A
    /// command line retries its own transient failures, so its failures are not retried here.
    async fn ask(
        &self,
        transport: &Transport,
        turns: &[Turn],
    ) -> Result<wire::Answer, ProviderError> {
        let Transport::Http(prepared) = transport else {
            self.tally.update(|spent| spent.requests += 1);
            let outcome = cli::run(self.model, self.request, turns, &self.client.env).await?;
            self.tally.update(|spent| {
                spent.usage += outcome.usage;
                if let Some(id) = outcome.request_id {
                    spent.request_id = Some(id);
                }
            });
            return outcome.answer;
        };
        self.send(prepared, turns).await
    }

    /// One logical request, retried on transient failures while the wait fits the deadline.
    async fn send(
        &self,
        prepared: &Prepared,
        turns: &[Turn],
    ) -> Result<wire::Answer, ProviderError> {
        let body = wire::build_body(self.model, self.request, turns);
        let url = format!("{}{}", self.model.base_url, wire::endpoint(self.model.api));
        let attempt = || self.attempt(&url, prepared, &body);
        attempt
            .retry(self.client.backoff)
            .when(ProviderError::is_transient)
            .adjust(|error, backoff| {
                // `None` = the retry budget is spent, whatever the provider asks. Otherwise the
                // provider's own wait beats our guess; either must end before the deadline or
                // the error is returned as is (a 429 then carries its retry_at).
                let wait = error.retry_after().unwrap_or(backoff?);
                let remaining = self.deadline.saturating_duration_since(Instant::now());
                (wait < remaining).then_some(wait)
            })
            .notify(|error, wait| {
                tracing::debug!(
                    provider = %self.model.provider,
                    model = %self.model.model,
                    retry.delay_ms = wait.as_millis() as u64,
                    error = %error,
                    "retrying learning model request",
                );
            })
            .await
    }

    /// One HTTP request.
    async fn attempt(
        &self,
        url: &str,
        prepared: &Prepared,
        body: &Value,
    ) -> Result<wire::Answer, ProviderError> {
        let remaining = self.deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            return Err(ProviderError::Timeout {
                deadline: self.timeout,
            });
        }
        self.tally.update(|spent| spent.requests += 1);
        let transport = |error: reqwest::Error| self.transport_error(error, &prepared.secrets);
        let response = self
            .client
            .http
            .post(url)
            .headers(prepared.headers.clone())
            .json(body)
            .timeout(remaining)
            .send()
            .await
            .map_err(transport)?;
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let bytes = response.bytes().await.map_err(transport)?;
        let received_at = SystemTime::now();
        let secrets = &prepared.secrets;
        if !(200..300).contains(&status) {
            let failure = error::classify(status, &headers, &bytes, secrets, received_at);
            if let Some(id) = failure.diagnostic().and_then(|d| d.request_id.clone()) {
                self.tally.update(|spent| spent.request_id = Some(id));
            }
            return Err(failure);
        }
        let Ok(parsed) = serde_json::from_slice::<Value>(&bytes) else {
            return Err(error::invalid_response(
                status,
                &headers,
                &bytes,
                secrets,
                "the response body is not JSON",
            ));
        };
        if let Some(id) = error::request_id(&headers, Some(&parsed)) {
            self.tally.update(|spent| spent.request_id = Some(id));
        }
        // Some gateways (OpenRouter) report upstream failures in-band with a 200.
        if parsed.get("error").is_some_and(Value::is_object) {
            let in_band = parsed["error"]
                .get("code")
                .and_then(Value::as_u64)
                .and_then(|code| u16::try_from(code).ok())
                .filter(|code| (400..600).contains(code))
                .unwrap_or(502);
            return Err(error::classify(
                in_band,
                &headers,
                &bytes,
                secrets,
                received_at,
            ));
        }
        let Some(answer) = wire::read_answer(self.model.api, &self.request.schema_name, &parsed)
        else {
            return Err(error::invalid_response(
                status,
                &headers,
                &bytes,
                secrets,
                "the response is not in the configured API's format",
            ));
        };
        self.tally.update(|spent| spent.usage += answer.usage);
        Ok(answer)
    }

    fn transport_error(&self, error: reqwest::Error, secrets: &[String]) -> ProviderError {
        if error.is_timeout() {
            return ProviderError::Timeout {
                deadline: self.timeout,
            };
        }
        let error = error.without_url();
        let mut message = error.to_string();
        let mut source = std::error::Error::source(&error);
        while let Some(cause) = source {
            message.push_str(": ");
            message.push_str(&cause.to_string());
            source = cause.source();
        }
        ProviderError::Network {
            message: error::clean_message(&message, secrets),
        }
    }
}
