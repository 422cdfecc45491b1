//! What the default extractor learns end to end, on both backends: a correction typed after an
//! interrupted turn (with that turn as context), a lesson restated in another session reinforcing
//! the experience (and a learned rule its Memory entry) instead of adding a copy (also when two
//! restatements settle at once), and automatic recall refusing weak matches while
//! finding a Chinese lesson for a Chinese follow-up.

use zuno_shared::config::Config;
use zuno_shared::learning::experience;
use zuno_shared::learning::extraction::{ExperienceKind, MemoryAction};
use zuno_shared::learning::retrieval::{self, PromptContext};
use zuno_shared::learning::validate::{CheckedCitation, ValidExperience, ValidatedExtraction};
use zuno_shared::memory::service::{Origin, Proposal};
use zuno_shared::memory::store::{self, Scope};
use zuno_shared::transcript::{MessageStatus, NewMessage, Part, Role, ToolStatus};
use zuno_tests::{TestDb, on_both_backends};

use crate::harness::{World, text, tool};

async fn context(world: &World, session: &str, prompt: &str) -> PromptContext {
    world.context(session, prompt).await
}

async fn assistant_with_status(
    world: &World,
    session: &str,
    status: MessageStatus,
    parts: Vec<Part>,
) {
    world
        .ingestion
        .append_message(
            session,
            &NewMessage {
                id: None,
                role: Role::Assistant,
                status: Some(status),
                parts,
                created_at: None,
            },
            None,
        )
        .await
        .unwrap();
}

async fn a_correction_after_an_interrupted_turn_is_learned_with_that_turn_as_context(db: TestDb) {
    let world = World::new(db, Config::default()).await;
    let session = world.session().await;
    world.user(&session, "make the dark highlight softer").await;
    // The user rejected the edit and interrupted the turn.
    assistant_with_status(
        &world,
        &session,
        MessageStatus::Failed,
        vec![tool(
            "edit",
            r#"{"file_path":"src/themes/base.css","new":"background: #f2d96b"}"#,
            "The user doesn't want to proceed with this tool use. The tool use was rejected.",
            ToolStatus::Error,
        )],
    )
    .await;
    world
        .user(&session, "No, never hard-code colours in base.css; change the --highlight-bg variable of the theme.")
        .await;
    let closed = world
        .assistant(
            &session,
            vec![
                tool(
                    "edit",
                    r#"{"file_path":"src/themes/dark.css"}"#,
                    "Applied",
                    ToolStatus::Completed,
                ),
                text("Changed --highlight-bg in dark.css."),
            ],
        )
        .await;
    assert_eq!(
        closed
            .admission
            .expect("the correcting turn is admitted")
            .outcome(),
        "queued"
    );
    assert_eq!(world.run_extract().await.completed, 1);
    let learned = experience::for_session(&world.db.db, &session)
        .await
        .unwrap();
    let summaries: Vec<&str> = learned.iter().map(|e| e.summary.as_str()).collect();
    assert_eq!(
        summaries,
        ["Never hard-code colours in base.css; change the --highlight-bg variable of the theme."]
    );
    assert!(
        learned[0].keywords.iter().any(|k| k.contains("highlight")),
        "{:?}",
        learned[0].keywords
    );
    // The interrupted turn was bound as read-only context, and is nothing the extractor cites.
    assert!(
        world
            .scalar("SELECT COUNT(*) FROM learning_source_record WHERE context = TRUE")
            .await
            >= 2
    );
    assert_eq!(
        world
            .scalar(
                "SELECT COUNT(*) FROM learning_source_snapshot WHERE context_start_seq IS NOT NULL"
            )
            .await,
        1
    );

    // A turn left in progress (the host never closed it) does not block the next one either.
    let other = world.session().await;
    world.user(&other, "run the migrations").await;
    assistant_with_status(
        &world,
        &other,
        MessageStatus::InProgress,
        vec![tool(
            "bash",
            r#"{"command":"make migrate"}"#,
            "",
            ToolStatus::Pending,
        )],
    )
    .await;
    world
        .user(&other, "Stop. Never run migrations against prod from here.")
        .await;
    let closed = world
        .assistant(
            &other,
            vec![tool(
                "bash",
                r#"{"command":"make migrate ENV=staging"}"#,
                "ok",
                ToolStatus::Completed,
            )],
        )
        .await;
    assert!(closed.eligibility.unwrap().eligible);
    assert_eq!(world.run_extract().await.completed, 1);
    let learned = experience::for_session(&world.db.db, &other).await.unwrap();
    assert_eq!(
        learned[0].summary,
        "Never run migrations against prod from here."
    );
}

