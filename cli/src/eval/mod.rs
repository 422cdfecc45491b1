//! The learning-quality harness behind `zuno learn eval` (`docs/learning-eval.md`): each labelled
//! transcript is imported into a fresh store, the pipeline runs as a server would run it
//! (extraction with the configured extractor, then memory maintenance) until the queue is idle,
//! and `context` is asked for every label's follow-up and negative prompts in a new session of
//! the same project and, for the cross-project probe, of another project. The figures compare
//! what was stored and recalled with what a careful reader labelled.

mod cassette;
mod error;
pub mod labels;
mod probe;
mod report;
mod score;
mod transcript;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio_util::sync::CancellationToken;
use zuno_shared::clock::system_clock;
use zuno_shared::config::Config;
use zuno_shared::db::{
    ConnectOptions, Db, ScratchError, create_scratch_database, drop_scratch_database,
};
use zuno_shared::ledger::Ledger;
use zuno_shared::paths::Paths;
use zuno_shared::runtime::process::{Settings, WorkerEnv, source_gate};
use zuno_shared::runtime::{JobHandler, RunReport, Runner, RunnerConfig};

pub use cassette::{CassetteMode, RECORDED_MODEL, RECORDED_PROVIDER};
pub use error::EvalError;
pub use report::{Report, print_text};
pub use score::{Figures, FileReport};

use crate::client::ApiClient;
use crate::server::Server;
use labels::LabelFile;

/// Where each transcript's fresh store lives.
#[derive(Debug, Clone)]
pub enum StoreChoice {
    /// A new SQLite file in a temporary directory.
    Sqlite,
    /// A new database on this Postgres server (created, then dropped).
    Postgres { admin_url: String },
}

#[derive(Debug, Clone)]
pub struct EvalOptions {
    pub labels: Vec<PathBuf>,
    /// Root of the shared corpus that label files name transcripts in.
    pub corpus: PathBuf,
    /// Root that `project:` transcript paths are relative to.
    pub repository: PathBuf,
    pub store: StoreChoice,
    /// The configuration to run with (its providers decide the extractor); database and paths
    /// are replaced by the fresh store's.
    pub config: Config,
    /// Record the provider's answers, or replay recorded ones (`None`: call the provider).
    pub cassettes: Option<CassetteMode>,
    /// The API each fresh store is served by, in this process.
    pub server: Arc<dyn Server>,
}

/// Runs the harness over every labels file, in order.
pub async fn run(options: &EvalOptions) -> Result<Report, EvalError> {
    let mut files = Vec::new();
    for path in &options.labels {
        files.push(run_file(options, path).await?);
    }
    Ok(Report::new(files))
}

async fn run_file(options: &EvalOptions, labels_path: &Path) -> Result<FileReport, EvalError> {
    let labels = LabelFile::read(labels_path)?;
    let transcript = labels.transcript_path(&options.corpus, &options.repository)?;
    let home = tempfile::Builder::new()
        .prefix("zuno-eval-")
        .tempdir()
        .map_err(|source| EvalError::Read {
            path: std::env::temp_dir(),
            source,
        })?;
    let store = FreshStore::create(&options.store, home.path()).await?;
    let result = evaluate(
        options,
        &labels,
        labels_path,
        &transcript,
        home.path(),
        &store,
    )
    .await;
    store.drop_database().await;
    result
}

