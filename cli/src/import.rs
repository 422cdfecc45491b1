//! `zuno import claude-code|codex|aider <file-or-dir>`: host transcripts into Zuno through the
//! ingestion routes (`POST /api/session/{id}/messages`), so closed eligible turns admit their
//! extraction jobs exactly as a live host's would. Ids are derived from the host's (for Aider,
//! from the history file and positions in it), so a re-import adds nothing twice.

use std::collections::HashSet;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};

use clap::{Subcommand, ValueEnum};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::Serialize;
use serde_json::{Value, json};
use zuno_shared::transcript::import::{
    self, Host, ImportedSession, LineIssue, Parsed, Position, aider,
};

use crate::client::{ApiClient, ClientError, ServerArgs};
use crate::error::CliError;
use crate::global::GlobalArgs;
use crate::local_project::local_project;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum HostArg {
    ClaudeCode,
    Codex,
    Aider,
}

impl From<HostArg> for Host {
    fn from(host: HostArg) -> Host {
        match host {
            HostArg::ClaudeCode => Host::ClaudeCode,
            HostArg::Codex => Host::Codex,
            HostArg::Aider => Host::Aider,
        }
    }
}

#[derive(Debug, clap::Args)]
pub struct ImportArgs {
    /// A transcript file, or a directory searched recursively for them (`*.jsonl`; for Aider
    /// `*.aider.chat.history.md`).
    pub path: PathBuf,
    /// Import into this project instead of one derived from each session's working directory.
    #[arg(long)]
    pub project: Option<String>,
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub server: ServerArgs,
}

#[derive(Debug, Subcommand)]
pub enum ImportCommand {
    /// Claude Code JSONL session logs (~/.claude/projects/…), with subagent sidechains.
    ClaudeCode(ImportArgs),
    /// Codex rollout JSONL (~/.codex/sessions/…).
    Codex(ImportArgs),
    /// Aider chat histories (`.aider.chat.history.md` in the directory aider ran in; that
    /// directory is the project unless `--project` is given).
    Aider(ImportArgs),
    /// Claude Code's own memory (CLAUDE.md files, `.claude/rules`, auto memory) into resident
    /// Memory as the user's entries, without duplicating rules Memory already states.
    ClaudeCodeMemory(crate::claude_memory::ClaudeMemoryArgs),
}

/// What an import did.
#[derive(Debug, Default, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ImportReport {
    pub files: usize,
    pub sessions: Vec<String>,
    pub sessions_created: usize,
    pub messages_added: usize,
    pub messages_existing: usize,
    pub messages_rejected: usize,
    pub jobs_admitted: usize,
    pub issues: Vec<FileIssue>,
}

#[derive(Debug, Clone, Serialize)]
pub struct FileIssue {
    pub file: String,
    pub line: u64,
    pub reason: String,
}

pub async fn run(global: &GlobalArgs, command: ImportCommand) -> Result<(), CliError> {
    let (host, args) = match command {
        ImportCommand::ClaudeCode(args) => (Host::ClaudeCode, args),
        ImportCommand::Codex(args) => (Host::Codex, args),
        ImportCommand::Aider(args) => (Host::Aider, args),
        ImportCommand::ClaudeCodeMemory(args) => {
            return crate::claude_memory::run(global, args).await;
        }
    };
    let files = discover(host, &args.path)?;
    if files.is_empty() {
        let kind = match host {
            Host::Aider => "Aider chat histories (*.aider.chat.history.md)",
            Host::ClaudeCode | Host::Codex => ".jsonl transcripts",
        };
        return Err(CliError::new(
            CliError::BAD_INPUT,
            format!("no {kind} under `{}`", args.path.display()),
        ));
    }
    // Every file is read before anything is sent: a file that is not a transcript stops the
    // import before it touches the server or the local database.
    let mut parsed = Vec::new();
    for file in &files {
        parsed.push((file.clone(), parse_file(host, file, Position::default())?));
    }
    let client = ApiClient::connect(global, &args.server).await?;
    let total: u64 = parsed
        .iter()
        .flat_map(|(_, p)| &p.sessions)
        .map(|s| s.messages.len() as u64)
        .sum();
    let bar = progress(total);
    let mut importer = Importer::new(client, args.project.clone());
    importer.report.files = files.len();
    for (file, parsed) in &parsed {
        importer
            .import(&file.display().to_string(), parsed, Some(&bar))
            .await?;
    }
    bar.finish_and_clear();
    let report = importer.report;
    for issue in &report.issues {
        eprintln!(
            "zuno: {}:{}: skipped: {}",
            issue.file, issue.line, issue.reason
        );
    }
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).unwrap_or_default()
        );
    } else {
        println!(
            "imported {} file(s): {} session(s) ({} new), {} message(s) added, {} already present, {} extraction job(s) admitted{}",
            report.files,
            report.sessions.len(),
            report.sessions_created,
            report.messages_added,
            report.messages_existing,
            report.jobs_admitted,
            if report.issues.is_empty() {
                String::new()
            } else {
                format!(", {} line(s) skipped", report.issues.len())
            }
        );
    }
    Ok(())
}

