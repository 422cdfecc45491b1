//! The transcript parsers on hand-written fixtures and on the real corpus.

use std::io::Cursor;

use zuno_shared::transcript::import::{self, Host, Position, project_for_cwd, session_id_for};
use zuno_shared::transcript::{MessageStatus, Part, Role, ToolStatus};

use crate::fixtures::*;

fn parse(host: Host, lines: &[String]) -> import::Parsed {
    let mut text = lines.join("\n");
    text.push('\n');
    import::parse(host, Cursor::new(text.into_bytes()), Position::default()).unwrap()
}

/// Each message's role and status, in order.
fn shape(session: &import::ImportedSession) -> Vec<(Role, MessageStatus)> {
    session
        .messages
        .iter()
        .map(|m| (m.role, m.status))
        .collect()
}

fn tool_calls(parts: &[Part]) -> Vec<(&str, ToolStatus, Option<&str>)> {
    parts
        .iter()
        .filter_map(|part| match part {
            Part::ToolCall {
                tool_name,
                status,
                result,
                ..
            } => Some((tool_name.as_str(), *status, result.as_deref())),
            _ => None,
        })
        .collect()
}

#[test]
fn claude_code_turns_tool_results_errors_and_a_malformed_line() {
    let mut lines = claude_code_lines();
    lines.extend(claude_code_second_turn());
    let parsed = parse(Host::ClaudeCode, &lines);
    assert_eq!(parsed.lines, lines.len() as u64);
    assert_eq!(parsed.issues.len(), 1, "{:?}", parsed.issues);
    assert_eq!(parsed.issues[0].line, 6, "the malformed line is named");
    assert!(parsed.issues[0].reason.contains("malformed JSON"));
    assert_eq!(parsed.sessions.len(), 1);
    let session = &parsed.sessions[0];
    assert_eq!(session.external_ref, CC_SESSION);
    assert_eq!(session.cwd.as_deref(), Some(CWD));
    assert_eq!(session.title.as_deref(), Some("Install the dependencies"));
    assert_eq!(
        shape(session),
        vec![
            (Role::User, MessageStatus::Completed),
            (Role::Assistant, MessageStatus::Completed),
            (Role::User, MessageStatus::Completed),
            (Role::User, MessageStatus::Completed),
            (Role::Assistant, MessageStatus::Completed),
        ]
    );
    let starts: Vec<u64> = session.messages.iter().map(|m| m.line).collect();
    assert_eq!(
        starts,
        [2, 4, 11, 12, 13],
        "each message starts at the JSON line of the record that opened it"
    );
    let first = &session.messages[1];
    assert_eq!(
        first.key, "a2",
        "the turn is keyed by its first assistant record with content"
    );
    assert_eq!(
        tool_calls(&first.parts),
        vec![
            (
                "Bash",
                ToolStatus::Error,
                Some("Exit code 1\nnpm ERR! missing lockfile")
            ),
            ("Bash", ToolStatus::Completed, Some("Done in 2.1s")),
        ]
    );
    assert!(
        first
            .parts
            .iter()
            .any(|p| matches!(p, Part::Text { text, .. } if text.contains("after npm failed")))
    );
    assert_eq!(first.created_at, Some(1_770_757_918_000));
    // The local-command output is Claude Code's own injection, never a human correction.
    assert!(matches!(
        &session.messages[2].parts[0],
        Part::Text { injected: true, .. }
    ));
    assert!(matches!(
        &session.messages[3].parts[0],
        Part::Text { injected: false, text } if text.starts_with("No, don't use npm")
    ));
    // Keys, hence message ids, are stable.
    let again = parse(Host::ClaudeCode, &lines);
    let sid = session.session_id();
    assert_eq!(sid, format!("cc-{CC_SESSION}"));
    assert_eq!(
        again.sessions[0].messages[4].message_id(&sid),
        session.messages[4].message_id(&sid)
    );
}

