use super::*;
use crate::learning::manifest::{FeedbackSource, build, build_with_context};
use crate::learning::validate::validate;
use crate::transcript::{Message, MessageStatus, Part, Role, ToolStatus};

fn message(id: &str, role: Role, status: MessageStatus, parts: Vec<Part>) -> Message {
    Message::sample(id, role, status, parts)
}

fn user(id: &str, text: &str) -> Message {
    message(
        id,
        Role::User,
        MessageStatus::Completed,
        vec![Part::Text {
            text: text.into(),
            injected: false,
        }],
    )
}

fn assistant(id: &str, parts: Vec<Part>) -> Message {
    message(id, Role::Assistant, MessageStatus::Completed, parts)
}

fn tool(name: &str, arguments: serde_json::Value, result: &str, status: ToolStatus) -> Part {
    Part::ToolCall {
        tool_name: name.into(),
        call_id: None,
        arguments,
        result: Some(result.into()),
        status,
        external_context: false,
        injected: false,
    }
}

fn bash(command: &str, result: &str, status: ToolStatus) -> Part {
    tool(
        "bash",
        serde_json::json!({ "command": command }),
        result,
        status,
    )
}

/// A user message followed by a completed assistant turn with one tool call.
fn probe(text: &str) -> SourceManifest {
    build(
        &[
            user("u1", text),
            assistant("a1", vec![bash("ls", "README.md", ToolStatus::Completed)]),
        ],
        None,
        131_072,
    )
}

fn summaries(output: &ExtractionOutput) -> Vec<&str> {
    output
        .experiences
        .iter()
        .map(|e| e.summary.as_str())
        .collect()
}

#[test]
fn the_seven_probes_of_the_issue() {
    for nothing in [
        "warning: comparison of unsigned expression in '>= 0' is always true [-Wtype-limits]",
        "No, don't worry about the flaky test for now.",
        "Should we always use pnpm here?",
        "程序出错了，帮我看看",
    ] {
        assert_eq!(
            extract(&probe(nothing)),
            ExtractionOutput::default(),
            "{nothing}"
        );
    }
    let yarn = extract(&probe("Use yarn instead."));
    assert_eq!(summaries(&yarn), ["Use yarn instead."]);
    assert_eq!(yarn.experiences[0].kind, ExperienceKind::Correction);
    assert!(
        yarn.memories.is_empty(),
        "a correction without a durable marker stays Experience"
    );

    let pnpm = extract(&probe("That\u{2019}s wrong \u{2014} it's pnpm."));
    assert_eq!(summaries(&pnpm), ["Use pnpm."]);
    assert_eq!(
        pnpm.experiences[0].citations[0].excerpt,
        "That\u{2019}s wrong \u{2014} it's pnpm."
    );
    assert!(pnpm.memories.is_empty());

    let never = extract(&probe("Never run migrations on prod."));
    assert_eq!(summaries(&never), ["Never run migrations on prod."]);
    assert_eq!(never.memories.len(), 1);
    assert_eq!(never.memories[0].target, MemoryTarget::Project);
    assert_eq!(
        never.memories[0].content.as_deref(),
        Some("Never run migrations on prod.")
    );
}

#[test]
fn a_user_wide_preference_goes_to_global_memory() {
    let output = extract(&probe(
        "以后都用中文回答，代码注释和 commit message 还是用英文",
    ));
    assert_eq!(output.memories.len(), 1);
    assert_eq!(output.memories[0].target, MemoryTarget::Global);
    assert_eq!(output.experiences[0].kind, ExperienceKind::Feedback);
    let project = extract(&probe("From now on run the tests with cargo nextest."));
    assert_eq!(project.memories[0].target, MemoryTarget::Project);
    assert_eq!(summaries(&project), ["Run the tests with cargo nextest."]);
}

