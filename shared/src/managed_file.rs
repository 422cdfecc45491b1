//! Files Zuno manages on disk: path checks, the shared OS lock and atomic publish.
//!
//! Resident Memory is authoritative in the database; `$CONFIG/memory/MEMORY.md` (global) and
//! `<worktree>/.zuno/RULES.md` (project) are readable projections of it, and skill files in a
//! worktree are written the same way. This module only deals with the files; it never touches the
//! database and knows nothing of their format. Its rules:
//!
//! * A managed file and its immediate directory must be regular paths: not symbolic links, not
//!   Windows junctions, not other file types. [`check_regular`] is applied before every read and,
//!   under the lock, again before a file is replaced. Files are opened without following a
//!   final symbolic link, so a link swapped in after the check is refused too.
//! * Absent is the ordinary state. Reading and checking create nothing; locking creates only the
//!   lock file, and only inside a directory that already exists. The directory and the file are
//!   created by the first accepted write ([`publish`]), never at start-up.
//! * External edits are preserved and reported, never silently replaced: [`publish`] writes only
//!   over the exact bytes Zuno last wrote or adopted (compared by digest).
//! * Cooperating writers and the reconciler share an operating-system lock
//!   ([`with_lock`]/[`try_with_lock`]) on `<dir>/.<file-name>.lock` around comparison and atomic
//!   replacement, so a file effect of a retried job lands at most once.
//!
//! Everything here is synchronous file I/O; async callers wrap it in `spawn_blocking`.

use std::cell::RefCell;
use std::collections::HashSet;
use std::ffi::OsString;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// Why a managed file could not be checked, read, locked or published. Every message names the
/// path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ManagedFileError {
    /// The file or its immediate directory is a symbolic link (or a Windows junction).
    #[error(
        "memory path {} is a symbolic link or junction; managed memory files and their directory must be regular paths",
        .path.display()
    )]
    Symlink { path: PathBuf },
    /// The file is not a regular file, or its directory is not a directory.
    #[error(
        "memory path {} is not a regular file or directory where one is required",
        .path.display()
    )]
    NotRegular { path: PathBuf },
    /// An existing managed file could not be read (permissions, invalid UTF-8, ...).
    #[error("cannot read memory projection {}: {reason}", .path.display())]
    Unreadable { path: PathBuf, reason: String },
    /// A filesystem operation failed (create, write, sync, rename, lock).
    #[error("memory projection I/O failed at {}: {reason}", .path.display())]
    Io { path: PathBuf, reason: String },
    /// [`try_with_lock`] found the lock held by another writer.
    #[error("memory projection {} is locked by another writer", .path.display())]
    Busy { path: PathBuf },
}

/// A managed file as found on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileState {
    pub content: String,
    /// [`digest`] of the file's exact bytes.
    pub digest: String,
}

/// The outcome of [`publish`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Publish {
    /// The content was written; `digest` is what to record as "last written".
    Written { digest: String },
    /// The file holds bytes Zuno neither wrote nor adopted. Nothing was written; the file is
    /// preserved as found and `found_digest` identifies it for inspection and import.
    ExternalEdit { found_digest: String },
    /// The file already holds exactly this content; nothing was written.
    Unchanged { digest: String },
}

/// Where a managed file lives, which decides what [`publish_with`] may create and with which
/// permissions (README, Security: the file-permission model).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CreateDir {
    /// In a worktree (`<worktree>/.zuno`): only the immediate directory is created, so a missing
    /// worktree is an error, never recreated. What [`publish`] uses. A new directory or file
    /// follows the repository: group and others get the read (and, for a directory, search)
    /// access they have on its parent directory, never write ([`inherited_mode`]); an existing
    /// file keeps its mode.
    Immediate,
    /// In Zuno's own home: the immediate directory and any missing ancestors (`$CONFIG/memory`
    /// on a fresh install, where `$CONFIG` itself may not exist yet), all private: directories
    /// 0700, the file 0600, and an existing file loses any group or other access.
    WithAncestors,
}

/// The mode of a new file (or directory, `dir`) in a worktree whose parent directory has
/// `parent_mode`: the owner's read and write (and search), plus the read (and search) bits the
/// parent grants group and others.
pub fn inherited_mode(parent_mode: u32, dir: bool) -> u32 {
    if dir {
        0o700 | (parent_mode & 0o055)
    } else {
        0o600 | (parent_mode & 0o044)
    }
}

/// Creates `dir` (its parent must exist) with [`inherited_mode`] from its parent, whatever the
/// process's umask: a directory Zuno adds to a repository is as readable as the one it is in.
/// `Ok(())` when it exists already.
pub fn create_dir_in_worktree(dir: &Path) -> io::Result<()> {
    match fs::create_dir(dir) {
        Ok(()) => {}
        Err(err) if err.kind() == io::ErrorKind::AlreadyExists => return Ok(()),
        Err(err) => return Err(err),
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let parent = dir.parent().unwrap_or(Path::new("."));
        let parent_mode = fs::metadata(parent)?.permissions().mode();
        fs::set_permissions(
            dir,
            fs::Permissions::from_mode(inherited_mode(parent_mode, true)),
        )?;
    }
    Ok(())
}

