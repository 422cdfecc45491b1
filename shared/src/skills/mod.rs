//! The slow path of the learning flywheel: repeated, verified evidence is consolidated into
//! patterns, a pattern becomes a Skill candidate, the candidate is evaluated offline, and an
//! approved one is written into the worktree at most once.
//!
//! * [`pattern`]: patterns grouped from repeated verified evidence, their promotion, rejection
//!   (suppression until new evidence) and the explicit one-evidence `promote`.
//! * [`candidate`]: Skill candidates — the complete SKILL.md, its unified diff, rules, evidence,
//!   exact source identity and digest, target and writability, operation and state.
//! * [`evaluation`]: immutable versioned offline suites, the cassette dispatcher, the pass rule,
//!   and runs fenced by an absolute deadline and an ownership token.
//! * [`apply`]: digest-checked apply and undo with persisted before/after snapshots under the OS
//!   path lock, and reconciliation that classifies (never replays) an interrupted effect.
//! * [`schedule`]: admission of aggregation checks (interval buckets plus evidence identity).
//!
//! Skill files live only at `<worktree>/.agents/skills/<name>/SKILL.md` with a validated name;
//! untrusted model text never becomes a path.

pub mod apply;
pub mod candidate;
pub mod diff;
pub mod evaluation;
pub mod pattern;
pub mod schedule;
pub mod store;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::config::Config;
use crate::db::{Db, StoreError};
use crate::ledger::{Ledger, LedgerError};
use crate::managed_file::ManagedFileError;

/// Where project Skills live, relative to the worktree.
pub const SKILLS_DIR: [&str; 2] = [".agents", "skills"];
/// The file name of a Skill.
pub const SKILL_FILE: &str = "SKILL.md";
/// The longest Skill name accepted.
pub const MAX_NAME_LEN: usize = 64;

/// Errors of the Skill services.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SkillError {
    #[error("{0}")]
    NotFound(String),
    /// The request does not fit the current state (wrong state, lost a race).
    #[error("{0}")]
    Conflict(String),
    /// The source or destination drifted: the candidate is now `stale` and nothing was written.
    #[error("{0}")]
    Stale(String),
    #[error("invalid `{field}`: {reason}")]
    Invalid { field: &'static str, reason: String },
    #[error(transparent)]
    File(#[from] ManagedFileError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Ledger(#[from] LedgerError),
}

impl From<sqlx::Error> for SkillError {
    fn from(error: sqlx::Error) -> Self {
        SkillError::Store(StoreError::Database(error))
    }
}

/// The Skill services over one database. Cheap to clone.
#[derive(Clone)]
pub struct SkillService {
    db: Db,
    config: Arc<Config>,
    ledger: Ledger,
}

impl SkillService {
    pub fn new(ledger: Ledger, config: Arc<Config>) -> SkillService {
        SkillService {
            db: ledger.db().clone(),
            config,
            ledger,
        }
    }

    pub fn db(&self) -> &Db {
        &self.db
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    pub fn ledger(&self) -> &Ledger {
        &self.ledger
    }

    fn now(&self) -> i64 {
        self.ledger.now_ms()
    }
}

/// Checks a Skill name: 1–64 characters of `[a-z0-9-]`, starting and ending with a letter or
/// digit. Names become one path component, so nothing else is allowed.
pub fn validate_name(name: &str) -> Result<(), SkillError> {
    let bytes = name.as_bytes();
    let ok = !bytes.is_empty()
        && bytes.len() <= MAX_NAME_LEN
        && bytes[0].is_ascii_alphanumeric()
        && bytes[bytes.len() - 1].is_ascii_alphanumeric()
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-');
    if ok {
        Ok(())
    } else {
        Err(SkillError::Invalid {
            field: "name",
            reason: format!(
                "`{}` is not a Skill name (1–{MAX_NAME_LEN} characters of a-z, 0-9 and `-`, starting and ending with a letter or digit)",
                name.escape_debug()
            ),
        })
    }
}

/// A Skill name derived from untrusted text (a model's concept): lower-case letters and digits,
/// other runs become one `-`, at most 48 characters; `learned-skill` when nothing is left.
pub fn slug(text: &str) -> String {
    let mut out = String::new();
    let mut dash = false;
    for c in text.chars() {
        if c.is_ascii_alphanumeric() {
            if dash && !out.is_empty() {
                out.push('-');
            }
            dash = false;
            out.push(c.to_ascii_lowercase());
        } else {
            dash = true;
        }
        if out.len() >= 48 {
            break;
        }
    }
    let out = out.trim_matches('-').to_owned();
    if out.is_empty() {
        String::from("learned-skill")
    } else {
        out
    }
}

/// `<worktree>/.agents/skills/<name>/SKILL.md` for an absolute worktree and a valid name.
pub fn skill_path(worktree: &Path, name: &str) -> Result<PathBuf, SkillError> {
    if !worktree.is_absolute() {
        return Err(SkillError::Invalid {
            field: "worktree",
            reason: String::from("Skills need a project with an absolute worktree"),
        });
    }
    validate_name(name)?;
    let mut path = worktree.to_path_buf();
    for part in SKILLS_DIR {
        path.push(part);
    }
    path.push(name);
    path.push(SKILL_FILE);
    Ok(path)
}

/// True when `path` is exactly a managed Skill path under `worktree`.
pub fn is_managed_path(worktree: &Path, path: &Path) -> bool {
    let Ok(relative) = path.strip_prefix(worktree) else {
        return false;
    };
    let parts: Vec<_> = relative.components().collect();
    parts.len() == 4
        && parts[0].as_os_str() == SKILLS_DIR[0]
        && parts[1].as_os_str() == SKILLS_DIR[1]
        && parts[2]
            .as_os_str()
            .to_str()
            .is_some_and(|name| validate_name(name).is_ok())
        && parts[3].as_os_str() == SKILL_FILE
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_one_safe_path_component() {
        assert!(validate_name("use-pnpm").is_ok());
        assert!(validate_name("a").is_ok());
        for bad in [
            "",
            "-a",
            "a-",
            "A",
            "a/b",
            "..",
            "a.b",
            "a b",
            &"x".repeat(65),
        ] {
            assert!(validate_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn slugs_are_valid_names() {
        assert_eq!(slug("Use pnpm, not npm!"), "use-pnpm-not-npm");
        assert_eq!(slug("../../etc/passwd"), "etc-passwd");
        assert_eq!(slug("“”"), "learned-skill");
        assert!(validate_name(&slug(&"long word ".repeat(20))).is_ok());
    }

    #[test]
    fn skill_paths_stay_under_the_worktree() {
        let worktree = Path::new("/src/repo");
        let path = skill_path(worktree, "use-pnpm").unwrap();
        assert_eq!(
            path,
            Path::new("/src/repo/.agents/skills/use-pnpm/SKILL.md")
        );
        assert!(is_managed_path(worktree, &path));
        assert!(skill_path(worktree, "../x").is_err());
        assert!(skill_path(Path::new("relative"), "x").is_err());
        assert!(!is_managed_path(
            worktree,
            Path::new("/src/repo/.agents/skills/x/../../y/SKILL.md")
        ));
    }
}
