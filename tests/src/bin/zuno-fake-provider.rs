//! The fake model provider as a standalone service, for the docker-compose stack: it serves the
//! same server the tests use (`zuno_tests::fake_provider`) in auto-answer mode, so every request
//! gets a valid answer of its own kind (an extraction citing the turn's first user statement, a
//! maintenance plan, pattern groups, an evaluation step or grade) and the stack learns through
//! every stage without a real model or key.
//!
//! Configure Zuno with a provider whose `base_url` is `http://HOST:PORT/v1` (any of the three
//! wire formats) and `learning.extractor_model` naming it.

use clap::Parser;
use zuno_tests::fake_provider::FakeProvider;

#[derive(Parser)]
#[command(name = "zuno-fake-provider", version)]
struct Args {
    /// Address to listen on.
    #[arg(
        long,
        env = "ZUNO_FAKE_PROVIDER_BIND",
        default_value = "127.0.0.1:8090"
    )]
    bind: String,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let shutdown = zuno_shared::runtime::shutdown::on_signal();
    let provider = FakeProvider::start_auto(&args.bind)
        .await
        .map_err(|error| anyhow::anyhow!("cannot listen on {}: {error}", args.bind))?;
    // One line a supervisor or test can wait for (the base URL shows the bound port).
    println!(
        "zuno-fake-provider listening on {} (auto-answer mode)",
        provider.base_url()
    );
    // As PID 1 in a container nothing else handles SIGTERM: stop promptly on it.
    shutdown.cancelled().await;
    println!(
        "zuno-fake-provider stopping after {} requests",
        provider.request_count()
    );
    drop(provider);
    Ok(())
}
