//! Serving the router over TCP, with what only a network connection needs:
//!
//! - hyper answers a request it cannot parse (a malformed request line or header: 400, a head
//!   too large: 431, a URI too long: 414) itself, before any route or middleware sees it, with an
//!   empty body. [`ProblemIo`] recognises those automatic answers on their way out and sends a
//!   problem document instead, so every error of the API, whoever produced it, is
//!   `application/problem+json`.
//! - RFC 9112 §3.2: an HTTP/1.1 request without `Host` is refused with 400, and so is an HTTP/2
//!   request (hyper also serves HTTP/2 with prior knowledge here) with neither `:authority` nor
//!   `Host` ([`require_host`]). The in-process router of the CLI sends none and is not served
//!   here, so the rule applies to the network only.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use axum::Router;
use axum::extract::Request;
use axum::http::{StatusCode, Version, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};

use super::error::ApiError;

/// Serves `app` on `listener` until `shutdown` completes, as `zuno serve` does.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    let app = app.layer(axum::middleware::from_fn(require_host));
    axum::serve(ProblemListener(listener), app)
        .with_graceful_shutdown(shutdown)
        .await
}

/// Refuses a request that names no host: an HTTP/1.1 request without `Host` (RFC 9112 §3.2: "A
/// server MUST respond with a 400 … to any HTTP/1.1 request message that lacks a Host header
/// field"), and an HTTP/2 request with neither `:authority` nor `Host` (hyper serves HTTP/2 with
/// prior knowledge on the same port; RFC 9113 §8.3.1 has clients send `:authority`). Two `Host`
/// fields, a malformed one and a foreign name in either place are refused by the guard, for
/// every transport.
pub async fn require_host(request: Request, next: Next) -> Response {
    let has_host = request.headers().contains_key(header::HOST);
    let detail = match request.version() {
        Version::HTTP_11 if !has_host => "an HTTP/1.1 request must carry a Host header",
        Version::HTTP_2 if !has_host && request.uri().authority().is_none() => {
            "an HTTP/2 request must carry :authority (or Host)"
        }
        _ => return next.run(request).await,
    };
    ApiError::Status {
        status: StatusCode::BAD_REQUEST,
        detail: String::from(detail),
    }
    .into_response()
}

/// A TCP listener whose connections answer hyper's own parse errors as problem documents.
pub struct ProblemListener(pub TcpListener);

impl axum::serve::Listener for ProblemListener {
    type Io = ProblemIo<TcpStream>;
    type Addr = std::net::SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        let (stream, address) = axum::serve::Listener::accept(&mut self.0).await;
        (ProblemIo::new(stream), address)
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.0.local_addr()
    }
}

/// A connection that replaces hyper's automatic error answers with problem documents.
///
/// hyper writes such an answer only when it could not parse a request: the answer is then the
/// last thing sent on the connection and ends the heads buffer of a write of its own (see
/// [`replacement`]). It is recognised as an HTTP/1 status line of 400, 414 or 431 whose head has
/// `content-length: 0` and no `content-type`; the API's own error answers always carry a problem
/// document, so they never look like that.
pub struct ProblemIo<S> {
    inner: S,
    /// The replacement being written, how much of it is written, and how many bytes of the
    /// caller's buffer it stands for (reported once it is all written).
    pending: Option<(Vec<u8>, usize, usize)>,
}

impl<S> ProblemIo<S> {
    pub fn new(inner: S) -> ProblemIo<S> {
        ProblemIo {
            inner,
            pending: None,
        }
    }
}

/// The bytes to send instead of `buf` when `buf` ends with one of hyper's automatic error heads.
///
/// hyper's automatic answer is the last thing it sends on a connection, so it ends the buffer
/// hyper writes. It also begins that buffer, unless earlier answers' heads are still in it: hyper
/// keeps heads in one buffer and each body in a buffer of its own, so a bodiless answer (to
/// `HEAD`, a 204 or 304) not yet flushed when the next pipelined request failed to parse comes
/// first. Those heads pass unchanged.
fn replacement(buf: &[u8]) -> Option<Vec<u8>> {
    if !buf.starts_with(b"HTTP/1.") {
        return None;
    }
    // The error head names no other message, so it starts at the last status line.
    let start = buf.windows(7).rposition(|w| w == b"HTTP/1.")?;
    let problem = problem_answer(&buf[start..])?;
    let mut bytes = buf[..start].to_vec();
    bytes.extend_from_slice(&problem);
    Some(bytes)
}

