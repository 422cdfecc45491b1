//! `LearningProjectionService`: one durable view of learning state for every client (HTTP, CLI,
//! dashboard). It reads only durable stores, so it works with generation disabled or no model.

use serde::Serialize;

use super::experience::{self, Experience};
use super::feedback::Feedback;
use super::store::projection as store;
use super::usage::{self, ProviderHealth, TokenTotals};
use super::validate::RefusedItem;
use super::{extractor_version, policy};
use crate::config::Config;
use crate::db::{Db, StoreError};
use crate::ledger::{Job, JobFilter, JobKind, JobState, Ledger, QueueCount};

/// Experiences per page (`/learn list [offset]`).
pub const PAGE: i64 = 100;

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PendingJob {
    pub job_id: String,
    pub kind: JobKind,
    pub state: JobState,
    pub attempts: i64,
    /// When a queued job is next due, or a running job's lease deadline.
    pub deadline: Option<i64>,
}

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RecentError {
    pub job_id: String,
    pub kind: JobKind,
    pub state: JobState,
    pub attempts: i64,
    pub error: String,
    pub at: i64,
}

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Warning {
    pub job_id: String,
    /// e.g. "learning extraction refused experience 2 (experiences.summary): …".
    pub message: String,
    #[schema(value_type = Object)]
    pub refused: RefusedItem,
}

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct QueueView {
    pub counts: Vec<QueueCount>,
    pub pending: Vec<PendingJob>,
    pub recent_errors: Vec<RecentError>,
}

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SessionLearning {
    pub session_id: String,
    pub project_id: String,
    pub policy: policy::SessionPolicy,
    pub feedback: Vec<Feedback>,
    /// The session's own experiences.
    pub session_experiences: Vec<Experience>,
    /// A page of the project's experiences, newest first.
    pub experiences: Vec<Experience>,
    /// Pass as `offset` for the next page; absent on the last page.
    pub next_offset: Option<i64>,
    pub queue: QueueView,
    pub warnings: Vec<Warning>,
    /// The last retrieval selection or skip for this session (what `context` chose, or why it
    /// chose nothing), if any.
    #[schema(value_type = Option<Object>)]
    pub last_retrieval: Option<serde_json::Value>,
    /// Pattern and Skill-candidate views arrive with the slow path.
    #[schema(value_type = Vec<Object>)]
    pub patterns: Vec<serde_json::Value>,
    #[schema(value_type = Vec<Object>)]
    pub skill_candidates: Vec<serde_json::Value>,
}

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProjectStatus {
    pub project_id: String,
    pub extractor_version: String,
    /// `rules` (built-in, no provider) or `model`.
    pub extractor: String,
    /// Which model extraction asks, or that none is configured.
    pub model_path: ModelPath,
    pub learning_enabled: bool,
    pub use_available: bool,
    pub generation_available: bool,
    pub post_turn_enabled: bool,
    pub history_batch_limit: i64,
    pub queue: QueueView,
    pub experiences: i64,
    /// Why nothing was learned yet, when nothing was (`null` once there is an experience):
    /// how many prompts were read and turns admitted, and what the extractor in force keeps.
    pub explanation: Option<String>,
    pub tokens_today: TokenTotals,
    pub tokens_total: TokenTotals,
    pub automatic_tokens_today: i64,
    pub max_tokens_per_day: Option<u64>,
    /// Automatic model calls recorded today, and the daily call budget in force (configured, or
    /// the default of a command-line model).
    pub automatic_calls_today: i64,
    pub max_calls_per_day: Option<u64>,
    /// True when a daily cap holds automatic model calls back: today's automatic spend and the
    /// calls in flight leave no room for one more call.
    pub automatic_paused: bool,
    pub providers: Vec<ProviderHealth>,
    pub warnings: Vec<Warning>,
    /// The rules with guards: recalled, stopped by a guard, broken anyway (`zuno guards list`).
    pub rules: Vec<crate::guards::RuleUse>,
}

/// The model path `learn status` shows: the provider kind and model extraction asks, or the
/// rules extractor with a word on what a model would add.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ModelPath {
    /// `claude_cli claude-code/haiku`, `rules-2, no model configured`, …
    pub active: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    /// The provider kind (`openai_chat`, …, `claude_cli`, `codex_cli`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub api: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Without a model: what one would add and how to get one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hint: Option<String>,
}

/// What a model adds over the rules extractor, and the ways to get one without a key of your own.
pub const NO_MODEL_HINT: &str = "A model extractor also learns lessons stated without a marker \
    word and recalls them in other words; get one with `zuno install claude-code` or `zuno install \
    codex` (your agent's own login), a local Ollama, or an API provider block in config.json \
    (docs/configuration.md#providers).";

