//! Embedded migrations with fail-closed verification, for the queue's tables and the
//! application's through one history.
//!
//! The queue crate embeds only its own migrations ([`QUEUE_MIGRATIONS`], from
//! `shared/queue/migrations/`); the application hands its own [`MigrationSet`] to
//! [`Schema::new`], which merges both into one version-ordered list run by one sqlx migrator
//! against one `_sqlx_migrations` table. Versions are one sequence across both sets (a version
//! used by both is refused), so a database migrated before the sets were split sees exactly the
//! versions and checksums it recorded (docs/adr/0010-one-migration-history-two-owners.md).
//!
//! Start-up refuses to continue when (1) an applied migration's checksum differs from this
//! build's copy, (2) the database carries a migration this build does not know, or (3) the schema
//! objects (tables, columns, indexes, triggers, constraints) differ from the fingerprint recorded
//! when migrations last ran — i.e. someone altered the schema by hand.

use std::collections::HashMap;

use sha2::{Digest, Sha256};
use sqlx::Row;
use sqlx::migrate::{MigrateError, Migrator};

use super::{Backend, Db, Pool, StoreError};
use crate::clock::now_ms;

static QUEUE_SQLITE: Migrator = sqlx::migrate!("migrations/sqlite");
static QUEUE_POSTGRES: Migrator = sqlx::migrate!("migrations/postgres");

/// The migrations of the job ledger's own tables. Its tables were first created by the
/// application's baseline migrations 0001 and 0014, which are frozen (see the ADR), so this set
/// runs only merged with the application's through [`Schema::new`].
pub static QUEUE_MIGRATIONS: MigrationSet =
    MigrationSet::new("queue", &QUEUE_SQLITE, &QUEUE_POSTGRES);

/// One owner's embedded migrations, the same numbered list for each backend.
#[derive(Debug)]
pub struct MigrationSet {
    owner: &'static str,
    sqlite: &'static Migrator,
    postgres: &'static Migrator,
}

impl MigrationSet {
    /// `sqlite` and `postgres` are `sqlx::migrate!` of the owner's two directories.
    pub const fn new(
        owner: &'static str,
        sqlite: &'static Migrator,
        postgres: &'static Migrator,
    ) -> MigrationSet {
        MigrationSet {
            owner,
            sqlite,
            postgres,
        }
    }

    fn for_backend(&self, backend: Backend) -> &'static Migrator {
        match backend {
            Backend::Sqlite => self.sqlite,
            Backend::Postgres => self.postgres,
        }
    }
}

/// Why two migration sets cannot be merged into one history.
#[derive(Debug, thiserror::Error)]
pub enum SchemaError {
    #[error("migration version {version} is used by both {first} and {second}")]
    VersionTaken {
        version: i64,
        first: &'static str,
        second: &'static str,
    },
    #[error(
        "the {owner} migrations differ between SQLite and Postgres: {sqlite:?} against {postgres:?}"
    )]
    BackendsDiffer {
        owner: &'static str,
        sqlite: Vec<(i64, String)>,
        postgres: Vec<(i64, String)>,
    },
}

/// The schema a database must have: the queue's migrations and the application's, merged in
/// version order, for each backend. One value per process, shared by every [`Db`] handle.
#[derive(Debug)]
pub struct Schema {
    sqlite: Migrator,
    postgres: Migrator,
}

impl Schema {
    /// Merges [`QUEUE_MIGRATIONS`] with `application`'s. Refuses a version both sets use (one
    /// `_sqlx_migrations` row per version) and a set whose two backends list different
    /// migrations (the two directories must say the same thing).
    pub fn new(application: &MigrationSet) -> Result<Schema, SchemaError> {
        let sets = [&QUEUE_MIGRATIONS, application];
        for set in sets {
            let sqlite = listing(set.sqlite);
            let postgres = listing(set.postgres);
            if sqlite != postgres {
                return Err(SchemaError::BackendsDiffer {
                    owner: set.owner,
                    sqlite,
                    postgres,
                });
            }
        }
        let mut owners: HashMap<i64, &'static str> = HashMap::new();
        for set in sets {
            for migration in set.sqlite.iter() {
                if let Some(first) = owners.insert(migration.version, set.owner) {
                    return Err(SchemaError::VersionTaken {
                        version: migration.version,
                        first,
                        second: set.owner,
                    });
                }
            }
        }
        let merged = |backend: Backend| {
            let migrations = sets
                .iter()
                .flat_map(|set| set.for_backend(backend).iter().cloned())
                .collect();
            Migrator::with_migrations(migrations)
        };
        Ok(Schema {
            sqlite: merged(Backend::Sqlite),
            postgres: merged(Backend::Postgres),
        })
    }

