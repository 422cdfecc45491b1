//! Parsers for agent transcripts written by other hosts: Claude Code JSONL session logs, Codex
//! rollout JSONL and Aider chat histories (Markdown). They turn an append-only file into Zuno
//! sessions and messages (one user message per prompt, one assistant message per turn with its
//! tool calls and results), with a stable key per message so a re-import is idempotent.
//!
//! Everything read here is untrusted: it becomes message text and JSON values only, never
//! query grammar, instructions or paths. Ids derived from it are hashed or validated.

pub mod aider;
pub mod claude_code;
pub mod codex;

use std::io::BufRead;

use sha2::{Digest, Sha256};

use super::{MessageStatus, Part, Role, ToolStatus};

/// Bytes kept from one tool result or text block (the rest is cut with a marker), so a single
/// huge tool output cannot exceed the per-part limit.
pub const MAX_TEXT_BYTES: usize = 64 * 1024;
/// Parts per assistant message before the turn is split (the store accepts 512).
pub const MAX_PARTS_PER_MESSAGE: usize = 480;

zuno_queue::text_enum! {
    /// Which host wrote the transcript.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Host {
        ClaudeCode = "claude-code",
        Codex = "codex",
        Aider = "aider",
    }
}

impl Host {
    /// The prefix of Zuno session ids derived from this host's session ids.
    pub fn prefix(self) -> &'static str {
        match self {
            Host::ClaudeCode => "cc",
            Host::Codex => "cx",
            Host::Aider => "ad",
        }
    }
}

/// One session found in a transcript (a main session or a sidechain).
#[derive(Debug, Clone, PartialEq)]
pub struct ImportedSession {
    pub host: Host,
    /// The host's own session reference (`<sessionId>` or `<sessionId>/agent-<agentId>`).
    pub external_ref: String,
    /// The parent session's external reference, for sidechains (subagents).
    pub parent_ref: Option<String>,
    /// The working directory the host recorded (untrusted).
    pub cwd: Option<String>,
    pub title: Option<String>,
    pub messages: Vec<ImportedMessage>,
}

impl ImportedSession {
    /// The Zuno session id for this host session: stable across imports.
    pub fn session_id(&self) -> String {
        session_id_for(self.host, &self.external_ref)
    }

    pub fn parent_session_id(&self) -> Option<String> {
        self.parent_ref
            .as_deref()
            .map(|parent| session_id_for(self.host, parent))
    }
}

/// The Zuno session id for a host session reference: `<prefix>-<ref>` when that is a valid id,
/// else `<prefix>-<digest>`.
pub fn session_id_for(host: Host, external_ref: &str) -> String {
    let readable = format!("{}-{}", host.prefix(), external_ref.replace('/', "-"));
    if crate::ids::is_valid_external_id(&readable) {
        readable
    } else {
        format!("{}-{}", host.prefix(), &digest(&[external_ref])[..32])
    }
}

/// One message to append.
#[derive(Debug, Clone, PartialEq)]
pub struct ImportedMessage {
    /// The host's stable key for the message (a record uuid, or a line number).
    pub key: String,
    /// The 1-based line of the transcript where the message starts: the JSON line of the record
    /// that opened it (Claude Code, Codex), the first `#### ` line of a prompt or the first line
    /// of a turn's output (Aider). Lets a reader map stored messages back to the file.
    pub line: u64,
    pub role: Role,
    pub status: MessageStatus,
    pub parts: Vec<Part>,
    pub created_at: Option<i64>,
}

impl ImportedMessage {
    /// The Zuno message id: a digest of the session id and the host key, so re-importing the
    /// same record yields the same id.
    pub fn message_id(&self, session_id: &str) -> String {
        format!("m-{}", &digest(&[session_id, &self.key])[..40])
    }
}

/// A line that could not be used; the rest of the file is still imported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LineIssue {
    /// 1-based line number in the file.
    pub line: u64,
    pub reason: String,
}

/// The result of parsing one file (or the part of it after a watermark).
#[derive(Debug, Clone, Default)]
pub struct Parsed {
    pub sessions: Vec<ImportedSession>,
    pub issues: Vec<LineIssue>,
    /// Complete lines read (including malformed and ignored ones).
    pub lines: u64,
    /// Bytes of complete lines consumed from the reader: the next watermark offset is the
    /// start offset plus this. A trailing line without a newline that does not parse yet (the
    /// host is still writing it) is not consumed.
    pub consumed_bytes: u64,
    /// Set when the file as a whole is not a transcript of the host (the line says where that
    /// shows): nothing in it was imported, and callers refuse it as bad input.
    pub unrecognized: Option<LineIssue>,
    /// Claude Code only: where what was read attaches to the conversation tree.
    pub chain: ChainEnds,
}

