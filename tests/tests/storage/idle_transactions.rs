//! On Postgres every pooled connection carries `idle_in_transaction_session_timeout`, whatever
//! the server's own settings: a transaction left idle (a frozen or cut-off process) is ended by
//! the server, and the row locks it held are released for the rest of the fleet.

use std::time::Duration;

use zuno_shared::db::{ConnectOptions, Db};
use zuno_tests::TestDb;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_transaction_is_ended_by_the_server_and_its_row_locks_released() {
    let db = TestDb::postgres().await;
    let pool = db.db.as_postgres().unwrap();
    let setting: String = sqlx::query_scalar("SHOW idle_in_transaction_session_timeout")
        .fetch_one(pool)
        .await
        .unwrap();
    assert_eq!(
        setting,
        format!("{}s", Db::IDLE_IN_TRANSACTION_TIMEOUT.as_secs())
    );
    sqlx::query("CREATE TABLE idle_probe (id BIGINT PRIMARY KEY)")
        .execute(pool)
        .await
        .unwrap();
    sqlx::query("INSERT INTO idle_probe (id) VALUES (1)")
        .execute(pool)
        .await
        .unwrap();
    let mut frozen = pool.begin().await.unwrap();
    sqlx::query("SELECT id FROM idle_probe WHERE id = 1 FOR UPDATE")
        .execute(&mut *frozen)
        .await
        .unwrap();

    // Another process takes the row as soon as the server has ended the idle session.
    let other = Db::connect(
        &ConnectOptions::new(db.url.clone()),
        zuno_shared::migrations::schema(),
    )
    .await
    .unwrap();
    let other = other.as_postgres().unwrap();
    zuno_tests::eventually(
        "the idle transaction's row lock is released",
        Db::IDLE_IN_TRANSACTION_TIMEOUT * 4,
        || async {
            let mut tx = other.begin().await.ok()?;
            let taken = sqlx::query("SELECT id FROM idle_probe WHERE id = 1 FOR UPDATE NOWAIT")
                .execute(&mut *tx)
                .await
                .is_ok();
            let _ = tx.rollback().await;
            if !taken {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            taken.then_some(())
        },
    )
    .await;
    let ended = sqlx::query("SELECT 1")
        .execute(&mut *frozen)
        .await
        .expect_err("the server ended the idle session");
    // The process that wakes up finds its connection gone, which callers retry (not a job
    // failure, not a 500).
    assert!(zuno_shared::db::is_connection_error(&ended), "{ended:?}");
}

/// A session the server ends (`pg_terminate_backend`: an administrator, a failover) is a
/// connection error, whichever way the driver reports it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_ended_by_the_server_is_a_connection_error() {
    let db = TestDb::postgres().await;
    let pool = db.db.as_postgres().unwrap();
    let mut victim = pool.begin().await.unwrap();
    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut *victim)
        .await
        .unwrap();
    let other = Db::connect(
        &ConnectOptions::new(db.url.clone()),
        zuno_shared::migrations::schema(),
    )
    .await
    .unwrap();
    let ended: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
        .bind(pid)
        .fetch_one(other.as_postgres().unwrap())
        .await
        .unwrap();
    assert!(ended);
    let error = sqlx::query("SELECT 1")
        .execute(&mut *victim)
        .await
        .expect_err("the session was ended");
    eprintln!("{error:?}");
    assert!(zuno_shared::db::is_connection_error(&error), "{error:?}");
}

/// An operator's own value in the database URL is kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_transaction_timeout_in_the_url_is_kept() {
    let db = TestDb::postgres().await;
    let separator = if db.url.contains('?') { '&' } else { '?' };
    let url = format!(
        "{}{separator}options=-c%20idle_in_transaction_session_timeout%3D5s",
        db.url
    );
    let configured = Db::connect(&ConnectOptions::new(url), zuno_shared::migrations::schema())
        .await
        .unwrap();
    let setting: String = sqlx::query_scalar("SHOW idle_in_transaction_session_timeout")
        .fetch_one(configured.as_postgres().unwrap())
        .await
        .unwrap();
    assert_eq!(setting, "5s");
}