/// Creates `dir` and its missing ancestors, each 0700.
fn create_private_dirs(dir: &Path) -> io::Result<()> {
    let mut builder = fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::DirBuilderExt;
        builder.mode(0o700);
    }
    builder.create(dir)
}

/// SHA-256 of `bytes`, lower-case hex.
pub fn digest(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

// ---------------------------------------------------------------------------------------------
// Regular-path checks and reading
// ---------------------------------------------------------------------------------------------

/// Checks the file and its immediate directory are regular paths (not symlinks, not junctions,
/// not other file types), using `symlink_metadata` on both (std reports Windows junctions, which
/// are name-surrogate reparse points, as symlinks). Absent is fine: `Ok(false)` when the file (or
/// its directory) does not exist, `Ok(true)` when it is a regular file in a real directory.
/// Creates nothing.
pub fn check_regular(path: &Path) -> Result<bool, ManagedFileError> {
    let dir = parent_dir(path)?;
    if !check_dir(dir)? {
        return Ok(false);
    }
    match fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_symlink() => Err(symlink(path)),
        Ok(meta) if meta.is_file() => Ok(true),
        Ok(_) => Err(not_regular(path)),
        Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(err) => Err(io_error(path, &err)),
    }
}

/// Reads the file after [`check_regular`]. `None` when it is absent. The file is opened
/// without following a final symbolic link; invalid UTF-8 or an unreadable file is
/// [`ManagedFileError::Unreadable`].
pub fn read(path: &Path) -> Result<Option<FileState>, ManagedFileError> {
    if !check_regular(path)? {
        return Ok(None);
    }
    let Some(existing) = read_existing(path)? else {
        return Ok(None);
    };
    let digest = digest(&existing.bytes);
    let content =
        String::from_utf8(existing.bytes).map_err(|err| ManagedFileError::Unreadable {
            path: path.to_path_buf(),
            reason: format!("not valid UTF-8 ({})", err.utf8_error()),
        })?;
    Ok(Some(FileState { content, digest }))
}

/// The directory a managed file lives in; `.` for a bare file name.
fn parent_dir(path: &Path) -> Result<&Path, ManagedFileError> {
    if path.file_name().is_none() {
        return Err(not_regular(path));
    }
    Ok(match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    })
}

/// `Ok(false)` when absent; the directory must be a real directory, not a link to one.
fn check_dir(dir: &Path) -> Result<bool, ManagedFileError> {
    match fs::symlink_metadata(dir) {
        Ok(meta) if meta.file_type().is_symlink() => Err(symlink(dir)),
        Ok(meta) if meta.is_dir() => Ok(true),
        Ok(_) => Err(not_regular(dir)),
        Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(err) => Err(io_error(dir, &err)),
    }
}

struct Existing {
    bytes: Vec<u8>,
    #[cfg_attr(not(unix), allow(dead_code))]
    permissions: fs::Permissions,
}

/// Opens without following a final link and re-checks the opened handle; `None` when absent.
fn read_existing(path: &Path) -> Result<Option<Existing>, ManagedFileError> {
    let mut options = OpenOptions::new();
    options.read(true);
    no_follow(&mut options, true);
    let mut file = match options.open(path) {
        Ok(file) => file,
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(err) if is_symlink_loop(&err) => return Err(symlink(path)),
        Err(err) => return Err(unreadable(path, &err)),
    };
    let meta = file.metadata().map_err(|err| unreadable(path, &err))?;
    if meta.file_type().is_symlink() {
        return Err(symlink(path));
    }
    if !meta.is_file() {
        return Err(not_regular(path));
    }
    let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    file.read_to_end(&mut bytes)
        .map_err(|err| unreadable(path, &err))?;
    Ok(Some(Existing {
        bytes,
        permissions: meta.permissions(),
    }))
}

/// Refuse a final symbolic link (or reparse point) instead of following it; for reads, also never
/// block on a FIFO swapped in after the check.
fn no_follow(options: &mut OpenOptions, reading: bool) {
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        let flags = if reading {
            libc::O_NOFOLLOW | libc::O_NONBLOCK
        } else {
            libc::O_NOFOLLOW
        };
        options.custom_flags(flags);
    }
    #[cfg(windows)]
    {
        use std::os::windows::fs::OpenOptionsExt;
        // FILE_FLAG_OPEN_REPARSE_POINT: open a link or junction itself; its metadata then
        // reports a symlink and is refused.
        let _ = reading;
        options.custom_flags(0x0020_0000);
    }
    #[cfg(not(any(unix, windows)))]
    {
        let _ = (options, reading);
    }
}

#[cfg(unix)]
fn is_symlink_loop(err: &io::Error) -> bool {
    err.raw_os_error() == Some(libc::ELOOP)
}

#[cfg(not(unix))]
fn is_symlink_loop(_err: &io::Error) -> bool {
    false
}

fn symlink(path: &Path) -> ManagedFileError {
    ManagedFileError::Symlink {
        path: path.to_path_buf(),
    }
}

