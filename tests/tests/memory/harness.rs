//! A small world for resident Memory tests: a project whose worktree is a temporary directory, a
//! `ZUNO_HOME` that does not exist yet (a fresh install), and the memory service over both.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio_util::sync::CancellationToken;
use zuno_shared::clock::system_clock;
use zuno_shared::config::{Config, MemoryPromotion};
use zuno_shared::db::Db;
use zuno_shared::learning::SourceGate;
use zuno_shared::learning::experience::{self, ExperienceOrigin};
use zuno_shared::learning::extraction::MemoryAction;
use zuno_shared::ledger::{Job, JobFilter, JobKind};
use zuno_shared::memory::maintenance;
use zuno_shared::memory::service::{MemoryError, MemoryService, Origin, Outcome, Proposal};
use zuno_shared::memory::store::{self, Candidate, DocumentView, Entry, Revision, Scope};
use zuno_shared::memory::write_check::WriteRefusal;
use zuno_shared::paths::Paths;
use zuno_shared::provider::LearningModelClient;
use zuno_shared::runtime::{RunReport, Runner, RunnerConfig};
use zuno_shared::transcript::{NewProject, TranscriptStore};
use zuno_tests::TestDb;
use zuno_worker_maintain::maintain::MaintainHandler;

pub const PROJECT: &str = "proj";

pub struct Env {
    pub db: TestDb,
    pub config: Arc<Config>,
    pub memory: MemoryService,
    /// `ZUNO_HOME`: absent until the first accepted global write creates `memory/` in it.
    pub home: PathBuf,
    /// The project's worktree (exists; `.zuno/` inside it does not).
    pub worktree: PathBuf,
    /// Holds `home`, `worktree` and anything else a test needs on disk.
    pub dir: tempfile::TempDir,
}

impl Env {
    pub async fn new(db: TestDb) -> Env {
        Env::with_config(db, Config::default()).await
    }

    pub async fn with_promotion(db: TestDb, promotion: MemoryPromotion) -> Env {
        let mut config = Config::default();
        config.memory.promotion = promotion;
        Env::with_config(db, config).await
    }

    pub async fn with_config(db: TestDb, mut config: Config) -> Env {
        let dir = tempfile::tempdir().expect("temp dir");
        let home = dir.path().join("zuno-home");
        let worktree = dir.path().join("repo");
        std::fs::create_dir(&worktree).expect("worktree");
        // Worktrees are used only inside the roots (the claim's rule, checked again on every
        // projection); the temporary directory is this world's root.
        if config.server.worktree_roots.is_empty() {
            config.server.worktree_roots = vec![dir.path().display().to_string()];
        }
        let config = Arc::new(config);
        let memory = MemoryService::new(
            db.db.clone(),
            config.clone(),
            Paths::resolve(Some(&home)),
            system_clock(),
        );
        let env = Env {
            db,
            config,
            memory,
            home,
            worktree,
            dir,
        };
        env.project(PROJECT, &env.worktree.clone()).await;
        env
    }

    /// Creates another project with `worktree` (which need not exist).
    pub async fn project(&self, id: &str, worktree: &Path) {
        TranscriptStore::new(self.db.db.clone(), system_clock())
            .create_project(&NewProject {
                id: id.into(),
                name: format!("Project {id}"),
                worktree: Some(worktree.display().to_string()),
            })
            .await
            .expect("create project");
    }

    /// The same service over another database handle (another process's pool).
    pub fn service_on(&self, db: Db) -> MemoryService {
        MemoryService::new(
            db,
            self.config.clone(),
            Paths::resolve(Some(&self.home)),
            system_clock(),
        )
    }

    /// The same stores and files under another promotion policy.
    pub fn service_with(&self, promotion: MemoryPromotion) -> MemoryService {
        let mut config = (*self.config).clone();
        config.memory.promotion = promotion;
        MemoryService::new(
            self.db.db.clone(),
            Arc::new(config),
            Paths::resolve(Some(&self.home)),
            system_clock(),
        )
    }

    pub fn rules_path(&self) -> PathBuf {
        self.worktree.join(".zuno").join("RULES.md")
    }

    pub fn global_path(&self) -> PathBuf {
        self.home.join("memory").join("MEMORY.md")
    }

    pub async fn propose(&self, proposal: Proposal) -> Result<Outcome, MemoryError> {
        self.memory.propose(proposal).await
    }

    /// Proposes and expects the change to be applied.
    pub async fn apply(&self, proposal: Proposal) -> Outcome {
        let outcome = self
            .memory
            .propose(proposal)
            .await
            .expect("proposal accepted");
        assert!(
            outcome.applied,
            "expected the proposal to apply: {outcome:?}"
        );
        outcome
    }

