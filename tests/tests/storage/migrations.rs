//! Start-up refuses a database whose applied migrations or schema were altered.

use zuno_shared::db::{ConnectOptions, Db, MigrationError};
use zuno_tests::{TestDb, on_both_backends};

async fn exec(db: &Db, sql: &'static str) {
    zuno_shared::on_db!(db, |pool| sqlx::query(sql)
        .execute(pool)
        .await
        .map(|d| d.rows_affected()))
    .unwrap();
}

async fn reopen(db: &TestDb) -> Result<Db, MigrationError> {
    Db::open(
        &ConnectOptions::new(db.url.clone()),
        zuno_shared::migrations::schema(),
    )
    .await
}

async fn migrating_twice_applies_nothing_new(db: TestDb) {
    let first = db.db.check_schema().await.unwrap();
    assert!(first.pending.is_empty());
    let again = db.reopen().await.migrate().await.unwrap();
    assert!(again.applied_now.is_empty());
    assert_eq!(again.fingerprint, first.fingerprint);
}

async fn an_altered_applied_migration_refuses_to_start(db: TestDb) {
    exec(
        &db.db,
        "UPDATE _sqlx_migrations SET checksum = checksum || checksum WHERE version = 1",
    )
    .await;
    let error = reopen(&db).await.unwrap_err();
    assert!(
        matches!(error, MigrationError::Altered { version: 1, .. }),
        "{error}"
    );
    assert!(error.to_string().contains("Refusing to start"));
}

async fn a_migration_from_a_newer_build_refuses_to_start(db: TestDb) {
    let sql = match db.backend {
        zuno_shared::db::Backend::Sqlite => {
            "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) VALUES (99990101000000, 'future', TRUE, X'00', 0)"
        }
        zuno_shared::db::Backend::Postgres => {
            "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) VALUES (99990101000000, 'future', TRUE, '\\x00', 0)"
        }
    };
    exec(&db.db, sql).await;
    let error = reopen(&db).await.unwrap_err();
    assert!(
        matches!(
            error,
            MigrationError::Unknown {
                version: 99990101000000
            }
        ),
        "{error}"
    );
}

async fn a_schema_altered_by_hand_refuses_to_start(db: TestDb) {
    exec(&db.db, "DROP INDEX learning_job_lease").await;
    let error = reopen(&db).await.unwrap_err();
    assert!(
        matches!(error, MigrationError::SchemaAltered { .. }),
        "{error}"
    );
}

async fn an_added_trigger_or_column_is_detected_too(db: TestDb) {
    exec(&db.db, "ALTER TABLE learning_job ADD COLUMN rogue TEXT").await;
    let error = reopen(&db).await.unwrap_err();
    assert!(
        matches!(error, MigrationError::SchemaAltered { .. }),
        "{error}"
    );
}

/// A database created by the build before the semantic layer (migrations up to 0010), holding a
/// job that a source snapshot and an experience reference.
async fn database_before_the_embed_kind(backend: zuno_shared::db::Backend) -> TestDb {
    let db = TestDb::unmigrated(backend).await;
    let folder = match backend {
        zuno_shared::db::Backend::Sqlite => "sqlite",
        zuno_shared::db::Backend::Postgres => "postgres",
    };
    // That build kept every migration in one directory; this one splits them between the
    // application and the queue (same versions, same files).
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let older = tempfile::tempdir().unwrap();
    for source in [
        root.join("../migrations"),
        root.join("../shared/queue/migrations"),
    ] {
        for entry in std::fs::read_dir(source.join(folder)).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            if name.as_str() < "0014" {
                std::fs::copy(&path, older.path().join(&name)).unwrap();
            }
        }
    }
    let migrator = sqlx::migrate::Migrator::new(older.path()).await.unwrap();
    zuno_shared::on_db!(db.db, |pool| migrator.run(pool).await).unwrap();
    for sql in [
        "INSERT INTO project (id, name, created_at) VALUES ('p', 'P', 1)",
        "INSERT INTO learning_job (id, kind, identity_key, project_id, origin, priority, state, run_at, created_at, updated_at) \
         VALUES ('job1', 'extract', 'k1', 'p', 'closed_turn', 200, 'completed', 1, 1, 1)",
        "INSERT INTO learning_source_snapshot (job_id, project_id, session_id, start_message_id, end_message_id, start_seq, end_seq, completed_at, terminal_digest, manifest_digest) \
         VALUES ('job1', 'p', 's', 'm1', 'm2', 1, 2, 1, 'd', 'd')",
        "INSERT INTO experience_record (id, project_id, job_id, ordinal, origin, kind, title, summary, confidence, verification, content_digest, created_at, updated_at) \
         VALUES ('exp1', 'p', 'job1', 0, 'extraction', 'correction', 't', 's', 1.0, 'verified', 'd', 1, 1)",
    ] {
        exec(&db.db, sql).await;
    }
    db
}

