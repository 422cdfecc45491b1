//! Typed provider failures with bounded, redacted diagnostics, and Retry-After parsing.

use std::fmt;
use std::time::{Duration, SystemTime};

use reqwest::header::HeaderMap;
use serde::Serialize;
use serde_json::Value;

use super::Usage;

/// Longest provider message kept in a diagnostic, in characters.
pub const MAX_MESSAGE_CHARS: usize = 500;

/// What a provider said about a failed request: enough to find it in the provider's logs,
/// never a credential.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Diagnostic {
    /// HTTP status, when a response arrived.
    pub status: Option<u16>,
    /// OpenAI `error.code` (else `error.type`), Anthropic `error.type`.
    pub code: Option<String>,
    /// `x-request-id` / `request-id` header, else the body's `request_id` or `id`.
    pub request_id: Option<String>,
    /// The provider's message, redacted and clipped to [`MAX_MESSAGE_CHARS`].
    pub message: String,
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        if let Some(status) = self.status {
            parts.push(format!("HTTP {status}"));
        }
        if let Some(code) = &self.code {
            parts.push(format!("code {code}"));
        }
        if let Some(request_id) = &self.request_id {
            parts.push(format!("request {request_id}"));
        }
        if parts.is_empty() {
            return write!(f, "{}", self.message);
        }
        write!(f, "{}: {}", parts.join(", "), self.message)
    }
}

/// Why a provider call failed. [`ProviderError::is_permanent`] separates the failures that a
/// later attempt cannot fix from those worth retrying.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ProviderError {
    /// A configured header or API-key environment variable is not set.
    #[error("provider credential missing: environment variable {variable} is not set")]
    MissingCredential { variable: String },
    /// A configured header name, or the value read for it, is not valid in HTTP.
    #[error("provider header {name} is not a valid HTTP header (name or value)")]
    InvalidHeader { name: String },
    /// 401 / 403.
    #[error("provider authentication rejected ({0})")]
    Auth(Diagnostic),
    /// 404, `model_not_found`, or a message naming an unknown model.
    #[error("model unavailable at the provider ({0})")]
    ModelUnavailable(Diagnostic),
    /// A 400 about the output limit: the endpoint will not run this model with bounded output.
    /// Reported as is; the ceiling is never removed to make the request pass.
    #[error("endpoint rejected the bounded output limit ({0})")]
    OutputLimitRejected(Diagnostic),
    /// Any other 4xx the provider will keep refusing (400, 413, 422, …).
    #[error("provider rejected the request ({0})")]
    BadRequest(Diagnostic),
    /// 429. `retry_at` is when the provider said it will accept requests again.
    #[error("provider rate limit ({diagnostic})")]
    RateLimited {
        diagnostic: Diagnostic,
        retry_after: Option<Duration>,
        retry_at: Option<SystemTime>,
    },
    /// 408, 409, 5xx, 529 (overloaded).
    #[error("provider temporarily unavailable ({diagnostic})")]
    Unavailable {
        diagnostic: Diagnostic,
        retry_after: Option<Duration>,
    },
    /// The request never got an HTTP answer (connection refused, reset, DNS…).
    #[error("network error talking to the provider: {message}")]
    Network { message: String },
    /// The whole call, retries and repair included, did not finish within its deadline.
    #[error("no valid answer within the {deadline:?} deadline")]
    Timeout { deadline: Duration },
    /// A success status whose body is not the API's envelope (wrong base URL, a proxy page).
    #[error("unreadable provider response ({0})")]
    InvalidResponse(Diagnostic),
    /// The answer was not the requested JSON, and neither was the single repair.
    #[error("malformed answer after one repair: {detail}")]
    MalformedAnswer { detail: String },
    /// A command-line provider's executable could not be started (not on `PATH`, not
    /// executable). A later attempt cannot help until the configuration or the install changes.
    #[error("provider command `{command}` could not be started: {message}")]
    CommandUnavailable { command: String, message: String },
    /// A command-line provider ran and failed for a reason it did not name in a way we
    /// recognise (its exit status or error result, with its message); worth a later attempt.
    #[error("provider command failed ({0})")]
    CommandFailed(Diagnostic),
}