async fn a_learned_rule_that_restates_a_memory_entry_reinforces_it(db: TestDb) {
    let world = World::new(db, Config::default()).await;
    let home = tempfile::tempdir().unwrap();
    let memory = world.memory(home.path());
    // The user wrote the rule into project Memory themselves.
    memory
        .propose(Proposal {
            scope: Scope::Project,
            project_id: Some("proj".into()),
            action: MemoryAction::Add,
            content: Some("Always run cargo fmt before committing.".into()),
            old_text: None,
            expected_revision: None,
            reason: String::from("the user's own rule"),
            confidence: 1.0,
            origin: Origin::User,
            evidence: Vec::new(),
            explicit_user_evidence: true,
            job_id: None,
        })
        .await
        .unwrap();
    // Later a session says it again, in other words.
    let session = world.session().await;
    world
        .user(
            &session,
            "From now on, always run cargo fmt before you commit.",
        )
        .await;
    world
        .assistant(
            &session,
            vec![tool(
                "bash",
                r#"{"command":"cargo fmt"}"#,
                "",
                ToolStatus::Completed,
            )],
        )
        .await;
    assert_eq!(world.run_extract().await.completed, 1);
    assert_eq!(world.run_maintain(&memory).await.completed, 1);
    let entries = store::supported_entries(&world.db.db, "proj")
        .await
        .unwrap();
    assert_eq!(entries.len(), 1, "{entries:?}");
    assert_eq!(
        entries[0].entry.content,
        "Always run cargo fmt before committing."
    );
    assert_eq!(entries[0].entry.owner, "user");
    assert_eq!(
        entries[0].experience_ids.len(),
        1,
        "the learned lesson joined the entry's support"
    );
    assert_eq!(
        world
            .scalar("SELECT MAX(revision) FROM memory_document WHERE scope = 'project'")
            .await,
        1,
        "reinforcing is not a change of the document"
    );
    let result: String = zuno_shared::on_db!(world.db.db, |pool| sqlx::query_scalar(
        "SELECT result FROM learning_job WHERE kind = 'maintain'"
    )
    .fetch_one(pool)
    .await)
    .unwrap();
    assert!(result.contains("\"reinforced\":[{"), "{result}");
}

async fn a_lesson_restated_in_another_session_reinforces_the_experience(db: TestDb) {
    let world = World::new(db, Config::default()).await;
    for statement in ["No, use pnpm, not npm.", "Use pnpm instead of npm!"] {
        pnpm_turn(&world, statement).await;
        assert_eq!(world.run_extract().await.completed, 1);
    }
    let (experiences, _) = experience::list(&world.db.db, "proj", 0, 100)
        .await
        .unwrap();
    assert_eq!(experiences.len(), 1, "{experiences:?}");
    let kept = &experiences[0];
    assert_eq!(kept.summary, "Use pnpm, not npm.");
    let excerpts: Vec<&str> = kept.evidence.iter().map(|e| e.excerpt.as_str()).collect();
    assert_eq!(
        excerpts,
        ["No, use pnpm, not npm.", "Use pnpm instead of npm!"]
    );
    assert!(kept.evidence.iter().all(|e| e.verified));
    assert_eq!(
        world
            .scalar("SELECT reinforcements FROM experience_record")
            .await,
        1,
        "the restatement reinforced the lesson"
    );
    assert_eq!(
        world
            .scalar("SELECT COUNT(*) FROM experience_evidence WHERE job_id IS NOT NULL")
            .await,
        1,
        "the new citation points into its own job's manifest"
    );
}

/// Two jobs restating one lesson settle at the same time, the second while the first's
/// transaction is still open: both citations are kept and both reinforcements count. (The next
/// ordinal used to be read before the record was locked, so on Postgres both picked the same
/// one and the second citation was dropped as a conflict.)
async fn concurrent_restatements_keep_every_citation(db: TestDb) {
    let world = World::new(db, Config::default()).await;
    pnpm_turn(&world, "No, use pnpm, not npm.").await;
    assert_eq!(world.run_extract().await.completed, 1);
    let mut restating = Vec::new();
    for statement in ["Use pnpm instead of npm!", "Use pnpm, never npm."] {
        let session = pnpm_turn(&world, statement).await;
        let job: String = zuno_shared::on_db!(world.db.db, |pool| sqlx::query_scalar(
            "SELECT id FROM learning_job WHERE kind = 'extract' AND session_id = $1"
        )
        .bind(&session)
        .fetch_one(pool)
        .await)
        .unwrap();
        restating.push((job, session, restatement(statement)));
    }
    let store = |db: zuno_shared::db::Db,
                 (job, session, validated): (String, String, ValidatedExtraction)| async move {
        let mut tx = db.begin().await.unwrap();
        let stored = experience::insert_extraction_in(
            &mut tx, &job, "proj", &session, "test", &validated, 1,
        )
        .await
        .unwrap();
        (tx, stored)
    };
    let mut restating = restating.into_iter();
    let (open, stored) = store(world.db.db.clone(), restating.next().unwrap()).await;
    assert_eq!(stored.reinforced.len(), 1, "{stored:?}");
    let second = {
        let db = world.db.reopen().await;
        let job = restating.next().unwrap();
        tokio::spawn(async move {
            let (tx, stored) = store(db, job).await;
            tx.commit().await.unwrap();
            stored
        })
    };
    if world.db.backend == zuno_shared::db::Backend::Postgres {
        // The second job is inside its settlement and waits for the first one's transaction.
        // (SQLite queues it at BEGIN IMMEDIATE instead.)
        zuno_tests::until_a_session_waits_on_a_lock(&world.db.db, "the second settlement").await;
    }
    open.commit().await.unwrap();
    let stored = second.await.unwrap();
    assert_eq!(stored.reinforced.len(), 1, "{stored:?}");

    let (experiences, _) = experience::list(&world.db.db, "proj", 0, 100)
        .await
        .unwrap();
    assert_eq!(experiences.len(), 1, "{experiences:?}");
    let excerpts: Vec<&str> = experiences[0]
        .evidence
        .iter()
        .map(|e| e.excerpt.as_str())
        .collect();
    assert_eq!(
        excerpts,
        [
            "No, use pnpm, not npm.",
            "Use pnpm instead of npm!",
            "Use pnpm, never npm."
        ]
    );
    assert_eq!(
        world
            .scalar("SELECT reinforcements FROM experience_record")
            .await,
        2
    );
}

