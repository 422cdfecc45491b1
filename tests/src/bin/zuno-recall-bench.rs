//! `context` latency beside a bare full-text query on the same data in the same run (issue #4).
//!
//! For each backend and size it creates a fresh, migrated database (SQLite: a new file in a
//! temporary directory; Postgres: a new database on `ZUNO_TEST_DATABASE_URL`, dropped at the
//! end — see [`zuno_tests::TestDb`]), seeds N experiences with evidence across `--projects`
//! projects from a fixed-seed generator, and then times, per prompt and interleaved so drift
//! affects all sides alike:
//!
//! - **context**: `retrieval::assemble` — the whole `/context` call: session policy, Memory
//!   documents, the project-scoped text search, ranking, budgeted rendering with the real
//!   tokenizer, and the receipt/use-count/event write in one transaction;
//! - **bare FTS**: the same terms of the same prompt against the same index, unranked, first 50
//!   rows (SQLite: `SELECT rowid FROM experience_fts WHERE experience_fts MATCH ? LIMIT 50` with
//!   the project's scope token; Postgres: `SELECT id FROM experience_record WHERE project_id = $1
//!   AND search_vector @@ (<one plainto_tsquery per term, OR-ed>) LIMIT 50`);
//! - **ranked FTS**: the same query ordered by relevance, first 40 (what `context` must do at
//!   least once), for reading where the time goes.
//!
//! Prints one Markdown table row per (backend, size) on stdout; progress goes to stderr. It is a
//! binary, not a test: nothing runs it as part of the suite.

use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use zuno_shared::clock::{now_ms, system_clock};
use zuno_shared::config::Config;
use zuno_shared::db::{Backend, Pool};
use zuno_shared::learning::LearningIngestion;
use zuno_shared::learning::experience::content_digest;
use zuno_shared::learning::extraction::ExperienceKind;
use zuno_shared::learning::recall::query::{self, MatchMode, QueryTerms};
use zuno_shared::learning::retrieval;
use zuno_shared::ledger::Ledger;
use zuno_shared::transcript::{NewProject, NewSession, TranscriptStore};
use zuno_tests::TestDb;

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
    /// Timed prompts per (backend, size), after the warm-up.
    #[arg(long, default_value_t = 500)]
    queries: usize,
    /// Untimed prompts first (tokenizer load, statement caches, page cache).
    #[arg(long, default_value_t = 50)]
    warmup: usize,
    /// Generator seed: the same seed gives the same texts and prompts.
    #[arg(long, default_value_t = 4)]
    seed: u64,
    /// Print the table header before the rows.
    #[arg(long)]
    header: bool,
}

/// SplitMix64: small, fast and deterministic; the data need not be cryptographic.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn range(&mut self, low: usize, high: usize) -> usize {
        low + self.below(high - low + 1)
    }

    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }

    fn hex(&mut self, bytes: usize) -> String {
        let mut out = String::with_capacity(bytes * 2);
        while out.len() < bytes * 2 {
            out.push_str(&format!("{:016x}", self.next()));
        }
        out.truncate(bytes * 2);
        out
    }
}