/// A progress bar on stderr, hidden when stderr is not a terminal.
fn progress(total: u64) -> ProgressBar {
    let bar = ProgressBar::new(total);
    if std::io::stderr().is_terminal() {
        bar.set_draw_target(ProgressDrawTarget::stderr());
        if let Ok(style) =
            ProgressStyle::with_template("{bar:40} {pos}/{len} messages {elapsed} {msg}")
        {
            bar.set_style(style);
        }
    } else {
        bar.set_draw_target(ProgressDrawTarget::hidden());
    }
    bar
}

/// Parses one file from `start`. Aider sessions are scoped to the file, with its directory as
/// their working directory; a file that is not a transcript of `host` at all is bad input.
pub fn parse_file(host: Host, file: &Path, start: Position) -> Result<Parsed, CliError> {
    parse_file_with_session(host, file, start, None)
}

/// As [`parse_file`]; a Codex rollout read from a watermark past its `session_meta` is named by
/// `session` (its id and working directory).
pub fn parse_file_with_session(
    host: Host,
    file: &Path,
    start: Position,
    session: Option<(String, Option<String>)>,
) -> Result<Parsed, CliError> {
    let unreadable = |error: std::io::Error| {
        CliError::new(
            CliError::BAD_INPUT,
            format!("cannot read `{}`: {error}", file.display()),
        )
    };
    let mut handle = std::fs::File::open(file).map_err(unreadable)?;
    if start.offset > 0 {
        use std::io::Seek;
        handle
            .seek(std::io::SeekFrom::Start(start.offset))
            .map_err(unreadable)?;
    }
    let reader = std::io::BufReader::new(handle);
    let mut parsed = match (host, session) {
        (Host::Codex, Some(session)) => {
            import::codex::parse_with_session(reader, start, Some(session))
        }
        _ => import::parse(host, reader, start),
    }
    .map_err(unreadable)?;
    if let Some(issue) = &parsed.unrecognized {
        return Err(CliError::new(
            CliError::BAD_INPUT,
            format!("{}:{}: {}", file.display(), issue.line, issue.reason),
        ));
    }
    if host == Host::Aider {
        aider::locate(&mut parsed, file);
    }
    Ok(parsed)
}

/// The transcripts of `host` at `path`: the file itself (whatever its name), or every one below
/// the directory (symlinks are not followed): `.jsonl` files, main sessions before `subagents/`
/// sidechains so parents exist first; for Aider, files named `*.aider.chat.history.md`, outside
/// `.git` and `node_modules`.
pub fn discover(host: Host, path: &Path) -> Result<Vec<PathBuf>, CliError> {
    let meta = std::fs::symlink_metadata(path).map_err(|error| {
        CliError::new(
            CliError::BAD_INPUT,
            format!("cannot read `{}`: {error}", path.display()),
        )
    })?;
    let follow = meta
        .file_type()
        .is_symlink()
        .then(|| std::fs::metadata(path));
    let is_dir = match follow {
        Some(Ok(target)) => target.is_dir(),
        Some(Err(_)) => false,
        None => meta.is_dir(),
    };
    if !is_dir {
        return Ok(vec![path.to_path_buf()]);
    }
    let mut found = Vec::new();
    let mut pending = vec![path.to_path_buf()];
    while let Some(dir) = pending.pop() {
        let entries = std::fs::read_dir(&dir).map_err(|error| {
            CliError::new(
                CliError::BAD_INPUT,
                format!("cannot read `{}`: {error}", dir.display()),
            )
        })?;
        for entry in entries.flatten() {
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            let entry_path = entry.path();
            if kind.is_dir() {
                let skipped = host == Host::Aider
                    && entry_path
                        .file_name()
                        .is_some_and(|name| name == ".git" || name == "node_modules");
                if !skipped {
                    pending.push(entry_path);
                }
            } else if kind.is_file() && is_transcript_name(host, &entry_path) {
                found.push(entry_path);
            }
        }
    }
    found.sort_by_key(|file| {
        let sidechain = file.components().any(|c| c.as_os_str() == "subagents");
        (sidechain, file.clone())
    });
    Ok(found)
}

/// Whether a file found in a directory walk is a transcript of `host`, by its name.
fn is_transcript_name(host: Host, file: &Path) -> bool {
    match host {
        Host::ClaudeCode | Host::Codex => file.extension().is_some_and(|ext| ext == "jsonl"),
        Host::Aider => file
            .file_name()
            .and_then(|name| name.to_str())
            .is_some_and(|name| name.ends_with(".aider.chat.history.md")),
    }
}

