//! Aider chat histories (`.aider.chat.history.md`, which aider appends to in the directory it
//! runs in). The file is Markdown written as the chat goes:
//!
//! - `# aider chat started at YYYY-MM-DD HH:MM:SS` starts a session; one file holds every run.
//! - What was typed is logged as `#### <line>` with two trailing spaces on every line, so
//!   consecutive such lines are one input (`####   ` is an empty line inside it). Not every input
//!   is a human prompt: in-chat commands (`/add`, `/undo`, `!cmd`, …), confirm answers aider logs
//!   the same way (`… (Y)es/(N)o … [Yes]: skip`), `<blank>`, and in architect mode the
//!   architect's own text handed to the editor model (the input right after `Edit the files? …
//!   y`, or, when aider accepts the plan by itself, an input repeating the reply word for word).
//! - `> ` lines are aider's own output. One output record ends with two spaces; its later lines
//!   may lack the `> ` (older aider prefixed only the first), so lines that follow a record
//!   directly, or before its closing two spaces, belong to it.
//! - Everything else is the model's reply.
//!
//! Mapping: a human prompt is a user message; everything after it up to the next prompt is one
//! assistant turn. Reply text becomes text parts; each block of output becomes a tool part
//! (`aider_edit`, `aider_lint`, `aider_test`, `aider_shell`, `aider_output`; a block is split
//! where a lint run or a shell/test command starts) with a status where the output shows one:
//! lint errors, a failed test run, an edit the model got wrong, an unknown command, an API error
//! are `error`; applied edits and commits `completed`. A command is an `aider_command` tool part
//! of the turn it follows, with aider's answer as its result, so `/undo` stays next to the change
//! it undoes and no command is ever user text. The architect's hand-off is an `aider_editor` tool
//! part. What precedes a session's first prompt (startup banner, early commands) is one
//! assistant message whose parts are all `injected`: host output, never a learning source. In
//! watch mode an `AI!` comment, not an input, asks for a turn (`Processing your request...`).
//!
//! A user interrupt (`^C`) while the model is replying ends the turn `failed`, as an interrupted
//! Claude Code turn does, and so does a model API error no reply followed. A `^C` after the reply
//! (stopping a shell command aider ran, or at the idle prompt) stays in the output only.
//!
//! Message keys are line numbers and a session's reference is its header's timestamp and line,
//! so re-reading the append-only file yields the same ids; [`locate`] scopes them to the file.
//! Aider writes the header's local time without a zone: it is stored as if it were UTC.

use std::io::BufRead;
use std::path::Path;
use std::sync::LazyLock;

use regex::Regex;
use serde_json::{Map, Value, json};

use super::{
    Host, ImportedSession, LineIssue, Parsed, Position, TurnBuilder, bounded, digest, title_from,
};
use crate::transcript::{MessageStatus, Part, ToolStatus};

const HEADER: &str = "# aider chat started at ";
/// Files or commits named in an edit part's arguments (all of them stay in its result).
const MAX_LISTED: usize = 100;

static CONFIRM_ANSWER: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"\(Y\)es/\(N\)o.*\[(?:Yes|No)\]: *(\S*)$").expect("valid pattern")
});
static COMMIT: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^Commit ([0-9a-f]{7,40})\b").expect("valid pattern"));
static EDIT_BLOCK_FAILED: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^# \d+ SEARCH/REPLACE blocks? failed to match").expect("valid pattern")
});
static SHELL_CONFIRM: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^Run shell commands?\?").expect("valid pattern"));
static API_ERROR: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^litellm\.[A-Za-z]*(?:Error|Exception)").expect("valid pattern"));
static OUTPUT_ADDED: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^Added \d+ lines? of output to the chat").expect("valid pattern")
});
static ARCHITECT: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^(?:Main model|Model): .* with architect edit format").expect("valid pattern")
});

/// Parses an Aider chat history from `reader`. Histories are read from their start (a session
/// is named by its header line), so `start` is normally the default position.
pub fn parse(reader: impl BufRead, start: Position) -> std::io::Result<Parsed> {
    let mut issues = Vec::new();
    let (lines, consumed) = read_lines(reader, start, &mut issues)?;
    let events = tokenize(&lines);
    let mut sessions = Vec::new();
    let mut current: Option<SessionBuilder> = None;
    let mut headers = 0usize;
    // What comes before the first session header: reported unless the whole file is refused.
    let mut stray: Vec<LineIssue> = Vec::new();
    let mut stray_text = false;
    for event in events {
        if let Event::Header { line, stamp } = &event {
            headers += 1;
            if let Some(done) = current.take().and_then(SessionBuilder::finish) {
                sessions.push(done);
            }
            current = Some(SessionBuilder::new(*line, stamp));
            continue;
        }
        let Some(session) = current.as_mut() else {
            match &event {
                Event::Input { line, .. } => stray.push(LineIssue {
                    line: *line,
                    reason: String::from(
                        "input before any `# aider chat started at` line: its session is unknown",
                    ),
                }),
                // One note for the text and output before the first header, not one per block.
                Event::Output { line, .. } | Event::Text { line, .. } if !stray_text => {
                    stray_text = true;
                    stray.push(LineIssue {
                        line: *line,
                        reason: String::from(
                            "text before any `# aider chat started at` line: its session is unknown",
                        ),
                    });
                }
                _ => {}
            }
            continue;
        };
        session.event(event);
    }
    if let Some(done) = current.take().and_then(SessionBuilder::finish) {
        sessions.push(done);
    }
    let unrecognized = (headers == 0 && start.offset == 0)
        .then(|| lines.iter().find(|line| !line.text.trim().is_empty()))
        .flatten()
        .map(|line| LineIssue {
            line: line.number,
            reason: String::from("not an Aider chat history: no `# aider chat started at …` line"),
        });
    if unrecognized.is_none() {
        issues.append(&mut stray);
    }
    issues.sort_by_key(|issue| issue.line);
    Ok(Parsed {
        sessions,
        issues,
        lines: lines.len() as u64,
        consumed_bytes: consumed,
        unrecognized,
        chain: super::ChainEnds::default(),
    })
}

