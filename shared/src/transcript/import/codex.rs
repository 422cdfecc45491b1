//! Codex CLI rollout JSONL (`~/.codex/sessions/YYYY/MM/DD/rollout-*.jsonl`): every line is
//! `{timestamp, type, payload}`. A turn starts at `event_msg/user_message` (the clean human
//! prompt; injected `<environment_context>` user items are not prompts) and ends at the next
//! prompt, `turn_aborted`, `task_complete` or the end of the file. Tool errors are read from
//! `Exit code: N` in `function_call_output` and `metadata.exit_code` in custom-tool outputs.
//! Records have no ids: message keys are line numbers, stable because the file is append-only.

use std::io::BufRead;

use serde_json::Value;

use super::{
    Host, ImportedSession, LineIssue, Parsed, Position, TurnBuilder, bounded, for_each_line,
    timestamp_ms, title_from,
};
use crate::transcript::{MessageStatus, Part, ToolStatus};

/// Parses Codex rollout records from `reader`. A rollout holds one session; a file whose
/// `session_meta` comes before the watermark is identified by `session_hint`
/// (see [`parse_with_session`]).
pub fn parse(reader: impl BufRead, start: Position) -> std::io::Result<Parsed> {
    parse_with_session(reader, start, None)
}

/// As [`parse`], naming the session when its `session_meta` record lies before `start`.
pub fn parse_with_session(
    reader: impl BufRead,
    start: Position,
    session_hint: Option<(String, Option<String>)>,
) -> std::io::Result<Parsed> {
    let mut issues: Vec<LineIssue> = Vec::new();
    let (session_id, cwd) = session_hint.unzip();
    let mut rollout = Rollout {
        session_id,
        cwd: cwd.flatten(),
        ..Rollout::default()
    };
    let (lines, consumed) = for_each_line(reader, start, &mut issues, |line, record| {
        rollout.record(line, &record);
    })?;
    issues.append(&mut rollout.issues);
    issues.sort_by_key(|issue| issue.line);
    let sessions = rollout.into_sessions(start, &mut issues);
    Ok(Parsed {
        sessions,
        issues,
        lines,
        consumed_bytes: consumed,
        unrecognized: None,
        chain: super::ChainEnds::default(),
    })
}

/// What the records of one rollout file add up to, record by record.
#[derive(Default)]
struct Rollout {
    session_id: Option<String>,
    cwd: Option<String>,
    title: Option<String>,
    turns: TurnBuilder,
    /// Problems in individual records (a line that is not JSON is reported by the reader).
    issues: Vec<LineIssue>,
}

/// Where a record sits in the file and when it was written.
struct At<'a> {
    line: u64,
    key: &'a str,
    ms: Option<i64>,
}

impl Rollout {
    fn record(&mut self, line: u64, record: &Value) {
        let key = format!("line-{line}");
        let at = At {
            line,
            key: &key,
            ms: timestamp_ms(record.get("timestamp")),
        };
        let payload = record.get("payload").cloned().unwrap_or(Value::Null);
        let kind = record.get("type").and_then(Value::as_str).unwrap_or("");
        let detail = payload.get("type").and_then(Value::as_str).unwrap_or("");
        match (kind, detail) {
            ("session_meta", _) => self.session_meta(line, &payload),
            ("event_msg", "user_message") => self.user_message(&at, &payload),
            ("event_msg", "turn_aborted") => {
                self.turns.fail_turn();
                self.turns.close(MessageStatus::Failed);
            }
            ("event_msg", "task_complete") => self.turns.close(MessageStatus::Completed),
            ("event_msg", "error") => {
                let text = payload
                    .get("message")
                    .and_then(Value::as_str)
                    .unwrap_or("error");
                self.part(
                    &at,
                    Part::Error {
                        text: bounded(text),
                    },
                );
                self.turns.fail_turn();
            }
            ("response_item", "message") => self.assistant_message(&at, &payload),
            ("response_item", "function_call" | "custom_tool_call" | "local_shell_call") => {
                self.part(&at, tool_call(detail, &payload));
            }
            ("response_item", "function_call_output" | "custom_tool_call_output") => {
                let Some(call_id) = payload.get("call_id").and_then(Value::as_str) else {
                    self.issues.push(LineIssue {
                        line,
                        reason: format!("{detail} without call_id"),
                    });
                    return;
                };
                let (output, is_error) = tool_output(payload.get("output"));
                self.turns.tool_result(call_id, output, is_error, false);
            }
            ("response_item", "web_search_call") => self.part(&at, web_search(&payload)),
            // reasoning, ghost_snapshot, turn_context, token_count, agent_message (duplicates
            // the assistant response item), agent_reasoning, compacted, …
            _ => {}
        }
    }

    fn part(&mut self, at: &At<'_>, part: Part) {
        self.turns.assistant_part(at.key, at.line, at.ms, part);
    }

