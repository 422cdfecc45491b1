//! The server as raw bytes on a socket meet it: requests hyper cannot parse (answered by the
//! HTTP layer, not by a route) and the `Host` rules of RFC 9112 §3.2.

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use zuno_shared::config::Config;
use zuno_tests::TestDb;
use zuno_tests::server::TestServer;

/// Sends `request` as is on a new connection and reads the answer until the server closes it
/// or the first answer is complete: (status, content type, body).
async fn exchange(server: &TestServer, request: &[u8]) -> (u16, String, String) {
    let address = server.base.trim_start_matches("http://");
    let mut stream = tokio::net::TcpStream::connect(address)
        .await
        .expect("connect");
    stream.write_all(request).await.expect("send");
    let mut received = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    loop {
        let n = tokio::time::timeout(std::time::Duration::from_secs(30), stream.read(&mut chunk))
            .await
            .expect("the server answers")
            .unwrap_or(0);
        if n == 0 {
            break;
        }
        received.extend_from_slice(&chunk[..n]);
        if let Some(answer) = complete(&received) {
            return answer;
        }
    }
    complete(&received).unwrap_or_else(|| {
        panic!(
            "incomplete answer: {:?}",
            String::from_utf8_lossy(&received)
        )
    })
}

/// The first answer in `bytes`, once its head and `content-length` bytes of body are there.
fn complete(bytes: &[u8]) -> Option<(u16, String, String)> {
    let text = String::from_utf8_lossy(bytes);
    let (head, body) = text.split_once("\r\n\r\n")?;
    let mut lines = head.lines();
    let status = lines.next()?.split(' ').nth(1)?.parse().ok()?;
    let mut content_type = String::new();
    let mut length = 0;
    for line in lines {
        let (name, value) = line.split_once(':')?;
        match name.trim().to_ascii_lowercase().as_str() {
            "content-type" => content_type = value.trim().to_owned(),
            "content-length" => length = value.trim().parse().ok()?,
            _ => {}
        }
    }
    (body.len() >= length).then(|| (status, content_type, body[..length].to_owned()))
}

fn assert_problem(answer: &(u16, String, String), status: u16, code: &str) {
    let (got, content_type, body) = answer;
    assert_eq!(*got, status, "{body}");
    assert_eq!(content_type, "application/problem+json", "{body}");
    let problem: Value = serde_json::from_str(body).expect("a JSON body");
    assert_eq!(problem["status"], status, "{body}");
    assert_eq!(problem["code"], code, "{body}");
    assert!(
        !problem["detail"].as_str().unwrap_or_default().is_empty(),
        "{body}"
    );
}

#[tokio::test]
async fn errors_of_the_http_layer_are_problem_documents() {
    let db = TestDb::sqlite().await;
    let server = TestServer::start(&db, Config::default(), None).await;

    // A malformed request line and a malformed header: hyper's own 400.
    let answer = exchange(&server, b"GET /healthz HTTP/9.9\r\nHost: localhost\r\n\r\n").await;
    assert_problem(&answer, 400, "bad_request");
    let answer = exchange(
        &server,
        b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nBad Header\r\n\r\n",
    )
    .await;
    assert_problem(&answer, 400, "bad_request");

    // A URI past the `http` crate's limit: 414.
    let long = format!(
        "GET /healthz?{} HTTP/1.1\r\nHost: localhost\r\n\r\n",
        "a".repeat(70_000)
    );
    let answer = exchange(&server, long.as_bytes()).await;
    assert_problem(&answer, 414, "uri_too_long");

    // Too many header fields for hyper's parser: 431.
    let mut many = String::from("GET /healthz HTTP/1.1\r\nHost: localhost\r\n");
    for i in 0..200 {
        many.push_str(&format!("x-filler-{i}: 1\r\n"));
    }
    many.push_str("\r\n");
    let answer = exchange(&server, many.as_bytes()).await;
    assert_problem(&answer, 431, "headers_too_large");

    // The server still answers well-formed requests.
    let answer = exchange(
        &server,
        b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(answer.0, 200, "{answer:?}");
}

#[tokio::test]
async fn host_is_required_once_and_well_formed() {
    let db = TestDb::sqlite().await;
    let server = TestServer::start(&db, Config::default(), None).await;

    // RFC 9112 §3.2: an HTTP/1.1 request without Host is a bad request.
    let answer = exchange(
        &server,
        b"GET /healthz HTTP/1.1\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_problem(&answer, 400, "bad_request");
    // HTTP/1.0 had no such rule.
    let answer = exchange(&server, b"GET /healthz HTTP/1.0\r\n\r\n").await;
    assert_eq!(answer.0, 200, "{answer:?}");

    // Two Host fields: which one would a check have read? Refused.
    let answer = exchange(
        &server,
        b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nHost: evil.example\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_problem(&answer, 400, "bad_request");

    // A bracketed loopback address followed by a domain name names no host of this server.
    for host in ["[::1]evil.example", "[::1]evil.example:7878", "[::1]:x"] {
        let request = format!("GET /healthz HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
        let answer = exchange(&server, request.as_bytes()).await;
        assert_problem(&answer, 403, "forbidden");
    }

    // The well-formed loopback names are still served.
    for host in ["[::1]", "[::1]:7878", "localhost", "127.0.0.1:1"] {
        let request = format!("GET /healthz HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
        let answer = exchange(&server, request.as_bytes()).await;
        assert_eq!(answer.0, 200, "{host}: {answer:?}");
    }
}
