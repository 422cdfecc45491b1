//! Source manifests' SQL: the `learning_source_record` rows persisted on an extraction job.

use super::keyed;
use crate::db::{Arg, Db, StoreError, Tx};
use crate::learning::manifest::{SourceRecord, wire_name};

/// Source records per insert statement (twelve parameters each).
const PERSIST_CHUNK: usize = 50;

/// Inserts `records` on job `job_id` in statements of [`PERSIST_CHUNK`] records; a record the
/// job already has stays.
pub(crate) async fn insert_in(
    tx: &mut Tx,
    job_id: &str,
    records: &[SourceRecord],
) -> Result<(), StoreError> {
    let labels: Vec<(String, String)> = records
        .iter()
        .map(|record| (wire_name(record.kind), wire_name(record.verification)))
        .collect();
    for (records, labels) in records
        .chunks(PERSIST_CHUNK)
        .zip(labels.chunks(PERSIST_CHUNK))
    {
        let rows = (0..records.len())
            .map(|row| {
                let marks: Vec<String> =
                    (1..=12).map(|col| format!("${}", row * 12 + col)).collect();
                format!("({})", marks.join(", "))
            })
            .collect::<Vec<_>>()
            .join(", ");
        let sql = format!(
            "INSERT INTO learning_source_record (job_id, source_id, address, message_id, part_ordinal, kind, \
               verification, text, raw_digest, redacted_digest, clipped, context) \
             VALUES {rows} ON CONFLICT (job_id, source_id) DO NOTHING"
        );
        let mut args: Vec<Arg<'_>> = Vec::with_capacity(records.len() * 12);
        for (record, (kind, verification)) in records.iter().zip(labels) {
            let row: [Arg<'_>; 12] = [
                job_id.into(),
                (&record.source_id).into(),
                (&record.address).into(),
                (&record.message_id).into(),
                record.part_ordinal.into(),
                kind.as_str().into(),
                verification.as_str().into(),
                (&record.text).into(),
                (&record.raw_digest).into(),
                (&record.redacted_digest).into(),
                record.clipped.into(),
                record.context.into(),
            ];
            args.extend(row);
        }
        crate::db::execute_in(tx, sqlx::AssertSqlSafe(sql.as_str()), &args).await?;
    }
    Ok(())
}

/// A persisted source record, its kind and verification as the columns store them.
#[derive(sqlx::FromRow)]
pub(crate) struct PersistedRecordRow {
    pub(crate) source_id: String,
    pub(crate) address: String,
    pub(crate) message_id: Option<String>,
    pub(crate) kind: String,
    pub(crate) verification: String,
    pub(crate) text: String,
    pub(crate) raw_digest: String,
    pub(crate) redacted_digest: String,
    pub(crate) clipped: bool,
    pub(crate) context: bool,
}

/// The source records persisted on job `job_id`, in no particular order.
pub(crate) async fn of_job(db: &Db, job_id: &str) -> Result<Vec<PersistedRecordRow>, StoreError> {
    let sql = "SELECT source_id, address, message_id, kind, verification, text, raw_digest, redacted_digest, clipped, \
               context FROM learning_source_record WHERE job_id = $1";
    Ok(keyed!(on_db, db, query_as(sql), job_id, fetch_all)?)
}
