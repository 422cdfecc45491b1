//! Records the model path's answers on the labelled dev set as cassettes: starts the label
//! oracle (a model that answers like a careful one, from the labels; `zuno_tests::label_oracle`),
//! runs the learning-quality harness with the model extractor pointed at it and
//! `CassetteMode::Record`, and prints the report. The regression test
//! (`tests/tests/learning/eval.rs`) replays the cassettes.
//!
//!   cargo run -p zuno-tests --bin zuno-record-cassettes -- [cassette dir]
//!
//! Default directory: `tests/learning-eval/cassettes/model-1`. Re-record after changing what the
//! pipeline sends a model (prompts, schemas, manifests): the test reports a request without a
//! recording as a failed job.

use std::path::{Path, PathBuf};

use zuno_cli::eval::{CassetteMode, EvalOptions, StoreChoice};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let repository = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let dir = std::env::args()
        .nth(1)
        .map(PathBuf::from)
        .unwrap_or_else(|| repository.join("tests/learning-eval/cassettes/model-1"));
    let labels = zuno_tests::label_oracle::dev_labels(&repository)?;
    let oracle = zuno_tests::label_oracle::LabelOracle::start(&labels).await?;
    if dir.exists() {
        std::fs::remove_dir_all(&dir)?;
    }
    let options = EvalOptions {
        labels,
        corpus: repository.join("../shared/corpus"),
        repository: repository.clone(),
        store: StoreChoice::Sqlite,
        config: zuno_tests::fake_provider::learning_config(&oracle.base_url(), 30_000),
        cassettes: Some(CassetteMode::Record(dir.clone())),
        server: std::sync::Arc::new(zuno_api::Api),
    };
    let report = zuno_cli::eval::run(&options).await?;
    print!("{}", zuno_cli::eval::print_text(&report));
    eprintln!(
        "recorded {} answers in {}",
        std::fs::read_dir(&dir)?.count(),
        dir.display()
    );
    Ok(())
}
