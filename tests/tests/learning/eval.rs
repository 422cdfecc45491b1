//! The learning-quality harness over the labelled dev set (`tests/learning-eval/dev/`, reading
//! the real transcripts in place from `../shared/corpus`), on both backends. The default
//! extractor (`rules-2`) is deterministic, so its figures are pinned: a change that makes the
//! learner keep more junk, find fewer lessons or recall worse fails here. The floors are the
//! figures `docs/benchmarks.md` reports (measured with `zuno learn eval`).
//!
//! The model path is pinned the same way on recorded answers, two sets of them:
//! - `blind-4`, its real figures: every request of the pipeline answered by a language model
//!   that saw only the request file (`tests/learning-eval/cassettes/blind-4/README.md`);
//! - `model-1`, the label oracle's answers (`zuno-record-cassettes`): an upper bound that proves
//!   the plumbing, since the oracle answers from the labels.
//!
//! Replaying runs the real extraction, maintenance and recall over those answers. A change in
//! what the pipeline sends a model finds no recording, fails the job, and fails here: re-record
//! both sets (and re-answer the blind one, `scripts/blind-record`).

use std::path::{Path, PathBuf};

use zuno_cli::eval::{CassetteMode, EvalOptions, Report, StoreChoice};
use zuno_shared::config::Config;

/// The figures `docs/benchmarks.md` reports for `rules-2` (the lower of the two backends, which
/// rank recall candidates differently); a regression below any of them fails.
const MIN_PRECISION: f64 = 0.96;
const MIN_LESSON_RECALL: f64 = 0.71;
const MIN_RECALL_AT_5: f64 = 0.68;
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
        server: std::sync::Arc::new(zuno_api::Api),
    };
    zuno_cli::eval::run(&options)
        .await
        .expect("the harness runs")
}

/// The model path on the label oracle's answers (`docs/benchmarks.md`, the lower backend): an
/// upper bound that proves the plumbing, since the oracle answers from the labels.
const MODEL_MIN_PRECISION: f64 = 0.98;
const MODEL_MIN_LESSON_RECALL: f64 = 0.88;
const MODEL_MIN_RECALL_AT_5: f64 = 0.83;
const MODEL_MAX_FALSE_RECALL: f64 = 0.042;

struct Floors {
    extractor: &'static str,
    precision: f64,
    lesson_recall: f64,
    recall_at_5: f64,
    false_recall: f64,
    /// Memory entries whose source prompt teaches nothing, as a share of all entries.
    junk_memory_share: f64,
    user_wide_reached: usize,
}

const RULES_2: Floors = Floors {
    extractor: "rules-2",
    precision: MIN_PRECISION,
    lesson_recall: MIN_LESSON_RECALL,
    recall_at_5: MIN_RECALL_AT_5,
    false_recall: MAX_FALSE_RECALL,
    junk_memory_share: 0.0,
    user_wide_reached: MIN_USER_WIDE_REACHED,
};

const MODEL_1: Floors = Floors {
    extractor: "model-1",
    precision: MODEL_MIN_PRECISION,
    lesson_recall: MODEL_MIN_LESSON_RECALL,
    recall_at_5: MODEL_MIN_RECALL_AT_5,
    false_recall: MODEL_MAX_FALSE_RECALL,
    junk_memory_share: 0.0,
    user_wide_reached: MIN_USER_WIDE_REACHED,
};

/// The blind set's figures (`docs/benchmarks.md`, "Learning quality: blind model answers", the
/// lower backend).
const BLIND_MIN_PRECISION: f64 = 0.97;
const BLIND_MIN_LESSON_RECALL: f64 = 0.88;
const BLIND_MIN_RECALL_AT_5: f64 = 1.0;
const BLIND_MAX_FALSE_RECALL: f64 = 0.042;
const BLIND_MAX_JUNK_SHARE: f64 = 0.0;
const BLIND_MIN_USER_WIDE_REACHED: usize = 5;

/// The model path's own figures: every request answered blind (by a language model that saw
/// only the request; `tests/learning-eval/cassettes/blind-4/README.md`), replayed.
const BLIND_4: Floors = Floors {
    extractor: "model-1",
    precision: BLIND_MIN_PRECISION,
    lesson_recall: BLIND_MIN_LESSON_RECALL,
    recall_at_5: BLIND_MIN_RECALL_AT_5,
    false_recall: BLIND_MAX_FALSE_RECALL,
    junk_memory_share: BLIND_MAX_JUNK_SHARE,
    user_wide_reached: BLIND_MIN_USER_WIDE_REACHED,
};

