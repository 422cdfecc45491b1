//! A database outage is 503 with `Retry-After` as problem JSON, never 500, and a client that
//! retries after the advertised wait gets its turn stored once the database is back.
//!
//! The API reaches its Postgres database through a TCP proxy the test cuts: open connections
//! close and new ones are dropped at once, as when the server goes away.

use std::time::Duration;

use serde_json::json;
use zuno_shared::config::Config;
use zuno_shared::db::{ConnectOptions, Db};
use zuno_tests::TestDb;
use zuno_tests::server::{TestServer, decode};
use zuno_tests::tcp_proxy::TcpProxy;

use crate::ingestion::project_and_session;

/// `url` with its host and port replaced by `address`.
fn through(url: &str, address: std::net::SocketAddr) -> (String, String) {
    let mut parsed = reqwest::Url::parse(url).expect("database URL");
    let host = parsed
        .host_str()
        .filter(|host| !host.is_empty())
        .expect("a TCP host in the test database URL")
        .to_owned();
    let target = format!("{host}:{}", parsed.port().unwrap_or(5432));
    parsed.set_host(Some("127.0.0.1")).unwrap();
    parsed.set_port(Some(address.port())).unwrap();
    (parsed.to_string(), target)
}

async fn post_turn(server: &TestServer, session: &str, text: &str) -> reqwest::Response {
    server
        .client
        .post(server.url(&format!("/api/session/{session}/messages")))
        .json(&json!({"role": "user", "parts": [{"type": "text", "text": text}]}))
        .send()
        .await
        .expect("the API answers")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_database_outage_is_503_with_retry_after_and_a_retried_turn_is_stored_once() {
    let db = TestDb::postgres().await;
    let (_, target) = through(&db.url, "127.0.0.1:1".parse().unwrap());
    let proxy = TcpProxy::start(target).await.unwrap();
    let (proxied_url, _) = through(&db.url, proxy.address());
    let api_db = Db::connect(
        &ConnectOptions::new(proxied_url),
        zuno_shared::migrations::schema(),
    )
    .await
    .expect("connect through the proxy");
    let server = TestServer::start_on(api_db, Config::default(), None).await;
    let session = project_and_session(&server, "p1").await;

    proxy.cut();
    let text = "No, use pnpm instead of npm.";
    let response = post_turn(&server, &session, text).await;
    assert_eq!(response.status().as_u16(), 503);
    assert_eq!(
        response.headers()["content-type"],
        "application/problem+json"
    );
    let retry_after: u64 = response.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .expect("Retry-After in seconds");
    assert!(retry_after >= 1, "{retry_after}");
    let (_, problem) = decode(response).await;
    assert_eq!(problem["status"], 503, "{problem}");
    assert_eq!(problem["code"], "unavailable", "{problem}");
    // Reads fail the same way, not as 500.
    let (status, _) = server
        .get(&format!("/api/session/{session}/messages"))
        .await;
    assert_eq!(status, 503);

    // The client keeps retrying after the advertised wait; the database comes back once the
    // client has met the outage.
    let (statuses, mut seen) = tokio::sync::mpsc::unbounded_channel::<u16>();
    let client = {
        let base = server.url("");
        let http = server.client.clone();
        let session = session.clone();
        tokio::spawn(async move {
            let mut answers = Vec::new();
            let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
            loop {
                let response = http
                    .post(format!("{base}/api/session/{session}/messages"))
                    .json(&json!({"role": "user", "parts": [{"type": "text", "text": text}]}))
                    .send()
                    .await
                    .expect("the API answers");
                let status = response.status().as_u16();
                answers.push(status);
                let _ = statuses.send(status);
                if status != 503 || tokio::time::Instant::now() > deadline {
                    return answers;
                }
                let wait: u64 = response.headers()["retry-after"]
                    .to_str()
                    .unwrap()
                    .parse()
                    .unwrap();
                tokio::time::sleep(Duration::from_secs(wait)).await;
            }
        })
    };
    let first = tokio::time::timeout(Duration::from_secs(30), seen.recv())
        .await
        .expect("the client's first answer");
    assert_eq!(first, Some(503));
    proxy.restore();
    let answers = client.await.unwrap();
    assert_eq!(answers.last(), Some(&201), "{answers:?}");
    assert!(
        answers[..answers.len() - 1].iter().all(|s| *s == 503),
        "{answers:?}"
    );

    let stored: Vec<String> = sqlx::query_scalar(
        "SELECT p.text FROM message_part p JOIN message m ON m.id = p.message_id WHERE m.session_id = $1",
    )
    .bind(&session)
    .fetch_all(db.db.as_postgres().unwrap())
    .await
    .unwrap();
    assert_eq!(stored, vec![text.to_owned()], "stored exactly once");
}

/// `zuno serve --database-url <url>` on a free loopback port, logging at the default level to
/// `stderr`. Returns the child and its base URL.
async fn serve(
    url: &str,
    home: &std::path::Path,
    stderr: std::process::Stdio,
) -> (tokio::process::Child, String) {
    let (child, _, base, _stdout) = zuno_tests::processes::serve(
        tokio::process::Command::new(zuno_tests::processes::binary("zuno"))
            .env("ZUNO_HOME", home)
            .env_remove("ZUNO_API_TOKEN")
            .env_remove("DATABASE_URL")
            .env_remove("ZUNO_DATABASE_URL")
            .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
            .env_remove("ZUNO_LOG")
            .env_remove("RUST_LOG")
            .args(["--database-url", url, "serve", "--bind", "127.0.0.1:0"]),
        stderr,
    )
    .await;
    (child, base)
}

/// `zuno serve` on Postgres whose server goes away entirely (its port refuses connections):
/// a request answers 503 with `Retry-After` after the API's short connection wait, before a
/// client's 15 s timeout, instead of hanging for the pool's full 30 s retry of refused
/// connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_database_connections_are_503_before_a_client_gives_up() {
    let db = TestDb::postgres().await;
    let (_, target) = through(&db.url, "127.0.0.1:1".parse().unwrap());
    let proxy = TcpProxy::start(target).await.unwrap();
    let (proxied_url, _) = through(&db.url, proxy.address());
    let home = tempfile::tempdir().unwrap();
    let (mut child, base) = serve(&proxied_url, home.path(), std::process::Stdio::null()).await;
    let token = std::fs::read_to_string(home.path().join("local-token")).unwrap();
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(15))
        .build()
        .unwrap();
    let create = |id: &'static str| {
        client
            .post(format!("{base}/api/projects"))
            .bearer_auth(token.trim())
            .json(&json!({"id": id, "name": id}))
            .send()
    };
    assert_eq!(create("before").await.unwrap().status().as_u16(), 201);

    // The database host goes away: open connections close and the port refuses new ones.
    proxy.cut();
    drop(proxy);
    let response = create("during")
        .await
        .expect("an answer before the client's 15 s timeout");
    assert_eq!(response.status().as_u16(), 503);
    assert!(response.headers().contains_key("retry-after"));
    assert_eq!(
        response.headers()["content-type"],
        "application/problem+json"
    );
    child.kill().await.unwrap();
}