async fn count(db: &Db, sql: &'static str) -> i64 {
    zuno_shared::on_db!(db, |pool| sqlx::query_scalar(sql).fetch_one(pool).await).unwrap()
}

/// SQLite cannot alter the job kind's CHECK constraint, so 0014 rebuilds the ledger table: the
/// rows, and the rows of other tables that reference them, must come through, and foreign keys
/// must be enforced again afterwards.
async fn the_embed_kind_migration_keeps_jobs_and_what_references_them(db: TestDb) {
    let backend = db.backend;
    drop(db);
    let old = database_before_the_embed_kind(backend).await;
    // Start-up applies 0014 (and whatever follows it).
    let db = old.reopen().await;
    assert!(db.check_schema().await.unwrap().pending.is_empty());
    assert_eq!(
        count(&db, "SELECT COUNT(*) FROM experience_embedding").await,
        0
    );
    assert_eq!(count(&db, "SELECT COUNT(*) FROM learning_job WHERE id = 'job1' AND kind = 'extract' AND state = 'completed'").await, 1);
    assert_eq!(
        count(
            &db,
            "SELECT COUNT(*) FROM learning_source_snapshot WHERE job_id = 'job1'"
        )
        .await,
        1
    );
    assert_eq!(
        count(
            &db,
            "SELECT COUNT(*) FROM experience_record WHERE id = 'exp1' AND job_id = 'job1'"
        )
        .await,
        1
    );
    exec(&db, "INSERT INTO learning_job (id, kind, identity_key, origin, priority, state, run_at, created_at, updated_at) \
               VALUES ('job2', 'embed', 'k2', 'legacy', 0, 'queued', 1, 1, 1)").await;
    let unknown = zuno_shared::on_db!(db, |pool| {
        sqlx::query(
            "INSERT INTO learning_job (id, kind, identity_key, origin, priority, state, run_at, created_at, updated_at) \
             VALUES ('job3', 'cron', 'k3', 'legacy', 0, 'queued', 1, 1, 1)")
        .execute(pool).await.map(|d| d.rows_affected())
    });
    assert!(unknown.is_err(), "other kinds are still refused");
    let dangling = zuno_shared::on_db!(db, |pool| {
        sqlx::query(
            "INSERT INTO learning_source_snapshot (job_id, project_id, session_id, start_message_id, end_message_id, start_seq, end_seq, completed_at, terminal_digest, manifest_digest) \
             VALUES ('nojob', 'p', 's', 'm1', 'm2', 1, 2, 1, 'd', 'd')")
        .execute(pool).await.map(|d| d.rows_affected())
    });
    assert!(dangling.is_err(), "foreign keys are enforced again");
    exec(&db, "DELETE FROM learning_job WHERE id = 'job1'").await;
    assert_eq!(
        count(&db, "SELECT COUNT(*) FROM learning_source_snapshot").await,
        0,
        "cascades still hold"
    );
}

on_both_backends!(
    the_embed_kind_migration_keeps_jobs_and_what_references_them,
    migrating_twice_applies_nothing_new,
    an_altered_applied_migration_refuses_to_start,
    a_migration_from_a_newer_build_refuses_to_start,
    a_schema_altered_by_hand_refuses_to_start,
    an_added_trigger_or_column_is_detected_too,
);
