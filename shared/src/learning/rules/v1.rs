//! The first built-in rules extractor (`rules-1`), kept selectable (`learning.rules_extractor`)
//! so old extractions can be reprocessed and compared; `rules-2` ([`super::v2`]) is the default.
//!
//! Rules decide only what is certain and leave ambiguity to a model extractor: an explicit
//! correction, rejection or stated preference in the user's own words, and a failed tool call
//! that a later call recovered from. Everything is copied verbatim from the manifest —
//! summaries and excerpts are exact substrings of the cited record — so every
//! citation verifies and nothing is paraphrased or invented. Medium signals (confusion, changed
//! intent) need interpretation and are left to a model; praise only adjusts confidence.

use std::collections::HashSet;
use std::ops::Range;

use super::super::extraction::{
    Citation, ExperienceKind, ExtractionOutput, MemoryAction, MemoryTarget, ProposedExperience,
    ProposedMemoryHint,
};
use super::super::manifest::{SourceKind, SourceManifest, SourceRecord, Verification};
use super::super::signals::{self, Signal, SignalKind, Strength};
use super::common::{
    ceil_boundary, cut, floor_boundary, is_exit_banner, is_failure, is_success, prefix, round2,
    tool_name,
};

/// At most this many experiences per manifest; the strongest (then earliest) are kept.
const MAX_EXPERIENCES: usize = 10;
/// At most this many recovered-error experiences per manifest: a long debugging session is
/// one lesson, not dozens.
const MAX_RECOVERED: usize = 3;

const STRONG_CONFIDENCE: f64 = 0.8;
/// Later praise from the user (a weak signal in [`crate::learning::signals`]) confirms the
/// correction was right.
const PRAISE_BONUS: f64 = 0.1;
const MAX_CONFIDENCE: f64 = 0.95;
const RECOVERED_CONFIDENCE: f64 = 0.6;

/// Byte limits, always cut on a char boundary. Bytes rather than chars keep the limits true
/// under either reading.
const TITLE_BYTES: usize = 80;
const ERROR_TITLE_BYTES: usize = 70;
const RESOLUTION_BYTES: usize = 200;
const HINT_BYTES: usize = 300;
/// A "sentence" with no terminator can be a whole pasted log; past this size only a window
/// around the signal phrase is quoted.
const SENTENCE_BYTES: usize = 1000;
const LINE_BYTES: usize = 500;
/// Validation does not verify excerpts shorter than this (in chars), so a terse "重写！" is
/// quoted together with its neighbour.
const MIN_EXCERPT_CHARS: usize = 4;

const CORRECTION_REASON: &str = "explicit user correction";
const PREFERENCE_REASON: &str = "stated user preference";

/// A proposed experience with what ordering and hints need to know about it.
struct Candidate {
    /// Index of the record it was found at: outputs keep manifest order.
    position: usize,
    /// The lexicon signal behind it; `None` for recovered errors.
    signal: Option<SignalKind>,
    experience: ProposedExperience,
}

/// Extracts experiences and memory hints from `manifest` with deterministic rules. No I/O.
pub fn extract(manifest: &SourceManifest) -> ExtractionOutput {
    let records = &manifest.records;
    // Shared across both rules, so the same sentence or error line is proposed only once.
    let mut seen = HashSet::new();
    let mut candidates = signal_experiences(records, &mut seen);
    candidates.extend(recovered_errors(records, &mut seen));

    let mut ranked: Vec<usize> = (0..candidates.len()).collect();
    ranked.sort_by(|&a, &b| {
        let (a_candidate, b_candidate) = (&candidates[a], &candidates[b]);
        b_candidate
            .experience
            .confidence
            .total_cmp(&a_candidate.experience.confidence)
            .then(a_candidate.position.cmp(&b_candidate.position))
            .then(a.cmp(&b))
    });
    ranked.truncate(MAX_EXPERIENCES);
    let keep: HashSet<usize> = ranked.into_iter().collect();
    let mut kept: Vec<Candidate> = candidates
        .into_iter()
        .enumerate()
        .filter(|(index, _)| keep.contains(index))
        .map(|(_, candidate)| candidate)
        .collect();
    // Stable: candidates found at the same record keep the order they were found in.
    kept.sort_by_key(|candidate| candidate.position);

    let memories = kept
        .iter()
        .enumerate()
        .filter_map(|(ordinal, candidate)| memory_hint(ordinal, candidate))
        .collect();
    ExtractionOutput {
        experiences: kept
            .into_iter()
            .map(|candidate| candidate.experience)
            .collect(),
        memories,
    }
}

