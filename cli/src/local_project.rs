//! The project a working directory belongs to on this machine.

use std::path::Path;

use zuno_shared::transcript::import::project_for_cwd;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalProject {
    pub id: String,
    pub name: String,
    /// The repository root, when the working directory lies in one on this machine.
    pub worktree: Option<String>,
}

/// A working directory inside a repository belongs to the repository's project: the nearest
/// ancestor holding `.git` (a directory, or a file in a linked worktree or submodule) is both
/// the project's identity and the worktree its hook binds. A directory in no repository is a
/// project of its own, bound to no worktree, so a session in a parent directory such as
/// `~/src` never claims the repositories below it. A repository at the home directory or at
/// `/` (a dotfiles repository) counts as none. A path from an imported file that does not
/// exist here, or climbs with `..`, never makes Zuno write anywhere.
pub fn local_project(cwd: &str) -> LocalProject {
    let home = directories::BaseDirs::new().map(|dirs| dirs.home_dir().to_path_buf());
    match repository_root(cwd, home.as_deref()) {
        Some(root) => {
            let (id, name) = project_for_cwd(&root);
            LocalProject {
                id,
                name,
                worktree: Some(root),
            }
        }
        None => {
            let (id, name) = project_for_cwd(cwd);
            LocalProject {
                id,
                name,
                worktree: None,
            }
        }
    }
}

/// The nearest ancestor of `cwd` (itself included) holding `.git`, by name (no links
/// resolved, so a repository opened at its own path keeps the project id it always had).
pub fn repository_root(cwd: &str, home: Option<&Path>) -> Option<String> {
    let path = Path::new(cwd.trim_end_matches('/'));
    let path = if path.as_os_str().is_empty() {
        Path::new("/")
    } else {
        path
    };
    if !path.is_absolute() || !path.is_dir() || cwd.contains("..") {
        return None;
    }
    let root = path
        .ancestors()
        .find(|dir| std::fs::symlink_metadata(dir.join(".git")).is_ok())?;
    let unsuitable = root.parent().is_none() || home.is_some_and(|home| root == home);
    if unsuitable {
        return None;
    }
    root.to_str().map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_working_directory_binds_its_repository_root_and_never_a_parent_of_repositories() {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().join("home");
        let src = home.join("src");
        let repo = src.join("app");
        std::fs::create_dir_all(repo.join(".git")).unwrap();
        std::fs::create_dir_all(repo.join("crates/core")).unwrap();
        // A linked worktree or submodule has a `.git` file.
        let linked = src.join("linked");
        std::fs::create_dir_all(&linked).unwrap();
        std::fs::write(
            linked.join(".git"),
            "gitdir: ../app/.git/worktrees/linked\n",
        )
        .unwrap();
        let text = |path: &Path| path.to_str().unwrap().to_owned();
        let root = |path: &Path| repository_root(&text(path), Some(&home));

        assert_eq!(root(&src), None, "a parent of repositories is no root");
        assert_eq!(root(&repo), Some(text(&repo)));
        assert_eq!(root(&repo.join("crates/core")), Some(text(&repo)));
        assert_eq!(root(&linked), Some(text(&linked)));
        // Paths that do not exist here, relative ones and climbing ones bind nothing.
        assert_eq!(repository_root("/definitely/not/here", Some(&home)), None);
        assert_eq!(repository_root("relative/app", Some(&home)), None);
        let climbing = format!("{}/crates/..", text(&repo));
        assert_eq!(repository_root(&climbing, Some(&home)), None);

        // The project of a subdirectory is the repository's, under the id the repository's own
        // sessions always had.
        let inside = local_project(&text(&repo.join("crates/core")));
        assert_eq!(inside.worktree, Some(text(&repo)));
        assert_eq!(inside.id, project_for_cwd(&text(&repo)).0);
        assert_eq!(inside.name, "app");
        let outside = local_project(&text(&src));
        assert_eq!(outside.worktree, None);
        assert_eq!(outside.id, project_for_cwd(&text(&src)).0);
        // A dotfiles repository at the home directory is no project root.
        std::fs::create_dir_all(home.join(".git")).unwrap();
        assert_eq!(root(&src), None);
        assert_eq!(root(&repo), Some(text(&repo)));
    }
}
