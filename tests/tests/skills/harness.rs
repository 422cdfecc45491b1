//! A small world for Skill tests: a project whose worktree is a temporary directory, sessions,
//! verified experiences written directly, the Skill service, and drained mine/eval workers.

use std::path::PathBuf;
use std::sync::Arc;

use serde_json::json;
use tokio_util::sync::CancellationToken;
use zuno_shared::config::Config;
use zuno_shared::learning::LearningIngestion;
use zuno_shared::ledger::{Job, JobFilter, JobKind, Ledger};
use zuno_shared::provider::LearningModelClient;
use zuno_shared::runtime::{RunReport, Runner, RunnerConfig};
use zuno_shared::skills::SkillService;
use zuno_shared::skills::candidate::Candidate;
use zuno_shared::transcript::{NewProject, NewSession, TranscriptStore};
use zuno_tests::TestDb;
use zuno_tests::fake_provider::Reply;

pub const PROJECT: &str = "proj";

pub struct World {
    pub db: TestDb,
    pub config: Arc<Config>,
    pub ledger: Ledger,
    pub ingestion: LearningIngestion,
    pub skills: SkillService,
    pub dir: tempfile::TempDir,
    pub worktree: PathBuf,
    tick: std::sync::atomic::AtomicI64,
}

/// The fake provider as the learning model (OpenAI Chat wire format).
pub fn model_config(base_url: &str) -> Config {
    zuno_tests::fake_provider::learning_config(base_url, 10_000)
}

impl World {
    pub async fn new(db: TestDb, config: Config) -> World {
        World::with_clock(db, config, zuno_shared::clock::system_clock()).await
    }

    /// A world whose ledger (and so every admission bucket and timestamp) reads `clock`.
    pub async fn with_clock(
        db: TestDb,
        config: Config,
        clock: zuno_shared::clock::SharedClock,
    ) -> World {
        let config = Arc::new(config);
        let ledger = Ledger::new(db.db.clone(), clock.clone());
        let ingestion = LearningIngestion::new(
            TranscriptStore::new(db.db.clone(), clock),
            ledger.clone(),
            config.clone(),
        );
        let dir = tempfile::tempdir().unwrap();
        let worktree = dir.path().join("repo");
        std::fs::create_dir(&worktree).unwrap();
        ingestion
            .store()
            .create_project(&NewProject {
                id: PROJECT.into(),
                name: "Project".into(),
                worktree: Some(worktree.display().to_string()),
            })
            .await
            .unwrap();
        World {
            skills: SkillService::new(ledger.clone(), config.clone()),
            db,
            config,
            ledger,
            ingestion,
            dir,
            worktree,
            tick: std::sync::atomic::AtomicI64::new(0),
        }
    }

    pub async fn session(&self) -> String {
        self.session_in(PROJECT).await
    }

    /// Another project with its own worktree (under the world's temporary directory).
    pub async fn add_project(&self, id: &str) -> PathBuf {
        let worktree = self.dir.path().join(id);
        std::fs::create_dir(&worktree).unwrap();
        self.ingestion
            .store()
            .create_project(&NewProject {
                id: id.into(),
                name: id.into(),
                worktree: Some(worktree.display().to_string()),
            })
            .await
            .unwrap();
        worktree
    }

    pub async fn session_in(&self, project: &str) -> String {
        self.ingestion
            .create_session(&NewSession {
                project_id: project.into(),
                ..NewSession::default()
            })
            .await
            .unwrap()
            .0
            .id
    }

    /// A verified correction in `session` with one verified evidence excerpt.
    pub async fn experience(&self, session: &str, title: &str, summary: &str) -> String {
        self.experience_of(session, "correction", "verified", title, summary)
            .await
    }

    pub async fn experience_of(
        &self,
        session: &str,
        kind: &str,
        verification: &str,
        title: &str,
        summary: &str,
    ) -> String {
        self.experience_in(PROJECT, session, kind, verification, title, summary)
            .await
    }

    /// A verified experience of `kind` in `project`'s `session`.
    pub async fn experience_in(
        &self,
        project: &str,
        session: &str,
        kind: &str,
        verification: &str,
        title: &str,
        summary: &str,
    ) -> String {
        // Strictly increasing creation times keep listings by time deterministic.
        let at = self.ledger.now_ms() + self.tick.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.experience_written_at(project, session, kind, verification, title, summary, at)
            .await
    }

