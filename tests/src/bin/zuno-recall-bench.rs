//! `context` latency beside a bare full-text query on the same data, in the same run
//! (docs/benchmarks.md, current figures; runs in docs/benchmarks-history.md, "Recall: context
//! latency").
//!
//! For each backend and size it creates a fresh, migrated database (SQLite: a new file in a
//! temporary directory with the default `synchronous=FULL`; Postgres: a new database on
//! `ZUNO_TEST_DATABASE_URL`, dropped at the end — see [`zuno_tests::TestDb`]) and seeds it:
//!
//! - `--projects` projects, each with five seed sessions and one query session, created through
//!   `LearningIngestion::create_session`;
//! - N experiences spread evenly over the projects, inserted with the columns extraction writes,
//!   in transactions of 5,000 (SQLite: one `INSERT` per row, so the FTS triggers index every row
//!   as they do in production; Postgres: `INSERT … SELECT FROM UNNEST`, which maintains the
//!   generated `tsvector` and the GIN/trigram indexes per row as well), with 1–3 evidence rows
//!   each. 55 % verified, 2 % forgotten, 1 % with a changed source, 30 % used before, 5 % with
//!   feedback, created over the last year;
//! - resident Memory: a global document of 8 entries and a project document of up to 12 entries
//!   per project, half of them derived, with provenance rows pointing at the project's
//!   experiences (so `context` renders and counts both Memory sections and checks the
//!   derived entries' support, as in production).
//!
//! Text comes from a fixed-seed generator: one Zipf(1.0) distribution over English stopwords (the
//! head, as function words are in real text; `search_terms::parse` drops them), a few hundred
//! coding-agent words and a tail of compound identifiers (`a_b`, `aB`, `a-b`, `a.b`, paths such as
//! `src/a/b.rs`; 20,000 words in all); 25 % of
//! each project's content words come from 30 project topic words, so a project talks about its
//! own things. One project in ten writes Chinese mixed with ASCII identifiers. In the resulting
//! data the most common content word occurs in about 15 % of the records and a project's topic
//! words in about a quarter of that project's records.
//!
//! Prompts (the same list for every backend at a given size and seed): 40 % restate part of a
//! stored title of the project, 35 % fresh text, 10 % one to three words, 5 % a correction
//! ("no, that's wrong …", which applies the violate rule to the previous receipt), 5 % praise,
//! 5 % a pasted log of 80–300 words. Each is sent to a random project's query session.
//!
//! Each prompt is timed three ways, in rotating order so caches favour none of them:
//!
//! - **context**: `retrieval::assemble`, the function `POST /api/session/{id}/context` calls:
//!   session policy, Memory documents, the project-scoped text search, ranking, budgeted
//!   rendering with the real tokenizer, and the receipt/use-count/event write in one
//!   transaction;
//! - **bare FTS**: the prompt's terms against the same index, project-scoped, unranked, first 50
//!   rows (SQLite: `experience_fts MATCH 'scope:"p…" AND {title summary resolution}: ("t1" OR
//!   …)' LIMIT 50`; Postgres: `project_id = $1 AND search_vector @@ (plainto_tsquery('simple',
//!   $2) || …) LIMIT 50`);
//! - **ranked FTS**: the same query ordered by relevance (bm25 / ts_rank_cd), first 40: the least
//!   a ranked recall must do.
//!
//! After seeding, the recall index (`recall::index`, migration 0013) indexes the bulk-inserted
//! records in one catch-up (timed, on stderr), as writers do record by record. For each timed
//! prompt that quotes a stored title, the quoted experience is looked up (untimed) in the ranked
//! FTS query's top 5 (what `scripts/recall-pruning-check.py` counts), in the recall index's top 5
//! and in what `context` selected: the hit-rate columns.
//!
//! `--rounds` times `--queries` new prompts per round on the same data; the table reports the
//! median over rounds of each round's p50 and p99 (nearest rank), so one burst of load on a
//! shared machine does not make the figure. One Markdown row per (backend, size) goes to stdout;
//! progress, seed
//! times, per-round figures and the load average go to stderr. It is a binary, not a test:
//! nothing runs it as part of the suite (`scripts/bench-recall` does).

use std::sync::Arc;
use std::time::{Duration, Instant};
use zuno_tests::rng::SplitMix64 as Rng;

use clap::Parser;
use zuno_shared::clock::{now_ms, system_clock};
use zuno_shared::config::Config;
use zuno_shared::db::{Backend, Db, Pool};
use zuno_shared::learning::LearningIngestion;
use zuno_shared::learning::experience::content_digest;
use zuno_shared::learning::extraction::ExperienceKind;
use zuno_shared::learning::recall::floor::Floor;
use zuno_shared::learning::recall::index;
use zuno_shared::learning::recall::search_terms::{self, MatchMode, QueryTerms};
use zuno_shared::learning::retrieval;
use zuno_shared::ledger::Ledger;
use zuno_shared::transcript::{NewProject, NewSession, TranscriptStore};
use zuno_tests::TestDb;

#[path = "zuno-recall-bench/words.rs"]
mod words;
use words::{CJK_PARTICLES, CJK_WORDS, PATH_EXTENSIONS, PATH_ROOTS, STOPWORDS, WORDS};

