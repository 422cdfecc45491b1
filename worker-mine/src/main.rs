use zuno_shared::runtime::process::{source_gate, worker_main};

const ABOUT: &str = "Claims `aggregate_project` and `aggregate_global` jobs: pattern mining.";

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    worker_main(
        "zuno-worker-mine",
        ABOUT,
        source_gate,
        zuno_worker_mine::handlers,
    )
    .await
}
