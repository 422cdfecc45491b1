//! The default rules extractor (`rules-2`): deterministic, English and Chinese, written to keep
//! only what a person would keep.
//!
//! - Only the user's own words can trigger ([`prose`]): never quoted text, code, pasted logs,
//!   compiler or command output, URLs or paths.
//! - Questions and dismissals are not rules; Chinese markers match as words ([`lexicon`]).
//! - An instruction becomes an experience whose summary is the lesson as one imperative sentence
//!   (discourse markers stripped, the reason kept) and whose citation is the exact user text.
//! - A correction that refers to the previous turn ("undo that", "you broke the highlight",
//!   "use yarn instead") names what it refers to when the turn's context records show it.
//! - A recovered error needs a real failure and a different command that worked ([`recovery`]).
//! - A thumbs-down note is a learning source.
//! - Only explicitly durable instructions ("always", "never", "remember", "from now on", "以后",
//!   "记住", "统一" …) carry a memory hint, user-wide ones to global Memory; everything else stays
//!   recallable Experience.

mod fold;
mod lexicon;
mod prose;
mod recovery;

use std::collections::HashSet;

pub use lexicon::has_instruction;
use lexicon::{Action, Instruction, Reference};

use super::common::{ceil_boundary, cut, floor_boundary, round2};
use crate::learning::extraction::{
    Citation, ExperienceKind, ExtractionOutput, MemoryAction, MemoryTarget, ProposedExperience,
    ProposedMemoryHint,
};
use crate::learning::manifest::{SourceKind, SourceManifest, SourceRecord, Verification};
use crate::learning::signals;

/// At most this many experiences per turn.
const MAX_EXPERIENCES: usize = 10;
const TITLE_BYTES: usize = 80;
/// Validation does not verify excerpts shorter than this (in chars): a terse "错了" is cited
/// with its neighbours.
const MIN_EXCERPT_CHARS: usize = 4;

const DURABLE_CONFIDENCE: f64 = 0.9;
const INSTRUCTION_CONFIDENCE: f64 = 0.8;
const REJECTION_CONFIDENCE: f64 = 0.7;
/// Later praise from the user confirms the instruction was followed and right.
const PRAISE_BONUS: f64 = 0.05;
const MAX_CONFIDENCE: f64 = 0.95;