/// One Project memory hint per explicit correction or stated preference. Never Global: global
/// memory needs explicit user evidence the maintainer checks. A rejection ("redo it") is about
/// one answer, not a durable rule, and recovered errors are evidence, not instructions.
fn memory_hint(ordinal: usize, candidate: &Candidate) -> Option<ProposedMemoryHint> {
    let reason = match candidate.signal? {
        SignalKind::Correction => CORRECTION_REASON,
        SignalKind::Preference => PREFERENCE_REASON,
        SignalKind::Rejection
        | SignalKind::Confusion
        | SignalKind::IntentChange
        | SignalKind::Praise => return None,
    };
    let experience = &candidate.experience;
    Some(ProposedMemoryHint {
        experience_ordinal: i64::try_from(ordinal).ok()?,
        target: MemoryTarget::Project,
        action: MemoryAction::Add,
        content: Some(prefix(&experience.summary, HINT_BYTES).to_owned()),
        old_text: None,
        reason: reason.to_owned(),
        confidence: experience.confidence,
    })
}

/// One experience per user record whose strongest signal is strong.
fn signal_experiences<'a>(
    records: &'a [SourceRecord],
    seen: &mut HashSet<&'a str>,
) -> Vec<Candidate> {
    let mut out = Vec::new();
    for (index, record) in records.iter().enumerate() {
        if !is_user_text(record) {
            continue;
        }
        let Some(signal) = strongest(&record.text) else {
            continue;
        };
        if signal.kind.strength() != Strength::Strong {
            continue;
        }
        let Some(range) = sentence_around(&record.text, signal.at, signal.phrase.len()) else {
            continue;
        };
        let sentence = &record.text[range];
        if !seen.insert(sentence) {
            continue;
        }
        let kind = match signal.kind {
            SignalKind::Preference => ExperienceKind::Feedback,
            _ => ExperienceKind::Correction,
        };
        let confidence = if praised_later(records, index) {
            round2((STRONG_CONFIDENCE + PRAISE_BONUS).min(MAX_CONFIDENCE))
        } else {
            STRONG_CONFIDENCE
        };
        out.push(Candidate {
            position: index,
            signal: Some(signal.kind),
            experience: ProposedExperience {
                kind,
                title: title(sentence),
                summary: sentence.to_owned(),
                resolution: resolution(records, index),
                citations: vec![Citation {
                    source_id: record.source_id.clone(),
                    excerpt: sentence.to_owned(),
                }],
                confidence,
                keywords: Vec::new(),
            },
        });
    }
    out
}

/// Something the user wrote. Host-generated texts (interrupts, slash-command wrappers,
/// compaction summaries) never reach the manifest, but a manifest may be persisted by an older
/// build or assembled by hand, so they are checked again.
fn is_user_text(record: &SourceRecord) -> bool {
    record.kind == SourceKind::UserText
        && record.verification == Verification::UserStatement
        && !signals::is_host_generated(&record.text)
}

/// `signals::strongest`, guarded. The lexicon matches on a lower-cased copy and reuses its
/// offsets when the total length did not change; a text where some characters grow and others
/// shrink under lower-casing (`İ` and the Kelvin sign `K`) keeps its length but not its offsets,
/// and slicing at them could panic. Such texts are skipped: an exotic mix, never worth a crash.
fn strongest(text: &str) -> Option<Signal> {
    let shifts = text
        .chars()
        .any(|c| c.to_lowercase().map(char::len_utf8).sum::<usize>() != c.len_utf8());
    if shifts && text.to_lowercase().len() == text.len() {
        return None;
    }
    signals::strongest(text)
}

/// Whether a later user record is praise (its strongest signal is praise: "thanks, but that's
/// wrong" is a correction, not approval).
fn praised_later(records: &[SourceRecord], index: usize) -> bool {
    records[index + 1..].iter().any(|record| {
        is_user_text(record)
            && strongest(&record.text).is_some_and(|signal| signal.kind == SignalKind::Praise)
    })
}

/// The first sentence of the first assistant reply after `index`: what the assistant did about
/// it, in its own words.
fn resolution(records: &[SourceRecord], index: usize) -> Option<String> {
    let reply = records[index + 1..]
        .iter()
        .find(|record| record.kind == SourceKind::AssistantText)?;
    let first = sentence_spans(&reply.text).into_iter().next()?;
    let sentence = prefix(&reply.text[first], RESOLUTION_BYTES).trim_end();
    (!sentence.is_empty()).then(|| sentence.to_owned())
}

