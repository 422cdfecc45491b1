//! Test support shared by the integration suites: a fresh database per test on SQLite (a new
//! file) or Postgres (a new database, dropped afterwards), a macro that runs one test body on
//! both, and helpers for the workspace's binaries.

pub mod fake_provider;
pub mod processes;
pub mod server;

use std::sync::Arc;

use zuno_shared::clock::{ManualClock, SharedClock};
use zuno_shared::db::{Backend, ConnectOptions, Db};
use zuno_shared::ledger::Ledger;

/// The Postgres server tests create their databases on: `ZUNO_TEST_DATABASE_URL`, else
/// `DATABASE_URL`. `scripts/test` starts a private cluster and sets the former.
pub fn postgres_admin_url() -> String {
    std::env::var("ZUNO_TEST_DATABASE_URL")
        .or_else(|_| std::env::var("DATABASE_URL"))
        .ok()
        .filter(|url| url.starts_with("postgres"))
        .unwrap_or_else(|| {
            panic!(
                "Postgres tests need a server: run `scripts/test` (it starts one), or set \
                 ZUNO_TEST_DATABASE_URL=postgres://user@host:port/postgres"
            )
        })
}

/// A fresh, migrated database that lives as long as this value.
pub struct TestDb {
    pub db: Db,
    pub url: String,
    pub backend: Backend,
    cleanup: Cleanup,
}

enum Cleanup {
    Sqlite(#[allow(dead_code)] tempfile::TempDir),
    Postgres { admin_url: String, name: String },
}

impl TestDb {
    pub async fn new(backend: Backend) -> TestDb {
        match backend {
            Backend::Sqlite => TestDb::sqlite().await,
            Backend::Postgres => TestDb::postgres().await,
        }
    }

    pub async fn sqlite() -> TestDb {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("zuno.db");
        let options = ConnectOptions::sqlite_file(&path);
        let db = Db::open(&options).await.expect("open sqlite");
        TestDb {
            db,
            url: options.url,
            backend: Backend::Sqlite,
            cleanup: Cleanup::Sqlite(dir),
        }
    }

    pub async fn postgres() -> TestDb {
        let admin_url = postgres_admin_url();
        let name = format!("zuno_test_{}", uuid::Uuid::new_v4().simple());
        let admin = Db::connect(&ConnectOptions::new(admin_url.clone()))
            .await
            .expect("connect to the Postgres test server");
        let sql = format!("CREATE DATABASE {name}");
        sqlx::query(sqlx::AssertSqlSafe(sql.as_str()))
            .execute(admin.as_postgres().expect("postgres"))
            .await
            .expect("create test database");
        admin.close().await;
        let url = database_url(&admin_url, &name);
        let db = Db::open(&ConnectOptions::new(url.clone()))
            .await
            .expect("open postgres test database");
        TestDb {
            db,
            url,
            backend: Backend::Postgres,
            cleanup: Cleanup::Postgres { admin_url, name },
        }
    }

    /// Another handle to the same database (a separate pool, like another process would have).
    pub async fn reopen(&self) -> Db {
        Db::open(&ConnectOptions::new(self.url.clone()))
            .await
            .expect("reopen")
    }

    pub fn ledger(&self) -> Ledger {
        Ledger::new(self.db.clone(), zuno_shared::clock::system_clock())
    }

    /// A ledger on a manual clock starting at a fixed instant.
    pub fn manual_ledger(&self) -> (Ledger, ManualClock) {
        let clock = ManualClock::starting_at(1_800_000_000_000);
        let shared: SharedClock = Arc::new(clock.clone());
        (Ledger::new(self.db.clone(), shared), clock)
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        if let Cleanup::Postgres { admin_url, name } = &self.cleanup {
            let admin_url = admin_url.clone();
            let name = name.clone();
            // Drop runs outside async context guarantees; use a private runtime on a thread.
            let dropped = std::thread::spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()?;
                runtime.block_on(async move {
                    let admin = Db::connect(&ConnectOptions::new(admin_url)).await?;
                    let sql = format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)");
                    sqlx::query(sqlx::AssertSqlSafe(sql.as_str()))
                        .execute(admin.as_postgres().expect("postgres"))
                        .await?;
                    admin.close().await;
                    anyhow::Ok(())
                })
            })
            .join();
            if let Ok(Err(error)) = dropped {
                eprintln!("could not drop test database: {error}");
            }
        }
    }
}

/// Replaces the database name in a Postgres URL.
pub fn database_url(admin_url: &str, database: &str) -> String {
    let (base, query) = match admin_url.split_once('?') {
        Some((base, query)) => (base, Some(query)),
        None => (admin_url, None),
    };
    let authority_end = base.find("://").map_or(0, |i| i + 3);
    let path_start = base[authority_end..].find('/').map(|i| authority_end + i);
    let mut url = match path_start {
        Some(start) => format!("{}/{database}", &base[..start]),
        None => format!("{base}/{database}"),
    };
    if let Some(query) = query {
        url.push('?');
        url.push_str(query);
    }
    url
}

/// Runs each listed async test body (`async fn name(db: TestDb)`) once on SQLite and once on
/// Postgres, as `sqlite::name` and `postgres::name`.
#[macro_export]
macro_rules! on_both_backends {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    super::$name($crate::TestDb::sqlite().await).await
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    super::$name($crate::TestDb::postgres().await).await
                }
            )*
        }
    };
}

/// Polls `check` until it returns `Some`, failing the test after `timeout`. For waiting on
/// another process's progress: it asserts an observable condition, never a duration.
pub async fn eventually<T, F, Fut>(what: &str, timeout: std::time::Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        if tokio::time::Instant::now() > deadline {
            panic!("timed out after {timeout:?} waiting for: {what}");
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::database_url;

    #[test]
    fn database_url_swaps_only_the_name() {
        assert_eq!(
            database_url("postgres://u@127.0.0.1:5433/postgres", "t1"),
            "postgres://u@127.0.0.1:5433/t1"
        );
        assert_eq!(
            database_url("postgres://u:p@h/postgres?sslmode=disable", "t1"),
            "postgres://u:p@h/t1?sslmode=disable"
        );
        assert_eq!(
            database_url("postgres://h:5432", "t1"),
            "postgres://h:5432/t1"
        );
    }
}
