//! The client the `zuno` subcommands use to reach the API: over HTTP when a server is
//! configured (`--server` or `ZUNO_SERVER_URL`), else the same router served in-process over
//! the local database, so both paths run exactly the route code (ingestion, admission, memory).

use std::time::Duration;

use axum::body::Body;
use serde_json::Value;
use tower::ServiceExt;

use crate::error::CliError;
use crate::global::GlobalArgs;
use crate::global::open_local;
#[cfg(doc)]
use crate::server::Server;

/// Where the API lives.
#[derive(Debug, Clone, clap::Args)]
pub struct ServerArgs {
    /// A running Zuno server (default: the local database directly).
    #[arg(long, global = true, env = "ZUNO_SERVER_URL")]
    pub server: Option<String>,
    /// Bearer token for the server (default: for a server on this machine, the local token in
    /// the data directory).
    #[arg(long, global = true, env = "ZUNO_API_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
}

/// Whether a server URL names this machine's loopback interface.
pub fn is_loopback_url(base: &str) -> bool {
    let rest = base
        .strip_prefix("http://")
        .or_else(|| base.strip_prefix("https://"))
        .unwrap_or(base);
    let authority = rest.split(['/', '?', '#']).next().unwrap_or(rest);
    let host = match authority.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(v6),
        None => authority
            .rsplit_once(':')
            .map_or(authority, |(host, _)| host),
    };
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// The token to send to `server`: the one given (`--token`, `ZUNO_API_TOKEN`), else, for a
/// server on this machine, the local token the server generated in the data directory. The
/// local token is never sent anywhere else.
pub fn token_for(
    global: &GlobalArgs,
    server: &str,
    given: Option<&str>,
) -> Result<Option<String>, CliError> {
    if let Some(token) = given.map(str::trim).filter(|token| !token.is_empty()) {
        return Ok(Some(token.to_owned()));
    }
    if !is_loopback_url(server) {
        return Ok(None);
    }
    let settings = global.settings()?;
    zuno_shared::tokens::local::read(&settings.paths)
        .map_err(|error| CliError::new(CliError::BAD_INPUT, error.to_string()))
}

/// A failed API call, classified for exit codes.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The server (or the local database) could not be reached.
    #[error("server unavailable: {0}")]
    Unavailable(String),
    /// The API answered with a problem document.
    #[error("{detail} ({code}, HTTP {status})")]
    Problem {
        status: u16,
        code: String,
        detail: String,
        body: Value,
    },
    #[error("unexpected answer from the server: {0}")]
    Protocol(String),
}

impl ClientError {
    pub fn exit_code(&self) -> u8 {
        match self {
            ClientError::Unavailable(_) => CliError::UNAVAILABLE,
            ClientError::Problem { status, .. } => match status {
                400 | 413 | 415 | 422 | 431 => CliError::BAD_INPUT,
                404 => CliError::NOT_FOUND,
                409 | 412 => CliError::CONFLICT,
                502..=504 => CliError::UNAVAILABLE,
                _ => CliError::FAILURE,
            },
            ClientError::Protocol(_) => CliError::FAILURE,
        }
    }

    pub fn status(&self) -> Option<u16> {
        match self {
            ClientError::Problem { status, .. } => Some(*status),
            _ => None,
        }
    }
}

impl From<ClientError> for CliError {
    fn from(error: ClientError) -> CliError {
        CliError::new(error.exit_code(), error.to_string())
    }
}

#[derive(Clone)]
enum Transport {
    Remote {
        base: String,
        token: Option<String>,
        http: reqwest::Client,
    },
    Local(axum::Router),
}

/// A JSON client of the `/api` routes.
#[derive(Clone)]
pub struct ApiClient {
    transport: Transport,
}

impl ApiClient {
    /// Connects to `server` when given, else opens the local database and serves the router
    /// in-process.
    pub async fn connect(global: &GlobalArgs, server: &ServerArgs) -> Result<ApiClient, CliError> {
        match &server.server {
            Some(base) => Ok(ApiClient::remote(
                base,
                token_for(global, base, server.token.as_deref())?,
                Duration::from_secs(30),
            )?),
            None => ApiClient::local(global).await,
        }
    }

    /// A client of a router served in-process (authenticated as its state allows: a state built
    /// without a server token treats every caller as the local user).
    pub fn in_process(router: axum::Router) -> ApiClient {
        ApiClient {
            transport: Transport::Local(router),
        }
    }

