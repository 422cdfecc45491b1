//! What every request must satisfy before any route sees it, whatever the authentication mode,
//! so that no web page a user visits can drive or read a local server:
//!
//! - `Host` must name this server: the bound address, `localhost`, `127.0.0.1`, `[::1]` or a name
//!   listed in `server.allowed_hosts` (any IP literal when bound to all interfaces). A DNS
//!   rebinding page reaches the server under its own domain name and is refused here.
//! - A request carrying `Origin` must come from this server's own origin. Browsers attach
//!   `Origin` to every cross-origin request that can change state, so a cross-site form or
//!   `fetch` is refused before it is authenticated or parsed.
//! - A body sent to `/api` must be `application/json`: the "simple" content types
//!   (`text/plain`, forms) that a cross-site request may send without a preflight are refused
//!   with 415.
//! - The request head is bounded (431).
//!
//! Every error answer, including those produced outside the routes (an unsupported method, an
//! extractor's own rejection), leaves as a problem document.

use std::collections::HashSet;
use std::net::{IpAddr, SocketAddr};

use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::error::ApiError;

/// The most header bytes (names and values) a request may carry.
pub const MAX_HEADER_BYTES: usize = 32 * 1024;

/// The `Host` names a server answers to.
#[derive(Debug, Clone)]
pub struct HostPolicy {
    names: HashSet<String>,
    /// Bound to every interface: any IP literal names this server (a rebinding page can only
    /// send a domain name).
    any_ip: bool,
}

impl HostPolicy {
    pub fn new(bind: &str, allowed_hosts: &[String]) -> HostPolicy {
        let mut names: HashSet<String> = ["localhost", "127.0.0.1", "::1"]
            .into_iter()
            .map(str::to_owned)
            .collect();
        let mut any_ip = false;
        if let Ok(address) = bind.parse::<SocketAddr>() {
            if address.ip().is_unspecified() {
                any_ip = true;
            } else {
                names.insert(address.ip().to_string());
            }
        } else if let Ok(ip) = bind.parse::<IpAddr>() {
            if ip.is_unspecified() {
                any_ip = true;
            } else {
                names.insert(ip.to_string());
            }
        } else {
            names.insert(host_name(bind).to_ascii_lowercase());
        }
        names.extend(allowed_hosts.iter().map(|h| h.to_ascii_lowercase()));
        HostPolicy { names, any_ip }
    }

    /// Whether a `Host` value (with or without a port) names this server.
    pub fn allows(&self, host: &str) -> bool {
        let name = host_name(host).to_ascii_lowercase();
        if let Ok(ip) = name.parse::<IpAddr>() {
            return self.any_ip || self.names.contains(&ip.to_string());
        }
        self.names.contains(&name)
    }
}

/// The host part of `host[:port]` or `[v6][:port]`, without brackets. Anything else after a
/// bracketed address (`[::1]evil.example`) leaves the value whole, which names no host.
fn host_name(value: &str) -> &str {
    let value = value.trim();
    if let Some((address, after)) = value
        .strip_prefix('[')
        .and_then(|rest| rest.split_once(']'))
    {
        let port_only = after.is_empty()
            || after
                .strip_prefix(':')
                .is_some_and(|port| port.bytes().all(|b| b.is_ascii_digit()));
        return if port_only { address } else { value };
    }
    match value.rsplit_once(':') {
        // One colon: `host:port`. More would be a bare IPv6 address.
        Some((host, port)) if !host.contains(':') && port.bytes().all(|b| b.is_ascii_digit()) => {
            host
        }
        _ => value,
    }
}

/// Whether a `Content-Type` value is JSON (`application/json`, any parameters).
pub fn is_json(value: Option<&HeaderValue>) -> bool {
    value
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.split(';').next())
        .is_some_and(|essence| essence.trim().eq_ignore_ascii_case("application/json"))
}

fn has_body(headers: &HeaderMap) -> bool {
    headers.contains_key(header::TRANSFER_ENCODING)
        || headers
            .get(header::CONTENT_LENGTH)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.trim().parse::<u64>().ok())
            .is_some_and(|length| length > 0)
}