    /// Proposes and expects a refusal; returns it.
    pub async fn refused(&self, proposal: Proposal) -> WriteRefusal {
        match self.memory.propose(proposal).await {
            Err(MemoryError::Refused(refusal)) => refusal,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    pub async fn view(&self, scope: Scope) -> DocumentView {
        let mut views = self
            .memory
            .read(Some(scope), Some(PROJECT), None, None)
            .await
            .expect("read memory");
        assert_eq!(views.len(), 1);
        views.remove(0)
    }

    /// The current (shown) entries of a scope.
    pub async fn entries(&self, scope: Scope) -> Vec<String> {
        contents(&self.view(scope).await)
    }

    pub async fn revision(&self, scope: Scope) -> i64 {
        self.view(scope).await.revision
    }

    pub async fn document_id(&self, scope: Scope) -> String {
        let project = match scope {
            Scope::Global => "",
            Scope::Project => PROJECT,
        };
        zuno_shared::on_db!(self.db.db, |pool| sqlx::query_scalar(
            "SELECT id FROM memory_document WHERE scope = $1 AND COALESCE(project_id, '') = $2"
        )
        .bind(scope.as_str())
        .bind(project)
        .fetch_one(pool)
        .await)
        .expect("memory document")
    }

    /// Revision history, newest first.
    pub async fn revisions(&self, scope: Scope) -> Vec<Revision> {
        store::revisions(&self.db.db, &self.document_id(scope).await, 1000)
            .await
            .expect("revisions")
    }

    pub async fn candidate(&self, id: &str) -> Candidate {
        store::candidates(&self.db.db, None, None, 10_000)
            .await
            .expect("candidates")
            .into_iter()
            .find(|c| c.id == id)
            .unwrap_or_else(|| panic!("candidate {id} exists"))
    }

    pub async fn count(&self, sql: &'static str) -> i64 {
        zuno_shared::on_db!(self.db.db, |pool| sqlx::query_scalar(sql)
            .fetch_one(pool)
            .await)
        .expect("count")
    }

    /// Every current entry of a scope's document, derived entries withheld from prompts
    /// included (they count toward the cap too).
    pub async fn document(&self, scope: Scope) -> Vec<Entry> {
        let mut tx = self.db.db.begin().await.unwrap();
        let document = store::document_in(&mut tx, scope, Some(PROJECT), 0)
            .await
            .unwrap();
        tx.commit().await.unwrap();
        document.entries
    }

    /// Records `texts` as explicit user records (`remember`) in one transaction and admits one
    /// maintenance job for them: the batch a busy session leaves between two maintenance runs.
    pub async fn remember_batch(&self, texts: &[String]) -> Vec<String> {
        let now = system_clock().now_ms();
        let mut tx = self.db.db.begin().await.unwrap();
        let mut ids = Vec::new();
        for text in texts {
            ids.push(remember_in(&mut tx, text, now).await);
        }
        let trigger = ids.last().expect("a batch has records").clone();
        maintenance::admit_in(&self.db.ledger(), &mut tx, PROJECT, &trigger)
            .await
            .unwrap();
        tx.commit().await.unwrap();
        ids
    }

    /// Runs a maintain worker over this environment's stores until its queue is empty.
    pub async fn run_maintain(&self) -> RunReport {
        let ledger = self.db.ledger();
        let mut config = RunnerConfig::new("maintain-test");
        config.exit_when_idle = true;
        Runner::new(ledger.clone(), config)
            .with_gate(Arc::new(SourceGate::new(
                self.config.clone(),
                ledger.clock().clone(),
            )))
            .register(Arc::new(MaintainHandler::new(
                self.config.clone(),
                self.memory.clone(),
                LearningModelClient::new(),
            )))
            .run(CancellationToken::new())
            .await
    }

    /// The maintenance jobs, newest first.
    pub async fn maintain_jobs(&self) -> Vec<Job> {
        self.db
            .ledger()
            .list(&JobFilter {
                kind: Some(JobKind::Maintain),
                limit: 1000,
                ..JobFilter::default()
            })
            .await
            .unwrap()
    }

    /// An explicit user statement (`remember`) in the project: evidence Memory may cite.
    pub async fn experience(&self, text: &str) -> String {
        let mut tx = self.db.db.begin().await.unwrap();
        let id = remember_in(&mut tx, text, system_clock().now_ms()).await;
        tx.commit().await.unwrap();
        id
    }
}

/// Records `text` as an explicit user statement (`remember`) in the project, in `tx`; returns its
/// id.
async fn remember_in(tx: &mut zuno_shared::db::Tx, text: &str, now: i64) -> String {
    experience::insert_manual_in(tx, PROJECT, None, ExperienceOrigin::Remember, text, now)
        .await
        .unwrap()
        .unwrap()
        .id
}

pub fn contents(view: &DocumentView) -> Vec<String> {
    view.entries.iter().map(|e| e.content.clone()).collect()
}

pub fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

/// The entries of a projection file on disk.
pub fn file_entries(path: &Path) -> Vec<String> {
    let content =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    zuno_shared::memory::markdown::parse(&content)
}

fn proposal(scope: Scope, action: MemoryAction, origin: Origin) -> Proposal {
    Proposal {
        scope,
        project_id: Some(PROJECT.into()),
        action,
        content: None,
        old_text: None,
        expected_revision: None,
        reason: String::from("a durable preference stated by the user"),
        confidence: 0.95,
        origin,
        evidence: Vec::new(),
        explicit_user_evidence: origin == Origin::User,
        job_id: None,
    }
}

pub fn add(scope: Scope, content: &str, origin: Origin) -> Proposal {
    Proposal {
        content: Some(content.into()),
        ..proposal(scope, MemoryAction::Add, origin)
    }
}

pub fn replace(scope: Scope, old_text: &str, content: &str, origin: Origin) -> Proposal {
    Proposal {
        content: Some(content.into()),
        old_text: Some(old_text.into()),
        ..proposal(scope, MemoryAction::Replace, origin)
    }
}

pub fn remove(scope: Scope, old_text: &str, origin: Origin) -> Proposal {
    Proposal {
        old_text: Some(old_text.into()),
        ..proposal(scope, MemoryAction::Remove, origin)
    }
}

/// A maintenance proposal citing `evidence`.
pub fn maintained(scope: Scope, content: &str, evidence: &[&str], confidence: f64) -> Proposal {
    Proposal {
        evidence: strings(evidence),
        confidence,
        ..add(scope, content, Origin::Maintenance)
    }
}