impl ProviderError {
    /// Whether retrying the same request later cannot help.
    pub fn is_permanent(&self) -> bool {
        match self {
            ProviderError::MissingCredential { .. }
            | ProviderError::InvalidHeader { .. }
            | ProviderError::Auth(_)
            | ProviderError::ModelUnavailable(_)
            | ProviderError::OutputLimitRejected(_)
            | ProviderError::BadRequest(_)
            | ProviderError::InvalidResponse(_)
            | ProviderError::MalformedAnswer { .. }
            | ProviderError::CommandUnavailable { .. } => true,
            ProviderError::RateLimited { .. }
            | ProviderError::Unavailable { .. }
            | ProviderError::Network { .. }
            | ProviderError::Timeout { .. }
            | ProviderError::CommandFailed(_) => false,
        }
    }

    /// How long the provider asked us to wait, when it said.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            ProviderError::RateLimited { retry_after, .. }
            | ProviderError::Unavailable { retry_after, .. } => *retry_after,
            // Only those two answers carry a Retry-After header worth honouring.
            _ => None,
        }
    }

    /// The provider's diagnostic, for failures that got an HTTP answer.
    pub fn diagnostic(&self) -> Option<&Diagnostic> {
        match self {
            ProviderError::Auth(diagnostic)
            | ProviderError::ModelUnavailable(diagnostic)
            | ProviderError::OutputLimitRejected(diagnostic)
            | ProviderError::BadRequest(diagnostic)
            | ProviderError::InvalidResponse(diagnostic)
            | ProviderError::RateLimited { diagnostic, .. }
            | ProviderError::Unavailable { diagnostic, .. }
            | ProviderError::CommandFailed(diagnostic) => Some(diagnostic),
            ProviderError::MissingCredential { .. }
            | ProviderError::InvalidHeader { .. }
            | ProviderError::Network { .. }
            | ProviderError::Timeout { .. }
            | ProviderError::MalformedAnswer { .. }
            | ProviderError::CommandUnavailable { .. } => None,
        }
    }

    /// Whether a retry inside the same call may succeed: transient failures and rate limits.
    /// Whether it fits the deadline is decided by the caller.
    pub(crate) fn is_transient(&self) -> bool {
        matches!(
            self,
            ProviderError::RateLimited { .. }
                | ProviderError::Unavailable { .. }
                | ProviderError::Network { .. }
        )
    }
}

/// A failed call: the error plus what it cost before failing (tokens spent on a malformed
/// answer still count against budgets).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{error} (after {requests} provider request(s))")]
pub struct ProviderFailure {
    pub error: ProviderError,
    pub usage: Usage,
    /// HTTP requests sent, including retries, the repair and a request cut off by the deadline.
    pub requests: u32,
    /// The last request id any provider response carried.
    pub provider_request_id: Option<String>,
}

impl ProviderFailure {
    pub fn is_permanent(&self) -> bool {
        self.error.is_permanent()
    }

    pub fn retry_after(&self) -> Option<Duration> {
        self.error.retry_after()
    }
}

/// Classifies a non-success response. `secrets` are the header values that were sent; they
/// are scrubbed from the message even when the generic redaction would not recognise them.
pub(crate) fn classify(
    status: u16,
    headers: &HeaderMap,
    body: &[u8],
    secrets: &[String],
    received_at: SystemTime,
) -> ProviderError {
    let parsed: Option<Value> = serde_json::from_slice(body).ok();
    let details = ErrorDetails::read(parsed.as_ref(), body);
    let diagnostic = Diagnostic {
        status: Some(status),
        code: details.code.clone(),
        request_id: request_id(headers, parsed.as_ref()),
        message: clean_message(&details.message, secrets),
    };
    let retry_after = || {
        retry_after_from_headers(headers, received_at)
            .or_else(|| details.metadata_retry_after(received_at))
            .or_else(|| retry_after_from_text(&details.message))
    };
    match status {
        401 | 403 => ProviderError::Auth(diagnostic),
        404 => ProviderError::ModelUnavailable(diagnostic),
        429 => {
            let retry_after = retry_after();
            ProviderError::RateLimited {
                diagnostic,
                retry_at: retry_after.and_then(|wait| received_at.checked_add(wait)),
                retry_after,
            }
        }
        408 | 409 | 500..=599 => ProviderError::Unavailable {
            retry_after: retry_after(),
            diagnostic,
        },
        _ if details.names_unknown_model() => ProviderError::ModelUnavailable(diagnostic),
        400 if details.is_about_output_limit() => ProviderError::OutputLimitRejected(diagnostic),
        _ => ProviderError::BadRequest(diagnostic),
    }
}

