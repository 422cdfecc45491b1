//! The recall index against the exact ranking: on a seeded corpus bigger than any shortcut
//! could cover by accident, the index's top 40 for each of many prompts must equal, id for id
//! and score for score, the ranking computed from the stored text of every record of the
//! project — after a full catch-up, while records wait for indexing (inserted, edited, deleted),
//! and after indexers ran concurrently. Both backends.

use zuno_shared::config::Config;
use zuno_shared::db::Db;
use zuno_shared::learning::recall::floor::Floor;
use zuno_shared::learning::recall::index;
use zuno_shared::learning::recall::search_terms::{self, MatchMode};
use zuno_shared::learning::retrieval;
use zuno_shared::transcript::NewSession;
use zuno_tests::{TestDb, on_both_backends};

use crate::harness::World;
use zuno_tests::rng::SplitMix64 as Rng;

/// Words with a skewed frequency (earlier ones far more often), identifiers and Chinese, so
/// keys range from one in most records to one in a handful.
const WORDS: &[&str] = &[
    "test",
    "build",
    "error",
    "config",
    "cargo",
    "migration",
    "schema",
    "lockfile",
    "pnpm",
    "install",
    "tests",
    "testing",
    "deploy",
    "timeout",
    "retry",
    "cache",
    "docker",
    "worker",
    "lease",
    "token",
    "parser",
    "tokenizer",
    "sqlite",
    "postgres",
    "vacuum",
    "checkpoint",
    "src/lib.rs",
    "foo.bar",
    "snake_case",
    "kebab-case",
    "v1.2.3",
    "the",
    "and",
    "of",
    "with",
    "数据库",
    "迁移",
    "安装依赖",
    "测试",
    "超时",
    "缓存",
];

fn word(rng: &mut Rng) -> &'static str {
    // Squares skew the choice towards the start of the list.
    let a = rng.below(WORDS.len());
    let b = rng.below(WORDS.len());
    WORDS[a.min(b)]
}

fn sentence(rng: &mut Rng, low: usize, high: usize) -> String {
    let n = low + rng.below(high - low + 1);
    (0..n).map(|_| word(rng)).collect::<Vec<_>>().join(" ")
}

/// Inserts `count` experiences into `project` (through plain SQL, as any writer could).
async fn seed(
    db: &Db,
    project: &str,
    session: &str,
    numbers: std::ops::Range<usize>,
    rng: &mut Rng,
) -> Vec<String> {
    let mut ids = Vec::new();
    for i in numbers {
        let id = format!("exp-{project}-{i:04}");
        let resolution = (rng.below(3) > 0).then(|| sentence(rng, 3, 12));
        zuno_shared::on_db!(db, |pool| sqlx::query(
                "INSERT INTO experience_record (id, project_id, session_id, origin, kind, title, summary, \
                   resolution, confidence, verification, status, content_digest, created_at, updated_at, keywords) \
                 VALUES ($1, $2, $3, 'extraction', 'outcome', $4, $5, $6, 0.8, 'verified', 'active', $7, $8, $8, $9)")
            .bind(&id)
            .bind(project)
            .bind(session)
            .bind(sentence(rng, 2, 6))
            .bind(sentence(rng, 5, 25))
            .bind(resolution)
            .bind(format!("digest-{id}"))
            .bind(1_700_000_000_000i64 + i as i64)
            .bind(if rng.below(4) == 0 { sentence(rng, 1, 3) } else { String::new() })
            .execute(pool)
            .await
            .map(|done| done.rows_affected()))
        .unwrap();
        ids.push(id);
    }
    ids
}

fn prompts(rng: &mut Rng) -> Vec<String> {
    let mut prompts: Vec<String> = (0..60).map(|_| sentence(rng, 1, 10)).collect();
    prompts.push("why does the 数据库迁移 fail with src/lib.rs".into());
    prompts.push("测试超时".into());
    prompts.push("tokenizer".into());
    prompts
}

