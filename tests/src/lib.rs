//! Test support shared by the integration suites: a fresh database per test on SQLite (a new
//! file) or Postgres (a new database, dropped afterwards), a macro that runs one test body on
//! both, and helpers for the workspace's binaries.

pub mod fake_embeddings;
pub mod fake_provider;
pub mod label_oracle;
pub mod otlp_receiver;
pub mod pg_cluster;
pub mod pnpm;
pub mod processes;
pub mod rng;
pub mod server;
pub mod tcp_proxy;

use std::sync::Arc;

use zuno_shared::clock::{ManualClock, SharedClock};
use zuno_shared::db::{
    Backend, ConnectOptions, Db, create_scratch_database, drop_scratch_database,
};
use zuno_shared::ledger::Ledger;

/// The Postgres server tests create their databases on: `ZUNO_TEST_DATABASE_URL`, else a
/// `postgres://` `DATABASE_URL` (`scripts/test` starts a private cluster and sets the former),
/// else a container of the locally built Postgres image, started once per test process on first
/// use (see [`postgres_container`]).
pub fn postgres_admin_url() -> String {
    configured_postgres_url().unwrap_or_else(|| postgres_container::admin_url().to_owned())
}

/// A Postgres server named by the environment, if any.
pub fn configured_postgres_url() -> Option<String> {
    ["ZUNO_TEST_DATABASE_URL", "DATABASE_URL"]
        .into_iter()
        .filter_map(|name| std::env::var(name).ok())
        .find(|url| url.starts_with("postgres"))
}

/// Postgres for the tests in a container, when the environment names no server.
///
/// One container per test process, started lazily by the first Postgres test and shared by the
/// rest (each still creates and drops its own database in it). nextest runs every test in a
/// process of its own, so there it is one container per Postgres test: slower than a shared
/// server, which is why `scripts/test` starts one and sets `ZUNO_TEST_DATABASE_URL`.
pub mod postgres_container {
    use std::process::{Command, Stdio};
    use std::sync::OnceLock;
    use std::time::Duration;

    use testcontainers::core::{IntoContainerPort, WaitFor};
    use testcontainers::runners::AsyncRunner;
    use testcontainers::{GenericImage, ImageExt};

    /// The image `scripts/images` builds (from Debian packages; nothing is pulled here).
    pub const DEFAULT_IMAGE: &str = "zuno/postgres:15";

    /// `ZUNO_TEST_POSTGRES_IMAGE`, else [`DEFAULT_IMAGE`]. Any image that follows the official
    /// `postgres` image's conventions (`POSTGRES_HOST_AUTH_METHOD`, `postgres -c …`) works,
    /// `postgres:15` included where it can be pulled.
    pub fn image() -> String {
        std::env::var("ZUNO_TEST_POSTGRES_IMAGE")
            .ok()
            .filter(|image| !image.is_empty())
            .unwrap_or_else(|| DEFAULT_IMAGE.to_owned())
    }

    struct Started {
        admin_url: String,
        /// The reaper's stdin: closed by the kernel when this process exits, however it exits.
        _reaper: Option<std::process::ChildStdin>,
    }

    static STARTED: OnceLock<Result<Started, String>> = OnceLock::new();

