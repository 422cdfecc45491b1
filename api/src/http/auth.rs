//! Bearer-token authentication and scoping.
//!
//! The server's own token reaches everything and is the user's: the operator's
//! `ZUNO_API_TOKEN`, or the local token the server generates in its data directory on first
//! start (which every local client reads from there). Tokens created with `zuno tokens create`
//! are stored as SHA-256 digests and carry a scope: the projects they name (another project's
//! resources answer 404, so a scoped caller cannot even learn that they exist), separately the
//! access they have to global Memory (none, read, write), and whether they are the user's
//! (may state `origin: "user"` and bind worktrees).
//!
//! Authentication is off only in-process (the CLI's own router) and with
//! `--insecure-no-auth` on a loopback address; every caller is then the local user.

use std::collections::HashSet;
use std::sync::Arc;

use sha2::{Digest, Sha256};
use zuno_shared::tokens::{GlobalAccess, Grant};

use super::error::ApiError;

/// Who is calling, and what they may reach.
#[derive(Debug, Clone)]
pub struct Caller {
    /// The key per-caller limits count under: `local` for the server's own token (and when
    /// authentication is off), else the token's id.
    id: Arc<str>,
    /// `None`: every project.
    projects: Option<Arc<HashSet<String>>>,
    global: GlobalAccess,
    user: bool,
}

impl Caller {
    /// The local user: every project, global Memory, user-owned changes.
    pub fn local() -> Caller {
        Caller {
            id: Arc::from("local"),
            projects: None,
            global: GlobalAccess::Write,
            user: true,
        }
    }

    /// The holder of a created token.
    pub fn scoped(grant: Grant) -> Caller {
        Caller {
            id: Arc::from(grant.id.as_str()),
            projects: Some(Arc::new(grant.projects.into_iter().collect())),
            global: grant.global,
            user: grant.user,
        }
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    pub fn can_access(&self, project_id: &str) -> bool {
        self.projects
            .as_ref()
            .is_none_or(|projects| projects.contains(project_id))
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
        self.projects
            .as_ref()
            .map(|projects| projects.iter().cloned().collect())
    }

    /// Whether the caller reaches every project (the server's token, or no authentication).
    pub fn is_unscoped(&self) -> bool {
        self.projects.is_none()
    }

    pub fn global(&self) -> GlobalAccess {
        self.global
    }

    pub fn can_read_global(&self) -> bool {
        self.global >= GlobalAccess::Read
    }

    /// 403 unless the caller's global-Memory scope includes `needed`.
    pub fn require_global(&self, needed: GlobalAccess) -> Result<(), ApiError> {
        if self.global >= needed {
            return Ok(());
        }
        let verb = if needed == GlobalAccess::Write {
            "change"
        } else {
            "read"
        };
        Err(ApiError::Forbidden(format!(
            "this token may not {verb} global Memory; a token created with `zuno tokens create --global {}` may",
            needed.as_str()
        )))
    }

    /// Whether the caller acts for the user: may state `origin: "user"` and bind worktrees.
    pub fn is_user(&self) -> bool {
        self.user
    }
}

/// Authentication settings: the digest of the server's own token, when authentication is on.
#[derive(Clone)]
pub struct Auth {
    pub(super) server_digest: Option<[u8; 32]>,
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Auth")
            .field("enabled", &self.enabled())
            .finish()
    }
}

impl Auth {
    /// `None` turns authentication off: every caller is the local user (the in-process router,
    /// `--insecure-no-auth`).
    pub fn new(server_token: Option<&str>) -> Auth {
        Auth {
            server_digest: server_token.map(digest),
        }
    }

    pub fn enabled(&self) -> bool {
        self.server_digest.is_some()
    }
}

pub fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// Compares digests in constant time.
pub fn same(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The credential of an `Authorization: Bearer …` header; the scheme is case-insensitive.
pub fn bearer(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim().split_once([' ', '\t'])?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

#[cfg(test)]
mod tests {
    use super::bearer;

    #[test]
    fn the_bearer_scheme_is_case_insensitive() {
        assert_eq!(bearer("Bearer abc"), Some("abc"));
        assert_eq!(bearer("bearer abc"), Some("abc"));
        assert_eq!(bearer("BEARER   abc  "), Some("abc"));
        assert_eq!(bearer("Basic abc"), None);
        assert_eq!(bearer("Bearer "), None);
        assert_eq!(bearer("Bearerabc"), None);
    }
}
