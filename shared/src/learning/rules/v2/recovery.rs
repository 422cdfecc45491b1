//! Recovered errors: a command that really failed (the host recorded the tool result as failed)
//! followed later in the turn by a DIFFERENT successful command with the same intent
//! (`python x.py` → `python3 x.py`, `npm test` → `npm run test:unit`). The lesson names both
//! commands and the error. Header lines some hosts print before the output (`Wall time: …`,
//! `Output:`, `Exit code: 1`) are never taken for the error, and a success of the same command
//! (a retry after an edit) is not a recovery.

use std::ops::Range;

use super::super::common::{cut, is_exit_banner, is_failure, is_success};
use crate::learning::extraction::{Citation, ExperienceKind, ProposedExperience};
use crate::learning::manifest::{SourceKind, SourceRecord};

/// At most this many recoveries per turn: a long debugging session is one lesson, not dozens.
pub const MAX_RECOVERED: usize = 3;
const CONFIDENCE: f64 = 0.7;
const ERROR_LINE_BYTES: usize = 300;
const COMMAND_BYTES: usize = 160;
const TITLE_BYTES: usize = 80;

/// A recovered error and where it was found.
pub struct Recovery {
    pub position: usize,
    pub experience: ProposedExperience,
}

/// The recoveries in `records` (context records excluded: they belong to an earlier turn).
pub fn recoveries(records: &[SourceRecord]) -> Vec<Recovery> {
    let mut found: Vec<Recovery> = Vec::new();
    for (index, failed) in records.iter().enumerate() {
        if found.len() == MAX_RECOVERED {
            break;
        }
        if failed.context || failed.kind != SourceKind::ToolResult || !is_failure(failed) {
            continue;
        }
        let Some(failed_call) = call_of(records, failed) else {
            continue;
        };
        let Some(failed_command) = command(&failed_call.text) else {
            continue;
        };
        let Some(error) = error_line(&failed.text) else {
            continue;
        };
        if transient(&failed.text[error.clone()]) {
            continue;
        }
        let Some((success_call, success_command)) =
            recovered_by(records, index, failed_call, &failed_command)
        else {
            continue;
        };
        if found.iter().any(|r| {
            r.experience
                .summary
                .contains(&format!("`{success_command}`"))
        }) {
            continue;
        }
        let failure = Failure {
            call: failed_call,
            result: failed,
            command: &failed_command,
            error: &failed.text[error.clone()],
        };
        if let Some(experience) = recovery_experience(&failure, success_call, &success_command) {
            found.push(Recovery {
                position: index,
                experience,
            });
        }
    }
    found
}

/// The call and command that recovered from the failure at `index`: the next result of the same
/// tool, when it succeeded with a command of the same intent.
fn recovered_by<'a>(
    records: &'a [SourceRecord],
    index: usize,
    failed_call: &SourceRecord,
    failed_command: &str,
) -> Option<(&'a SourceRecord, String)> {
    records[index + 1..]
        .iter()
        .filter(|r| !r.context && r.kind == SourceKind::ToolResult)
        .filter_map(|result| Some((result, call_of(records, result)?)))
        .find(|(_, call)| tool(&call.text) == tool(&failed_call.text))
        .filter(|(result, _)| is_success(result))
        .and_then(|(_, call)| {
            let command = command(&call.text)?;
            same_intent(failed_command, &command).then_some((call, command))
        })
}

/// A failed tool call, its result and the result's error line.
struct Failure<'a> {
    call: &'a SourceRecord,
    result: &'a SourceRecord,
    command: &'a str,
    error: &'a str,
}

