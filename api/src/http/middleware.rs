//! The layers that need the router's state: authentication, the `/metrics` gate and the request
//! guard (`guard.rs` holds the rules, `auth.rs` the callers).

use axum::extract::{Request, State};
use axum::http::{HeaderMap, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::auth::{Caller, bearer, digest, same};
use super::error::ApiError;
use super::guard::check;
use super::state::AppState;

/// The caller a request authenticates as.
pub async fn caller_of(state: &AppState, headers: &HeaderMap) -> Result<Caller, ApiError> {
    let Some(server) = &state.auth.server_digest else {
        return Ok(Caller::local());
    };
    let presented = headers
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(bearer)
        .map(digest)
        .ok_or(ApiError::Unauthorized)?;
    if same(&presented, server) {
        return Ok(Caller::local());
    }
    let grant = state
        .tokens
        .grant_for(&hex::encode(presented))
        .await?
        .ok_or(ApiError::Unauthorized)?;
    Ok(Caller::scoped(grant))
}

pub async fn authenticate(
    State(state): State<AppState>,
    mut request: Request,
    next: Next,
) -> Result<Response, ApiError> {
    let caller = caller_of(&state, request.headers()).await?;
    request.extensions_mut().insert(caller);
    Ok(next.run(request).await)
}

/// `/metrics` with `server.metrics_auth`: only the server's own token may read it.
pub async fn metrics_gate(
    State(state): State<AppState>,
    request: Request,
    next: Next,
) -> Result<Response, ApiError> {
    if state.metrics_auth {
        let caller = caller_of(&state, request.headers()).await?;
        if !caller.is_unscoped() {
            return Err(ApiError::Forbidden(String::from(
                "metrics are readable with the server's own token only",
            )));
        }
    }
    Ok(next.run(request).await)
}

/// Refuses foreign hosts, cross-origin requests, non-JSON bodies and oversized heads.
pub async fn guard(State(state): State<AppState>, request: Request, next: Next) -> Response {
    match check(&state.hosts, &request) {
        Ok(()) => next.run(request).await,
        Err(error) => error.into_response(),
    }
}