#[test]
fn an_undo_names_what_the_previous_turn_changed() {
    let context = [
        user("u0", "make the highlight softer"),
        assistant(
            "a0",
            vec![
                tool(
                    "edit",
                    serde_json::json!({"file_path": "src/theme.css", "old": "a", "new": "b"}),
                    "ok",
                    ToolStatus::Completed,
                ),
                Part::Text {
                    text: "Softened it.".into(),
                    injected: false,
                },
            ],
        ),
    ];
    let window = [
        user("u1", "undo the last change it messed up the dark highlight"),
        assistant(
            "a1",
            vec![bash(
                "git checkout src/theme.css",
                "",
                ToolStatus::Completed,
            )],
        ),
    ];
    let manifest = build_with_context(&context, &window, None, 131_072);
    assert!(manifest.records.iter().take_while(|r| r.context).count() >= 3);
    let output = extract(&manifest);
    assert_eq!(
        summaries(&output),
        ["Don't repeat the edit to src/theme.css: it messed up the dark highlight."]
    );
    let cited: Vec<bool> = output.experiences[0]
        .citations
        .iter()
        .map(|c| manifest.record(&c.source_id).unwrap().context)
        .collect();
    assert_eq!(
        cited,
        [false, true],
        "the user's words, then the change they undo"
    );
    let valid = validate(&output, &manifest).unwrap();
    assert!(valid.experiences.iter().all(|e| e.verified));

    // Context is never a source of lessons by itself.
    let quiet = build_with_context(
        &[
            user("u0", "Never use npm."),
            assistant("a0", vec![bash("ls", "x", ToolStatus::Completed)]),
        ],
        &[
            user("u1", "list the files"),
            assistant("a1", vec![bash("ls", "x", ToolStatus::Completed)]),
        ],
        None,
        131_072,
    );
    assert_eq!(extract(&quiet), ExtractionOutput::default());

    // "revert that" with nothing to name and no reason teaches nothing.
    assert_eq!(extract(&probe("revert that")), ExtractionOutput::default());
}

#[test]
fn use_instead_names_the_replaced_tool_from_the_previous_turn() {
    let context = [
        user("u0", "install the dependencies"),
        assistant(
            "a0",
            vec![bash(
                "npm install",
                "added 120 packages",
                ToolStatus::Completed,
            )],
        ),
    ];
    let window = [
        user("u1", "Use yarn instead."),
        assistant(
            "a1",
            vec![bash("yarn install", "Done in 3.2s", ToolStatus::Completed)],
        ),
    ];
    let output = extract(&build_with_context(&context, &window, None, 131_072));
    assert_eq!(summaries(&output), ["Use yarn instead of npm."]);
}

#[test]
fn recovered_errors_need_a_real_failure_and_a_different_command() {
    let window = [
        user("u1", "run the script"),
        assistant(
            "a1",
            vec![
                bash(
                    "python fetch.py",
                    "Wall time: 0.1 seconds\nOutput:\nbash: python: command not found",
                    ToolStatus::Error,
                ),
                bash("python3 fetch.py", "fetched 12 rows", ToolStatus::Completed),
            ],
        ),
    ];
    let manifest = build(&window, None, 131_072);
    let output = extract(&manifest);
    assert_eq!(
        summaries(&output),
        [
            "Use `python3 fetch.py` instead of `python fetch.py`: `python fetch.py` failed with \"bash: python: command not found\"."
        ]
    );
    assert!(
        output.memories.is_empty(),
        "recoveries are evidence, not instructions"
    );
    assert!(validate(&output, &manifest).unwrap().experiences[0].verified);

    // A successful command with a header line is not an error; a retry of the same command
    // after a fix is not a recovery.
    let quiet = build(
        &[
            user("u1", "run it"),
            assistant(
                "a1",
                vec![
                    bash(
                        "cargo test",
                        "Wall time: 0.1 seconds\nOutput:\nok",
                        ToolStatus::Completed,
                    ),
                    bash(
                        "cargo build",
                        "error[E0382]: borrow of moved value",
                        ToolStatus::Error,
                    ),
                    bash("cargo build", "Finished", ToolStatus::Completed),
                ],
            ),
        ],
        None,
        131_072,
    );
    assert_eq!(extract(&quiet), ExtractionOutput::default());
}

#[test]
fn a_thumbs_down_note_is_a_learning_source() {
    let window = [
        user("u1", "summarize the release"),
        assistant(
            "a1",
            vec![Part::Text {
                text: "Here it is.".into(),
                injected: false,
            }],
        ),
    ];
    let feedback = FeedbackSource {
        message_id: "a1".into(),
        value: "negative".into(),
        note: Some("the summary dropped the migration step".into()),
        revision: 1,
    };
    let manifest = build(&window, Some(&feedback), 131_072);
    let output = extract(&manifest);
    assert_eq!(
        summaries(&output),
        ["The summary dropped the migration step."]
    );
    assert_eq!(output.experiences[0].kind, ExperienceKind::Feedback);
    assert!(validate(&output, &manifest).unwrap().experiences[0].verified);

    let positive = FeedbackSource {
        value: "positive".into(),
        ..feedback
    };
    assert_eq!(
        extract(&build(&window, Some(&positive), 131_072)),
        ExtractionOutput::default()
    );
}