/// Scopes the sessions of `parsed`, read from `history_file`, to that file: each session
/// reference gains a digest of the file's canonical path, so two histories with a run started
/// in the same second at the same line stay apart, and the working directory becomes the file's
/// directory, where aider ran.
pub fn locate(parsed: &mut Parsed, history_file: &Path) {
    let path = std::fs::canonicalize(history_file)
        .or_else(|_| std::path::absolute(history_file))
        .unwrap_or_else(|_| history_file.to_path_buf());
    let scope = digest(&[&path.to_string_lossy()]);
    let dir = path
        .parent()
        .map(|parent| parent.to_string_lossy().into_owned());
    for session in &mut parsed.sessions {
        session.external_ref = format!("{}/{}", &scope[..12], session.external_ref);
        session.cwd.clone_from(&dir);
    }
}

struct RawLine {
    number: u64,
    text: String,
}

/// Every line of the file (without its line break). Undecodable bytes are dropped from their
/// line, which is noted as an issue; the rest of the line is kept so the structure survives.
fn read_lines(
    mut reader: impl BufRead,
    start: Position,
    issues: &mut Vec<LineIssue>,
) -> std::io::Result<(Vec<RawLine>, u64)> {
    let mut buffer = Vec::new();
    let mut lines = Vec::new();
    let mut consumed = 0u64;
    let mut number = start.line;
    loop {
        buffer.clear();
        let read = reader.read_until(b'\n', &mut buffer)?;
        if read == 0 {
            break;
        }
        consumed += read as u64;
        number += 1;
        let mut bytes = buffer.as_slice();
        if let Some(rest) = bytes.strip_suffix(b"\n") {
            bytes = rest;
        }
        if let Some(rest) = bytes.strip_suffix(b"\r") {
            bytes = rest;
        }
        if number == 1
            && let Some(rest) = bytes.strip_prefix("\u{feff}".as_bytes())
        {
            bytes = rest;
        }
        let text = match std::str::from_utf8(bytes) {
            Ok(text) => text.to_owned(),
            Err(_) => {
                issues.push(LineIssue {
                    line: number,
                    reason: String::from("undecodable bytes (invalid UTF-8)"),
                });
                bytes.utf8_chunks().map(|chunk| chunk.valid()).collect()
            }
        };
        lines.push(RawLine { number, text });
    }
    Ok((lines, consumed))
}

/// What one line of a history is.
enum LineKind<'a> {
    Header(&'a str),
    /// A logged input line, without `#### ` and the trailing two spaces.
    Input(&'a str),
    /// An output line, without `> `; `closed` when it ends its record (two trailing spaces,
    /// removed from the text).
    Output {
        text: &'a str,
        closed: bool,
    },
    Blank,
    Text,
}

fn classify(line: &str) -> LineKind<'_> {
    if let Some(stamp) = line.strip_prefix(HEADER) {
        return LineKind::Header(stamp.trim());
    }
    let closed = line.ends_with("  ");
    let body = if closed {
        &line[..line.len() - 2]
    } else {
        line
    };
    // Markdown headings in the reply (`#### file.rb`) lack the two spaces every logged input
    // line ends with.
    if closed
        && let Some(rest) = body.strip_prefix("####")
        && (rest.is_empty() || rest.starts_with(' '))
    {
        return LineKind::Input(rest.strip_prefix(' ').unwrap_or(rest));
    }
    // `>>>>>>> REPLACE` and other `>`-runs in the reply are not output.
    if let Some(rest) = body.strip_prefix('>')
        && (rest.is_empty() || rest.starts_with(' '))
    {
        return LineKind::Output {
            text: rest.strip_prefix(' ').unwrap_or(rest),
            closed,
        };
    }
    if line.trim().is_empty() {
        return LineKind::Blank;
    }
    LineKind::Text
}

enum Event {
    Header { line: u64, stamp: String },
    Input { line: u64, lines: Vec<String> },
    Output { line: u64, text: String },
    Text { line: u64, text: String },
}

fn tokenize(lines: &[RawLine]) -> Vec<Event> {
    let mut events = Vec::new();
    let mut index = 0;
    let mut text_start: Option<usize> = None;
    while index < lines.len() {
        let kind = classify(&lines[index].text);
        if !matches!(kind, LineKind::Blank | LineKind::Text)
            && let Some(text) = text_event(lines, text_start.take(), index)
        {
            events.push(text);
        }
        match kind {
            LineKind::Header(stamp) => {
                events.push(Event::Header {
                    line: lines[index].number,
                    stamp: stamp.to_owned(),
                });
                index += 1;
            }
            LineKind::Input(_) => {
                let line = lines[index].number;
                let mut input = Vec::new();
                while let Some(LineKind::Input(text)) = lines.get(index).map(|l| classify(&l.text))
                {
                    input.push(text.to_owned());
                    index += 1;
                }
                events.push(Event::Input { line, lines: input });
            }
            LineKind::Output { text, closed } => {
                let (record, next) = output_record(lines, index, text, closed);
                events.push(Event::Output {
                    line: lines[index].number,
                    text: record,
                });
                index = next;
            }
            LineKind::Blank | LineKind::Text => {
                text_start.get_or_insert(index);
                index += 1;
            }
        }
    }
    events.extend(text_event(lines, text_start.take(), lines.len()));
    events
}

/// The user-visible text of `lines[from..to]` without its blank edges; `None` when there is
/// no such run or it is blank.
fn text_event(lines: &[RawLine], from: Option<usize>, to: usize) -> Option<Event> {
    let block = &lines[from?..to];
    let first = block.iter().position(|l| !l.text.trim().is_empty())?;
    let last = block
        .iter()
        .rposition(|l| !l.text.trim().is_empty())
        .unwrap_or(first);
    let text = block[first..=last]
        .iter()
        .map(|l| l.text.as_str())
        .collect::<Vec<_>>()
        .join("\n");
    Some(Event::Text {
        line: block[first].number,
        text,
    })
}

/// The output record starting at `lines[start]` (whose first text is `text`), and the index
/// after it. The rest of a record: lines right after it (aider's console pads some with
/// spaces, so only an empty line separates), and, while its closing two spaces are still
/// missing, lines after empty ones.
fn output_record(lines: &[RawLine], start: usize, text: &str, closed: bool) -> (String, usize) {
    let mut record = text.to_owned();
    let mut closed = closed;
    let mut blanks = 0;
    let mut index = start + 1;
    while let Some(next) = lines.get(index) {
        match classify(&next.text) {
            LineKind::Text | LineKind::Blank if !next.text.is_empty() => {
                for _ in 0..blanks {
                    record.push('\n');
                }
                blanks = 0;
                closed = next.text.ends_with("  ");
                record.push('\n');
                record.push_str(if closed {
                    &next.text[..next.text.len() - 2]
                } else {
                    &next.text
                });
                index += 1;
            }
            LineKind::Blank if !closed => {
                blanks += 1;
                index += 1;
            }
            _ => break,
        }
    }
    (record, index)
}

