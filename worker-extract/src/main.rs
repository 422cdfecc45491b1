use zuno_shared::runtime::process::{source_gate, worker_main};

const ABOUT: &str = "Claims `extract` jobs and turns closed turns into cited Experience.";

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    worker_main(
        "zuno-worker-extract",
        ABOUT,
        source_gate,
        zuno_worker_extract::handlers,
    )
    .await
}