/// Words of coding-agent transcripts, roughly most frequent first: the head of the Zipf
/// distribution below. The tail is compound identifiers and paths built from them.
const WORDS: &[&str] = &[
    "test",
    "build",
    "error",
    "file",
    "function",
    "config",
    "run",
    "fix",
    "use",
    "type",
    "data",
    "change",
    "code",
    "add",
    "update",
    "check",
    "value",
    "return",
    "module",
    "version",
    "command",
    "project",
    "path",
    "failed",
    "import",
    "package",
    "database",
    "query",
    "server",
    "client",
    "request",
    "response",
    "api",
    "user",
    "string",
    "list",
    "script",
    "install",
    "cargo",
    "npm",
    "pnpm",
    "rust",
    "python",
    "typescript",
    "node",
    "docker",
    "migration",
    "schema",
    "table",
    "index",
    "column",
    "sqlite",
    "postgres",
    "transaction",
    "lock",
    "timeout",
    "retry",
    "cache",
    "log",
    "debug",
    "trace",
    "warning",
    "panic",
    "crash",
    "memory",
    "thread",
    "async",
    "await",
    "future",
    "task",
    "job",
    "queue",
    "worker",
    "lease",
    "token",
    "auth",
    "session",
    "cookie",
    "header",
    "json",
    "yaml",
    "toml",
    "env",
    "variable",
    "secret",
    "key",
    "field",
    "struct",
    "enum",
    "trait",
    "impl",
    "method",
    "class",
    "interface",
    "component",
    "render",
    "state",
    "hook",
    "props",
    "route",
    "handler",
    "middleware",
    "endpoint",
    "http",
    "grpc",
    "socket",
    "stream",
    "buffer",
    "parse",
    "serialize",
    "deserialize",
    "encode",
    "decode",
    "format",
    "lint",
    "clippy",
    "rustfmt",
    "eslint",
    "prettier",
    "formatter",
    "compile",
    "compiler",
    "linker",
    "dependency",
    "crate",
    "workspace",
    "feature",
    "flag",
    "option",
    "argument",
    "default",
    "override",
    "merge",
    "branch",
    "commit",
    "rebase",
    "git",
    "diff",
    "patch",
    "review",
    "ci",
    "pipeline",
    "deploy",
    "release",
    "tag",
    "image",
    "container",
    "volume",
    "network",
    "port",
    "host",
    "dns",
    "tls",
    "certificate",
    "proxy",
    "upstream",
    "download",
    "upload",
    "network",
    "offline",
    "vendor",
    "lockfile",
    "checksum",
    "hash",
    "digest",
    "signature",
    "verify",
    "assert",
    "expect",
    "mock",
    "fixture",
    "snapshot",
    "coverage",
    "benchmark",
    "profile",
    "latency",
    "throughput",
    "slow",
    "fast",
    "regression",
    "flaky",
    "deadlock",
    "race",
    "mutex",
    "channel",
    "callback",
    "closure",
    "lifetime",
    "borrow",
    "ownership",
    "clone",
    "reference",
    "pointer",
    "null",
    "undefined",
    "option",
    "result",
    "unwrap",
    "exception",
    "stack",
    "heap",
    "alloc",
    "leak",
    "overflow",
    "bounds",
    "range",
    "iterator",
    "vector",
    "map",
    "set",
    "tree",
    "graph",
    "node",
    "edge",
    "sort",
    "search",
    "filter",
    "reduce",
    "batch",
    "chunk",
    "page",
    "offset",
    "limit",
    "cursor",
    "pagination",
    "window",
    "event",
    "listener",
    "signal",
    "shutdown",
    "startup",
    "restart",
    "health",
    "readiness",
    "metrics",
    "telemetry",
    "span",
    "exporter",
    "collector",
    "dashboard",
    "alert",
    "quota",
    "budget",
    "cost",
    "provider",
    "model",
    "prompt",
    "context",
    "completion",
    "embedding",
    "vector",
    "recall",
    "ranking",
    "score",
    "weight",
    "threshold",
    "window",
    "encoding",
    "utf8",
    "unicode",
    "locale",
    "timezone",
    "timestamp",
    "date",
    "duration",
    "interval",
    "cron",
    "schedule",
    "backoff",
    "jitter",
    "idempotent",
    "duplicate",
    "unique",
    "constraint",
    "foreign",
    "cascade",
    "trigger",
    "view",
    "permission",
    "role",
    "grant",
    "owner",
    "directory",
    "symlink",
    "mount",
    "filesystem",
    "disk",
    "fsync",
    "wal",
    "checkpoint",
    "vacuum",
    "analyze",
    "explain",
    "plan",
    "scan",
    "seek",
    "join",
    "aggregate",
    "group",
    "order",
    "window",
    "partition",
    "replica",
    "primary",
    "failover",
    "backup",
    "restore",
    "dump",
    "export",
    "import",
    "archive",
    "compress",
    "gzip",
    "zstd",
    "tarball",
    "wheel",
    "venv",
    "pip",
    "poetry",
    "uv",
    "tox",
    "pytest",
    "jest",
    "vitest",
    "mocha",
    "nextest",
    "tokio",
    "axum",
    "sqlx",
    "serde",
    "reqwest",
    "hyper",
    "tonic",
    "prost",
    "react",
    "vue",
    "svelte",
    "webpack",
    "vite",
    "esbuild",
    "babel",
    "tsconfig",
    "monorepo",
    "turbo",
    "bazel",
    "make",
    "cmake",
    "gcc",
    "clang",
    "llvm",
    "wasm",
    "arm64",
    "x86",
    "musl",
    "glibc",
    "alpine",
    "debian",
    "ubuntu",
    "macos",
    "windows",
    "wsl",
    "shell",
    "bash",
    "zsh",
    "powershell",
    "terminal",
    "stdout",
    "stderr",
    "exit",
    "status",
    "code",
    "signal",
    "kill",
    "process",
    "pid",
    "fork",
    "spawn",
    "pipe",
    "redirect",
    "quote",
    "escape",
    "regex",
    "glob",
    "wildcard",
    "pattern",
    "template",
    "macro",
    "generic",
    "inference",
    "annotation",
    "decorator",
];

