//! Worktrees are claims. A project's worktree is where Zuno writes `.zuno/RULES.md` and Skills and
//! from where it adopts an existing `RULES.md`, so binding one is an act of the user (the local
//! token or a `--user` token) and the path must be:
//!
//! - absolute, and stored canonical (symbolic links resolved), so two spellings of one directory
//!   are one claim;
//! - an existing directory strictly inside one of `server.worktree_roots` (default: the home
//!   directory of the user running the server);
//! - not inside, above or equal to another project's worktree (checked where the project is
//!   stored, under the same lock as the insert).
//!
//! Refusals that depend on the filesystem all read the same, so they do not tell whether a path
//! exists.

use std::path::{Path, PathBuf};

use zuno_shared::config::ServerConfig;

use super::error::ApiError;

/// The longest worktree path accepted.
const MAX_WORKTREE_BYTES: usize = 4096;

/// The roots as canonical paths; a root that does not exist contains nothing.
pub fn roots(config: &ServerConfig) -> Vec<PathBuf> {
    zuno_shared::worktree::roots(config)
}

fn refused() -> ApiError {
    ApiError::bad_request(
        "worktree",
        "must be an existing directory inside one of the server's worktree roots \
         (server.worktree_roots), not shared with another project",
    )
}

/// Checks the shape of a requested worktree and resolves it to the canonical directory it
/// names inside a root, or refuses.
pub fn resolve(requested: &str, roots: &[PathBuf]) -> Result<String, ApiError> {
    if requested.is_empty() || requested.len() > MAX_WORKTREE_BYTES || requested.contains('\0') {
        return Err(ApiError::bad_request(
            "worktree",
            format!("must be 1–{MAX_WORKTREE_BYTES} bytes without NUL"),
        ));
    }
    let path = Path::new(requested);
    if !path.is_absolute() {
        return Err(ApiError::bad_request(
            "worktree",
            "must be an absolute path",
        ));
    }
    let canonical = path.canonicalize().map_err(|_| refused())?;
    let is_dir = std::fs::metadata(&canonical).is_ok_and(|meta| meta.is_dir());
    let inside = roots
        .iter()
        .any(|root| canonical != *root && canonical.starts_with(root));
    if !(is_dir && inside) {
        return Err(refused());
    }
    canonical.to_str().map(str::to_owned).ok_or_else(refused)
}

/// [`resolve`] off the async runtime's threads.
pub async fn resolve_blocking(requested: String, roots: Vec<PathBuf>) -> Result<String, ApiError> {
    tokio::task::spawn_blocking(move || resolve(&requested, &roots))
        .await
        .map_err(|error| ApiError::Internal(anyhow::anyhow!("worktree check failed: {error}")))?
}

/// The refusal for a worktree that overlaps another project's, worded like every other
/// filesystem refusal unless the caller may see that project.
pub fn overlap(project: &str, caller_sees_it: bool) -> ApiError {
    if caller_sees_it {
        ApiError::bad_request(
            "worktree",
            format!("the worktree overlaps the worktree of project `{project}`"),
        )
    } else {
        refused()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_existing_directories_strictly_inside_a_root_are_claimed() {
        let root = tempfile::tempdir().unwrap();
        let root_path = root.path().canonicalize().unwrap();
        let repo = root_path.join("repo");
        std::fs::create_dir(&repo).unwrap();
        std::fs::write(root_path.join("file"), "x").unwrap();
        let roots = vec![root_path.clone()];
        assert_eq!(
            resolve(repo.to_str().unwrap(), &roots).unwrap(),
            repo.to_str().unwrap()
        );
        let dotted = format!("{}/repo/../repo", root_path.display());
        assert_eq!(resolve(&dotted, &roots).unwrap(), repo.to_str().unwrap());
        let refusals: Vec<String> = [
            "/etc".to_owned(),
            "/definitely/not/here".to_owned(),
            format!("{}/missing", root_path.display()),
            format!("{}/file", root_path.display()),
            root_path.display().to_string(),
        ]
        .iter()
        .map(|path| resolve(path, &roots).unwrap_err().to_string())
        .collect();
        assert!(
            refusals.iter().all(|r| r == &refusals[0]),
            "every filesystem refusal reads the same: {refusals:?}"
        );
        assert!(resolve("relative/path", &roots).is_err());
        #[cfg(unix)]
        {
            let link = root_path.join("link-to-etc");
            std::os::unix::fs::symlink("/etc", &link).unwrap();
            assert_eq!(
                resolve(link.to_str().unwrap(), &roots)
                    .unwrap_err()
                    .to_string(),
                refusals[0],
                "a link out of the roots is resolved and refused"
            );
        }
    }
}