fn not_regular(path: &Path) -> ManagedFileError {
    ManagedFileError::NotRegular {
        path: path.to_path_buf(),
    }
}

fn unreadable(path: &Path, err: &io::Error) -> ManagedFileError {
    ManagedFileError::Unreadable {
        path: path.to_path_buf(),
        reason: err.to_string(),
    }
}

fn io_error(path: &Path, err: &io::Error) -> ManagedFileError {
    if is_symlink_loop(err) {
        return symlink(path);
    }
    ManagedFileError::Io {
        path: path.to_path_buf(),
        reason: err.to_string(),
    }
}

// ---------------------------------------------------------------------------------------------
// The shared OS lock
// ---------------------------------------------------------------------------------------------

thread_local! {
    /// Lock files this thread currently holds, so nested `with_lock`/`publish` calls for the same
    /// path reuse the held lock instead of deadlocking against it.
    static HELD: RefCell<HashSet<PathBuf>> = RefCell::new(HashSet::new());
}

/// Runs `f` while holding the shared OS lock for `path`, waiting for other holders.
///
/// The lock is an exclusive `flock`/`LockFileEx` lock (via [`File::lock`]) on
/// `<dir>/.<file-name>.lock`, so other processes see it; cooperating writers and the reconciler use
/// the same lock. The lock file is created on first use and never removed (removing it would let
/// two holders lock different files).
///
/// * The immediate directory must be a real directory ([`ManagedFileError::Symlink`] /
///   [`ManagedFileError::NotRegular`] otherwise); the file itself is not checked here.
/// * When the directory does not exist there is nothing to protect and nothing is created: `f`
///   runs without the lock. Any write `f` makes through [`publish`] creates the directory, takes
///   the lock itself and re-checks under it.
/// * Re-entrant on one thread: calling `with_lock`, `try_with_lock` or [`publish`] for the same
///   path inside `f` reuses the held lock.
pub fn with_lock<T>(
    path: &Path,
    f: impl FnOnce() -> Result<T, ManagedFileError>,
) -> Result<T, ManagedFileError> {
    lock_and_run(path, Wait::Block, MissingDir::RunUnlocked, f)
}

/// [`with_lock`], but returns [`ManagedFileError::Busy`] at once instead of waiting when another
/// holder (another process, or another thread with its own handle) has the lock, so a
/// reconciler skips a busy writer.
pub fn try_with_lock<T>(
    path: &Path,
    f: impl FnOnce() -> Result<T, ManagedFileError>,
) -> Result<T, ManagedFileError> {
    lock_and_run(path, Wait::Try, MissingDir::RunUnlocked, f)
}

#[derive(Clone, Copy)]
enum Wait {
    Block,
    Try,
}

#[derive(Clone, Copy)]
enum MissingDir {
    RunUnlocked,
    Fail,
}

/// Removes its key from [`HELD`] and then (dropping the file) releases the OS lock.
struct HeldLock {
    key: PathBuf,
    _file: File,
}

impl Drop for HeldLock {
    fn drop(&mut self) {
        HELD.with(|held| {
            held.borrow_mut().remove(&self.key);
        });
    }
}

fn lock_file_name(path: &Path) -> Result<OsString, ManagedFileError> {
    let name = path.file_name().ok_or_else(|| not_regular(path))?;
    let mut lock = OsString::from(".");
    lock.push(name);
    lock.push(".lock");
    Ok(lock)
}

fn lock_and_run<T>(
    path: &Path,
    wait: Wait,
    missing: MissingDir,
    f: impl FnOnce() -> Result<T, ManagedFileError>,
) -> Result<T, ManagedFileError> {
    let dir = parent_dir(path)?;
    if !check_dir(dir)? {
        return match missing {
            MissingDir::RunUnlocked => f(),
            MissingDir::Fail => Err(ManagedFileError::Io {
                path: dir.to_path_buf(),
                reason: "the directory disappeared before it could be locked".to_string(),
            }),
        };
    }
    let lock_name = lock_file_name(path)?;
    let lock_path = dir.join(&lock_name);
    let key = fs::canonicalize(dir)
        .map_err(|err| io_error(dir, &err))?
        .join(&lock_name);
    if HELD.with(|held| held.borrow().contains(&key)) {
        return f();
    }

    let mut options = OpenOptions::new();
    options.read(true).write(true).create(true);
    no_follow(&mut options, false);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        // Only writers open it, and they are the owner.
        options.mode(0o600);
    }
    let file = options
        .open(&lock_path)
        .map_err(|err| io_error(&lock_path, &err))?;
    let meta = file.metadata().map_err(|err| io_error(&lock_path, &err))?;
    if meta.file_type().is_symlink() {
        return Err(symlink(&lock_path));
    }
    if !meta.is_file() {
        return Err(not_regular(&lock_path));
    }
    match wait {
        Wait::Block => file.lock().map_err(|err| io_error(&lock_path, &err))?,
        Wait::Try => match file.try_lock() {
            Ok(()) => {}
            Err(fs::TryLockError::WouldBlock) => {
                return Err(ManagedFileError::Busy {
                    path: path.to_path_buf(),
                });
            }
            Err(fs::TryLockError::Error(err)) => return Err(io_error(&lock_path, &err)),
        },
    }
    HELD.with(|held| held.borrow_mut().insert(key.clone()));
    let _held = HeldLock { key, _file: file };
    // The directory may have been swapped while we waited.
    if !check_dir(dir)? {
        return Err(ManagedFileError::Io {
            path: dir.to_path_buf(),
            reason: "the directory disappeared while it was being locked".to_string(),
        });
    }
    f()
}