    fn migrator(&self, backend: Backend) -> &Migrator {
        match backend {
            Backend::Sqlite => &self.sqlite,
            Backend::Postgres => &self.postgres,
        }
    }

    /// Every migration's `(version, description)` in the order they run on `backend`.
    pub fn versions(&self, backend: Backend) -> Vec<(i64, String)> {
        listing(self.migrator(backend))
    }
}

fn listing(migrator: &Migrator) -> Vec<(i64, String)> {
    migrator
        .iter()
        .map(|migration| (migration.version, migration.description.to_string()))
        .collect()
}

/// Why the database cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum MigrationError {
    #[error(
        "applied migration {version} ({description}) does not match this build's copy: the \
         database was migrated by a different build or its migration history was edited. \
         Refusing to start; restore the database or run the build that migrated it"
    )]
    Altered { version: i64, description: String },
    #[error(
        "the database has applied migration {version}, which this build does not know (it was \
         migrated by a newer Zuno). Refusing to start"
    )]
    Unknown { version: i64 },
    #[error(
        "migration {version} was left partially applied (dirty). Refusing to start; restore the \
         database from a backup"
    )]
    Dirty { version: i64 },
    #[error(
        "the database schema was altered outside Zuno's migrations (expected fingerprint \
         {expected}, found {found}). Refusing to start"
    )]
    SchemaAltered { expected: String, found: String },
    #[error("this database handle was opened without a schema to migrate to")]
    NoSchema,
    #[error(transparent)]
    Schema(#[from] SchemaError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("migration failed: {0}")]
    Failed(String),
}

impl From<sqlx::Error> for MigrationError {
    fn from(error: sqlx::Error) -> Self {
        MigrationError::Store(StoreError::Database(error))
    }
}

/// What [`migrate`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigrationReport {
    pub backend: Backend,
    pub applied_now: Vec<i64>,
    pub current_version: i64,
    pub fingerprint: String,
}

/// The verified state of an already migrated database.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchemaCheck {
    pub current_version: i64,
    pub pending: Vec<i64>,
    pub fingerprint: String,
}

/// The merged migrator of the schema `db` was opened for.
fn migrator(db: &Db) -> Result<&Migrator, MigrationError> {
    let schema = db.schema().ok_or(MigrationError::NoSchema)?;
    Ok(schema.migrator(db.backend()))
}

/// The key of the Postgres advisory lock that serializes start-up migrations across processes
/// (`zuno-migrate` in ASCII). sqlx's migrator takes its own lock, but only around applying;
/// verifying, fingerprinting and recording the fingerprint happen outside it.
const MIGRATION_LOCK_KEY: i64 = 0x7a75_6e6f_2d6d_6967;

/// Held while one process verifies, applies and records the schema; released on drop (the
/// Postgres session ends, the directory's descriptor closes), so a crashed process never keeps it.
enum MigrationLock {
    Postgres(sqlx::PgConnection),
    SqliteDirectory(std::fs::File),
    None,
}

impl MigrationLock {
    /// Waits for the start-up lock of `db`'s database. Without it, processes of a fleet starting
    /// together race: one sees another's half-applied schema as an altered fingerprint, and
    /// Postgres's `CREATE TABLE IF NOT EXISTS` is not safe against a concurrent creator.
    async fn acquire(db: &Db) -> Result<MigrationLock, MigrationError> {
        match db.pool() {
            Pool::Postgres(pool) => {
                use sqlx::Connection;
                // A connection of its own, outside the pool: the lock lives as long as it does.
                let mut connection =
                    sqlx::PgConnection::connect_with(&pool.connect_options()).await?;
                sqlx::query("SELECT pg_advisory_lock($1)")
                    .bind(MIGRATION_LOCK_KEY)
                    .execute(&mut connection)
                    .await?;
                Ok(MigrationLock::Postgres(connection))
            }
            Pool::Sqlite(pool) => {
                let options = pool.connect_options();
                let path = options.get_filename();
                if path.as_os_str().is_empty() || path.to_string_lossy().starts_with(':') {
                    // In-memory: no other process can open it.
                    return Ok(MigrationLock::None);
                }
                // The lock is an exclusive `flock` on the database's directory: it creates no
                // file beside the database, and unlike a descriptor on the database file itself
                // closing it cannot drop SQLite's own (POSIX record) locks.
                let directory = match path.parent() {
                    Some(parent) if !parent.as_os_str().is_empty() => parent.to_owned(),
                    _ => std::path::PathBuf::from("."),
                };
                let file = tokio::task::spawn_blocking(move || {
                    let file = std::fs::File::open(&directory)?;
                    file.lock()?;
                    Ok::<_, std::io::Error>(file)
                })
                .await
                .map_err(|error| MigrationError::Failed(error.to_string()))?
                .map_err(|error| {
                    MigrationError::Failed(format!("cannot take the migration lock: {error}"))
                })?;
                Ok(MigrationLock::SqliteDirectory(file))
            }
        }
    }