/// What a project's learning has read and kept so far.
pub(crate) struct Learned {
    pub(crate) prompts: i64,
    pub(crate) turns: i64,
    pub(crate) waiting: i64,
    pub(crate) experiences: i64,
}

impl Learned {
    /// An empty result explained: what was read, and why the extractor in force kept nothing.
    fn explain(&self, config: &Config) -> Option<String> {
        let Learned {
            prompts,
            turns,
            waiting,
            experiences,
        } = *self;
        if experiences > 0 {
            return None;
        }
        if prompts == 0 {
            return Some(String::from(
                "Nothing read yet: no prompt was sent or imported in this project.",
            ));
        }
        let read = format!("{prompts} prompts read, {turns} closed turns admitted for extraction");
        if waiting > 0 {
            return Some(format!(
                "{read}, {waiting} of them still waiting (see the queue): no lesson yet."
            ));
        }
        let version = extractor_version(config);
        Some(if super::rules::is_rules_version(version) {
            format!(
                "{read}, 0 lessons: the rules extractor ({version}) keeps only explicit \
                 corrections and rules (\"no, use X\", \"always …\", \"never …\", \"from now on …\", \
                 a recovered command) and none of these turns carried one. {NO_MODEL_HINT}"
            )
        } else {
            format!("{read}; the model found no lesson in them.")
        })
    }
}

/// The model path of `config`: with providers configured, the model `learning.extractor_model`
/// (else the only provider's `small_model`) names; with several and neither, each session's own.
pub fn model_path(config: &Config) -> ModelPath {
    if config.providers.is_empty() {
        return ModelPath {
            active: format!("{}, no model configured", extractor_version(config)),
            provider: None,
            api: None,
            model: None,
            hint: Some(String::from(NO_MODEL_HINT)),
        };
    }
    match crate::provider::resolve_model(config, None) {
        Ok(model) => ModelPath {
            active: format!("{} {}/{}", model.api.as_str(), model.provider, model.model),
            api: Some(model.api.as_str().to_owned()),
            provider: Some(model.provider),
            model: Some(model.model),
            hint: None,
        },
        Err(unavailable) => ModelPath {
            active: match unavailable {
                crate::provider::ModelUnavailable::NoModel => String::from(
                    "the session's own provider and model (no learning.extractor_model)",
                ),
                other => format!("unavailable: {other}"),
            },
            provider: None,
            api: None,
            model: None,
            hint: None,
        },
    }
}

async fn queue_view(
    ledger: &Ledger,
    project_id: &str,
    session_id: Option<&str>,
) -> Result<QueueView, StoreError> {
    let filter = JobFilter {
        projects: Some(vec![project_id.to_owned()]),
        session_id: session_id.map(str::to_owned),
        limit: 200,
        ..JobFilter::default()
    };
    let jobs = ledger.list(&filter).await.map_err(ledger_store)?;
    let mut counts: Vec<QueueCount> = Vec::new();
    for job in &jobs {
        match counts
            .iter_mut()
            .find(|c| c.kind == job.kind && c.state == job.state)
        {
            Some(count) => count.count += 1,
            None => counts.push(QueueCount {
                kind: job.kind,
                state: job.state,
                count: 1,
            }),
        }
    }
    let pending = jobs
        .iter()
        .filter(|j| matches!(j.state, JobState::Queued | JobState::Running))
        .map(|j| PendingJob {
            job_id: j.id.clone(),
            kind: j.kind,
            state: j.state,
            attempts: j.attempts,
            deadline: if j.state == JobState::Running {
                j.lease_expires_at
            } else {
                Some(j.run_at)
            },
        })
        .collect();
    let recent_errors = jobs
        .iter()
        .filter_map(|j| {
            j.last_error.as_ref().map(|error| RecentError {
                job_id: j.id.clone(),
                kind: j.kind,
                state: j.state,
                attempts: j.attempts,
                error: error.clone(),
                at: j.updated_at,
            })
        })
        .take(10)
        .collect();
    Ok(QueueView {
        counts,
        pending,
        recent_errors,
    })
}

