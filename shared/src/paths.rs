//! Where Zuno keeps its files: the database, `config.json`, the local token and the global
//! Memory projection (`memory/MEMORY.md`); docs/configuration.md lists them.
//!
//! Platform conventions by default (`~/.local/share/zuno` and `~/.config/zuno` on Linux,
//! `~/Library/Application Support/zuno` on macOS); `ZUNO_HOME` puts everything under one
//! directory. Start-up creates only the database; memory files are created by their first
//! accepted write.

use std::path::{Path, PathBuf};

use serde::Serialize;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Paths {
    pub data_dir: PathBuf,
    pub config_dir: PathBuf,
}

impl Paths {
    /// `ZUNO_HOME` when given, else the platform's directories.
    pub fn resolve(zuno_home: Option<&Path>) -> Paths {
        if let Some(home) = zuno_home {
            return Paths {
                data_dir: home.to_path_buf(),
                config_dir: home.to_path_buf(),
            };
        }
        match directories::ProjectDirs::from("", "", "zuno") {
            Some(dirs) => Paths {
                data_dir: dirs.data_dir().to_path_buf(),
                config_dir: dirs.config_dir().to_path_buf(),
            },
            None => Paths {
                data_dir: PathBuf::from(".zuno"),
                config_dir: PathBuf::from(".zuno"),
            },
        }
    }

    pub fn database(&self) -> PathBuf {
        self.data_dir.join("zuno.db")
    }

    pub fn config_file(&self) -> PathBuf {
        self.config_dir.join("config.json")
    }

    /// `$CONFIG/memory/MEMORY.md`.
    pub fn global_memory(&self) -> PathBuf {
        self.config_dir.join("memory").join("MEMORY.md")
    }

    /// Refuses a home that another user owns or may write to, and such a `config.json` (see
    /// [`crate::ownership`]): the data and configuration directories and the configuration file
    /// found there must be the user's (or root's) and writable by no one else. A configuration
    /// file the operator named (`explicit_config`) may belong to anyone, but no one else may
    /// write to it either. Absent paths pass.
    pub fn check_trusted(
        &self,
        explicit_config: Option<&Path>,
    ) -> Result<(), crate::ownership::Untrusted> {
        use crate::ownership::{Owner, check};
        check("the data directory", &self.data_dir, Owner::UserOrRoot)?;
        if self.config_dir != self.data_dir {
            check(
                "the configuration directory",
                &self.config_dir,
                Owner::UserOrRoot,
            )?;
        }
        match explicit_config {
            Some(file) => check("the configuration file", file, Owner::Any),
            None => check(
                "the configuration file",
                &self.config_file(),
                Owner::UserOrRoot,
            ),
        }
    }

    /// Takes group and other access away from Zuno's directories and the files it keeps in them
    /// (the data and configuration directories, `memory/`, the SQLite database with its `-wal`
    /// and `-shm`, `MEMORY.md`, the local token), for homes created before these were private or
    /// under a looser umask. Returns the paths it changed; absent ones are skipped.
    pub fn make_private(&self) -> std::io::Result<Vec<PathBuf>> {
        let database = self.database().display().to_string();
        let candidates = [
            self.data_dir.clone(),
            self.config_dir.clone(),
            self.config_dir.join("memory"),
            PathBuf::from(&database),
            PathBuf::from(format!("{database}-wal")),
            PathBuf::from(format!("{database}-shm")),
            self.global_memory(),
            self.data_dir.join("local-token"),
        ];
        let mut changed = Vec::new();
        for path in candidates {
            if remove_group_and_other_access(&path)? {
                changed.push(path);
            }
        }
        Ok(changed)
    }

    /// `<worktree>/.zuno/RULES.md`.
    pub fn project_rules(worktree: &Path) -> PathBuf {
        worktree.join(".zuno").join("RULES.md")
    }

    /// The paths `zuno debug paths` prints, each marked present or absent.
    pub fn report(&self, worktree: &Path, database_url: Option<&str>) -> Vec<PathEntry> {
        let database = match database_url {
            Some(url) if !url.starts_with("sqlite:") => PathEntry {
                name: "database",
                path: crate::db::redact_url(url),
                exists: None,
            },
            Some(url) => PathEntry::file("database", PathBuf::from(sqlite_path(url))),
            None => PathEntry::file("database", self.database()),
        };
        vec![
            database,
            PathEntry::file("config", self.config_file()),
            PathEntry::file("global memory", self.global_memory()),
            PathEntry::file("project rules", Paths::project_rules(worktree)),
        ]
    }
}

/// Clears the group and other bits of `path` (links not followed: a link is left alone); false
/// when it is absent or already private.
pub fn remove_group_and_other_access(path: &Path) -> std::io::Result<bool> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        let meta = match std::fs::symlink_metadata(path) {
            Ok(meta) if !meta.file_type().is_symlink() => meta,
            Ok(_) => return Ok(false),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(false),
            Err(error) => return Err(error),
        };
        let mode = meta.permissions().mode() & 0o7777;
        if mode & 0o077 == 0 {
            return Ok(false);
        }
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode & 0o7700))?;
        Ok(true)
    }
    #[cfg(not(unix))]
    {
        let _ = path;
        Ok(false)
    }
}

/// The file path inside a `sqlite:` URL.
pub fn sqlite_path(url: &str) -> &str {
    let rest = url.strip_prefix("sqlite:").unwrap_or(url);
    let rest = rest.strip_prefix("//").unwrap_or(rest);
    rest.split('?').next().unwrap_or(rest)
}

/// One line of `zuno debug paths`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PathEntry {
    pub name: &'static str,
    pub path: String,
    /// `None` for non-file stores (a Postgres URL).
    pub exists: Option<bool>,
}

impl PathEntry {
    fn file(name: &'static str, path: PathBuf) -> PathEntry {
        let exists = Some(path.exists());
        PathEntry {
            name,
            path: path.display().to_string(),
            exists,
        }
    }

    pub fn render(&self) -> String {
        let marker = if self.exists == Some(false) {
            " (absent)"
        } else {
            ""
        };
        format!("{:<14} {}{marker}", format!("{}:", self.name), self.path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zuno_home_holds_everything() {
        let paths = Paths::resolve(Some(Path::new("/srv/zuno")));
        assert_eq!(paths.database(), PathBuf::from("/srv/zuno/zuno.db"));
        assert_eq!(paths.config_file(), PathBuf::from("/srv/zuno/config.json"));
        assert_eq!(
            paths.global_memory(),
            PathBuf::from("/srv/zuno/memory/MEMORY.md")
        );
        assert_eq!(
            Paths::project_rules(Path::new("/work/repo")),
            PathBuf::from("/work/repo/.zuno/RULES.md")
        );
    }

    #[test]
    fn absent_stores_are_marked() {
        let dir = tempfile::tempdir().unwrap();
        let paths = Paths::resolve(Some(dir.path()));
        std::fs::write(paths.config_file(), "{}").unwrap();
        let report = paths.report(dir.path(), None);
        let render: Vec<String> = report.iter().map(PathEntry::render).collect();
        assert!(render[0].ends_with("zuno.db (absent)"), "{render:?}");
        assert!(!render[1].contains("(absent)"), "{render:?}");
        assert!(render[2].ends_with("MEMORY.md (absent)"));
        assert!(render[3].ends_with("RULES.md (absent)"));
    }

    #[test]
    fn sqlite_urls_map_to_files() {
        assert_eq!(sqlite_path("sqlite:///tmp/a.db"), "/tmp/a.db");
        assert_eq!(sqlite_path("sqlite:/tmp/a.db?mode=rwc"), "/tmp/a.db");
    }
}