    async fn release(self) {
        match self {
            MigrationLock::Postgres(connection) => {
                use sqlx::Connection;
                // Closing the session releases the lock; an error only means it is gone already.
                let _ = connection.close().await;
            }
            MigrationLock::SqliteDirectory(directory) => {
                let _ = directory.unlock();
            }
            MigrationLock::None => {}
        }
    }
}

/// Applies pending migrations after verifying what is already applied, holding the start-up
/// lock so that processes starting together migrate one at a time. A database that is already
/// current (nothing pending, its fingerprint recorded for the current version and matching) is
/// verified without the lock: a fleet starting together checks in parallel instead of queueing
/// behind one another's schema fingerprint.
pub(super) async fn migrate(db: &Db) -> Result<MigrationReport, MigrationError> {
    let verified = verify(db).await?;
    let pending = migrator(db)?
        .iter()
        .any(|m| !verified.applied.contains_key(&m.version));
    let current_version = verified.current_version();
    if !pending && let Some(fingerprint) = verified.fingerprint {
        // Another process between applying and recording leaves an older record, which
        // `verify` does not count: that case takes the lock below.
        return Ok(MigrationReport {
            backend: db.backend(),
            applied_now: Vec::new(),
            current_version,
            fingerprint,
        });
    }
    let lock = MigrationLock::acquire(db).await?;
    let report = migrate_locked(db).await;
    lock.release().await;
    report
}

async fn migrate_locked(db: &Db) -> Result<MigrationReport, MigrationError> {
    let verified = verify(db).await?;
    let migrator = migrator(db)?;
    // Postgres serializes concurrent migrators with an advisory lock inside sqlx. SQLite has no
    // such lock: when another process applies the same migration first, ours fails on an object
    // that now exists. Re-verifying then shows whether the database is already where we need it.
    let mut tries = 0;
    loop {
        match crate::on_db!(db, |pool| migrator.run(pool).await) {
            Ok(()) => break,
            Err(error) => {
                tries += 1;
                let settled = db.backend() == Backend::Sqlite
                    && tries < 5
                    && matches!(check(db).await, Ok(ref state) if state.pending.is_empty());
                if settled {
                    break;
                }
                if db.backend() == Backend::Sqlite && tries < 5 {
                    tokio::time::sleep(std::time::Duration::from_millis(50 * tries)).await;
                    continue;
                }
                return Err(map_migrate_error(error));
            }
        }
    }
    let current_version = applied_versions(db)
        .await?
        .keys()
        .copied()
        .max()
        .unwrap_or(0);
    let fingerprint = fingerprint(db).await?;
    record_fingerprint(db, current_version, &fingerprint).await?;
    let applied_now = migrator
        .iter()
        .map(|m| m.version)
        .filter(|v| !verified.applied.contains_key(v))
        .collect();
    Ok(MigrationReport {
        backend: db.backend(),
        applied_now,
        current_version,
        fingerprint,
    })
}

/// Verifies applied migrations and the schema fingerprint without changing anything.
pub(super) async fn check(db: &Db) -> Result<SchemaCheck, MigrationError> {
    let verified = verify(db).await?;
    let pending = migrator(db)?
        .iter()
        .map(|m| m.version)
        .filter(|v| !verified.applied.contains_key(v))
        .collect();
    let current_version = verified.current_version();
    let fingerprint = match verified.fingerprint {
        Some(fingerprint) => fingerprint,
        None => fingerprint(db).await?,
    };
    Ok(SchemaCheck {
        current_version,
        pending,
        fingerprint,
    })
}

