//! A project's worktree after its claim. The claim stored the worktree canonical (symbolic links
//! resolved) and strictly inside one of `server.worktree_roots`; a directory on that path can be
//! replaced by a symbolic link later, and writing `<worktree>/.zuno/RULES.md` through it would
//! write (or importing would read) another project's file. So every projection write, adoption,
//! inspection and import resolves the stored path again and goes ahead only when it still
//! resolves to itself, inside a root ([`recheck`]).
//!
//! A check and the write after it are separate system calls: a link swapped in between them is
//! not caught here (`crate::managed_file` still refuses a link at `.zuno/` or at the file).

use std::path::{Path, PathBuf};

use crate::config::ServerConfig;

/// The worktree roots as canonical paths; a root that does not exist contains nothing.
pub fn roots(config: &ServerConfig) -> Vec<PathBuf> {
    let configured: Vec<PathBuf> = if config.worktree_roots.is_empty() {
        directories::BaseDirs::new()
            .map(|dirs| vec![dirs.home_dir().to_path_buf()])
            .unwrap_or_default()
    } else {
        config.worktree_roots.iter().map(PathBuf::from).collect()
    };
    configured
        .iter()
        .filter_map(|root| root.canonicalize().ok())
        .collect()
}

/// Why a claimed worktree may not be used any more. The messages name the stored path only:
/// where a link now points is for the server's log, not for an API caller.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WorktreeMoved {
    #[error(
        "the worktree {stored} no longer resolves to itself (a directory on its path was replaced by a symbolic link); nothing was read or written there: restore the directory or bind the project to its new place"
    )]
    Redirected { stored: String, resolved: String },
    #[error(
        "the worktree {stored} is no longer inside the server's worktree roots (server.worktree_roots); nothing was read or written there"
    )]
    OutsideRoots { stored: String },
    #[error(
        "the worktree {stored} cannot be resolved ({reason}); nothing was read or written there"
    )]
    Unresolvable { stored: String, reason: String },
}

/// The stored worktree, when it still resolves to itself and lies strictly inside one of
/// `roots` (canonical, from [`roots`]); the refusal otherwise, logged at WARN with where the
/// path now leads.
pub fn recheck(stored: &Path, roots: &[PathBuf]) -> Result<PathBuf, WorktreeMoved> {
    let result = resolve_again(stored, roots);
    if let Err(error) = &result {
        let resolved = match error {
            WorktreeMoved::Redirected { resolved, .. } => resolved.as_str(),
            _ => "",
        };
        tracing::warn!(worktree = %stored.display(), resolved, %error, "worktree refused");
    }
    result
}

fn resolve_again(stored: &Path, roots: &[PathBuf]) -> Result<PathBuf, WorktreeMoved> {
    let display = || stored.display().to_string();
    let canonical = stored
        .canonicalize()
        .map_err(|error| WorktreeMoved::Unresolvable {
            stored: display(),
            reason: error.to_string(),
        })?;
    if canonical != stored {
        return Err(WorktreeMoved::Redirected {
            stored: display(),
            resolved: canonical.display().to_string(),
        });
    }
    let inside = roots
        .iter()
        .any(|root| canonical != *root && canonical.starts_with(root));
    if !inside {
        return Err(WorktreeMoved::OutsideRoots { stored: display() });
    }
    Ok(canonical)
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;

    #[test]
    fn a_worktree_is_used_only_while_it_resolves_to_itself_inside_a_root() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        let repo = root.join("repo");
        let other = root.join("other");
        std::fs::create_dir(&repo).unwrap();
        std::fs::create_dir(&other).unwrap();
        let roots = vec![root.clone()];
        assert_eq!(recheck(&repo, &roots).unwrap(), repo);

        std::fs::remove_dir(&repo).unwrap();
        assert!(matches!(
            recheck(&repo, &roots),
            Err(WorktreeMoved::Unresolvable { .. })
        ));
        std::os::unix::fs::symlink(&other, &repo).unwrap();
        let refusal = recheck(&repo, &roots).unwrap_err();
        assert_eq!(
            refusal,
            WorktreeMoved::Redirected {
                stored: repo.display().to_string(),
                resolved: other.display().to_string(),
            }
        );
        assert!(
            !refusal.to_string().contains("other"),
            "the message does not tell where the link leads: {refusal}"
        );

        let elsewhere = tempfile::tempdir().unwrap();
        let outside = elsewhere.path().canonicalize().unwrap();
        assert_eq!(
            recheck(&outside, &roots),
            Err(WorktreeMoved::OutsideRoots {
                stored: outside.display().to_string()
            })
        );
        assert!(matches!(
            recheck(&root, &roots),
            Err(WorktreeMoved::OutsideRoots { .. })
        ));
    }
}