fn warnings(jobs: &[Job]) -> Vec<Warning> {
    jobs.iter()
        .filter(|j| j.kind == JobKind::Extract)
        .flat_map(|j| {
            let refused: Vec<RefusedItem> = j
                .result
                .as_ref()
                .and_then(|r| r.get("refusedItems"))
                .and_then(|v| serde_json::from_value::<Vec<serde_json::Value>>(v.clone()).ok())
                .unwrap_or_default()
                .into_iter()
                .filter_map(|v| {
                    Some(RefusedItem {
                        ordinal: v.get("ordinal")?.as_i64()?,
                        experience_ordinal: v.get("experienceOrdinal")?.as_i64()?,
                        field: v.get("field")?.as_str()?.to_owned(),
                        detail: v.get("detail")?.as_str()?.to_owned(),
                    })
                })
                .collect();
            refused.into_iter().map(move |item| Warning {
                job_id: j.id.clone(),
                message: format!(
                    "learning extraction refused experience {} ({}): {}",
                    item.experience_ordinal, item.field, item.detail
                ),
                refused: item,
            })
        })
        .collect()
}

fn ledger_store(error: crate::ledger::LedgerError) -> StoreError {
    match error {
        crate::ledger::LedgerError::Store(store) => store,
        other => StoreError::Corrupt(other.to_string()),
    }
}

pub async fn session_learning(
    db: &Db,
    ledger: &Ledger,
    config: &Config,
    session_id: &str,
    offset: i64,
) -> Result<Option<SessionLearning>, StoreError> {
    let project_id = store::project_of_session(db, session_id).await?;
    let Some(project_id) = project_id else {
        return Ok(None);
    };
    let mut tx = db.begin_read().await?;
    let policy =
        policy::effective_in(&mut tx, session_id, &config.learning, ledger.now_ms()).await?;
    let feedback_ids = super::store::feedback::messages_of_session_in(&mut tx, session_id).await?;
    let mut feedback = Vec::new();
    for id in feedback_ids {
        if let Some(item) = super::feedback::load_in(&mut tx, &id).await? {
            feedback.push(item);
        }
    }
    let last_retrieval =
        super::store::events::last_retrieval_payload_in(&mut tx, session_id).await?;
    tx.rollback().await?;
    let (experiences, total) = experience::list(db, &project_id, offset.max(0), PAGE).await?;
    let session_experiences = experience::for_session(db, session_id).await?;
    let queue = queue_view(ledger, &project_id, Some(session_id)).await?;
    let jobs = ledger
        .list(&JobFilter {
            session_id: Some(session_id.to_owned()),
            kind: Some(JobKind::Extract),
            limit: 50,
            ..JobFilter::default()
        })
        .await
        .map_err(ledger_store)?;
    let next = offset.max(0) + PAGE;
    Ok(Some(SessionLearning {
        session_id: session_id.to_owned(),
        project_id,
        policy,
        feedback,
        session_experiences,
        experiences,
        next_offset: (next < total).then_some(next),
        queue,
        warnings: warnings(&jobs),
        last_retrieval: last_retrieval.and_then(|text| serde_json::from_str(&text).ok()),
        patterns: Vec::new(),
        skill_candidates: Vec::new(),
    }))
}

pub async fn project_status(
    db: &Db,
    ledger: &Ledger,
    config: &Config,
    project_id: &str,
) -> Result<ProjectStatus, StoreError> {
    let learning = &config.learning;
    let now = ledger.now_ms();
    let today = usage::day_of(now);
    let budget = usage::automatic_budget(db, today).await?;
    let learned = store::learned(db, project_id).await?;
    let jobs = ledger
        .list(&JobFilter {
            projects: Some(vec![project_id.to_owned()]),
            kind: Some(JobKind::Extract),
            limit: 50,
            ..JobFilter::default()
        })
        .await
        .map_err(ledger_store)?;
    let caps = usage::DailyCaps::of(config);
    let version = extractor_version(config);
    Ok(ProjectStatus {
        project_id: project_id.to_owned(),
        extractor_version: version.to_owned(),
        extractor: String::from(if super::rules::is_rules_version(version) {
            "rules"
        } else {
            "model"
        }),
        model_path: model_path(config),
        learning_enabled: learning.enabled,
        use_available: learning.use_enabled(),
        generation_available: learning.generate_enabled(),
        post_turn_enabled: learning.post_turn_enabled(),
        history_batch_limit: super::ingestion::REPAIR_BATCH_LIMIT,
        queue: queue_view(ledger, project_id, None).await?,
        experiences: learned.experiences,
        explanation: learned.explain(config),
        tokens_today: usage::project_totals(db, project_id, Some(today)).await?,
        tokens_total: usage::project_totals(db, project_id, None).await?,
        automatic_tokens_today: budget.spent,
        max_tokens_per_day: caps.tokens,
        automatic_calls_today: budget.calls_spent,
        max_calls_per_day: caps.calls,
        automatic_paused: caps.any()
            && !budget.admits(usage::call_ceiling(&learning.execution), caps),
        providers: usage::health(db).await?,
        warnings: warnings(&jobs),
        rules: crate::guards::rule_uses(db, project_id).await?,
    })
}