    /// The admin URL of this process's Postgres container, starting it on first call. Panics
    /// with what to do when no container can be started (no Docker, or no image).
    pub fn admin_url() -> &'static str {
        match STARTED.get_or_init(start) {
            Ok(started) => &started.admin_url,
            Err(error) => panic!(
                "Postgres tests need a server. None is configured (ZUNO_TEST_DATABASE_URL or a \
                 postgres:// DATABASE_URL) and no Postgres container could be started from image \
                 `{}`: {error}.\nEither run `scripts/test` (it starts a private cluster), set \
                 ZUNO_TEST_DATABASE_URL=postgres://user@host:port/postgres, or make Docker \
                 available and build the image with `scripts/images`.",
                image()
            ),
        }
    }

    fn start() -> Result<Started, String> {
        let image = image();
        let (name, tag) = image.rsplit_once(':').unwrap_or((image.as_str(), "latest"));
        let request = GenericImage::new(name, tag)
            .with_exposed_port(5432.tcp())
            // The server is ready only after initialization; the image logs this line once.
            .with_wait_for(WaitFor::message_on_stderr(
                "database system is ready to accept connections",
            ))
            .with_env_var("POSTGRES_HOST_AUTH_METHOD", "trust")
            .with_label("zuno.test", "postgres")
            .with_label("zuno.test.pid", std::process::id().to_string())
            // Test data need not survive a crash; every test opens pools of its own.
            .with_cmd([
                "postgres",
                "-c",
                "fsync=off",
                "-c",
                "synchronous_commit=off",
                "-c",
                "full_page_writes=off",
                "-c",
                "max_connections=300",
            ])
            .with_startup_timeout(Duration::from_secs(120));
        // Start on a thread with a runtime of its own: callers may be on any runtime (each
        // #[tokio::test] has one that ends with the test), or on none.
        let started = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            runtime.block_on(async move {
                let container = request.start().await.map_err(|e| e.to_string())?;
                let port = container
                    .get_host_port_ipv4(5432.tcp())
                    .await
                    .map_err(|e| e.to_string())?;
                let id = container.id().to_owned();
                // The container must outlive this runtime and every test of the process. Its
                // Drop would remove it through this runtime's client, so it is not dropped:
                // the reaper below removes it when the process exits.
                std::mem::forget(container);
                Ok::<_, String>((id, port))
            })
        })
        .join()
        .map_err(|_| String::from("the container start panicked"))?;
        let (id, port) = started?;
        eprintln!(
            "test: Postgres in container {} ({image}) on port {port}",
            &id[..12.min(id.len())]
        );
        Ok(Started {
            admin_url: format!("postgres://postgres@127.0.0.1:{port}/postgres"),
            _reaper: spawn_reaper(&id),
        })
    }

    /// Removes the container once this process is gone, even when it is killed: a detached
    /// shell waits for EOF on a pipe only this process holds open. (testcontainers' own reaper
    /// container would need an image pulled from a registry.)
    fn spawn_reaper(id: &str) -> Option<std::process::ChildStdin> {
        let spawned = Command::new("setsid")
            .args([
                "sh",
                "-c",
                "cat >/dev/null; docker rm -f -v \"$0\" >/dev/null 2>&1",
                id,
            ])
            .stdin(Stdio::piped())
            // Nothing of the test's output stays open in the reaper (nextest waits for it).
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
        match spawned {
            Ok(mut child) => child.stdin.take(),
            Err(error) => {
                eprintln!(
                    "test: cannot start a reaper for container {id} ({error}); remove it with \
                     `docker rm -f {id}`"
                );
                None
            }
        }
    }
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
        TestDb::sqlite_with(true).await
    }

    /// A database of `backend` with no schema at all (connected, not migrated): for claims
    /// about what start-up does to a fresh database.
    pub async fn unmigrated(backend: Backend) -> TestDb {
        match backend {
            Backend::Sqlite => TestDb::sqlite_with(false).await,
            Backend::Postgres => TestDb::postgres_with(false).await,
        }
    }

    async fn sqlite_with(migrate: bool) -> TestDb {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("zuno.db");
        let options = ConnectOptions::sqlite_file(&path);
        let db = if migrate {
            Db::open(&options, zuno_shared::migrations::schema())
                .await
                .expect("open sqlite")
        } else {
            Db::connect(&options, zuno_shared::migrations::schema())
                .await
                .expect("connect sqlite")
        };
        TestDb {
            db,
            url: options.url,
            backend: Backend::Sqlite,
            cleanup: Cleanup::Sqlite(dir),
        }
    }

    pub async fn postgres() -> TestDb {
        TestDb::postgres_with(true).await
    }

    async fn postgres_with(migrate: bool) -> TestDb {
        let admin_url = postgres_admin_url();
        let name = format!("zuno_test_{}", uuid::Uuid::new_v4().simple());
        let url = create_scratch_database(&admin_url, &name)
            .await
            .expect("create a test database on the Postgres test server");
        let options = ConnectOptions::new(url.clone());
        let db = if migrate {
            Db::open(&options, zuno_shared::migrations::schema())
                .await
                .expect("open postgres test database")
        } else {
            Db::connect(&options, zuno_shared::migrations::schema())
                .await
                .expect("connect to the postgres test database")
        };
        TestDb {
            db,
            url,
            backend: Backend::Postgres,
            cleanup: Cleanup::Postgres { admin_url, name },
        }
    }

    /// Another handle to the same database (a separate pool, like another process would have).
    pub async fn reopen(&self) -> Db {
        Db::open(
            &ConnectOptions::new(self.url.clone()),
            zuno_shared::migrations::schema(),
        )
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
                    drop_scratch_database(&admin_url, &name).await?;
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

/// Waits until a session of `db`'s Postgres database waits on a lock (`who`, for the failure
/// message), failing the test after 20 s: how a test knows that a second writer has reached the
/// first one's uncommitted row before it lets the first commit.
pub async fn until_a_session_waits_on_a_lock(db: &zuno_shared::db::Db, who: &str) {
    eventually(
        &format!("{who} waits on a lock"),
        std::time::Duration::from_secs(20),
        || async {
            let waiting: i64 = zuno_shared::on_db!(db, |pool| sqlx::query_scalar(
                "SELECT COUNT(*) FROM pg_stat_activity \
                 WHERE datname = current_database() AND wait_event_type = 'Lock'"
            )
            .fetch_one(pool)
            .await)
            .unwrap();
            (waiting > 0).then_some(())
        },
    )
    .await
}

/// Serves `app` on `listener` in a background task until `shutdown` is cancelled; `what` names
/// the server in the panic if serving fails.
pub fn serve_until_cancelled(
    listener: tokio::net::TcpListener,
    app: axum::Router,
    shutdown: tokio_util::sync::CancellationToken,
    what: &'static str,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async move { shutdown.cancelled().await })
            .await
            .unwrap_or_else(|error| panic!("{what} serve: {error}"));
    })
}

/// `value` percent-encoded for a URL query: everything but RFC 3986's unreserved characters.
pub fn percent_encode(value: &str) -> String {
    value
        .bytes()
        .map(|byte| match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                char::from(byte).to_string()
            }
            _ => format!("%{byte:02X}"),
        })
        .collect()
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