/// The kind of tool part an output section becomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SectionKind {
    Output,
    Edit,
    Lint,
    Test,
    Shell,
    Command,
}

/// Consecutive output records that become one tool part.
struct Section {
    line: u64,
    kind: SectionKind,
    command: Option<String>,
    records: Vec<(u64, String)>,
    /// The records that name the shell or test command (before its confirm question).
    subject: Vec<String>,
    run: Option<bool>,
    /// A lint or test section has asked its closing question: what follows is new.
    ended: bool,
}

impl Section {
    fn new(line: u64, kind: SectionKind) -> Section {
        Section {
            line,
            kind,
            command: None,
            records: Vec::new(),
            subject: Vec::new(),
            run: None,
            ended: false,
        }
    }

    fn into_part(self, injected: bool) -> Part {
        let failed = self.records.iter().any(|(_, record)| is_failure(record));
        let text = self
            .records
            .iter()
            .map(|(_, record)| record.as_str())
            .collect::<Vec<_>>()
            .join("\n");
        let text = text.trim_matches('\n');
        let mut arguments = Map::new();
        let tool_name = match self.kind {
            SectionKind::Command => {
                arguments.insert(
                    String::from("command"),
                    Value::String(bounded(self.command.as_deref().unwrap_or(""))),
                );
                "aider_command"
            }
            SectionKind::Edit => {
                let files: Vec<&str> = self
                    .records
                    .iter()
                    .filter_map(|(_, record)| record.strip_prefix("Applied edit to "))
                    .map(str::trim)
                    .take(MAX_LISTED)
                    .collect();
                let commits: Vec<&str> = self
                    .records
                    .iter()
                    .filter_map(|(_, record)| COMMIT.captures(record))
                    .filter_map(|captures| captures.get(1))
                    .map(|sha| sha.as_str())
                    .take(MAX_LISTED)
                    .collect();
                arguments.insert(String::from("files"), json!(files));
                arguments.insert(String::from("commits"), json!(commits));
                "aider_edit"
            }
            SectionKind::Lint => {
                if let Some(command) = self
                    .records
                    .iter()
                    .find_map(|(_, record)| record.strip_prefix("## Running: "))
                {
                    arguments.insert(String::from("command"), Value::String(bounded(command)));
                }
                "aider_lint"
            }
            SectionKind::Test | SectionKind::Shell => {
                arguments.insert(
                    String::from("commands"),
                    Value::String(bounded(&self.subject.join("\n"))),
                );
                if let Some(run) = self.run {
                    arguments.insert(String::from("run"), Value::Bool(run));
                }
                if self.kind == SectionKind::Test {
                    "aider_test"
                } else {
                    "aider_shell"
                }
            }
            SectionKind::Output if injected => "aider_startup",
            SectionKind::Output => "aider_output",
        };
        Part::ToolCall {
            tool_name: tool_name.to_owned(),
            call_id: None,
            arguments: Value::Object(arguments),
            result: (!text.is_empty()).then(|| bounded(text)),
            status: if failed {
                ToolStatus::Error
            } else {
                ToolStatus::Completed
            },
            external_context: false,
            injected,
        }
    }
}

/// A record that shows something failed: a lint or test run that found errors, an edit the
/// model got wrong, an unknown command, an undo that could not be done, a model API error.
fn is_failure(record: &str) -> bool {
    record.starts_with("# Fix any errors below")
        || record.starts_with("Attempt to fix lint errors?")
        || record.starts_with("Attempt to fix test errors?")
        || record.starts_with("The LLM did not conform to the edit format")
        || EDIT_BLOCK_FAILED.is_match(record)
        || record.starts_with("Invalid command:")
        || record.starts_with("Error running command")
        || record.starts_with("Error: ")
        || record.starts_with("Error creating file")
        || record.contains("Cannot undo")
        || record.starts_with("The last commit was not made by aider")
        || record.starts_with("Traceback (most recent call last)")
        || record.ends_with(": file not found error")
        || record.contains(": unable to read:")
        || API_ERROR.is_match(record)
}

fn is_interrupt(record: &str) -> bool {
    record.starts_with("^C again to exit") || record.starts_with("^C KeyboardInterrupt")
}

/// A confirm answered yes after which aider sends the model a new request: fixing lint or test
/// errors, or files and URLs added to the chat (command output added to the chat is not sent).
fn starts_request(record: &str) -> bool {
    confirm_answer(record) == Some(true)
        && (record.starts_with("Attempt to fix")
            || (record.contains(" to the chat?") && !record.contains("output")))
}

fn is_undo_hint(record: &str) -> bool {
    record.starts_with("You can use /undo to undo")
}

fn is_edit(record: &str) -> bool {
    record.starts_with("Applied edit to ")
        || COMMIT.is_match(record)
        || (record.starts_with("Committing ") && record.contains("before applying edits"))
        || record.starts_with("The LLM did not conform to the edit format")
        || EDIT_BLOCK_FAILED.is_match(record)
        || record.starts_with("Did not apply edit to ")
        || record.starts_with("Skipping edits to ")
}

/// Records aider prints about its own work (as opposed to the shell or test command it is
/// about to ask for, or the output of one).
fn is_aider_message(record: &str) -> bool {
    record.trim().is_empty()
        || is_edit(record)
        || is_undo_hint(record)
        || is_interrupt(record)
        || record.starts_with("Tokens: ")
        || record.contains("(Y)es/(N)o")
        || record.starts_with("Running ")
        || OUTPUT_ADDED.is_match(record)
}

/// The answer logged after a confirm question: `Some(true)` for yes/all, `Some(false)` for
/// no/skip/don't ask, `None` when no answer is visible.
fn confirm_answer(record: &str) -> Option<bool> {
    let answer = CONFIRM_ANSWER.captures(record)?.get(1)?.as_str();
    let answer = answer.to_ascii_lowercase();
    if answer.is_empty() {
        return None;
    }
    Some(answer.starts_with('y') || answer.starts_with('a'))
}