/// "Use `to`, not `from`", cited by the failed call, its error and the successful call; `None`
/// when either command cannot be quoted from its call.
fn recovery_experience(
    failure: &Failure<'_>,
    success_call: &SourceRecord,
    success_command: &str,
) -> Option<ProposedExperience> {
    let failed_excerpt = excerpt_of(&failure.call.text, failure.command)?;
    let success_excerpt = excerpt_of(&success_call.text, success_command)?;
    let (from, to) = (
        cut(failure.command, COMMAND_BYTES),
        cut(success_command, COMMAND_BYTES),
    );
    Some(ProposedExperience {
        kind: ExperienceKind::Problem,
        title: cut(&format!("Use `{to}`, not `{from}`"), TITLE_BYTES),
        summary: format!(
            "Use `{to}` instead of `{from}`: `{from}` failed with \"{}\".",
            cut(failure.error, ERROR_LINE_BYTES)
        ),
        resolution: Some(format!("`{to}` succeeded.")),
        citations: vec![
            Citation {
                source_id: failure.call.source_id.clone(),
                excerpt: failed_excerpt,
            },
            Citation {
                source_id: failure.result.source_id.clone(),
                excerpt: failure.error.to_owned(),
            },
            Citation {
                source_id: success_call.source_id.clone(),
                excerpt: success_excerpt,
            },
        ],
        confidence: CONFIDENCE,
        keywords: [failure.command, success_command]
            .iter()
            .flat_map(|command| command.split_whitespace().take(2))
            .filter(|word| !word.starts_with('-'))
            .map(str::to_lowercase)
            .collect(),
    })
}

/// The call record of a tool result (same message and part).
fn call_of<'a>(records: &'a [SourceRecord], result: &SourceRecord) -> Option<&'a SourceRecord> {
    records.iter().find(|record| {
        record.kind == SourceKind::ToolCall
            && record.message_id == result.message_id
            && record.part_ordinal == result.part_ordinal
    })
}

/// The tool name of a call record (`bash {"command": …}` → `bash`).
fn tool(call: &str) -> &str {
    call.split_whitespace().next().unwrap_or_default()
}

/// The shell command of a call record: its `command`/`cmd`/`script` argument (a string, or an
/// argv array joined by spaces), whitespace collapsed.
pub fn command(call: &str) -> Option<String> {
    let json = call.split_once(' ').map(|(_, rest)| rest)?;
    let arguments: serde_json::Value = serde_json::from_str(json).ok()?;
    let value = ["command", "cmd", "script", "input"]
        .iter()
        .find_map(|key| arguments.get(key))?;
    let text = match value {
        serde_json::Value::String(text) => text.clone(),
        serde_json::Value::Array(items) => items
            .iter()
            .filter_map(|item| item.as_str())
            .collect::<Vec<_>>()
            .join(" "),
        _ => return None,
    };
    let collapsed = text.split_whitespace().collect::<Vec<_>>().join(" ");
    (!collapsed.is_empty()).then_some(collapsed)
}

/// An exact excerpt of the call record that shows `command`: the command itself when the record
/// holds it verbatim, else its JSON-escaped form, else the longest verbatim word of it.
fn excerpt_of(call: &str, command: &str) -> Option<String> {
    if call.contains(command) {
        return Some(command.to_owned());
    }
    let escaped = serde_json::to_string(command).ok()?;
    let escaped = escaped.trim_matches('"');
    if call.contains(escaped) {
        return Some(escaped.to_owned());
    }
    command
        .split_whitespace()
        .filter(|word| word.chars().count() >= 4 && call.contains(*word))
        .max_by_key(|word| word.len())
        .map(str::to_owned)
}

/// Commands longer than this (in words) are scripts, not a command a lesson can name.
const MAX_COMMAND_WORDS: usize = 10;

/// Two different commands that try to do the same thing, both short: the same arguments under
/// another program (`python x.py` / `python3 x.py`), or the same program where what changed is
/// related — a flag, or a word the new command still contains (`npm test` / `npm run
/// test:unit`), never an unrelated subcommand (`git status` / `git log`).
fn same_intent(failed: &str, succeeded: &str) -> bool {
    if failed == succeeded {
        return false;
    }
    let a: Vec<&str> = failed.split_whitespace().collect();
    let b: Vec<&str> = succeeded.split_whitespace().collect();
    if a.len() > MAX_COMMAND_WORDS || b.len() > MAX_COMMAND_WORDS {
        return false;
    }
    if a[0] != b[0] {
        return a.len() > 1 && a[1..] == b[1..];
    }
    let only_a: Vec<&str> = a.iter().filter(|w| !b.contains(w)).copied().collect();
    let only_b: Vec<&str> = b.iter().filter(|w| !a.contains(w)).copied().collect();
    let related =
        |x: &str, y: &str| x.len() >= 3 && y.len() >= 3 && (x.contains(y) || y.contains(x));
    only_a.len() <= 1
        && only_b.len() <= 2
        && word_distance(&a, &b) <= 2
        && only_a
            .iter()
            .all(|x| x.starts_with('-') || only_b.iter().any(|y| related(x, y)))
}