pub fn check(policy: &HostPolicy, request: &Request) -> Result<(), ApiError> {
    let headers = request.headers();
    let header_bytes: usize = headers
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len())
        .sum();
    if header_bytes > MAX_HEADER_BYTES {
        return Err(ApiError::Status {
            status: StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            detail: format!("the request headers exceed {MAX_HEADER_BYTES} bytes"),
        });
    }
    // RFC 9112 §3.2: more than one Host field is a bad request, whichever one a check read.
    if headers.get_all(header::HOST).iter().nth(1).is_some() {
        return Err(ApiError::Status {
            status: StatusCode::BAD_REQUEST,
            detail: String::from("the request carries more than one Host header"),
        });
    }
    // The host is named by `Host` and, over HTTP/2 (`:authority`) or in an absolute-form
    // HTTP/1.1 target, by the URI's authority: every name a request carries must be this
    // server's, whichever one a later layer reads. An in-process call names none; over the
    // network a request naming none is refused before it gets here (`transport::require_host`).
    let host = match headers.get(header::HOST) {
        Some(value) => Some(value.to_str().map_err(|_| {
            ApiError::Forbidden(String::from("the Host header is not readable text"))
        })?),
        None => None,
    };
    let authority = request
        .uri()
        .authority()
        .map(|authority| authority.as_str());
    for name in [host, authority].into_iter().flatten() {
        if !policy.allows(name) {
            return Err(ApiError::Forbidden(format!(
                "this server does not answer to host `{}`; add it to `server.allowed_hosts` if it is yours",
                host_name(name)
            )));
        }
    }
    let host = host.or(authority);
    if let Some(origin) = headers.get(header::ORIGIN) {
        let own = origin
            .to_str()
            .ok()
            .and_then(|origin| {
                origin
                    .strip_prefix("http://")
                    .or_else(|| origin.strip_prefix("https://"))
            })
            .filter(|authority| !authority.contains('/'))
            .is_some_and(|authority| {
                policy.allows(authority)
                    && host.is_none_or(|host| authority.eq_ignore_ascii_case(host))
            });
        if !own {
            return Err(ApiError::Forbidden(String::from(
                "cross-origin requests are refused: only pages served by this server may call it",
            )));
        }
    }
    if request.uri().path().starts_with("/api/")
        && matches!(
            *request.method(),
            Method::POST | Method::PUT | Method::PATCH | Method::DELETE
        )
    {
        let content_type = headers.get(header::CONTENT_TYPE);
        if (content_type.is_some() || has_body(headers)) && !is_json(content_type) {
            return Err(ApiError::UnsupportedMediaType(String::from(
                "request bodies must be JSON sent as `Content-Type: application/json`",
            )));
        }
    }
    Ok(())
}

/// Turns every error response that is not already a problem document into one, keeping its
/// status and headers (`Allow` on a 405, for example) and using its text as the detail.
pub async fn problem_errors(request: Request, next: Next) -> Response {
    let response = next.run(request).await;
    let status = response.status();
    if !(status.is_client_error() || status.is_server_error()) {
        return response;
    }
    let is_problem = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| value.starts_with("application/problem+json"));
    if is_problem {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    let text = axum::body::to_bytes(body, 16 * 1024)
        .await
        .map(|bytes| String::from_utf8_lossy(&bytes).trim().to_owned())
        .unwrap_or_default();
    let detail = if text.is_empty() {
        status
            .canonical_reason()
            .unwrap_or("the request failed")
            .to_owned()
    } else {
        text.chars().take(1000).collect()
    };
    let problem = if status == StatusCode::METHOD_NOT_ALLOWED {
        ApiError::Status {
            status,
            detail: String::from("this path does not support the request's method"),
        }
    } else {
        ApiError::Status { status, detail }
    }
    .into_response();
    let (problem_parts, problem_body) = problem.into_parts();
    parts.headers.remove(header::CONTENT_LENGTH);
    for (name, value) in &problem_parts.headers {
        parts.headers.insert(name, value.clone());
    }
    Response::from_parts(parts, Body::new(problem_body))
}

/// True for loopback addresses and `localhost`.
pub fn is_loopback(bind: &str) -> bool {
    if let Ok(addr) = bind.parse::<SocketAddr>() {
        return addr.ip().is_loopback();
    }
    if let Ok(ip) = bind.parse::<IpAddr>() {
        return ip.is_loopback();
    }
    bind.rsplit_once(':').map_or(bind, |(host, _)| host) == "localhost"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_detection() {
        assert!(is_loopback("127.0.0.1:7878"));
        assert!(is_loopback("[::1]:7878"));
        assert!(is_loopback("localhost:7878"));
        assert!(!is_loopback("0.0.0.0:7878"));
        assert!(!is_loopback("10.0.0.5:80"));
        assert!(!is_loopback("example.com:80"));
    }

    #[test]
    fn hosts_are_the_bound_address_loopback_names_and_the_allowed_list() {
        let local = HostPolicy::new("127.0.0.1:7878", &[]);
        for host in [
            "127.0.0.1:7878",
            "localhost:7878",
            "LOCALHOST",
            "[::1]:7878",
            "127.0.0.1",
        ] {
            assert!(local.allows(host), "{host}");
        }
        for host in [
            "evil.example",
            "evil.example:7878",
            "10.0.0.5:7878",
            "localhost.evil.example",
        ] {
            assert!(!local.allows(host), "{host}");
        }
        let everywhere = HostPolicy::new("0.0.0.0:7878", &["api".to_owned()]);
        assert!(everywhere.allows("10.0.0.5:7878"));
        assert!(everywhere.allows("[fe80::1]:7878"));
        assert!(everywhere.allows("api:7878"));
        assert!(!everywhere.allows("evil.example:7878"));
        for host in [
            "[::1]evil.example",
            "[::1]evil.example:7878",
            "[::1]:evil",
            "[::1",
            "localhost:7878x",
        ] {
            assert!(!local.allows(host), "{host}");
            assert!(!everywhere.allows(host), "{host}");
        }
        let named = HostPolicy::new("zuno.internal:7878", &[]);
        assert!(named.allows("zuno.internal:7878"));
        assert!(!named.allows("10.0.0.5:7878"));
    }

    #[test]
    fn json_content_types() {
        let json = |v: &str| is_json(Some(&HeaderValue::from_str(v).unwrap()));
        assert!(json("application/json"));
        assert!(json("Application/JSON; charset=utf-8"));
        assert!(!json("text/plain"));
        assert!(!json("application/x-www-form-urlencoded"));
        assert!(!json("multipart/form-data; boundary=x"));
        assert!(!is_json(None));
    }
}