    fn session_meta(&mut self, line: u64, payload: &Value) {
        match payload.get("id").and_then(Value::as_str) {
            Some(id) => self.session_id = Some(id.to_owned()),
            None => self.issues.push(LineIssue {
                line,
                reason: String::from("session_meta without payload.id"),
            }),
        }
        if let Some(dir) = payload.get("cwd").and_then(Value::as_str) {
            self.cwd = Some(dir.to_owned());
        }
    }

    fn user_message(&mut self, at: &At<'_>, payload: &Value) {
        let text = payload.get("message").and_then(Value::as_str).unwrap_or("");
        if text.trim().is_empty() {
            return;
        }
        let injected = text.trim_start().starts_with("<environment_context>")
            || text.trim_start().starts_with("<user_instructions>");
        if !injected && self.title.is_none() {
            self.title = title_from(text);
        }
        self.turns.user(at.key, at.line, at.ms, text, injected);
    }

    fn assistant_message(&mut self, at: &At<'_>, payload: &Value) {
        if payload.get("role").and_then(Value::as_str) != Some("assistant") {
            // user items duplicate event_msg/user_message or are injected context;
            // developer items are instructions.
            return;
        }
        let text = content_text(payload);
        if !text.trim().is_empty() {
            self.part(
                at,
                Part::Text {
                    text: bounded(&text),
                    injected: false,
                },
            );
        }
    }

    /// The rollout's one session, or none (with an issue when there were messages but no
    /// `session_meta` to name them).
    fn into_sessions(self, start: Position, issues: &mut Vec<LineIssue>) -> Vec<ImportedSession> {
        let messages = self.turns.finish();
        match self.session_id {
            Some(id) => vec![ImportedSession {
                host: Host::Codex,
                external_ref: id,
                parent_ref: None,
                cwd: self.cwd,
                title: self.title,
                messages,
            }],
            None if messages.is_empty() => Vec::new(),
            None => {
                issues.push(LineIssue {
                    line: start.line + 1,
                    reason: String::from(
                        "no session_meta record: the rollout's session is unknown",
                    ),
                });
                Vec::new()
            }
        }
    }
}

/// A function, custom-tool or local-shell call, its result still pending.
fn tool_call(detail: &str, payload: &Value) -> Part {
    let name =
        payload
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or(if detail == "local_shell_call" {
                "local_shell"
            } else {
                "unknown"
            });
    let arguments = match (payload.get("arguments"), payload.get("input")) {
        (Some(Value::String(json)), _) => {
            serde_json::from_str(json).unwrap_or_else(|_| Value::String(bounded(json)))
        }
        (_, Some(Value::String(input))) => serde_json::json!({ "input": bounded(input) }),
        _ => payload.get("action").cloned().unwrap_or(Value::Null),
    };
    let call_id = payload
        .get("call_id")
        .or_else(|| payload.get("id"))
        .and_then(Value::as_str)
        .map(str::to_owned);
    Part::ToolCall {
        tool_name: name.chars().take(256).collect(),
        call_id,
        arguments,
        result: None,
        status: ToolStatus::Pending,
        external_context: false,
        injected: false,
    }
}

/// A Web search, complete in one record.
fn web_search(payload: &Value) -> Part {
    let call_id = payload.get("id").and_then(Value::as_str).map(str::to_owned);
    let completed = payload.get("status").and_then(Value::as_str) == Some("completed");
    Part::ToolCall {
        tool_name: String::from("web_search"),
        call_id,
        arguments: payload.get("action").cloned().unwrap_or(Value::Null),
        result: None,
        status: if completed {
            ToolStatus::Completed
        } else {
            ToolStatus::Error
        },
        // A successful Web result is external context (host metadata).
        external_context: completed,
        injected: false,
    }
}

fn content_text(payload: &Value) -> String {
    payload
        .get("content")
        .and_then(Value::as_array)
        .map(|items| {
            items
                .iter()
                .filter_map(|item| item.get("text").and_then(Value::as_str))
                .collect::<Vec<_>>()
                .join("\n")
        })
        .unwrap_or_default()
}

/// A tool output and whether it failed: `Exit code: N` (N ≠ 0) in plain outputs, or
/// `metadata.exit_code` in the JSON outputs of custom tools.
fn tool_output(output: Option<&Value>) -> (String, bool) {
    let text = match output {
        Some(Value::String(text)) => text.clone(),
        Some(Value::Object(object)) => object
            .get("content")
            .and_then(Value::as_str)
            .map_or_else(|| Value::Object(object.clone()).to_string(), str::to_owned),
        Some(other) => other.to_string(),
        None => String::new(),
    };
    if let Ok(Value::Object(json)) = serde_json::from_str::<Value>(&text)
        && let Some(inner) = json.get("output").and_then(Value::as_str)
    {
        let code = json
            .get("metadata")
            .and_then(|metadata| metadata.get("exit_code"))
            .and_then(Value::as_i64);
        return (inner.to_owned(), code.is_some_and(|code| code != 0));
    }
    let failed = text
        .lines()
        .take(3)
        .find_map(|line| line.strip_prefix("Exit code: "))
        .and_then(|code| code.trim().parse::<i64>().ok())
        .is_some_and(|code| code != 0);
    (text, failed)
}
