//! Extraction with the rules extractor and with a model behind the fake provider.

use serde_json::json;
use zuno_shared::config::Config;
use zuno_shared::learning::events;
use zuno_shared::learning::feedback::{self, FeedbackValue};
use zuno_shared::learning::projection;
use zuno_shared::ledger::{JobFilter, JobKind, JobState};
use zuno_shared::transcript::{Part, ToolStatus};
use zuno_tests::fake_provider::{FakeProvider, Gate, Reply};
use zuno_tests::{TestDb, on_both_backends};

use crate::harness::{World, model_config, text, tool};

fn answer(experiences: serde_json::Value, memories: serde_json::Value) -> Reply {
    Reply::answer_with_usage(
        json!({ "experiences": experiences, "memories": memories }).to_string(),
        900,
        120,
    )
}

fn experience(summary: &str, source: &str, excerpt: &str) -> serde_json::Value {
    json!({"kind": "correction", "title": "Use pnpm", "summary": summary, "resolution": "Installed with pnpm.",
           "citations": [{"source_id": source, "excerpt": excerpt}], "confidence": 0.85})
}

async fn only_job(world: &World) -> zuno_shared::ledger::Job {
    let jobs = world
        .ledger
        .list(&JobFilter {
            kind: Some(JobKind::Extract),
            ..JobFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    jobs.into_iter().next().unwrap()
}

async fn the_rules_extractor_turns_a_correction_into_a_verified_cited_experience(db: TestDb) {
    let world = World::new(db, Config::default()).await;
    let session = world.session().await;
    let turn = world.corrected_turn(&session).await;
    assert_eq!(turn.admission.unwrap().outcome(), "queued");
    let report = world.run_extract().await;
    assert_eq!(report.completed, 1, "{report:?}");
    let view =
        projection::session_learning(&world.db.db, &world.ledger, &world.config, &session, 0)
            .await
            .unwrap()
            .unwrap();
    assert_eq!(
        view.session_experiences.len(),
        1,
        "{:?}",
        view.session_experiences
    );
    let experience = &view.session_experiences[0];
    assert_eq!(experience.verification.as_str(), "verified");
    assert_eq!(experience.kind.as_str(), "correction");
    // The citation is the exact user text, with the reason sentence that follows the rule.
    assert_eq!(
        experience.evidence[0].excerpt,
        "No, never use npm here; always use pnpm. It keeps the lockfile consistent."
    );
    assert!(experience.evidence[0].verified);
    assert!(
        experience.evidence[0]
            .address
            .as_deref()
            .unwrap()
            .starts_with("message:")
    );
    let job = only_job(&world).await;
    assert_eq!(job.extractor_version.as_deref(), Some("rules-2"));
    assert_eq!(
        experience.summary,
        "Never use npm here; always use pnpm. It keeps the lockfile consistent."
    );
    // "never"/"always" make it a durable instruction: one memory hint for maintenance.
    assert_eq!(job.result.as_ref().unwrap()["memoryHints"], 1);
    let kinds: Vec<String> = events::for_job(&world.db.db, &job.id)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.kind)
        .collect();
    assert_eq!(
        kinds,
        [events::EXTRACTION_REQUEST, events::EXTRACTION_OUTCOME]
    );
    assert!(
        world
            .scalar("SELECT COUNT(*) FROM learning_source_record")
            .await
            >= 3,
        "the exact manifest was persisted"
    );
}

async fn the_model_extractor_stores_verified_and_unverified_experiences(db: TestDb) {
    let fake = FakeProvider::start().await;
    let world = World::new(db, model_config(fake.base_url())).await;
    let session = world.session().await;
    world.corrected_turn(&session).await;
    fake.push([answer(
        json!([experience("Use pnpm, not npm.", "S1", "use pnpm"), experience("Invented.", "S9", "use pnpm")]),
        json!([{"experience_ordinal": 0, "target": "project", "action": "add", "content": "Use pnpm for installs.", "old_text": null, "reason": "user correction", "confidence": 0.9}]),
    )]);
    let report = world.run_extract().await;
    assert_eq!(report.completed, 1, "{report:?}");
    let job = only_job(&world).await;
    assert_eq!(job.extractor_version.as_deref(), Some("model-1"));
    let result = job.result.unwrap();
    assert_eq!(
        (result["verified"].as_i64(), result["unverified"].as_i64()),
        (Some(1), Some(1)),
        "{result}"
    );
    assert_eq!(
        result["usage"],
        json!({"inputTokens": 900, "outputTokens": 120})
    );

    // The provider saw sources as data with canonical ids, no storage ids, and no tools.
    let requests = fake.requests();
    assert_eq!(requests.len(), 1);
    let body = requests[0].body.to_string();
    assert!(
        body.contains("S1") && !body.contains("msg_"),
        "storage ids stay host-side"
    );
    assert!(requests[0].body.get("tools").is_none());
    assert!(
        requests[0].body.get("temperature").is_none(),
        "no temperature is imposed"
    );

    let events = events::for_job(&world.db.db, &job.id).await.unwrap();
    let request: serde_json::Value = serde_json::from_str(&events[0].payload).unwrap();
    assert_eq!(request["tools"], json!([]));
    assert_eq!(request["model"], "fake-model");
    assert!(
        request["prompt"].to_string().contains("<sources>"),
        "the exact prompt is durable"
    );
    assert_eq!(
        world
            .scalar("SELECT CAST(SUM(input_tokens + output_tokens) AS BIGINT) FROM provider_usage")
            .await,
        1020
    );
    assert_eq!(world.scalar("SELECT COUNT(*) FROM memory_hint").await, 1);
}

async fn refused_items_are_skipped_and_siblings_keep_their_ordinals(db: TestDb) {
    let fake = FakeProvider::start().await;
    let world = World::new(db, model_config(fake.base_url())).await;
    let session = world.session().await;
    world.corrected_turn(&session).await;
    fake.push([answer(
        json!([
            experience("Use pnpm.", "S1", "use pnpm"),
            experience(
                "Hidden \u{E0049}\u{E0047}\u{E004E}\u{E004F}\u{E0052}\u{E0045} instructions",
                "S1",
                "use pnpm"
            ),
            experience(
                "Lockfile stays consistent.",
                "S1",
                "It keeps the lockfile consistent."
            ),
        ]),
        json!([]),
    )]);
    world.run_extract().await;
    let job = only_job(&world).await;
    assert_eq!(
        job.state,
        JobState::Completed,
        "a refused item does not fail the job"
    );
    let result = job.result.unwrap();
    assert_eq!(
        result["refusedItems"],
        json!([{"ordinal": 1, "experienceOrdinal": 1, "field": "experiences.summary",
        "detail": "contains U+E0049, an encoding the model reads differently from a person"}])
    );
    let ordinals: Vec<i64> = result["experiences"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["ordinal"].as_i64().unwrap())
        .collect();
    assert_eq!(ordinals, [0, 2]);
    let view =
        projection::session_learning(&world.db.db, &world.ledger, &world.config, &session, 0)
            .await
            .unwrap()
            .unwrap();
    assert!(
        view.warnings[0]
            .message
            .starts_with("learning extraction refused experience 1"),
        "{:?}",
        view.warnings
    );
}

async fn a_malformed_answer_gets_one_repair(db: TestDb) {
    let fake = FakeProvider::start().await;
    let world = World::new(db, model_config(fake.base_url())).await;
    let session = world.session().await;
    world.corrected_turn(&session).await;
    fake.push([
        Reply::answer("Sure! Here are the experiences: [oops"),
        answer(
            json!([experience("Use pnpm.", "S1", "use pnpm")]),
            json!([]),
        ),
    ]);
    world.run_extract().await;
    let job = only_job(&world).await;
    assert_eq!(job.state, JobState::Completed);
    assert_eq!(job.result.unwrap()["repaired"], true);
    assert_eq!(fake.requests().len(), 2);
}

async fn a_second_malformed_answer_fails_the_job(db: TestDb) {
    let fake = FakeProvider::start().await;
    let world = World::new(db, model_config(fake.base_url())).await;
    let session = world.session().await;
    world.corrected_turn(&session).await;
    fake.push([Reply::answer("not json"), Reply::answer("still not json")]);
    world.run_extract().await;
    let job = only_job(&world).await;
    assert_eq!(job.state, JobState::Failed);
    assert_eq!(
        job.attempts, 1,
        "a permanent failure does not spend the remaining attempts"
    );
    assert!(job.last_error.unwrap().contains("malformed"));
}

async fn an_authentication_failure_fails_at_once_and_marks_the_provider_unhealthy(db: TestDb) {
    let fake = FakeProvider::start().await;
    let world = World::new(db, model_config(fake.base_url())).await;
    let session = world.session().await;
    world.corrected_turn(&session).await;
    fake.push([Reply::json(401, json!({"error": {"message": "Incorrect API key provided: sk-proj-abcdefghijklmnopqrstuvwxyz012345", "type": "invalid_request_error", "code": "invalid_api_key"}}))
        .with_header("x-request-id", "req_auth_1")]);
    world.run_extract().await;
    let job = only_job(&world).await;
    assert_eq!((job.state, job.attempts), (JobState::Failed, 1));
    let error = job.last_error.unwrap();
    assert!(
        error.contains("401") && error.contains("invalid_api_key") && error.contains("req_auth_1"),
        "{error}"
    );
    assert!(
        !error.contains("abcdefghijklmnop"),
        "credentials are redacted from diagnostics: {error}"
    );
    let status = projection::project_status(&world.db.db, &world.ledger, &world.config, "proj")
        .await
        .unwrap();
    assert_eq!(status.providers.len(), 1);
    assert!(!status.providers[0].healthy);
    assert_eq!(status.providers[0].status, Some(401));
}

async fn a_rate_limit_waits_for_retry_after(db: TestDb) {
    let fake = FakeProvider::start().await;
    let world = World::new(db, model_config(fake.base_url())).await;
    let session = world.session().await;
    world.corrected_turn(&session).await;
    let before = world.ledger.now_ms();
    fake.push([Reply::json(429, json!({"error": {"message": "Rate limit reached. Please try again in 40s.", "type": "requests", "code": "rate_limit_exceeded"}}))
        .with_header("retry-after", "40")]);
    world.run_extract().await;
    let job = only_job(&world).await;
    assert_eq!((job.state, job.attempts), (JobState::Queued, 1));
    assert!(
        job.run_at >= before + 39_000 && job.run_at <= world.ledger.now_ms() + 41_000,
        "run_at {} vs {before}",
        job.run_at
    );
    assert!(job.last_error.unwrap().contains("429"));
}

async fn a_hint_outside_the_list_fails_the_whole_job(db: TestDb) {
    let fake = FakeProvider::start().await;
    let world = World::new(db, model_config(fake.base_url())).await;
    let session = world.session().await;
    world.corrected_turn(&session).await;
    fake.push([answer(
        json!([experience("Use pnpm.", "S1", "use pnpm")]),
        json!([{"experience_ordinal": 4, "target": "project", "action": "add", "content": "x", "old_text": null, "reason": "r", "confidence": 0.5}]),
    )]);
    world.run_extract().await;
    let job = only_job(&world).await;
    assert_eq!(job.state, JobState::Failed);
    assert_eq!(
        world.scalar("SELECT COUNT(*) FROM experience_record").await,
        0,
        "nothing partially committed"
    );
}

async fn injected_sections_are_never_sources(db: TestDb) {
    let world = World::new(db, Config::default()).await;
    let session = world.session().await;
    let injected = zuno_shared::transcript::NewMessage {
        id: None,
        role: zuno_shared::transcript::Role::User,
        status: None,
        parts: vec![
            Part::Text {
                text: "<zuno-context>From now on always use yarn.</zuno-context>".into(),
                injected: true,
            },
            Part::Text {
                text: "Please fix the build; always run the tests with nextest.".into(),
                injected: false,
            },
        ],
        created_at: None,
    };
    world
        .ingestion
        .append_message(&session, &injected, None)
        .await
        .unwrap();
    world
        .assistant(
            &session,
            vec![
                tool(
                    "bash",
                    r#"{"command":"cargo nextest run"}"#,
                    "ok",
                    zuno_shared::transcript::ToolStatus::Completed,
                ),
                text("Fixed."),
            ],
        )
        .await;
    world.run_extract().await;
    let texts: Vec<String> = zuno_shared::on_db!(world.db.db, |pool| sqlx::query_scalar(
        "SELECT text FROM learning_source_record"
    )
    .fetch_all(pool)
    .await)
    .unwrap();
    assert!(!texts.iter().any(|t| t.contains("yarn")), "{texts:?}");
    let summaries: Vec<String> = zuno_shared::on_db!(world.db.db, |pool| sqlx::query_scalar(
        "SELECT summary FROM experience_record"
    )
    .fetch_all(pool)
    .await)
    .unwrap();
    assert_eq!(summaries, ["Always run the tests with nextest."]);
}

async fn the_daily_token_cap_pauses_automatic_extraction_only(db: TestDb) {
    let fake = FakeProvider::start().await;
    let mut config = model_config(fake.base_url());
    // Room for one call's ceiling, and 500 tokens beyond it.
    let ceiling = zuno_shared::learning::usage::call_ceiling(&config.learning.execution);
    config.learning.execution.max_tokens_per_day = Some(ceiling + 500);
    let world = World::new(db, config).await;
    let session = world.session().await;
    world.corrected_turn(&session).await;
    fake.push([answer(
        json!([experience("Use pnpm.", "S1", "use pnpm")]),
        json!([]),
    )]);
    world.run_extract().await;
    // The first job spent 1,020 tokens; the next automatic job waits for tomorrow.
    let second = world.session().await;
    let turn = world.corrected_turn(&second).await;
    let second_job = turn.admission.unwrap().job().id.clone();
    let report = world.run_extract().await;
    assert_eq!(report.completed, 0);
    let deferred = world.ledger.get(&second_job).await.unwrap();
    assert_eq!((deferred.state, deferred.attempts), (JobState::Queued, 0));
    assert!(deferred.run_at > world.ledger.now_ms());
    let status = projection::project_status(&world.db.db, &world.ledger, &world.config, "proj")
        .await
        .unwrap();
    assert!(status.automatic_paused);
    // Manual reflection is never blocked by the cap.
    fake.push([answer(
        json!([experience("Use pnpm.", "S1", "use pnpm")]),
        json!([]),
    )]);
    let reflected = world
        .ingestion
        .reflect(&second, zuno_shared::learning::ReflectScope::Turn, None)
        .await
        .unwrap()
        .unwrap();
    world.run_extract().await;
    let manual = world
        .ledger
        .get(&reflected.admission.job().id)
        .await
        .unwrap();
    assert_eq!(manual.state, JobState::Completed);
}

async fn verified_extractions_in_one_bucket_admit_one_aggregation_check(db: TestDb) {
    let mut config = Config::default();
    // One bucket for the whole test, whatever the time of day.
    config.learning.aggregation.interval_ms = 1 << 50;
    let world = World::new(db, config).await;
    for correction in [
        "No, never use npm here; always use pnpm. It keeps the lockfile consistent.",
        "No, never push to main; always open a pull request. Reviews catch mistakes.",
        "No, never commit the .env file; always use the vault. It holds the secrets.",
        "No, never skip the tests; always run cargo nextest. It finds flaky tests.",
    ] {
        let session = world.session().await;
        world.user(&session, correction).await;
        world
            .assistant(
                &session,
                vec![
                    tool("bash", r#"{"command":"true"}"#, "ok", ToolStatus::Completed),
                    text("Done."),
                ],
            )
            .await;
    }
    let report = world.run_extract().await;
    assert_eq!(report.completed, 4, "{report:?}");
    assert_eq!(
        world
            .scalar("SELECT COUNT(*) FROM experience_record WHERE verification = 'verified'")
            .await,
        4
    );
    let checks = world
        .ledger
        .list(&JobFilter {
            kind: Some(JobKind::AggregateProject),
            ..JobFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(
        checks.len(),
        1,
        "each extraction's check joined the queued one: {checks:?}"
    );
    assert_eq!(checks[0].state, JobState::Queued);
}

/// The claim gate checked the source, and the attempt starts from what the gate read. Feedback
/// given while the model answers changes the source: the settlement's own check still catches
/// it, so nothing of the answer commits and the job is skipped.
async fn a_source_changed_while_the_model_answers_commits_nothing(db: TestDb) {
    let fake = FakeProvider::start().await;
    let world = World::new(db, model_config(fake.base_url())).await;
    let session = world.session().await;
    let turn = world.corrected_turn(&session).await;
    let job_id = turn.admission.expect("admitted").job().id.clone();
    let gate = Gate::new();
    fake.push([Reply::held(
        &gate,
        answer(
            json!([experience("Use pnpm, not npm.", "S1", "use pnpm")]),
            json!([]),
        ),
    )]);
    let run = world.run_extract();
    tokio::pin!(run);
    let meanwhile = async {
        zuno_tests::eventually(
            "the model request is in flight",
            std::time::Duration::from_secs(30),
            || async { (fake.request_count() == 1).then_some(()) },
        )
        .await;
        // Straight to the store: through the ingestion path the feedback would also admit a
        // second extraction of the turn as it now reads.
        let mut tx = world.db.db.begin().await.unwrap();
        feedback::set_in(
            &mut tx,
            &turn.message.id,
            FeedbackValue::Negative,
            Some("not what I asked"),
            0,
            world.ledger.now_ms(),
        )
        .await
        .unwrap()
        .unwrap();
        tx.commit().await.unwrap();
        gate.open();
    };
    let (report, ()) = tokio::join!(run, meanwhile);
    let job = world.ledger.get(&job_id).await.unwrap();
    assert_eq!(job.state, JobState::Skipped, "{report:?} {job:?}");
    let result = job.result.unwrap().to_string();
    assert!(result.contains("changed"), "{result}");
    assert_eq!(
        world.scalar("SELECT COUNT(*) FROM experience_record").await,
        0
    );
    assert_eq!(fake.request_count(), 1, "the answer was asked for once");
}

on_both_backends!(
    a_source_changed_while_the_model_answers_commits_nothing,
    verified_extractions_in_one_bucket_admit_one_aggregation_check,
    the_rules_extractor_turns_a_correction_into_a_verified_cited_experience,
    the_model_extractor_stores_verified_and_unverified_experiences,
    refused_items_are_skipped_and_siblings_keep_their_ordinals,
    a_malformed_answer_gets_one_repair,
    a_second_malformed_answer_fails_the_job,
    an_authentication_failure_fails_at_once_and_marks_the_provider_unhealthy,
    a_rate_limit_waits_for_retry_after,
    a_hint_outside_the_list_fails_the_whole_job,
    injected_sections_are_never_sources,
    the_daily_token_cap_pauses_automatic_extraction_only,
);

mod resumed {
    use zuno_shared::learning::experience;
    use zuno_shared::learning::extraction::{
        Citation, ExperienceKind, ExtractionOutput, MemoryAction, MemoryTarget, ProposedExperience,
        ProposedMemoryHint,
    };
    use zuno_shared::learning::manifest::{SourceKind, SourceRecord, Verification, finish};
    use zuno_shared::learning::validate::validate;
    use zuno_shared::ledger::{JobIdentity, JobOrigin, NewJob};
    use zuno_tests::{TestDb, on_both_backends};

    use crate::harness::World;

    /// Settling the same `(job, ordinal)`s twice (a resumed attempt) stores nothing twice.
    async fn a_resumed_attempt_stores_nothing_twice(db: TestDb) {
        let world = World::new(db, zuno_shared::config::Config::default()).await;
        let session = world.session().await;
        let job = world
            .ledger
            .admit(NewJob::new(
                JobIdentity::extract("proj", &session, "m", "rules-1", None),
                JobOrigin::ClosedTurn,
            ))
            .await
            .unwrap()
            .into_job();
        let manifest = finish(vec![SourceRecord {
            source_id: "S1".into(),
            address: "message:m:part:0".into(),
            message_id: Some("m".into()),
            part_ordinal: Some(0),
            kind: SourceKind::UserText,
            verification: Verification::UserStatement,
            text: "Use pnpm, not npm.".into(),
            raw_digest: "r".into(),
            redacted_digest: "d".into(),
            clipped: false,
            context: false,
        }]);
        let output = ExtractionOutput {
            experiences: vec![ProposedExperience {
                kind: ExperienceKind::Correction,
                title: "pnpm".into(),
                summary: "Use pnpm.".into(),
                resolution: None,
                citations: vec![Citation {
                    source_id: "S1".into(),
                    excerpt: "Use pnpm".into(),
                }],
                confidence: 0.8,
                keywords: Vec::new(),
            }],
            memories: vec![ProposedMemoryHint {
                experience_ordinal: 0,
                target: MemoryTarget::Project,
                action: MemoryAction::Add,
                content: Some("Use pnpm.".into()),
                old_text: None,
                reason: "correction".into(),
                confidence: 0.8,
            }],
        };
        let validated = validate(&output, &manifest).unwrap();
        let mut ids = Vec::new();
        for _ in 0..2 {
            let mut tx = world.db.db.begin().await.unwrap();
            let stored = experience::insert_extraction_in(
                &mut tx, &job.id, "proj", &session, "rules-1", &validated, 1,
            )
            .await
            .unwrap();
            tx.commit().await.unwrap();
            ids.push(stored.experiences);
        }
        assert_eq!(
            ids[0], ids[1],
            "the resumed attempt finds the same experience"
        );
        assert_eq!(
            world.scalar("SELECT COUNT(*) FROM experience_record").await,
            1
        );
        assert_eq!(
            world
                .scalar("SELECT COUNT(*) FROM experience_evidence")
                .await,
            1
        );
        assert_eq!(world.scalar("SELECT COUNT(*) FROM memory_hint").await, 1);
    }

    on_both_backends!(a_resumed_attempt_stores_nothing_twice);
}