// ---------------------------------------------------------------------------------------------
// Publishing
// ---------------------------------------------------------------------------------------------

/// Publishes `content` atomically, creating only the immediate directory when it is absent
/// (`publish_with(.., CreateDir::Immediate)`).
///
/// Under the shared OS lock for this path it re-checks regular paths, then:
///
/// * if the file already holds exactly `content` → [`Publish::Unchanged`] (checked first: nothing
///   would be replaced, and it is how a crash between the rename and recording the new digest is
///   recognised);
/// * if the file exists and its digest differs from `expected_digest` (the digest Zuno last wrote
///   or adopted; `None` = never written) → nothing is written, [`Publish::ExternalEdit`];
/// * otherwise (including a missing file, which is restored) it writes a temp file in the same
///   directory, fsyncs it, re-checks the path and the file once more, renames over the target,
///   fsyncs the directory → [`Publish::Written`].
///
/// A symlinked file or directory is refused before anything is created, and never followed.
/// Stale temp files a crashed writer left behind are removed under the lock.
pub fn publish(
    path: &Path,
    content: &str,
    expected_digest: Option<&str>,
) -> Result<Publish, ManagedFileError> {
    publish_with(path, content, expected_digest, CreateDir::Immediate)
}

/// [`publish`] with a choice of which missing directories may be created.
pub fn publish_with(
    path: &Path,
    content: &str,
    expected_digest: Option<&str>,
    create: CreateDir,
) -> Result<Publish, ManagedFileError> {
    // Refuse links before creating anything (directory, lock file) through them.
    check_regular(path)?;
    let dir = parent_dir(path)?;
    if !check_dir(dir)? {
        let created = match create {
            CreateDir::Immediate => create_dir_in_worktree(dir),
            CreateDir::WithAncestors => create_private_dirs(dir),
        };
        match created {
            Ok(()) => {}
            Err(err) if err.kind() == io::ErrorKind::AlreadyExists => {}
            Err(err) => return Err(io_error(dir, &err)),
        }
    }
    lock_and_run(path, Wait::Block, MissingDir::Fail, || {
        publish_locked(path, dir, content, expected_digest, create)
    })
}

fn publish_locked(
    path: &Path,
    dir: &Path,
    content: &str,
    expected_digest: Option<&str>,
    create: CreateDir,
) -> Result<Publish, ManagedFileError> {
    let current = if check_regular(path)? {
        read_existing(path)?
    } else {
        None
    };
    let new_digest = digest(content.as_bytes());
    if let Some(existing) = &current {
        if existing.bytes == content.as_bytes() {
            return Ok(Publish::Unchanged { digest: new_digest });
        }
        let found_digest = digest(&existing.bytes);
        if expected_digest != Some(found_digest.as_str()) {
            return Ok(Publish::ExternalEdit { found_digest });
        }
    }

    remove_stale_temps(dir, path);
    let temp = write_temp(dir, path, content.as_bytes(), current.as_ref(), create)?;

    // Last look before replacing: still regular, still the bytes we compared against.
    check_regular(path)?;
    let now = read_existing(path)?;
    if let Some(now) = &now
        && current
            .as_ref()
            .is_none_or(|before| before.bytes != now.bytes)
    {
        return Ok(Publish::ExternalEdit {
            found_digest: digest(&now.bytes),
        });
    }

    fs::rename(&temp.path, path).map_err(|err| io_error(path, &err))?;
    temp.disarm();
    sync_dir(dir)?;
    Ok(Publish::Written { digest: new_digest })
}

/// A temp file that is removed unless it was renamed into place.
struct TempFile {
    path: PathBuf,
    armed: std::cell::Cell<bool>,
}

impl TempFile {
    fn disarm(&self) {
        self.armed.set(false);
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if self.armed.get() {
            let _ = fs::remove_file(&self.path);
        }
    }
}

/// `.<file-name>.` — the prefix of this file's temp files (suffix `.tmp`).
fn temp_prefix(path: &Path) -> OsString {
    let mut prefix = OsString::from(".");
    prefix.push(path.file_name().unwrap_or_default());
    prefix.push(".");
    prefix
}

