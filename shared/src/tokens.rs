//! API tokens. Only SHA-256 digests are stored; a token itself is shown once, when it is created.
//!
//! A token reaches the projects it names and, separately, global Memory at the access its
//! `global` scope grants (none, read or write). A token marked as the user's may state
//! `origin: "user"` on Memory changes and bind project worktrees; other tokens act as automatic
//! callers.
//!
//! The server's own token (the operator's `ZUNO_API_TOKEN`, or the local token generated in the
//! data directory on first start) is none of these rows: it reaches everything and is the user's.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

mod store;

use crate::clock::SharedClock;
use crate::db::{Db, StoreError};
use crate::paths::Paths;

zuno_queue::text_enum! {
    /// What a token may do with global Memory.
    #[derive(
        Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize,
        utoipa::ToSchema,
    )]
    #[serde(rename_all = "snake_case")]
    pub enum GlobalAccess {
        #[default]
        None = "none",
        Read = "read",
        Write = "write",
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TokenInfo {
    pub id: String,
    pub name: String,
    pub projects: Vec<String>,
    pub global: GlobalAccess,
    /// May state `origin: "user"` and bind worktrees.
    pub user: bool,
    pub created_at: i64,
    pub revoked_at: Option<i64>,
}

/// What a new token may reach.
#[derive(Debug, Clone, Default)]
pub struct NewToken {
    pub name: String,
    pub projects: Vec<String>,
    pub global: GlobalAccess,
    pub user: bool,
}

/// The scope of a live token, as authentication needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    pub id: String,
    pub projects: Vec<String>,
    pub global: GlobalAccess,
    pub user: bool,
}

#[derive(Debug, Clone)]
pub struct TokenStore {
    db: Db,
    clock: SharedClock,
}