#[test]
fn claude_code_sidechains_become_child_sessions() {
    let mut lines = claude_code_lines();
    lines.extend(claude_code_sidechain());
    let parsed = parse(Host::ClaudeCode, &lines);
    assert_eq!(parsed.sessions.len(), 2);
    let child = parsed
        .sessions
        .iter()
        .find(|s| s.parent_ref.is_some())
        .expect("sidechain session");
    assert_eq!(child.external_ref, format!("{CC_SESSION}/agent-a881341"));
    assert_eq!(child.parent_session_id(), Some(format!("cc-{CC_SESSION}")));
    assert_eq!(child.messages.len(), 2);
    assert_eq!(
        tool_calls(&child.messages[1].parts),
        vec![("Glob", ToolStatus::Completed, Some("pnpm-lock.yaml"))]
    );
}

#[test]
fn a_partial_last_line_is_left_for_the_next_pass() {
    let lines = claude_code_lines();
    let mut text = lines.join("\n");
    text.push('\n');
    let complete = text.len() as u64;
    text.push_str("{\"type\":\"user\",\"message\":");
    let parsed = import::parse(
        Host::ClaudeCode,
        Cursor::new(text.clone().into_bytes()),
        Position::default(),
    )
    .unwrap();
    assert_eq!(parsed.consumed_bytes, complete);
    assert_eq!(
        parsed.issues.len(),
        1,
        "only the malformed line 6: {:?}",
        parsed.issues
    );
    // Resuming from the watermark reads only what follows it.
    let mut more = text.as_bytes()[..complete as usize].to_vec();
    let appended = claude_code_second_turn().join("\n") + "\n";
    more.extend_from_slice(appended.as_bytes());
    let mut reader = Cursor::new(more);
    reader.set_position(complete);
    let next = import::parse(
        Host::ClaudeCode,
        reader,
        Position {
            offset: complete,
            line: parsed.lines,
        },
    )
    .unwrap();
    assert!(next.issues.is_empty(), "{:?}", next.issues);
    let messages = &next.sessions[0].messages;
    assert_eq!(messages.len(), 2);
    assert_eq!(messages[0].key, "u2");
    assert_eq!(messages[1].key, "a5");
    assert_eq!(
        (messages[0].line, messages[1].line),
        (12, 13),
        "lines count on from the watermark"
    );
}

#[test]
fn codex_turns_exit_codes_custom_tools_aborts_and_a_malformed_line() {
    let lines = codex_lines();
    let parsed = parse(Host::Codex, &lines);
    assert_eq!(parsed.issues.len(), 1, "{:?}", parsed.issues);
    assert_eq!(parsed.issues[0].line, 5);
    let session = &parsed.sessions[0];
    assert_eq!(session.session_id(), format!("cx-{CODEX_SESSION}"));
    assert_eq!(session.cwd.as_deref(), Some("/home/someone/src/chess"));
    assert_eq!(session.title.as_deref(), Some("Run the tests"));
    assert_eq!(
        shape(session),
        vec![
            (Role::User, MessageStatus::Completed),
            (Role::Assistant, MessageStatus::Completed),
            (Role::User, MessageStatus::Completed),
            (Role::Assistant, MessageStatus::Completed),
            (Role::User, MessageStatus::Completed),
            (Role::Assistant, MessageStatus::Failed),
        ]
    );
    let starts: Vec<u64> = session.messages.iter().map(|m| m.line).collect();
    assert_eq!(starts, [3, 6, 12, 13, 15, 16]);
    let calls = tool_calls(&session.messages[1].parts);
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[0].1, ToolStatus::Error, "Exit code: 101 is a failure");
    assert_eq!(calls[1].1, ToolStatus::Completed);
    let Part::ToolCall { arguments, .. } = &session.messages[1].parts[0] else {
        panic!("tool call first")
    };
    assert_eq!(
        arguments["command"][0], "cargo",
        "arguments are parsed JSON"
    );
    assert_eq!(
        tool_calls(&session.messages[3].parts),
        vec![(
            "apply_patch",
            ToolStatus::Completed,
            Some("Success. Updated the following files:\nM README.md")
        )]
    );
}