fn write_temp(
    dir: &Path,
    path: &Path,
    content: &[u8],
    current: Option<&Existing>,
    create: CreateDir,
) -> Result<TempFile, ManagedFileError> {
    let mut name = temp_prefix(path);
    name.push(format!(
        "{}.{:016x}.tmp",
        std::process::id(),
        rand::random::<u64>()
    ));
    let temp_path = dir.join(name);
    let mut options = OpenOptions::new();
    options.write(true).create_new(true);
    no_follow(&mut options, false);
    let mut file = options
        .open(&temp_path)
        .map_err(|err| io_error(&temp_path, &err))?;
    let temp = TempFile {
        path: temp_path,
        armed: std::cell::Cell::new(true),
    };
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        file.set_permissions(fs::Permissions::from_mode(file_mode(dir, current, create)?))
            .map_err(|err| io_error(&temp.path, &err))?;
    }
    #[cfg(not(unix))]
    let _ = (current, create);
    file.write_all(content)
        .map_err(|err| io_error(&temp.path, &err))?;
    file.sync_all().map_err(|err| io_error(&temp.path, &err))?;
    Ok(temp)
}

/// The mode the published file gets: in a worktree, the mode a user gave the existing file (e.g.
/// 0600), else [`inherited_mode`] from its directory; in Zuno's home, 0600, or the existing
/// file's mode without group and other access.
#[cfg(unix)]
fn file_mode(
    dir: &Path,
    current: Option<&Existing>,
    create: CreateDir,
) -> Result<u32, ManagedFileError> {
    use std::os::unix::fs::PermissionsExt;
    let existing = current.map(|existing| existing.permissions.mode() & 0o7777);
    Ok(match (create, existing) {
        (CreateDir::Immediate, Some(mode)) => mode,
        (CreateDir::Immediate, None) => {
            let dir_mode = fs::metadata(dir)
                .map_err(|err| io_error(dir, &err))?
                .permissions()
                .mode();
            inherited_mode(dir_mode, false)
        }
        (CreateDir::WithAncestors, Some(mode)) => mode & 0o700,
        (CreateDir::WithAncestors, None) => 0o600,
    })
}

/// Under the lock, every temp file of this file belongs to a writer that died mid-write.
fn remove_stale_temps(dir: &Path, path: &Path) {
    let prefix = temp_prefix(path);
    let prefix = prefix.to_string_lossy();
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with(prefix.as_ref())
            && name.ends_with(".tmp")
            && let Err(err) = fs::remove_file(entry.path())
        {
            tracing::warn!(path = %entry.path().display(), %err, "could not remove a stale memory projection temp file");
        }
    }
}

#[cfg(unix)]
fn sync_dir(dir: &Path) -> Result<(), ManagedFileError> {
    File::open(dir)
        .and_then(|handle| handle.sync_all())
        .map_err(|err| io_error(dir, &err))
}