struct SessionBuilder {
    line: u64,
    stamp: String,
    created_at: Option<i64>,
    architect: bool,
    turns: TurnBuilder,
    title: Option<String>,
    /// A human prompt was seen: from now on output belongs to turns, not to the startup.
    prompted: bool,
    /// Anything beyond the startup banner: a prompt, a command or reply text.
    meaningful: bool,
    section: Option<Section>,
    /// `Edit the files? … y` was answered: the next input is the architect's hand-off.
    expect_hand_off: bool,
    /// The latest reply text of the open turn (an architect hand-off repeats it).
    reply: Option<String>,
    /// A model request is under way: from a prompt (or a request aider makes by itself) to
    /// its token report. An interrupt then cuts the reply; after it, aider's own steps or an idle
    /// prompt are what the user stopped.
    replying: bool,
    interrupted: bool,
    /// A model API error that no reply text followed yet.
    unanswered_error: bool,
}

impl SessionBuilder {
    fn new(line: u64, stamp: &str) -> SessionBuilder {
        SessionBuilder {
            line,
            stamp: stamp.to_owned(),
            created_at: started_at(stamp),
            architect: false,
            turns: TurnBuilder::default(),
            title: None,
            prompted: false,
            meaningful: false,
            section: None,
            expect_hand_off: false,
            reply: None,
            replying: false,
            interrupted: false,
            unanswered_error: false,
        }
    }

    fn event(&mut self, event: Event) {
        match event {
            Event::Header { .. } => {}
            Event::Output { line, text } => self.output(line, text),
            Event::Text { line, text } => {
                self.flush();
                self.meaningful = true;
                self.expect_hand_off = false;
                self.unanswered_error = false;
                self.replying = true;
                let part = Part::Text {
                    text: bounded(&text),
                    injected: !self.prompted,
                };
                self.turns
                    .assistant_part(&key(line), line, self.created_at, part);
                self.reply = Some(text);
            }
            Event::Input { line, lines } => self.input(line, lines),
        }
    }

    fn input(&mut self, line: u64, lines: Vec<String>) {
        if lines.len() == 1 && lines[0].trim() == "<blank>" {
            return;
        }
        if lines.len() == 1 && CONFIRM_ANSWER.is_match(&lines[0]) {
            // A confirm answer aider logged as input: part of the output it answers.
            self.output(line, lines[0].clone());
            return;
        }
        let first = lines.iter().position(|l| !l.trim().is_empty());
        let last = lines.iter().rposition(|l| !l.trim().is_empty());
        let (Some(first), Some(last)) = (first, last) else {
            return;
        };
        let text = lines[first..=last].join("\n");
        let hand_off = self.expect_hand_off
            || (self.architect
                && self.prompted
                && self
                    .reply
                    .as_deref()
                    .is_some_and(|reply| same_words(reply, &text)));
        self.expect_hand_off = false;
        if hand_off {
            self.flush();
            self.meaningful = true;
            self.replying = true;
            let part = Part::ToolCall {
                tool_name: String::from("aider_editor"),
                call_id: None,
                arguments: json!({ "instructions": bounded(&text) }),
                result: None,
                status: ToolStatus::Completed,
                external_context: false,
                injected: !self.prompted,
            };
            self.turns
                .assistant_part(&key(line), line, self.created_at, part);
            return;
        }
        let command = text.trim_start();
        if command.starts_with('/') || command.starts_with('!') {
            self.flush();
            self.meaningful = true;
            let mut section = Section::new(line, SectionKind::Command);
            section.command = Some(command.to_owned());
            self.section = Some(section);
            return;
        }
        self.flush();
        self.close_flags();
        self.turns
            .user(&key(line), line, self.created_at, &text, false);
        if self.title.is_none() {
            self.title = title_from(&text);
        }
        self.prompted = true;
        self.meaningful = true;
        self.reply = None;
        self.replying = true;
    }

    fn output(&mut self, line: u64, record: String) {
        if ARCHITECT.is_match(&record) {
            self.architect = true;
        }
        if record.starts_with("Processing your request") {
            // Watch mode: an `AI!` comment in a source file asked for this turn, no input did.
            self.flush();
            self.close_flags();
            self.turns.close(MessageStatus::Completed);
            self.prompted = true;
            self.meaningful = true;
            self.reply = None;
            self.replying = true;
        }
        let in_command = self
            .section
            .as_ref()
            .is_some_and(|section| section.kind == SectionKind::Command);
        if self.prompted && !in_command {
            if is_interrupt(&record) && self.replying {
                self.interrupted = true;
            }
            if API_ERROR.is_match(&record) {
                self.unanswered_error = true;
            }
            if record.starts_with("Tokens: ") {
                self.replying = false;
            } else if starts_request(&record) {
                self.replying = true;
            }
        }
        if is_interrupt(&record) {
            self.expect_hand_off = false;
        } else if record.starts_with("Edit the files?") {
            self.expect_hand_off = confirm_answer(&record) == Some(true);
        }
        if in_command {
            if let Some(section) = self.section.as_mut() {
                section.records.push((line, record));
            }
            return;
        }
        self.section_record(line, record);
    }

    /// Adds an output record to the open section, starting a new one where the record begins
    /// a different piece of work (a lint run, a shell or test command, an edit after those).
    fn section_record(&mut self, line: u64, record: String) {
        if record.starts_with("# Fix any errors below") {
            self.flush();
            let mut section = Section::new(line, SectionKind::Lint);
            section.records.push((line, record));
            self.section = Some(section);
            return;
        }
        let question = if SHELL_CONFIRM.is_match(&record) {
            Some(SectionKind::Shell)
        } else if record.starts_with("Attempt to fix test errors?") {
            Some(SectionKind::Test)
        } else {
            None
        };
        if let Some(kind) = question {
            // The command it asks about was printed just before: move it along.
            let mut subject = Vec::new();
            if let Some(section) = self.section.as_mut() {
                let keep = section
                    .records
                    .iter()
                    .rposition(|(_, r)| is_aider_message(r))
                    .map_or(0, |i| i + 1);
                subject = section.records.split_off(keep);
                if section.records.is_empty() {
                    self.section = None;
                }
            }
            self.flush();
            let start = subject.first().map_or(line, |(l, _)| *l);
            let mut section = Section::new(start, kind);
            section.subject = subject.iter().map(|(_, r)| r.clone()).collect();
            section.records = subject;
            section.run = confirm_answer(&record);
            section.ended = kind == SectionKind::Test;
            section.records.push((line, record));
            self.section = Some(section);
            return;
        }
        let starts_new = match &self.section {
            None => true,
            Some(section) => match section.kind {
                SectionKind::Lint | SectionKind::Test => {
                    section.ended || is_edit(&record) || record.starts_with("Tokens: ")
                }
                SectionKind::Shell => is_edit(&record) || record.starts_with("Tokens: "),
                _ => false,
            },
        };
        if starts_new {
            self.flush();
            self.section = Some(Section::new(line, SectionKind::Output));
        }
        if let Some(section) = self.section.as_mut() {
            if section.kind == SectionKind::Output && is_edit(&record) {
                section.kind = SectionKind::Edit;
            }
            if section.kind == SectionKind::Lint
                && record.starts_with("Attempt to fix lint errors?")
            {
                section.ended = true;
            }
            section.records.push((line, record));
        }
    }