#[derive(Parser)]
struct Args {
    /// Backends to run, comma-separated (`sqlite`, `postgres`). Postgres databases are created
    /// on `ZUNO_TEST_DATABASE_URL` (else a container, as in the test suite).
    #[arg(long, value_delimiter = ',', default_value = "sqlite,postgres")]
    backends: Vec<String>,
    /// Experience counts, comma-separated; each gets a fresh database.
    #[arg(long, value_delimiter = ',', default_value = "10000,100000")]
    experiences: Vec<usize>,
    /// Projects the experiences are spread over (evenly).
    #[arg(long, default_value_t = 20)]
    projects: usize,
    /// Timed prompts per round.
    #[arg(long, default_value_t = 300)]
    queries: usize,
    /// Rounds of `--queries` new prompts each; the table shows the median of the rounds'
    /// percentiles.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Untimed prompts first (tokenizer load, statement caches, page cache).
    #[arg(long, default_value_t = 30)]
    warmup: usize,
    /// Generator seed: the same seed gives the same texts and prompts.
    #[arg(long, default_value_t = 4)]
    seed: u64,
    /// Print the table header before the rows.
    #[arg(long)]
    header: bool,
    /// After each SQLite run, keep a copy of the database (receipts included) in this directory
    /// as `recall-<experiences>.db`, for inspection with the `sqlite3` shell.
    #[arg(long)]
    save_sqlite: Option<std::path::PathBuf>,
    /// After each Postgres run, keep a copy of the database as `<this>_<experiences>` on the
    /// same server (replaced if it exists).
    #[arg(long)]
    save_postgres: Option<String>,
    /// Instead of benchmarking: rank prompts against a database saved with `--save-sqlite`, as
    /// `context` ranks them. Reads JSON lines `{"project": …, "prompt": …}` on stdin and writes,
    /// per line, `{"index": [ids…], "search": [ids…], "ms": …}`: the recall index's best 40 and
    /// the best 5 after the final ranking (what `scripts/recall-pruning-check.py` counts).
    #[arg(long)]
    rank_cases: Option<std::path::PathBuf>,
    /// Time `context` alone, without the full-text baselines (for a profiler attached to the
    /// run; the baseline columns then read 0).
    #[arg(long)]
    only_context: bool,
}

/// `--only-context`, read by [`time_prompt`].
static ONLY_CONTEXT: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// `--rank-cases`: see [`Args::rank_cases`].
async fn rank_cases(path: &std::path::Path) -> anyhow::Result<()> {
    use std::io::BufRead;
    let options = zuno_shared::db::ConnectOptions::sqlite_file(path);
    let db = Db::connect(&options, zuno_shared::migrations::schema()).await?;
    for line in std::io::stdin().lock().lines() {
        let case: serde_json::Value = serde_json::from_str(&line?)?;
        let (Some(project), Some(prompt)) = (case["project"].as_str(), case["prompt"].as_str())
        else {
            anyhow::bail!("each line needs \"project\" and \"prompt\"");
        };
        let started = Instant::now();
        let terms = search_terms::parse(prompt);
        let keys = index::query_keys(&terms, Floor::of(prompt).bigrams());
        let top = index::top(&db, project, &keys, 40)
            .await?
            .ok_or_else(|| anyhow::anyhow!("the recall index is behind"))?;
        let elapsed = started.elapsed();
        let search = retrieval::search(&db, project, prompt, 5, MatchMode::Any, now_ms()).await?;
        let line = serde_json::json!({
            "index": top.iter().map(|(id, _)| id).collect::<Vec<_>>(),
            "search": search.iter().map(|hit| &hit.experience.id).collect::<Vec<_>>(),
            "ms": elapsed.as_secs_f64() * 1000.0,
        });
        println!("{line}");
    }
    db.close().await;
    Ok(())
}

const KINDS: &[(&str, f64)] = &[
    ("outcome", 0.30),
    ("problem", 0.20),
    ("correction", 0.20),
    ("feedback", 0.10),
    ("verified_procedure", 0.15),
    ("unresolved_issue", 0.05),
];

/// Share of a project's content words drawn from its topic words.
const TOPIC_SHARE: f64 = 0.25;
const TOPIC_WORDS: usize = 30;

/// Zipf(1.0) over stopwords, coding words and compounds; Zipf(1.0) over the Chinese words.
struct Vocabulary {
    words: Vec<String>,
    cumulative: Vec<f64>,
    cjk_cumulative: Vec<f64>,
}

fn zipf_cumulative(n: usize) -> Vec<f64> {
    let mut total = 0.0;
    let cumulative: Vec<f64> = (0..n)
        .map(|rank| {
            total += 1.0 / (rank + 1) as f64;
            total
        })
        .collect();
    cumulative.into_iter().map(|c| c / total).collect()
}

fn draw(cumulative: &[f64], rng: &mut Rng) -> usize {
    let u = rng.unit();
    cumulative
        .partition_point(|&c| c < u)
        .min(cumulative.len() - 1)
}

/// How one project writes.
struct Style {
    /// Indexes (into the vocabulary) of the project's topic words.
    topics: Vec<usize>,
    /// Chinese mixed with ASCII identifiers.
    chinese: bool,
}

impl Vocabulary {
    fn new(seed: u64, size: usize) -> Vocabulary {
        let mut rng = Rng(seed ^ 0x5eed);
        let mut words: Vec<String> = Vec::with_capacity(size);
        let mut seen = std::collections::HashSet::new();
        for word in STOPWORDS.iter().chain(WORDS) {
            if seen.insert(word.to_string()) {
                words.push(word.to_string());
            }
        }
        while words.len() < size {
            let a = WORDS[rng.below(WORDS.len())];
            let b = WORDS[rng.below(WORDS.len())];
            let word = match rng.below(10) {
                0 | 1 => format!("{a}_{b}"),
                2 => format!(
                    "{}/{a}/{b}.{}",
                    rng.pick(PATH_ROOTS),
                    rng.pick(PATH_EXTENSIONS)
                ),
                3 | 4 => format!("{a}{}", capitalize(b)),
                5 | 6 => format!("{a}-{b}"),
                7 | 8 => format!("{a}.{b}"),
                _ => format!("{a}_{b}_{}", rng.below(100)),
            };
            if seen.insert(word.clone()) {
                words.push(word);
            }
        }
        Vocabulary {
            cumulative: zipf_cumulative(words.len()),
            cjk_cumulative: zipf_cumulative(CJK_WORDS.len()),
            words,
        }
    }

