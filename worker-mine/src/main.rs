use clap::Parser;
use zuno_shared::runtime::process::{WorkerArgs, run_worker, source_gate};

/// Claims `aggregate_project` and `aggregate_global` jobs: pattern mining.
#[derive(Parser)]
#[command(name = "zuno-worker-mine", version)]
struct Args {
    #[command(flatten)]
    worker: WorkerArgs,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    run_worker(
        "zuno-worker-mine",
        args.worker,
        source_gate,
        zuno_worker_mine::handlers,
    )
    .await
}
