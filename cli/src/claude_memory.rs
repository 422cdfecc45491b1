//! `zuno import claude-code-memory [dir]`: absorbs the memory Claude Code keeps of its own into
//! Zuno's resident Memory, so the rules a user already wrote (or Claude Code noted) reach every
//! agent Zuno serves and are not learned a second time.
//!
//! Read, for the project directory `dir` (default: the current directory):
//! - `CLAUDE.md`, `.claude/CLAUDE.md`, `CLAUDE.local.md` and `.claude/rules/*.md` in it: project
//!   Memory;
//! - `~/.claude/CLAUDE.md` and `~/.claude/rules/*.md` (the user's rules for every project): global
//!   Memory, unless `--no-global`;
//! - auto memory, `~/.claude/projects/<dir with '/' and '.' as '-'>/memory/`: the first 200 lines
//!   of its `MEMORY.md` index (what Claude Code loads; lines that only link a topic file are
//!   pointers, not notes) and its topic files, whose front matter `type: user` makes them global
//!   and any other type project Memory.
//!
//! Each bullet or paragraph is one entry (Markdown as the Memory projections are read back:
//! headings dropped, code blocks kept whole); `@path` import lines are Claude Code directives, not
//! rules, so the `@.zuno/RULES.md` line `zuno install claude-code --claude-md` adds is never read
//! back. Entries are added as the user's own (`origin: user`: protected from automatic rewrites,
//! never dropped at the cap) with their provenance (`file:line`) as the change's reason. A rule
//! Memory already holds, in the same or other words ([`same_rule`]), is not added again, nor is a
//! rule stated twice across these files. The document caps apply: what does not fit even after
//! consolidation is reported with the server's reason and skipped, and the rest is still imported.

use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::{Value, json};
use zuno_shared::memory::dedupe::same_rule;
use zuno_shared::memory::markdown;

use crate::client::{ApiClient, ClientError, ServerArgs, encode};
use crate::error::CliError;
use crate::global::GlobalArgs;
use crate::local_project::local_project;

/// Lines of `MEMORY.md` Claude Code loads at the start of a session.
const INDEX_LINES: usize = 200;
/// Bytes read from one memory file at most (Claude Code's own files are a few kilobytes).
const MAX_FILE_BYTES: u64 = 1024 * 1024;

#[derive(Debug, clap::Args)]
pub struct ClaudeMemoryArgs {
    /// The project directory whose CLAUDE.md files and auto memory are read (default: the
    /// current directory).
    pub dir: Option<PathBuf>,
    /// Import into this project instead of the one derived from the directory.
    #[arg(long)]
    pub project: Option<String>,
    /// Claude Code's configuration directory (default: `$CLAUDE_CONFIG_DIR`, else `~/.claude`).
    #[arg(long)]
    pub claude_home: Option<PathBuf>,
    /// Leave the user-level files (`~/.claude/CLAUDE.md`, `~/.claude/rules/`) and `type: user`
    /// auto-memory notes out.
    #[arg(long)]
    pub no_global: bool,
    /// Show what would be imported; change nothing.
    #[arg(long)]
    pub dry_run: bool,
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub server: ServerArgs,
}

/// One entry read from a memory file.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Note {
    /// `global` or `project`.
    pub target: &'static str,
    pub content: String,
    pub file: String,
    pub line: u64,
}

/// What happened to one note.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NoteOutcome {
    #[serde(flatten)]
    pub note: Note,
    /// `added`, `present` (Memory or an earlier note states the rule), `skipped` or, with
    /// `--dry-run`, `new`.
    pub outcome: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

#[derive(Debug, Default, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MemoryImportReport {
    pub project: String,
    pub files: Vec<String>,
    pub added: usize,
    pub present: usize,
    pub skipped: usize,
    pub notes: Vec<NoteOutcome>,
}

impl MemoryImportReport {
    /// Records what became of `note` and counts it: `new` (a dry run's) counts as added.
    fn record(&mut self, note: Note, outcome: &'static str, detail: Option<String>) {
        match outcome {
            "present" => self.present += 1,
            "added" | "new" => self.added += 1,
            _ => self.skipped += 1,
        }
        self.notes.push(NoteOutcome {
            note,
            outcome,
            detail,
        });
    }
}