/// A diagnostic for a response that arrived but could not be used.
pub(crate) fn invalid_response(
    status: u16,
    headers: &HeaderMap,
    body: &[u8],
    secrets: &[String],
    problem: &str,
) -> ProviderError {
    let parsed: Option<Value> = serde_json::from_slice(body).ok();
    let excerpt = String::from_utf8_lossy(body);
    ProviderError::InvalidResponse(Diagnostic {
        status: Some(status),
        code: None,
        request_id: request_id(headers, parsed.as_ref()),
        message: clean_message(&format!("{problem}: {excerpt}"), secrets),
    })
}

/// The provider's request id: `x-request-id`, Anthropic's `request-id`, then the body's
/// `request_id`, then the response `id`.
pub(crate) fn request_id(headers: &HeaderMap, body: Option<&Value>) -> Option<String> {
    let header = ["x-request-id", "request-id"]
        .iter()
        .find_map(|name| headers.get(*name)?.to_str().ok())
        .map(str::trim)
        .filter(|id| !id.is_empty())
        .map(|id| clip(id, 200));
    header.or_else(|| {
        let body = body?;
        ["request_id", "id"]
            .iter()
            .find_map(|key| body.get(*key)?.as_str())
            .map(|id| clip(id, 200))
    })
}

/// Error fields from the shapes providers use: `{"error": {...}}` (OpenAI, Anthropic,
/// OpenRouter), `{"error": "text"}`, `{"message"|"detail": ...}`, or a non-JSON body.
struct ErrorDetails {
    code: Option<String>,
    kind: Option<String>,
    param: Option<String>,
    message: String,
    /// OpenRouter's `error.metadata`, which carries the upstream provider's details.
    metadata: Option<Value>,
}