/// Asserts that the index's ranking equals the exact one for every prompt, in `project`.
async fn assert_index_is_exact(db: &Db, project: &str, prompts: &[String], stage: &str) {
    let mut nonempty = 0;
    for prompt in prompts {
        let terms = search_terms::parse(prompt);
        let keys = index::query_keys(&terms, Floor::of(prompt).bigrams());
        let fast = index::top(db, project, &keys, 40)
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("{stage}: the index answered for {prompt:?}"));
        let exact = index::exact_top(db, project, &keys, 40).await.unwrap();
        assert_eq!(fast, exact, "{stage}: {prompt:?}");
        for (id, _) in &fast {
            let owner: String = zuno_shared::on_db!(db, |pool| sqlx::query_scalar(
                "SELECT project_id FROM experience_record WHERE id = $1"
            )
            .bind(id)
            .fetch_one(pool)
            .await)
            .unwrap();
            assert_eq!(
                owner, project,
                "{stage}: {id} of another project for {prompt:?}"
            );
        }
        if !fast.is_empty() {
            nonempty += 1;
        }
    }
    assert!(
        nonempty * 2 > prompts.len(),
        "{stage}: most prompts should find something ({nonempty})"
    );
}

async fn pending(db: &Db) -> i64 {
    zuno_shared::on_db!(db, |pool| sqlx::query_scalar(
        "SELECT COUNT(*) FROM recall_pending"
    )
    .fetch_one(pool)
    .await)
    .unwrap()
}

async fn the_index_ranks_as_the_stored_text_does_caught_up_or_not(db: TestDb) {
    let world = World::new(db, Config::default()).await;
    let db = world.db.db.clone();
    let mut rng = Rng(0x5EED_0013);
    let mut sessions = Vec::new();
    for project in ["alpha", "beta"] {
        world.project(project, None).await;
        sessions.push(
            world
                .session_with(NewSession {
                    project_id: project.into(),
                    ..NewSession::default()
                })
                .await,
        );
    }
    let alpha = seed(&db, "alpha", &sessions[0], 0..600, &mut rng).await;
    seed(&db, "beta", &sessions[1], 0..200, &mut rng).await;
    let prompts = prompts(&mut rng);

    // Far behind: the index refuses to answer and recall still works from the full-text index.
    assert_eq!(pending(&db).await, 800);
    let keys = index::query_keys(&search_terms::parse("cargo lockfile"), &[]);
    assert!(index::top(&db, "alpha", &keys, 40).await.unwrap().is_none());
    let hits = retrieval::search(&db, "alpha", "cargo lockfile", 5, MatchMode::Any, 0)
        .await
        .unwrap();
    assert!(!hits.is_empty(), "the full-text fallback finds matches");

    assert_eq!(index::catch_up(&db, 250).await.unwrap(), 800);
    assert_eq!(pending(&db).await, 0);
    assert_index_is_exact(&db, "alpha", &prompts, "caught up").await;
    assert_index_is_exact(&db, "beta", &prompts, "caught up").await;

    // Records change without indexing: edited, deleted, inserted, moved to another project.
    for id in &alpha[..5] {
        zuno_shared::on_db!(db, |pool| sqlx::query(
                "UPDATE experience_record SET title = 'tokenizer lockfile 缓存', summary = summary || ' vacuum' WHERE id = $1")
            .bind(id).execute(pool).await.map(|done| done.rows_affected()))
        .unwrap();
    }
    for id in &alpha[5..8] {
        zuno_shared::on_db!(db, |pool| sqlx::query(
            "DELETE FROM experience_record WHERE id = $1"
        )
        .bind(id)
        .execute(pool)
        .await
        .map(|done| done.rows_affected()))
        .unwrap();
    }
    zuno_shared::on_db!(db, |pool| sqlx::query(
            // A moved record takes a place in its new project's sequence (mining order).
            "UPDATE experience_record SET project_id = 'beta', session_id = $2, seq = 1000000 WHERE id = $1")
        .bind(&alpha[8]).bind(&sessions[1]).execute(pool).await.map(|done| done.rows_affected()))
    .unwrap();
    seed(&db, "alpha", &sessions[0], 600..604, &mut rng).await;
    assert_eq!(pending(&db).await, 13);
    assert_index_is_exact(&db, "alpha", &prompts, "pending").await;
    assert_index_is_exact(&db, "beta", &prompts, "pending").await;

    // Indexing them changes nothing a reader sees.
    assert_eq!(index::catch_up(&db, 5).await.unwrap(), 13);
    assert_index_is_exact(&db, "alpha", &prompts, "caught up again").await;
    assert_index_is_exact(&db, "beta", &prompts, "caught up again").await;
}