struct Verified {
    applied: HashMap<i64, AppliedMigration>,
    /// The schema's fingerprint when a record for the current version exists (and matched it).
    fingerprint: Option<String>,
}

impl Verified {
    fn current_version(&self) -> i64 {
        self.applied.keys().copied().max().unwrap_or(0)
    }
}

struct AppliedMigration {
    checksum: Vec<u8>,
    success: bool,
}

async fn verify(db: &Db) -> Result<Verified, MigrationError> {
    let applied = applied_versions(db).await?;
    let known: HashMap<i64, &sqlx::migrate::Migration> =
        migrator(db)?.iter().map(|m| (m.version, m)).collect();
    let mut versions: Vec<&i64> = applied.keys().collect();
    versions.sort();
    for version in versions {
        let row = &applied[version];
        if !row.success {
            return Err(MigrationError::Dirty { version: *version });
        }
        match known.get(version) {
            None => return Err(MigrationError::Unknown { version: *version }),
            Some(migration) if migration.checksum.as_ref() != row.checksum.as_slice() => {
                return Err(MigrationError::Altered {
                    version: *version,
                    description: migration.description.to_string(),
                });
            }
            Some(_) => {}
        }
    }
    let mut verified = Verified {
        applied,
        fingerprint: None,
    };
    if let Some((recorded_version, expected)) = recorded_fingerprint(db).await? {
        // A crash between applying migrations and recording the fingerprint leaves an older
        // record behind; only a record for the current version is authoritative.
        if recorded_version == verified.current_version() {
            let found = fingerprint(db).await?;
            if found != expected {
                return Err(MigrationError::SchemaAltered { expected, found });
            }
            verified.fingerprint = Some(found);
        }
    }
    Ok(verified)
}

fn map_migrate_error(error: MigrateError) -> MigrationError {
    match error {
        MigrateError::VersionMismatch(version) => MigrationError::Altered {
            version,
            description: String::from("checksum mismatch"),
        },
        MigrateError::VersionMissing(version) => MigrationError::Unknown { version },
        MigrateError::Dirty(version) => MigrationError::Dirty { version },
        MigrateError::Execute(error) => MigrationError::Store(StoreError::Database(error)),
        other => MigrationError::Failed(other.to_string()),
    }
}

async fn applied_versions(db: &Db) -> Result<HashMap<i64, AppliedMigration>, MigrationError> {
    if !table_exists(db, "_sqlx_migrations").await? {
        return Ok(HashMap::new());
    }
    let sql = "SELECT version, checksum, success FROM _sqlx_migrations";
    let rows: Vec<(i64, Vec<u8>, bool)> = crate::on_db!(db, |pool| {
        sqlx::query(sql)
            .fetch_all(pool)
            .await?
            .into_iter()
            .map(|row| Ok((row.try_get(0)?, row.try_get(1)?, row.try_get(2)?)))
            .collect::<Result<Vec<_>, sqlx::Error>>()?
    });
    Ok(rows
        .into_iter()
        .map(|(version, checksum, success)| (version, AppliedMigration { checksum, success }))
        .collect())
}

async fn table_exists(db: &Db, table: &str) -> Result<bool, MigrationError> {
    let found: Option<i64> =
        match db.pool() {
            Pool::Sqlite(pool) => sqlx::query_scalar(
                "SELECT CAST(1 AS BIGINT) FROM sqlite_master WHERE type = 'table' AND name = $1",
            )
            .bind(table)
            .fetch_optional(pool)
            .await?,
            Pool::Postgres(pool) => {
                sqlx::query_scalar(
                    "SELECT 1::BIGINT FROM information_schema.tables \
                 WHERE table_schema = current_schema() AND table_name = $1",
                )
                .bind(table)
                .fetch_optional(pool)
                .await?
            }
        };
    Ok(found.is_some())
}

const META_TABLE_DDL: &str = "CREATE TABLE IF NOT EXISTS zuno_schema (\
    id BIGINT PRIMARY KEY CHECK (id = 1), \
    migration_version BIGINT NOT NULL, \
    fingerprint TEXT NOT NULL, \
    recorded_at BIGINT NOT NULL)";

async fn recorded_fingerprint(db: &Db) -> Result<Option<(i64, String)>, MigrationError> {
    if !table_exists(db, "zuno_schema").await? {
        return Ok(None);
    }
    let sql = "SELECT migration_version, fingerprint FROM zuno_schema WHERE id = 1";
    let row: Option<(i64, String)> =
        crate::on_db!(db, |pool| sqlx::query_as(sql).fetch_optional(pool).await?);
    Ok(row)
}

