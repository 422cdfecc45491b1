//! The server as raw bytes on a socket meet it: requests hyper cannot parse (answered by the
//! HTTP layer, not by a route), alone or pipelined after good ones, and the `Host` rules of
//! RFC 9112 §3.2, over HTTP/1.1 and over HTTP/2 with prior knowledge.

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

/// Sends `requests` pipelined in one write on a new connection and reads until the server
/// closes it: the raw bytes of every answer.
async fn pipelined(server: &TestServer, requests: &[&[u8]]) -> Vec<u8> {
    let address = server.base.trim_start_matches("http://");
    let mut stream = tokio::net::TcpStream::connect(address)
        .await
        .expect("connect");
    stream.write_all(&requests.concat()).await.expect("send");
    let mut received = Vec::new();
    tokio::time::timeout(
        std::time::Duration::from_secs(30),
        stream.read_to_end(&mut received),
    )
    .await
    .expect("the server closes the connection after a malformed request")
    .expect("read");
    received
}

/// The last answer in `bytes` (answers here carry no `HTTP/1.1 ` in their bodies).
fn last_answer(bytes: &[u8]) -> (u16, String, String) {
    let text = String::from_utf8_lossy(bytes);
    let start = text.rfind("HTTP/1.1 ").expect("an answer");
    complete(text[start..].as_bytes()).expect("a complete last answer")
}

/// A malformed request pipelined after good ones on one connection gets the same problem
/// document as a lone one, also after an answer without a body (`HEAD`), whose head hyper may
/// still hold when the next request fails to parse; the good requests are answered first.
#[tokio::test]
async fn a_pipelined_malformed_request_gets_the_same_problem_document() {
    let db = TestDb::sqlite().await;
    let server = TestServer::start(&db, Config::default(), None).await;
    let long = format!(
        "GET /healthz?{} HTTP/1.1\r\nHost: localhost\r\n\r\n",
        "a".repeat(70_000)
    );
    let mut many = String::from("GET /healthz HTTP/1.1\r\nHost: localhost\r\n");
    for i in 0..200 {
        many.push_str(&format!("x-filler-{i}: 1\r\n"));
    }
    many.push_str("\r\n");
    let malformed: [(&[u8], u16, &str); 4] = [
        (
            b"GET /healthz HTTP/9.9\r\nHost: localhost\r\n\r\n",
            400,
            "bad_request",
        ),
        (
            b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nBad Header\r\n\r\n",
            400,
            "bad_request",
        ),
        (long.as_bytes(), 414, "uri_too_long"),
        (many.as_bytes(), 431, "headers_too_large"),
    ];
    let good: [(&[u8], &str); 3] = [
        (b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n", "GET"),
        (b"HEAD /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n", "HEAD"),
        (b"GET /nope HTTP/1.1\r\nHost: localhost\r\n\r\n", "GET 404"),
    ];
    for (bad, status, code) in malformed {
        let lone = exchange(&server, bad).await;
        assert_problem(&lone, status, code);
        for (first, name) in good {
            for count in [1, 3] {
                let mut requests = vec![first; count];
                requests.push(bad);
                let received = pipelined(&server, &requests).await;
                let answers = String::from_utf8_lossy(&received)
                    .matches("HTTP/1.1 ")
                    .count();
                assert_eq!(
                    answers,
                    count + 1,
                    "{name} ×{count}: every request is answered"
                );
                let answer = last_answer(&received);
                assert_eq!(answer, lone, "{name} ×{count} then a malformed request");
            }
        }
    }
}

/// An HTTP/2 request as `h2` sends it: `authority` in `:authority` (none when `None`) and the
/// given `Host`; returns (status, content type, body).
async fn h2_get(
    server: &TestServer,
    authority: Option<&str>,
    host: Option<&str>,
) -> (u16, String, String) {
    let address = server.base.trim_start_matches("http://");
    let stream = tokio::net::TcpStream::connect(address)
        .await
        .expect("connect");
    let (mut client, connection) = h2::client::handshake(stream)
        .await
        .expect("the server speaks HTTP/2 with prior knowledge");
    tokio::spawn(connection);
    // A relative URI (sent as an HTTP/1.1 request forwarded over HTTP/2) carries no :authority.
    let mut request = match authority {
        Some(authority) => {
            http::Request::get(format!("http://{authority}/healthz")).version(http::Version::HTTP_2)
        }
        None => http::Request::get("/healthz"),
    };
    if let Some(host) = host {
        request = request.header("host", host);
    }
    let (response, _) = client
        .send_request(request.body(()).unwrap(), true)
        .expect("send");
    let response = tokio::time::timeout(std::time::Duration::from_secs(30), response)
        .await
        .expect("the server answers")
        .expect("an answer");
    let status = response.status().as_u16();
    let content_type = response
        .headers()
        .get("content-type")
        .map(|value| value.to_str().unwrap().to_owned())
        .unwrap_or_default();
    let mut body = response.into_body();
    let mut bytes = Vec::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.expect("body");
        let _ = body.flow_control().release_capacity(chunk.len());
        bytes.extend_from_slice(&chunk);
    }
    (status, content_type, String::from_utf8(bytes).unwrap())
}

/// The server also speaks HTTP/2 with prior knowledge (hyper's automatic protocol choice): the
/// DNS-rebinding defence holds there too. `:authority` and `Host` must both name this server
/// when both are present, and a request naming no host at all is refused like one over
/// HTTP/1.1.
#[tokio::test]
async fn http2_requests_must_name_this_server() {
    let db = TestDb::sqlite().await;
    let server = TestServer::start(&db, Config::default(), None).await;
    let own = server.base.trim_start_matches("http://").to_owned();
    let port = own.rsplit_once(':').unwrap().1.to_owned();
    let foreign = format!("evil.example:{port}");

    let answer = h2_get(&server, Some(&own), None).await;
    assert_eq!(answer.0, 200, "{answer:?}");
    let answer = h2_get(&server, None, Some("localhost")).await;
    assert_eq!(
        answer.0, 200,
        "Host stands for a missing :authority: {answer:?}"
    );

    assert_problem(
        &h2_get(&server, Some(&foreign), None).await,
        403,
        "forbidden",
    );
    assert_problem(
        &h2_get(&server, None, Some(&foreign)).await,
        403,
        "forbidden",
    );
    assert_problem(
        &h2_get(&server, Some(&foreign), Some("localhost")).await,
        403,
        "forbidden",
    );
    assert_problem(
        &h2_get(&server, Some(&own), Some(&foreign)).await,
        403,
        "forbidden",
    );
    assert_problem(&h2_get(&server, None, None).await, 400, "bad_request");
}

/// An absolute-form request target names the host too (RFC 9112 §3.2.2 puts it before `Host`):
/// a foreign one is refused even beside a loopback `Host`.
#[tokio::test]
async fn an_absolute_form_target_must_name_this_server() {
    let db = TestDb::sqlite().await;
    let server = TestServer::start(&db, Config::default(), None).await;
    let answer = exchange(
        &server,
        b"GET http://evil.example/healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_problem(&answer, 403, "forbidden");
    let answer = exchange(
        &server,
        b"GET http://localhost/healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(answer.0, 200, "{answer:?}");
}