#[test]
fn one_off_instructions_and_reads_are_not_lessons() {
    assert_eq!(
        extract(&probe("Don't apply the changes yet.")),
        ExtractionOutput::default()
    );
    assert_eq!(
        extract(&probe("Skip the e2e tests for now, never mind.")),
        ExtractionOutput::default()
    );
    // "be concise in the changes you make" is about code, not how to answer.
    let code = extract(&probe("Always be concise in the changes you make."));
    assert_eq!(code.memories[0].target, MemoryTarget::Project);
    let reply = extract(&probe("Be concise."));
    assert_eq!(reply.memories[0].target, MemoryTarget::Global);
    // An undo names the last change, not a read or a syntax check after it.
    let context = [
        user("u0", "highlight the cooldown"),
        assistant(
            "a0",
            vec![
                tool(
                    "apply_patch",
                    serde_json::json!({"input": "*** Begin Patch\n*** Update File: app.js\n@@\n-a\n+b\n*** End Patch"}),
                    "Success",
                    ToolStatus::Completed,
                ),
                bash("node --check app.js", "", ToolStatus::Completed),
                tool(
                    "read",
                    serde_json::json!({"path": "styles.css"}),
                    "body {}",
                    ToolStatus::Completed,
                ),
            ],
        ),
    ];
    let window = [
        user("u1", "undo the last change, it broke the dark highlight"),
        assistant(
            "a1",
            vec![bash("git checkout app.js", "", ToolStatus::Completed)],
        ),
    ];
    let output = extract(&build_with_context(&context, &window, None, 131_072));
    assert_eq!(
        summaries(&output),
        ["Don't repeat the edit to app.js: it broke the dark highlight."]
    );
}

#[test]
fn the_reason_is_kept_and_markers_stripped() {
    let output = extract(&probe(
        "No, use pnpm instead of npm, because the lockfile is pnpm-lock.yaml.",
    ));
    assert_eq!(
        summaries(&output),
        ["Use pnpm instead of npm, because the lockfile is pnpm-lock.yaml."]
    );
    assert_eq!(
        output.experiences[0].citations[0].excerpt,
        "No, use pnpm instead of npm, because the lockfile is pnpm-lock.yaml."
    );
}

fn varied_manifests() -> Vec<SourceManifest> {
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
        "“",
        "’",
        "```",
        "> ",
        "    ",
        "warning:",
        "never",
        "always",
        "instead of",
        ", not ",
        "undo that",
        "错了",
        "ＰＮＰＭ",
        "İ",
        "\u{212A}",
    ];
    let mut manifests = Vec::new();
    let mut seed: u64 = 0x853c_49e6_748f_ea9b;
    for n in 0..300 {
        let mut body = String::new();
        for _ in 0..(1 + n % 14) {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            body.push_str(pieces[(seed % pieces.len() as u64) as usize]);
        }
        manifests.push(build_with_context(
            &[
                user("u0", &body),
                assistant("a0", vec![bash(&body, &body, ToolStatus::Completed)]),
            ],
            &[
                user("u1", &body),
                assistant(
                    "a1",
                    vec![
                        bash(&body, &body, ToolStatus::Error),
                        bash("x y", &body, ToolStatus::Completed),
                    ],
                ),
                user("u2", &body),
            ],
            None,
            131_072,
        ));
    }
    manifests
}

#[test]
fn every_citation_is_exact_and_every_answer_validates() {
    let mut experiences = 0;
    for manifest in varied_manifests() {
        let output = extract(&manifest);
        assert_eq!(output, extract(&manifest), "deterministic");
        assert!(output.experiences.len() <= MAX_EXPERIENCES);
        for experience in &output.experiences {
            experiences += 1;
            assert!(!experience.summary.trim().is_empty());
            assert!(experience.title.len() <= TITLE_BYTES + 3);
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
        }
        let valid = validate(&output, &manifest).expect("a rules answer never fails the whole job");
        assert!(valid.refused_items.is_empty());
        for hint in &output.memories {
            let experience = &output.experiences[hint.experience_ordinal as usize];
            assert_ne!(experience.kind, ExperienceKind::Problem);
            assert_eq!(hint.content.as_deref(), Some(experience.summary.as_str()));
        }
    }
    assert!(
        experiences > 50,
        "the property ran on {experiences} experiences"
    );
}