async fn record_fingerprint(
    db: &Db,
    version: i64,
    fingerprint: &str,
) -> Result<(), MigrationError> {
    crate::on_db!(db, |pool| sqlx::query(META_TABLE_DDL)
        .execute(pool)
        .await
        .map(|done| done.rows_affected()))?;
    let sql = "INSERT INTO zuno_schema (id, migration_version, fingerprint, recorded_at) \
               VALUES (1, $1, $2, $3) \
               ON CONFLICT (id) DO UPDATE SET migration_version = excluded.migration_version, \
               fingerprint = excluded.fingerprint, recorded_at = excluded.recorded_at";
    crate::on_db!(db, |pool| sqlx::query(sql)
        .bind(version)
        .bind(fingerprint)
        .bind(now_ms())
        .execute(pool)
        .await
        .map(|done| done.rows_affected()))?;
    Ok(())
}

/// A digest of every schema object Zuno owns, in a stable order.
pub(super) async fn fingerprint(db: &Db) -> Result<String, MigrationError> {
    let lines: Vec<String> = match db.pool() {
        Pool::Sqlite(pool) => {
            let rows: Vec<(String, String, String, Option<String>)> = sqlx::query_as(
                "SELECT type, name, tbl_name, sql FROM sqlite_master \
                 WHERE name NOT LIKE 'sqlite_%' AND tbl_name NOT IN ('_sqlx_migrations', 'zuno_schema') \
                 ORDER BY type, name",
            )
            .fetch_all(pool)
            .await?;
            rows.into_iter()
                .map(|(kind, name, table, sql)| {
                    format!(
                        "{kind}|{name}|{table}|{}",
                        normalize(sql.as_deref().unwrap_or(""))
                    )
                })
                .collect()
        }
        Pool::Postgres(pool) => {
            let rows: Vec<(String,)> = sqlx::query_as(
                "SELECT line FROM ( \
                   SELECT 'column|' || table_name || '|' || column_name || '|' || data_type || '|' \
                          || is_nullable || '|' || COALESCE(column_default, '') AS line \
                   FROM information_schema.columns WHERE table_schema = current_schema() \
                   UNION ALL \
                   SELECT 'index|' || tablename || '|' || indexname || '|' || indexdef \
                   FROM pg_indexes WHERE schemaname = current_schema() \
                   UNION ALL \
                   SELECT 'constraint|' || c.conrelid::regclass::text || '|' || c.conname || '|' \
                          || pg_get_constraintdef(c.oid) \
                   FROM pg_constraint c JOIN pg_namespace n ON n.oid = c.connamespace \
                   WHERE n.nspname = current_schema() \
                   UNION ALL \
                   SELECT 'trigger|' || t.tgrelid::regclass::text || '|' || t.tgname || '|' \
                          || pg_get_triggerdef(t.oid) \
                   FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid \
                   JOIN pg_namespace n ON n.oid = c.relnamespace \
                   WHERE n.nspname = current_schema() AND NOT t.tgisinternal \
                   UNION ALL \
                   SELECT 'function|' || p.proname || '|' || md5(p.prosrc) \
                   FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace \
                   WHERE n.nspname = current_schema() \
                 ) objects \
                 WHERE line NOT LIKE '%_sqlx_migrations%' AND line NOT LIKE '%zuno_schema%' \
                 ORDER BY line COLLATE \"C\"",
            )
            .fetch_all(pool)
            .await?;
            rows.into_iter().map(|(line,)| line).collect()
        }
    };
    let mut hasher = Sha256::new();
    for line in &lines {
        hasher.update(line.as_bytes());
        hasher.update(b"\n");
    }
    Ok(hex::encode(&hasher.finalize()[..12]))
}

fn normalize(sql: &str) -> String {
    sql.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::{QUEUE_POSTGRES, QUEUE_SQLITE, listing};

    /// The queue's two directories say the same thing: the same numbered migrations, with the
    /// same names.
    #[test]
    fn both_backends_have_the_same_queue_migrations() {
        assert_eq!(listing(&QUEUE_SQLITE), listing(&QUEUE_POSTGRES));
        assert!(!listing(&QUEUE_SQLITE).is_empty());
    }
}