    /// Turns the open section into a tool part of the open turn (or of the startup).
    fn flush(&mut self) {
        let Some(section) = self.section.take() else {
            return;
        };
        if section.records.is_empty() && section.kind != SectionKind::Command {
            return;
        }
        let line = section.line;
        let part = section.into_part(!self.prompted);
        self.turns
            .assistant_part(&key(line), line, self.created_at, part);
    }

    /// Applies what the open turn showed (an interrupt, an unanswered API error) before it
    /// closes.
    fn close_flags(&mut self) {
        if self.prompted && (self.interrupted || self.unanswered_error) {
            self.turns.fail_turn();
        }
        self.interrupted = false;
        self.unanswered_error = false;
    }

    fn finish(mut self) -> Option<ImportedSession> {
        self.flush();
        self.close_flags();
        if !self.meaningful {
            // Aider started and stopped without anything typed: only its banner.
            return None;
        }
        let external_ref = format!("{}-L{}", self.stamp_ref(), self.line);
        let messages = self.turns.finish();
        Some(ImportedSession {
            host: Host::Aider,
            external_ref,
            parent_ref: None,
            cwd: None,
            title: self.title,
            messages,
        })
    }

    /// The header's time as `2025-01-29T193332`: readable, and plain enough for an id.
    fn stamp_ref(&self) -> String {
        let stamp: String = self
            .stamp
            .chars()
            .map(|c| if c == ' ' { 'T' } else { c })
            .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.'))
            .take(40)
            .collect();
        if stamp.is_empty() {
            String::from("session")
        } else {
            stamp
        }
    }
}

fn key(line: u64) -> String {
    format!("L{line}")
}

/// The header's local time as if it were UTC (aider writes no zone), in Unix milliseconds.
fn started_at(stamp: &str) -> Option<i64> {
    let format = time::macros::format_description!("[year]-[month]-[day] [hour]:[minute]:[second]");
    let parsed = time::PrimitiveDateTime::parse(stamp, format).ok()?;
    i64::try_from(parsed.assume_utc().unix_timestamp_nanos() / 1_000_000).ok()
}