async fn evaluate(
    options: &EvalOptions,
    labels: &LabelFile,
    labels_path: &Path,
    transcript: &Path,
    home: &Path,
    store: &FreshStore,
) -> Result<FileReport, EvalError> {
    // The cassettes answer for the providers until the end of the run.
    let (config, _cassettes) = run_config(options, store, home).await?;
    let config = Arc::new(config);
    // Zuno's own home sits beside the worktrees, never around them: a worktree inside Zuno's
    // data directory is a sensitive directory it refuses to bind.
    let paths = Paths::resolve(Some(&home.join("zuno")));
    let clock = system_clock();
    let client = ApiClient::in_process(options.server.local_router(
        config.clone(),
        store.db.clone(),
        paths.clone(),
    ));

    let project = labels.project.clone();
    let other = format!("{project}-other");
    create_projects(&client, home, &[project.as_str(), other.as_str()]).await?;
    let loaded = transcript::load(&client, labels.format, transcript, &project).await?;

    let env = WorkerEnv {
        settings: Settings {
            paths,
            config: (*config).clone(),
        },
        ledger: Ledger::new(store.db.clone(), clock),
    };
    drain(&env).await?;
    let jobs = job_counts(&env.ledger).await?;

    let (experiences, _) = zuno_shared::learning::experience::list(&store.db, &project, 0, 100_000)
        .await
        .map_err(EvalError::store)?;
    let memory = zuno_shared::memory::store::supported_entries(&store.db, &project)
        .await
        .map_err(EvalError::store)?;
    let lexical_only = lexical_only_client(options.server.as_ref(), &config, store, home);
    let probes =
        score::Probes::ask(&client, lexical_only.as_ref(), labels, &project, &other).await?;
    let mut report = score::score(labels, &loaded, &experiences, &memory, &probes, &project);
    report.labels = labels_path.display().to_string();
    report.transcript = transcript.display().to_string();
    report.jobs = jobs;
    report.extractor = zuno_shared::learning::extractor_version(&config).to_owned();
    let audit = zuno_shared::memory::audit::audit(
        &memory,
        &[],
        &[],
        |scope| zuno_shared::memory::audit::char_limit(&config, scope),
        None,
    );
    for document in &audit.documents {
        report.figures.shared_subjects += document.shared_subjects.len();
        report.figures.duplicate_rules += document.duplicates.len();
        report.figures.documents_over_limit += usize::from(!document.within_limit);
    }
    report.audit = Some(audit);
    Ok(report)
}

/// The configuration to run with, on the fresh store, and the cassettes that stand in for its
/// providers when recording or replaying.
async fn run_config(
    options: &EvalOptions,
    store: &FreshStore,
    home: &Path,
) -> Result<(Config, Option<cassette::Cassettes>), EvalError> {
    let mut config = options.config.clone();
    config.database.url = Some(store.url.clone());
    // The projects' worktrees live in this run's temporary home and nowhere else.
    config.server.worktree_roots = vec![home.display().to_string()];
    let cassettes = match &options.cassettes {
        Some(mode) => {
            if config.providers.is_empty() {
                use_recorded_provider(&mut config);
            }
            if let CassetteMode::AwaitAnswers { wait, .. } = mode {
                // The answerer may take minutes; the model call waits for it.
                config.learning.execution.timeout_ms =
                    u64::try_from(wait.as_millis()).unwrap_or(u64::MAX);
            }
            let (cassettes, providers) =
                cassette::Cassettes::start(mode.clone(), &config.providers).await?;
            config.providers = providers;
            Some(cassettes)
        }
        None => None,
    };
    Ok((config, cassettes))
}

/// Points the model path at the cassettes' own provider: with cassettes and no configured
/// provider the harness still runs (and records, or replays) the model path.
fn use_recorded_provider(config: &mut Config) {
    use zuno_shared::config::{ProviderApi, ProviderConfig};
    config.providers.insert(
        cassette::RECORDED_PROVIDER.to_owned(),
        ProviderConfig {
            api: ProviderApi::OpenaiChat,
            // Never reached: the proxy replaces it, and answers without a provider.
            base_url: String::from("http://127.0.0.1:9"),
            api_key_env: None,
            header_envs: Default::default(),
            small_model: None,
            models: Default::default(),
        },
    );
    config.learning.extractor_model = Some(format!(
        "{}/{}",
        cassette::RECORDED_PROVIDER,
        cassette::RECORDED_MODEL
    ));
}

/// Creates each project with a worktree of its own under `home`.
async fn create_projects(client: &ApiClient, home: &Path, ids: &[&str]) -> Result<(), EvalError> {
    for &id in ids {
        let worktree = home.join("worktrees").join(transcript::safe_id(id));
        std::fs::create_dir_all(&worktree).map_err(|source| EvalError::Read {
            path: worktree.clone(),
            source,
        })?;
        client
            .post(
                "/api/projects",
                &json!({ "id": id, "name": id, "worktree": worktree.display().to_string() }),
            )
            .await
            .map_err(|e| EvalError::cli(e.into()))?;
    }
    Ok(())
}