/// A new random secret: `zuno_` and 64 hex digits (244 random bits).
pub fn new_secret() -> String {
    format!(
        "zuno_{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    )
}

/// The hex SHA-256 a token is stored and looked up by.
pub fn digest_hex(secret: &str) -> String {
    hex::encode(Sha256::digest(secret.as_bytes()))
}

impl TokenStore {
    pub fn new(db: Db, clock: SharedClock) -> TokenStore {
        TokenStore { db, clock }
    }

    /// Creates a token for `projects` only (no global Memory, not the user's); returns its info
    /// and the secret (shown once).
    pub async fn create(
        &self,
        name: &str,
        projects: &[String],
    ) -> Result<(TokenInfo, String), StoreError> {
        self.create_with(&NewToken {
            name: name.to_owned(),
            projects: projects.to_vec(),
            ..NewToken::default()
        })
        .await
    }

    /// Creates a token with the given scope; returns its info and the secret (shown once).
    pub async fn create_with(&self, new: &NewToken) -> Result<(TokenInfo, String), StoreError> {
        let secret = new_secret();
        let info = TokenInfo {
            id: crate::ids::new_id("tok"),
            name: new.name.clone(),
            projects: new.projects.clone(),
            global: new.global,
            user: new.user,
            created_at: self.clock.now_ms(),
            revoked_at: None,
        };
        store::insert(&self.db, &info, &digest_hex(&secret)).await?;
        Ok((info, secret))
    }

    /// The scope of a live token given by its hex SHA-256, or `None` for an unknown or revoked
    /// token.
    pub async fn grant_for(&self, digest_hex: &str) -> Result<Option<Grant>, StoreError> {
        store::grant_for(&self.db, digest_hex).await
    }

    pub async fn list(&self) -> Result<Vec<TokenInfo>, StoreError> {
        store::list(&self.db).await
    }

    pub async fn revoke(&self, id: &str) -> Result<bool, StoreError> {
        store::revoke(&self.db, id, self.clock.now_ms()).await
    }
}

/// The local token: generated in the data directory on the server's first start without
/// `ZUNO_API_TOKEN`, readable only by its owner, and read from there by every client of the same
/// user (CLI, hooks, MCP), so a local server needs no typing and no web page can drive it.
pub mod local {
    use super::*;

    /// `$DATA/local-token`.
    pub fn path(paths: &Paths) -> PathBuf {
        paths.data_dir.join("local-token")
    }

    /// Why the local token could not be read or created.
    #[derive(Debug, thiserror::Error)]
    pub enum LocalTokenError {
        #[error("cannot use the local token file {path}: {reason}")]
        Io { path: String, reason: String },
        #[error(
            "the local token file {path} is readable by other users (mode {mode:o}); make it private (chmod 600) or remove it"
        )]
        Exposed { path: String, mode: u32 },
        #[error("the local token file {path} holds no token; remove it to generate a new one")]
        Empty { path: String },
        /// Another user owns the file: whoever planted it knows the token.
        #[error(transparent)]
        Untrusted(#[from] crate::ownership::Untrusted),
    }

    fn io(path: &Path, error: &std::io::Error) -> LocalTokenError {
        LocalTokenError::Io {
            path: path.display().to_string(),
            reason: error.to_string(),
        }
    }

    /// Reads the local token, if the file exists.
    pub fn read(paths: &Paths) -> Result<Option<String>, LocalTokenError> {
        read_file(&path(paths))
    }

    fn read_file(file: &Path) -> Result<Option<String>, LocalTokenError> {
        crate::ownership::check(
            "the local token file",
            file,
            crate::ownership::Owner::UserOrRoot,
        )?;
        let text = match std::fs::read_to_string(file) {
            Ok(text) => text,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(error) => return Err(io(file, &error)),
        };
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            let mode = std::fs::metadata(file)
                .map_err(|error| io(file, &error))?
                .permissions()
                .mode()
                & 0o777;
            if mode & 0o077 != 0 {
                return Err(LocalTokenError::Exposed {
                    path: file.display().to_string(),
                    mode,
                });
            }
        }
        let token = text.trim();
        if token.is_empty() {
            return Err(LocalTokenError::Empty {
                path: file.display().to_string(),
            });
        }
        Ok(Some(token.to_owned()))
    }

    /// The local token, generated (mode 0600, created exclusively so two servers starting
    /// together agree on one) when the file does not exist yet.
    pub fn load_or_create(paths: &Paths) -> Result<String, LocalTokenError> {
        let file = path(paths);
        if let Some(token) = read_file(&file)? {
            return Ok(token);
        }
        std::fs::create_dir_all(&paths.data_dir).map_err(|error| io(&paths.data_dir, &error))?;
        let secret = new_secret();
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create_new(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt as _;
            options.mode(0o600);
        }
        match options.open(&file) {
            Ok(mut handle) => {
                handle
                    .write_all(format!("{secret}\n").as_bytes())
                    .and_then(|()| handle.sync_all())
                    .map_err(|error| io(&file, &error))?;
                Ok(secret)
            }
            // Another process created it first: use theirs.
            Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => read_file(&file)?
                .ok_or_else(|| LocalTokenError::Empty {
                    path: file.display().to_string(),
                }),
            Err(error) => Err(io(&file, &error)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_local_token_is_created_once_private_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let paths = Paths::resolve(Some(dir.path()));
        assert_eq!(local::read(&paths).unwrap(), None, "absent until created");
        let first = local::load_or_create(&paths).unwrap();
        assert!(first.starts_with("zuno_") && first.len() == 69, "{first}");
        assert_eq!(local::load_or_create(&paths).unwrap(), first);
        assert_eq!(
            local::read(&paths).unwrap().as_deref(),
            Some(first.as_str())
        );
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            let file = local::path(&paths);
            let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600);
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
            assert!(matches!(
                local::read(&paths),
                Err(local::LocalTokenError::Exposed { .. })
            ));
        }
    }

    /// Issue 31, item 5: a token file another user owns is refused even at mode 0600 (its
    /// planter knows the token). Changing a file's owner needs root; elsewhere the rule itself is
    /// tested on made-up metadata in `ownership`.
    #[cfg(unix)]
    #[test]
    fn a_local_token_owned_by_another_user_is_refused() {
        if crate::ownership::current_user() != 0 {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let paths = Paths::resolve(Some(dir.path()));
        local::load_or_create(&paths).unwrap();
        let file = local::path(&paths);
        std::os::unix::fs::chown(&file, Some(4242), None).unwrap();
        for result in [local::read(&paths), local::load_or_create(&paths).map(Some)] {
            let error = result.unwrap_err();
            assert!(
                matches!(
                    error,
                    local::LocalTokenError::Untrusted(crate::ownership::Untrusted::ForeignOwner {
                        owner: 4242,
                        ..
                    })
                ),
                "{error}"
            );
        }
    }

    #[test]
    fn global_access_orders_none_read_write() {
        assert!(GlobalAccess::None < GlobalAccess::Read);
        assert!(GlobalAccess::Read < GlobalAccess::Write);
        for access in [GlobalAccess::None, GlobalAccess::Read, GlobalAccess::Write] {
            assert_eq!(GlobalAccess::parse(access.as_str()), Some(access));
        }
    }
}
