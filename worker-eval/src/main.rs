use clap::Parser;
use zuno_shared::runtime::process::{WorkerArgs, allow_all, run_worker};

/// Claims `evaluate` jobs: offline cassette evaluation of Skill candidates.
#[derive(Parser)]
#[command(name = "zuno-worker-eval", version)]
struct Args {
    #[command(flatten)]
    worker: WorkerArgs,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    run_worker(
        "zuno-worker-eval",
        args.worker,
        allow_all,
        zuno_worker_eval::handlers,
    )
    .await
}