/// Replays the oracle's recordings (`model-1`, made with the `fake` provider of the test
/// configuration) or a blind set (made with the harness's own `recorded` provider, which a
/// configuration without providers selects).
async fn replay(store: StoreChoice, set: &str) -> Report {
    let config = if set == "model-1" {
        // Replay never reaches the provider's address: every answer comes from the cassettes.
        zuno_tests::fake_provider::learning_config("http://127.0.0.1:9", 30_000)
    } else {
        Config::default()
    };
    let options = EvalOptions {
        labels: dev_labels(),
        corpus: repository().join("../shared/corpus"),
        repository: repository(),
        store,
        config,
        cassettes: Some(CassetteMode::Replay(
            repository().join("tests/learning-eval/cassettes").join(set),
        )),
        server: std::sync::Arc::new(zuno_api::Api),
    };
    zuno_cli::eval::run(&options)
        .await
        .expect("the harness runs")
}

fn assert_figures(report: &Report) {
    assert_floors(report, &RULES_2);
}

fn assert_floors(report: &Report, floors: &Floors) {
    let text = zuno_cli::eval::print_text(report);
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
        assert_eq!(file.report.extractor, floors.extractor);
        for (job, count) in &file.report.jobs {
            assert!(
                !job.ends_with(":failed") && !job.ends_with(":dead"),
                "{}: {count} {job} jobs (a request without a recording? re-record with \
                 zuno-record-cassettes)\n{}",
                file.report.labels,
                zuno_cli::eval::print_text(report)
            );
        }
    }
    let at_least = |name: &str, value: Option<f64>, floor: f64| {
        let value = value.unwrap_or(0.0);
        assert!(
            value >= floor,
            "{name} {value:.3} fell below {floor}\n{text}"
        );
    };
    at_least("precision", total.precision, floors.precision);
    at_least("lesson recall", total.lesson_recall, floors.lesson_recall);
    at_least("recall@5", total.recall_at_5, floors.recall_at_5);
    let false_recall = total.false_recall.unwrap_or(0.0);
    assert!(
        false_recall <= floors.false_recall,
        "false recall {false_recall:.3}\n{text}"
    );
    assert_eq!(total.counts.cross_project_items, 0, "{text}");
    let junk_share = total.counts.junk_memory as f64 / total.counts.memory_entries.max(1) as f64;
    assert!(
        junk_share <= floors.junk_memory_share,
        "junk Memory {junk_share:.3}\n{text}"
    );
    assert!(
        total.counts.user_wide_reached >= floors.user_wide_reached,
        "{text}"
    );
    assert_eq!(total.counts.duplicates, 0, "{text}");
    // No entry tells the agent to run what a labelled lesson forbids (issue 29).
    assert_eq!(total.counts.label_contradictions, 0, "{text}");
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

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_model_path_figures_hold_on_recorded_answers() {
    assert_floors(&replay(StoreChoice::Sqlite, "model-1").await, &MODEL_1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_model_path_figures_hold_on_recorded_answers() {
    assert_floors(
        &replay(
            StoreChoice::Postgres {
                admin_url: zuno_tests::postgres_admin_url(),
            },
            "model-1",
        )
        .await,
        &MODEL_1,
    );
}

/// The blind set's floors, and Memory's shape: one entry per subject, no rule stated twice,
/// every document within its budget (issue 29).
fn assert_blind_figures(report: &Report) {
    assert_floors(report, &BLIND_4);
    assert_eq!(
        report.total.counts.shared_subjects, 0,
        "entries sharing a subject"
    );
    assert_eq!(report.total.counts.duplicate_rules, 0, "duplicate rules");
    assert_eq!(
        report.total.counts.documents_over_limit, 0,
        "documents over their limit"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sqlite_model_path_figures_hold_on_blind_answers() {
    assert_blind_figures(&replay(StoreChoice::Sqlite, "blind-4").await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_model_path_figures_hold_on_blind_answers() {
    assert_blind_figures(
        &replay(
            StoreChoice::Postgres {
                admin_url: zuno_tests::postgres_admin_url(),
            },
            "blind-4",
        )
        .await,
    );
}
