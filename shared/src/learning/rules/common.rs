//! Helpers both rules extractors share: tool results and their calls, and byte-bounded cuts
//! that stay exact substrings of what they cut.

use crate::learning::manifest::{SourceKind, SourceRecord, Verification};

/// A failed tool result or an error part; a declined tool call is a decision, not a failure.
pub fn is_failure(record: &SourceRecord) -> bool {
    let failed = (record.kind == SourceKind::ToolResult
        && record.verification == Verification::ToolFailed)
        || record.kind == SourceKind::Error;
    // Claude Code records the user declining a tool call as a failed result ("The user doesn't
    // want to proceed with this tool use…"); it is a decision, not an error anything recovered
    // from.
    failed
        && !record
            .text
            .trim_start()
            .starts_with("The user doesn't want to proceed with this tool use")
}

/// A tool result the host recorded as successful.
pub fn is_success(record: &SourceRecord) -> bool {
    record.kind == SourceKind::ToolResult && record.verification == Verification::ToolSucceeded
}

/// The tool a result belongs to: the first word of the call record for the same part.
pub fn tool_name<'a>(records: &'a [SourceRecord], result: &SourceRecord) -> Option<&'a str> {
    if result.kind != SourceKind::ToolResult {
        return None;
    }
    records
        .iter()
        .find(|record| {
            record.kind == SourceKind::ToolCall
                && record.message_id == result.message_id
                && record.part_ordinal == result.part_ordinal
        })
        .and_then(|call| call.text.split_whitespace().next())
}

/// A bare exit-code banner (`Error: Exit code 1`) that says nothing about what failed.
pub fn is_exit_banner(line: &str) -> bool {
    let rest = line.strip_prefix("Error:").map_or(line, str::trim_start);
    let Some(code) = rest.strip_prefix("Exit code") else {
        return false;
    };
    let code = code.trim_start_matches(':').trim();
    let digits = code.strip_prefix('-').unwrap_or(code);
    !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())
}

/// `text` bounded to `max` bytes; a cut one ends in `…` and never in whitespace.
pub fn cut(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.trim_end().to_owned();
    }
    let head = prefix(text, max.saturating_sub('…'.len_utf8())).trim_end();
    format!("{head}…")
}

/// The longest prefix of `text` of at most `max` bytes that ends on a char boundary: still an
/// exact substring.
pub fn prefix(text: &str, max: usize) -> &str {
    &text[..floor_boundary(text, max)]
}

/// The largest char boundary at or below `index`.
pub fn floor_boundary(text: &str, index: usize) -> usize {
    let mut index = index.min(text.len());
    while !text.is_char_boundary(index) {
        index -= 1;
    }
    index
}

/// The smallest char boundary at or above `index`.
pub fn ceil_boundary(text: &str, index: usize) -> usize {
    let mut index = index.min(text.len());
    while !text.is_char_boundary(index) {
        index += 1;
    }
    index
}

/// Confidences are stored and compared; `0.8 + 0.1` should be `0.9`, not `0.9000000000000001`.
pub fn round2(value: f64) -> f64 {
    (value * 100.0).round() / 100.0
}
