//! Whether a directory or file Zuno trusts (its home, `config.json`, the local token) could have
//! been put there or changed by another user, checked the way OpenSSH's `StrictModes` checks
//! `~/.ssh`: it must belong to the user running Zuno (or to root) and be writable by nobody
//! else. A `config.json` planted in a world-writable home could widen `worktree_roots` to `/`,
//! and a planted `local-token` would be a token its planter knows; so a process that finds
//! either refuses to start and says which path to fix and how (README, Security).

use std::path::Path;

/// What the check needs from a file's metadata; a test can make one up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Facts {
    pub owner: u32,
    pub mode: u32,
}

/// Which owners are accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner {
    /// The user running Zuno, or root.
    UserOrRoot,
    /// Anyone: a file the operator named explicitly (`--config`), such as a root- or
    /// host-owned file mounted read-only into a container.
    Any,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Untrusted {
    #[error(
        "refusing to use {what} {path}: it is owned by uid {owner}, not by uid {user} (the user running Zuno) or root. Fix: `chown {user} {path}` if its content is yours, else remove it"
    )]
    ForeignOwner {
        what: &'static str,
        path: String,
        owner: u32,
        user: u32,
    },
    #[error(
        "refusing to use {what} {path}: it is writable by {by} (mode {mode:o}), who could change what Zuno reads there. Fix: `chmod go-w {path}`"
    )]
    Writable {
        what: &'static str,
        path: String,
        mode: u32,
        by: &'static str,
    },
    #[error("cannot check {what} {path}: {reason}")]
    Unreadable {
        what: &'static str,
        path: String,
        reason: String,
    },
}

/// The rule itself, on `facts` for `path`, for a process running as `user`.
pub fn check_facts(
    what: &'static str,
    path: &Path,
    facts: Facts,
    owner: Owner,
    user: u32,
) -> Result<(), Untrusted> {
    let path = path.display().to_string();
    if owner == Owner::UserOrRoot && facts.owner != user && facts.owner != 0 {
        return Err(Untrusted::ForeignOwner {
            what,
            path,
            owner: facts.owner,
            user,
        });
    }
    let by = match (facts.mode & 0o020 != 0, facts.mode & 0o002 != 0) {
        (_, true) => "every user",
        (true, false) => "its group",
        (false, false) => return Ok(()),
    };
    Err(Untrusted::Writable {
        what,
        path,
        mode: facts.mode & 0o7777,
        by,
    })
}

/// [`check_facts`] on the file or directory at `path` (links followed: what is checked is what
/// would be read). An absent path is fine: Zuno creates its own, privately.
pub fn check(what: &'static str, path: &Path, owner: Owner) -> Result<(), Untrusted> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt as _;
        let meta = match std::fs::metadata(path) {
            Ok(meta) => meta,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(error) => {
                return Err(Untrusted::Unreadable {
                    what,
                    path: path.display().to_string(),
                    reason: error.to_string(),
                });
            }
        };
        let facts = Facts {
            owner: meta.uid(),
            mode: meta.mode(),
        };
        check_facts(what, path, facts, owner, current_user())
    }
    #[cfg(not(unix))]
    {
        let _ = (what, path, owner);
        Ok(())
    }
}

/// The effective uid of this process.
#[cfg(unix)]
pub fn current_user() -> u32 {
    nix::unistd::geteuid().as_raw()
}

#[cfg(test)]
mod tests {
    use super::*;

    const USER: u32 = 1000;

    fn facts(owner: u32, mode: u32) -> Facts {
        Facts { owner, mode }
    }

    #[test]
    fn only_the_user_or_root_may_own_and_only_they_may_write() {
        let path = Path::new("/home/u/.local/share/zuno/local-token");
        let check = |facts, owner| check_facts("the local token", path, facts, owner, USER);
        assert_eq!(check(facts(USER, 0o100600), Owner::UserOrRoot), Ok(()));
        assert_eq!(check(facts(0, 0o40755), Owner::UserOrRoot), Ok(()));
        let foreign = check(facts(4242, 0o100600), Owner::UserOrRoot).unwrap_err();
        assert_eq!(
            foreign,
            Untrusted::ForeignOwner {
                what: "the local token",
                path: path.display().to_string(),
                owner: 4242,
                user: USER,
            }
        );
        let message = foreign.to_string();
        assert!(
            message.contains("/home/u/.local/share/zuno/local-token")
                && message.contains("chown 1000"),
            "{message}"
        );
        assert_eq!(check(facts(4242, 0o100644), Owner::Any), Ok(()));
        for (mode, by) in [
            (0o40777, "every user"),
            (0o40775, "its group"),
            (0o100602, "every user"),
        ] {
            let refusal = check(facts(USER, mode), Owner::Any).unwrap_err();
            assert!(
                matches!(&refusal, Untrusted::Writable { by: found, .. } if *found == by),
                "{mode:o}: {refusal}"
            );
            assert!(refusal.to_string().contains("chmod go-w"), "{refusal}");
        }
        // The sticky bit does not make a world-writable directory private.
        assert!(check(facts(USER, 0o41777), Owner::UserOrRoot).is_err());
    }

    #[cfg(unix)]
    #[test]
    fn absent_paths_pass_and_real_modes_are_read() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(
            check("the home", &dir.path().join("absent"), Owner::UserOrRoot),
            Ok(())
        );
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(matches!(
            check("the home", dir.path(), Owner::UserOrRoot),
            Err(Untrusted::Writable { .. })
        ));
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        assert_eq!(check("the home", dir.path(), Owner::UserOrRoot), Ok(()));
    }
}
