//! What the optional semantic recall layer costs `context`: one project with `--experiences`
//! experiences, each with a stored vector of `--dims`, and `context` timed without the layer,
//! with it (the prompt embedded by the in-process fake embeddings server), and the bounded vector
//! scan alone, in the same run. Prints p50/p99 in milliseconds.
//!
//! `zuno-semantic-bench --experiences 10000 --dims 768` (SQLite in a temporary directory), or
//! with `--database-url postgres://…/db` on an empty, migrated-on-open Postgres database.

use std::sync::Arc;
use std::time::Instant;
use zuno_tests::rng::SplitMix64 as Rng;

use clap::Parser;
use zuno_shared::config::Config;
use zuno_shared::db::{ConnectOptions, Db};
use zuno_shared::learning::LearningIngestion;
use zuno_shared::learning::recall::semantic;
use zuno_shared::learning::retrieval;
use zuno_shared::ledger::Ledger;
use zuno_shared::transcript::{NewProject, NewSession, TranscriptStore};
use zuno_tests::fake_embeddings::FakeEmbeddings;

#[derive(Parser)]
#[command(name = "zuno-semantic-bench")]
struct Args {
    #[arg(long, default_value_t = 10_000)]
    experiences: usize,
    #[arg(long, default_value_t = 768)]
    dims: u32,
    #[arg(long, default_value_t = 200)]
    samples: usize,
    /// `embeddings.max_scan` for the runs with the layer.
    #[arg(long, default_value_t = 5_000)]
    max_scan: u32,
    #[arg(long)]
    database_url: Option<String>,
}

const WORDS: &[&str] = &[
    "pnpm",
    "lockfile",
    "migration",
    "invoice",
    "pytest",
    "docker",
    "compose",
    "cache",
    "retry",
    "lease",
    "schema",
    "index",
    "query",
    "token",
    "budget",
    "router",
    "handler",
    "session",
    "worker",
    "ledger",
    "vector",
    "prompt",
    "config",
    "deploy",
    "staging",
    "release",
    "branch",
    "rebase",
    "commit",
    "review",
    "format",
    "lint",
    "clippy",
    "tracing",
    "metrics",
    "export",
];

/// `words` words of the bench's list.
fn sentence(rng: &mut Rng, words: usize) -> String {
    (0..words)
        .map(|_| WORDS[(rng.next_u64() % WORDS.len() as u64) as usize])
        .collect::<Vec<_>>()
        .join(" ")
}

fn percentiles(mut samples: Vec<f64>) -> (f64, f64) {
    samples.sort_by(f64::total_cmp);
    let at = |q: f64| samples[((samples.len() as f64 - 1.0) * q).round() as usize];
    (at(0.5), at(0.99))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let temp = tempfile::tempdir()?;
    let options = match &args.database_url {
        Some(url) => ConnectOptions::new(url.clone()),
        None => ConnectOptions::sqlite_file(&temp.path().join("bench.db")),
    };
    let db = Db::open(&options, zuno_shared::migrations::schema()).await?;
    let fake = FakeEmbeddings::start_with(args.dims).await;
    let mut with_layer = Config::default();
    let mut embeddings = fake.config("bench-embed", 0.75);
    embeddings.max_scan = args.max_scan;
    with_layer.embeddings = Some(embeddings);
    let clock = zuno_shared::clock::system_clock();
    let ledger = Ledger::new(db.clone(), clock.clone());
    let ingestion = LearningIngestion::new(
        TranscriptStore::new(db.clone(), clock),
        ledger.clone(),
        Arc::new(Config::default()),
    );
    ingestion
        .store()
        .create_project(&NewProject {
            id: "bench".into(),
            name: "bench".into(),
            worktree: None,
        })
        .await?;
    let session = ingestion
        .create_session(&NewSession {
            project_id: "bench".into(),
            ..NewSession::default()
        })
        .await?
        .0
        .id;

    let seeding = Instant::now();
    let mut rng = Rng(17);
    let now = ledger.now_ms();
    for chunk in 0..args.experiences.div_ceil(1000) {
        let mut tx = db.begin().await?;
        for i in chunk * 1000..((chunk + 1) * 1000).min(args.experiences) {
            let id = format!("exp{i:07}");
            let (title, summary) = (sentence(&mut rng, 6), sentence(&mut rng, 24));
            zuno_shared::on_tx!(&mut tx, |conn| {
                sqlx::query(
                    "INSERT INTO experience_record (id, project_id, origin, kind, title, summary, confidence, \
                       verification, content_digest, created_at, updated_at) \
                     VALUES ($1, 'bench', 'remember', 'feedback', $2, $3, 1.0, 'verified', $1, $4, $4)")
                .bind(&id).bind(&title).bind(&summary).bind(now - i as i64)
                .execute(conn).await.map(|d| d.rows_affected())
            })?;
            let vector: Vec<f32> = (0..args.dims).map(|_| rng.signed_unit()).collect();
            semantic::store_in(
                &mut tx,
                &id,
                "bench",
                "bench-embed",
                &vector,
                &id,
                now - i as i64,
            )
            .await?;
        }
        tx.commit().await?;
    }
    eprintln!(
        "seeded {} experiences with {}-dimension vectors in {:.1}s",
        args.experiences,
        args.dims,
        seeding.elapsed().as_secs_f64()
    );

    let prompts: Vec<String> = (0..args.samples).map(|_| sentence(&mut rng, 8)).collect();
    let lexical_config = Config::default();
    let mut rows = Vec::new();
    for (name, config) in [
        ("context, lexical only", &lexical_config),
        ("context, with the semantic layer", &with_layer),
    ] {
        let mut samples = Vec::new();
        for prompt in &prompts {
            let started = Instant::now();
            retrieval::assemble(&db, config, &session, prompt, ledger.now_ms()).await?;
            samples.push(started.elapsed().as_secs_f64() * 1000.0);
        }
        rows.push((name, percentiles(samples)));
    }
    let mut samples = Vec::new();
    for _ in &prompts {
        let query: Vec<f32> = (0..args.dims).map(|_| rng.signed_unit()).collect();
        let started = Instant::now();
        semantic::nearest(&db, "bench", "bench-embed", &query, args.max_scan, 40).await?;
        samples.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    rows.push(("vector scan alone (nearest 40)", percentiles(samples)));
    println!(
        "{} backend, {} experiences, {} dimensions, max_scan {}, {} samples",
        db.backend().as_str(),
        args.experiences,
        args.dims,
        args.max_scan,
        args.samples
    );
    for (name, (p50, p99)) in rows {
        println!("{name:<36} p50 {p50:8.2} ms   p99 {p99:8.2} ms");
    }
    db.close().await;
    Ok(())
}