struct Candidate {
    position: usize,
    experience: ProposedExperience,
    hint: Option<(MemoryTarget, &'static str)>,
}

/// Extracts experiences and memory hints from `manifest` with deterministic rules. No I/O.
pub fn extract(manifest: &SourceManifest) -> ExtractionOutput {
    let records = &manifest.records;
    let mut candidates = Vec::new();
    for (position, record) in records.iter().enumerate() {
        if is_user_text(record) {
            for instruction in lexicon::instructions(&record.text) {
                if let Some(candidate) = from_instruction(records, position, record, &instruction) {
                    candidates.push(candidate);
                }
            }
        } else if record.kind == SourceKind::Feedback
            && record.verification == Verification::UserFeedback
            && !record.context
        {
            candidates.extend(from_feedback(records, position, record));
        }
    }
    candidates.extend(recovery::recoveries(records).into_iter().map(|mut found| {
        let mut keywords = situation(records, None);
        for keyword in std::mem::take(&mut found.experience.keywords) {
            if !keywords.contains(&keyword) {
                keywords.push(keyword);
            }
        }
        found.experience.keywords = keywords;
        Candidate {
            position: found.position,
            experience: found.experience,
            hint: None,
        }
    }));

    let mut seen = HashSet::new();
    candidates.retain(|c| seen.insert(c.experience.summary.to_lowercase()));
    // The strongest first, then the earliest, within the cap; output in turn order.
    let mut ranked: Vec<usize> = (0..candidates.len()).collect();
    ranked.sort_by(|&a, &b| {
        let (x, y) = (&candidates[a], &candidates[b]);
        y.experience
            .confidence
            .total_cmp(&x.experience.confidence)
            .then(x.position.cmp(&y.position))
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
    kept.sort_by_key(|candidate| candidate.position);

    let memories = kept
        .iter()
        .enumerate()
        .filter_map(|(ordinal, candidate)| {
            let (target, reason) = candidate.hint?;
            Some(ProposedMemoryHint {
                experience_ordinal: i64::try_from(ordinal).ok()?,
                target,
                action: MemoryAction::Add,
                content: Some(candidate.experience.summary.clone()),
                old_text: None,
                reason: reason.to_owned(),
                confidence: candidate.experience.confidence,
            })
        })
        .collect();
    ExtractionOutput {
        experiences: kept.into_iter().map(|c| c.experience).collect(),
        memories,
    }
}

/// Something the user typed in this turn (not context, not host-generated).
fn is_user_text(record: &SourceRecord) -> bool {
    record.kind == SourceKind::UserText
        && record.verification == Verification::UserStatement
        && !record.context
        && !signals::is_host_generated(&record.text)
}

fn from_instruction(
    records: &[SourceRecord],
    position: usize,
    record: &SourceRecord,
    instruction: &Instruction,
) -> Option<Candidate> {
    let excerpt = excerpt(&record.text, instruction.cite.clone())?;
    let mut citations = vec![Citation {
        source_id: record.source_id.clone(),
        excerpt,
    }];
    let lesson = match &instruction.reference {
        None => instruction.lesson.clone(),
        Some(reference) => {
            let change = previous_change(records);
            if let Some(change) = &change {
                citations.push(Citation {
                    source_id: change.source_id.clone(),
                    excerpt: change.excerpt.clone(),
                });
            }
            resolve(reference, &instruction.lesson, change.as_ref(), records)?
        }
    };
    let (kind, mut confidence) = match instruction.action {
        Action::Preference => (ExperienceKind::Feedback, INSTRUCTION_CONFIDENCE),
        Action::Correction => (ExperienceKind::Correction, INSTRUCTION_CONFIDENCE),
        Action::Rejection => (ExperienceKind::Correction, REJECTION_CONFIDENCE),
    };
    if instruction.durable {
        confidence = DURABLE_CONFIDENCE;
    }
    if praised_later(records, position) {
        confidence = round2((confidence + PRAISE_BONUS).min(MAX_CONFIDENCE));
    }
    let hint = (instruction.durable || instruction.user_wide).then_some(if instruction.user_wide {
        (MemoryTarget::Global, "explicit user-wide preference")
    } else {
        (MemoryTarget::Project, "explicit durable instruction")
    });
    Some(Candidate {
        position,
        experience: ProposedExperience {
            kind,
            title: title(&lesson),
            summary: lesson,
            resolution: None,
            citations,
            confidence,
            keywords: situation(records, Some((record, &instruction.cite))),
        },
        hint,
    })
}

/// At most this many keywords from each part of the situation.
const REQUEST_TERMS: usize = 8;
const COMMANDS: usize = 4;

/// Retrieval keywords describing the situation a lesson applies to, so a later prompt about the
/// same kind of task finds it: the request the user made in the turn before (or the rest of the
/// correcting message), and the programs, subcommands and files the turns worked with. They are
/// searched, never shown.
fn situation(
    records: &[SourceRecord],
    correcting: Option<(&SourceRecord, &std::ops::Range<usize>)>,
) -> Vec<String> {
    use crate::learning::recall::search_terms;
    let mut keywords: Vec<String> = Vec::new();
    let mut add = |keyword: String| {
        // Bare numbers and one-letter words describe nothing (list numbering, "a").
        let useful = keyword.chars().count() >= 2 && !keyword.chars().all(|c| c.is_ascii_digit());
        if useful && !keywords.contains(&keyword) {
            keywords.push(keyword);
        }
    };
    let request_terms = |text: &str| {
        search_terms::parse(&prose::own_text(text))
            .terms
            .into_iter()
            .take(REQUEST_TERMS)
    };
    match correcting {
        Some((record, cite)) => {
            let before = record.text.get(..cite.start).unwrap_or("");
            let after = record.text.get(cite.end..).unwrap_or("");
            for term in request_terms(&format!("{before}\n{after}")) {
                add(term.text);
            }
        }
        None => {
            for record in records.iter().filter(|r| is_user_text(r)) {
                for term in request_terms(&record.text) {
                    add(term.text);
                }
            }
        }
    }
    for record in records
        .iter()
        .filter(|r| r.context && r.kind == SourceKind::UserText)
    {
        for term in request_terms(&record.text) {
            add(term.text);
        }
    }
    let mut commands = 0;
    for call in records.iter().filter(|r| r.kind == SourceKind::ToolCall) {
        if commands == COMMANDS {
            break;
        }
        if let Some(change) = change_of(call) {
            commands += 1;
            match change.program {
                Some(_) => {
                    let command = recovery::command(&call.text).unwrap_or_default();
                    for word in command
                        .split_whitespace()
                        .take(2)
                        .filter(|w| !w.starts_with('-'))
                    {
                        add(word.to_lowercase());
                    }
                }
                None => {
                    add(change.excerpt.to_lowercase());
                    if let Some(name) = std::path::Path::new(&change.excerpt).file_name() {
                        add(name.to_string_lossy().to_lowercase());
                    }
                }
            }
        }
    }
    keywords
}

/// A thumbs-down with a note: the note's instructions, or the note itself as the lesson.
fn from_feedback(
    records: &[SourceRecord],
    position: usize,
    record: &SourceRecord,
) -> Vec<Candidate> {
    let Some(note_at) = record
        .text
        .strip_prefix("negative feedback: ")
        .map(|_| "negative feedback: ".len())
    else {
        return Vec::new();
    };
    let note = &record.text[note_at..];
    if note.trim().chars().count() < MIN_EXCERPT_CHARS {
        return Vec::new();
    }
    let found = lexicon::instructions(note);
    let lessons: Vec<(String, std::ops::Range<usize>, bool, bool)> = if found.is_empty() {
        let core = note.trim();
        let start = note_at + (note.len() - note.trim_start().len());
        let user_wide = lexicon::is_user_wide(core);
        vec![(
            lexicon::finish(&lexicon::capitalize(core)),
            start..start + core.len(),
            user_wide,
            user_wide,
        )]
    } else {
        found
            .into_iter()
            .filter(|i| i.reference.is_none())
            .map(|i| {
                (
                    i.lesson,
                    note_at + i.cite.start..note_at + i.cite.end,
                    i.durable || i.user_wide,
                    i.user_wide,
                )
            })
            .collect()
    };
    lessons
        .into_iter()
        .filter_map(|(lesson, cite, durable, user_wide)| {
            Some(Candidate {
                position,
                experience: ProposedExperience {
                    kind: ExperienceKind::Feedback,
                    title: title(&lesson),
                    summary: lesson,
                    resolution: None,
                    citations: vec![Citation {
                        source_id: record.source_id.clone(),
                        excerpt: excerpt(&record.text, cite)?,
                    }],
                    confidence: if durable {
                        DURABLE_CONFIDENCE
                    } else {
                        INSTRUCTION_CONFIDENCE
                    },
                    keywords: situation(records, None),
                },
                hint: durable.then_some(if user_wide {
                    (MemoryTarget::Global, "explicit user-wide preference")
                } else {
                    (MemoryTarget::Project, "explicit durable instruction")
                }),
            })
        })
        .collect()
}

/// What the previous turn changed, as its context records show it: the latest edited file or
/// command, and an exact excerpt of the call record naming it.
struct Change {
    source_id: String,
    excerpt: String,
    /// `the edit to src/theme.css`, `` `git push --force` ``.
    description: String,
    /// The program of a shell command.
    program: Option<String>,
    /// Whether the call changed something (an edit, a command that is not a read).
    modifies: bool,
}

/// The latest change of the previous turn: an edit, or a shell command that is not a read.
fn previous_change(records: &[SourceRecord]) -> Option<Change> {
    records
        .iter()
        .rev()
        .filter(|r| r.context && r.kind == SourceKind::ToolCall)
        .filter_map(change_of)
        .find(|change| change.modifies)
}

/// Shell commands that only look (list, read, search, diff, type-check): undoing a turn never
/// undoes them.
fn reads_only(description: &str) -> bool {
    let command = description.trim_matches('`');
    let mut words = command.split_whitespace();
    let program = words.next().unwrap_or_default();
    let subcommand = words.next().unwrap_or_default();
    matches!(
        program,
        "ls" | "cat"
            | "head"
            | "tail"
            | "grep"
            | "rg"
            | "find"
            | "pwd"
            | "echo"
            | "which"
            | "wc"
            | "less"
            | "tree"
            | "stat"
    ) || (program == "git" && matches!(subcommand, "status" | "diff" | "log" | "show" | "blame"))
        || command.contains("--noEmit")
        || command.contains("--dry-run")
        || command.split_whitespace().any(|word| word == "--check")
}

fn change_of(call: &SourceRecord) -> Option<Change> {
    let (tool, json) = call.text.split_once(' ')?;
    let tool = tool.to_lowercase();
    let arguments: serde_json::Value = serde_json::from_str(json).ok()?;
    let path = ["file_path", "path", "file", "filename", "target_file"]
        .iter()
        .find_map(|key| arguments.get(key).and_then(|v| v.as_str()))
        .map(str::to_owned)
        .or_else(|| patched_file(&arguments))
        .filter(|path| !path.is_empty() && call.text.contains(path.as_str()));
    if let Some(path) = path {
        let verb = if tool.contains("write") || tool.contains("create") {
            "write"
        } else {
            "edit"
        };
        return Some(Change {
            source_id: call.source_id.clone(),
            description: format!("the {verb} to {path}"),
            excerpt: path,
            program: None,
            modifies: EDIT_TOOLS.iter().any(|edit| tool.contains(edit)),
        });
    }
    let command = recovery::command(&call.text)?;
    let excerpt = if call.text.contains(&command) {
        command.clone()
    } else {
        command
            .split_whitespace()
            .next()
            .filter(|w| call.text.contains(*w))?
            .to_owned()
    };
    Some(Change {
        source_id: call.source_id.clone(),
        excerpt,
        program: command.split_whitespace().next().map(str::to_owned),
        modifies: !reads_only(&command),
        description: format!("`{}`", cut(&command, 120)),
    })
}

/// Tools that change files (by name): Claude Code's Edit/Write/MultiEdit, Codex's
/// apply_patch, aider's edits, editors' str_replace/create/insert.
const EDIT_TOOLS: [&str; 9] = [
    "edit",
    "write",
    "str_replace",
    "apply_patch",
    "patch",
    "create",
    "insert",
    "replace",
    "update",
];

/// The first file a Codex-style patch (`*** Update File: app.js`) touches.
fn patched_file(arguments: &serde_json::Value) -> Option<String> {
    let patch = ["input", "patch"]
        .iter()
        .find_map(|key| arguments.get(key).and_then(|v| v.as_str()))?;
    patch.lines().find_map(|line| {
        ["*** Update File: ", "*** Add File: ", "*** Delete File: "]
            .iter()
            .find_map(|marker| line.strip_prefix(marker))
            .map(|path| path.trim().to_owned())
    })
}

/// The lesson of an instruction that refers to the previous turn, or `None` when nothing
/// reusable is left ("revert that" with no reason and nothing to name).
fn resolve(
    reference: &Reference,
    lesson: &str,
    change: Option<&Change>,
    records: &[SourceRecord],
) -> Option<String> {
    match reference {
        // A bare "undo that" rejects one answer; only the reason the user gives makes it a
        // lesson for later turns.
        Reference::Undo { reason } => {
            let what = change.map_or("the last change", |c| c.description.as_str());
            reason
                .as_ref()
                .map(|reason| lexicon::finish(&format!("Don't repeat {what}: {reason}")))
        }
        Reference::Broke { what } => Some(lexicon::finish(&match change {
            Some(change) => format!("Keep {what} working: {} broke it", change.description),
            None => format!("Keep {what} working: the last change broke it"),
        })),
        Reference::Instead { replacement } => {
            let program = replacement
                .split_whitespace()
                .next()
                .unwrap_or_default()
                .to_lowercase();
            let replaced = change
                .and_then(|c| c.program.clone())
                .or_else(|| {
                    records
                        .iter()
                        .filter(|r| r.context && r.kind == SourceKind::ToolCall)
                        .find_map(|r| recovery::command(&r.text))
                        .and_then(|c| c.split_whitespace().next().map(str::to_owned))
                })
                .filter(|previous| {
                    previous.to_lowercase() != program && alternatives(previous, &program)
                });
            Some(match replaced {
                Some(previous) => {
                    lexicon::finish(&format!("Use {replacement} instead of {previous}"))
                }
                None => lesson.to_owned(),
            })
        }
    }
}

/// Whether two programs replace one another (package managers, interpreters, …).
fn alternatives(a: &str, b: &str) -> bool {
    const GROUPS: [&[&str]; 5] = [
        &["npm", "yarn", "pnpm", "bun"],
        &["pip", "pip3", "uv", "poetry", "pipenv", "conda"],
        &["python", "python3", "py"],
        &["docker", "podman"],
        &["jest", "vitest", "mocha"],
    ];
    let (a, b) = (a.to_lowercase(), b.to_lowercase());
    GROUPS
        .iter()
        .any(|group| group.contains(&a.as_str()) && group.contains(&b.as_str()))
}

/// Whether a later user record of this turn is praise.
fn praised_later(records: &[SourceRecord], index: usize) -> bool {
    records[index + 1..].iter().any(|record| {
        is_user_text(record)
            && signals::strongest(&record.text)
                .is_some_and(|s| s.kind == signals::SignalKind::Praise)
            && lexicon::instructions(&record.text).is_empty()
    })
}

/// The exact text at `range` of `text`, widened to its neighbours when too short to verify.
fn excerpt(text: &str, range: std::ops::Range<usize>) -> Option<String> {
    let start = floor_boundary(text, range.start);
    let mut end = ceil_boundary(text, range.end.min(text.len()));
    let mut begin = start;
    while text[begin..end].trim().chars().count() < MIN_EXCERPT_CHARS {
        if end < text.len() {
            end = ceil_boundary(text, end + 1);
        } else if begin > 0 {
            begin = floor_boundary(text, begin - 1);
        } else {
            break;
        }
    }
    let cited = text[begin..end].trim();
    (!cited.is_empty()).then(|| cited.to_owned())
}

fn title(lesson: &str) -> String {
    cut(lesson.trim_end_matches(['.', '。']), TITLE_BYTES)
}

#[cfg(test)]
mod tests;