/// A failed tool result (or an error) followed later by a successful tool result: the failure
/// and what worked after it.
fn recovered_errors<'a>(
    records: &'a [SourceRecord],
    seen: &mut HashSet<&'a str>,
) -> Vec<Candidate> {
    let mut out = Vec::new();
    for (index, failed) in records.iter().enumerate() {
        if out.len() == MAX_RECOVERED {
            break;
        }
        if !is_failure(failed) {
            continue;
        }
        let Some(error_line) = first_line(&failed.text) else {
            continue;
        };
        let later = &records[index + 1..];
        // Prefer a later success of the same tool: a failed `bash` is recovered by a `bash`
        // that worked, not by an unrelated file read in between.
        let tool = tool_name(records, failed);
        let success = later
            .iter()
            .filter(|record| is_success(record))
            .find(|record| tool.is_some() && tool_name(records, record) == tool)
            .or_else(|| later.iter().find(|record| is_success(record)));
        let Some(success) = success else {
            continue;
        };
        let Some(success_line) = first_line(&success.text) else {
            continue;
        };
        if !seen.insert(error_line) {
            continue;
        }
        out.push(Candidate {
            position: index,
            signal: None,
            experience: ProposedExperience {
                kind: ExperienceKind::Problem,
                title: format!("Recovered: {}", cut(error_line, ERROR_TITLE_BYTES)),
                summary: error_line.to_owned(),
                resolution: Some(success_line.to_owned()),
                citations: vec![
                    Citation {
                        source_id: failed.source_id.clone(),
                        excerpt: error_line.to_owned(),
                    },
                    Citation {
                        source_id: success.source_id.clone(),
                        excerpt: success_line.to_owned(),
                    },
                ],
                confidence: RECOVERED_CONFIDENCE,
                keywords: Vec::new(),
            },
        });
    }
    out
}

/// The first informative line of a tool output, trimmed and bounded. A bare exit-code banner
/// ("Error: Exit code 1", as Claude Code reports a failed command) is skipped when a line
/// follows: the next line says what failed.
fn first_line(text: &str) -> Option<&str> {
    let mut lines = text
        .split('\n')
        .map(str::trim)
        .filter(|line| !line.is_empty());
    let first = lines.next()?;
    let line = if is_exit_banner(first) {
        lines.next().unwrap_or(first)
    } else {
        first
    };
    Some(prefix(line, LINE_BYTES).trim_end())
}

/// The exact sentence (or line) of `text` containing the phrase at `at..at + len`, extended
/// to a neighbour when too short to verify, and windowed around the phrase when huge. Always a
/// char-boundary range of `text`.
fn sentence_around(text: &str, at: usize, len: usize) -> Option<Range<usize>> {
    let phrase_end = at.checked_add(len)?;
    text.get(at..phrase_end)?;
    let spans = sentence_spans(text);
    let index = spans
        .iter()
        .position(|span| span.start <= at && at < span.end)?;
    let mut range = spans[index].clone();
    // No lexicon phrase contains a terminator today; if one ever does, quote all of it.
    range.end = range.end.max(phrase_end);
    let short = |range: &Range<usize>| text[range.clone()].chars().count() < MIN_EXCERPT_CHARS;
    let mut next = index + 1;
    while short(&range) && next < spans.len() {
        range.end = range.end.max(spans[next].end);
        next += 1;
    }
    let mut previous = index;
    while short(&range) && previous > 0 {
        previous -= 1;
        range.start = spans[previous].start;
    }
    if range.len() > SENTENCE_BYTES {
        let half = SENTENCE_BYTES / 2;
        let start = ceil_boundary(text, at.saturating_sub(half).max(range.start));
        let end = floor_boundary(text, phrase_end.saturating_add(half).min(range.end));
        range = trimmed(text, start..end)?;
    }
    Some(range)
}

/// Sentence terminators, English and Chinese.
fn is_terminator(c: char) -> bool {
    matches!(c, '.' | '!' | '?' | '。' | '！' | '？')
}

/// Closing quotes and brackets that belong to the sentence they follow.
fn is_closer(c: char) -> bool {
    matches!(c, '"' | '\'' | '”' | '’' | ')' | '）' | '」' | '』' | ']')
}

