//! One storage interface over two sqlx backends.
//!
//! Every query body is written once and compiled for both drivers through [`on_db!`] and
//! [`on_tx!`]: the SQL text uses `$N` placeholders (which sqlx binds positionally on SQLite too),
//! integers are `i64`, timestamps are Unix milliseconds and JSON is stored as text, so the same
//! statement means the same thing on SQLite and Postgres. Where the dialects differ (claiming with
//! `FOR UPDATE SKIP LOCKED`, notifications) the caller matches on [`Backend`] explicitly.

mod checkpoint;
mod connect;
mod migrate;
mod scratch;

use std::time::Duration;

use sqlx::{PgPool, Postgres, Sqlite, SqlitePool, Transaction};

pub use connect::{ConnectOptions, SqliteSynchronous, redact_url};
pub use migrate::{
    MigrationError, MigrationReport, MigrationSet, QUEUE_MIGRATIONS, Schema, SchemaCheck,
    SchemaError,
};
pub use scratch::{ScratchError, create_scratch_database, drop_scratch_database, scratch_url};

crate::text_enum! {
    /// Which database engine a [`Db`] talks to.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub enum Backend {
        Sqlite = "sqlite",
        Postgres = "postgres",
    }
}

/// A connection pool on one of the two supported backends.
#[derive(Debug, Clone)]
pub enum Pool {
    Sqlite(SqlitePool),
    Postgres(PgPool),
}

/// The database handle every store and the ledger share: a pool plus the in-process wake bus
/// that tells co-located workers about work committed through this handle.
#[derive(Debug, Clone)]
pub struct Db {
    pool: Pool,
    wake: WakeBus,
    /// SQLite admits one writer at a time. Writers of this process queue here instead of
    /// sleeping in SQLite's busy handler (which backs off in milliseconds); other processes
    /// still meet the busy timeout.
    writer: Option<std::sync::Arc<tokio::sync::Mutex<()>>>,
    /// SQLite: moves WAL checkpoints off the committing caller (see [`checkpoint`]).
    checkpoints: Option<checkpoint::Checkpoints>,
    /// What [`Db::migrate`] and [`Db::check_schema`] compare the database with; `None` only for
    /// the crate's own administrative connections (creating a scratch database).
    schema: Option<&'static Schema>,
}

/// The connection of an open write transaction.
pub enum TxConn {
    Sqlite(Transaction<'static, Sqlite>),
    Postgres(Transaction<'static, Postgres>),
}

/// An open write transaction on either backend.
///
/// On SQLite it was opened with `BEGIN IMMEDIATE`, so it holds the database's write lock from its
/// first statement: a read followed by a write inside it can never fail with a stale snapshot.
/// Wake-ups requested inside it are delivered only after a successful commit, so a woken worker
/// always finds the committed job.
pub struct Tx {
    conn: TxConn,
    wake: WakeBus,
    wake_on_commit: bool,
    checkpoints: Option<checkpoint::Checkpoints>,
    // Dropped after `conn`, so the next local writer starts only once this one has ended.
    _writer: Option<tokio::sync::OwnedMutexGuard<()>>,
}

/// Errors from the storage layer.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    #[error("stored value is corrupt: {0}")]
    Corrupt(String),
    #[error("unsupported database URL `{0}`: expected sqlite:… or postgres://…")]
    UnsupportedUrl(String),
}

impl StoreError {
    /// True when the error is a broken or refused connection rather than a statement failure,
    /// so callers (workers) retry instead of recording a job failure.
    pub fn is_connection(&self) -> bool {
        matches!(self, StoreError::Database(error) if is_connection_error(error))
    }

    /// True when the statement lost a race with another transaction and may simply be run
    /// again: a deadlock or serialization failure (SQLSTATE 40P01, 40001) or a busy SQLite
    /// database. Not a fault of the job the statement was about.
    pub fn is_contention(&self) -> bool {
        matches!(self, StoreError::Database(sqlx::Error::Database(db))
            if db.code().is_some_and(|code| matches!(&*code, "40P01" | "40001" | "5" | "517" | "6")))
    }