/// Applies parsed sessions through the API.
pub struct Importer {
    client: ApiClient,
    project: Option<String>,
    projects: HashSet<String>,
    sessions: HashSet<String>,
    pub report: ImportReport,
}

impl Importer {
    pub fn new(client: ApiClient, project: Option<String>) -> Importer {
        Importer {
            client,
            project,
            projects: HashSet::new(),
            sessions: HashSet::new(),
            report: ImportReport::default(),
        }
    }

    /// Imports every session of `parsed` (main sessions before their sidechains).
    pub async fn import(
        &mut self,
        file: &str,
        parsed: &Parsed,
        bar: Option<&ProgressBar>,
    ) -> Result<(), CliError> {
        self.report
            .issues
            .extend(parsed.issues.iter().map(|issue: &LineIssue| FileIssue {
                file: file.to_owned(),
                line: issue.line,
                reason: issue.reason.clone(),
            }));
        let mut sessions: Vec<&ImportedSession> = parsed.sessions.iter().collect();
        sessions.sort_by_key(|session| session.parent_ref.is_some());
        for session in sessions {
            if session.messages.is_empty() {
                continue;
            }
            self.session(file, session, bar).await?;
        }
        Ok(())
    }

    async fn ensure_project(&mut self, session: &ImportedSession) -> Result<String, CliError> {
        if let Some(project) = &self.project {
            if self.projects.insert(project.clone()) {
                let body = json!({ "id": project, "name": project });
                tolerate_conflict(self.client.post("/api/projects", &body).await)?;
            }
            return Ok(project.clone());
        }
        let cwd = session.cwd.as_deref().unwrap_or("unknown");
        let local = local_project(cwd);
        if self.projects.insert(local.id.clone()) {
            crate::client::ensure_project(
                &self.client,
                &local.id,
                &local.name,
                local.worktree.as_deref(),
            )
            .await?;
        }
        Ok(local.id)
    }

    async fn session(
        &mut self,
        file: &str,
        session: &ImportedSession,
        bar: Option<&ProgressBar>,
    ) -> Result<(), CliError> {
        let project = self.ensure_project(session).await?;
        let session_id = session.session_id();
        if self.sessions.insert(session_id.clone()) {
            let mut body = json!({
                "id": session_id,
                "title": session.title,
                "externalRef": session.external_ref,
            });
            if let Some(parent) = session.parent_session_id() {
                body["parentId"] = Value::String(parent);
            }
            let path = format!("/api/projects/{}/sessions", crate::client::encode(&project));
            let created = match self.client.post(&path, &body).await {
                Ok(_) => true,
                Err(error) if error.status() == Some(409) => false,
                Err(error) if error.status() == Some(404) && body.get("parentId").is_some() => {
                    // The parent session was not imported (its file was not given).
                    body.as_object_mut().map(|object| object.remove("parentId"));
                    tolerate_conflict(self.client.post(&path, &body).await)?
                }
                Err(error) => return Err(error.into()),
            };
            if created {
                self.report.sessions_created += 1;
            }
            self.report.sessions.push(session_id.clone());
        }
        let path = format!(
            "/api/session/{}/messages",
            crate::client::encode(&session_id)
        );
        for message in &session.messages {
            let body = json!({
                "id": message.message_id(&session_id),
                "role": message.role,
                "status": message.status,
                "parts": message.parts,
                "createdAt": message.created_at,
            });
            match self.client.post_status(&path, &body).await {
                // The same message was already stored (a re-import): 200, not 201.
                Ok((200, _)) => self.report.messages_existing += 1,
                Ok((_, outcome)) => {
                    self.report.messages_added += 1;
                    if outcome
                        .pointer("/admission/outcome")
                        .and_then(Value::as_str)
                        == Some("queued")
                    {
                        self.report.jobs_admitted += 1;
                    }
                }
                Err(error) if error.status() == Some(409) => self.report.messages_existing += 1,
                Err(ClientError::Problem {
                    status: 400 | 413,
                    detail,
                    ..
                }) => {
                    // One unacceptable message (e.g. oversized) does not stop the import.
                    self.report.messages_rejected += 1;
                    self.report.issues.push(FileIssue {
                        file: file.to_owned(),
                        line: message.line,
                        reason: format!("message `{}` rejected: {detail}", message.key),
                    });
                }
                Err(error) => return Err(error.into()),
            }
            if let Some(bar) = bar {
                bar.inc(1);
            }
        }
        Ok(())
    }
}

/// The project a working directory belongs to, as every local client derives it (hooks,
/// imports, `zuno learn`, the MCP server), and the worktree a hook may bind for it.
/// `Ok(true)` when created, `Ok(false)` when it already existed (409).
fn tolerate_conflict(result: Result<Value, ClientError>) -> Result<bool, CliError> {
    match result {
        Ok(_) => Ok(true),
        Err(error) if error.status() == Some(409) => Ok(false),
        Err(error) => Err(error.into()),
    }
}
