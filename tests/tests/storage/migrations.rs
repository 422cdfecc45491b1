//! Start-up refuses a database whose applied migrations or schema were altered.

use zuno_shared::db::{ConnectOptions, Db, MigrationError};
use zuno_tests::{TestDb, on_both_backends};

async fn exec(db: &Db, sql: &'static str) {
    zuno_shared::on_db!(db, pool => sqlx::query(sql).execute(pool).await.map(|d| d.rows_affected()))
        .unwrap();
}

async fn reopen(db: &TestDb) -> Result<Db, MigrationError> {
    Db::open(&ConnectOptions::new(db.url.clone())).await
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

on_both_backends!(
    migrating_twice_applies_nothing_new,
    an_altered_applied_migration_refuses_to_start,
    a_migration_from_a_newer_build_refuses_to_start,
    a_schema_altered_by_hand_refuses_to_start,
    an_added_trigger_or_column_is_detected_too,
);
