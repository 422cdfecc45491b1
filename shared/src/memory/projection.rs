//! The file layer of resident Memory projections.
//!
//! Resident Memory is authoritative in the database; `$CONFIG/memory/MEMORY.md` (global) and
//! `<worktree>/.zuno/RULES.md` (project) are readable projections of it (spec 001, "Apply and undo
//! recovery" and "Where resident Memory lives"). This module only deals with those files; it never
//! touches the database. Its rules:
//!
//! * A managed file and its immediate directory must be regular paths: not symbolic links, not
//!   Windows junctions, not other file types. [`check_regular`] is applied before every read and,
//!   under the lock, again before a projection is replaced. Files are opened without following a
//!   final symbolic link, so a link swapped in after the check is refused too.
//! * Absent is the ordinary state. Reading and checking create nothing; locking creates only the
//!   lock file, and only inside a directory that already exists. The directory and the file are
//!   created by the first accepted write ([`publish`]), never at start-up.
//! * External edits are preserved and reported, never silently replaced: [`publish`] writes only
//!   over the exact bytes Zuno last wrote or adopted (compared by digest).
//! * Cooperating writers and the reconciler share an operating-system lock
//!   ([`with_lock`]/[`try_with_lock`]) on `<dir>/.<file-name>.lock` around comparison and atomic
//!   replacement (spec 002, "At-most-once file effects").
//!
//! Everything here is synchronous file I/O; async callers wrap it in `spawn_blocking`.

use std::cell::RefCell;
use std::collections::HashSet;
use std::ffi::OsString;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// Why a projection could not be checked, read, locked or published. Every message names the path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProjectionError {
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
    /// An existing projection could not be read (permissions, invalid UTF-8, ...).
    #[error("cannot read memory projection {}: {reason}", .path.display())]
    Unreadable { path: PathBuf, reason: String },
    /// A filesystem operation failed (create, write, sync, rename, lock).
    #[error("memory projection I/O failed at {}: {reason}", .path.display())]
    Io { path: PathBuf, reason: String },
    /// [`try_with_lock`] found the lock held by another writer.
    #[error("memory projection {} is locked by another writer", .path.display())]
    Busy { path: PathBuf },
}

/// A projection as found on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileState {
    pub content: String,
    /// [`digest`] of the file's exact bytes.
    pub digest: String,
    /// [`parse`] of `content`.
    pub entries: Vec<String>,
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

/// Which directories [`publish_with`] may create when the projection's directory is absent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CreateDir {
    /// Only the immediate directory (`<worktree>/.zuno`): a missing worktree is an error, never
    /// recreated. What [`publish`] uses.
    Immediate,
    /// The immediate directory and any missing ancestors (`$CONFIG/memory` on a fresh install,
    /// where `$CONFIG` itself may not exist yet).
    WithAncestors,
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
pub fn check_regular(path: &Path) -> Result<bool, ProjectionError> {
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

/// Reads the projection after [`check_regular`]. `None` when it is absent. The file is opened
/// without following a final symbolic link; invalid UTF-8 or an unreadable file is
/// [`ProjectionError::Unreadable`].
pub fn read(path: &Path) -> Result<Option<FileState>, ProjectionError> {
    if !check_regular(path)? {
        return Ok(None);
    }
    let Some(existing) = read_existing(path)? else {
        return Ok(None);
    };
    let digest = digest(&existing.bytes);
    let content = String::from_utf8(existing.bytes).map_err(|err| ProjectionError::Unreadable {
        path: path.to_path_buf(),
        reason: format!("not valid UTF-8 ({})", err.utf8_error()),
    })?;
    let entries = parse(&content);
    Ok(Some(FileState {
        content,
        digest,
        entries,
    }))
}

/// The directory a projection lives in; `.` for a bare file name.
fn parent_dir(path: &Path) -> Result<&Path, ProjectionError> {
    if path.file_name().is_none() {
        return Err(not_regular(path));
    }
    Ok(match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    })
}

