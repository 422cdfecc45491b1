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
    run_worker("zuno-worker-maintain", args.worker, source_gate, |env| {
        // Before the first claim, so a host that runs only maintenance workers (no `zuno serve`)
        // still gets its Memory files repaired when a worker starts.
        tokio::task::block_in_place(|| {
            tokio::runtime::Handle::current()
                .block_on(zuno_worker_maintain::reconcile_at_start(env))
        });
        zuno_worker_maintain::handlers(env)
    })
    .await
}
