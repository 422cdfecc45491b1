//! The metrics endpoint of processes that have no HTTP API of their own (the workers): `GET
//! /metrics` in the Prometheus text format and `GET /healthz` for liveness probes.
//!
//! The API serves the same two routes from its own router; this one exists so a scraper can
//! reach every worker of a fleet without the worker running the API.

use std::net::SocketAddr;

use axum::Router;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use tokio_util::sync::CancellationToken;

/// A bound metrics endpoint; serving stops when the shutdown token is cancelled.
pub struct MetricsServer {
    address: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl MetricsServer {
    /// Binds `address` and starts serving `registry`. Binding happens here, before any work
    /// starts, so a taken port fails the process at start-up instead of leaving it unscrapable.
    pub async fn start(
        address: SocketAddr,
        registry: prometheus::Registry,
        shutdown: CancellationToken,
    ) -> std::io::Result<MetricsServer> {
        let listener = tokio::net::TcpListener::bind(address).await?;
        let address = listener.local_addr()?;
        let app = Router::new()
            .route(
                "/metrics",
                get(move || {
                    let registry = registry.clone();
                    async move {
                        (
                            [(header::CONTENT_TYPE, prometheus::TEXT_FORMAT)],
                            super::render_prometheus(&registry),
                        )
                    }
                }),
            )
            .route("/healthz", get(healthz));
        let task = tokio::spawn(async move {
            let served = axum::serve(listener, app)
                .with_graceful_shutdown(async move { shutdown.cancelled().await })
                .await;
            if let Err(error) = served {
                tracing::error!(%error, "metrics endpoint stopped");
            }
        });
        tracing::info!(%address, "metrics endpoint listening");
        Ok(MetricsServer { address, task })
    }

    /// The address actually bound (differs from the requested one for port 0).
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// Stops serving now, without waiting for idle keep-alive connections of a scraper.
    pub fn abort(self) {
        self.task.abort();
    }
}

async fn healthz() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "application/json")],
        r#"{"status":"ok"}"#,
    )
}
