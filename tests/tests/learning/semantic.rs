//! The optional semantic recall layer end to end, on both backends: an experience is embedded by
//! an `embed` job of the extract worker (against the fake embeddings server), a paraphrase that
//! shares no word with it recalls it through `context`, an unrelated prompt does not, provider
//! errors are retried through the ledger, and without an embeddings provider nothing changes and
//! nothing is sent.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;
use zuno_shared::config::Config;
use zuno_shared::learning::experience::ExperienceOrigin;
use zuno_shared::learning::recall::semantic;
use zuno_shared::learning::retrieval::{self, PromptContext};
use zuno_shared::ledger::{JobFilter, JobKind, JobState};
use zuno_shared::runtime::process::{Settings, WorkerEnv};
use zuno_shared::runtime::{RunReport, Runner, RunnerConfig};
use zuno_tests::fake_embeddings::FakeEmbeddings;
use zuno_tests::{TestDb, on_both_backends};

use crate::harness::World;

/// The lesson: how this repository installs dependencies, in words the prompt never uses.
const LESSON: &str = "Add dependencies with pnpm add so the lockfile stays consistent";
/// The same need in other words: no word (nor stem) in common with the lesson.
const PARAPHRASE: &str = "How do I install packages?";
const UNRELATED: &str = "Rotate the database credentials monthly";
const MODEL: &str = "fake-embed-1";

fn embeddings_config(fake: &FakeEmbeddings) -> Config {
    let mut config = Config::default();
    config.embeddings = Some(fake.config(MODEL, 0.6));
    config
}

async fn remember(world: &World, text: &str) -> String {
    world
        .ingestion
        .record("proj", None, ExperienceOrigin::Remember, text)
        .await
        .unwrap()
        .unwrap()
        .id
}

/// Runs the extract worker's handlers, exactly as `zuno-worker-extract` registers them, until
/// the queue is empty.
async fn run_extract_worker(world: &World) -> RunReport {
    let home = tempfile::tempdir().unwrap();
    let env = WorkerEnv {
        settings: Settings {
            paths: zuno_shared::paths::Paths::resolve(Some(home.path())),
            config: (*world.config).clone(),
        },
        ledger: world.ledger.clone(),
    };
    let mut config = RunnerConfig::new("extract-semantic-test");
    config.exit_when_idle = true;
    let mut runner = Runner::new(world.ledger.clone(), config).with_gate(Arc::new(
        zuno_shared::learning::SourceGate::new(world.config.clone(), world.ledger.clock().clone()),
    ));
    for handler in zuno_worker_extract::handlers(&env).unwrap() {
        runner = runner.register(handler);
    }
    runner.run(CancellationToken::new()).await
}

async fn embed_jobs(world: &World) -> Vec<zuno_shared::ledger::Job> {
    world
        .ledger
        .list(&JobFilter {
            kind: Some(JobKind::Embed),
            ..JobFilter::default()
        })
        .await
        .unwrap()
}

async fn context(world: &World, session: &str, prompt: &str) -> PromptContext {
    world.context(session, prompt).await
}

async fn receipt_retrieval(world: &World, receipt_id: &str) -> serde_json::Value {
    retrieval::receipt(&world.db.db, receipt_id)
        .await
        .unwrap()
        .expect("the receipt was stored")
        .retrieval
}