#[cfg(not(unix))]
fn sync_dir(_dir: &Path) -> Result<(), ManagedFileError> {
    // std cannot open a directory handle to sync here; the rename's durability is left to the
    // filesystem's metadata journal.
    Ok(())
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use crate::memory::markdown::{parse, render};

    use std::io::{BufRead, BufReader};
    use std::os::unix::fs::{PermissionsExt, symlink as make_symlink};
    use std::process::{Command, Stdio};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::mpsc;
    use std::time::Duration;

    fn entries(items: &[&str]) -> Vec<String> {
        items.iter().map(|item| item.to_string()).collect()
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    // ---- Regular-path checks -----------------------------------------------------------------

    #[test]
    fn absent_is_fine_and_creates_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("config/memory/MEMORY.md");
        assert_eq!(check_regular(&path), Ok(false));
        assert_eq!(read(&path), Ok(None));
        assert_eq!(with_lock(&path, || Ok(1)), Ok(1));
        assert_eq!(try_with_lock(&path, || Ok(2)), Ok(2));
        assert!(
            names(tmp.path()).is_empty(),
            "nothing is created before the first write"
        );

        fs::create_dir_all(path.parent().unwrap()).unwrap();
        assert_eq!(check_regular(&path), Ok(false));
        assert_eq!(read(&path), Ok(None));
        assert!(names(path.parent().unwrap()).is_empty());
    }

    #[test]
    fn other_file_types_and_bad_bytes_are_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join(".zuno");
        fs::create_dir(&dir).unwrap();
        let path = dir.join("RULES.md");
        fs::create_dir(&path).unwrap();
        assert_eq!(check_regular(&path), Err(not_regular(&path)));
        assert_eq!(read(&path), Err(not_regular(&path)));
        assert_eq!(publish(&path, "- x\n", None), Err(not_regular(&path)));

        // The "directory" is a file.
        let file_dir = tmp.path().join("plain");
        fs::write(&file_dir, "not a dir").unwrap();
        let inside = file_dir.join("RULES.md");
        assert_eq!(read(&inside), Err(not_regular(&file_dir)));

        let bad = tmp.path().join("BAD.md");
        fs::write(&bad, [b'o', b'k', 0xff, 0xfe]).unwrap();
        match read(&bad) {
            Err(ManagedFileError::Unreadable { path, reason }) => {
                assert_eq!(path, bad);
                assert!(reason.contains("UTF-8"), "{reason}");
            }
            other => panic!("expected Unreadable, got {other:?}"),
        }
        let message = read(&bad).unwrap_err().to_string();
        assert!(message.contains(&bad.display().to_string()), "{message}");
    }

    #[test]
    fn symlinked_file_is_refused_and_its_target_never_written() {
        let tmp = tempfile::tempdir().unwrap();
        let elsewhere = tmp.path().join("elsewhere");
        fs::create_dir(&elsewhere).unwrap();
        let target = elsewhere.join("target.md");
        fs::write(&target, "original\n").unwrap();
        let dir = tmp.path().join("memory");
        fs::create_dir(&dir).unwrap();
        let path = dir.join("MEMORY.md");
        make_symlink(&target, &path).unwrap();

        assert_eq!(check_regular(&path), Err(symlink(&path)));
        assert_eq!(read(&path), Err(symlink(&path)));
        assert_eq!(publish(&path, "- new\n", None), Err(symlink(&path)));
        let original = digest(b"original\n");
        assert_eq!(
            publish(&path, "- new\n", Some(&original)),
            Err(symlink(&path))
        );
        assert_eq!(fs::read_to_string(&target).unwrap(), "original\n");
        assert_eq!(names(&elsewhere), vec!["target.md"]);
        assert!(
            fs::symlink_metadata(&path)
                .unwrap()
                .file_type()
                .is_symlink()
        );
        let message = publish(&path, "x", None).unwrap_err().to_string();
        assert!(message.contains(&path.display().to_string()), "{message}");

        // A dangling link: its target must not be created.
        let dangling_target = elsewhere.join("never.md");
        let dangling = dir.join("RULES.md");
        make_symlink(&dangling_target, &dangling).unwrap();
        assert_eq!(read(&dangling), Err(symlink(&dangling)));
        assert_eq!(publish(&dangling, "- new\n", None), Err(symlink(&dangling)));
        assert!(!dangling_target.exists());
    }

    #[test]
    fn symlinked_directory_is_refused_and_nothing_is_written_through_it() {
        let tmp = tempfile::tempdir().unwrap();
        let real = tmp.path().join("real");
        fs::create_dir(&real).unwrap();
        fs::write(real.join("MEMORY.md"), "original\n").unwrap();
        let linked = tmp.path().join("memory");
        make_symlink(&real, &linked).unwrap();
        let path = linked.join("MEMORY.md");

        assert_eq!(check_regular(&path), Err(symlink(&linked)));
        assert_eq!(read(&path), Err(symlink(&linked)));
        assert_eq!(publish(&path, "- new\n", None), Err(symlink(&linked)));
        let original = digest(b"original\n");
        assert_eq!(
            publish(&path, "- new\n", Some(&original)),
            Err(symlink(&linked))
        );
        assert_eq!(
            publish_with(&path, "- new\n", Some(&original), CreateDir::WithAncestors),
            Err(symlink(&linked))
        );
        assert_eq!(with_lock(&path, || Ok(())), Err(symlink(&linked)));
        assert_eq!(try_with_lock(&path, || Ok(())), Err(symlink(&linked)));
        assert_eq!(
            fs::read_to_string(real.join("MEMORY.md")).unwrap(),
            "original\n"
        );
        assert_eq!(
            names(&real),
            vec!["MEMORY.md"],
            "no lock or temp file through the link"
        );

        // A dangling directory link is refused too, and its target is not created.
        let missing = tmp.path().join("missing");
        let dangling = tmp.path().join(".zuno");
        make_symlink(&missing, &dangling).unwrap();
        let rules = dangling.join("RULES.md");
        assert_eq!(publish(&rules, "- new\n", None), Err(symlink(&dangling)));
        assert!(!missing.exists());
    }

    #[test]
    fn symlinked_lock_file_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("memory");
        fs::create_dir(&dir).unwrap();
        let victim = tmp.path().join("victim");
        make_symlink(&victim, dir.join(".MEMORY.md.lock")).unwrap();
        let path = dir.join("MEMORY.md");
        let lock = dir.join(".MEMORY.md.lock");
        assert_eq!(with_lock(&path, || Ok(())), Err(symlink(&lock)));
        assert_eq!(publish(&path, "- x\n", None), Err(symlink(&lock)));
        assert!(!victim.exists());
        assert!(!path.exists());
    }

    // ---- Publishing --------------------------------------------------------------------------

    #[test]
    fn first_publish_creates_the_directory_and_file() {
        let tmp = tempfile::tempdir().unwrap();
        let worktree = tmp.path().join("repo");
        fs::create_dir(&worktree).unwrap();
        let dir = worktree.join(".zuno");
        let path = dir.join("RULES.md");
        assert!(!dir.exists());

        let content = render("project", 1, &entries(&["Use tabs"]));
        let written = publish(&path, &content, None).unwrap();
        assert_eq!(
            written,
            Publish::Written {
                digest: digest(content.as_bytes())
            }
        );
        assert_eq!(fs::read_to_string(&path).unwrap(), content);
        assert_eq!(names(&dir), vec![".RULES.md.lock", "RULES.md"]);
        let state = read(&path).unwrap().unwrap();
        assert_eq!(state.content, content);
        assert_eq!(state.digest, digest(content.as_bytes()));
        assert_eq!(parse(&state.content), entries(&["Use tabs"]));

        // Only the immediate directory is created: a missing worktree is not resurrected.
        let gone = tmp.path().join("deleted-worktree/.zuno/RULES.md");
        assert!(matches!(
            publish(&gone, &content, None),
            Err(ManagedFileError::Io { .. })
        ));
        assert!(!tmp.path().join("deleted-worktree").exists());

        // The global store may need `$CONFIG` too.
        let global = tmp.path().join("config/zuno/memory/MEMORY.md");
        assert!(matches!(
            publish_with(&global, &content, None, CreateDir::WithAncestors),
            Ok(Publish::Written { .. })
        ));
        assert_eq!(fs::read_to_string(&global).unwrap(), content);
    }

    #[test]
    fn publish_with_the_recorded_digest_replaces_and_identical_content_is_unchanged() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("memory/MEMORY.md");
        let first = render("global", 1, &entries(&["one"]));
        let Publish::Written { digest: d1 } = publish(&path, &first, None).unwrap() else {
            panic!("first write");
        };

        let second = render("global", 2, &entries(&["one", "two"]));
        let Publish::Written { digest: d2 } = publish(&path, &second, Some(&d1)).unwrap() else {
            panic!("second write");
        };
        assert_eq!(d2, digest(second.as_bytes()));
        assert_eq!(fs::read_to_string(&path).unwrap(), second);

        assert_eq!(
            publish(&path, &second, Some(&d2)).unwrap(),
            Publish::Unchanged { digest: d2.clone() }
        );
        // Identical content is in sync even when the caller's record is stale (e.g. a crash
        // after the rename, before the new digest was recorded).
        assert_eq!(
            publish(&path, &second, Some(&d1)).unwrap(),
            Publish::Unchanged { digest: d2.clone() }
        );

        // A deleted projection is restored from its recorded revision.
        fs::remove_file(&path).unwrap();
        assert_eq!(
            publish(&path, &second, Some(&d2)).unwrap(),
            Publish::Written { digest: d2 }
        );
    }

    #[test]
    fn external_edits_are_preserved_and_reported() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("memory/MEMORY.md");
        let first = render("global", 1, &entries(&["one"]));
        let Publish::Written { digest: d1 } = publish(&path, &first, None).unwrap() else {
            panic!("first write");
        };

        let edited = format!("{first}- added by hand\n");
        fs::write(&path, &edited).unwrap();
        let next = render("global", 2, &entries(&["one", "two"]));
        let outcome = publish(&path, &next, Some(&d1)).unwrap();
        assert_eq!(
            outcome,
            Publish::ExternalEdit {
                found_digest: digest(edited.as_bytes())
            }
        );
        assert_eq!(fs::read_to_string(&path).unwrap(), edited, "edit preserved");
        assert_eq!(
            parse(&read(&path).unwrap().unwrap().content),
            entries(&["one", "added by hand"])
        );

        // A file Zuno never wrote (expected None) is never replaced either.
        let other = tmp.path().join("repo/.zuno/RULES.md");
        fs::create_dir_all(other.parent().unwrap()).unwrap();
        fs::write(&other, "my own rules\n").unwrap();
        assert_eq!(
            publish(&other, &next, None).unwrap(),
            Publish::ExternalEdit {
                found_digest: digest(b"my own rules\n")
            }
        );
        assert_eq!(fs::read_to_string(&other).unwrap(), "my own rules\n");

        // After import, the adopted digest allows the next write.
        let adopted = digest(edited.as_bytes());
        assert!(matches!(
            publish(&path, &next, Some(&adopted)).unwrap(),
            Publish::Written { .. }
        ));
        assert_eq!(fs::read_to_string(&path).unwrap(), next);
    }

    #[test]
    fn publish_keeps_the_file_mode() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("memory/MEMORY.md");
        let Publish::Written { digest: d1 } = publish(&path, "- one\n", None).unwrap() else {
            panic!("first write");
        };
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
        publish(&path, "- two\n", Some(&d1)).unwrap();
        let mode = fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
    }

    #[test]
    fn atomic_publish_never_exposes_a_partial_file_or_leaves_temp_files() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("memory");
        let path = dir.join("MEMORY.md");
        let big_a = "a".repeat(2 << 20);
        let big_b = format!("{}\n", "字".repeat(700_000));

        let Publish::Written { digest: mut last } = publish(&path, &big_a, None).unwrap() else {
            panic!("first write");
        };
        // A stale temp file from a writer that died mid-write is cleaned up under the lock.
        fs::write(dir.join(".MEMORY.md.12345.00000000deadbeef.tmp"), "partial").unwrap();

        let stop = Arc::new(AtomicBool::new(false));
        let reader = {
            let (path, stop) = (path.clone(), stop.clone());
            let (a, b) = (big_a.clone(), big_b.clone());
            std::thread::spawn(move || {
                let mut reads = 0;
                while !stop.load(Ordering::SeqCst) {
                    let state = read(&path).unwrap().expect("never absent once written");
                    assert!(state.content == a || state.content == b, "partial read");
                    reads += 1;
                }
                reads
            })
        };
        for round in 0..8 {
            let content = if round % 2 == 0 { &big_b } else { &big_a };
            match publish(&path, content, Some(&last)).unwrap() {
                Publish::Written { digest } => last = digest,
                other => panic!("round {round}: {other:?}"),
            }
            assert_eq!(names(&dir), vec![".MEMORY.md.lock", "MEMORY.md"]);
        }
        stop.store(true, Ordering::SeqCst);
        assert!(reader.join().unwrap() > 0);
        assert_eq!(fs::read_to_string(&path).unwrap(), big_a);
    }

    // ---- Locking -----------------------------------------------------------------------------

    #[test]
    fn locking_is_reentrant_on_one_thread() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("memory/MEMORY.md");
        publish(&path, "- one\n", None).unwrap();
        let outcome = with_lock(&path, || {
            let state = read(&path)?.expect("present");
            try_with_lock(&path, || publish(&path, "- two\n", Some(&state.digest)))
        })
        .unwrap();
        assert!(matches!(outcome, Publish::Written { .. }));
        // Released afterwards.
        assert_eq!(try_with_lock(&path, || Ok(())), Ok(()));
    }

    /// flock locks belong to an open file description, so a thread holding its own handle excludes
    /// this thread as another process would.
    #[test]
    fn try_with_lock_is_busy_while_another_thread_holds_the_lock() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("memory/MEMORY.md");
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        let (held_tx, held_rx) = mpsc::channel();
        let (release_tx, release_rx) = mpsc::channel::<()>();
        let holder = {
            let path = path.clone();
            std::thread::spawn(move || {
                with_lock(&path, || {
                    held_tx.send(()).unwrap();
                    release_rx.recv().unwrap();
                    Ok(())
                })
            })
        };
        held_rx.recv().unwrap();
        assert_eq!(
            try_with_lock(&path, || Ok(())),
            Err(ManagedFileError::Busy { path: path.clone() })
        );
        release_tx.send(()).unwrap();
        holder.join().unwrap().unwrap();
        assert_eq!(try_with_lock(&path, || Ok(())), Ok(()));
    }

    const HOLD_ENV: &str = "ZUNO_TEST_MANAGED_FILE_HOLD_LOCK";
    const HELD_MARKER: &str = "zuno-managed-file-lock-held";

    /// Child half of `the_lock_excludes_other_processes`: a no-op unless the parent sets
    /// `HOLD_ENV`; then it holds the lock until its stdin closes.
    #[test]
    fn lock_holder_child() {
        let Some(path) = std::env::var_os(HOLD_ENV) else {
            return;
        };
        with_lock(Path::new(&path), || {
            println!("{HELD_MARKER}");
            io::stdout().flush().unwrap();
            let mut rest = String::new();
            io::stdin().read_to_string(&mut rest).unwrap();
            Ok(())
        })
        .unwrap();
    }

    #[test]
    fn the_lock_excludes_other_processes() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("memory/MEMORY.md");
        let Publish::Written { digest: d1 } = publish(&path, "- one\n", None).unwrap() else {
            panic!("first write");
        };

        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "managed_file::tests::lock_holder_child",
                "--exact",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(HOLD_ENV, &path)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        // Drain the child's stdout on a thread so a missing marker fails the test instead of
        // hanging it. libtest prints `test <name> ... ` before the test's own output.
        let stdout = child.stdout.take().unwrap();
        let (held_tx, held_rx) = mpsc::channel();
        let drain = std::thread::spawn(move || {
            let mut output = String::new();
            for line in BufReader::new(stdout).lines() {
                let line = line.unwrap();
                if line.contains(HELD_MARKER) {
                    let _ = held_tx.send(());
                }
                output.push_str(&line);
                output.push('\n');
            }
            output
        });
        if held_rx.recv_timeout(Duration::from_secs(60)).is_err() {
            child.kill().unwrap();
            child.wait().unwrap();
            panic!(
                "the child never reported holding the lock:\n{}",
                drain.join().unwrap()
            );
        }

        // A reconciler skips the busy writer...
        assert_eq!(
            try_with_lock(&path, || Ok(())),
            Err(ManagedFileError::Busy { path: path.clone() })
        );
        // ...and a cooperating writer waits for it.
        let released = Arc::new(AtomicBool::new(false));
        let writer = {
            let (path, released) = (path.clone(), released.clone());
            std::thread::spawn(move || {
                let outcome = publish(&path, "- two\n", Some(&d1));
                (released.load(Ordering::SeqCst), outcome)
            })
        };
        std::thread::sleep(Duration::from_millis(300));
        assert!(
            !writer.is_finished(),
            "publish must wait for the other process"
        );
        assert_eq!(fs::read_to_string(&path).unwrap(), "- one\n");

        released.store(true, Ordering::SeqCst);
        drop(child.stdin.take());
        let (waited, outcome) = writer.join().unwrap();
        assert!(waited, "publish ran only after the child released the lock");
        assert!(matches!(outcome, Ok(Publish::Written { .. })));
        let status = child.wait().unwrap();
        let output = drain.join().unwrap();
        assert!(status.success(), "child output:\n{output}");
        assert_eq!(try_with_lock(&path, || Ok(())), Ok(()));
        assert_eq!(fs::read_to_string(&path).unwrap(), "- two\n");
    }
}
