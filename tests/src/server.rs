//! The API served in-process on a free port, over a [`TestDb`](crate::TestDb).
//!
//! Like `zuno serve`, the server always has a token: the `operator_token` a test passes (the
//! `ZUNO_API_TOKEN` case), else a local token generated in the server's home directory (the
//! default case), which [`TestServer::client`] then sends on every request, as the local CLI
//! would. Worktrees are accepted under the system's temporary directory unless the test's
//! configuration names `server.worktree_roots` itself.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;
use zuno_api::http::{AppState, router};
use zuno_shared::config::Config;
use zuno_shared::db::Db;

use crate::TestDb;

pub struct TestServer {
    pub base: String,
    /// An HTTP client; when the server runs on its generated local token, it sends that token.
    pub client: reqwest::Client,
    pub state: AppState,
    /// The server's own token: the operator token given, or the generated local token.
    token: String,
    /// The server's ZUNO_HOME (global memory lives here).
    pub home: tempfile::TempDir,
    shutdown: CancellationToken,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl TestServer {
    pub async fn start(db: &TestDb, config: Config, operator_token: Option<&str>) -> TestServer {
        TestServer::start_on(db.db.clone(), config, operator_token).await
    }

    /// Serves on `db`, a handle of the caller's making (e.g. one that reaches the database
    /// through a proxy the test can cut).
    pub async fn start_on(db: Db, mut config: Config, operator_token: Option<&str>) -> TestServer {
        let home = tempfile::tempdir().expect("temp home");
        let paths = zuno_shared::paths::Paths::resolve(Some(home.path()));
        if config.server.worktree_roots.is_empty() {
            let temp = std::env::temp_dir()
                .canonicalize()
                .expect("temporary directory");
            config.server.worktree_roots = vec![temp.display().to_string()];
        }
        let (token, local) = match operator_token {
            Some(token) => (token.to_owned(), false),
            None => (
                zuno_shared::tokens::local::load_or_create(&paths).expect("local token"),
                true,
            ),
        };
        let state = AppState::new(
            Arc::new(config),
            db,
            zuno_shared::clock::system_clock(),
            paths,
            Some(&token),
            None,
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let base = format!("http://{}", listener.local_addr().expect("addr"));
        let shutdown = CancellationToken::new();
        let stop = shutdown.clone();
        let app = router(state.clone());
        let task = tokio::spawn(async move {
            zuno_api::http::transport::serve(listener, app, async move { stop.cancelled().await })
                .await
                .expect("serve");
        });
        let mut headers = reqwest::header::HeaderMap::new();
        if local {
            headers.insert(
                reqwest::header::AUTHORIZATION,
                format!("Bearer {token}").parse().expect("header"),
            );
        }
        TestServer {
            base,
            client: reqwest::Client::builder()
                .default_headers(headers)
                .build()
                .expect("client"),
            state,
            token,
            home,
            shutdown,
            task: Some(task),
        }
    }

    /// Runs an extract worker in this process on the server's ledger and configuration, gated as
    /// `zuno-worker-extract` is, until the queue is empty.
    pub async fn drain_extraction(&self, worker_id: &str) {
        let extract = zuno_worker_extract::extract::ExtractHandler::new(
            self.state.config.clone(),
            zuno_shared::provider::LearningModelClient::new(),
        );
        self.drain_with(worker_id, Arc::new(extract)).await;
    }

    /// Runs a maintain worker in this process on the server's ledger, configuration and Memory
    /// service, gated as `zuno-worker-maintain` is, until the queue is empty.
    pub async fn drain_maintenance(&self, worker_id: &str) {
        let maintain = zuno_worker_maintain::maintain::MaintainHandler::new(
            self.state.config.clone(),
            self.state.memory.clone(),
            zuno_shared::provider::LearningModelClient::new(),
        );
        self.drain_with(worker_id, Arc::new(maintain)).await;
    }

    async fn drain_with(
        &self,
        worker_id: &str,
        handler: Arc<dyn zuno_shared::runtime::JobHandler>,
    ) {
        let mut runner = zuno_shared::runtime::RunnerConfig::new(worker_id);
        runner.exit_when_idle = true;
        let gate = zuno_shared::learning::SourceGate::new(
            self.state.config.clone(),
            self.state.ledger.clock().clone(),
        );
        zuno_shared::runtime::Runner::new(self.state.ledger.clone(), runner)
            .with_gate(Arc::new(gate))
            .register(handler)
            .run(CancellationToken::new())
            .await;
    }

    /// The server's own token (what a local client finds in the data directory).
    pub fn token(&self) -> &str {
        &self.token
    }

    /// The server's home: its data directory, where the local token lives.
    pub fn home(&self) -> &std::path::Path {
        self.home.path()
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub async fn post(&self, path: &str, body: serde_json::Value) -> (u16, serde_json::Value) {
        let response = self
            .client
            .post(self.url(path))
            .json(&body)
            .send()
            .await
            .expect("request");
        decode(response).await
    }

    pub async fn get(&self, path: &str) -> (u16, serde_json::Value) {
        let response = self
            .client
            .get(self.url(path))
            .send()
            .await
            .expect("request");
        decode(response).await
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.shutdown.cancel();
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

pub async fn decode(response: reqwest::Response) -> (u16, serde_json::Value) {
    let status = response.status().as_u16();
    let text = response.text().await.expect("body");
    let value = serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text));
    (status, value)
}