/// Jobs per `kind:state`.
async fn job_counts(ledger: &Ledger) -> Result<std::collections::BTreeMap<String, i64>, EvalError> {
    Ok(ledger
        .counts()
        .await
        .map_err(EvalError::store)?
        .into_iter()
        .map(|count| {
            (
                format!("{}:{}", count.kind.as_str(), count.state.as_str()),
                count.count,
            )
        })
        .collect())
}

/// With the semantic layer configured, the follow-ups are also asked without it (same store,
/// same experiences, embeddings off) so the report can put recall@5 with and without side by
/// side.
fn lexical_only_client(
    server: &dyn Server,
    config: &Config,
    store: &FreshStore,
    home: &Path,
) -> Option<ApiClient> {
    config.embeddings.as_ref().map(|_| {
        let mut lexical = config.clone();
        lexical.embeddings = None;
        ApiClient::in_process(server.local_router(
            Arc::new(lexical),
            store.db.clone(),
            Paths::resolve(Some(&home.join("zuno"))),
        ))
    })
}

/// Runs the extract and maintain stages until the queue has nothing due for them.
async fn drain(env: &WorkerEnv) -> Result<(), EvalError> {
    type Build = fn(&WorkerEnv) -> anyhow::Result<Vec<Arc<dyn JobHandler>>>;
    let stages: [(&str, Build); 2] = [
        ("extract", zuno_worker_extract::handlers),
        ("maintain", zuno_worker_maintain::handlers),
    ];
    for _ in 0..4 {
        let mut worked = 0;
        for (stage, build) in stages {
            let mut config = RunnerConfig::new(format!("zuno-eval-{stage}"));
            config.exit_when_idle = true;
            config.concurrency = 1;
            config.max_jobs_per_wake = 2;
            config.poll_interval = Duration::from_millis(200);
            let mut runner = Runner::new(env.ledger.clone(), config).with_gate(source_gate(env));
            for handler in build(env).map_err(EvalError::store)? {
                runner = runner.register(handler);
            }
            let report: RunReport = runner.run(CancellationToken::new()).await;
            worked += report.completed + report.failed + report.skipped + report.retried;
        }
        if worked == 0 {
            break;
        }
    }
    Ok(())
}

/// A store that exists only for one transcript.
struct FreshStore {
    db: Db,
    url: String,
    /// The Postgres admin URL and database name to drop afterwards.
    postgres: Option<(String, String)>,
}

impl FreshStore {
    async fn create(choice: &StoreChoice, home: &Path) -> Result<FreshStore, EvalError> {
        match choice {
            StoreChoice::Sqlite => {
                let options = ConnectOptions::sqlite_file(&home.join("zuno.db"));
                let db = Db::open(&options, zuno_shared::migrations::schema())
                    .await
                    .map_err(EvalError::store)?;
                Ok(FreshStore {
                    db,
                    url: options.url,
                    postgres: None,
                })
            }
            StoreChoice::Postgres { admin_url } => {
                let name = format!("zuno_eval_{}", uuid::Uuid::new_v4().simple());
                let url = create_scratch_database(admin_url, &name)
                    .await
                    .map_err(|error| match error {
                        ScratchError::NotPostgres => EvalError::Store(String::from(
                            "--database-url must name a Postgres server",
                        )),
                        other => EvalError::store(other),
                    })?;
                let db = Db::open(
                    &ConnectOptions::new(url.clone()),
                    zuno_shared::migrations::schema(),
                )
                .await
                .map_err(EvalError::store)?;
                Ok(FreshStore {
                    db,
                    url,
                    postgres: Some((admin_url.clone(), name)),
                })
            }
        }
    }

    async fn drop_database(&self) {
        self.db.close().await;
        if let Some((admin_url, name)) = &self.postgres
            && let Err(error) = drop_scratch_database(admin_url, name).await
        {
            tracing::warn!(%error, database = %name, "could not drop the evaluation database");
        }
    }
}