    fn style(&self, rng: &mut Rng, chinese: bool) -> Style {
        let first = STOPWORDS.len();
        let topics = (0..TOPIC_WORDS)
            .map(|_| first + rng.below(3000.min(self.words.len() - first)))
            .collect();
        Style { topics, chinese }
    }

    /// Any word, stopwords included.
    fn word(&self, rng: &mut Rng, style: &Style) -> &str {
        let at = draw(&self.cumulative, rng);
        if at >= STOPWORDS.len() && rng.chance(TOPIC_SHARE) {
            return &self.words[style.topics[rng.below(style.topics.len())]];
        }
        &self.words[at]
    }

    /// A content word (no stopword).
    fn content(&self, rng: &mut Rng, style: &Style) -> &str {
        loop {
            let at = draw(&self.cumulative, rng);
            if at < STOPWORDS.len() {
                continue;
            }
            if rng.chance(TOPIC_SHARE) {
                return &self.words[style.topics[rng.below(style.topics.len())]];
            }
            return &self.words[at];
        }
    }

    fn cjk(&self, rng: &mut Rng) -> &'static str {
        CJK_WORDS[draw(&self.cjk_cumulative, rng)]
    }

    /// `low..=high` words in the project's style.
    fn sentence(&self, rng: &mut Rng, style: &Style, low: usize, high: usize) -> String {
        let n = rng.range(low, high);
        let mut out = String::new();
        if !style.chinese {
            for i in 0..n {
                if i > 0 {
                    out.push(' ');
                }
                out.push_str(self.word(rng, style));
            }
            return out;
        }
        // Chinese words run together, with particles between some; ASCII identifiers stand
        // between spaces.
        let mut last_cjk = false;
        for _ in 0..n {
            if rng.chance(0.65) {
                if last_cjk && rng.chance(0.3) {
                    out.push_str(rng.pick(CJK_PARTICLES));
                } else if !out.is_empty() && !last_cjk {
                    out.push(' ');
                }
                out.push_str(self.cjk(rng));
                if rng.chance(0.08) {
                    out.push('，');
                }
                last_cjk = true;
            } else {
                if !out.is_empty() {
                    out.push(' ');
                }
                out.push_str(self.content(rng, style));
                last_cjk = false;
            }
        }
        out
    }
}

fn capitalize(word: &str) -> String {
    let mut chars = word.chars();
    match chars.next() {
        Some(first) => first.to_uppercase().chain(chars).collect(),
        None => String::new(),
    }
}

struct SeedExperience {
    id: String,
    project_id: String,
    session_id: String,
    kind: &'static str,
    title: String,
    summary: String,
    resolution: Option<String>,
    confidence: f64,
    verification: &'static str,
    status: &'static str,
    source_state: &'static str,
    content_digest: String,
    use_count: i64,
    feedback_score: f64,
    created_at: i64,
    forgotten_at: Option<i64>,
}

struct SeedEvidence {
    experience_id: String,
    ordinal: i64,
    source_id: String,
    address: String,
    message_id: String,
    excerpt: String,
    raw_digest: String,
    verified: bool,
}

