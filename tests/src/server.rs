//! The API served in-process on a free port, over a [`TestDb`](crate::TestDb).

use std::sync::Arc;

use tokio_util::sync::CancellationToken;
use zuno_api::http::{AppState, router};
use zuno_shared::config::Config;

use crate::TestDb;

pub struct TestServer {
    pub base: String,
    pub client: reqwest::Client,
    pub state: AppState,
    /// The server's ZUNO_HOME (global memory lives here).
    pub home: tempfile::TempDir,
    shutdown: CancellationToken,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl TestServer {
    pub async fn start(db: &TestDb, config: Config, operator_token: Option<&str>) -> TestServer {
        let home = tempfile::tempdir().expect("temp home");
        let state = AppState::new(
            Arc::new(config),
            db.db.clone(),
            zuno_shared::clock::system_clock(),
            zuno_shared::paths::Paths::resolve(Some(home.path())),
            operator_token,
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
            axum::serve(listener, app)
                .with_graceful_shutdown(async move { stop.cancelled().await })
                .await
                .expect("serve");
        });
        TestServer {
            base,
            client: reqwest::Client::new(),
            state,
            home,
            shutdown,
            task: Some(task),
        }
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
