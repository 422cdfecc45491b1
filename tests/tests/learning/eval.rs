//! The learning-quality harness over the labelled dev set (`tests/learning-eval/dev/`, reading
//! the real transcripts in place from `../shared/corpus`), on both backends. The default
//! extractor (`rules-2`) is deterministic, so its figures are pinned: a change that makes the
//! learner keep more junk, find fewer lessons or recall worse fails here. The floors are the
//! figures `docs/benchmarks.md` reports (measured with `zuno learn eval`).

use std::path::{Path, PathBuf};

use zuno_api::eval::{EvalOptions, Report, StoreChoice};
use zuno_shared::config::Config;

/// The figures `docs/benchmarks.md` reports for `rules-2` (the lower of the two backends, which
/// rank recall candidates differently); a regression below any of them fails.
const MIN_PRECISION: f64 = 0.96;
const MIN_LESSON_RECALL: f64 = 0.71;
const MIN_RECALL_AT_5: f64 = 0.64;
const MAX_FALSE_RECALL: f64 = 0.05;
const MIN_USER_WIDE_REACHED: usize = 5;

fn repository() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn dev_labels() -> Vec<PathBuf> {
    let dir = repository().join("tests/learning-eval/dev");
    let mut labels: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("the dev labels directory")
        .map(|entry| entry.expect("a directory entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "json"))
        .collect();
    labels.sort();
    assert!(labels.len() >= 15, "{} labels files", labels.len());
    labels
}

async fn run(store: StoreChoice) -> Report {
    let options = EvalOptions {
        labels: dev_labels(),
        corpus: repository().join("../shared/corpus"),
        repository: repository(),
        store,
        config: Config::default(),
        cassettes: None,
    };
    zuno_api::eval::run(&options)
        .await
        .expect("the harness runs")
}

fn assert_figures(report: &Report) {
    let text = zuno_api::eval::print_text(report);
    let total = &report.total;
    for file in &report.files {
        assert!(
            file.report.label_problems.is_empty(),
            "{}: {:?}",
            file.report.labels,
            file.report.label_problems
        );
        assert!(
            file.report.unlabelled.is_empty(),
            "{}: unlabelled {:?}",
            file.report.labels,
            file.report.unlabelled
        );
        assert_eq!(file.report.extractor, "rules-2");
    }
    let at_least = |name: &str, value: Option<f64>, floor: f64| {
        let value = value.unwrap_or(0.0);
        assert!(
            value >= floor,
            "{name} {value:.3} fell below {floor}\n{text}"
        );
    };
    at_least("precision", total.precision, MIN_PRECISION);
    at_least("lesson recall", total.lesson_recall, MIN_LESSON_RECALL);
    at_least("recall@5", total.recall_at_5, MIN_RECALL_AT_5);
    let false_recall = total.false_recall.unwrap_or(0.0);
    assert!(
        false_recall <= MAX_FALSE_RECALL,
        "false recall {false_recall:.3}\n{text}"
    );
    assert_eq!(total.counts.cross_project_items, 0, "{text}");
    assert_eq!(total.counts.junk_memory, 0, "{text}");
    assert!(
        total.counts.user_wide_reached >= MIN_USER_WIDE_REACHED,
        "{text}"
    );
    assert_eq!(total.counts.duplicates, 0, "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_dev_set_figures_hold() {
    assert_figures(&run(StoreChoice::Sqlite).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_dev_set_figures_hold() {
    assert_figures(
        &run(StoreChoice::Postgres {
            admin_url: zuno_tests::postgres_admin_url(),
        })
        .await,
    );
}