    pub fn remote(
        base: &str,
        token: Option<String>,
        timeout: Duration,
    ) -> Result<ApiClient, CliError> {
        let base = base.trim_end_matches('/').to_owned();
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            return Err(CliError::new(
                CliError::BAD_INPUT,
                format!("--server must be an http:// or https:// URL, not `{base}`"),
            ));
        }
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout.min(Duration::from_secs(5)))
            .build()
            .map_err(|error| CliError::new(CliError::FAILURE, error.to_string()))?;
        Ok(ApiClient {
            transport: Transport::Remote { base, token, http },
        })
    }

    /// The router over the local database, in this process (see [`Server::local_router`]).
    pub async fn local(global: &GlobalArgs) -> Result<ApiClient, CliError> {
        let settings = global.settings()?;
        let db = open_local(&settings).await?;
        let router = global.server()?.local_router(
            std::sync::Arc::new(settings.config.clone()),
            db,
            settings.paths.clone(),
        );
        Ok(ApiClient::in_process(router))
    }

    pub fn is_remote(&self) -> bool {
        matches!(self.transport, Transport::Remote { .. })
    }

    pub async fn get(&self, path: &str) -> Result<Value, ClientError> {
        self.call(reqwest::Method::GET, path, None).await
    }

    pub async fn post(&self, path: &str, body: &Value) -> Result<Value, ClientError> {
        self.call(reqwest::Method::POST, path, Some(body)).await
    }

    /// A POST whose success status matters (201 created versus 200 already there).
    pub async fn post_status(&self, path: &str, body: &Value) -> Result<(u16, Value), ClientError> {
        self.call_status(reqwest::Method::POST, path, Some(body))
            .await
    }

    pub async fn put(&self, path: &str, body: &Value) -> Result<Value, ClientError> {
        self.call(reqwest::Method::PUT, path, Some(body)).await
    }

    pub async fn delete(&self, path: &str) -> Result<Value, ClientError> {
        self.call(reqwest::Method::DELETE, path, None).await
    }

    /// One request; a non-2xx answer becomes [`ClientError::Problem`].
    pub async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Value, ClientError> {
        self.call_status(method, path, body)
            .await
            .map(|(_, value)| value)
    }

    /// One request, with the success status; a non-2xx answer becomes [`ClientError::Problem`].
    pub async fn call_status(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<(u16, Value), ClientError> {
        let (status, text) = match &self.transport {
            Transport::Remote { base, token, http } => {
                let mut request = http.request(method, format!("{base}{path}"));
                if let Some(token) = token {
                    request = request.bearer_auth(token);
                }
                if let Some(body) = body {
                    request = request.json(body);
                }
                let response = request
                    .send()
                    .await
                    .map_err(|error| ClientError::Unavailable(error.to_string()))?;
                let status = response.status().as_u16();
                let text = response
                    .text()
                    .await
                    .map_err(|error| ClientError::Unavailable(error.to_string()))?;
                (status, text)
            }
            Transport::Local(router) => {
                let method = axum::http::Method::from_bytes(method.as_str().as_bytes())
                    .map_err(|error| ClientError::Protocol(error.to_string()))?;
                let mut request = axum::http::Request::builder().method(method).uri(path);
                let body = match body {
                    Some(body) => {
                        request = request.header("content-type", "application/json");
                        Body::from(body.to_string())
                    }
                    None => Body::empty(),
                };
                let request = request
                    .body(body)
                    .map_err(|error| ClientError::Protocol(error.to_string()))?;
                let response = router
                    .clone()
                    .oneshot(request)
                    .await
                    .map_err(|error| ClientError::Protocol(error.to_string()))?;
                let status = response.status().as_u16();
                let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
                    .await
                    .map_err(|error| ClientError::Protocol(error.to_string()))?;
                (status, String::from_utf8_lossy(&bytes).into_owned())
            }
        };
        let value: Value = if text.trim().is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).unwrap_or(Value::String(text))
        };
        if (200..300).contains(&status) {
            return Ok((status, value));
        }
        if status == 503 && value.get("code").is_none() {
            return Err(ClientError::Unavailable(format!("HTTP {status}")));
        }
        Err(ClientError::Problem {
            status,
            code: value
                .get("code")
                .and_then(Value::as_str)
                .unwrap_or("unknown")
                .to_owned(),
            detail: value
                .get("detail")
                .and_then(Value::as_str)
                .map_or_else(|| value.to_string(), str::to_owned),
            body: value,
        })
    }
}

/// Percent-encodes one path segment or query value (ids and free text from the command line).
pub fn encode(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for byte in value.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// Creates a project (a 409 means it already exists: `Ok(false)`), binding `worktree` when the
/// server accepts the claim. A worktree the server refuses (outside its worktree roots, say, or
/// a token that may not bind one) leaves the project without one rather than failing the
/// caller: the project still works, without a rules file. The refusal is reported on stderr.
pub async fn ensure_project(
    client: &ApiClient,
    id: &str,
    name: &str,
    worktree: Option<&str>,
) -> Result<bool, ClientError> {
    let created = |result: Result<Value, ClientError>| match result {
        Ok(_) => Ok(true),
        Err(error) if error.status() == Some(409) => Ok(false),
        Err(error) => Err(error),
    };
    let Some(worktree) = worktree else {
        return created(
            client
                .post(
                    "/api/projects",
                    &serde_json::json!({ "id": id, "name": name }),
                )
                .await,
        );
    };
    let body = serde_json::json!({ "id": id, "name": name, "worktree": worktree });
    match client.post("/api/projects", &body).await {
        Err(ClientError::Problem {
            status: 400 | 403,
            body: problem,
            ..
        }) if problem.get("field").and_then(Value::as_str) == Some("worktree")
            || problem
                .get("detail")
                .and_then(Value::as_str)
                .is_some_and(|detail| detail.contains("worktree")) =>
        {
            eprintln!(
                "zuno: {worktree} was not bound as project `{id}`'s worktree ({}); continuing without it",
                problem
                    .get("detail")
                    .and_then(Value::as_str)
                    .unwrap_or("refused")
            );
            created(
                client
                    .post(
                        "/api/projects",
                        &serde_json::json!({ "id": id, "name": name }),
                    )
                    .await,
            )
        }
        other => created(other),
    }
}
