use zuno_shared::runtime::process::{source_gate, worker_main};
use zuno_worker_maintain::reconciled_handlers;

const ABOUT: &str = "Claims `maintain` jobs: no-tools resident Memory maintenance.";

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    worker_main(
        "zuno-worker-maintain",
        ABOUT,
        source_gate,
        reconciled_handlers,
    )
    .await
}