/// A new session whose user says `statement` and whose assistant then runs `pnpm install`.
async fn pnpm_turn(world: &World, statement: &str) -> String {
    let session = world.session().await;
    world.user(&session, statement).await;
    world
        .assistant(
            &session,
            vec![tool(
                "bash",
                r#"{"command":"pnpm install"}"#,
                "ok",
                ToolStatus::Completed,
            )],
        )
        .await;
    session
}

/// What a job's validation accepts for a user's restatement of the pnpm lesson.
fn restatement(statement: &str) -> ValidatedExtraction {
    ValidatedExtraction {
        experiences: vec![ValidExperience {
            ordinal: 0,
            kind: ExperienceKind::Correction,
            title: "Use pnpm".to_owned(),
            summary: "Use pnpm, not npm.".to_owned(),
            resolution: None,
            confidence: 0.9,
            citations: vec![CheckedCitation {
                source_id: "S1".to_owned(),
                excerpt: statement.to_owned(),
                verified: true,
                address: None,
                message_id: None,
                raw_digest: None,
                redacted_digest: None,
                detail: None,
            }],
            verified: true,
            keywords: vec!["pnpm".to_owned()],
        }],
        hints: Vec::new(),
        refused_items: Vec::new(),
        truncated: 0,
    }
}

async fn recall_refuses_weak_matches_and_finds_chinese_lessons(db: TestDb) {
    let world = World::new(db, Config::default()).await;
    for statement in [
        "Never run the migrations against the prod database.",
        "日期统一用 dayjs 格式化，格式是 YYYY-MM-DD HH:mm，不要用 moment。",
        "Don't add comments to every line of a file.",
    ] {
        let session = world.session().await;
        world.user(&session, statement).await;
        world
            .assistant(
                &session,
                vec![tool(
                    "bash",
                    r#"{"command":"ls"}"#,
                    "README.md",
                    ToolStatus::Completed,
                )],
            )
            .await;
    }
    assert_eq!(world.run_extract().await.completed, 3);
    let learned: Vec<(String, String)> = zuno_shared::on_db!(world.db.db, |pool| sqlx::query_as(
        "SELECT id, summary FROM experience_record ORDER BY summary"
    )
    .fetch_all(pool)
    .await)
    .unwrap();
    assert_eq!(learned.len(), 3, "{learned:?}");
    let id_of = |needle: &str| {
        learned
            .iter()
            .find(|(_, s)| s.contains(needle))
            .unwrap()
            .0
            .clone()
    };
    let next = world.session().await;

    let related = context(&world, &next, "run the migrations on staging first").await;
    assert_eq!(related.experience_ids, [id_of("migrations")]);
    // Only generic words in common ("add", "file", "fix"): nothing rides along.
    let generic = context(&world, &next, "fix the typo in that file and add a newline").await;
    assert!(
        generic.experience_ids.is_empty(),
        "{:?}",
        generic.experience_ids
    );
    let chinese = context(&world, &next, "订单列表的日期格式化一下").await;
    assert_eq!(chinese.experience_ids, [id_of("dayjs")]);
    let unrelated = context(&world, &next, "帮我看看这个问题").await;
    assert!(
        unrelated.experience_ids.is_empty(),
        "{:?}",
        unrelated.experience_ids
    );
    // Explicit search has no floor: a single generic word still finds what contains it.
    let searched = retrieval::search(
        &world.db.db,
        "proj",
        "file",
        10,
        zuno_shared::learning::recall::search_terms::MatchMode::Any,
        world.ledger.now_ms(),
    )
    .await
    .unwrap();
    assert_eq!(searched.len(), 1);
}

on_both_backends!(
    a_correction_after_an_interrupted_turn_is_learned_with_that_turn_as_context,
    a_learned_rule_that_restates_a_memory_entry_reinforces_it,
    a_lesson_restated_in_another_session_reinforces_the_experience,
    concurrent_restatements_keep_every_citation,
    recall_refuses_weak_matches_and_finds_chinese_lessons,
);