/// How a part of a Claude Code log read from a watermark attaches to what came before it: a
/// reader that remembers the last record it saw can tell that the session went back to an
/// earlier point (a rewind) when a new branch starts under another record.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ChainEnds {
    /// The `uuid` of the last record read.
    pub last: Option<String>,
    /// Parents, not among the records read, of the user messages that start a branch.
    pub outside_parents: Vec<String>,
}

/// Where parsing starts: a byte offset at a line boundary and the number of lines before it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Position {
    pub offset: u64,
    pub line: u64,
}

/// Errors reading a transcript.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    #[error("cannot read `{path}`: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

/// Reads JSON lines from `reader`, calling `record` with each parsed object and its 1-based
/// line number. Malformed lines become issues; a final partial line that does not parse is
/// left unconsumed.
pub(crate) fn for_each_line(
    mut reader: impl BufRead,
    start: Position,
    issues: &mut Vec<LineIssue>,
    mut record: impl FnMut(u64, serde_json::Value),
) -> std::io::Result<(u64, u64)> {
    let mut buffer = Vec::new();
    let mut line = start.line;
    let mut lines = 0;
    let mut consumed = 0u64;
    loop {
        buffer.clear();
        let read = reader.read_until(b'\n', &mut buffer)?;
        if read == 0 {
            break;
        }
        let complete = buffer.last() == Some(&b'\n');
        let parsed = serde_json::from_slice::<serde_json::Value>(trim(&buffer));
        if !complete && parsed.is_err() {
            // The host may still be writing this line: leave it for the next pass.
            break;
        }
        line += 1;
        lines += 1;
        consumed += read as u64;
        if trim(&buffer).is_empty() {
            continue;
        }
        match parsed {
            Ok(value @ serde_json::Value::Object(_)) => record(line, value),
            Ok(_) => issues.push(LineIssue {
                line,
                reason: String::from("not a JSON object"),
            }),
            Err(error) => issues.push(LineIssue {
                line,
                reason: format!("malformed JSON: {error}"),
            }),
        }
    }
    Ok((lines, consumed))
}

fn trim(bytes: &[u8]) -> &[u8] {
    let end = bytes
        .iter()
        .rposition(|b| !b.is_ascii_whitespace())
        .map_or(0, |i| i + 1);
    let start = bytes[..end]
        .iter()
        .position(|b| !b.is_ascii_whitespace())
        .unwrap_or(end);
    &bytes[start..end]
}

fn digest(values: &[&str]) -> String {
    let mut hasher = Sha256::new();
    for value in values {
        hasher.update(value.as_bytes());
        hasher.update([0]);
    }
    hex::encode(hasher.finalize())
}

/// Cuts `text` to [`MAX_TEXT_BYTES`] on a character boundary, marking the cut.
pub(crate) fn bounded(text: &str) -> String {
    if text.len() <= MAX_TEXT_BYTES {
        return text.to_owned();
    }
    let mut end = MAX_TEXT_BYTES;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!(
        "{}\n[… {} bytes cut by import]",
        &text[..end],
        text.len() - end
    )
}

/// ISO-8601 timestamp to Unix milliseconds.
pub(crate) fn timestamp_ms(value: Option<&serde_json::Value>) -> Option<i64> {
    let text = value?.as_str()?;
    let parsed =
        time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339).ok()?;
    i64::try_from(parsed.unix_timestamp_nanos() / 1_000_000).ok()
}

/// Builds the messages of one session: user prompts and assistant turns.
#[derive(Debug, Default)]
pub(crate) struct TurnBuilder {
    pub(crate) messages: Vec<ImportedMessage>,
    turn: Option<OpenTurn>,
    /// Injected user records seen while a turn was open, emitted after it.
    deferred: Vec<ImportedMessage>,
}

#[derive(Debug)]
struct OpenTurn {
    key: String,
    line: u64,
    created_at: Option<i64>,
    parts: Vec<Part>,
    failed: bool,
    splits: u32,
}

impl TurnBuilder {
    /// Adds an assistant part read at `line`, opening a turn keyed by `key` when none is open.
    pub(crate) fn assistant_part(
        &mut self,
        key: &str,
        line: u64,
        created_at: Option<i64>,
        part: Part,
    ) {
        let turn = self.turn.get_or_insert_with(|| OpenTurn {
            key: key.to_owned(),
            line,
            created_at,
            parts: Vec::new(),
            failed: false,
            splits: 0,
        });
        if turn.parts.len() >= MAX_PARTS_PER_MESSAGE {
            // A very long turn is stored as several assistant messages.
            let splits = turn.splits + 1;
            let key = format!("{}#{}", turn.key, splits);
            self.close(MessageStatus::Completed);
            self.turn = Some(OpenTurn {
                key,
                line,
                created_at,
                parts: Vec::new(),
                failed: false,
                splits,
            });
        }
        if let Some(turn) = self.turn.as_mut() {
            turn.parts.push(part);
        }
    }