async fn an_embedded_experience_is_recalled_by_a_paraphrase_and_not_by_an_unrelated_prompt(
    db: TestDb,
) {
    let fake = FakeEmbeddings::start().await;
    let world = World::new(db, embeddings_config(&fake)).await;
    let lesson = remember(&world, LESSON).await;
    let jobs = embed_jobs(&world).await;
    assert_eq!(jobs.len(), 1, "storing the experience queues its embedding");
    assert_eq!(jobs[0].state, JobState::Queued);

    let report = run_extract_worker(&world).await;
    assert_eq!(report.completed, 1, "{report:?}");
    let (dims, bytes, model): (i64, Vec<u8>, String) =
        zuno_shared::on_db!(world.db.db, |pool| sqlx::query_as(
            "SELECT dims, vector, model FROM experience_embedding WHERE experience_id = $1"
        )
        .bind(&lesson)
        .fetch_one(pool)
        .await)
        .unwrap();
    assert_eq!((dims, bytes.len(), model.as_str()), (256, 1024, MODEL));
    let requests = fake.requests();
    assert_eq!(requests.len(), 1);
    assert_eq!(requests[0]["model"], MODEL);
    assert!(
        requests[0]["input"][0].as_str().unwrap().contains(LESSON),
        "{requests:?}"
    );

    let session = world.session().await;
    let recalled = context(&world, &session, PARAPHRASE).await;
    assert_eq!(
        recalled.experience_ids,
        std::slice::from_ref(&lesson),
        "{recalled:?}"
    );
    let section = recalled
        .sections
        .iter()
        .find(|s| s.name == "learning.experiences")
        .expect("the experience was injected");
    assert!(section.content.contains("pnpm add"), "{}", section.content);
    // The receipt records how it was found, and replays the exact section.
    let record = receipt_retrieval(&world, &recalled.receipt_id).await;
    let fused = &record["semantic"]["fused"][0];
    assert_eq!(fused["id"], lesson.as_str());
    assert_eq!(fused["lexicalRank"], serde_json::Value::Null);
    assert_eq!(fused["vectorRank"], 1);
    assert!(fused["similarity"].as_f64().unwrap() >= 0.6, "{record}");
    assert_eq!(record["selected"], serde_json::json!([lesson]));
    let replayed = retrieval::receipt(&world.db.db, &recalled.receipt_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(replayed.sections, recalled.sections);

    let unrelated = context(&world, &session, UNRELATED).await;
    assert!(unrelated.experience_ids.is_empty(), "{unrelated:?}");
    // Both prompts were embedded, nothing else was sent.
    assert_eq!(fake.requests().len(), 3);

    // Lexical recall alone does not find it: the layer is what bridged the paraphrase.
    let lexical = retrieval::search(
        &world.db.db,
        "proj",
        PARAPHRASE,
        5,
        Default::default(),
        world.ledger.now_ms(),
    )
    .await
    .unwrap();
    assert!(lexical.is_empty(), "{lexical:?}");
}

async fn without_an_embeddings_provider_nothing_is_queued_sent_or_changed(db: TestDb) {
    let fake = FakeEmbeddings::start().await;
    let world = World::new(db, Config::default()).await;
    let lesson = remember(&world, LESSON).await;
    assert!(embed_jobs(&world).await.is_empty());
    let backfill = semantic::backfill(&world.ledger, &world.config, None)
        .await
        .unwrap();
    assert_eq!(backfill, semantic::Backfill::default());
    assert_eq!(run_extract_worker(&world).await, RunReport::default());
    assert!(embed_jobs(&world).await.is_empty());

    let session = world.session().await;
    let paraphrase = context(&world, &session, PARAPHRASE).await;
    assert!(paraphrase.experience_ids.is_empty());
    let record = receipt_retrieval(&world, &paraphrase.receipt_id).await;
    assert!(record.get("semantic").is_none(), "{record}");
    // Lexical recall is what it was: the lesson's own words still find it.
    let lexical = context(&world, &session, "pnpm add lockfile").await;
    assert_eq!(lexical.experience_ids, [lesson]);
    let record = receipt_retrieval(&world, &lexical.receipt_id).await;
    assert!(record.get("semantic").is_none(), "{record}");
    let vectors: i64 = zuno_shared::on_db!(world.db.db, |pool| sqlx::query_scalar(
        "SELECT COUNT(*) FROM experience_embedding"
    )
    .fetch_one(pool)
    .await)
    .unwrap();
    assert_eq!(vectors, 0);
    assert!(
        fake.requests().is_empty(),
        "no request may leave the machine"
    );
}

async fn provider_errors_are_retried_through_the_ledger(db: TestDb) {
    let fake = FakeEmbeddings::start().await;
    fake.push_failure(429, Some("0"))
        .push_failure(500, Some("0"));
    let world = World::new(db, embeddings_config(&fake)).await;
    let lesson = remember(&world, LESSON).await;

    let report = run_extract_worker(&world).await;
    assert_eq!((report.retried, report.completed), (2, 1), "{report:?}");
    let jobs = embed_jobs(&world).await;
    assert_eq!(jobs.len(), 1);
    assert_eq!(jobs[0].state, JobState::Completed);
    assert_eq!(jobs[0].attempts, 3, "a 429 and a 500, then the answer");
    assert_eq!(fake.requests().len(), 3);
    let stored: i64 = zuno_shared::on_db!(world.db.db, |pool| sqlx::query_scalar(
        "SELECT COUNT(*) FROM experience_embedding WHERE experience_id = $1"
    )
    .bind(&lesson)
    .fetch_one(pool)
    .await)
    .unwrap();
    assert_eq!(stored, 1);
}

/// A refused credential or request cannot succeed later: the job fails at once, no retry.
async fn a_permanent_provider_error_fails_the_job_without_retrying(db: TestDb) {
    let fake = FakeEmbeddings::start().await;
    fake.push_failure(401, None);
    let world = World::new(db, embeddings_config(&fake)).await;
    remember(&world, LESSON).await;
    let report = run_extract_worker(&world).await;
    assert_eq!((report.failed, report.retried), (1, 0), "{report:?}");
    let job = &embed_jobs(&world).await[0];
    assert_eq!((job.state, job.attempts), (JobState::Failed, 1));
    assert!(
        job.last_error
            .as_deref()
            .unwrap_or("")
            .contains("authentication"),
        "{job:?}"
    );
    assert_eq!(fake.requests().len(), 1);
}

/// When the prompt cannot be embedded, `context` still answers, lexically, and the receipt says
/// why the layer took no part.
async fn a_failing_prompt_embedding_leaves_recall_lexical(db: TestDb) {
    let fake = FakeEmbeddings::start().await;
    let world = World::new(db, embeddings_config(&fake)).await;
    let lesson = remember(&world, LESSON).await;
    assert_eq!(run_extract_worker(&world).await.completed, 1);
    let session = world.session().await;

    fake.push_failure(503, None).push_failure(503, None);
    let lexical = context(&world, &session, "pnpm add lockfile").await;
    assert_eq!(lexical.experience_ids, [lesson]);
    let record = receipt_retrieval(&world, &lexical.receipt_id).await;
    assert!(
        record["semantic"]["error"]
            .as_str()
            .unwrap()
            .contains("503"),
        "{record}"
    );
    let paraphrase = context(&world, &session, PARAPHRASE).await;
    assert!(paraphrase.experience_ids.is_empty(), "{paraphrase:?}");
}

async fn embedding_is_idempotent_per_experience_and_model_and_backfill_covers_the_rest(db: TestDb) {
    let fake = FakeEmbeddings::start().await;
    // Experiences stored while the layer was off...
    let world = World::new(db, Config::default()).await;
    let first = remember(&world, LESSON).await;
    let second = remember(&world, "Never commit the generated schema file").await;
    assert!(embed_jobs(&world).await.is_empty());
    // ...are embedded once it is configured and a backfill queues them.
    let world = World {
        config: Arc::new(embeddings_config(&fake)),
        ..world
    };
    let backfill = semantic::backfill(&world.ledger, &world.config, None)
        .await
        .unwrap();
    assert_eq!(
        backfill,
        semantic::Backfill {
            configured: true,
            missing: 2,
            queued: 2,
            existing: 0
        }
    );
    let completed = run_extract_worker(&world).await.completed;
    assert_eq!(embedded(&world).await, 2);
    assert_eq!(completed, 2);
    let ids: Vec<String> = embed_jobs(&world)
        .await
        .into_iter()
        .map(|job| job.payload["experienceId"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(ids.len(), 2);
    assert!(ids.contains(&first) && ids.contains(&second), "{ids:?}");

    // Nothing left to do: a backfill queues nothing and the server hears nothing more.
    let before = fake.requests().len();
    let again = semantic::backfill(&world.ledger, &world.config, None)
        .await
        .unwrap();
    assert_eq!((again.missing, again.queued), (0, 0), "{again:?}");
    let mut tx = world.db.db.begin().await.unwrap();
    let admission = semantic::admit_in(
        &world.ledger,
        &mut tx,
        &world.config,
        "proj",
        &first,
        zuno_shared::ledger::JobOrigin::Manual,
    )
    .await
    .unwrap()
    .unwrap();
    tx.commit().await.unwrap();
    assert!(!admission.is_new(), "one job per (experience, model)");
    assert_eq!(run_extract_worker(&world).await, RunReport::default());
    assert_eq!(fake.requests().len(), before);

    // Another model is another identity.
    let mut other = embeddings_config(&fake);
    other.embeddings.as_mut().unwrap().model = String::from("fake-embed-2");
    let other = semantic::backfill(&world.ledger, &other, None)
        .await
        .unwrap();
    assert_eq!(other.queued, 2);
}

/// The `zuno-worker-extract` process, started after experiences were stored without the layer,
/// queues their embeddings at start-up and runs them before it goes idle.
async fn the_extract_worker_binary_backfills_and_embeds_at_start(db: TestDb) {
    let fake = FakeEmbeddings::start().await;
    let world = World::new(db, Config::default()).await;
    let lesson = remember(&world, LESSON).await;
    assert!(embed_jobs(&world).await.is_empty());
    let home = tempfile::tempdir().unwrap();
    let config_file = home.path().join("config.json");
    std::fs::write(
        &config_file,
        serde_json::to_string(&embeddings_config(&fake)).unwrap(),
    )
    .unwrap();
    let output = tokio::process::Command::new(zuno_tests::processes::binary("zuno-worker-extract"))
        .arg("--database-url")
        .arg(&world.db.url)
        .arg("--config")
        .arg(&config_file)
        .arg("--exit-when-idle")
        .env("ZUNO_HOME", home.path())
        .output()
        .await
        .unwrap();
    zuno_tests::processes::assert_succeeded(&output);
    let jobs = embed_jobs(&world).await;
    assert_eq!(jobs.len(), 1);
    assert_eq!(jobs[0].state, JobState::Completed);
    assert_eq!(jobs[0].payload["experienceId"], lesson.as_str());
    assert_eq!(embedded(&world).await, 1);
    assert_eq!(fake.requests().len(), 1);
}

/// `POST /api/projects/web/learn/embed-backfill`, which must answer 200.
async fn embed_backfill(server: &zuno_tests::server::TestServer) -> serde_json::Value {
    let (status, report) = server
        .post(
            "/api/projects/web/learn/embed-backfill",
            serde_json::json!({}),
        )
        .await;
    assert_eq!(status, 200, "{report}");
    report
}

/// Over HTTP: `/learn remember` queues the embedding, and `embed-backfill` finds nothing more to
/// queue for the project (the job exists); without a provider the route says it is off.
async fn the_remember_and_embed_backfill_routes(db: TestDb) {
    let fake = FakeEmbeddings::start().await;
    let server = zuno_tests::server::TestServer::start(&db, embeddings_config(&fake), None).await;
    let (status, _) = server
        .post(
            "/api/projects",
            serde_json::json!({"id": "web", "name": "web"}),
        )
        .await;
    assert_eq!(status, 201);
    let (status, experience) = server
        .post(
            "/api/projects/web/learn/remember",
            serde_json::json!({ "text": LESSON }),
        )
        .await;
    assert_eq!(status, 201, "{experience}");
    let jobs = server
        .state
        .ledger
        .list(&JobFilter {
            kind: Some(JobKind::Embed),
            ..JobFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(jobs.len(), 1);
    assert_eq!(jobs[0].payload["experienceId"], experience["id"]);
    let report = embed_backfill(&server).await;
    assert_eq!(
        report,
        serde_json::json!({"configured": true, "missing": 1, "queued": 0, "existing": 1})
    );
    drop(server);

    let server = zuno_tests::server::TestServer::start(&db, Config::default(), None).await;
    let report = embed_backfill(&server).await;
    assert_eq!(report["configured"], false);
    assert!(fake.requests().is_empty());
}

/// The client sends the key from the named variable as a Bearer token (and `dimensions` when
/// asked to), refuses to send without it, and refuses vectors of another length.
#[tokio::test]
async fn the_embedding_client_speaks_the_openai_wire_format() {
    use std::time::Duration;
    use zuno_shared::provider::{EmbeddingClient, ProviderError};
    let fake = FakeEmbeddings::start().await;
    let mut config = fake.config(MODEL, 0.6);
    config.api_key_env = Some(String::from("EMBED_KEY"));
    config.send_dimensions = true;
    let timeout = Duration::from_secs(5);

    let missing = EmbeddingClient::new(config.clone())
        .with_env(|_| None)
        .embed("text", timeout)
        .await
        .unwrap_err();
    assert!(
        matches!(missing, ProviderError::MissingCredential { ref variable } if variable == "EMBED_KEY"),
        "{missing:?}"
    );
    assert!(
        fake.requests().is_empty(),
        "nothing is sent without the key"
    );

    let client = EmbeddingClient::new(config.clone())
        .with_env(|name| (name == "EMBED_KEY").then(|| String::from("sk-test")));
    let vector = client.embed("install packages", timeout).await.unwrap();
    assert_eq!(
        vector,
        zuno_tests::fake_embeddings::fake_embedding("install packages", 256)
    );
    assert_eq!(
        fake.authorizations(),
        [Some(String::from("Bearer sk-test"))]
    );
    let body = &fake.requests()[0];
    assert_eq!(body["model"], MODEL);
    assert_eq!(body["input"], serde_json::json!(["install packages"]));
    assert_eq!(body["dimensions"], 256);

    config.dimensions = 128;
    let wrong = EmbeddingClient::new(config)
        .with_env(|_| Some(String::from("sk-test")))
        .embed("install packages", timeout)
        .await
        .unwrap_err();
    assert!(
        matches!(wrong, ProviderError::InvalidResponse(_)),
        "{wrong:?}"
    );
    assert!(wrong.is_permanent());
    assert!(!wrong.to_string().contains("sk-test"));
}

fn eval_options(config: Config, store: zuno_cli::eval::StoreChoice) -> zuno_cli::eval::EvalOptions {
    let repository = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    zuno_cli::eval::EvalOptions {
        labels: vec![
            repository.join("tests/learning-eval/dev/synthetic-en-imperatives.labels.json"),
        ],
        corpus: repository.join("../shared/corpus"),
        repository,
        store,
        config,
        cassettes: None,
        server: std::sync::Arc::new(zuno_api::Api),
    }
}

/// `zuno learn eval` with an embeddings endpoint configured embeds what it learned (through
/// the extract worker's `embed` jobs) and reports recall@5 with and without the layer; the
/// figure without it is what a run with no layer measures.
async fn the_eval_reports_recall_at_5_with_and_without_the_layer(db: TestDb) {
    let store = match db.backend {
        zuno_shared::db::Backend::Sqlite => zuno_cli::eval::StoreChoice::Sqlite,
        zuno_shared::db::Backend::Postgres => zuno_cli::eval::StoreChoice::Postgres {
            admin_url: zuno_tests::postgres_admin_url(),
        },
    };
    drop(db);
    let lexical = zuno_cli::eval::run(&eval_options(Config::default(), store.clone()))
        .await
        .unwrap();
    assert_eq!(lexical.total.recall_at_5_without_semantic, None);
    let text = zuno_cli::eval::print_text(&lexical);
    assert!(!text.contains("without the semantic layer"), "{text}");

    let fake = FakeEmbeddings::start().await;
    let semantic = zuno_cli::eval::run(&eval_options(embeddings_config(&fake), store))
        .await
        .unwrap();
    let total = &semantic.total;
    assert!(total.counts.lexical_only_follow_ups > 0);
    assert_eq!(
        total.counts.lexical_only_follow_ups,
        total.counts.follow_ups
    );
    assert_eq!(
        total.recall_at_5_without_semantic, lexical.total.recall_at_5,
        "with the layer off, recall is the lexical recall"
    );
    assert!(total.recall_at_5.is_some());
    let jobs = &semantic.files[0].report.jobs;
    assert_eq!(
        jobs.get("embed:completed").copied(),
        Some(total.counts.experiences as i64),
        "{jobs:?}"
    );
    let text = zuno_cli::eval::print_text(&semantic);
    assert!(
        text.contains("recall@5 without the semantic layer"),
        "{text}"
    );
}

async fn embedded(world: &World) -> i64 {
    zuno_shared::on_db!(world.db.db, |pool| sqlx::query_scalar(
        "SELECT COUNT(*) FROM experience_embedding"
    )
    .fetch_one(pool)
    .await)
    .unwrap()
}

on_both_backends!(
    an_embedded_experience_is_recalled_by_a_paraphrase_and_not_by_an_unrelated_prompt,
    without_an_embeddings_provider_nothing_is_queued_sent_or_changed,
    provider_errors_are_retried_through_the_ledger,
    a_permanent_provider_error_fails_the_job_without_retrying,
    a_failing_prompt_embedding_leaves_recall_lexical,
    embedding_is_idempotent_per_experience_and_model_and_backfill_covers_the_rest,
    the_eval_reports_recall_at_5_with_and_without_the_layer,
    the_extract_worker_binary_backfills_and_embeds_at_start,
    the_remember_and_embed_backfill_routes,
);