/// Trimmed, non-empty sentence ranges of `text`. Lines always end a sentence; Chinese
/// terminators always do; `!` and `?` do before whitespace, a non-ASCII character or the end;
/// `.` only before whitespace or the end, so `src/main.rs`, `v1.2` and `example.com` stay whole.
fn sentence_spans(text: &str) -> Vec<Range<usize>> {
    let mut spans = Vec::new();
    let mut start = 0;
    let mut chars = text.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        if c == '\n' {
            spans.extend(trimmed(text, start..i));
            start = i + 1;
            continue;
        }
        if !is_terminator(c) {
            continue;
        }
        let mut end = i + c.len_utf8();
        while let Some(&(j, d)) = chars.peek() {
            if !(is_terminator(d) || is_closer(d)) {
                break;
            }
            end = j + d.len_utf8();
            chars.next();
        }
        let after = chars.peek().map(|&(_, d)| d);
        let ends = match c {
            '.' => after.is_none_or(char::is_whitespace),
            '!' | '?' => after.is_none_or(|d| d.is_whitespace() || !d.is_ascii()),
            _ => true,
        };
        if ends {
            spans.extend(trimmed(text, start..end));
            start = end;
        }
    }
    spans.extend(trimmed(text, start..text.len()));
    spans
}

fn trimmed(text: &str, range: Range<usize>) -> Option<Range<usize>> {
    let slice = text.get(range.clone())?;
    let start = range.start + (slice.len() - slice.trim_start().len());
    let end = range.end - (slice.len() - slice.trim_end().len());
    (start < end).then_some(start..end)
}