async fn concurrent_indexers_leave_the_index_exact(db: TestDb) {
    let world = World::new(db, Config::default()).await;
    let db = world.db.db.clone();
    let mut rng = Rng(0x1DE7);
    world.project("alpha", None).await;
    let session = world
        .session_with(NewSession {
            project_id: "alpha".into(),
            ..NewSession::default()
        })
        .await;
    seed(&db, "alpha", &session, 0..400, &mut rng).await;
    // Four indexers with small batches take pending records at the same time, each in its own
    // transaction on its own connection.
    let indexers: Vec<_> = (0..4)
        .map(|_| {
            let db = db.clone();
            tokio::spawn(async move { index::catch_up(&db, 7).await })
        })
        .collect();
    let mut taken = 0;
    for indexer in indexers {
        taken += indexer.await.unwrap().unwrap();
    }
    assert_eq!(taken, 400, "every pending record taken exactly once");
    assert_eq!(pending(&db).await, 0);
    let prompts = prompts(&mut rng);
    assert_index_is_exact(&db, "alpha", &prompts, "after concurrent indexing").await;
}

/// The background drain indexes what writers left pending, with no reader involved: a pass when
/// it starts and another after each wake of the database's wake bus (the test waits for its
/// reported passes, not for time).
async fn the_background_drain_indexes_what_writers_left_pending(db: TestDb) {
    let world = World::new(db, Config::default()).await;
    let db = world.db.db.clone();
    let mut rng = Rng(0xD2A1_0017);
    world.project("alpha", None).await;
    let session = world
        .session_with(NewSession {
            project_id: "alpha".into(),
            ..NewSession::default()
        })
        .await;
    let ids = seed(&db, "alpha", &session, 0..120, &mut rng).await;
    assert_eq!(pending(&db).await, 120);
    let (report, mut passes) = tokio::sync::mpsc::unbounded_channel();
    let shutdown = tokio_util::sync::CancellationToken::new();
    let drain = tokio::spawn(index::drain(db.clone(), shutdown.clone(), Some(report)));
    assert_eq!(
        passes.recv().await,
        Some(120),
        "the first pass takes everything"
    );
    assert_eq!(pending(&db).await, 0);

    // Another writer edits and deletes without indexing, then wakes the bus (as a settled job
    // or a Postgres notification does).
    for id in &ids[..3] {
        zuno_shared::on_db!(db, |pool| sqlx::query(
            "UPDATE experience_record SET title = 'vacuum checkpoint 缓存' WHERE id = $1"
        )
        .bind(id)
        .execute(pool)
        .await
        .map(|done| done.rows_affected()))
        .unwrap();
    }
    zuno_shared::on_db!(db, |pool| sqlx::query(
        "DELETE FROM experience_record WHERE id = $1"
    )
    .bind(&ids[3])
    .execute(pool)
    .await
    .map(|done| done.rows_affected()))
    .unwrap();
    assert_eq!(pending(&db).await, 4);
    db.wake_bus().wake();
    // A timed pass may run between the edits; the wake guarantees one after them.
    let mut taken = 0;
    while taken < 4 {
        taken += passes.recv().await.expect("the drain runs until shut down");
    }
    assert_eq!(taken, 4, "each change indexed once");
    assert_eq!(pending(&db).await, 0);
    let prompts = prompts(&mut rng);
    assert_index_is_exact(&db, "alpha", &prompts, "drained").await;
    shutdown.cancel();
    drain.await.unwrap();
}

on_both_backends!(
    the_index_ranks_as_the_stored_text_does_caught_up_or_not,
    concurrent_indexers_leave_the_index_exact,
    the_background_drain_indexes_what_writers_left_pending,
);