    /// True when a unique or check constraint rejected the statement.
    pub fn constraint_violation(&self) -> Option<String> {
        match self {
            StoreError::Database(sqlx::Error::Database(db)) => {
                use sqlx::error::ErrorKind;
                match db.kind() {
                    ErrorKind::UniqueViolation
                    | ErrorKind::CheckViolation
                    | ErrorKind::ForeignKeyViolation
                    | ErrorKind::NotNullViolation => Some(db.message().to_owned()),
                    _ => None,
                }
            }
            _ => None,
        }
    }
}

/// True when `error` says the database cannot be reached rather than that a statement failed:
/// the pool timed out or was closed, the socket broke, or the server ended or refused the
/// session (SQLSTATE class 08; 57P01–57P03: terminated by an administrator, crash recovery,
/// starting up or shutting down; 25P03: ended for idling inside a transaction). Workers retry these
/// instead of recording a job failure, and the API answers 503 with `Retry-After` instead of 500.
pub fn is_connection_error(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Io(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed
        | sqlx::Error::Tls(_) => true,
        sqlx::Error::Database(db) => db.code().is_some_and(|code| {
            code.starts_with("08") || matches!(&*code, "57P01" | "57P02" | "57P03" | "25P03")
        }),
        _ => false,
    }
}

/// One value bound to a statement run by [`execute_in`]: the column types the schema uses on
/// both backends (text, 64-bit integers, doubles, booleans, blobs; text and integers nullable).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Arg<'a> {
    Text(&'a str),
    OptText(Option<&'a str>),
    Int(i64),
    OptInt(Option<i64>),
    Real(f64),
    Bool(bool),
    Blob(&'a [u8]),
}

impl<'a> From<&'a str> for Arg<'a> {
    fn from(value: &'a str) -> Self {
        Arg::Text(value)
    }
}

impl<'a> From<&'a String> for Arg<'a> {
    fn from(value: &'a String) -> Self {
        Arg::Text(value)
    }
}

impl<'a> From<Option<&'a str>> for Arg<'a> {
    fn from(value: Option<&'a str>) -> Self {
        Arg::OptText(value)
    }
}

impl<'a> From<&'a Option<String>> for Arg<'a> {
    fn from(value: &'a Option<String>) -> Self {
        Arg::OptText(value.as_deref())
    }
}

impl<'a> From<&'a [u8]> for Arg<'a> {
    fn from(value: &'a [u8]) -> Self {
        Arg::Blob(value)
    }
}

impl<'a> From<&'a Vec<u8>> for Arg<'a> {
    fn from(value: &'a Vec<u8>) -> Self {
        Arg::Blob(value)
    }
}

impl From<&i64> for Arg<'_> {
    fn from(value: &i64) -> Self {
        Arg::Int(*value)
    }
}

impl From<f64> for Arg<'_> {
    fn from(value: f64) -> Self {
        Arg::Real(value)
    }
}

impl From<i64> for Arg<'_> {
    fn from(value: i64) -> Self {
        Arg::Int(value)
    }
}

impl From<Option<i64>> for Arg<'_> {
    fn from(value: Option<i64>) -> Self {
        Arg::OptInt(value)
    }
}

impl From<bool> for Arg<'_> {
    fn from(value: bool) -> Self {
        Arg::Bool(value)
    }
}

macro_rules! bind_args {
    ($query:expr, $args:expr) => {{
        let mut query = $query;
        for arg in $args {
            query = match *arg {
                Arg::Text(value) => query.bind(value),
                Arg::OptText(value) => query.bind(value),
                Arg::Int(value) => query.bind(value),
                Arg::OptInt(value) => query.bind(value),
                Arg::Real(value) => query.bind(value),
                Arg::Bool(value) => query.bind(value),
                Arg::Blob(value) => query.bind(value),
            };
        }
        query
    }};
}