/// Claude Code's configuration directory: `--claude-home`, `$CLAUDE_CONFIG_DIR`, `~/.claude`.
pub fn claude_home(given: Option<&Path>) -> Option<PathBuf> {
    if let Some(given) = given {
        return Some(given.to_path_buf());
    }
    if let Some(dir) = std::env::var_os("CLAUDE_CONFIG_DIR").filter(|dir| !dir.is_empty()) {
        return Some(PathBuf::from(dir));
    }
    directories::BaseDirs::new().map(|dirs| dirs.home_dir().join(".claude"))
}

/// The auto-memory directory Claude Code keeps for `dir`: its path with `/` and `.` as `-`.
pub fn auto_memory_dir(claude_home: &Path, dir: &Path) -> PathBuf {
    let slug: String = dir
        .to_string_lossy()
        .chars()
        .map(|c| {
            if matches!(c, '/' | '\\' | '.' | ':') {
                '-'
            } else {
                c
            }
        })
        .collect();
    claude_home.join("projects").join(slug).join("memory")
}

/// Every note in the memory files for `dir` (see the module documentation), in file order.
pub fn collect(dir: &Path, claude_home: Option<&Path>, global: bool) -> (Vec<String>, Vec<Note>) {
    let mut files = Vec::new();
    let mut notes = Vec::new();
    let mut read = |path: &Path, target: &'static str, index: bool| {
        let Some(text) = read_text(path) else {
            return;
        };
        files.push(path.display().to_string());
        notes.extend(notes_of(&text, path, target, index));
    };
    if global && let Some(home) = claude_home {
        read(&home.join("CLAUDE.md"), "global", false);
        for rule in markdown_files(&home.join("rules")) {
            read(&rule, "global", false);
        }
    }
    for name in ["CLAUDE.md", ".claude/CLAUDE.md", "CLAUDE.local.md"] {
        read(&dir.join(name), "project", false);
    }
    for rule in markdown_files(&dir.join(".claude").join("rules")) {
        read(&rule, "project", false);
    }
    if let Some(home) = claude_home {
        let auto = auto_memory_dir(home, dir);
        read(&auto.join("MEMORY.md"), "project", true);
        for topic in markdown_files(&auto) {
            if topic.file_name().is_some_and(|name| name == "MEMORY.md") {
                continue;
            }
            let Some(text) = read_text(&topic) else {
                continue;
            };
            let target = match front_matter_type(&text).as_deref() {
                Some("user") if global => "global",
                Some("user") => continue,
                _ => "project",
            };
            files.push(topic.display().to_string());
            notes.extend(notes_of(&text, &topic, target, false));
        }
    }
    (files, notes)
}

/// A regular file's text (symbolic links are not followed into other places).
fn read_text(path: &Path) -> Option<String> {
    let meta = std::fs::symlink_metadata(path).ok()?;
    if !meta.is_file() || meta.len() > MAX_FILE_BYTES {
        return None;
    }
    std::fs::read_to_string(path).ok()
}

/// The `*.md` files directly in `dir`, sorted.
fn markdown_files(dir: &Path) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|entry| entry.file_type().is_ok_and(|kind| kind.is_file()))
        .map(|entry| entry.path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "md"))
        .collect();
    found.sort();
    found
}

/// The text after a leading `---` front matter block, and the number of lines it took.
fn without_front_matter(text: &str) -> (&str, usize) {
    let mut lines = text.split_inclusive('\n');
    if lines.next().map(str::trim_end) != Some("---") {
        return (text, 0);
    }
    let mut offset = text.find('\n').map_or(text.len(), |i| i + 1);
    let mut count = 1;
    for line in lines {
        offset += line.len();
        count += 1;
        if line.trim_end() == "---" {
            return (&text[offset..], count);
        }
    }
    (text, 0)
}

/// The `type:` of an auto-memory topic file's front matter.
fn front_matter_type(text: &str) -> Option<String> {
    let (_, lines) = without_front_matter(text);
    text.lines().take(lines).find_map(|line| {
        line.strip_prefix("type:")
            .map(|value| value.trim().trim_matches(['"', '\'']).to_lowercase())
    })
}