impl ErrorDetails {
    fn read(parsed: Option<&Value>, body: &[u8]) -> ErrorDetails {
        let text = |value: Option<&Value>| -> Option<String> {
            match value? {
                Value::String(s) => Some(s.clone()),
                Value::Number(n) => Some(n.to_string()),
                _ => None,
            }
        };
        let Some(parsed) = parsed else {
            return ErrorDetails {
                code: None,
                kind: None,
                param: None,
                message: String::from_utf8_lossy(body).trim().to_owned(),
                metadata: None,
            };
        };
        let error = parsed.get("error").unwrap_or(parsed);
        if let Value::String(message) = error {
            return ErrorDetails {
                code: None,
                kind: None,
                param: None,
                message: message.clone(),
                metadata: None,
            };
        }
        let code = text(error.get("code"));
        let kind = text(error.get("type"));
        let metadata = error.get("metadata").cloned();
        let mut message = text(error.get("message"))
            .or_else(|| text(error.get("detail")))
            .unwrap_or_else(|| parsed.to_string());
        // OpenRouter's message is generic ("Provider returned error"); the upstream text with
        // the actual reason is in metadata.raw.
        if let Some(raw) = metadata.as_ref().and_then(|m| m.get("raw")) {
            let raw = match raw {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            message = format!("{message}: {raw}");
        }
        ErrorDetails {
            code: code.clone().or_else(|| kind.clone()),
            kind,
            param: text(error.get("param")),
            message,
            metadata,
        }
    }

    fn names_unknown_model(&self) -> bool {
        let code_says = [self.code.as_deref(), self.kind.as_deref()]
            .into_iter()
            .flatten()
            .any(|c| c == "model_not_found" || c == "not_found_error");
        let message = self.message.to_ascii_lowercase();
        code_says
            || message.contains("unknown model")
            || message.contains("model_not_found")
            || (message.contains("model")
                && (message.contains("does not exist") || message.contains("not found")))
    }

    fn is_about_output_limit(&self) -> bool {
        let param = self.param.as_deref().unwrap_or("");
        let message = self.message.to_ascii_lowercase();
        super::resolve::LIMIT_ALIASES
            .iter()
            .any(|alias| param == *alias || message.contains(&alias.to_ascii_lowercase()))
            || (message.contains("maximum") && message.contains("token"))
    }

    /// OpenRouter forwards upstream limits in `metadata.headers` and sometimes names a delay
    /// directly; `X-RateLimit-Reset` there is an instant (epoch seconds or milliseconds).
    fn metadata_retry_after(&self, now: SystemTime) -> Option<Duration> {
        let metadata = self.metadata.as_ref()?;
        let seconds = |value: &Value| match value {
            Value::Number(n) => n.as_f64(),
            Value::String(s) => s.trim().parse::<f64>().ok(),
            _ => None,
        };
        for key in ["retry_after", "retry_after_seconds", "retryAfter"] {
            if let Some(wait) = metadata.get(key).and_then(seconds).and_then(secs) {
                return Some(wait);
            }
        }
        let headers = metadata.get("headers")?.as_object()?;
        let header = |name: &str| {
            headers
                .iter()
                .find(|(key, _)| key.eq_ignore_ascii_case(name))
                .map(|(_, value)| value)
        };
        if let Some(wait) = header("retry-after-ms")
            .and_then(seconds)
            .and_then(|ms| secs(ms / 1000.0))
        {
            return Some(wait);
        }
        if let Some(wait) = header("retry-after").and_then(seconds).and_then(secs) {
            return Some(wait);
        }
        let reset = header("x-ratelimit-reset").and_then(seconds)?;
        // Epoch milliseconds are above 10^10; epoch seconds will not reach it until 2286.
        let reset_secs = if reset > 1e10 { reset / 1000.0 } else { reset };
        let since_epoch = now.duration_since(SystemTime::UNIX_EPOCH).ok()?;
        secs(reset_secs - since_epoch.as_secs_f64()).or(Some(Duration::ZERO))
    }
}

fn secs(value: f64) -> Option<Duration> {
    (value.is_finite() && value >= 0.0)
        .then(|| Duration::try_from_secs_f64(value).ok())
        .flatten()
}

/// Retry-After as providers send it: `retry-after-ms` (milliseconds) first, then
/// `retry-after` as (possibly fractional) seconds or an HTTP-date, then a wait named in the
/// message text ("Please try again in 18.642s"). Headers are not enough on their own: Azure
/// OpenAI has been seen to omit them on 429s.
pub fn parse_retry_after(headers: &HeaderMap, message: &str, now: SystemTime) -> Option<Duration> {
    retry_after_from_headers(headers, now).or_else(|| retry_after_from_text(message))
}

/// The header part of [`parse_retry_after`].
pub fn retry_after_from_headers(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let header = |name: &str| headers.get(name)?.to_str().ok().map(str::trim);
    if let Some(wait) = header("retry-after-ms")
        .and_then(|ms| ms.parse::<f64>().ok())
        .and_then(|ms| secs(ms / 1000.0))
    {
        return Some(wait);
    }
    let value = header("retry-after")?;
    if let Some(wait) = value.parse::<f64>().ok().and_then(secs) {
        return Some(wait);
    }
    // HTTP-date (IMF-fixdate, e.g. "Wed, 21 Oct 2015 07:28:00 GMT") is RFC 2822 syntax.
    let date =
        time::OffsetDateTime::parse(value, &time::format_description::well_known::Rfc2822).ok()?;
    let at = SystemTime::from(date);
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// A wait named in an error message: "try again in 18.642s", "try again in 174ms",
/// "try again in 1m30s", "retry after 20 seconds", or Google's `"retryDelay": "39s"` forwarded
/// inside an OpenRouter message.
pub fn retry_after_from_text(message: &str) -> Option<Duration> {
    let lower = message.to_ascii_lowercase();
    const MARKERS: [&str; 5] = [
        "try again in ",
        "retry after ",
        "retry in ",
        "\"retrydelay\": \"",
        "\"retrydelay\":\"",
    ];
    MARKERS.iter().find_map(|marker| {
        lower
            .match_indices(marker)
            .find_map(|(at, _)| parse_duration_prefix(&lower[at + marker.len()..]))
    })
}

/// Parses a duration at the start of `text`: Go-style components (`1m2.5s`, `174ms`, `6h`) or a
/// number followed by a unit word (`20 seconds`).
fn parse_duration_prefix(text: &str) -> Option<Duration> {
    let mut rest = text;
    let mut total = 0.0_f64;
    let mut parsed_any = false;
    loop {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        if digits == 0 {
            break;
        }
        let Ok(number) = rest[..digits].parse::<f64>() else {
            break;
        };
        let after = &rest[digits..];
        let spaced = after.trim_start();
        let (scale, unit_len) = [
            ("ms", 0.001, false),
            ("milliseconds", 0.001, true),
            ("millisecond", 0.001, true),
            ("seconds", 1.0, true),
            ("second", 1.0, true),
            ("secs", 1.0, true),
            ("sec", 1.0, true),
            ("s", 1.0, false),
            ("minutes", 60.0, true),
            ("minute", 60.0, true),
            ("m", 60.0, false),
            ("hours", 3600.0, true),
            ("hour", 3600.0, true),
            ("h", 3600.0, false),
        ]
        .iter()
        .find_map(|(unit, scale, may_space)| {
            let candidate = if *may_space { spaced } else { after };
            candidate
                .starts_with(unit)
                .then(|| (*scale, after.len() - candidate.len() + unit.len()))
        })?;
        total += number * scale;
        parsed_any = true;
        rest = &after[unit_len..];
    }
    if parsed_any { secs(total) } else { None }
}

/// Redacts credentials and clips to [`MAX_MESSAGE_CHARS`]. The exact header values this client
/// sent are scrubbed first: providers echo a rejected key back in 401 messages, and a key of a
/// format the shared patterns do not know must not slip through.
pub(crate) fn clean_message(message: &str, secrets: &[String]) -> String {
    let mut text = message.trim().to_owned();
    for secret in secrets.iter().filter(|s| s.len() >= 4) {
        text = text.replace(secret.as_str(), "[REDACTED:credential]");
    }
    clip(&crate::text::redact::redact(&text).text, MAX_MESSAGE_CHARS)
}

/// At most `max` characters, marking the cut.
pub(crate) fn clip(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_in_messages() {
        let parse = retry_after_from_text;
        assert_eq!(
            parse("Please try again in 18.642s. Visit"),
            Some(Duration::from_millis(18_642))
        );
        assert_eq!(
            parse("Please try again in 174ms."),
            Some(Duration::from_millis(174))
        );
        assert_eq!(parse("try again in 1m30s"), Some(Duration::from_secs(90)));
        assert_eq!(
            parse("Retry after 20 seconds"),
            Some(Duration::from_secs(20))
        );
        assert_eq!(
            parse(r#"{"retryDelay": "39s"}"#),
            Some(Duration::from_secs(39))
        );
        assert_eq!(parse("try again in a moment"), None);
        assert_eq!(parse("no hint"), None);
    }

    #[test]
    fn sent_secrets_and_key_shapes_are_redacted() {
        let secrets = [String::from("zz-custom-credential-0042")];
        let text = clean_message(
            "bad key zz-custom-credential-0042 and sk-proj-abcdefghijklmnopqrstuvwx1234",
            &secrets,
        );
        assert!(!text.contains("zz-custom-credential-0042"), "{text}");
        assert!(!text.contains("abcdefghijklmnopqrstuvwx1234"), "{text}");
        assert!(text.contains("[REDACTED:credential]"), "{text}");
    }

    #[test]
    fn clip_counts_characters() {
        assert_eq!(clip("ééé", 2), "éé…");
        assert_eq!(clip("ab", 2), "ab");
    }
}