/// Runs one write statement inside `tx` with `args` bound to `$1`, `$2`, … in order and
/// returns how many rows it changed: the common case of a store's `UPDATE … WHERE id = $1`,
/// written once instead of as one bind chain per statement. `sql` is a static string or an
/// `AssertSqlSafe` of text built from constants: never from stored or untrusted text.
pub async fn execute_in(
    tx: &mut Tx,
    sql: impl sqlx::SqlSafeStr,
    args: &[Arg<'_>],
) -> Result<u64, StoreError> {
    let changed = match tx.conn_mut() {
        TxConn::Sqlite(conn) => bind_args!(sqlx::query(sql), args)
            .execute(&mut **conn)
            .await?
            .rows_affected(),
        TxConn::Postgres(conn) => bind_args!(sqlx::query(sql), args)
            .execute(&mut **conn)
            .await?
            .rows_affected(),
    };
    Ok(changed)
}

/// Runs `$body` with `$pool` bound to the concrete pool of the [`Db`] `$db`.
#[macro_export]
macro_rules! on_db {
    ($db:expr, |$pool:ident| $body:expr) => {
        match $db.pool() {
            $crate::db::Pool::Sqlite($pool) => $body,
            $crate::db::Pool::Postgres($pool) => $body,
        }
    };
}

/// Runs `$body` with `$conn` bound to the concrete connection of the [`Tx`] `$tx`.
#[macro_export]
macro_rules! on_tx {
    ($tx:expr, |$conn:ident| $body:expr) => {
        match $tx.conn_mut() {
            $crate::db::TxConn::Sqlite(tx) => {
                let $conn = &mut **tx;
                $body
            }
            $crate::db::TxConn::Postgres(tx) => {
                let $conn = &mut **tx;
                $body
            }
        }
    };
}

impl Db {
    /// Connects without running migrations; `schema` is what [`Db::migrate`] and
    /// [`Db::check_schema`] will compare the database with. Use [`Db::open`] for the normal
    /// start-up path.
    pub async fn connect(
        options: &ConnectOptions,
        schema: &'static Schema,
    ) -> Result<Db, StoreError> {
        let mut db = connect::connect(options).await?;
        db.schema = Some(schema);
        Ok(db)
    }

    /// Connects, applies `schema`'s pending migrations (the queue's and the application's, in
    /// version order) and refuses to continue when the applied history or the schema itself was
    /// altered.
    pub async fn open(
        options: &ConnectOptions,
        schema: &'static Schema,
    ) -> Result<Db, MigrationError> {
        let db = Db::connect(options, schema).await?;
        db.migrate().await?;
        Ok(db)
    }

    /// The schema this handle was opened for.
    pub fn schema(&self) -> Option<&'static Schema> {
        self.schema
    }

    pub(crate) fn from_pool(pool: Pool) -> Db {
        let writer = matches!(pool, Pool::Sqlite(_))
            .then(|| std::sync::Arc::new(tokio::sync::Mutex::new(())));
        let checkpoints = match &pool {
            Pool::Sqlite(sqlite) => Some(checkpoint::Checkpoints::new(sqlite.clone())),
            Pool::Postgres(_) => None,
        };
        Db {
            pool,
            wake: WakeBus::new(),
            writer,
            checkpoints,
            schema: None,
        }
    }

    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// The in-process wake bus shared by every clone of this handle.
    pub fn wake_bus(&self) -> &WakeBus {
        &self.wake
    }

    pub fn backend(&self) -> Backend {
        match self.pool {
            Pool::Sqlite(_) => Backend::Sqlite,
            Pool::Postgres(_) => Backend::Postgres,
        }
    }

    /// Opens a write transaction (`BEGIN IMMEDIATE` on SQLite).
    pub async fn begin(&self) -> Result<Tx, StoreError> {
        let writer = match &self.writer {
            Some(lock) => Some(lock.clone().lock_owned().await),
            None => None,
        };
        let conn = match &self.pool {
            Pool::Sqlite(pool) => TxConn::Sqlite(pool.begin_with("BEGIN IMMEDIATE").await?),
            Pool::Postgres(pool) => TxConn::Postgres(pool.begin().await?),
        };
        Ok(Tx {
            conn,
            wake: self.wake.clone(),
            wake_on_commit: false,
            checkpoints: self.checkpoints.clone(),
            _writer: writer,
        })
    }

    /// Holds this process's SQLite write slot for a single autocommit write statement (a no-op
    /// on Postgres). See [`Db::begin`] for why local writers queue.
    pub async fn write_slot(&self) -> Option<tokio::sync::OwnedMutexGuard<()>> {
        match &self.writer {
            Some(lock) => Some(lock.clone().lock_owned().await),
            None => None,
        }
    }

    /// Opens a transaction for consistent reads only: it takes no write lock, so it never
    /// waits for writers. Writing through it is a bug (on SQLite it could fail with BUSY).
    pub async fn begin_read(&self) -> Result<Tx, StoreError> {
        let conn = match &self.pool {
            Pool::Sqlite(pool) => TxConn::Sqlite(pool.begin().await?),
            Pool::Postgres(pool) => TxConn::Postgres(pool.begin().await?),
        };
        Ok(Tx {
            conn,
            wake: self.wake.clone(),
            wake_on_commit: false,
            checkpoints: None,
            _writer: None,
        })
    }

    /// Applies pending migrations and verifies the schema (see [`migrate`]).
    pub async fn migrate(&self) -> Result<MigrationReport, MigrationError> {
        migrate::migrate(self).await
    }

    /// Checks applied migrations and schema fingerprint without applying anything.
    pub async fn check_schema(&self) -> Result<SchemaCheck, MigrationError> {
        migrate::check(self).await
    }

    /// A cheap liveness probe used by `/readyz` and worker reconnect loops.
    pub async fn ping(&self) -> Result<(), StoreError> {
        on_db!(self, |pool| sqlx::query("SELECT 1")
            .execute(pool)
            .await
            .map(|done| done.rows_affected()))?;
        Ok(())
    }

    pub async fn close(&self) {
        on_db!(self, |pool| pool.close().await)
    }

    /// The Postgres pool, when this is a Postgres database (used for LISTEN/NOTIFY).
    pub fn as_postgres(&self) -> Option<&PgPool> {
        match &self.pool {
            Pool::Postgres(pool) => Some(pool),
            Pool::Sqlite(_) => None,
        }
    }

    /// The SQLite pool, when this is a SQLite database (used to watch other processes' commits).
    pub fn as_sqlite(&self) -> Option<&SqlitePool> {
        match &self.pool {
            Pool::Sqlite(pool) => Some(pool),
            Pool::Postgres(_) => None,
        }
    }

    /// Pool acquire timeout of both backends: workers wait this long for a connection (their
    /// runner retries and deadlines bound each ledger call on top).
    pub const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(30);
    /// The API's acquire timeout: a request waits at most this long for a connection, then
    /// answers 503 with `Retry-After`, well inside a hook's or an HTTP client's own timeout
    /// (with the workers' 30 s a refused database kept every request hanging for 30 s).
    pub const REQUEST_ACQUIRE_TIMEOUT: Duration = Duration::from_secs(5);
    /// How long a Postgres session may sit idle inside a transaction before the server ends
    /// it (set on every pooled connection). A live process keeps its transactions busy (model
    /// calls happen outside them), so only a frozen or cut-off process reaches it; it is well
    /// below the 60 s default lease, so such a process's locks are gone before its lease can
    /// be rescued.
    pub const IDLE_IN_TRANSACTION_TIMEOUT: Duration = Duration::from_secs(15);
}

