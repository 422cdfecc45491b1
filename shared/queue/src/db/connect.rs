use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};

use super::{Db, Pool, StoreError};

/// SQLite's `synchronous` pragma. `Full` (the default) survives power loss with WAL; `Normal`
/// survives process crashes but may lose the last commits on power loss, for roughly twice the
/// commit rate (see docs/benchmarks.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SqliteSynchronous {
    #[default]
    Full,
    Normal,
}

/// How to reach the database.
#[derive(Debug, Clone)]
pub struct ConnectOptions {
    /// `sqlite:<path>` or `postgres://…`.
    pub url: String,
    pub sqlite_synchronous: SqliteSynchronous,
    pub max_connections: u32,
    pub busy_timeout: Duration,
    /// How long a caller waits for a pooled connection. A refused connection is retried until
    /// then, so this is also how long a caller waits out a database that is down.
    pub acquire_timeout: Duration,
}

impl ConnectOptions {
    pub fn new(url: impl Into<String>) -> Self {
        ConnectOptions {
            url: url.into(),
            sqlite_synchronous: SqliteSynchronous::Full,
            max_connections: 8,
            busy_timeout: Duration::from_secs(30),
            acquire_timeout: Db::ACQUIRE_TIMEOUT,
        }
    }

    pub fn sqlite_file(path: &std::path::Path) -> Self {
        ConnectOptions::new(format!("sqlite://{}", path.display()))
    }

    pub fn is_postgres(&self) -> bool {
        self.url.starts_with("postgres://") || self.url.starts_with("postgresql://")
    }
}

const IDLE_IN_TRANSACTION_SETTING: &str = "idle_in_transaction_session_timeout";

pub(super) async fn connect(options: &ConnectOptions) -> Result<Db, StoreError> {
    if options.is_postgres() {
        // A session left idle inside a transaction (a frozen or cut-off worker) would hold its
        // row locks, and with them the rescue of its expired lease, until the server notices
        // the dead client; the server ends such sessions itself, whatever its own settings. An
        // operator's own value in the URL (`?options=-c idle_in_transaction_session_timeout=…`)
        // is kept.
        let mut connect = PgConnectOptions::from_str(&options.url)?.application_name("zuno");
        let operator_set = connect
            .get_options()
            .is_some_and(|set| set.contains(IDLE_IN_TRANSACTION_SETTING));
        if !operator_set {
            let idle_timeout = format!("{}ms", Db::IDLE_IN_TRANSACTION_TIMEOUT.as_millis());
            connect = connect.options([(IDLE_IN_TRANSACTION_SETTING, idle_timeout.as_str())]);
        }
        let pool = PgPoolOptions::new()
            .max_connections(options.max_connections)
            .acquire_timeout(options.acquire_timeout)
            .connect_with(connect)
            .await?;
        return Ok(Db::from_pool(Pool::Postgres(pool)));
    }
    if !options.url.starts_with("sqlite:") {
        return Err(StoreError::UnsupportedUrl(redact_url(&options.url)));
    }
    let synchronous = match options.sqlite_synchronous {
        SqliteSynchronous::Full => sqlx::sqlite::SqliteSynchronous::Full,
        SqliteSynchronous::Normal => sqlx::sqlite::SqliteSynchronous::Normal,
    };
    let connect = SqliteConnectOptions::from_str(&options.url)?
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(synchronous)
        .busy_timeout(options.busy_timeout)
        .foreign_keys(true)
        // Checkpoints run in the background (`checkpoint`); this only bounds the WAL.
        .pragma(
            "wal_autocheckpoint",
            super::checkpoint::BACKSTOP_PAGES.to_string(),
        );
    // A local file needs no liveness ping before each use; skipping it saves a round trip to
    // the driver's connection thread on every statement.
    let pool = SqlitePoolOptions::new()
        .max_connections(options.max_connections)
        .test_before_acquire(false)
        .acquire_timeout(options.acquire_timeout)
        .connect_with(connect)
        .await?;
    Ok(Db::from_pool(Pool::Sqlite(pool)))
}

/// Removes a password from a database URL before it appears in a message.
pub fn redact_url(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme_end), Some(at)) if at > scheme_end => {
            let userinfo = &url[scheme_end + 3..at];
            match userinfo.find(':') {
                Some(colon) => format!(
                    "{}{}:***{}",
                    &url[..scheme_end + 3],
                    &userinfo[..colon],
                    &url[at..]
                ),
                None => url.to_owned(),
            }
        }
        _ => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::redact_url;

    #[test]
    fn redacts_password_but_keeps_user_and_host() {
        assert_eq!(
            redact_url("postgres://zuno:s3cret@db:5432/zuno"),
            "postgres://zuno:***@db:5432/zuno"
        );
        assert_eq!(redact_url("sqlite:///tmp/x.db"), "sqlite:///tmp/x.db");
    }
}