/// The same words in the same order, whatever the spacing.
fn same_words(a: &str, b: &str) -> bool {
    a.split_whitespace().eq(b.split_whitespace())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transcript::Role;
    use crate::transcript::import::ImportedMessage;

    /// A history as aider writes it: every `####` and `>` line gets its two trailing spaces,
    /// except a line ending in `¶`, which is written without them (an output record that goes
    /// on below, or a reply line that merely starts like one).
    fn history(lines: &[&str]) -> String {
        let mut text = String::new();
        for line in lines {
            if let Some(open) = line.strip_suffix('¶') {
                text.push_str(open);
            } else if line.starts_with("####") || line.starts_with('>') {
                text.push_str(line);
                text.push_str("  ");
            } else {
                text.push_str(line);
            }
            text.push('\n');
        }
        text
    }

    fn parse_bytes(bytes: &[u8]) -> Parsed {
        parse(std::io::Cursor::new(bytes.to_vec()), Position::default()).unwrap()
    }

    fn parse_lines(lines: &[&str]) -> Parsed {
        parse_bytes(history(lines).as_bytes())
    }

    fn tools(message: &ImportedMessage) -> Vec<(&str, ToolStatus)> {
        message
            .parts
            .iter()
            .filter_map(|part| match part {
                Part::ToolCall {
                    tool_name, status, ..
                } => Some((tool_name.as_str(), *status)),
                _ => None,
            })
            .collect()
    }

    fn tool<'a>(message: &'a ImportedMessage, name: &str, nth: usize) -> &'a Part {
        message
            .parts
            .iter()
            .filter(|part| matches!(part, Part::ToolCall { tool_name, .. } if tool_name == name))
            .nth(nth)
            .unwrap_or_else(|| panic!("no {name} #{nth} in {:?}", message.parts))
    }

    fn result(part: &Part) -> Option<&str> {
        match part {
            Part::ToolCall { result, .. } => result.as_deref(),
            _ => None,
        }
    }

    fn arguments(part: &Part) -> &Value {
        match part {
            Part::ToolCall { arguments, .. } => arguments,
            _ => panic!("not a tool part: {part:?}"),
        }
    }

    fn prompts(session: &ImportedSession) -> Vec<(u64, &str)> {
        session
            .messages
            .iter()
            .filter(|m| m.role == Role::User)
            .map(|m| (m.line, m.parts[0].text().unwrap_or("")))
            .collect()
    }

    fn shape(session: &ImportedSession) -> Vec<(Role, u64, MessageStatus)> {
        session
            .messages
            .iter()
            .map(|m| (m.role, m.line, m.status))
            .collect()
    }

    #[test]
    fn prompts_are_told_apart_from_commands_confirm_answers_and_blank_inputs() {
        let parsed = parse_lines(&[
            "",
            "# aider chat started at 2025-01-29 19:33:32",
            "",
            "> /usr/bin/aider --model sonnet",
            "> Aider v0.72.3",
            "",
            "#### /add src/app.py",
            "> Added src/app.py to the chat",
            "",
            "#### Use pnpm, not npm, in this repo.",
            "#### ",
            "#### The lockfile is pnpm-lock.yaml.",
            "> https://pnpm.io/",
            "> Add URL to the chat? (Y)es/(N)o/(A)ll/(S)kip all [Yes]: s",
            "",
            "#### Add URL to the chat? (Y)es/(N)o/(A)ll/(S)kip all [Yes]: skip",
            "> Add URL to the chat? (Y)es/(N)o/(A)ll/(S)kip all [Yes]: s",
            "",
            "Switching the scripts to pnpm.",
            "",
            "> Tokens: 2.5k sent, 312 received.",
            "> Applied edit to package.json",
            "> Commit 1c0a157 build: use pnpm",
            "> You can use /undo to undo and discard each aider commit.",
            "",
            "#### /undo",
            "> Removed: 1c0a157 build: use pnpm",
            "> Now at:  adc41a3 init",
            "",
            "#### <blank>",
            "",
            "#### !ls src",
            "> app.py",
            "",
            "#### /ask why pnpm?",
            "",
            "#### why pnpm?",
            "",
            "Because the repository has a pnpm lockfile.",
            "",
            "> Tokens: 3.0k sent, 20 received.",
        ]);
        assert!(parsed.issues.is_empty(), "{:?}", parsed.issues);
        assert_eq!(parsed.unrecognized, None);
        assert_eq!(parsed.sessions.len(), 1);
        let session = &parsed.sessions[0];
        assert_eq!(session.host, Host::Aider);
        assert_eq!(session.external_ref, "2025-01-29T193332-L2");
        assert_eq!(
            session.title.as_deref(),
            Some("Use pnpm, not npm, in this repo.")
        );
        assert_eq!(
            prompts(session),
            vec![
                (
                    10,
                    "Use pnpm, not npm, in this repo.\n\nThe lockfile is pnpm-lock.yaml."
                ),
                (37, "why pnpm?"),
            ],
            "commands, confirm answers and <blank> are not prompts"
        );
        assert_eq!(
            shape(session),
            vec![
                (Role::Assistant, 4, MessageStatus::Completed),
                (Role::User, 10, MessageStatus::Completed),
                (Role::Assistant, 13, MessageStatus::Completed),
                (Role::User, 37, MessageStatus::Completed),
                (Role::Assistant, 39, MessageStatus::Completed),
            ]
        );
        // The startup and a command typed before the first prompt: host output only.
        let startup = &session.messages[0];
        assert!(startup.parts.iter().all(Part::is_injected));
        assert_eq!(
            tools(startup),
            vec![
                ("aider_startup", ToolStatus::Completed),
                ("aider_command", ToolStatus::Completed)
            ]
        );
        assert_eq!(
            result(&startup.parts[0]),
            Some("/usr/bin/aider --model sonnet\nAider v0.72.3")
        );
        let turn = &session.messages[2];
        assert!(!turn.parts.iter().any(Part::is_injected));
        assert_eq!(
            tools(turn),
            vec![
                ("aider_output", ToolStatus::Completed),
                ("aider_edit", ToolStatus::Completed),
                ("aider_command", ToolStatus::Completed),
                ("aider_command", ToolStatus::Completed),
                ("aider_command", ToolStatus::Completed),
            ]
        );
        assert!(
            result(&turn.parts[0]).is_some_and(|r| r.contains("[Yes]: skip")),
            "the logged confirm answer stays with the output it answers: {:?}",
            turn.parts[0]
        );
        let edit = tool(turn, "aider_edit", 0);
        assert_eq!(
            arguments(edit),
            &json!({"files": ["package.json"], "commits": ["1c0a157"]})
        );
        // `/undo` is kept, next to the change it undoes, with aider's answer.
        let undo = tool(turn, "aider_command", 0);
        assert_eq!(arguments(undo), &json!({"command": "/undo"}));
        assert_eq!(
            result(undo),
            Some("Removed: 1c0a157 build: use pnpm\nNow at:  adc41a3 init")
        );
        assert_eq!(
            arguments(tool(turn, "aider_command", 1)),
            &json!({"command": "!ls src"})
        );
        assert_eq!(result(tool(turn, "aider_command", 2)), None);
        assert_eq!(turn.key, "L13");
    }

    #[test]
    fn output_blocks_split_into_tool_parts_with_the_status_they_show() {
        let parsed = parse_lines(&[
            "# aider chat started at 2025-02-01 10:00:00",
            "#### fix the settings module",
            "",
            "Here is the fix.",
            "",
            "> Tokens: 2.5k sent, 968 received.",
            "> Applied edit to app/urls.py",
            "> ",
            "> # Fix any errors below, if possible.",
            "> ",
            "> ## Running: python -m flake8 --select=F821 app/urls.py",
            "> ",
            "> app/urls.py:14:37: F821 undefined name 'HttpResponse'",
            "> ",
            "> Attempt to fix lint errors? (Y)es/(N)o [Yes]: y",
            "",
            "Adding the import.",
            "",
            "> Tokens: 3.9k sent, 805 received.",
            "> The LLM did not conform to the edit format.",
            "> # 1 SEARCH/REPLACE block failed to match!¶",
            "",
            "## SearchReplaceNoExactMatch: This SEARCH block failed to exactly match lines in app/urls.py",
            "Just reply with fixed versions of the block above that failed to match.  ",
            "",
            "Fixed block.",
            "",
            "> Tokens: 4.1k sent, 100 received.",
            "> Applied edit to app/urls.py",
            "> Commit 2a4c0a5 fix: import HttpResponse",
            "> pip install django¶",
            "python manage.py check  ",
            "> Run shell commands? (Y)es/(N)o [Yes]: y",
            "> Running pip install django",
            "> Running python manage.py check",
            "> Add command output to the chat? (Y)es/(N)o [Yes]: n",
            "> You can use /undo to undo and discard each aider commit.",
        ]);
        assert!(parsed.issues.is_empty(), "{:?}", parsed.issues);
        let session = &parsed.sessions[0];
        let turn = &session.messages[1];
        assert_eq!(turn.status, MessageStatus::Completed);
        assert_eq!(turn.line, 4);
        assert_eq!(
            tools(turn),
            vec![
                ("aider_edit", ToolStatus::Completed),
                ("aider_lint", ToolStatus::Error),
                ("aider_edit", ToolStatus::Error),
                ("aider_edit", ToolStatus::Completed),
                ("aider_shell", ToolStatus::Completed),
            ]
        );
        let texts: Vec<&str> = turn
            .parts
            .iter()
            .filter_map(|p| match p {
                Part::Text { text, .. } => Some(text.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(
            texts,
            ["Here is the fix.", "Adding the import.", "Fixed block."]
        );
        let lint = tool(turn, "aider_lint", 0);
        assert_eq!(
            arguments(lint),
            &json!({"command": "python -m flake8 --select=F821 app/urls.py"})
        );
        assert!(
            result(lint).is_some_and(|r| r.starts_with("# Fix any errors below")
                && r.contains("F821 undefined name")
                && r.ends_with("Attempt to fix lint errors? (Y)es/(N)o [Yes]: y"))
        );
        // A record whose later lines lack `> ` is read up to its closing two spaces.
        let failed_edit = tool(turn, "aider_edit", 1);
        assert!(result(failed_edit).is_some_and(|r| r.ends_with(
            "## SearchReplaceNoExactMatch: This SEARCH block failed to exactly match lines in app/urls.py\nJust reply with fixed versions of the block above that failed to match."
        )));
        let shell = tool(turn, "aider_shell", 0);
        assert_eq!(
            arguments(shell),
            &json!({"commands": "pip install django\npython manage.py check", "run": true})
        );
        assert!(result(shell).is_some_and(|r| r.contains("Running python manage.py check")));
        assert_eq!(
            arguments(tool(turn, "aider_edit", 2)),
            &json!({"files": ["app/urls.py"], "commits": ["2a4c0a5"]})
        );
    }

    #[test]
    fn the_architect_hand_off_to_the_editor_is_assistant_output() {
        let parsed = parse_lines(&[
            "# aider chat started at 2025-01-27 17:58:07",
            "> Model: gemini/gemini-2.0-flash-exp with architect edit format",
            "> Editor model: gemini/gemini-exp-1206 with diff edit format",
            "",
            "#### Why does the stream need auth?",
            "",
            "It does not; drop the credentials from the URL.",
            "",
            "> Tokens: 626 sent, 361 received.",
            "> Edit the files? (Y)es/(N)o [Yes]: n",
            "",
            "#### Then make the change.",
            "",
            "Remove the username and password from RTSP_URL.",
            "",
            "> Tokens: 700 sent, 50 received.",
            "> Edit the files? (Y)es/(N)o [Yes]: y",
            "",
            "#### Remove the username and password from RTSP_URL.",
            "",
            "app.py",
            "",
            "> Tokens: 900 sent, 80 received.",
            "> Applied edit to app.py",
            "> Commit 25a37a1 fix: drop RTSP credentials",
            "",
            "#### Also log the frames.",
            "",
            "Log each frame's shape in on_new_sample.",
            "",
            "> Tokens: 1.0k sent, 40 received.",
            "",
            "#### Log each frame's shape in   on_new_sample.",
            "",
            "Done.",
        ]);
        let session = &parsed.sessions[0];
        assert_eq!(
            prompts(session),
            vec![
                (5, "Why does the stream need auth?"),
                (12, "Then make the change."),
                (27, "Also log the frames."),
            ],
            "after `n` the next input is the human's; after `y`, or repeating the reply, it is the architect's"
        );
        let second = &session.messages[4];
        assert_eq!(
            tools(second),
            vec![
                ("aider_output", ToolStatus::Completed),
                ("aider_editor", ToolStatus::Completed),
                ("aider_edit", ToolStatus::Completed),
            ]
        );
        assert_eq!(
            arguments(tool(second, "aider_editor", 0)),
            &json!({"instructions": "Remove the username and password from RTSP_URL."})
        );
        let third = &session.messages[6];
        assert_eq!(
            tools(third),
            vec![
                ("aider_output", ToolStatus::Completed),
                ("aider_editor", ToolStatus::Completed)
            ]
        );
    }

    #[test]
    fn an_interrupted_reply_or_an_unanswered_api_error_fails_the_turn() {
        let parsed = parse_lines(&[
            "# aider chat started at 2024-10-03 12:00:00",
            "#### explain the crawler",
            "",
            "The crawler starts by",
            "> ",
            "> ",
            "> ^C again to exit",
            "> Tokens: 15k sent, 0 received.",
            "",
            "#### update the README",
            "",
            "Updated the README.",
            "",
            "> Tokens: 12k sent, 1.9k received.",
            "> Applied edit to README.md",
            "> pnpm dev",
            "> Run shell command? (Y)es/(N)o [Yes]: y",
            "> Running pnpm dev",
            "> ",
            "> ",
            "> ^C again to exit",
            "",
            "#### retry again",
            "> litellm.APIError: APIError: OpenrouterException - Error code: 402",
            "> Retrying in 0.2 seconds...",
            "",
            "#### try again",
            "> litellm.RateLimitError: litellm.RateLimitError: VertexAIException - 429",
            "> Retrying in 0.2 seconds...",
            "",
            "Here is the summary.",
            "",
            "> Tokens: 1k sent, 10 received.",
            "",
            "#### one more",
            "",
            "Sure, the",
            "> ",
            "> ",
            "> ^C again to exit",
            "> ",
            "> ",
            "> ^C KeyboardInterrupt",
        ]);
        let session = &parsed.sessions[0];
        let assistant: Vec<(u64, MessageStatus)> = session
            .messages
            .iter()
            .filter(|m| m.role == Role::Assistant)
            .map(|m| (m.line, m.status))
            .collect();
        assert_eq!(
            assistant,
            vec![
                (4, MessageStatus::Failed),
                (12, MessageStatus::Completed),
                (24, MessageStatus::Failed),
                (28, MessageStatus::Completed),
                (37, MessageStatus::Failed),
            ],
            "a ^C during the reply fails it; one that stops a dev server aider ran does not"
        );
        let stopped = tool(&session.messages[3], "aider_shell", 0);
        assert!(result(stopped).is_some_and(|r| r.ends_with("^C again to exit")));
        assert_eq!(
            tools(&session.messages[5]),
            vec![("aider_output", ToolStatus::Error)]
        );
    }

    #[test]
    fn sessions_keep_their_ids_when_more_are_appended() {
        let first = history(&[
            "",
            "# aider chat started at 2025-01-29 19:33:32",
            "> Aider v0.72.3",
            "",
            "#### first prompt",
            "",
            "First answer.",
            "",
            "# aider chat started at 2025-01-29 19:40:00",
            "> Aider v0.72.3",
            "> ^C KeyboardInterrupt",
            "",
            "# aider chat started at 2025-01-29 20:00:00",
            "#### second prompt",
            "",
            "Second answer.",
        ]);
        let appended = history(&[
            "",
            "# aider chat started at 2025-01-30 09:00:00",
            "#### third prompt",
            "",
            "Third answer.",
        ]);
        let before = parse_bytes(first.as_bytes());
        let after = parse_bytes(format!("{first}{appended}").as_bytes());
        let refs = |parsed: &Parsed| -> Vec<String> {
            parsed
                .sessions
                .iter()
                .map(|s| s.external_ref.clone())
                .collect()
        };
        assert_eq!(
            refs(&before),
            ["2025-01-29T193332-L2", "2025-01-29T200000-L13"],
            "a run with nothing but its banner is no session"
        );
        assert_eq!(
            refs(&after),
            [
                "2025-01-29T193332-L2",
                "2025-01-29T200000-L13",
                "2025-01-30T090000-L18"
            ]
        );
        let ids = |parsed: &Parsed| -> Vec<String> {
            parsed
                .sessions
                .iter()
                .flat_map(|s| {
                    let sid = s.session_id();
                    s.messages.iter().map(move |m| m.message_id(&sid))
                })
                .collect()
        };
        let (old, new) = (ids(&before), ids(&after));
        assert_eq!(old.len(), 5);
        assert_eq!(new.len(), 7);
        assert_eq!(new[..5], old[..], "re-reading yields the same ids");
        for session in &after.sessions {
            assert!(
                crate::ids::is_valid_external_id(&session.session_id()),
                "{}",
                session.session_id()
            );
            assert!(session.session_id().starts_with("ad-"));
        }
        assert_eq!(
            after.sessions[2].messages[0].created_at,
            Some(1_738_227_600_000),
            "the header's time"
        );
        assert_eq!(after.consumed_bytes, (first.len() + appended.len()) as u64);
        assert_eq!(after.lines, 21);
    }

    #[test]
    fn locating_scopes_sessions_to_their_file_and_its_directory() {
        let text = history(&["# aider chat started at 2025-01-29 19:33:32", "#### hello"]);
        let mut one = parse_bytes(text.as_bytes());
        let mut two = parse_bytes(text.as_bytes());
        locate(
            &mut one,
            Path::new("/nonexistent/zuno/app/.aider.chat.history.md"),
        );
        locate(
            &mut two,
            Path::new("/nonexistent/zuno/lib/.aider.chat.history.md"),
        );
        assert_eq!(
            one.sessions[0].cwd.as_deref(),
            Some("/nonexistent/zuno/app")
        );
        assert_eq!(
            two.sessions[0].cwd.as_deref(),
            Some("/nonexistent/zuno/lib")
        );
        assert_ne!(
            one.sessions[0].session_id(),
            two.sessions[0].session_id(),
            "the same run time in two files is two sessions"
        );
        assert!(
            one.sessions[0]
                .external_ref
                .ends_with("/2025-01-29T193332-L1")
        );
        assert!(crate::ids::is_valid_external_id(
            &one.sessions[0].session_id()
        ));
    }

    #[test]
    fn malformed_input_is_reported_by_line_and_the_rest_is_read() {
        let mut bytes = history(&[
            "#### a prompt before any header",
            "> stray output",
            "",
            "# aider chat started at 2025-01-29 19:33:32",
        ])
        .into_bytes();
        bytes.extend_from_slice(b"#### fine \xff prompt  \n\nAnswer.\n");
        let parsed = parse_bytes(&bytes);
        let lines: Vec<u64> = parsed.issues.iter().map(|i| i.line).collect();
        assert_eq!(lines, [1, 2, 5], "{:?}", parsed.issues);
        assert!(parsed.issues[2].reason.contains("invalid UTF-8"));
        assert_eq!(parsed.unrecognized, None);
        assert_eq!(prompts(&parsed.sessions[0]), vec![(5, "fine  prompt")]);

        let json = parse_bytes(b"\n{\"type\":\"user\",\"message\":{\"content\":\"hi\"}}\n");
        let unrecognized = json.unrecognized.expect("not an Aider history");
        assert_eq!(unrecognized.line, 2);
        assert!(unrecognized.reason.contains("not an Aider chat history"));
        assert!(json.sessions.is_empty());
        assert!(json.issues.is_empty(), "{:?}", json.issues);

        let empty = parse_bytes(b"");
        assert_eq!(empty.unrecognized, None, "an empty history is a history");
        assert!(empty.sessions.is_empty());
    }

    #[test]
    fn windows_line_breaks_and_a_byte_order_mark_read_the_same() {
        let text = history(&[
            "# aider chat started at 2024-12-19 10:00:00",
            "#### add the dropdown",
            "",
            "Added.",
            "",
            "> Applied edit to app\\page.tsx",
        ]);
        let windows = format!("\u{feff}{}", text.replace('\n', "\r\n"));
        let (unix, windows) = (
            parse_bytes(text.as_bytes()),
            parse_bytes(windows.as_bytes()),
        );
        assert!(windows.issues.is_empty(), "{:?}", windows.issues);
        assert_eq!(windows.sessions, unix.sessions);
        assert_eq!(prompts(&windows.sessions[0]), vec![(2, "add the dropdown")]);
    }

    #[test]
    fn reply_markdown_that_looks_like_input_or_output_stays_reply_text() {
        let parsed = parse_lines(&[
            "# aider chat started at 2024-07-27 23:06:30",
            "#### 请修改 `window_craftlist.rb`",
            "",
            "#### `window_craftlist.rb`¶",
            "",
            "```ruby",
            "<<<<<<< SEARCH",
            "x = 1",
            "=======",
            "x = 2",
            ">>>>>>> REPLACE¶",
            "```",
        ]);
        let session = &parsed.sessions[0];
        assert_eq!(prompts(session), vec![(2, "请修改 `window_craftlist.rb`")]);
        let reply = &session.messages[1];
        assert!(tools(reply).is_empty());
        assert!(reply.parts[0].text().is_some_and(
            |t| t.starts_with("#### `window_craftlist.rb`") && t.contains(">>>>>>> REPLACE")
        ));
    }

    #[test]
    fn watch_mode_requests_are_turns_without_a_prompt() {
        let parsed = parse_lines(&[
            "# aider chat started at 2025-06-02 14:15:20",
            "> Aider v0.84.0",
            "> Processing your request...",
            "",
            "Removing the async keyword.",
            "",
            "> Tokens: 12k sent, 288 received.",
            "> Applied edit to src/union.ts",
            "> Processing your request...",
            "",
            "Refactoring.",
        ]);
        let session = &parsed.sessions[0];
        assert_eq!(
            shape(session),
            vec![
                (Role::Assistant, 2, MessageStatus::Completed),
                (Role::Assistant, 3, MessageStatus::Completed),
                (Role::Assistant, 9, MessageStatus::Completed),
            ]
        );
        assert!(session.messages[0].parts.iter().all(Part::is_injected));
        assert!(!session.messages[1].parts.iter().any(Part::is_injected));
        assert_eq!(
            tools(&session.messages[1]),
            vec![
                ("aider_output", ToolStatus::Completed),
                ("aider_edit", ToolStatus::Completed)
            ]
        );
    }
}