impl Tx {
    pub fn backend(&self) -> Backend {
        match self.conn {
            TxConn::Sqlite(_) => Backend::Sqlite,
            TxConn::Postgres(_) => Backend::Postgres,
        }
    }

    pub fn conn_mut(&mut self) -> &mut TxConn {
        &mut self.conn
    }

    /// Asks for co-located workers to be woken once this transaction commits.
    pub fn wake_after_commit(&mut self) {
        self.wake_on_commit = true;
    }

    pub async fn commit(self) -> Result<(), StoreError> {
        match self.conn {
            TxConn::Sqlite(tx) => tx.commit().await?,
            TxConn::Postgres(tx) => tx.commit().await?,
        }
        if let Some(checkpoints) = &self.checkpoints {
            checkpoints.committed();
        }
        if self.wake_on_commit {
            self.wake.wake();
        }
        Ok(())
    }

    pub async fn rollback(self) -> Result<(), StoreError> {
        match self.conn {
            TxConn::Sqlite(tx) => tx.rollback().await?,
            TxConn::Postgres(tx) => tx.rollback().await?,
        }
        Ok(())
    }
}

/// Coalescing in-process wake-ups: a generation counter that every waiter observes.
///
/// A wake sent while nobody waits is not lost (the waiter sees the new generation on its next
/// wait), and any number of wakes between two waits collapse into one.
#[derive(Debug, Clone)]
pub struct WakeBus {
    sender: std::sync::Arc<tokio::sync::watch::Sender<u64>>,
}

impl WakeBus {
    pub fn new() -> Self {
        let (sender, _) = tokio::sync::watch::channel(0);
        WakeBus {
            sender: std::sync::Arc::new(sender),
        }
    }

    pub fn wake(&self) {
        self.sender
            .send_modify(|generation| *generation = generation.wrapping_add(1));
    }

    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.sender.subscribe()
    }
}

impl Default for WakeBus {
    fn default() -> Self {
        WakeBus::new()
    }
}
