//! A small world for learning tests: a project, sessions, turns and an extract worker.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;
use zuno_shared::config::Config;
use zuno_shared::learning::{LearningIngestion, SourceGate, TurnOutcome};
use zuno_shared::ledger::Ledger;
use zuno_shared::memory::service::MemoryService;
use zuno_shared::runtime::{RunReport, Runner, RunnerConfig};
use zuno_shared::transcript::{
    MessageStatus, NewMessage, NewProject, NewSession, Part, Role, ToolStatus, TranscriptStore,
};
use zuno_tests::TestDb;
use zuno_worker_extract::extract::ExtractHandler;
use zuno_worker_extract::provider::LearningModelClient;
use zuno_worker_maintain::maintain::MaintainHandler;

pub struct World {
    pub db: TestDb,
    pub config: Arc<Config>,
    pub ingestion: LearningIngestion,
    pub ledger: Ledger,
}

/// A configuration whose extractor is the model behind `base_url` (OpenAI Chat wire format).
pub fn model_config(base_url: &str) -> Config {
    zuno_tests::fake_provider::learning_config(base_url, 5_000)
}

impl World {
    /// `context` for `prompt` in `session` now: what the prompt hook would insert.
    pub async fn context(
        &self,
        session: &str,
        prompt: &str,
    ) -> zuno_shared::learning::retrieval::PromptContext {
        zuno_shared::learning::retrieval::assemble(
            &self.db.db,
            &self.config,
            session,
            prompt,
            self.ledger.now_ms(),
        )
        .await
        .unwrap()
        .expect("the session exists")
    }

    pub async fn new(db: TestDb, mut config: Config) -> World {
        // A project's worktree is used only inside the worktree roots (checked again on every
        // projection); this world's worktrees are temporary directories.
        if config.server.worktree_roots.is_empty() {
            config.server.worktree_roots = vec![std::env::temp_dir().display().to_string()];
        }
        let config = Arc::new(config);
        let clock = zuno_shared::clock::system_clock();
        let ledger = Ledger::new(db.db.clone(), clock.clone());
        let ingestion = LearningIngestion::new(
            TranscriptStore::new(db.db.clone(), clock),
            ledger.clone(),
            config.clone(),
        );
        ingestion
            .store()
            .create_project(&NewProject {
                id: "proj".into(),
                name: "Project".into(),
                worktree: None,
            })
            .await
            .unwrap();
        World {
            db,
            config,
            ingestion,
            ledger,
        }
    }

    pub async fn session(&self) -> String {
        self.session_with(NewSession {
            project_id: "proj".into(),
            ..NewSession::default()
        })
        .await
    }

    pub async fn session_with(&self, new: NewSession) -> String {
        self.ingestion.create_session(&new).await.unwrap().0.id
    }

    pub async fn user(&self, session: &str, text: &str) -> TurnOutcome {
        let message = NewMessage {
            id: None,
            role: Role::User,
            status: None,
            parts: vec![Part::Text {
                text: text.into(),
                injected: false,
            }],
            created_at: None,
        };
        self.ingestion
            .append_message(session, &message, None)
            .await
            .unwrap()
    }

    pub async fn assistant(&self, session: &str, parts: Vec<Part>) -> TurnOutcome {
        let message = NewMessage {
            id: None,
            role: Role::Assistant,
            status: Some(MessageStatus::Completed),
            parts,
            created_at: None,
        };
        self.ingestion
            .append_message(session, &message, None)
            .await
            .unwrap()
    }

    /// A durable correction ("never … always …", so it also becomes a project rule) followed by a
    /// completed tool call: the canonical eligible turn.
    pub async fn corrected_turn(&self, session: &str) -> TurnOutcome {
        self.user(
            session,
            "No, never use npm here; always use pnpm. It keeps the lockfile consistent.",
        )
        .await;
        self.assistant(
            session,
            vec![
                tool(
                    "bash",
                    r#"{"command":"pnpm install"}"#,
                    "Done in 2.1s",
                    ToolStatus::Completed,
                ),
                text("Installed with pnpm."),
            ],
        )
        .await
    }

    /// Runs an extract worker until the queue is empty.
    pub async fn run_extract(&self) -> RunReport {
        self.run_extract_with(LearningModelClient::new()).await
    }

    pub async fn run_extract_with(&self, client: LearningModelClient) -> RunReport {
        let mut config = RunnerConfig::new("extract-test");
        config.exit_when_idle = true;
        Runner::new(self.ledger.clone(), config)
            .with_gate(Arc::new(SourceGate::new(
                self.config.clone(),
                self.ledger.clock().clone(),
            )))
            .register(Arc::new(ExtractHandler::new(self.config.clone(), client)))
            .run(CancellationToken::new())
            .await
    }

    /// Creates another project, optionally with a worktree (where `.zuno/RULES.md` lives).
    pub async fn project(&self, id: &str, worktree: Option<&std::path::Path>) {
        self.ingestion
            .store()
            .create_project(&NewProject {
                id: id.into(),
                name: id.into(),
                worktree: worktree.map(|w| w.display().to_string()),
            })
            .await
            .unwrap();
    }

    /// The memory service over this world's database, with `home` as ZUNO_HOME.
    pub fn memory(&self, home: &std::path::Path) -> MemoryService {
        MemoryService::new(
            self.db.db.clone(),
            self.config.clone(),
            zuno_shared::paths::Paths::resolve(Some(home)),
            self.ledger.clock().clone(),
        )
    }

    /// Runs a maintain worker (no model: the deterministic plan) until the queue is empty.
    pub async fn run_maintain(&self, memory: &MemoryService) -> RunReport {
        let mut config = RunnerConfig::new("maintain-test");
        config.exit_when_idle = true;
        self.maintain_runner_with(memory, config)
            .run(CancellationToken::new())
            .await
    }

    /// A maintain worker (no model) named `worker`, running until it is cancelled.
    pub fn maintain_runner(&self, memory: &MemoryService, worker: &str) -> Runner {
        self.maintain_runner_with(memory, RunnerConfig::new(worker))
    }

    fn maintain_runner_with(&self, memory: &MemoryService, config: RunnerConfig) -> Runner {
        Runner::new(self.ledger.clone(), config)
            .with_gate(Arc::new(SourceGate::new(
                self.config.clone(),
                self.ledger.clock().clone(),
            )))
            .register(Arc::new(MaintainHandler::new(
                self.config.clone(),
                memory.clone(),
                LearningModelClient::new(),
            )))
    }

    pub async fn scalar_i64(&self, sql: &'static str, bind: i64) -> i64 {
        zuno_shared::on_db!(self.db.db, |pool| sqlx::query_scalar(sql)
            .bind(bind)
            .fetch_one(pool)
            .await)
        .unwrap()
    }

    pub async fn scalar(&self, sql: &'static str) -> i64 {
        zuno_shared::on_db!(self.db.db, |pool| sqlx::query_scalar(sql)
            .fetch_one(pool)
            .await)
        .unwrap()
    }
}

pub fn text(text: &str) -> Part {
    Part::Text {
        text: text.into(),
        injected: false,
    }
}

pub fn tool(name: &str, arguments: &str, result: &str, status: ToolStatus) -> Part {
    Part::ToolCall {
        tool_name: name.into(),
        call_id: None,
        arguments: serde_json::from_str(arguments).unwrap(),
        result: Some(result.into()),
        status,
        external_context: false,
        injected: false,
    }
}