/// `Ok(false)` when absent; the directory must be a real directory, not a link to one.
fn check_dir(dir: &Path) -> Result<bool, ProjectionError> {
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
fn read_existing(path: &Path) -> Result<Option<Existing>, ProjectionError> {
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

fn symlink(path: &Path) -> ProjectionError {
    ProjectionError::Symlink {
        path: path.to_path_buf(),
    }
}

fn not_regular(path: &Path) -> ProjectionError {
    ProjectionError::NotRegular {
        path: path.to_path_buf(),
    }
}

fn unreadable(path: &Path, err: &io::Error) -> ProjectionError {
    ProjectionError::Unreadable {
        path: path.to_path_buf(),
        reason: err.to_string(),
    }
}

fn io_error(path: &Path, err: &io::Error) -> ProjectionError {
    if is_symlink_loop(err) {
        return symlink(path);
    }
    ProjectionError::Io {
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
/// * The immediate directory must be a real directory ([`ProjectionError::Symlink`] /
///   [`ProjectionError::NotRegular`] otherwise); the file itself is not checked here.
/// * When the directory does not exist there is nothing to protect and nothing is created: `f`
///   runs without the lock. Any write `f` makes through [`publish`] creates the directory, takes
///   the lock itself and re-checks under it.
/// * Re-entrant on one thread: calling `with_lock`, `try_with_lock` or [`publish`] for the same
///   path inside `f` reuses the held lock.
pub fn with_lock<T>(
    path: &Path,
    f: impl FnOnce() -> Result<T, ProjectionError>,
) -> Result<T, ProjectionError> {
    lock_and_run(path, Wait::Block, MissingDir::RunUnlocked, f)
}

/// [`with_lock`], but returns [`ProjectionError::Busy`] at once instead of waiting when another
/// holder (another process, or another thread with its own handle) has the lock, so a
/// reconciler skips a busy writer.
pub fn try_with_lock<T>(
    path: &Path,
    f: impl FnOnce() -> Result<T, ProjectionError>,
) -> Result<T, ProjectionError> {
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

fn lock_file_name(path: &Path) -> Result<OsString, ProjectionError> {
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
    f: impl FnOnce() -> Result<T, ProjectionError>,
) -> Result<T, ProjectionError> {
    let dir = parent_dir(path)?;
    if !check_dir(dir)? {
        return match missing {
            MissingDir::RunUnlocked => f(),
            MissingDir::Fail => Err(ProjectionError::Io {
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
                return Err(ProjectionError::Busy {
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
        return Err(ProjectionError::Io {
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
) -> Result<Publish, ProjectionError> {
    publish_with(path, content, expected_digest, CreateDir::Immediate)
}

/// [`publish`] with a choice of which missing directories may be created.
pub fn publish_with(
    path: &Path,
    content: &str,
    expected_digest: Option<&str>,
    create: CreateDir,
) -> Result<Publish, ProjectionError> {
    // Refuse links before creating anything (directory, lock file) through them.
    check_regular(path)?;
    let dir = parent_dir(path)?;
    if !check_dir(dir)? {
        let created = match create {
            CreateDir::Immediate => fs::create_dir(dir),
            CreateDir::WithAncestors => fs::create_dir_all(dir),
        };
        match created {
            Ok(()) => {}
            Err(err) if err.kind() == io::ErrorKind::AlreadyExists => {}
            Err(err) => return Err(io_error(dir, &err)),
        }
    }
    lock_and_run(path, Wait::Block, MissingDir::Fail, || {
        publish_locked(path, dir, content, expected_digest)
    })
}

fn publish_locked(
    path: &Path,
    dir: &Path,
    content: &str,
    expected_digest: Option<&str>,
) -> Result<Publish, ProjectionError> {
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
    let temp = write_temp(dir, path, content.as_bytes(), current.as_ref())?;

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

/// `.<file-name>.` — the prefix of this projection's temp files (suffix `.tmp`).
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
) -> Result<TempFile, ProjectionError> {
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
    // Keep the mode a user gave the projection (e.g. 0600).
    #[cfg(unix)]
    if let Some(existing) = current {
        file.set_permissions(existing.permissions.clone())
            .map_err(|err| io_error(&temp.path, &err))?;
    }
    #[cfg(not(unix))]
    let _ = current;
    file.write_all(content)
        .map_err(|err| io_error(&temp.path, &err))?;
    file.sync_all().map_err(|err| io_error(&temp.path, &err))?;
    Ok(temp)
}

/// Under the lock, every temp file of this projection belongs to a writer that died mid-write.
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
fn sync_dir(dir: &Path) -> Result<(), ProjectionError> {
    File::open(dir)
        .and_then(|handle| handle.sync_all())
        .map_err(|err| io_error(dir, &err))
}

#[cfg(not(unix))]
fn sync_dir(_dir: &Path) -> Result<(), ProjectionError> {
    // std cannot open a directory handle to sync here; the rename's durability is left to the
    // filesystem's metadata journal.
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Markdown
// ---------------------------------------------------------------------------------------------

/// Renders entries as Markdown: a header comment naming the scope, the revision and how to accept
/// edits (`zuno learn import-memory <scope>`), a blank line, then one `- entry` per entry with the
/// continuation lines of a multi-line entry indented by two spaces (blank lines inside an entry
/// stay blank).
///
/// Entries are normalised first ([`normalize_entry`]; empty ones are dropped) and made visible
/// ([`visible_entry`]: invisible and reordering characters become `[U+XXXX]` markers, as in prompt
/// sections, so the file shows a person what a model reading it would see), so
/// `parse(&render(s, r, x)) == visible(normalize(x))`, and `== x` when every entry is already
/// normalised and visible.
/// An entry whose first line would turn `- …` into a thematic break (`---`, `- -`) is written
/// with a `* ` bullet instead, so it still round-trips. `scope` is `global` or `project`; `>` and
/// control characters are dropped from it so it cannot end the comment.
pub fn render(scope: &str, revision: i64, entries: &[String]) -> String {
    let scope: String = scope
        .chars()
        .filter(|c| *c != '>' && !c.is_control())
        .collect();
    let mut out = format!(
        "<!--\n\
         Zuno resident Memory ({scope} scope), revision {revision}.\n\
         The accepted entries live in Zuno's database; this file is a readable projection of them.\n\
         Edits made here are kept but not used until you accept them with:\n\
         \x20 zuno learn import-memory {scope}\n\
         -->\n"
    );
    let mut first_entry = true;
    for entry in entries
        .iter()
        .filter_map(|entry| normalize_entry(entry))
        .map(|entry| visible_entry(&entry))
    {
        if first_entry {
            out.push('\n');
            first_entry = false;
        }
        let mut lines = entry.split('\n');
        let first = lines.next().unwrap_or_default();
        let marker = if is_thematic_break(&format!("- {first}")) {
            "* "
        } else {
            "- "
        };
        out.push_str(marker);
        out.push_str(first);
        out.push('\n');
        for line in lines {
            if !line.is_empty() {
                out.push_str("  ");
                out.push_str(line);
            }
            out.push('\n');
        }
    }
    out
}

/// An entry as its projection shows it: every invisible or reordering codepoint (zero-width
/// characters, bidi controls, tags, variation selectors, …) as a visible `[U+XXXX]` marker, and a
/// `[U+` already in the text written `&#91;U+`, so every marker in a file was put there by Zuno.
/// Entries without such characters are unchanged.
pub fn visible_entry(entry: &str) -> String {
    use crate::learning::recall::render::is_invisible_or_reordering;
    let mut out = String::with_capacity(entry.len());
    let mut chars = entry.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\n' => out.push('\n'),
            '[' if {
                let mut rest = chars.clone();
                matches!(rest.next(), Some('U' | 'u')) && rest.next() == Some('+')
            } =>
            {
                out.push_str("&#91;");
            }
            c if is_invisible_or_reordering(c) => {
                out.push_str(&format!("[U+{:04X}]", c as u32));
            }
            c => out.push(c),
        }
    }
    out
}

/// The canonical form of one entry, as [`parse`] produces it: lines split on `\n`/`\r\n`,
/// trailing whitespace removed from every line, leading and trailing blank lines removed, leading
/// whitespace removed from the first line (later lines keep their indentation). `None` when
/// nothing is left.
pub fn normalize_entry(entry: &str) -> Option<String> {
    let lines: Vec<&str> = entry.lines().map(str::trim_end).collect();
    let start = lines.iter().position(|line| !line.is_empty())?;
    let end = lines.iter().rposition(|line| !line.is_empty())?;
    let mut out = String::new();
    for (i, line) in lines[start..=end].iter().enumerate() {
        if i == 0 {
            out.push_str(line.trim_start());
        } else {
            out.push('\n');
            out.push_str(line);
        }
    }
    Some(out)
}

/// Parses entries back from any Markdown a user may have edited.
///
/// * `-`, `*` and `+` bullets and ordered items (`1.`, `2)`) are entries. Lines indented to the
///   item's content column continue it (that indentation is removed; blank lines followed by
///   such a line stay in the entry); an unindented text line right after it is a lazy
///   continuation. Nested lists therefore stay inside their parent entry.
/// * Outside items, each paragraph (lines up to a blank line) is one entry, so a file written
///   without bullets yields one entry per paragraph.
/// * HTML comments (the header), blank lines, ATX (`#`) headings, thematic breaks and one-line
///   setext headings (a line over `===`/`---`) are ignored; a longer paragraph over such an
///   underline is kept as an entry rather than dropped. Fenced code blocks (```` ``` ````/`~~~`) are kept whole, blank lines and `#`
///   lines included, in the entry that contains them.
/// * A leading byte-order mark and `\r\n` line ends are accepted; each entry is
///   [`normalize_entry`]-ed.
///
/// `parse(&render(s, r, x))` returns the normalised `x`.
pub fn parse(content: &str) -> Vec<String> {
    let content = content.strip_prefix('\u{feff}').unwrap_or(content);
    let mut parser = Parser::default();
    for line in content.lines() {
        parser.feed(line);
    }
    parser.close();
    parser.entries
}

#[derive(Default)]
struct Parser {
    entries: Vec<String>,
    block: Block,
    in_comment: bool,
}

#[derive(Default)]
enum Block {
    #[default]
    None,
    Item(Item),
    Paragraph(Paragraph),
}

struct Item {
    lines: Vec<String>,
    /// The content column: continuation lines are indented at least this far.
    offset: usize,
    /// Blank lines seen since the last content line, kept if the item continues.
    blanks: usize,
    fence: Option<Fence>,
}

struct Paragraph {
    lines: Vec<String>,
    fence: Option<Fence>,
}

#[derive(Clone, Copy)]
struct Fence {
    ch: char,
    len: usize,
}

impl Item {
    /// Takes `line` into this item, or returns false when the line ends it.
    fn take(&mut self, line: &str) -> bool {
        if line.is_empty() {
            if self.fence.is_some() {
                self.lines.push(String::new());
            } else {
                self.blanks += 1;
            }
            return true;
        }
        if indent_width(line) >= self.offset {
            for _ in 0..std::mem::take(&mut self.blanks) {
                self.lines.push(String::new());
            }
            let text = strip_indent(line, self.offset);
            self.fence = next_fence(self.fence, text);
            self.lines.push(text.to_string());
            return true;
        }
        let text = line.trim_start_matches([' ', '\t']);
        let lazy = self.fence.is_none()
            && self.blanks == 0
            && self.lines.iter().any(|line| !line.is_empty())
            && is_plain_text(text);
        if lazy {
            self.lines.push(text.to_string());
        }
        lazy
    }
}

impl Parser {
    fn feed(&mut self, raw: &str) {
        let line = raw.trim_end();
        if self.in_comment {
            if let Some(end) = line.find("-->") {
                self.in_comment = false;
                let rest = &line[end + 3..];
                if !rest.trim().is_empty() {
                    self.feed(rest);
                }
            }
            return;
        }
        if let Block::Item(item) = &mut self.block {
            if item.take(line) {
                return;
            }
            self.close();
        }
        self.top_level(line);
    }

    /// A line outside any item.
    fn top_level(&mut self, line: &str) {
        if let Block::Paragraph(paragraph) = &mut self.block
            && let Some(fence) = paragraph.fence
        {
            paragraph.lines.push(line.to_string());
            if closes_fence(fence, line.trim_start_matches([' ', '\t'])) {
                paragraph.fence = None;
            }
            return;
        }
        if line.is_empty() {
            self.close();
            return;
        }
        let indent = indent_width(line);
        let text = line.trim_start_matches([' ', '\t']);
        let in_paragraph = matches!(self.block, Block::Paragraph(_));
        if indent <= 3 {
            if let Some(rest) = text.strip_prefix("<!--") {
                self.close();
                match rest.find("-->") {
                    Some(end) => {
                        let after = &rest[end + 3..];
                        if !after.trim().is_empty() {
                            self.feed(after);
                        }
                    }
                    None => self.in_comment = true,
                }
                return;
            }
            if is_setext_underline(text) {
                // A one-line paragraph over `===`/`---` is a heading. A longer paragraph is kept
                // (the underline is read as a separator) rather than dropping several lines of
                // hand-written text.
                if let Block::Paragraph(paragraph) = &self.block
                    && paragraph.lines.len() == 1
                {
                    self.block = Block::None;
                    return;
                }
                if text.starts_with('=') {
                    return;
                }
            }
            if is_thematic_break(text) || is_heading(text) {
                self.close();
                return;
            }
            if let Some(start) = bullet(line)
                && !(in_paragraph && start.ordered_not_one)
            {
                self.close();
                self.block = Block::Item(Item {
                    lines: vec![start.content.to_string()],
                    offset: start.offset,
                    blanks: 0,
                    fence: open_fence(start.content),
                });
                return;
            }
        }
        let fence = if indent <= 3 { open_fence(text) } else { None };
        match &mut self.block {
            Block::Paragraph(paragraph) => {
                paragraph.lines.push(text.to_string());
                paragraph.fence = fence;
            }
            _ => {
                self.close();
                self.block = Block::Paragraph(Paragraph {
                    lines: vec![text.to_string()],
                    fence,
                });
            }
        }
    }

    fn close(&mut self) {
        let lines = match std::mem::take(&mut self.block) {
            Block::None => return,
            Block::Item(item) => item.lines,
            Block::Paragraph(paragraph) => paragraph.lines,
        };
        if let Some(entry) = normalize_entry(&lines.join("\n")) {
            self.entries.push(entry);
        }
    }
}

struct Bullet<'a> {
    offset: usize,
    content: &'a str,
    /// An ordered item numbered other than 1, which may not interrupt a paragraph.
    ordered_not_one: bool,
}

/// A list-item start (`- x`, `* x`, `+ x`, `1. x`, `1) x`) indented at most three columns.
fn bullet(line: &str) -> Option<Bullet<'_>> {
    let lead = indent_width(line);
    if lead > 3 {
        return None;
    }
    let text = line.trim_start_matches([' ', '\t']);
    let (marker, ordered_not_one) = match text.as_bytes().first()? {
        b'-' | b'*' | b'+' => (1, false),
        b'0'..=b'9' => {
            let digits = text.bytes().take_while(u8::is_ascii_digit).count();
            if digits > 9 || !matches!(text.as_bytes().get(digits), Some(b'.' | b')')) {
                return None;
            }
            (digits + 1, text[..digits].parse::<u32>().ok() != Some(1))
        }
        _ => return None,
    };
    let rest = &text[marker..];
    if rest.is_empty() {
        return Some(Bullet {
            offset: lead + marker + 1,
            content: "",
            ordered_not_one,
        });
    }
    if !rest.starts_with([' ', '\t']) {
        return None;
    }
    let gap = match indent_width(rest) {
        gap @ 1..=4 => gap,
        _ => 1,
    };
    Some(Bullet {
        offset: lead + marker + gap,
        content: rest.trim_start_matches([' ', '\t']),
        ordered_not_one,
    })
}

/// A line that may lazily continue an item: not the start of any other block.
fn is_plain_text(text: &str) -> bool {
    !(text.starts_with("<!--")
        || is_thematic_break(text)
        || is_heading(text)
        || (is_setext_underline(text) && text.starts_with('='))
        || bullet(text).is_some()
        || open_fence(text).is_some())
}

fn is_heading(text: &str) -> bool {
    let hashes = text.bytes().take_while(|b| *b == b'#').count();
    (1..=6).contains(&hashes) && matches!(text.as_bytes().get(hashes), None | Some(b' ' | b'\t'))
}

/// `===` or `---` (no inner spaces) under a paragraph line.
fn is_setext_underline(text: &str) -> bool {
    !text.is_empty()
        && (text.bytes().all(|b| b == b'=') || (text.len() >= 2 && text.bytes().all(|b| b == b'-')))
}

/// Three or more `-`, `*` or `_` (one kind), optionally separated by spaces.
fn is_thematic_break(text: &str) -> bool {
    let mut kind = None;
    let mut count = 0;
    for c in text.chars() {
        match c {
            ' ' | '\t' => {}
            '-' | '*' | '_' if *kind.get_or_insert(c) == c => count += 1,
            _ => return false,
        }
    }
    count >= 3
}

fn open_fence(text: &str) -> Option<Fence> {
    let ch = text.chars().next().filter(|c| *c == '`' || *c == '~')?;
    let len = text.chars().take_while(|c| *c == ch).count();
    if len < 3 || (ch == '`' && text[len..].contains('`')) {
        return None;
    }
    Some(Fence { ch, len })
}

fn closes_fence(fence: Fence, text: &str) -> bool {
    let len = text.chars().take_while(|c| *c == fence.ch).count();
    len >= fence.len && text[len * fence.ch.len_utf8()..].trim().is_empty()
}

fn next_fence(current: Option<Fence>, text: &str) -> Option<Fence> {
    let text = text.trim_start_matches([' ', '\t']);
    match current {
        Some(fence) if closes_fence(fence, text) => None,
        Some(fence) => Some(fence),
        None => open_fence(text),
    }
}

/// Leading columns of spaces and tabs (tab stops every four columns).
fn indent_width(line: &str) -> usize {
    let mut col = 0;
    for c in line.chars() {
        match c {
            ' ' => col += 1,
            '\t' => col += 4 - col % 4,
            _ => break,
        }
    }
    col
}

/// `line` without up to `width` columns of leading spaces and tabs.
fn strip_indent(line: &str, width: usize) -> &str {
    let mut col = 0;
    for (i, c) in line.char_indices() {
        if col >= width {
            return &line[i..];
        }
        match c {
            ' ' => col += 1,
            '\t' => col += 4 - col % 4,
            _ => return &line[i..],
        }
    }
    ""
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;

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

    // ---- Markdown ----------------------------------------------------------------------------

    #[test]
    fn render_then_parse_round_trips() {
        let original = entries(&[
            "Prefer `cargo nextest` over `cargo test`.",
            "Multi-line rule:\nsecond line\n  indented third line",
            "提交前运行 `cargo fmt`,不要用 `--all`。",
            "多行中文条目\n第二行:保持简洁。",
            "Blank lines inside\n\n\nstay inside",
            "A code block:\n```sh\n# not a heading\n\ncargo test\n```\nafter the fence",
            "Unclosed fence\n```\nstill here",
            "- looks like a bullet\n* and so does this\n1. and this",
            "# looks like a heading\n<!-- looks like a comment -->\n---\n===",
            "---",
            "- - -",
            "***",
            "<!-- starts a comment",
            "Tabs\tinside\n\tand a leading tab",
            "\u{3000}ideographic space later\nok",
        ]);
        let rendered = render("project", 42, &original);
        let parsed = parse(&rendered);
        let normalized: Vec<String> = original.iter().filter_map(|e| normalize_entry(e)).collect();
        assert_eq!(parsed, normalized, "rendered:\n{rendered}");
        // Only the ideographic-space entry changes under normalisation.
        assert_eq!(
            normalized.last().unwrap(),
            "ideographic space later\nok",
            "leading whitespace of the first line is not content"
        );
        assert_eq!(parsed[..14], original[..14]);
        // Rendering is stable.
        assert_eq!(render("project", 42, &parsed), rendered);
    }

    #[test]
    fn render_layout() {
        let rendered = render(
            "global",
            7,
            &entries(&["One", "Two\nlines\n\nand a gap", "  ", ""]),
        );
        assert!(rendered.starts_with("<!--\n"));
        assert!(rendered.contains("global scope"));
        assert!(rendered.contains("revision 7"));
        assert!(rendered.contains("zuno learn import-memory global"));
        assert!(rendered.ends_with("-->\n\n- One\n- Two\n  lines\n\n  and a gap\n"));
        assert_eq!(
            parse(&rendered),
            entries(&["One", "Two\nlines\n\nand a gap"])
        );
        // No entries: just the header, which parses to nothing.
        assert_eq!(parse(&render("project", 0, &[])), Vec::<String>::new());
        // A hostile scope cannot close the comment early.
        let rendered = render("x-->- injected", 1, &entries(&["a"]));
        assert_eq!(parse(&rendered), entries(&["a"]));
    }

    #[test]
    fn projections_show_invisible_and_reordering_characters_as_markers() {
        let hostile = entries(&[
            "Use pnpm\u{202E}mpn esu\u{202C} always",
            "zero\u{200B}width and a forged [U+0041] marker",
            "plain entry",
        ]);
        let rendered = render("project", 3, &hostile);
        assert!(
            rendered.contains("- Use pnpm[U+202E]mpn esu[U+202C] always\n"),
            "{rendered}"
        );
        assert!(rendered.contains("- zero[U+200B]width and a forged &#91;U+0041] marker\n"));
        assert!(
            !rendered
                .chars()
                .any(|c| matches!(c as u32, 0x200B | 0x202C | 0x202E)),
            "no invisible character reaches the file"
        );
        let parsed = parse(&rendered);
        let visible: Vec<String> = hostile.iter().map(|e| visible_entry(e)).collect();
        assert_eq!(parsed, visible);
        assert_eq!(parsed[2], "plain entry", "ordinary entries are unchanged");
    }

    #[test]
    fn normalizes_messy_entries() {
        let messy = entries(&[
            "  padded  ",
            "\n\nlead\n  keep indent  \n\n",
            "crlf\r\nline",
        ]);
        let parsed = parse(&render("global", 1, &messy));
        assert_eq!(
            parsed,
            entries(&["padded", "lead\n  keep indent", "crlf\nline"])
        );
    }

    #[test]
    fn parses_hand_edited_markdown() {
        let text = "\u{feff}# Project rules\r\n\
            \r\n\
            Intro paragraph written by hand\r\n\
            that wraps onto a second line.\r\n\
            \r\n\
            ## Style\n\
            \n\
            * star bullet\n\
            + plus bullet\n\
            -   wide bullet\n    with its continuation\n\
            - lazy bullet\n\
            continues here\n\
            \n\
            Setext heading\n\
            ==============\n\
            \n\
            1. first ordered\n\
            2) second ordered\n\
            \n\
            - outer\n  - nested stays inside\n\
            \n\
            * * *\n\
            <!-- a note to self -->\n\
            Another paragraph.\n\
            Second setext\n\
            ---\n\
            ```bash\n\
            # a comment in code, not a heading\n\
            \n\
            make test\n\
            ```\n\
            \n\n\n\
            Last paragraph";
        assert_eq!(
            parse(text),
            entries(&[
                "Intro paragraph written by hand\nthat wraps onto a second line.",
                "star bullet",
                "plus bullet",
                "wide bullet\nwith its continuation",
                "lazy bullet\ncontinues here",
                "first ordered",
                "second ordered",
                "outer\n- nested stays inside",
                "Another paragraph.\nSecond setext",
                "```bash\n# a comment in code, not a heading\n\nmake test\n```",
                "Last paragraph",
            ])
        );
    }

    #[test]
    fn parses_paragraph_only_files() {
        let text = "Always run the linters.\n\n\
                    Never push to main.\nAsk first.\n\n\n\
                    用中文写提交说明。\n";
        assert_eq!(
            parse(text),
            entries(&[
                "Always run the linters.",
                "Never push to main.\nAsk first.",
                "用中文写提交说明。"
            ])
        );
        assert_eq!(parse(""), Vec::<String>::new());
        assert_eq!(
            parse("\n\n# Only a heading\n\n<!--\nmulti\nline\n-->\n"),
            Vec::<String>::new()
        );
        // Text after a comment on the same line is kept; a year is not an ordered item mid-paragraph.
        assert_eq!(
            parse("<!-- note --> kept text\nsince\n2024. still the same paragraph"),
            entries(&["kept text\nsince\n2024. still the same paragraph"])
        );
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
            Err(ProjectionError::Unreadable { path, reason }) => {
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
        assert_eq!(state.entries, entries(&["Use tabs"]));

        // Only the immediate directory is created: a missing worktree is not resurrected.
        let gone = tmp.path().join("deleted-worktree/.zuno/RULES.md");
        assert!(matches!(
            publish(&gone, &content, None),
            Err(ProjectionError::Io { .. })
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
            read(&path).unwrap().unwrap().entries,
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
            Err(ProjectionError::Busy { path: path.clone() })
        );
        release_tx.send(()).unwrap();
        holder.join().unwrap().unwrap();
        assert_eq!(try_with_lock(&path, || Ok(())), Ok(()));
    }

    const HOLD_ENV: &str = "ZUNO_TEST_PROJECTION_HOLD_LOCK";
    const HELD_MARKER: &str = "zuno-projection-lock-held";

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
                "memory::projection::tests::lock_holder_child",
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
            Err(ProjectionError::Busy { path: path.clone() })
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
