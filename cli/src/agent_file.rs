//! An agent's configuration file (Claude Code's `settings.json`, Codex's `config.toml`, …) read
//! and written the way its owner set it up. A symlinked file — dotfiles kept in a repository — is
//! written through the link, to the file it names, and never replaced by a regular file; the
//! write is atomic in that file's own directory (a temporary file beside it, fsync, rename, fsync
//! of the directory) and keeps its permission bits.

use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Links followed before giving up (as Linux's `MAXSYMLINKS`).
const MAX_LINKS: usize = 40;

/// Whether `path` itself is a symbolic link.
pub fn is_link(path: &Path) -> bool {
    fs::symlink_metadata(path).is_ok_and(|meta| meta.file_type().is_symlink())
}

/// The file `path` names once every link is followed (also when the last target is absent: a
/// dangling link is written through, creating its target).
pub fn resolve(path: &Path) -> io::Result<PathBuf> {
    let mut current = path.to_path_buf();
    for _ in 0..MAX_LINKS {
        match fs::symlink_metadata(&current) {
            Ok(meta) if meta.file_type().is_symlink() => {
                let target = fs::read_link(&current)?;
                current = match current.parent() {
                    Some(dir) if target.is_relative() => dir.join(target),
                    _ => target,
                };
            }
            Ok(_) => return Ok(current),
            Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(current),
            Err(error) => return Err(error),
        }
    }
    Err(io::Error::other("too many levels of symbolic links"))
}

/// The file's text, `None` when it (or a link's target) is absent.
pub fn read_optional(path: &Path) -> io::Result<Option<String>> {
    match fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(error) => Err(error),
    }
}

/// Replaces the content of the file `path` names (through links) with `text`, atomically; an
/// existing file keeps its mode, a new one gets the process's default. Returns the file written.
pub fn write(path: &Path, text: &str) -> io::Result<PathBuf> {
    let target = resolve(path)?;
    let dir = match target.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
        _ => PathBuf::from("."),
    };
    fs::create_dir_all(&dir)?;
    let mode = match fs::metadata(&target) {
        Ok(meta) => Some(meta.permissions().mode() & 0o7777),
        Err(error) if error.kind() == io::ErrorKind::NotFound => None,
        Err(error) => return Err(error),
    };
    let name = target
        .file_name()
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_default();
    let temporary = dir.join(format!(".{name}.zuno-{}.tmp", std::process::id()));
    let result = write_new(&temporary, text, mode).and_then(|()| fs::rename(&temporary, &target));
    if result.is_err() {
        let _ = fs::remove_file(&temporary);
    }
    result?;
    // The rename is durable once the directory is.
    if let Ok(dir) = fs::File::open(&dir) {
        let _ = dir.sync_all();
    }
    Ok(target)
}

/// Writes `text` to a new file at `path` (a stale one from a crashed run is replaced), with
/// `mode` exactly when given, and syncs it.
fn write_new(path: &Path, text: &str, mode: Option<u32>) -> io::Result<()> {
    let open = || {
        OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode.unwrap_or(0o666))
            .open(path)
    };
    let mut file = match open() {
        Err(error) if error.kind() == io::ErrorKind::AlreadyExists => {
            fs::remove_file(path)?;
            open()?
        }
        other => other?,
    };
    file.write_all(text.as_bytes())?;
    if let Some(mode) = mode {
        // The umask narrowed the mode at creation; the replaced file's bits are what it keeps.
        file.set_permissions(fs::Permissions::from_mode(mode))?;
    }
    file.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_link_is_written_through_and_keeps_the_targets_mode() {
        let dir = tempfile::tempdir().unwrap();
        let dotfiles = dir.path().join("dotfiles");
        fs::create_dir(&dotfiles).unwrap();
        let target = dotfiles.join("settings.json");
        fs::write(&target, "{}\n").unwrap();
        fs::set_permissions(&target, fs::Permissions::from_mode(0o640)).unwrap();
        let link = dir.path().join("settings.json");
        std::os::unix::fs::symlink("dotfiles/settings.json", &link).unwrap();

        let written = write(&link, "{\"a\": 1}\n").unwrap();

        assert_eq!(written, dir.path().join("dotfiles/settings.json"));
        assert!(is_link(&link), "the link stays a link");
        assert_eq!(fs::read_to_string(&target).unwrap(), "{\"a\": 1}\n");
        let mode = fs::metadata(&target).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o640);
        let names: Vec<_> = fs::read_dir(&dotfiles).unwrap().collect();
        assert_eq!(names.len(), 1, "no temporary file is left behind");
    }

    #[test]
    fn a_dangling_link_creates_its_target_and_a_loop_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let link = dir.path().join("config.toml");
        std::os::unix::fs::symlink(dir.path().join("real/config.toml"), &link).unwrap();
        write(&link, "x = 1\n").unwrap();
        assert_eq!(
            fs::read_to_string(dir.path().join("real/config.toml")).unwrap(),
            "x = 1\n"
        );
        assert!(is_link(&link));

        let a = dir.path().join("a");
        let b = dir.path().join("b");
        std::os::unix::fs::symlink(&b, &a).unwrap();
        std::os::unix::fs::symlink(&a, &b).unwrap();
        assert!(write(&a, "{}").is_err());
    }
}