/// The API process exports its job counters at 0 before any admission (every kind, both
/// outcomes), and an outage answered with 503s is logged once at WARN, never at ERROR: 40
/// requests during the cut produce one log line about it (the HTTP layer logged each 503 at
/// ERROR besides).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_is_logged_once_at_warn_and_counters_start_at_zero() {
    let db = TestDb::postgres().await;
    let (_, target) = through(&db.url, "127.0.0.1:1".parse().unwrap());
    let proxy = TcpProxy::start(target).await.unwrap();
    let (proxied_url, _) = through(&db.url, proxy.address());
    let home = tempfile::tempdir().unwrap();
    let log_path = home.path().join("serve.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let (mut child, base) = serve(&proxied_url, home.path(), log.into()).await;

    let metrics = reqwest::get(format!("{base}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for kind in zuno_shared::ledger::JobKind::ALL {
        for outcome in ["queued", "existing"] {
            assert!(
                metrics
                    .lines()
                    .any(|line| line.starts_with("zuno_jobs_admitted")
                        && line.contains(&format!("kind=\"{kind}\""))
                        && line.contains(&format!("outcome=\"{outcome}\""))
                        && line.ends_with(" 0")),
                "zuno_jobs_admitted{{kind={kind},outcome={outcome}}} is exported at 0:\n{metrics}"
            );
        }
    }
    assert!(
        metrics
            .lines()
            .any(|line| line.starts_with("zuno_experiences_recorded")
                && line.contains("verification=\"verified\"")
                && line.ends_with(" 0")),
        "{metrics}"
    );

    let token = std::fs::read_to_string(home.path().join("local-token")).unwrap();
    let client = reqwest::Client::new();
    proxy.cut();
    for n in 0..40 {
        let response = client
            .post(format!("{base}/api/projects"))
            .bearer_auth(token.trim())
            .json(&json!({"id": format!("p{n}"), "name": "p"}))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), 503);
    }
    child.kill().await.unwrap();
    let logged = std::fs::read_to_string(&log_path).unwrap();
    let errors: Vec<&str> = logged.lines().filter(|l| l.contains("ERROR")).collect();
    assert!(errors.is_empty(), "no 503 is logged at ERROR:\n{logged}");
    let outage: Vec<&str> = logged
        .lines()
        .filter(|l| l.contains("dependency unavailable"))
        .collect();
    assert_eq!(outage.len(), 1, "one line for the outage:\n{logged}");
    assert!(outage[0].contains("WARN"), "{logged}");
}
