use clap::Parser;
use zuno_shared::runtime::process::{WorkerArgs, allow_all, run_worker};

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
        allow_all,
        zuno_worker_mine::handlers,
    )
    .await
}
