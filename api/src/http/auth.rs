//! Bearer-token authentication and project scoping.
//!
//! `ZUNO_API_TOKEN` is the operator token (every project). Scoped tokens, created with
//! `zuno tokens create --project …`, are stored as SHA-256 digests and can reach only the
//! projects they name; another project's resources answer 404, so a scoped caller cannot even
//! learn that they exist. Without `ZUNO_API_TOKEN` authentication is off, which the server
//! allows only on a loopback address.

use std::collections::HashSet;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::Response;
use sha2::{Digest, Sha256};

use super::AppState;
use super::error::ApiError;

/// Who is calling.
#[derive(Debug, Clone)]
pub enum Caller {
    /// Authentication is disabled (loopback without a token).
    Local,
    /// The operator token.
    Operator,
    /// A token scoped to these projects.
    Scoped(Arc<HashSet<String>>),
}

impl Caller {
    pub fn can_access(&self, project_id: &str) -> bool {
        match self {
            Caller::Local | Caller::Operator => true,
            Caller::Scoped(projects) => projects.contains(project_id),
        }
    }

    /// 404 for projects outside the caller's scope (existence is not revealed).
    pub fn require(&self, project_id: &str, what: &str, id: &str) -> Result<(), ApiError> {
        if self.can_access(project_id) {
            Ok(())
        } else {
            Err(ApiError::NotFound(format!("{what} `{id}` was not found")))
        }
    }

    /// The projects a listing may include; `None` = all.
    pub fn project_filter(&self) -> Option<Vec<String>> {
        match self {
            Caller::Local | Caller::Operator => None,
            Caller::Scoped(projects) => Some(projects.iter().cloned().collect()),
        }
    }
}

/// Authentication settings.
#[derive(Clone)]
pub struct Auth {
    operator_digest: Option<[u8; 32]>,
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Auth")
            .field("enabled", &self.enabled())
            .finish()
    }
}

impl Auth {
    pub fn new(operator_token: Option<&str>) -> Auth {
        Auth {
            operator_digest: operator_token.map(digest),
        }
    }

    pub fn enabled(&self) -> bool {
        self.operator_digest.is_some()
    }
}

pub fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// Compares digests in constant time.
fn same(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

pub async fn authenticate(
    State(state): State<AppState>,
    mut request: Request,
    next: Next,
) -> Result<Response, ApiError> {
    let auth = &state.auth;
    let caller = match &auth.operator_digest {
        None => Caller::Local,
        Some(operator) => {
            let token = request
                .headers()
                .get(header::AUTHORIZATION)
                .and_then(|value| value.to_str().ok())
                .and_then(|value| value.strip_prefix("Bearer "))
                .map(str::trim)
                .filter(|token| !token.is_empty())
                .ok_or(ApiError::Unauthorized)?;
            let presented = digest(token);
            if same(&presented, operator) {
                Caller::Operator
            } else {
                let projects = state.tokens.projects_for(&hex::encode(presented)).await?;
                Caller::Scoped(Arc::new(
                    projects
                        .ok_or(ApiError::Unauthorized)?
                        .into_iter()
                        .collect(),
                ))
            }
        }
    };
    request.extensions_mut().insert(caller);
    Ok(next.run(request).await)
}
