//! Session learning policy: `use_memories` and `generation`, frozen with a revision when the
//! session is created. A child copies its parent's latest durable policy in the same transaction
//! that creates it; `excluded` is host-assigned and final.

use serde::{Deserialize, Serialize};

use super::store::policy as store;
use crate::config::LearningConfig;
use crate::db::{StoreError, Tx};

zuno_queue::text_enum! {
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
    #[serde(rename_all = "snake_case")]
    pub enum Generation {
        Enabled = "enabled",
        Disabled = "disabled",
        /// Fail-closed state for an ineligible session; it can never be enabled again.
        Excluded = "excluded",
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SessionPolicy {
    pub session_id: String,
    pub use_memories: bool,
    pub generation: Generation,
    /// 0 for a legacy session without a durable policy (the configuration fallback).
    pub revision: i64,
    pub reason: Option<String>,
    pub updated_at: i64,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PolicyError {
    #[error("the policy changed: expected revision {expected}, current revision is {current}")]
    Stale { expected: i64, current: i64 },
    #[error("generation is `excluded` for this session and cannot be changed")]
    Excluded,
    #[error(
        "clients may set generation only to `enabled` or `disabled`; `excluded` is host-assigned"
    )]
    ExcludedIsHostAssigned,
    #[error("session `{0}` has no policy")]
    Missing(String),
}

/// The configuration default, used for new root sessions and legacy sessions without a row.
pub fn configured_default(session_id: &str, config: &LearningConfig, now: i64) -> SessionPolicy {
    SessionPolicy {
        session_id: session_id.to_owned(),
        use_memories: config.use_enabled(),
        generation: if config.generate_enabled() {
            Generation::Enabled
        } else {
            Generation::Disabled
        },
        revision: 0,
        reason: None,
        updated_at: now,
    }
}

/// The durable policy of `session_id`, if it has one.
pub async fn load_in(tx: &mut Tx, session_id: &str) -> Result<Option<SessionPolicy>, StoreError> {
    store::load_in(tx, session_id).await
}

/// [`effective_in`] as one statement outside any transaction (the prompt path reads it before
/// every request; a single row needs no transaction to be consistent).
pub async fn effective(
    db: &crate::db::Db,
    session_id: &str,
    config: &LearningConfig,
    now: i64,
) -> Result<SessionPolicy, StoreError> {
    Ok(match store::load(db, session_id).await? {
        Some(policy) => policy,
        None => configured_default(session_id, config, now),
    })
}

/// The durable policy, or the configuration fallback for a legacy session (revision 0).
pub async fn effective_in(
    tx: &mut Tx,
    session_id: &str,
    config: &LearningConfig,
    now: i64,
) -> Result<SessionPolicy, StoreError> {
    Ok(match load_in(tx, session_id).await? {
        Some(policy) => policy,
        None => configured_default(session_id, config, now),
    })
}

/// The project of a session (`None`: no such session) and its effective policy, in one
/// statement: the extraction settlement checks both for every job.
pub async fn session_project_and_effective_in(
    tx: &mut Tx,
    session_id: &str,
    config: &LearningConfig,
    now: i64,
) -> Result<(Option<String>, SessionPolicy), StoreError> {
    let Some(session) = store::session_with_policy_in(tx, session_id).await? else {
        return Ok((None, configured_default(session_id, config, now)));
    };
    let policy = session
        .policy
        .unwrap_or_else(|| configured_default(session_id, config, now));
    Ok((session.project_id, policy))
}

/// Freezes the policy of a new session: a copy of the parent's latest durable policy (its
/// disabled/excluded choices preserved), else the configuration default. Revision 1.
pub async fn create_in(
    tx: &mut Tx,
    session_id: &str,
    parent_id: Option<&str>,
    config: &LearningConfig,
    now: i64,
) -> Result<SessionPolicy, StoreError> {
    let parent = match parent_id {
        Some(parent) => load_in(tx, parent).await?,
        None => None,
    };
    let mut policy = match parent {
        Some(parent) => SessionPolicy {
            session_id: session_id.to_owned(),
            use_memories: parent.use_memories,
            generation: parent.generation,
            revision: 1,
            reason: parent.reason.map(|reason| format!("inherited: {reason}")),
            updated_at: now,
        },
        None => configured_default(session_id, config, now),
    };
    policy.revision = 1;
    write_in(tx, &policy).await?;
    Ok(policy)
}

async fn write_in(tx: &mut Tx, policy: &SessionPolicy) -> Result<(), StoreError> {
    store::upsert_in(tx, policy).await
}

/// A client's compare-and-set update. `generation` may only be `enabled` or `disabled`, and an
/// excluded session stays excluded.
pub async fn update_in(
    tx: &mut Tx,
    session_id: &str,
    expected_revision: i64,
    use_memories: Option<bool>,
    generation: Option<Generation>,
    config: &LearningConfig,
    now: i64,
) -> Result<Result<SessionPolicy, PolicyError>, StoreError> {
    if generation == Some(Generation::Excluded) {
        return Ok(Err(PolicyError::ExcludedIsHostAssigned));
    }
    let current = effective_in(tx, session_id, config, now).await?;
    if current.revision != expected_revision {
        return Ok(Err(PolicyError::Stale {
            expected: expected_revision,
            current: current.revision,
        }));
    }
    if current.generation == Generation::Excluded
        && generation.is_some_and(|g| g != Generation::Excluded)
    {
        return Ok(Err(PolicyError::Excluded));
    }
    let next = SessionPolicy {
        session_id: session_id.to_owned(),
        use_memories: use_memories.unwrap_or(current.use_memories),
        generation: generation.unwrap_or(current.generation),
        revision: current.revision + 1,
        reason: current.reason,
        updated_at: now,
    };
    let changed = if current.revision == 0 {
        write_in(tx, &next).await?;
        1
    } else {
        store::update_in(tx, &next, expected_revision).await?
    };
    if changed != 1 {
        let latest = effective_in(tx, session_id, config, now).await?;
        return Ok(Err(PolicyError::Stale {
            expected: expected_revision,
            current: latest.revision,
        }));
    }
    Ok(Ok(next))
}

/// Host-side exclusion (e.g. a turn consumed a Web/MCP result): final, revision bumped.
pub async fn exclude_in(
    tx: &mut Tx,
    session_id: &str,
    reason: &str,
    config: &LearningConfig,
    now: i64,
) -> Result<SessionPolicy, StoreError> {
    let current = effective_in(tx, session_id, config, now).await?;
    if current.generation == Generation::Excluded {
        return Ok(current);
    }
    let next = SessionPolicy {
        generation: Generation::Excluded,
        revision: current.revision + 1,
        reason: Some(reason.to_owned()),
        updated_at: now,
        ..current
    };
    write_in(tx, &next).await?;
    Ok(next)
}