/// A one-line title from the sentence: whitespace collapsed, closing punctuation dropped,
/// bounded.
fn title(sentence: &str) -> String {
    let collapsed = sentence.split_whitespace().collect::<Vec<_>>().join(" ");
    let core = collapsed.trim_end_matches(|c: char| {
        is_terminator(c) || matches!(c, ',' | '，' | ';' | '；' | ':' | '：') || c.is_whitespace()
    });
    let core = if core.is_empty() {
        collapsed.as_str()
    } else {
        core
    };
    cut(core, TITLE_BYTES)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::learning::manifest::{build, finish};
    use crate::transcript::{Message, MessageStatus, Part, Role, ToolStatus};

    fn message(id: &str, role: Role, parts: Vec<Part>) -> Message {
        Message::sample(id, role, MessageStatus::Completed, parts)
    }

    fn text(text: &str) -> Part {
        Part::Text {
            text: text.into(),
            injected: false,
        }
    }

    fn tool(name: &str, result: &str, status: ToolStatus) -> Part {
        Part::ToolCall {
            tool_name: name.into(),
            call_id: None,
            arguments: serde_json::json!({"cmd": "x"}),
            result: Some(result.into()),
            status,
            external_context: false,
            injected: false,
        }
    }

    fn user(id: &str, body: &str) -> Message {
        message(id, Role::User, vec![text(body)])
    }

    fn assistant(id: &str, parts: Vec<Part>) -> Message {
        message(id, Role::Assistant, parts)
    }

    fn manifest(window: &[Message]) -> SourceManifest {
        build(window, None, 131_072)
    }

    fn run(window: &[Message]) -> ExtractionOutput {
        extract(&manifest(window))
    }

    fn user_record(source_id: &str, text: &str) -> SourceRecord {
        SourceRecord {
            source_id: source_id.into(),
            address: format!("message:{source_id}:part:0"),
            message_id: Some(source_id.into()),
            part_ordinal: Some(0),
            kind: SourceKind::UserText,
            verification: Verification::UserStatement,
            text: text.into(),
            raw_digest: "r".into(),
            redacted_digest: "d".into(),
            clipped: false,
            context: false,
        }
    }

    #[test]
    fn english_correction() {
        let output = run(&[
            user("u1", "No, don't use npm here; use pnpm."),
            assistant(
                "a1",
                vec![text("Switched to pnpm. Running pnpm install now.")],
            ),
        ]);
        assert_eq!(output.experiences.len(), 1);
        let experience = &output.experiences[0];
        assert_eq!(experience.kind, ExperienceKind::Correction);
        assert_eq!(experience.title, "No, don't use npm here; use pnpm");
        assert_eq!(experience.summary, "No, don't use npm here; use pnpm.");
        assert_eq!(experience.resolution.as_deref(), Some("Switched to pnpm."));
        assert_eq!(
            experience.citations,
            [Citation {
                source_id: "S1".into(),
                excerpt: "No, don't use npm here; use pnpm.".into()
            }]
        );
        assert_eq!(experience.confidence, 0.8);
        assert_eq!(
            output.memories,
            [ProposedMemoryHint {
                experience_ordinal: 0,
                target: MemoryTarget::Project,
                action: MemoryAction::Add,
                content: Some("No, don't use npm here; use pnpm.".into()),
                old_text: None,
                reason: CORRECTION_REASON.into(),
                confidence: 0.8,
            }]
        );
    }

    #[test]
    fn the_summary_is_the_sentence_holding_the_signal() {
        let output = run(&[user(
            "u1",
            "I ran the build in src/main.rs twice. It should be using the v2 API! Can you check?",
        )]);
        assert_eq!(
            output.experiences[0].summary,
            "It should be using the v2 API!"
        );
        assert_eq!(output.experiences[0].resolution, None);
    }

    #[test]
    fn rejection_is_a_correction_without_a_memory_hint() {
        let output = run(&[
            user("u1", "Please redo it with a smaller diff"),
            assistant("a1", vec![text("Sure, here is a smaller diff.")]),
        ]);
        assert_eq!(output.experiences.len(), 1);
        assert_eq!(output.experiences[0].kind, ExperienceKind::Correction);
        assert_eq!(
            output.experiences[0].summary,
            "Please redo it with a smaller diff"
        );
        assert!(output.memories.is_empty());
    }

    #[test]
    fn english_preference() {
        let output = run(&[user(
            "u1",
            "From now on always run cargo fmt before committing.",
        )]);
        let experience = &output.experiences[0];
        assert_eq!(experience.kind, ExperienceKind::Feedback);
        assert_eq!(
            experience.title,
            "From now on always run cargo fmt before committing"
        );
        assert_eq!(output.memories.len(), 1);
        assert_eq!(output.memories[0].reason, PREFERENCE_REASON);
        assert_eq!(output.memories[0].target, MemoryTarget::Project);
        assert_eq!(
            output.memories[0].content.as_deref(),
            Some("From now on always run cargo fmt before committing.")
        );
    }

    #[test]
    fn chinese_correction() {
        let output = run(&[
            user("u1", "先看一下日志。不对，应该用 pnpm 安装。然后再跑测试"),
            assistant("a1", vec![text("好的，改用 pnpm 安装。已经重新运行。")]),
        ]);
        let experience = &output.experiences[0];
        assert_eq!(experience.kind, ExperienceKind::Correction);
        assert_eq!(experience.summary, "不对，应该用 pnpm 安装。");
        assert_eq!(experience.title, "不对，应该用 pnpm 安装");
        assert_eq!(
            experience.resolution.as_deref(),
            Some("好的，改用 pnpm 安装。")
        );
        assert_eq!(output.memories[0].reason, CORRECTION_REASON);
    }

    #[test]
    fn chinese_preferences() {
        let output = run(&[
            user("u1", "以后都用中文回答。"),
            user("u2", "记住：提交前先运行 cargo fmt"),
        ]);
        let summaries: Vec<&str> = output
            .experiences
            .iter()
            .map(|e| e.summary.as_str())
            .collect();
        assert_eq!(
            summaries,
            ["以后都用中文回答。", "记住：提交前先运行 cargo fmt"]
        );
        assert!(
            output
                .experiences
                .iter()
                .all(|e| e.kind == ExperienceKind::Feedback)
        );
        let ordinals: Vec<i64> = output
            .memories
            .iter()
            .map(|m| m.experience_ordinal)
            .collect();
        assert_eq!(ordinals, [0, 1]);
    }

    #[test]
    fn terse_sentences_are_quoted_with_their_neighbour() {
        let output = run(&[user("u1", "重写！用别的方法处理。")]);
        assert_eq!(output.experiences[0].summary, "重写！用别的方法处理。");
    }

    #[test]
    fn praise_alone_produces_nothing() {
        for body in ["Thanks, looks good!", "很好，就是这样", "Perfect. LGTM"] {
            assert_eq!(
                run(&[user("u1", body)]),
                ExtractionOutput::default(),
                "{body}"
            );
        }
    }

    #[test]
    fn medium_signals_alone_produce_nothing() {
        for body in [
            "Why did you delete the lockfile?",
            "I don't understand this change",
            "Actually, let's switch to yarn",
            "我没明白这段代码",
        ] {
            assert_eq!(
                run(&[user("u1", body)]),
                ExtractionOutput::default(),
                "{body}"
            );
        }
    }

    #[test]
    fn later_praise_raises_confidence() {
        let window = [
            user("u1", "That's wrong, it should be the staging database."),
            assistant("a1", vec![text("Pointed it at staging.")]),
            user("u2", "Perfect, thanks!"),
        ];
        let output = run(&window);
        assert_eq!(output.experiences.len(), 1);
        assert_eq!(output.experiences[0].confidence, 0.9);
        assert_eq!(output.memories[0].confidence, 0.9);

        // Praise before the correction does not confirm it.
        let earlier = [
            user("u0", "Thanks!"),
            user("u1", "That's wrong, it should be the staging database."),
        ];
        assert_eq!(run(&earlier).experiences[0].confidence, 0.8);

        // "Thanks, but …" is a correction, not approval.
        let mixed = [
            user("u1", "That's wrong, it should be the staging database."),
            user("u2", "Thanks, but never use the prod replica either."),
        ];
        let output = run(&mixed);
        assert!(output.experiences.iter().all(|e| e.confidence == 0.8));
    }

    #[test]
    fn recovered_error() {
        let window = [
            user("u1", "run the tests"),
            assistant(
                "a1",
                vec![
                    tool(
                        "bash",
                        "Error: Exit code 1\nnpm ERR! Missing script: \"test\"",
                        ToolStatus::Error,
                    ),
                    tool("read", "package.json contents", ToolStatus::Completed),
                    tool(
                        "bash",
                        "test result: ok. 12 passed; 0 failed\nfinished in 0.4s",
                        ToolStatus::Completed,
                    ),
                ],
            ),
        ];
        let manifest = manifest(&window);
        let output = extract(&manifest);
        assert_eq!(output.experiences.len(), 1);
        let experience = &output.experiences[0];
        assert_eq!(experience.kind, ExperienceKind::Problem);
        assert_eq!(
            experience.title,
            "Recovered: npm ERR! Missing script: \"test\""
        );
        assert_eq!(experience.summary, "npm ERR! Missing script: \"test\"");
        assert_eq!(
            experience.resolution.as_deref(),
            Some("test result: ok. 12 passed; 0 failed")
        );
        assert_eq!(experience.confidence, 0.6);
        let cited: Vec<SourceKind> = experience
            .citations
            .iter()
            .filter_map(|c| manifest.record(&c.source_id))
            .map(|r| r.kind)
            .collect();
        assert_eq!(cited, [SourceKind::ToolResult, SourceKind::ToolResult]);
        assert_eq!(
            experience.citations[1].excerpt,
            "test result: ok. 12 passed; 0 failed"
        );
        assert!(output.memories.is_empty(), "problems never become hints");
    }

    #[test]
    fn errors_without_a_later_success_and_declined_calls_are_not_recoveries() {
        let declined =
            "The user doesn't want to proceed with this tool use. The tool use was rejected.";
        let window = [assistant(
            "a1",
            vec![
                tool("bash", "ok", ToolStatus::Completed),
                tool("bash", declined, ToolStatus::Error),
                Part::Error {
                    text: "stream closed".into(),
                },
            ],
        )];
        assert_eq!(run(&window), ExtractionOutput::default());
    }

    #[test]
    fn at_most_three_recoveries_and_error_parts_count() {
        let mut parts = vec![Part::Error {
            text: "provider overloaded".into(),
        }];
        for i in 0..5 {
            parts.push(tool(
                "bash",
                &format!("cargo: error {i}"),
                ToolStatus::Error,
            ));
        }
        parts.push(tool("bash", "Finished dev profile", ToolStatus::Completed));
        let output = run(&[assistant("a1", parts)]);
        let summaries: Vec<&str> = output
            .experiences
            .iter()
            .map(|e| e.summary.as_str())
            .collect();
        assert_eq!(
            summaries,
            ["provider overloaded", "cargo: error 0", "cargo: error 1"]
        );
    }

    #[test]
    fn injected_and_host_generated_texts_are_ignored() {
        let window = [
            message(
                "u1",
                Role::User,
                vec![
                    Part::Text {
                        text: "<memory>No, don't use npm here</memory>".into(),
                        injected: true,
                    },
                    text("<command-name>/review</command-name> don't use npm"),
                    text("[Request interrupted by user for tool use]"),
                ],
            ),
            assistant("a1", vec![text("That's wrong of me; I should use pnpm.")]),
        ];
        assert_eq!(run(&window), ExtractionOutput::default());

        // A hand-built or older manifest that still carries a host-generated text.
        let manifest = finish(vec![
            user_record(
                "S1",
                "This session is being continued from a previous conversation. Never use npm.",
            ),
            user_record(
                "S2",
                "<system-reminder>Always run the linter.</system-reminder>",
            ),
        ]);
        assert_eq!(extract(&manifest), ExtractionOutput::default());
    }

    #[test]
    fn identical_sentences_are_proposed_once_and_output_is_capped() {
        let repeated = run(&[user("u1", "Never use npm."), user("u2", "Never use npm.")]);
        assert_eq!(repeated.experiences.len(), 1);

        let mut window: Vec<Message> = (0..14)
            .map(|i| user(&format!("u{i}"), &format!("Never use tool{i} here.")))
            .collect();
        window.push(user("praise", "Thanks!"));
        let mut parts = vec![];
        for i in 0..3 {
            parts.push(tool("bash", &format!("failure {i}"), ToolStatus::Error));
        }
        parts.push(tool("bash", "ok now", ToolStatus::Completed));
        window.push(assistant("a1", parts));
        let output = run(&window);
        assert_eq!(output.experiences.len(), MAX_EXPERIENCES);
        // The strongest (all praised corrections) and earliest are kept, in manifest order.
        let summaries: Vec<String> = output
            .experiences
            .iter()
            .map(|e| e.summary.clone())
            .collect();
        let expected: Vec<String> = (0..10)
            .map(|i| format!("Never use tool{i} here."))
            .collect();
        assert_eq!(summaries, expected);
        assert!(output.experiences.iter().all(|e| e.confidence == 0.9));
        let ordinals: Vec<i64> = output
            .memories
            .iter()
            .map(|m| m.experience_ordinal)
            .collect();
        assert_eq!(ordinals, (0..10).collect::<Vec<i64>>());
    }

    #[test]
    fn credentials_stay_redacted_in_what_is_quoted() {
        let output = run(&[user(
            "u1",
            "No, don't use the key sk-proj-Ab3dEf6hIj9kLm2nOp5qRs8tUv1wXy4z in code.",
        )]);
        assert_eq!(
            output.experiences[0].summary,
            "No, don't use the key [REDACTED:api_key] in code."
        );
    }

    #[test]
    fn sentences_split_on_english_and_chinese_terminators() {
        let text =
            "Use src/main.rs (v1.2) instead. Really?! 好的。不要用npm！以后都这样\nnext line";
        let spans: Vec<&str> = sentence_spans(text).into_iter().map(|r| &text[r]).collect();
        assert_eq!(
            spans,
            [
                "Use src/main.rs (v1.2) instead.",
                "Really?!",
                "好的。",
                "不要用npm！",
                "以后都这样",
                "next line"
            ]
        );
    }

    #[test]
    fn long_sentences_are_windowed_and_titles_bounded() {
        let body = format!(
            "{} you should have used the cached build {}",
            "lorem ".repeat(400),
            "ipsum ".repeat(400)
        );
        let output = run(&[user("u1", &body)]);
        let experience = &output.experiences[0];
        assert!(experience.summary.len() <= SENTENCE_BYTES + 32);
        assert!(experience.summary.contains("you should have"));
        assert!(experience.title.len() <= TITLE_BYTES);
        assert!(experience.title.ends_with('…'));

        let chinese = format!("不对，{}", "应该先备份配置文件再修改".repeat(20));
        let output = run(&[user("u1", &chinese)]);
        let title = &output.experiences[0].title;
        assert!(title.len() <= TITLE_BYTES, "{title}");
        assert!(!title.trim_end_matches('…').ends_with(char::is_whitespace));
    }

    #[test]
    fn lowercasing_that_shifts_offsets_never_panics() {
        // `İ` grows and the Kelvin sign shrinks under lower-casing: same total length, shifted
        // offsets.
        for body in [
            "İİ that's wrong.\u{212A}",
            "\u{212A}İİ no, don't use npm",
            "İ\u{212A}İ 不对",
        ] {
            let _ = run(&[user("u1", body), user("u2", "thanks")]);
        }
    }

    #[test]
    fn rules_output_passes_validation_with_verified_citations() {
        let manifest = manifest(&[
            user("u1", "No, don't use npm here; use pnpm."),
            user("u2", "以后都用中文回答。"),
            assistant(
                "a1",
                vec![
                    text("Switched to pnpm."),
                    tool("bash", "error: lockfile is stale", ToolStatus::Error),
                    tool("bash", "Lockfile is up to date", ToolStatus::Completed),
                ],
            ),
        ]);
        let output = extract(&manifest);
        assert_eq!(output.experiences.len(), 3);
        let valid = crate::learning::validate::validate(&output, &manifest)
            .expect("a rules answer never fails the whole job");
        assert!(valid.refused_items.is_empty());
        assert!(valid.experiences.iter().all(|e| e.verified));
        assert_eq!(valid.hints.len(), 2);
    }

    fn varied_manifests() -> Vec<SourceManifest> {
        let mut manifests = vec![
            manifest(&[
                user("u1", "No, don't use npm here; use pnpm."),
                assistant("a1", vec![text("OK")]),
            ]),
            manifest(&[user("u1", "  重写！  \n\n  算了  ")]),
            manifest(&[user(
                "u1",
                "First line\n\n   From now on always run cargo fmt before committing   \nthanks",
            )]),
            manifest(&[
                user("u1", "先看一下日志。不对，应该用 pnpm 安装。然后再跑测试"),
                assistant(
                    "a1",
                    vec![
                        tool("bash", "\n\n  Error: Exit code 2  \n", ToolStatus::Error),
                        text("好的。"),
                        tool("bash", "   \r\n  done \r\n", ToolStatus::Completed),
                    ],
                ),
                user("u2", "很好"),
            ]),
            manifest(&[user(
                "u1",
                &format!("{} stop using {}", "α".repeat(900), "β".repeat(900)),
            )]),
            manifest(&[user("u1", "Please try again. Please try again! Try again?")]),
            finish(vec![
                user_record("S1", "x"),
                user_record("S2", "错了"),
                user_record("S3", "ALWAYS USE TABS"),
                user_record("S4", "…redo…"),
            ]),
        ];
        // Generated turns mixing signals, filler and punctuation.
        let pieces = [
            "No, use yarn",
            "不对",
            "记住",
            "from now on",
            "thanks",
            "why did you",
            "src/lib.rs",
            "。",
            "！",
            ".",
            "?",
            "\n",
            " ",
            "🦀",
            "e.g.",
            "don't use",
            "以后都",
        ];
        let mut seed: u64 = 0x853c_49e6_748f_ea9b;
        for n in 0..200 {
            let mut body = String::new();
            for _ in 0..(1 + n % 12) {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                body.push_str(pieces[(seed % pieces.len() as u64) as usize]);
            }
            manifests.push(manifest(&[
                user("u1", &body),
                assistant(
                    "a1",
                    vec![
                        text(&body),
                        tool("bash", &body, ToolStatus::Error),
                        tool("bash", &body, ToolStatus::Completed),
                    ],
                ),
                user("u2", &body),
            ]));
        }
        manifests
    }

    #[test]
    fn every_excerpt_is_an_exact_substring_of_its_record() {
        let mut experiences = 0;
        for manifest in varied_manifests() {
            let output = extract(&manifest);
            assert_eq!(output, extract(&manifest), "deterministic");
            assert!(output.experiences.len() <= MAX_EXPERIENCES);
            for experience in &output.experiences {
                experiences += 1;
                assert!(!experience.citations.is_empty());
                for citation in &experience.citations {
                    let record = manifest
                        .record(&citation.source_id)
                        .expect("cites a supplied record");
                    assert!(
                        record.text.contains(&citation.excerpt),
                        "{:?} not in {:?}",
                        citation.excerpt,
                        record.text
                    );
                }
                let first = &experience.citations[0];
                assert_eq!(experience.summary, first.excerpt);
                assert!(!experience.summary.trim().is_empty());
                assert!(experience.title.len() <= 81, "{}", experience.title);
                assert_eq!(experience.title, experience.title.trim_end());
                assert!((0.0..=1.0).contains(&experience.confidence));
            }
            for hint in &output.memories {
                let ordinal = usize::try_from(hint.experience_ordinal).expect("non-negative");
                let experience = &output.experiences[ordinal];
                assert_ne!(experience.kind, ExperienceKind::Problem);
                assert_eq!(hint.target, MemoryTarget::Project);
                let content = hint.content.as_deref().expect("an add has content");
                assert!(content.len() <= HINT_BYTES);
                assert!(experience.summary.starts_with(content));
            }
        }
        assert!(
            experiences > 100,
            "the property ran on {experiences} experiences"
        );
    }
}
