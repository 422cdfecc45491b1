use clap::Parser;
use zuno_shared::runtime::process::{WorkerArgs, run_worker, source_gate};

/// Claims `extract` jobs and turns closed turns into cited Experience.
#[derive(Parser)]
#[command(name = "zuno-worker-extract", version)]
struct Args {
    #[command(flatten)]
    worker: WorkerArgs,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    run_worker(
        "zuno-worker-extract",
        args.worker,
        source_gate,
        zuno_worker_extract::handlers,
    )
    .await
}
