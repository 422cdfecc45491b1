//! The fake embeddings server as a standalone service (`POST /v1/embeddings`, answered by the
//! deterministic hashed bag of concepts of `zuno_tests::fake_embeddings`), so the semantic
//! recall layer can be exercised end to end without a model: `zuno learn eval` with an
//! `embeddings` section whose `base_url` is `http://HOST:PORT/v1` and `dimensions` match.

use clap::Parser;
use zuno_tests::fake_embeddings::{DIMENSIONS, FakeEmbeddings};

#[derive(Parser)]
#[command(name = "zuno-fake-embeddings", version)]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8091")]
    bind: String,
    /// Length of the vectors it answers.
    #[arg(long, default_value_t = DIMENSIONS)]
    dimensions: u32,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let shutdown = zuno_shared::runtime::shutdown::on_signal();
    let server = FakeEmbeddings::start_on(&args.bind, args.dimensions)
        .await
        .map_err(|error| anyhow::anyhow!("cannot listen on {}: {error}", args.bind))?;
    println!(
        "zuno-fake-embeddings listening on {} ({} dimensions)",
        server.base_url(),
        args.dimensions
    );
    shutdown.cancelled().await;
    println!(
        "zuno-fake-embeddings stopping after {} requests",
        server.request_count()
    );
    Ok(())
}
