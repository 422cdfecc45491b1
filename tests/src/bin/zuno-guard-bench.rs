//! `zuno-guard-bench`: what guards compiled from the dev set's lessons would do (issue 30).
//!
//! 1. Compiles every lesson of `tests/learning-eval/dev/*.labels.json` with the rules compiler.
//! 2. Replays every tool call of each dev transcript through the guards of its own lessons, and
//!    every tool call of the other corpus transcripts through all of them (a project's guards
//!    never see another project's calls; this is the worst case), listing each block.
//! 3. Replays the follow-up violations and near misses of `tests/learning-eval/guards/
//!    checkable.json` through the guards of their lesson: the true-block rate.
//! 4. Times the in-process verdict over 200 guards for every corpus call.
//!
//!   cargo run --release -p zuno-tests --bin zuno-guard-bench -- [--corpus ../shared/corpus]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde_json::Value;
use zuno_shared::config::GuardDecision;
use zuno_shared::guards::call::tool_call;
use zuno_shared::guards::compile::compile;
use zuno_shared::guards::matcher::{Matcher, ToolCall};
use zuno_shared::guards::store::{Guard, GuardOrigin, GuardState};
use zuno_shared::transcript::Part;
use zuno_shared::transcript::import::{Host, Position};

struct Call {
    source: String,
    shown: String,
    call: ToolCall,
}

fn guard(id: String, matcher: Matcher, alternative: Option<String>, reason: &str) -> Guard {
    Guard {
        id,
        project_id: None,
        matcher,
        alternative,
        reason: reason.to_owned(),
        source_entry_id: None,
        evidence: Vec::new(),
        origin: GuardOrigin::Rules,
        state: GuardState::Active,
        decision: GuardDecision::Ask,
        blocks: 0,
        violations: 0,
        created_at: 0,
        updated_at: 0,
    }
}

fn shown(call: &ToolCall) -> String {
    match call {
        ToolCall::Shell(line) => line
            .lines()
            .next()
            .unwrap_or("")
            .chars()
            .take(120)
            .collect(),
        ToolCall::Edit(paths) => format!("edit {}", paths.join(", ")),
    }
}

fn calls_of_parts(source: &str, parts: &[Part], worktree: Option<&Path>, out: &mut Vec<Call>) {
    for part in parts {
        if let Part::ToolCall {
            tool_name,
            arguments,
            ..
        } = part
            && let Some(call) = tool_call(tool_name, arguments, worktree)
        {
            out.push(Call {
                source: source.to_owned(),
                shown: shown(&call),
                call,
            });
        }
    }
}

/// The tool calls of a host transcript (Claude Code, Codex, Aider), each session's cwd as its
/// worktree.
fn host_calls(host: Host, path: &Path) -> Vec<Call> {
    let mut out = Vec::new();
    let Ok(parsed) = zuno_cli::import::parse_file(host, path, Position::default()) else {
        return out;
    };
    for session in &parsed.sessions {
        let root = session.cwd.as_deref().map(Path::new);
        for message in &session.messages {
            let source = format!("{}:{}", path.display(), message.line);
            calls_of_parts(&source, &message.parts, root, &mut out);
        }
    }
    out
}

/// The tool calls of a synthetic (`zuno`) transcript: one message per JSON line.
fn synthetic_calls(path: &Path) -> Vec<Call> {
    let mut out = Vec::new();
    let text = std::fs::read_to_string(path).unwrap_or_default();
    for (index, line) in text.lines().enumerate() {
        let Ok(value) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        let Some(parts) = value.get("parts") else {
            continue;
        };
        let parts: Vec<Part> = serde_json::from_value(parts.clone()).unwrap_or_default();
        calls_of_parts(
            &format!("{}:{}", path.display(), index + 1),
            &parts,
            None,
            &mut out,
        );
    }
    out
}