    /// An experience whose `created_at` is `at` (as a host with that clock would write it).
    #[allow(clippy::too_many_arguments)]
    pub async fn experience_written_at(
        &self,
        project: &str,
        session: &str,
        kind: &str,
        verification: &str,
        title: &str,
        summary: &str,
        at: i64,
    ) -> String {
        let id = zuno_shared::ids::new_id("exp");
        zuno_shared::on_db!(self.db.db, |pool| sqlx::query(
                "INSERT INTO experience_record (id, project_id, session_id, origin, kind, title, summary, confidence, \
                   verification, content_digest, created_at, updated_at) \
                 VALUES ($1, $2, $3, 'extraction', $4, $5, $6, 0.9, $7, $8, $9, $9)")
            .bind(&id).bind(project).bind(session).bind(kind).bind(title).bind(summary)
            .bind(verification).bind(zuno_shared::text::sha256(summary)).bind(at)
            .execute(pool).await.map(|d| d.rows_affected()))
        .unwrap();
        zuno_shared::on_db!(self.db.db, |pool| sqlx::query(
                "INSERT INTO experience_evidence (experience_id, ordinal, source_id, excerpt, verified) VALUES ($1, 0, 's1', $2, TRUE)")
            .bind(&id).bind(summary).execute(pool).await.map(|d| d.rows_affected()))
        .unwrap();
        id
    }

    /// Runs a mine worker until the queue is empty.
    pub async fn run_mine(&self) -> RunReport {
        let mut config = RunnerConfig::new("mine-test");
        config.exit_when_idle = true;
        let client = LearningModelClient::new();
        Runner::new(self.ledger.clone(), config)
            .with_gate(Arc::new(zuno_shared::learning::SourceGate::new(
                self.config.clone(),
                self.ledger.clock().clone(),
            )))
            .register(Arc::new(
                zuno_worker_mine::mine::AggregateProjectHandler::new(
                    self.skills.clone(),
                    client.clone(),
                ),
            ))
            .register(Arc::new(
                zuno_worker_mine::mine::AggregateGlobalHandler::new(self.skills.clone(), client),
            ))
            .run(CancellationToken::new())
            .await
    }

    /// Runs an eval worker until the queue is empty.
    pub async fn run_eval(&self) -> RunReport {
        let mut config = RunnerConfig::new("eval-test");
        config.exit_when_idle = true;
        Runner::new(self.ledger.clone(), config)
            .register(Arc::new(zuno_worker_eval::eval::EvaluateHandler::new(
                self.skills.clone(),
                LearningModelClient::new(),
            )))
            .run(CancellationToken::new())
            .await
    }

    pub async fn jobs(&self, kind: JobKind) -> Vec<Job> {
        self.ledger
            .list(&JobFilter {
                kind: Some(kind),
                ..JobFilter::default()
            })
            .await
            .unwrap()
    }

    pub async fn scalar(&self, sql: &'static str) -> i64 {
        zuno_shared::on_db!(self.db.db, |pool| sqlx::query_scalar(sql)
            .fetch_one(pool)
            .await)
        .unwrap()
    }

    /// A promoted one-evidence candidate (the fastest way to a reviewable candidate).
    pub async fn promoted_candidate(&self, title: &str, summary: &str) -> Candidate {
        let session = self.session().await;
        let experience = self.experience(&session, title, summary).await;
        self.skills
            .promote_experience(PROJECT, &experience)
            .await
            .unwrap()
            .candidate
            .expect("a companion candidate")
    }

    /// Marks a candidate approved directly (for apply tests that do not need an evaluation).
    pub async fn force_approved(&self, id: &str) {
        zuno_shared::on_db!(self.db.db, |pool| sqlx::query(
                "UPDATE skill_candidate SET state = 'approved', evaluation_state = 'passed' WHERE id = $1")
            .bind(id).execute(pool).await.map(|d| d.rows_affected()))
        .unwrap();
    }
}

/// The model's grouping answer.
pub fn groups(groups: serde_json::Value) -> Reply {
    Reply::answer(json!({ "groups": groups }).to_string())
}

pub fn answer(text: &str) -> Reply {
    Reply::answer(json!({ "action": "answer", "answer": text }).to_string())
}

pub fn call(tool: &str, arguments: serde_json::Value) -> Reply {
    Reply::answer(json!({ "action": "call", "tool": tool, "arguments": arguments }).to_string())
}

pub fn grade(score: f64, passed: bool, critical: bool) -> Reply {
    Reply::answer(
        json!({ "score": score, "passed": passed, "critical": critical, "reason": "graded" })
            .to_string(),
    )
}