#[test]
fn the_real_claude_code_corpus_parses_without_losing_records() {
    let root = corpus().join("claude-code-jsonl");
    let mut files = Vec::new();
    let mut pending = vec![root];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).expect("corpus present") {
            let path = entry.unwrap().path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|e| e == "jsonl")
                && !path.ends_with("sample_hook_logs.jsonl")
            {
                files.push(path);
            }
        }
    }
    assert!(files.len() >= 9, "{files:?}");
    let mut assistant_turns = 0;
    let mut tool_calls_seen = 0;
    let mut errors_seen = 0;
    let mut sidechains = 0;
    for file in &files {
        let reader = std::io::BufReader::new(std::fs::File::open(file).unwrap());
        let parsed = import::parse(Host::ClaudeCode, reader, Position::default()).unwrap();
        assert!(
            parsed.issues.is_empty(),
            "{}: {:?}",
            file.display(),
            parsed.issues
        );
        assert_eq!(
            parsed.consumed_bytes,
            std::fs::metadata(file).unwrap().len(),
            "{}",
            file.display()
        );
        assert!(!parsed.sessions.is_empty(), "{}", file.display());
        for session in &parsed.sessions {
            sidechains += usize::from(session.parent_ref.is_some());
            assert!(
                zuno_shared::ids::is_valid_external_id(&session.session_id()),
                "{}",
                session.session_id()
            );
            for message in &session.messages {
                assert!(message.parts.len() <= 512);
                if message.role == Role::Assistant {
                    assistant_turns += 1;
                    for (_, status, _) in tool_calls(&message.parts) {
                        tool_calls_seen += 1;
                        errors_seen += usize::from(status == ToolStatus::Error);
                    }
                }
            }
        }
    }
    assert!(assistant_turns > 20, "{assistant_turns}");
    assert!(tool_calls_seen > 100, "{tool_calls_seen}");
    assert!(errors_seen > 0, "the corpus has failing tool calls");
    assert!(
        sidechains >= 2,
        "subagent and compaction sidechains: {sidechains}"
    );
}

#[test]
fn the_real_codex_rollout_parses_into_one_session_with_tool_calls() {
    let file = corpus()
        .join("codex-rollout")
        .join("rtchess-rollout-019aad50-a7e6-7422-b7a8-0b384290624f.jsonl");
    let reader = std::io::BufReader::new(std::fs::File::open(&file).unwrap());
    let parsed = import::parse(Host::Codex, reader, Position::default()).unwrap();
    assert!(parsed.issues.is_empty(), "{:?}", parsed.issues);
    assert_eq!(parsed.sessions.len(), 1);
    let session = &parsed.sessions[0];
    assert_eq!(session.external_ref, CODEX_SESSION);
    let users = session
        .messages
        .iter()
        .filter(|m| m.role == Role::User)
        .count();
    let calls: usize = session
        .messages
        .iter()
        .map(|m| tool_calls(&m.parts).len())
        .sum();
    assert!(users >= 5, "{users}");
    assert!(calls >= 50, "{calls}");
    assert!(session.messages.iter().all(|m| !m.parts.is_empty()));
    assert!(
        session
            .messages
            .iter()
            .filter(|m| m.role == Role::User)
            .all(|m| !m.parts[0]
                .text()
                .unwrap_or("")
                .starts_with("<environment_context>")),
        "injected context is not a prompt"
    );
}

#[test]
fn ids_from_untrusted_text_are_always_valid() {
    let id = session_id_for(Host::ClaudeCode, "../../etc/passwd; DROP TABLE session");
    assert!(zuno_shared::ids::is_valid_external_id(&id), "{id}");
    assert!(!id.contains(".."));
    let (project, name) = project_for_cwd("/home/x/my repo!");
    assert!(
        zuno_shared::ids::is_valid_external_id(&project),
        "{project}"
    );
    assert!(project.starts_with("myrepo-"), "{project}");
    assert_eq!(name, "my repo!");
    assert_ne!(project_for_cwd("/a/app").0, project_for_cwd("/b/app").0);
}