fn transcript_calls(labels: &Value, corpus: &Path) -> Vec<Call> {
    let transcript = labels["transcript"].as_str().unwrap_or_default();
    match labels["format"].as_str() {
        Some("zuno") => synthetic_calls(Path::new(transcript.trim_start_matches("project:"))),
        Some("claude-code") => host_calls(Host::ClaudeCode, &corpus.join(transcript)),
        Some("codex") => host_calls(Host::Codex, &corpus.join(transcript)),
        _ => host_calls(Host::Aider, &corpus.join(transcript)),
    }
}

fn files_under(dir: &Path, ext: &str, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() && path.file_name().is_some_and(|n| n != "dev") {
            files_under(&path, ext, out);
        } else if path.to_string_lossy().ends_with(ext) {
            out.push(path);
        }
    }
}

/// Every tool call of the corpus outside `dev/`.
fn corpus_calls(corpus: &Path) -> Vec<Call> {
    let mut files = Vec::new();
    files_under(&corpus.join("claude-code-jsonl"), ".jsonl", &mut files);
    let mut calls = Vec::new();
    for file in files
        .iter()
        .filter(|f| !f.to_string_lossy().contains("hook_logs"))
    {
        calls.extend(host_calls(Host::ClaudeCode, file));
    }
    let mut rollouts = Vec::new();
    files_under(&corpus.join("codex-rollout"), ".jsonl", &mut rollouts);
    for file in &rollouts {
        calls.extend(host_calls(Host::Codex, file));
    }
    let mut aider = Vec::new();
    files_under(&corpus.join("aider"), ".md", &mut aider);
    for file in &aider {
        calls.extend(host_calls(Host::Aider, file));
    }
    calls
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let corpus = args
        .iter()
        .position(|a| a == "--corpus")
        .and_then(|i| args.get(i + 1))
        .map_or_else(|| PathBuf::from("../shared/corpus"), PathBuf::from);
    let mut labels_files: Vec<PathBuf> = std::fs::read_dir("tests/learning-eval/dev")?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.to_string_lossy().ends_with(".labels.json"))
        .collect();
    labels_files.sort();

    // 1–2: compile each file's lessons; replay its own calls.
    let mut by_group: BTreeMap<String, Vec<Guard>> = BTreeMap::new();
    let mut all_guards: Vec<Guard> = Vec::new();
    let (mut own_calls, mut own_blocks) = (0usize, Vec::new());
    for file in &labels_files {
        let labels: Value = serde_json::from_str(&std::fs::read_to_string(file)?)?;
        let mut guards: Vec<Guard> = Vec::new();
        for prompt in labels["prompts"].as_array().into_iter().flatten() {
            let (Some(lesson), Some(group)) =
                (prompt["lesson"].as_str(), prompt["lesson_group"].as_str())
            else {
                continue;
            };
            for compiled in compile(lesson) {
                let id = format!("{group}:{}", compiled.matcher.key());
                let made = guard(id.clone(), compiled.matcher, compiled.alternative, lesson);
                let of_group = by_group.entry(group.to_owned()).or_default();
                if !of_group.iter().any(|g| g.id == id) {
                    of_group.push(made.clone());
                }
                if !guards.iter().any(|g| g.matcher == made.matcher) {
                    guards.push(made);
                }
            }
        }
        let calls = transcript_calls(&labels, &corpus);
        own_calls += calls.len();
        for call in &calls {
            if let Some(verdict) =
                zuno_shared::guards::verdict(&guards, &call.call, GuardDecision::Ask)
            {
                own_blocks.push(format!(
                    "{} | {} | {} | {}",
                    call.source, verdict.guard.id, verdict.matched, call.shown
                ));
            }
        }
        all_guards.extend(guards);
    }
    println!("## Guards compiled from the dev set's lessons\n");
    for (group, guards) in &by_group {
        for g in guards {
            println!(
                "- `{group}`: {} (alternative: {})",
                g.matcher.describe(),
                g.alternative.as_deref().unwrap_or("-")
            );
        }
    }
    println!(
        "\n{} guards from {} lesson groups.\n",
        all_guards.len(),
        by_group.len()
    );
    println!(
        "## Own transcripts: {own_calls} tool calls, {} blocked\n",
        own_blocks.len()
    );
    for block in &own_blocks {
        println!("- {block}");
    }

    // Cross-corpus worst case.
    let corpus_calls = corpus_calls(&corpus);
    let cross: Vec<String> = corpus_calls
        .iter()
        .filter_map(|call| {
            zuno_shared::guards::verdict(&all_guards, &call.call, GuardDecision::Ask).map(|v| {
                format!(
                    "{} | {} | {} | {}",
                    call.source, v.guard.id, v.matched, call.shown
                )
            })
        })
        .collect();
    let shell = corpus_calls
        .iter()
        .filter(|c| matches!(c.call, ToolCall::Shell(_)))
        .count();
    println!(
        "\n## Other corpus transcripts through all {} dev guards: {} tool calls ({} shell, {} edits), {} blocked ({:.2} %)\n",
        all_guards.len(),
        corpus_calls.len(),
        shell,
        corpus_calls.len() - shell,
        cross.len(),
        100.0 * cross.len() as f64 / corpus_calls.len().max(1) as f64
    );
    for block in &cross {
        println!("- {block}");
    }

    // 3: follow-up violations and near misses.
    let truth: Value = serde_json::from_str(&std::fs::read_to_string(
        "tests/learning-eval/guards/checkable.json",
    )?)?;
    let as_call = |v: &Value| match (v["command"].as_str(), v["path"].as_str()) {
        (Some(command), _) => ToolCall::Shell(command.to_owned()),
        (_, Some(path)) => ToolCall::Edit(vec![path.to_owned()]),
        _ => ToolCall::Shell(String::new()),
    };
    let (mut violations, mut blocked, mut near, mut near_blocked) = (0, 0, 0, 0);
    let mut missed = Vec::new();
    for lesson in truth["lessons"].as_array().into_iter().flatten() {
        let group = lesson["group"].as_str().unwrap_or_default();
        let guards = by_group.get(group).cloned().unwrap_or_default();
        for v in lesson["violations"].as_array().into_iter().flatten() {
            violations += 1;
            let call = as_call(v);
            match zuno_shared::guards::verdict(&guards, &call, GuardDecision::Ask) {
                Some(_) => blocked += 1,
                None => missed.push(format!("{group}: {}", shown(&call))),
            }
        }
        for v in lesson["allowed"].as_array().into_iter().flatten() {
            near += 1;
            let call = as_call(v);
            if zuno_shared::guards::verdict(&guards, &call, GuardDecision::Ask).is_some() {
                near_blocked += 1;
                missed.push(format!("{group}: near miss blocked: {}", shown(&call)));
            }
        }
    }
    println!(
        "\n## Follow-up violations of the {} checkable lessons: {blocked}/{violations} blocked ({:.2}); near misses blocked: {near_blocked}/{near}\n",
        truth["lessons"].as_array().map_or(0, Vec::len),
        blocked as f64 / violations.max(1) as f64
    );
    for line in &missed {
        println!("- missed: {line}");
    }

    // 4: verdict latency over 200 guards.
    let mut two_hundred = all_guards.clone();
    let mut filler = 0;
    while two_hundred.len() < 200 {
        filler += 1;
        let matcher = if filler % 4 == 0 {
            Matcher::Path {
                glob: format!("generated{filler}/"),
            }
        } else {
            Matcher::Command {
                program: format!("tool{filler}"),
                args: vec![String::from("run")],
            }
        };
        two_hundred.push(guard(format!("filler{filler}"), matcher, None, "filler"));
    }
    let mut micros: Vec<f64> = corpus_calls
        .iter()
        .map(|call| {
            let start = Instant::now();
            let verdict =
                zuno_shared::guards::verdict(&two_hundred, &call.call, GuardDecision::Ask);
            std::hint::black_box(verdict);
            start.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    micros.sort_by(f64::total_cmp);
    println!(
        "\n## Verdict over 200 guards, in process: {} calls, p50 {:.1} µs, p99 {:.1} µs, max {:.1} µs",
        micros.len(),
        percentile(&micros, 0.5),
        percentile(&micros, 0.99),
        micros.last().copied().unwrap_or(0.0)
    );
    Ok(())
}
