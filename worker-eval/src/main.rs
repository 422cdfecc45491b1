use zuno_shared::runtime::process::{allow_all, worker_main};

const ABOUT: &str = "Claims `evaluate` jobs: offline cassette evaluation of Skill candidates.";

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    worker_main(
        "zuno-worker-eval",
        ABOUT,
        allow_all,
        zuno_worker_eval::handlers,
    )
    .await
}