/// The notes of one file: its entries as Memory reads Markdown, without import directives and
/// (in the `MEMORY.md` index) pointers to topic files.
fn notes_of(text: &str, path: &Path, target: &'static str, index: bool) -> Vec<Note> {
    let (body, skipped_lines) = without_front_matter(text);
    let body = if index {
        body.lines()
            .take(INDEX_LINES)
            .collect::<Vec<_>>()
            .join("\n")
    } else {
        body.to_owned()
    };
    let lines: Vec<&str> = body.lines().collect();
    let mut searched = 0;
    markdown::parse(&body)
        .into_iter()
        .filter(|entry| !(is_import_directive(entry) || index && is_topic_pointer(entry)))
        .map(|entry| {
            let first = entry.lines().next().unwrap_or_default().trim().to_owned();
            let found = lines[searched..]
                .iter()
                .position(|line| line.contains(first.as_str()))
                .map(|i| searched + i);
            if let Some(found) = found {
                searched = found;
            }
            Note {
                target,
                content: entry,
                file: path.display().to_string(),
                line: (found.unwrap_or(0) + skipped_lines + 1) as u64,
            }
        })
        .collect()
}

/// `@path/to/file` lines: Claude Code's import syntax.
fn is_import_directive(entry: &str) -> bool {
    entry
        .lines()
        .all(|line| line.trim().is_empty() || is_import_line(line))
}

/// One `@path` import line.
pub fn is_import_line(line: &str) -> bool {
    let line = line.trim();
    line.len() > 1 && line.starts_with('@') && !line.contains(char::is_whitespace)
}

/// An index line that only links a topic file: `[Title](file.md)`, optionally with a hook after
/// a dash.
fn is_topic_pointer(entry: &str) -> bool {
    let line = entry.trim();
    let Some(rest) = line.strip_prefix('[') else {
        return false;
    };
    rest.split_once("](")
        .and_then(|(_, target)| target.split_once(')'))
        .is_some_and(|(target, _)| target.ends_with(".md") && !entry.contains('\n'))
}

pub async fn run(global: &GlobalArgs, args: ClaudeMemoryArgs) -> Result<(), CliError> {
    let dir = match &args.dir {
        Some(dir) => dir.clone(),
        None => std::env::current_dir()
            .map_err(|error| CliError::new(CliError::FAILURE, error.to_string()))?,
    };
    let dir = std::path::absolute(&dir)
        .map_err(|error| CliError::new(CliError::BAD_INPUT, error.to_string()))?;
    if !dir.is_dir() {
        return Err(CliError::new(
            CliError::BAD_INPUT,
            format!("`{}` is not a directory", dir.display()),
        ));
    }
    let home = claude_home(args.claude_home.as_deref());
    let (files, notes) = collect(&dir, home.as_deref(), !args.no_global);
    if files.is_empty() {
        return Err(CliError::new(
            CliError::BAD_INPUT,
            format!(
                "no Claude Code memory for `{}` (CLAUDE.md, .claude/rules, auto memory{})",
                dir.display(),
                home.as_deref()
                    .map(|home| format!(" under {}", home.display()))
                    .unwrap_or_default()
            ),
        ));
    }
    let client = ApiClient::connect(global, &args.server).await?;
    let report = import(
        &client,
        &dir,
        args.project.as_deref(),
        files,
        notes,
        args.dry_run,
    )
    .await?;
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).unwrap_or_default()
        );
    } else {
        for note in report.notes.iter().filter(|n| n.outcome == "skipped") {
            eprintln!(
                "zuno: {}:{}: skipped: {}",
                note.note.file,
                note.note.line,
                note.detail.as_deref().unwrap_or("refused")
            );
        }
        let verb = if args.dry_run { "would add" } else { "added" };
        println!(
            "{} file(s) read for project `{}`: {} {} entr{}, {} already in Memory, {} skipped",
            report.files.len(),
            report.project,
            verb,
            report.added,
            if report.added == 1 { "y" } else { "ies" },
            report.present,
            report.skipped
        );
    }
    Ok(())
}