struct Project {
    id: String,
    style: Style,
    /// The session prompts are assembled for (not one the experiences came from).
    query_session: String,
    seed_sessions: Vec<String>,
    /// Titles and ids of some of the project's experiences, for prompts related to stored work.
    sample_titles: Vec<(String, String)>,
    /// Live experiences Memory entries can cite, as `(id, kind)`.
    supportable: Vec<(String, &'static str)>,
}

fn generate(
    rng: &mut Rng,
    vocabulary: &Vocabulary,
    project: &Project,
    now: i64,
) -> (SeedExperience, Vec<SeedEvidence>) {
    let id = zuno_shared::ids::new_id("exp");
    let session = &project.seed_sessions[rng.below(project.seed_sessions.len())];
    let style = &project.style;
    let mut pick = rng.unit();
    let kind = KINDS
        .iter()
        .find(|(_, p)| {
            pick -= p;
            pick < 0.0
        })
        .map_or("outcome", |(kind, _)| kind);
    let title = capitalize(&vocabulary.sentence(rng, style, 4, 10));
    let summary = capitalize(&vocabulary.sentence(rng, style, 15, 50)) + ".";
    let resolution = (kind != "unresolved_issue" && rng.chance(0.7))
        .then(|| capitalize(&vocabulary.sentence(rng, style, 8, 35)) + ".");
    let verified = rng.chance(0.55);
    let forgotten = rng.chance(0.02);
    let created_at = now - rng.below(365 * 86_400_000) as i64;
    let digest = content_digest(
        ExperienceKind::parse(kind).unwrap_or(ExperienceKind::Outcome),
        &title,
        &summary,
        resolution.as_deref(),
    );
    let experience = SeedExperience {
        id: id.clone(),
        project_id: project.id.clone(),
        session_id: session.clone(),
        kind,
        title,
        summary,
        resolution,
        confidence: 0.5 + 0.45 * rng.unit(),
        verification: if verified { "verified" } else { "unverified" },
        status: if forgotten { "forgotten" } else { "active" },
        source_state: if rng.chance(0.01) {
            "changed"
        } else {
            "current"
        },
        content_digest: digest,
        use_count: if rng.chance(0.3) {
            rng.range(1, 12) as i64
        } else {
            0
        },
        feedback_score: if rng.chance(0.05) {
            [-0.2, 0.1, 0.2][rng.below(3)]
        } else {
            0.0
        },
        created_at,
        forgotten_at: forgotten.then_some(created_at + 1000),
    };
    let evidence = (0..rng.range(1, 3))
        .map(|ordinal| {
            let message_id = zuno_shared::ids::new_id("msg");
            SeedEvidence {
                experience_id: id.clone(),
                ordinal: ordinal as i64,
                source_id: format!("m{}", ordinal + 1),
                address: format!("session:{session}/message:{message_id}/part:0"),
                message_id,
                excerpt: vocabulary.sentence(rng, style, 20, 60),
                raw_digest: rng.hex(32),
                verified: verified && ordinal == 0,
            }
        })
        .collect();
    (experience, evidence)
}

async fn seed(
    test_db: &TestDb,
    args: &Args,
    count: usize,
    config: &Arc<Config>,
    vocabulary: &Vocabulary,
    rng: &mut Rng,
) -> anyhow::Result<Vec<Project>> {
    let clock = system_clock();
    let store = TranscriptStore::new(test_db.db.clone(), clock.clone());
    let ingestion = LearningIngestion::new(
        store.clone(),
        Ledger::new(test_db.db.clone(), clock),
        config.clone(),
    );
    let mut projects = Vec::new();
    for p in 0..args.projects {
        let id = zuno_shared::ids::new_id("prj");
        store
            .create_project(&NewProject {
                id: id.clone(),
                name: format!("bench project {p}"),
                worktree: None,
            })
            .await?;
        let new_session = NewSession {
            project_id: id.clone(),
            ..NewSession::default()
        };
        let mut seed_sessions = Vec::new();
        for _ in 0..5 {
            seed_sessions.push(ingestion.create_session(&new_session).await?.0.id);
        }
        let query_session = ingestion.create_session(&new_session).await?.0.id;
        projects.push(Project {
            id,
            style: vocabulary.style(rng, p % 10 == 3),
            query_session,
            seed_sessions,
            sample_titles: Vec::new(),
            supportable: Vec::new(),
        });
    }
    let now = now_ms();
    const BATCH: usize = 5000;
    let mut done = 0;
    while done < count {
        let n = BATCH.min(count - done);
        let mut experiences = Vec::with_capacity(n);
        let mut evidence = Vec::with_capacity(n * 2);
        for i in done..done + n {
            let project = &mut projects[i % args.projects];
            let (experience, rows) = generate(rng, vocabulary, project, now);
            if project.sample_titles.len() < 200 && rng.chance(0.05) {
                project
                    .sample_titles
                    .push((experience.title.clone(), experience.id.clone()));
            }
            if project.supportable.len() < 40
                && experience.status == "active"
                && experience.source_state == "current"
                && experience.kind != "unresolved_issue"
                && rng.chance(0.1)
            {
                project
                    .supportable
                    .push((experience.id.clone(), experience.kind));
            }
            experiences.push(experience);
            evidence.extend(rows);
        }
        match test_db.db.pool() {
            Pool::Sqlite(pool) => insert_sqlite(pool, &experiences, &evidence).await?,
            Pool::Postgres(pool) => insert_postgres(pool, &experiences, &evidence).await?,
        }
        done += n;
    }
    seed_memory(&test_db.db, &projects, vocabulary, rng, now).await?;
    // What the writers' transactions do record by record (`recall::index::catch_up_in`), here
    // for the bulk-inserted records at once.
    let started = Instant::now();
    let indexed = index::catch_up(&test_db.db, 200_000).await?;
    eprintln!(
        "  recall index: {indexed} records indexed in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    if let Pool::Postgres(pool) = test_db.db.pool() {
        // What autovacuum would have done shortly after such a load.
        sqlx::query("VACUUM ANALYZE").execute(pool).await?;
    }
    Ok(projects)
}

/// Resident Memory as the memory service leaves it after accepted writes: one global document
/// and one per project, entries within the character caps, derived entries with provenance.
async fn seed_memory(
    db: &Db,
    projects: &[Project],
    vocabulary: &Vocabulary,
    rng: &mut Rng,
    now: i64,
) -> anyhow::Result<()> {
    const LEADS: &[&str] = &["Always", "Never", "Use", "Prefer", "Run", "Keep", "Check"];
    let mut tx = db.begin().await?;
    let english = Style {
        topics: vec![STOPWORDS.len()],
        chinese: false,
    };
    let mut documents: Vec<(Option<&Project>, usize, usize)> = vec![(None, 8, 2200)];
    documents.extend(projects.iter().map(|p| (Some(p), 12, 3000)));
    for (project, entries, cap) in documents {
        let document_id = zuno_shared::ids::new_id("mdoc");
        let scope = if project.is_some() {
            "project"
        } else {
            "global"
        };
        zuno_shared::on_tx!(&mut tx, |conn| {
            sqlx::query(
                "INSERT INTO memory_document (id, scope, project_id, revision, updated_at) VALUES ($1, $2, $3, 1, $4)")
            .bind(&document_id).bind(scope).bind(project.map(|p| p.id.as_str())).bind(now)
            .execute(conn).await.map(|done| done.rows_affected())
        })?;
        let style = project.map_or(&english, |p| &p.style);
        let mut used = 0;
        for position in 0..entries {
            let content = format!(
                "{} {}.",
                rng.pick(LEADS),
                vocabulary.sentence(rng, style, 12, 30)
            );
            used += content.chars().count();
            if used > cap {
                break;
            }
            let supports: Vec<&(String, &str)> = match project {
                Some(p) if position % 2 == 1 && !p.supportable.is_empty() => (0..rng.range(1, 2))
                    .map(|_| &p.supportable[rng.below(p.supportable.len())])
                    .collect(),
                _ => Vec::new(),
            };
            let entry_id = zuno_shared::ids::new_id("ment");
            let owner = if supports.is_empty() {
                "user"
            } else {
                "automatic"
            };
            zuno_shared::on_tx!(&mut tx, |conn| {
                sqlx::query(
                    "INSERT INTO memory_entry (id, document_id, content, owner, derived, position, created_revision, created_at) \
                     VALUES ($1, $2, $3, $4, $5, $6, 1, $7)")
                .bind(&entry_id).bind(&document_id).bind(&content).bind(owner)
                .bind(!supports.is_empty()).bind(position as i64).bind(now)
                .execute(conn).await.map(|done| done.rows_affected())
            })?;
            for (experience_id, kind) in supports {
                zuno_shared::on_tx!(&mut tx, |conn| {
                    sqlx::query(
                        "INSERT INTO memory_provenance (entry_id, experience_id, experience_kind) VALUES ($1, $2, $3) \
                         ON CONFLICT DO NOTHING")
                    .bind(&entry_id).bind(experience_id).bind(*kind)
                    .execute(conn).await.map(|done| done.rows_affected())
                })?;
            }
        }
    }
    tx.commit().await?;
    Ok(())
}

const EXPERIENCE_INSERT: &str = "INSERT INTO experience_record (id, project_id, session_id, origin, \
    kind, title, summary, resolution, confidence, verification, status, source_state, \
    content_digest, use_count, feedback_score, created_at, updated_at, forgotten_at)";
const EVIDENCE_INSERT: &str = "INSERT INTO experience_evidence (experience_id, ordinal, \
    source_id, address, message_id, excerpt, raw_digest, redacted_digest, verified)";

async fn insert_sqlite(
    pool: &sqlx::SqlitePool,
    experiences: &[SeedExperience],
    evidence: &[SeedEvidence],
) -> anyhow::Result<()> {
    let mut tx = pool.begin().await?;
    let sql = format!(
        "{EXPERIENCE_INSERT} VALUES ($1, $2, $3, 'extraction', $4, $5, $6, $7, $8, $9, $10, $11, \
         $12, $13, $14, $15, $15, $16)"
    );
    for e in experiences {
        sqlx::query(sqlx::AssertSqlSafe(sql.as_str()))
            .bind(&e.id)
            .bind(&e.project_id)
            .bind(&e.session_id)
            .bind(e.kind)
            .bind(&e.title)
            .bind(&e.summary)
            .bind(&e.resolution)
            .bind(e.confidence)
            .bind(e.verification)
            .bind(e.status)
            .bind(e.source_state)
            .bind(&e.content_digest)
            .bind(e.use_count)
            .bind(e.feedback_score)
            .bind(e.created_at)
            .bind(e.forgotten_at)
            .execute(&mut *tx)
            .await?;
    }
    let sql = format!("{EVIDENCE_INSERT} VALUES ($1, $2, $3, $4, $5, $6, $7, $7, $8)");
    for v in evidence {
        sqlx::query(sqlx::AssertSqlSafe(sql.as_str()))
            .bind(&v.experience_id)
            .bind(v.ordinal)
            .bind(&v.source_id)
            .bind(&v.address)
            .bind(&v.message_id)
            .bind(&v.excerpt)
            .bind(&v.raw_digest)
            .bind(v.verified)
            .execute(&mut *tx)
            .await?;
    }
    tx.commit().await?;
    Ok(())
}

async fn insert_postgres(
    pool: &sqlx::PgPool,
    experiences: &[SeedExperience],
    evidence: &[SeedEvidence],
) -> anyhow::Result<()> {
    fn column<T: Clone, R>(rows: &[R], f: impl Fn(&R) -> T) -> Vec<T> {
        rows.iter().map(f).collect()
    }
    let mut tx = pool.begin().await?;
    let sql = format!(
        "{EXPERIENCE_INSERT} SELECT id, project_id, session_id, 'extraction', kind, title, \
         summary, resolution, confidence, verification, status, source_state, content_digest, \
         use_count, feedback_score, created_at, created_at, forgotten_at \
         FROM UNNEST($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], \
                     $7::text[], $8::float8[], $9::text[], $10::text[], $11::text[], $12::text[], \
                     $13::int8[], $14::float8[], $15::int8[], $16::int8[]) \
           AS t(id, project_id, session_id, kind, title, summary, resolution, confidence, \
                verification, status, source_state, content_digest, use_count, feedback_score, \
                created_at, forgotten_at)"
    );
    sqlx::query(sqlx::AssertSqlSafe(sql.as_str()))
        .bind(column(experiences, |e| e.id.clone()))
        .bind(column(experiences, |e| e.project_id.clone()))
        .bind(column(experiences, |e| e.session_id.clone()))
        .bind(column(experiences, |e| e.kind.to_owned()))
        .bind(column(experiences, |e| e.title.clone()))
        .bind(column(experiences, |e| e.summary.clone()))
        .bind(column(experiences, |e| e.resolution.clone()))
        .bind(column(experiences, |e| e.confidence))
        .bind(column(experiences, |e| e.verification.to_owned()))
        .bind(column(experiences, |e| e.status.to_owned()))
        .bind(column(experiences, |e| e.source_state.to_owned()))
        .bind(column(experiences, |e| e.content_digest.clone()))
        .bind(column(experiences, |e| e.use_count))
        .bind(column(experiences, |e| e.feedback_score))
        .bind(column(experiences, |e| e.created_at))
        .bind(column(experiences, |e| e.forgotten_at))
        .execute(&mut *tx)
        .await?;
    let sql = format!(
        "{EVIDENCE_INSERT} SELECT experience_id, ordinal, source_id, address, message_id, \
         excerpt, raw_digest, raw_digest, verified \
         FROM UNNEST($1::text[], $2::int8[], $3::text[], $4::text[], $5::text[], $6::text[], \
                     $7::text[], $8::bool[]) \
           AS t(experience_id, ordinal, source_id, address, message_id, excerpt, raw_digest, \
                verified)"
    );
    sqlx::query(sqlx::AssertSqlSafe(sql.as_str()))
        .bind(column(evidence, |v| v.experience_id.clone()))
        .bind(column(evidence, |v| v.ordinal))
        .bind(column(evidence, |v| v.source_id.clone()))
        .bind(column(evidence, |v| v.address.clone()))
        .bind(column(evidence, |v| v.message_id.clone()))
        .bind(column(evidence, |v| v.excerpt.clone()))
        .bind(column(evidence, |v| v.raw_digest.clone()))
        .bind(column(evidence, |v| v.verified))
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(())
}

/// A prompt for `project` (see the module docs for the mix).
fn prompt(rng: &mut Rng, vocabulary: &Vocabulary, project: &Project) -> (String, Option<String>) {
    let style = &project.style;
    let chinese = style.chinese;
    let fresh = |rng: &mut Rng, low, high| vocabulary.sentence(rng, style, low, high);
    let roll = rng.unit();
    if roll < 0.40 && !project.sample_titles.is_empty() {
        // Part of a stored title, in a question.
        let (title, target) = &project.sample_titles[rng.below(project.sample_titles.len())];
        let title = title.to_lowercase();
        let part: String = if chinese {
            let chars: Vec<char> = title.chars().collect();
            let keep = rng.range(chars.len().div_ceil(2), chars.len());
            let start = rng.below(chars.len() - keep + 1);
            chars[start..start + keep].iter().collect()
        } else {
            let words: Vec<&str> = title.split(' ').collect();
            let keep = rng.range(words.len().div_ceil(2), words.len());
            let start = rng.below(words.len() - keep + 1);
            words[start..start + keep].join(" ")
        };
        let tail = fresh(rng, 0, 8);
        let text = match (chinese, rng.below(3)) {
            (false, 0) => format!("why does {part} fail again? {tail}"),
            (false, 1) => format!("how do we handle {part} here; {tail}"),
            (false, _) => format!("{part} {tail}"),
            (true, 0) => format!("为什么{part}又失败了？{tail}"),
            (true, 1) => format!("这里怎么处理{part}，{tail}"),
            (true, _) => format!("{part} {tail}"),
        };
        return (text, Some(target.clone()));
    }
    if roll < 0.75 {
        return (fresh(rng, 4, 30), None);
    }
    if roll < 0.85 {
        return (fresh(rng, 1, 3), None);
    }
    if roll < 0.90 {
        let (a, b) = (
            vocabulary.content(rng, style).to_owned(),
            vocabulary.content(rng, style).to_owned(),
        );
        let tail = fresh(rng, 3, 12);
        return (
            format!("no, that's wrong: don't use {a}, use {b} instead. {tail}"),
            None,
        );
    }
    if roll < 0.95 {
        let tail = fresh(rng, 3, 12);
        return (format!("thanks, looks good. now {tail}"), None);
    }
    // A pasted log.
    let mut out = String::from("it fails with:\n");
    let lines = rng.range(4, 15);
    for _ in 0..lines {
        let line = fresh(rng, 20, 20);
        out.push_str(&format!(
            "[{}] error: {}\n",
            rng.hex(4),
            line.replace(' ', if rng.chance(0.3) { "::" } else { " " })
        ));
    }
    (out, None)
}

/// The bare query: same index, same project scope, same terms as `context` searches for;
/// `ranked` orders by relevance and keeps 40 (what `context` must do at least once), otherwise
/// unranked, first 50.
async fn bare_fts(
    db: &Db,
    project_id: &str,
    terms: &QueryTerms,
    ranked: bool,
) -> anyhow::Result<Vec<String>> {
    match db.pool() {
        Pool::Sqlite(pool) => {
            let Some(expression) = terms.fts5_unicode(MatchMode::Any) else {
                return Ok(Vec::new());
            };
            let scope = format!("p{}", hex_lower(project_id));
            let matcher =
                format!("scope:\"{scope}\" AND {{title summary resolution}}: ({expression})");
            // The ids of the (at most 40 or 50) rows found, in rank order.
            let sql = if ranked {
                "SELECT k.experience_id FROM (SELECT rowid AS num, bm25(experience_fts, 0.0, 5.0, 2.0, 1.0) AS rank \
                   FROM experience_fts WHERE experience_fts MATCH $1 ORDER BY rank LIMIT 40) found \
                 JOIN experience_search_key k ON k.num = found.num ORDER BY found.rank, found.num"
            } else {
                "SELECT k.experience_id FROM (SELECT rowid AS num FROM experience_fts \
                   WHERE experience_fts MATCH $1 LIMIT 50) found \
                 JOIN experience_search_key k ON k.num = found.num"
            };
            let rows: Vec<String> = sqlx::query_scalar(sql)
                .bind(&matcher)
                .fetch_all(pool)
                .await?;
            Ok(rows)
        }
        Pool::Postgres(pool) => {
            let texts = terms.texts();
            if texts.is_empty() {
                return Ok(Vec::new());
            }
            let tsquery: Vec<String> = (0..texts.len())
                .map(|i| format!("plainto_tsquery('simple', ${})", i + 2))
                .collect();
            let sql = if ranked {
                format!(
                    "SELECT id FROM experience_record, (SELECT {}) AS tsq(q) \
                     WHERE project_id = $1 AND search_vector @@ q \
                     ORDER BY ts_rank_cd(search_vector, q) DESC LIMIT 40",
                    tsquery.join(" || ")
                )
            } else {
                format!(
                    "SELECT id FROM experience_record \
                     WHERE project_id = $1 AND search_vector @@ ({}) LIMIT 50",
                    tsquery.join(" || ")
                )
            };
            let mut query = sqlx::query_scalar(sqlx::AssertSqlSafe(sql.as_str())).bind(project_id);
            for text in texts {
                query = query.bind(text);
            }
            let rows: Vec<String> = query.fetch_all(pool).await?;
            Ok(rows)
        }
    }
}

fn hex_lower(text: &str) -> String {
    text.bytes().map(|b| format!("{b:02x}")).collect()
}

/// Nearest-rank percentile in milliseconds.
fn percentile(samples: &[Duration], quantile: f64) -> f64 {
    let mut sorted = samples.to_vec();
    sorted.sort();
    let rank = ((quantile * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1].as_secs_f64() * 1000.0
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n.is_multiple_of(2) {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    } else {
        values[n / 2]
    }
}

/// One side's samples, one list per round.
#[derive(Default)]
struct Timings(Vec<Vec<Duration>>);

impl Timings {
    /// Median over rounds of each round's `quantile`.
    fn ms(&self, quantile: f64) -> f64 {
        median(self.0.iter().map(|r| percentile(r, quantile)).collect())
    }

    fn max_ms(&self) -> f64 {
        self.0
            .iter()
            .flatten()
            .max()
            .map_or(0.0, |d| d.as_secs_f64() * 1000.0)
    }
}

struct Row {
    backend: &'static str,
    experiences: usize,
    context: Timings,
    bare: Timings,
    ranked: Timings,
    /// Rows the bare query returned and experiences `context` selected, summed over all
    /// timed prompts.
    matched: usize,
    selected: usize,
    samples: usize,
    /// Timed prompts that quote a stored title, and how often the quoted experience was in
    /// the ranked FTS top 5, the recall index's top 5 and `context`'s selection.
    quoting: usize,
    hits: [usize; 3],
}

impl Row {
    fn markdown(&self) -> String {
        format!(
            "| {} | {} | {:.2} | **{:.2}** | {:.1} | {:.2} | {:.2} | {:.2} | {:.2} | {:.1} | {:.1} | {q} | {} | {} | {} |",
            self.backend,
            thousands(self.experiences),
            self.context.ms(0.5),
            self.context.ms(0.99),
            self.context.max_ms(),
            self.bare.ms(0.5),
            self.bare.ms(0.99),
            self.ranked.ms(0.5),
            self.ranked.ms(0.99),
            self.matched as f64 / self.samples as f64,
            self.selected as f64 / self.samples as f64,
            self.hits[0],
            self.hits[1],
            self.hits[2],
            q = self.quoting,
        )
    }
}

fn thousands(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|text| text.split(' ').take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| String::from("?"))
}

/// One prompt's measurements.
struct Sample {
    /// `context`, bare FTS, ranked FTS.
    times: [Duration; 3],
    /// Rows the bare query returned and experiences `context` selected.
    matched: usize,
    selected: usize,
    /// For a prompt quoting a stored title: whether that experience is in the ranked FTS
    /// query's top 5, in the recall index's top 5, and among what `context` selected.
    hits: Option<[bool; 3]>,
}

/// Times `context`, the bare and the ranked query for one prompt, in an order that rotates
/// with `turn`; then, untimed, looks the quoted experience (if any) up in the recall index's
/// top 5.
async fn time_prompt(
    db: &Db,
    config: &Config,
    project: &Project,
    (prompt, target): &(String, Option<String>),
    turn: usize,
) -> anyhow::Result<Sample> {
    let terms = search_terms::parse(prompt);
    let mut times = [Duration::ZERO; 3];
    let (mut matched, mut selected) = (0, Vec::new());
    let mut fts_top = Vec::new();
    for step in 0..3 {
        let side = (turn + step) % 3;
        if side != 0 && ONLY_CONTEXT.load(std::sync::atomic::Ordering::Relaxed) {
            continue;
        }
        let start = Instant::now();
        match side {
            0 => {
                let context =
                    retrieval::assemble(db, config, &project.query_session, prompt, now_ms())
                        .await?
                        .ok_or_else(|| anyhow::anyhow!("session disappeared"))?;
                selected = context.experience_ids;
            }
            1 => matched = bare_fts(db, &project.id, &terms, false).await?.len(),
            _ => fts_top = bare_fts(db, &project.id, &terms, true).await?,
        }
        times[side] = start.elapsed();
    }
    let hits = match target {
        Some(target) => {
            let keys = index::query_keys(&terms, Floor::of(prompt).bigrams());
            let index_top = index::top(db, &project.id, &keys, 5)
                .await?
                .ok_or_else(|| anyhow::anyhow!("the recall index is behind"))?;
            Some([
                fts_top.iter().take(5).any(|id| id == target),
                index_top.iter().any(|(id, _)| id == target),
                selected.iter().any(|id| id == target),
            ])
        }
        None => None,
    };
    Ok(Sample {
        times,
        matched,
        selected: selected.len(),
        hits,
    })
}

async fn run(args: &Args, backend: Backend, count: usize) -> anyhow::Result<Row> {
    let mut rng = Rng(args.seed.wrapping_mul(1_000_003).wrapping_add(count as u64));
    let vocabulary = Vocabulary::new(args.seed, 20_000);
    let config = Arc::new(Config::default());
    let test_db = TestDb::new(backend).await;
    let name = match backend {
        Backend::Sqlite => "SQLite",
        Backend::Postgres => "Postgres",
    };
    let started = Instant::now();
    let projects = seed(&test_db, args, count, &config, &vocabulary, &mut rng).await?;
    eprintln!(
        "{name}, {count} experiences: seeded in {:.1} s (load {})",
        started.elapsed().as_secs_f64(),
        load_average()
    );
    let db = &test_db.db;
    // Every prompt is new: no round repeats another's, so nothing is timed warm twice.
    let total = args.warmup + args.rounds * args.queries;
    let mut prompts = Vec::with_capacity(total);
    for _ in 0..total {
        let project = &projects[rng.below(projects.len())];
        prompts.push((project, prompt(&mut rng, &vocabulary, project)));
    }
    let (warmup, timed) = prompts.split_at(args.warmup);
    for (turn, (project, prompt)) in warmup.iter().enumerate() {
        time_prompt(db, &config, project, prompt, turn).await?;
    }
    let mut row = Row {
        backend: name,
        experiences: count,
        context: Timings::default(),
        bare: Timings::default(),
        ranked: Timings::default(),
        matched: 0,
        selected: 0,
        samples: 0,
        quoting: 0,
        hits: [0; 3],
    };
    for round in 0..args.rounds {
        let mut sides: [Vec<Duration>; 3] = Default::default();
        let batch = &timed[round * args.queries..(round + 1) * args.queries];
        for (turn, (project, prompt)) in batch.iter().enumerate() {
            let sample = time_prompt(db, &config, project, prompt, turn).await?;
            for (side, time) in sides.iter_mut().zip(sample.times) {
                side.push(time);
            }
            row.matched += sample.matched;
            row.selected += sample.selected;
            row.samples += 1;
            if let Some(hits) = sample.hits {
                row.quoting += 1;
                for (count, hit) in row.hits.iter_mut().zip(hits) {
                    *count += usize::from(hit);
                }
            }
        }
        eprintln!(
            "  round {}: context p50 {:.2} p99 {:.2} ms, bare p50 {:.2} p99 {:.2} ms, ranked p50 {:.2} p99 {:.2} ms (load {})",
            round + 1,
            percentile(&sides[0], 0.5),
            percentile(&sides[0], 0.99),
            percentile(&sides[1], 0.5),
            percentile(&sides[1], 0.99),
            percentile(&sides[2], 0.5),
            percentile(&sides[2], 0.99),
            load_average()
        );
        let [context, bare, ranked] = sides;
        row.context.0.push(context);
        row.bare.0.push(bare);
        row.ranked.0.push(ranked);
    }
    if let (Some(prefix), Backend::Postgres) = (&args.save_postgres, backend) {
        anyhow::ensure!(
            prefix
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'),
            "--save-postgres takes [a-z0-9_]"
        );
        let source = test_db
            .url
            .rsplit('/')
            .next()
            .and_then(|name| name.split('?').next())
            .unwrap_or_default()
            .to_owned();
        db.close().await;
        let admin = sqlx::PgPool::connect(&zuno_tests::postgres_admin_url()).await?;
        for sql in [
            format!("DROP DATABASE IF EXISTS {prefix}_{count} WITH (FORCE)"),
            format!("CREATE DATABASE {prefix}_{count} TEMPLATE {source}"),
        ] {
            sqlx::query(sqlx::AssertSqlSafe(sql))
                .execute(&admin)
                .await?;
        }
        admin.close().await;
    }
    if let (Some(dir), Pool::Sqlite(pool)) = (&args.save_sqlite, db.pool()) {
        std::fs::create_dir_all(dir)?;
        let path = dir.join(format!("recall-{count}.db"));
        let _ = std::fs::remove_file(&path);
        sqlx::query("VACUUM INTO $1")
            .bind(path.to_string_lossy().into_owned())
            .execute(pool)
            .await?;
    }
    Ok(row)
}

const HEADER: &str = "| backend | experiences | context p50 ms | context p99 ms | context max ms | \
bare FTS p50 ms | bare FTS p99 ms | ranked FTS p50 ms | ranked FTS p99 ms | bare rows | selected | \
quoting prompts | quoted in ranked FTS top 5 | quoted in index top 5 | quoted in context |\n\
|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|";

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    ONLY_CONTEXT.store(args.only_context, std::sync::atomic::Ordering::Relaxed);
    if let Some(path) = &args.rank_cases {
        return rank_cases(path).await;
    }
    anyhow::ensure!(
        args.projects > 0 && args.queries > 0 && args.rounds > 0,
        "--projects, --queries and --rounds must be positive"
    );
    if args.header {
        println!("{HEADER}");
    }
    for backend in &args.backends {
        let backend = match backend.as_str() {
            "sqlite" => Backend::Sqlite,
            "postgres" => Backend::Postgres,
            other => anyhow::bail!("unknown backend `{other}` (sqlite or postgres)"),
        };
        for &count in &args.experiences {
            let row = run(&args, backend, count).await?;
            println!("{}", row.markdown());
        }
    }
    Ok(())
}