/// Filler that `query::parse` drops as stopwords, so prompts read like sentences.
const FILLER: &[&str] = &[
    "the", "a", "in", "when", "is", "it", "to", "and", "of", "we", "this", "for", "with", "on",
    "after", "but", "should", "please", "can", "you",
];

const KINDS: &[(&str, f64)] = &[
    ("outcome", 0.30),
    ("problem", 0.20),
    ("correction", 0.20),
    ("feedback", 0.10),
    ("verified_procedure", 0.15),
    ("unresolved_issue", 0.05),
];

/// Zipf(s = 1.05) over the base words plus a long tail of compound identifiers.
struct Vocabulary {
    words: Vec<String>,
    cumulative: Vec<f64>,
}

impl Vocabulary {
    fn new(seed: u64, size: usize) -> Vocabulary {
        let mut rng = Rng(seed ^ 0x5eed);
        let mut words: Vec<String> = Vec::with_capacity(size);
        let mut seen = std::collections::HashSet::new();
        for word in WORDS {
            if seen.insert(word.to_string()) {
                words.push(word.to_string());
            }
        }
        while words.len() < size {
            let a = WORDS[rng.below(WORDS.len())];
            let b = WORDS[rng.below(WORDS.len())];
            let word = match rng.below(6) {
                0 => format!("{a}_{b}"),
                1 => format!("src/{a}/{b}.rs"),
                2 => format!("{a}{}", capitalize(b)),
                3 => format!("{a}-{b}"),
                4 => format!("{a}.{b}"),
                _ => format!("{a}_{b}_{}", rng.below(100)),
            };
            if seen.insert(word.clone()) {
                words.push(word);
            }
        }
        let mut total = 0.0;
        let cumulative = (0..words.len())
            .map(|rank| {
                total += 1.0 / ((rank + 1) as f64).powf(1.05);
                total
            })
            .collect::<Vec<_>>();
        let cumulative = cumulative.into_iter().map(|c| c / total).collect();
        Vocabulary { words, cumulative }
    }

    fn word(&self, rng: &mut Rng) -> &str {
        let u = rng.unit();
        let at = self.cumulative.partition_point(|&c| c < u);
        &self.words[at.min(self.words.len() - 1)]
    }