/// Sends `notes` to the project's Memory (see the module documentation).
pub async fn import(
    client: &ApiClient,
    dir: &Path,
    project: Option<&str>,
    files: Vec<String>,
    notes: Vec<Note>,
    dry_run: bool,
) -> Result<MemoryImportReport, CliError> {
    let project = ensure_import_project(client, dir, project).await?;
    let memory_path = format!("/api/projects/{}/memory", encode(&project));
    let mut known = known_entries(client, &memory_path, &notes).await?;
    let mut report = MemoryImportReport {
        project: project.clone(),
        files,
        ..MemoryImportReport::default()
    };
    for note in notes {
        let present = known
            .iter()
            .any(|(target, content)| *target == note.target && same_rule(content, &note.content));
        if present {
            report.record(note, "present", None);
            continue;
        }
        if dry_run {
            known.push((note.target, note.content.clone()));
            report.record(note, "new", None);
            continue;
        }
        add_note(client, &memory_path, note, &mut known, &mut report).await?;
    }
    Ok(report)
}

/// The project to import into (`--project`, else the one of `dir`), created when missing.
async fn ensure_import_project(
    client: &ApiClient,
    dir: &Path,
    project: Option<&str>,
) -> Result<String, CliError> {
    let cwd = dir.to_string_lossy();
    Ok(match project {
        Some(project) => {
            crate::client::ensure_project(client, project, project, None).await?;
            project.to_owned()
        }
        None => {
            let local = local_project(&cwd);
            crate::client::ensure_project(
                client,
                &local.id,
                &local.name,
                local.worktree.as_deref(),
            )
            .await?;
            local.id
        }
    })
}

/// The entries Memory already holds, per target, so a note that restates one is not sent
/// again. Only the targets some note goes to are read.
async fn known_entries(
    client: &ApiClient,
    memory_path: &str,
    notes: &[Note],
) -> Result<Vec<(&'static str, String)>, CliError> {
    let mut known: Vec<(&'static str, String)> = Vec::new();
    for target in ["global", "project"] {
        if !notes.iter().any(|note| note.target == target) {
            continue;
        }
        let read = client
            .get(&format!("{memory_path}?target={target}"))
            .await?;
        for document in read["documents"].as_array().into_iter().flatten() {
            for entry in document["entries"].as_array().into_iter().flatten() {
                if let Some(content) = entry["content"].as_str() {
                    known.push((target, content.to_owned()));
                }
            }
        }
    }
    Ok(known)
}

/// Adds one note as the user's own entry, and reports what became of it.
async fn add_note(
    client: &ApiClient,
    memory_path: &str,
    note: Note,
    known: &mut Vec<(&'static str, String)>,
    report: &mut MemoryImportReport,
) -> Result<(), CliError> {
    let body = json!({
        "target": note.target,
        "action": "add",
        "content": note.content,
        "reason": format!("imported from Claude Code memory: {}:{}", note.file, note.line),
        "confidence": 1.0,
        "origin": "user",
    });
    match client.post(memory_path, &body).await {
        Ok(outcome) => {
            known.push((note.target, note.content.clone()));
            let applied = outcome["applied"].as_bool() == Some(true);
            let detail = (!applied).then(|| String::from("left pending for review"));
            report.record(note, if applied { "added" } else { "skipped" }, detail);
        }
        Err(ClientError::Problem { status: 403, .. }) => {
            return Err(CliError::new(
                CliError::BAD_INPUT,
                "importing Claude Code memory adds the user's own entries: it needs the user's token (the local token, or one created with `zuno tokens create --user`)",
            ));
        }
        Err(ClientError::Problem {
            status: 400 | 409 | 413,
            detail,
            body,
            ..
        }) => {
            // One entry Memory refuses (over the cap, a credential, an injection) does not
            // stop the import.
            let field = body
                .get("field")
                .and_then(Value::as_str)
                .unwrap_or("content");
            report.record(note, "skipped", Some(format!("{detail} ({field})")));
        }
        Err(error) => return Err(error.into()),
    }
    Ok(())
}
