//! The Experience aggregate's shared SQL conditions, written once: every query that asks for
//! "live" experience (recall, mining, Memory support, maintenance) uses these, so a change to
//! what keeps an experience usable is one edit.

/// An experience that may still be used: not forgotten or superseded (`status = 'active'`) and
/// its source unchanged since extraction (`source_state = 'current'`). A string literal, so it
/// composes with `concat!` into `&'static str` statements: `live_experience!()` for an
/// unaliased `experience_record`, `live_experience!("e")` for one aliased `e`.
macro_rules! live_experience {
    () => {
        "status = 'active' AND source_state = 'current'"
    };
    ($alias:literal) => {
        concat!(
            $alias,
            ".status = 'active' AND ",
            $alias,
            ".source_state = 'current'"
        )
    };
}
pub(crate) use live_experience;

/// A live experience that may be evidence for a rule: verified, and never an unresolved issue (an
/// issue nobody solved teaches no rule). Aliased like [`live_experience!`].
macro_rules! evidence_experience {
    () => {
        concat!(
            $crate::learning::experience::store::live_experience!(),
            " AND verification = 'verified' AND kind <> 'unresolved_issue'"
        )
    };
    ($alias:literal) => {
        concat!(
            $crate::learning::experience::store::live_experience!($alias),
            " AND ",
            $alias,
            ".verification = 'verified' AND ",
            $alias,
            ".kind <> 'unresolved_issue'"
        )
    };
}
pub(crate) use evidence_experience;

/// What decides whether one experience may become pattern evidence, read by id.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct EvidenceFacts {
    pub project_id: String,
    pub kind: String,
    pub title: String,
    pub summary: String,
    pub resolution: Option<String>,
    pub verification: String,
    pub status: String,
    pub source_state: String,
    /// Live and verified: evidence unless it is an unresolved issue.
    pub verified_and_live: bool,
}

pub async fn evidence_facts_in(
    tx: &mut crate::db::Tx,
    experience_id: &str,
) -> Result<Option<EvidenceFacts>, crate::db::StoreError> {
    const SQL: &str = concat!(
        "SELECT project_id, kind, title, summary, resolution, verification, status, \
           source_state, CASE WHEN ",
        live_experience!(),
        " AND verification = 'verified' THEN TRUE ELSE FALSE END AS verified_and_live \
         FROM experience_record WHERE id = $1"
    );
    Ok(crate::on_tx!(tx, |conn| sqlx::query_as(SQL)
        .bind(experience_id)
        .fetch_optional(conn)
        .await)?)
}

/// One experience offered to the pattern miner.
#[derive(Debug, Clone, PartialEq, serde::Serialize, sqlx::FromRow)]
pub struct MiningInput {
    pub id: String,
    /// The project's commit-ordered experience sequence.
    pub seq: i64,
    pub kind: String,
    pub session_id: Option<String>,
    pub title: String,
    pub summary: String,
    pub resolution: Option<String>,
    pub created_at: i64,
}

/// A window `(after, through]` of one project's experience sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SeqWindow<'a> {
    pub project_id: &'a str,
    pub after: i64,
    pub through: i64,
}

/// The project's newest experience `seq` (`None` before its first experience).
pub async fn newest_seq_in(
    tx: &mut crate::db::Tx,
    project_id: &str,
) -> Result<Option<i64>, crate::db::StoreError> {
    Ok(crate::on_tx!(tx, |conn| sqlx::query_scalar(
        "SELECT MAX(seq) FROM experience_record WHERE project_id = $1"
    )
    .bind(project_id)
    .fetch_one(conn)
    .await)?)
}

/// How many active experiences (any verification) fall in `window`.
pub async fn active_count_in(
    tx: &mut crate::db::Tx,
    window: SeqWindow<'_>,
) -> Result<i64, crate::db::StoreError> {
    Ok(crate::on_tx!(tx, |conn| sqlx::query_scalar(
        "SELECT COUNT(*) FROM experience_record WHERE project_id = $1 AND status = 'active' \
         AND seq > $2 AND seq <= $3"
    )
    .bind(window.project_id)
    .bind(window.after)
    .bind(window.through)
    .fetch_one(conn)
    .await)?)
}

/// The experiences of `window` that may be evidence for a rule, oldest first, at most `limit`.
pub async fn evidence_inputs_in(
    tx: &mut crate::db::Tx,
    window: SeqWindow<'_>,
    limit: i64,
) -> Result<Vec<MiningInput>, crate::db::StoreError> {
    const SQL: &str = concat!(
        "SELECT id, seq, kind, session_id, title, summary, resolution, created_at \
         FROM experience_record WHERE project_id = $1 AND ",
        evidence_experience!(),
        " AND seq > $2 AND seq <= $3 ORDER BY seq LIMIT $4"
    );
    Ok(crate::on_tx!(tx, |conn| sqlx::query_as(SQL)
        .bind(window.project_id)
        .bind(window.after)
        .bind(window.through)
        .bind(limit)
        .fetch_all(conn)
        .await)?)
}

/// The ids of the project's experiences past `after_seq` that may be evidence for a rule.
pub async fn evidence_ids_after_in(
    tx: &mut crate::db::Tx,
    project_id: &str,
    after_seq: i64,
) -> Result<Vec<String>, crate::db::StoreError> {
    const SQL: &str = concat!(
        "SELECT id FROM experience_record WHERE project_id = $1 AND ",
        evidence_experience!(),
        " AND seq > $2 ORDER BY id"
    );
    Ok(crate::on_tx!(tx, |conn| sqlx::query_scalar(SQL)
        .bind(project_id)
        .bind(after_seq)
        .fetch_all(conn)
        .await)?)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_conditions_read_as_sql() {
        assert_eq!(
            live_experience!("e"),
            "e.status = 'active' AND e.source_state = 'current'"
        );
        assert_eq!(
            evidence_experience!(),
            "status = 'active' AND source_state = 'current' AND verification = 'verified' \
             AND kind <> 'unresolved_issue'"
        );
    }
}