    fn sentence(&self, rng: &mut Rng, low: usize, high: usize) -> String {
        let n = rng.range(low, high);
        let mut out = String::new();
        for i in 0..n {
            if i > 0 {
                out.push(' ');
            }
            if i > 0 && rng.chance(0.3) {
                out.push_str(FILLER[rng.below(FILLER.len())]);
                out.push(' ');
            }
            out.push_str(self.word(rng));
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
    /// The session prompts are assembled for (not one the experiences came from).
    query_session: String,
    /// Titles of some of the project's experiences, for prompts related to stored work.
    sample_titles: Vec<String>,
}

fn generate(
    rng: &mut Rng,
    vocabulary: &Vocabulary,
    project: &str,
    session: &str,
    now: i64,
) -> (SeedExperience, Vec<SeedEvidence>) {
    let id = zuno_shared::ids::new_id("exp");
    let mut pick = rng.unit();
    let kind = KINDS
        .iter()
        .find(|(_, p)| {
            pick -= p;
            pick < 0.0
        })
        .map_or("outcome", |(kind, _)| kind);
    let title = capitalize(&vocabulary.sentence(rng, 4, 10));
    let summary = capitalize(&vocabulary.sentence(rng, 15, 50)) + ".";
    let resolution = (kind != "unresolved_issue" && rng.chance(0.7))
        .then(|| capitalize(&vocabulary.sentence(rng, 8, 35)) + ".");
    let verified = rng.chance(0.4);
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
        project_id: project.to_owned(),
        session_id: session.to_owned(),
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
                excerpt: vocabulary.sentence(rng, 20, 60),
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
    let mut seed_sessions = Vec::new();
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
        let mut sessions = Vec::new();
        for _ in 0..5 {
            sessions.push(ingestion.create_session(&new_session).await?.0.id);
        }
        let query_session = ingestion.create_session(&new_session).await?.0.id;
        seed_sessions.push(sessions);
        projects.push(Project {
            id,
            query_session,
            sample_titles: Vec::new(),
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
            let p = i % args.projects;
            let session = &seed_sessions[p][rng.below(5)];
            let (experience, rows) = generate(rng, vocabulary, &projects[p].id, session, now);
            if projects[p].sample_titles.len() < 200 && rng.chance(0.05) {
                projects[p].sample_titles.push(experience.title.clone());
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
    if let Pool::Postgres(pool) = test_db.db.pool() {
        // What autovacuum would have done shortly after such a load.
        sqlx::query("ANALYZE").execute(pool).await?;
    }
    Ok(projects)
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

/// A prompt: half of them restate a stored experience's title in other words (a related
/// question), the rest are fresh text from the same vocabulary.
fn prompt(rng: &mut Rng, vocabulary: &Vocabulary, project: &Project) -> String {
    let fresh = vocabulary.sentence(rng, 6, 30);
    if project.sample_titles.is_empty() || rng.chance(0.5) {
        return fresh;
    }
    let title = &project.sample_titles[rng.below(project.sample_titles.len())];
    let words: Vec<&str> = fresh.split(' ').collect();
    let keep = words.len().min(rng.range(2, 10));
    format!(
        "why does {} fail again? {}",
        title.to_lowercase(),
        words[..keep].join(" ")
    )
}

/// The bare query: same index, same project scope, same terms as `context` searches for,
/// unranked, first 50.
async fn bare_fts(
    db: &zuno_shared::db::Db,
    project_id: &str,
    terms: &QueryTerms,
    ranked: bool,
) -> anyhow::Result<usize> {
    match db.pool() {
        Pool::Sqlite(pool) => {
            let Some(expression) = terms.fts5_unicode(MatchMode::Any) else {
                return Ok(0);
            };
            let scope = format!("p{}", hex_lower(project_id));
            let matcher =
                format!("scope:\"{scope}\" AND {{title summary resolution}}: ({expression})");
            let sql = if ranked {
                "SELECT rowid FROM experience_fts WHERE experience_fts MATCH $1 \
                 ORDER BY bm25(experience_fts, 0.0, 5.0, 2.0, 1.0) LIMIT 40"
            } else {
                "SELECT rowid FROM experience_fts WHERE experience_fts MATCH $1 LIMIT 50"
            };
            let rows: Vec<i64> = sqlx::query_scalar(sql)
                .bind(&matcher)
                .fetch_all(pool)
                .await?;
            Ok(rows.len())
        }
        Pool::Postgres(pool) => {
            let texts = terms.texts();
            if texts.is_empty() {
                return Ok(0);
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
            Ok(rows.len())
        }
    }
}

fn hex_lower(text: &str) -> String {
    text.bytes().map(|b| format!("{b:02x}")).collect()
}

#[derive(Default)]
struct Samples(Vec<Duration>);

impl Samples {
    fn ms(&self, quantile: f64) -> f64 {
        let mut sorted = self.0.clone();
        sorted.sort();
        // Nearest rank: the smallest sample with at least `quantile` of the samples at or below.
        let rank = ((quantile * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
        sorted[rank - 1].as_secs_f64() * 1000.0
    }
}

struct Row {
    backend: &'static str,
    experiences: usize,
    context: Samples,
    bare: Samples,
    ranked: Samples,
    selected: usize,
    matched: usize,
    queries: usize,
}

impl Row {
    fn markdown(&self) -> String {
        format!(
            "| {} | {} | {:.2} | **{:.2}** | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.1} | {:.1} |",
            self.backend,
            thousands(self.experiences),
            self.context.ms(0.5),
            self.context.ms(0.99),
            self.context.ms(1.0),
            self.bare.ms(0.5),
            self.bare.ms(0.99),
            self.ranked.ms(0.5),
            self.ranked.ms(0.99),
            self.matched as f64 / self.queries as f64,
            self.selected as f64 / self.queries as f64,
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

async fn run(args: &Args, backend: Backend, count: usize) -> anyhow::Result<Row> {
    let mut rng = Rng(args.seed.wrapping_mul(1_000_003).wrapping_add(count as u64));
    let vocabulary = Vocabulary::new(args.seed, 20_000);
    let config = Arc::new(Config::default());
    let test_db = TestDb::new(backend).await;
    let started = Instant::now();
    let projects = seed(&test_db, args, count, &config, &vocabulary, &mut rng).await?;
    let name = match backend {
        Backend::Sqlite => "SQLite",
        Backend::Postgres => "Postgres",
    };
    eprintln!(
        "{name}, {count} experiences: seeded in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let db = &test_db.db;
    let mut row = Row {
        backend: name,
        experiences: count,
        context: Samples::default(),
        bare: Samples::default(),
        ranked: Samples::default(),
        selected: 0,
        matched: 0,
        queries: args.queries,
    };
    for i in 0..args.warmup + args.queries {
        let project = &projects[rng.below(projects.len())];
        let prompt = prompt(&mut rng, &vocabulary, project);
        let terms = query::parse(&prompt);
        let timed = i >= args.warmup;
        // Rotate the order so neither side always runs on a cache the other just warmed.
        let mut context_time = Duration::ZERO;
        let mut bare_time = Duration::ZERO;
        let mut ranked_time = Duration::ZERO;
        for step in 0..3 {
            match (i + step) % 3 {
                0 => {
                    let start = Instant::now();
                    let context =
                        retrieval::assemble(db, &config, &project.query_session, &prompt, now_ms())
                            .await?
                            .ok_or_else(|| anyhow::anyhow!("session disappeared"))?;
                    context_time = start.elapsed();
                    if timed {
                        row.selected += context.experience_ids.len();
                    }
                }
                1 => {
                    let start = Instant::now();
                    let matched = bare_fts(db, &project.id, &terms, false).await?;
                    bare_time = start.elapsed();
                    if timed {
                        row.matched += matched;
                    }
                }
                _ => {
                    let start = Instant::now();
                    bare_fts(db, &project.id, &terms, true).await?;
                    ranked_time = start.elapsed();
                }
            }
        }
        if timed {
            row.context.0.push(context_time);
            row.bare.0.push(bare_time);
            row.ranked.0.push(ranked_time);
        }
    }
    Ok(row)
}

const HEADER: &str = "| backend | experiences | context p50 ms | context p99 ms | context max ms | \
bare FTS p50 ms | bare FTS p99 ms | ranked FTS p50 ms | ranked FTS p99 ms | bare rows | selected |\n\
|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|";

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
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