/// The problem answer standing for `head` when it is exactly one of hyper's automatic error
/// heads (a 400, 414 or 431 status line, `content-length: 0`, no `content-type`).
fn problem_answer(head: &[u8]) -> Option<Vec<u8>> {
    let end = head.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    if end != head.len() {
        return None;
    }
    let head = std::str::from_utf8(head).ok()?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next()?;
    let rest = status_line
        .strip_prefix("HTTP/1.1 ")
        .or_else(|| status_line.strip_prefix("HTTP/1.0 "))?;
    let status = StatusCode::from_u16(rest.get(..3)?.parse().ok()?).ok()?;
    let detail = match status.as_u16() {
        400 => "the request is not valid HTTP/1",
        414 => "the request's URI is too long",
        431 => "the request's head is too large",
        _ => return None,
    };
    let mut empty = false;
    let mut other_headers = Vec::new();
    for line in lines.filter(|line| !line.is_empty()) {
        let (name, value) = line.split_once(':')?;
        let name = name.trim().to_ascii_lowercase();
        match name.as_str() {
            "content-type" => return None,
            "content-length" => empty = value.trim() == "0",
            _ => other_headers.push(line),
        }
    }
    if !empty {
        return None;
    }
    let problem = ApiError::Status {
        status,
        detail: String::from(detail),
    }
    .problem();
    let body = serde_json::to_vec(&problem).ok()?;
    let mut answer = format!(
        "{status_line}\r\ncontent-type: application/problem+json\r\ncontent-length: {}\r\n",
        body.len()
    );
    for line in other_headers {
        answer.push_str(line);
        answer.push_str("\r\n");
    }
    answer.push_str("\r\n");
    let mut bytes = answer.into_bytes();
    bytes.extend_from_slice(&body);
    Some(bytes)
}

impl<S: AsyncWrite + Unpin> ProblemIo<S> {
    /// Writes the pending replacement; `Ready(n)` once it is all out, `n` being the length of
    /// the caller's buffer it stood for.
    fn drain_pending(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        while let Some((bytes, written, stands_for)) = self.pending.as_mut() {
            if *written == bytes.len() {
                let stands_for = *stands_for;
                self.pending = None;
                return Poll::Ready(Ok(stands_for));
            }
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &bytes[*written..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            *written += n;
        }
        Poll::Ready(Ok(0))
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for ProblemIo<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for ProblemIo<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        // A write that was interrupted goes on with the same buffer, so what is pending stands
        // for it.
        if self.pending.is_none() {
            match replacement(buf) {
                Some(bytes) => self.pending = Some((bytes, 0, buf.len())),
                None => return Pin::new(&mut self.inner).poll_write(cx, buf),
            }
        }
        self.drain_pending(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let first = bufs.iter().find(|buf| !buf.is_empty());
        let error_head = first.is_some_and(|buf| replacement(buf).is_some());
        if self.pending.is_some() || error_head {
            // The heads buffer ends with an error head: written alone (anything after it follows
            // in the caller's next write).
            let first: &[u8] = first.map_or(&[], |buf| buf);
            return self.poll_write(cx, first);
        }
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.pending.is_some() {
            ready!(self.drain_pending(cx))?;
        }
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.pending.is_some() {
            ready!(self.drain_pending(cx))?;
        }
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::replacement;

    #[test]
    fn hypers_automatic_answers_become_problem_documents() {
        let answer = replacement(
            b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\ndate: Mon, 07 Dec 2026 11:00:00 GMT\r\n\r\n",
        )
        .expect("replaced");
        let text = String::from_utf8(answer).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 431 "), "{head}");
        assert!(
            head.contains("content-type: application/problem+json"),
            "{head}"
        );
        assert!(head.contains("date: Mon, 07 Dec 2026"), "{head}");
        assert!(
            head.contains(&format!("content-length: {}", body.len())),
            "{head}"
        );
        let problem: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(problem["status"], 431);
        assert_eq!(problem["code"], "headers_too_large");
    }

    /// A pipelined request that fails to parse after one answered without a body (`HEAD`):
    /// both heads are in one buffer; the first passes as it is, the second becomes the same
    /// problem answer a lone malformed request gets.
    #[test]
    fn an_error_head_after_a_bodiless_answer_in_the_same_buffer_is_replaced() {
        let first =
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 15\r\n\r\n";
        let error = b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nconnection: close\r\n\r\n";
        let lone = replacement(error).expect("a lone error head is replaced");
        let both = replacement(&[&first[..], &error[..]].concat()).expect("replaced");
        assert_eq!(&both[..first.len()], first);
        assert_eq!(&both[first.len()..], &lone[..]);
        // An error head that doesn't end the buffer is not hyper's automatic answer.
        assert_eq!(replacement(&[&error[..], b"{}"].concat()), None);
    }

    #[test]
    fn other_answers_pass_unchanged() {
        for head in [
            &b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"[..],
            b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/problem+json\r\ncontent-length: 2\r\n\r\n{}",
            b"HTTP/1.1 400 Bad Request\r\ncontent-length: 12\r\n\r\n",
            b"{\"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n",
            b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n",
        ] {
            assert_eq!(replacement(head), None, "{}", String::from_utf8_lossy(head));
        }
    }
}
