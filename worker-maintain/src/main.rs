use clap::Parser;
use zuno_shared::runtime::process::{WorkerArgs, run_worker, source_gate};

/// Claims `maintain` jobs: no-tools resident Memory maintenance.
#[derive(Parser)]
#[command(name = "zuno-worker-maintain", version)]
struct Args {
    #[command(flatten)]
    worker: WorkerArgs,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    run_worker(
        "zuno-worker-maintain",
        args.worker,
        source_gate,
        zuno_worker_maintain::handlers,
    )
    .await
}