#[test]
fn a_claude_code_rewind_keeps_the_abandoned_branch_as_failed_context() {
    let parsed = parse(Host::ClaudeCode, &claude_code_rewind_lines());
    assert!(parsed.issues.is_empty(), "{:?}", parsed.issues);
    let session = &parsed.sessions[0];
    let shape: Vec<(&str, u64, Role, MessageStatus, bool)> = session
        .messages
        .iter()
        .map(|m| {
            (
                m.key.as_str(),
                m.line,
                m.role,
                m.status,
                m.parts.iter().all(Part::is_injected),
            )
        })
        .collect();
    assert_eq!(
        shape,
        vec![
            ("u1", 1, Role::User, MessageStatus::Completed, false),
            ("a1", 2, Role::Assistant, MessageStatus::Completed, false),
            // The abandoned branch, in file order: its turn did not happen (failed), and the
            // prompt nobody answered is not a prompt of the next turn.
            ("u2", 6, Role::User, MessageStatus::Completed, false),
            ("a3", 7, Role::Assistant, MessageStatus::Failed, false),
            ("u3", 10, Role::User, MessageStatus::Completed, true),
            // The branch the session continued on, with both parallel calls and results.
            ("u4", 11, Role::User, MessageStatus::Completed, false),
            ("a5", 12, Role::Assistant, MessageStatus::Completed, false),
        ]
    );
    assert_eq!(
        tool_calls(&session.messages[6].parts),
        vec![
            ("Bash", ToolStatus::Completed, Some("12 passed")),
            ("Bash", ToolStatus::Completed, Some("0 problems")),
        ]
    );
    assert_eq!(session.title.as_deref(), Some("Install the dependencies"));
}

#[test]
fn parallel_tool_calls_in_the_real_corpus_are_not_branches() {
    // tool_heavy.jsonl has a parallel call whose record and result hang off the chain (lines
    // 30 and 32): they stay in their turn, and nothing in the corpus is a rewind.
    for name in [
        "spotter/tool_heavy.jsonl",
        "spotter/subagent.jsonl",
        "spotter/258c7280-ae70-4798-800f-63464d01a85d.jsonl",
        "zh-claudecode-web/b.converted.jsonl",
    ] {
        let file = corpus().join("claude-code-jsonl").join(name);
        let reader = std::io::BufReader::new(std::fs::File::open(&file).unwrap());
        let parsed = import::parse(Host::ClaudeCode, reader, Position::default()).unwrap();
        for session in &parsed.sessions {
            assert!(
                session
                    .messages
                    .iter()
                    .all(|m| m.status != MessageStatus::Failed
                        || m.parts.iter().any(|p| matches!(p, Part::Error { .. }))
                        || session.messages.iter().any(|n| n.line > m.line
                            && n.role == Role::User
                            && n.parts.iter().any(|p| p
                                .text()
                                .is_some_and(|t| t.starts_with("[Request interrupted"))))),
                "{name}: a failed turn without an error or an interrupt"
            );
        }
    }
    let file = corpus().join("claude-code-jsonl/spotter/tool_heavy.jsonl");
    let reader = std::io::BufReader::new(std::fs::File::open(&file).unwrap());
    let parsed = import::parse(Host::ClaudeCode, reader, Position::default()).unwrap();
    let turn = parsed.sessions[0]
        .messages
        .iter()
        .find(|m| m.line == 27 || m.line == 29)
        .expect("the turn of line 26's prompt");
    let calls = tool_calls(&turn.parts);
    assert!(calls.len() >= 3, "{calls:?}");
    assert!(
        calls
            .iter()
            .all(|(_, status, _)| *status != ToolStatus::Pending),
        "both parallel calls got their results: {calls:?}"
    );
}

#[test]
fn compaction_summaries_in_the_real_corpus_stay_injected() {
    // Each file has a compact_boundary (a new root whose logicalParentUuid points back) followed
    // by the summary Claude Code wrote: the conversation continues across it, and the summary
    // is never a prompt.
    for (name, summary_line) in [
        ("spotter/258c7280-ae70-4798-800f-63464d01a85d.jsonl", 1257),
        ("fasthooks/sample_main_transcript.jsonl", 60),
    ] {
        let file = corpus().join("claude-code-jsonl").join(name);
        let reader = std::io::BufReader::new(std::fs::File::open(&file).unwrap());
        let parsed = import::parse(Host::ClaudeCode, reader, Position::default()).unwrap();
        let main = parsed
            .sessions
            .iter()
            .find(|s| s.parent_ref.is_none())
            .unwrap();
        let summary = main
            .messages
            .iter()
            .find(|m| m.line == summary_line)
            .unwrap_or_else(|| panic!("{name}: the summary at line {summary_line}"));
        assert_eq!(summary.role, Role::User);
        assert!(summary.parts.iter().all(Part::is_injected), "{name}");
        assert!(
            main.messages
                .iter()
                .filter(|m| m.role == Role::User && m.line < summary_line)
                .any(|m| !m.parts.iter().all(Part::is_injected)),
            "{name}: the prompts before the compaction are still prompts"
        );
    }
}
