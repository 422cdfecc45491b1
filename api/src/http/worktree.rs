//! Worktrees are claims. A project's worktree is where Zuno writes `.zuno/RULES.md` and Skills and
//! from where it adopts an existing `RULES.md`, so binding one is an act of the user (the local
//! token or a `--user` token) and the path must be:
//!
//! - absolute, and stored canonical (symbolic links resolved), so two spellings of one directory
//!   are one claim;
//! - an existing directory strictly inside one of `server.worktree_roots` (default: the home
//!   directory of the user running the server);
//! - not inside, above or equal to another project's worktree (checked where the project is
//!   stored, under the same lock as the insert);
//! - not a sensitive directory ([`Sensitive`]): the home directory itself, `/`, or anything in
//!   a directory that holds credentials or Zuno's own data (`~/.ssh`, `~/.gnupg`, …), even when
//!   a configured root contains it.
//!
//! Refusals that depend on the filesystem all read the same, so they do not tell whether a path
//! exists. A sensitive path is refused by name, with its own message, since it says nothing
//! about what exists.

use std::path::{Component, Path, PathBuf};

use zuno_shared::config::ServerConfig;
use zuno_shared::paths::Paths;

use super::error::ApiError;

/// Directories under the home directory that hold credentials or other programs' settings; a
/// worktree may be neither one of them nor inside one.
pub const SENSITIVE_HOME_DIRS: &[&str] = &[
    ".ssh",
    ".gnupg",
    ".aws",
    ".azure",
    ".kube",
    ".docker",
    ".password-store",
    ".config",
    ".local",
    "Library",
];

/// Why a requested worktree was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum WorktreeRefusal {
    #[error("must be 1–{MAX_WORKTREE_BYTES} bytes without NUL")]
    Shape,
    #[error("must be an absolute path")]
    NotAbsolute,
    /// Not an existing directory strictly inside a root (worded alike for every such case).
    #[error(
        "must be an existing directory inside one of the server's worktree roots \
         (server.worktree_roots), not shared with another project"
    )]
    Refused,
    #[error(
        "`{0}` is a sensitive directory (the home directory itself, `/`, or inside ~/.ssh, \
         ~/.gnupg, ~/.aws, ~/.config, Zuno's data or configuration directory, …); \
         Zuno never binds one as a worktree"
    )]
    Sensitive(String),
}

impl From<WorktreeRefusal> for ApiError {
    fn from(refusal: WorktreeRefusal) -> ApiError {
        ApiError::bad_request("worktree", refusal.to_string())
    }
}

/// The directories refused as worktrees: `exact` ones (the home directory, `/`) and `trees`
/// refused with everything under them. Both spellings of each (as named and canonical) are
/// kept, so a link to one is refused too.
#[derive(Debug, Clone, Default)]
pub struct Sensitive {
    exact: Vec<PathBuf>,
    trees: Vec<PathBuf>,
}

impl Sensitive {
    /// The list for a server with these data and configuration directories, run by a user
    /// whose home is `home`.
    pub fn new(home: Option<&Path>, paths: &Paths) -> Sensitive {
        let mut sensitive = Sensitive::default();
        sensitive.add_exact(Path::new("/"));
        let mut trees = vec![paths.data_dir.clone(), paths.config_dir.clone()];
        if let Some(home) = home {
            sensitive.add_exact(home);
            trees.extend(SENSITIVE_HOME_DIRS.iter().map(|dir| home.join(dir)));
        }
        for tree in trees {
            let tree = absolute(&tree);
            if let Ok(canonical) = tree.canonicalize() {
                sensitive.trees.push(canonical);
            }
            sensitive.trees.push(tree);
        }
        sensitive
    }

    /// The list for the user running this process.
    pub fn for_this_user(paths: &Paths) -> Sensitive {
        let home = directories::BaseDirs::new().map(|dirs| dirs.home_dir().to_path_buf());
        Sensitive::new(home.as_deref(), paths)
    }

    fn add_exact(&mut self, path: &Path) {
        if let Ok(canonical) = path.canonicalize() {
            self.exact.push(canonical);
        }
        self.exact.push(normalize(path));
    }

    /// Whether `path` (absolute) is refused; checked on its lexical form and, by the caller,
    /// again on its canonical one.
    pub fn contains(&self, path: &Path) -> bool {
        let path = normalize(path);
        self.exact.contains(&path) || self.trees.iter().any(|tree| path.starts_with(tree))
    }
}

/// `path` made absolute against the current directory (a relative `ZUNO_HOME`).
fn absolute(path: &Path) -> PathBuf {
    let joined = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir()
            .map(|dir| dir.join(path))
            .unwrap_or_else(|_| path.to_path_buf())
    };
    normalize(&joined)
}

/// `.` and `..` resolved by name, so `/home/me/src/../.ssh` is seen as `~/.ssh` before any
/// filesystem lookup.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

/// The longest worktree path accepted.
const MAX_WORKTREE_BYTES: usize = 4096;

/// The roots as canonical paths; a root that does not exist contains nothing.
pub fn roots(config: &ServerConfig) -> Vec<PathBuf> {
    zuno_shared::worktree::roots(config)
}

fn refused() -> ApiError {
    WorktreeRefusal::Refused.into()
}