    /// Marks the open turn failed (an API error or an abort), keeping it open for its parts.
    pub(crate) fn fail_turn(&mut self) {
        if let Some(turn) = self.turn.as_mut() {
            turn.failed = true;
        }
    }

    /// Records a tool result on the open turn's call with `call_id`. Returns false when no
    /// such call is open.
    pub(crate) fn tool_result(
        &mut self,
        call_id: &str,
        output: String,
        is_error: bool,
        external: bool,
    ) -> bool {
        let Some(turn) = self.turn.as_mut() else {
            return false;
        };
        for part in turn.parts.iter_mut().rev() {
            if let Part::ToolCall {
                call_id: Some(id),
                result,
                status,
                external_context,
                ..
            } = part
                && id == call_id
            {
                *result = Some(bounded(&output));
                *status = if is_error {
                    ToolStatus::Error
                } else {
                    ToolStatus::Completed
                };
                *external_context = external && !is_error;
                return true;
            }
        }
        false
    }

    /// Closes the open turn (a pending tool call makes it `pending_tools`).
    pub(crate) fn close(&mut self, status: MessageStatus) {
        if let Some(turn) = self.turn.take()
            && !turn.parts.is_empty()
        {
            let pending = turn.parts.iter().any(|part| {
                matches!(
                    part,
                    Part::ToolCall {
                        status: ToolStatus::Pending,
                        ..
                    }
                )
            });
            let status = if turn.failed {
                MessageStatus::Failed
            } else if pending && status == MessageStatus::Completed {
                MessageStatus::PendingTools
            } else {
                status
            };
            self.messages.push(ImportedMessage {
                key: turn.key,
                line: turn.line,
                role: Role::Assistant,
                status,
                parts: turn.parts,
                created_at: turn.created_at,
            });
        }
        self.messages.append(&mut self.deferred);
    }

    /// Adds a user message read at `line`; a real prompt closes the open turn first, an
    /// injected one waits for the turn to end.
    pub(crate) fn user(
        &mut self,
        key: &str,
        line: u64,
        created_at: Option<i64>,
        text: &str,
        injected: bool,
    ) {
        let message = ImportedMessage {
            key: key.to_owned(),
            line,
            role: Role::User,
            status: MessageStatus::Completed,
            parts: vec![Part::Text {
                text: bounded(text),
                injected,
            }],
            created_at,
        };
        if injected && self.turn.is_some() {
            self.deferred.push(message);
            return;
        }
        self.close(MessageStatus::Completed);
        self.messages.push(message);
    }

    pub(crate) fn finish(mut self) -> Vec<ImportedMessage> {
        self.close(MessageStatus::Completed);
        self.messages
    }
}

/// Text of the first line of a prompt, bounded, as a session title.
pub(crate) fn title_from(text: &str) -> Option<String> {
    let line = text.lines().find(|line| !line.trim().is_empty())?.trim();
    let mut title: String = line.chars().take(80).collect();
    if line.chars().count() > 80 {
        title.push('…');
    }
    Some(title)
}

/// Parses a transcript of `host` from `reader` starting at `start`.
pub fn parse(host: Host, reader: impl BufRead, start: Position) -> std::io::Result<Parsed> {
    match host {
        Host::ClaudeCode => claude_code::parse(reader, start),
        Host::Codex => codex::parse(reader, start),
        Host::Aider => aider::parse(reader, start),
    }
}

impl TurnBuilder {
    /// The tool name of the open turn's call with `call_id`.
    pub(crate) fn tool_name(&self, call_id: &str) -> Option<&str> {
        self.turn
            .as_ref()?
            .parts
            .iter()
            .find_map(|part| match part {
                Part::ToolCall {
                    call_id: Some(id),
                    tool_name,
                    ..
                } if id == call_id => Some(tool_name.as_str()),
                _ => None,
            })
    }
}

/// The project an agent working directory belongs to: a readable slug of its last component
/// plus a digest of the whole path, so two checkouts named alike stay apart. Returns the id
/// and a display name.
pub fn project_for_cwd(cwd: &str) -> (String, String) {
    let trimmed = cwd.trim_end_matches(['/', '\\']);
    let last = trimmed
        .rsplit(['/', '\\'])
        .next()
        .filter(|part| !part.is_empty())
        .unwrap_or("project");
    let slug: String = last
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
        .take(48)
        .collect();
    let slug = slug.trim_start_matches(|c: char| !c.is_ascii_alphanumeric());
    let slug = if slug.is_empty() { "project" } else { slug };
    let name: String = last.chars().take(100).collect();
    (format!("{slug}-{}", &digest(&[trimmed])[..8]), name)
}