/// Edit distance between two word sequences.
fn word_distance(a: &[&str], b: &[&str]) -> usize {
    let mut previous: Vec<usize> = (0..=b.len()).collect();
    for (i, x) in a.iter().enumerate() {
        let mut current = vec![i + 1];
        for (j, y) in b.iter().enumerate() {
            let substitution = previous[j] + usize::from(x != y);
            current.push(substitution.min(previous[j + 1] + 1).min(current[j] + 1));
        }
        previous = current;
    }
    previous[b.len()]
}

/// Failures of the environment, not of the command: nothing to learn about the command.
fn transient(error: &str) -> bool {
    const MARKERS: [&str; 8] = [
        "cygheap",
        "child_copy",
        "Win32 error",
        "cygpath",
        "timed out",
        "Timeout",
        "ECONNRESET",
        "Connection reset",
    ];
    MARKERS.iter().any(|marker| error.contains(marker))
}

/// The first line of a failed output that says what failed: header lines (`Wall time:`,
/// `Output:`, `Chunk ID:`, `Process exited with code 1`, an exit-code banner) are skipped.
fn error_line(text: &str) -> Option<Range<usize>> {
    let mut offset = 0;
    for line in text.split('\n') {
        let start = offset;
        offset += line.len() + 1;
        let trimmed = line.trim();
        if trimmed.is_empty() || is_header(trimmed) {
            continue;
        }
        let lead = line.len() - line.trim_start().len();
        let begin = start + lead;
        return Some(begin..begin + trimmed.len());
    }
    None
}

fn is_header(line: &str) -> bool {
    const HEADERS: [&str; 8] = [
        "Wall time:",
        "Output:",
        "Chunk ID:",
        "Original token count:",
        "Process exited with code",
        "Exit code:",
        "Command:",
        "Total output lines:",
    ];
    is_exit_banner(line) || HEADERS.iter().any(|header| line.starts_with(header))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intent() {
        assert!(same_intent("python x.py", "python3 x.py"));
        assert!(same_intent("npm test", "npm run test:unit"));
        assert!(same_intent("npm install", "pnpm install"));
        assert!(!same_intent("npm test", "npm test"));
        assert!(!same_intent("git status", "git log"));
        assert!(!same_intent("ls", "cat README.md"));
        assert!(same_intent("make test", "just test"));
        assert!(!same_intent(
            "powershell.exe -Command \"Get-Service | Select-Object -First 5 Name,Status\"",
            "powershell.exe -Command \"Get-Acl C:\\hosts | Select-Object -ExpandProperty Access\""
        ));
    }

    #[test]
    fn headers_are_not_errors() {
        let text = "Wall time: 0.1 seconds\nOutput:\nbash: python: command not found\n";
        let range = error_line(text).unwrap();
        assert_eq!(&text[range], "bash: python: command not found");
        assert_eq!(error_line("Wall time: 0.1 seconds\nOutput:\n"), None);
        let banner = "Error: Exit code 1\nnpm ERR! Missing script: \"test\"";
        assert_eq!(
            &banner[error_line(banner).unwrap()],
            "npm ERR! Missing script: \"test\""
        );
    }

    #[test]
    fn commands_from_call_records() {
        assert_eq!(
            command(r#"bash {"command":"python3  x.py"}"#).as_deref(),
            Some("python3 x.py")
        );
        assert_eq!(
            command(r#"shell {"command":["bash","-lc","ls"]}"#).as_deref(),
            Some("bash -lc ls")
        );
        assert_eq!(command(r#"edit {"path":"a.rs"}"#), None);
    }
}