/// Checks the shape of a requested worktree and resolves it to the canonical directory it
/// names inside a root, or refuses.
pub fn resolve(
    requested: &str,
    roots: &[PathBuf],
    sensitive: &Sensitive,
) -> Result<String, WorktreeRefusal> {
    if requested.is_empty() || requested.len() > MAX_WORKTREE_BYTES || requested.contains('\0') {
        return Err(WorktreeRefusal::Shape);
    }
    let path = Path::new(requested);
    if !path.is_absolute() {
        return Err(WorktreeRefusal::NotAbsolute);
    }
    if sensitive.contains(path) {
        return Err(WorktreeRefusal::Sensitive(requested.to_owned()));
    }
    let canonical = path.canonicalize().map_err(|_| WorktreeRefusal::Refused)?;
    if sensitive.contains(&canonical) {
        return Err(WorktreeRefusal::Sensitive(requested.to_owned()));
    }
    let is_dir = std::fs::metadata(&canonical).is_ok_and(|meta| meta.is_dir());
    let inside = roots
        .iter()
        .any(|root| canonical != *root && canonical.starts_with(root));
    if !(is_dir && inside) {
        return Err(WorktreeRefusal::Refused);
    }
    canonical
        .to_str()
        .map(str::to_owned)
        .ok_or(WorktreeRefusal::Refused)
}

/// [`resolve`] off the async runtime's threads, with the server's roots and sensitive list.
pub async fn resolve_blocking(
    requested: String,
    config: &ServerConfig,
    paths: &Paths,
) -> Result<String, ApiError> {
    let roots = roots(config);
    let sensitive = Sensitive::for_this_user(paths);
    tokio::task::spawn_blocking(move || resolve(&requested, &roots, &sensitive))
        .await
        .map_err(|error| ApiError::Internal(anyhow::anyhow!("worktree check failed: {error}")))?
        .map_err(ApiError::from)
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
            resolve(repo.to_str().unwrap(), &roots, &Sensitive::default()).unwrap(),
            repo.to_str().unwrap()
        );
        let dotted = format!("{}/repo/../repo", root_path.display());
        assert_eq!(
            resolve(&dotted, &roots, &Sensitive::default()).unwrap(),
            repo.to_str().unwrap()
        );
        let refusals: Vec<String> = [
            "/etc".to_owned(),
            "/definitely/not/here".to_owned(),
            format!("{}/missing", root_path.display()),
            format!("{}/file", root_path.display()),
            root_path.display().to_string(),
        ]
        .iter()
        .map(|path| {
            resolve(path, &roots, &Sensitive::default())
                .unwrap_err()
                .to_string()
        })
        .collect();
        assert!(
            refusals.iter().all(|r| r == &refusals[0]),
            "every filesystem refusal reads the same: {refusals:?}"
        );
        assert!(resolve("relative/path", &roots, &Sensitive::default()).is_err());
        #[cfg(unix)]
        {
            let link = root_path.join("link-to-etc");
            std::os::unix::fs::symlink("/etc", &link).unwrap();
            assert_eq!(
                resolve(link.to_str().unwrap(), &roots, &Sensitive::default())
                    .unwrap_err()
                    .to_string(),
                refusals[0],
                "a link out of the roots is resolved and refused"
            );
        }
    }

    #[test]
    fn sensitive_directories_are_refused_inside_a_root_and_through_links() {
        let root = tempfile::tempdir().unwrap();
        let home = root.path().canonicalize().unwrap().join("home");
        let data = root.path().canonicalize().unwrap().join("zuno-data");
        for dir in [".ssh/keys", ".gnupg", ".config/app", "src/repo"] {
            std::fs::create_dir_all(home.join(dir)).unwrap();
        }
        std::fs::create_dir_all(&data).unwrap();
        let paths = Paths {
            data_dir: data.clone(),
            config_dir: data.clone(),
        };
        let sensitive = Sensitive::new(Some(&home), &paths);
        // The root is above the home directory, so only the sensitive list stands in the way.
        let roots = vec![root.path().canonicalize().unwrap()];
        let link = home.join("src/keys-link");
        std::os::unix::fs::symlink(home.join(".ssh"), &link).unwrap();
        for refused in [
            home.clone(),
            home.join(".ssh"),
            home.join(".ssh/keys"),
            home.join(".gnupg"),
            home.join(".config/app"),
            home.join("src/../.ssh"),
            data.clone(),
            link,
        ] {
            let answer = resolve(refused.to_str().unwrap(), &roots, &sensitive);
            assert!(
                matches!(answer, Err(WorktreeRefusal::Sensitive(_))),
                "{}: {answer:?}",
                refused.display()
            );
        }
        assert!(matches!(
            resolve("/", &[PathBuf::from("/")], &sensitive),
            Err(WorktreeRefusal::Sensitive(_))
        ));
        // A missing path under a sensitive directory reads as sensitive too, not as missing.
        assert!(matches!(
            resolve(home.join(".aws/none").to_str().unwrap(), &roots, &sensitive),
            Err(WorktreeRefusal::Sensitive(_))
        ));
        let repo = home.join("src/repo");
        assert_eq!(
            resolve(repo.to_str().unwrap(), &roots, &sensitive).unwrap(),
            repo.to_str().unwrap()
        );
    }
}
