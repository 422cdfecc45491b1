//! Rate limits, retries and the deadline: Retry-After parsing, waits that fit the deadline, the
//! retry budget, and a repair sharing the deadline.

use std::time::{Duration, SystemTime};

use reqwest::header::{HeaderMap, HeaderValue};
use serde_json::{Value, json};
use zuno_shared::config::{ModelConfig, ProviderApi};
use zuno_tests::fake_provider::{FakeProvider, Reply};
use zuno_worker_extract::provider::{ProviderError, Usage, parse_retry_after};

use crate::harness::*;

#[test]
fn retry_after_parser() {
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_445_412_450); // 07:27:30 GMT
    let headers = |pairs: &[(&'static str, &'static str)]| {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, HeaderValue::from_static(value));
        }
        map
    };
    let parse = |pairs: &[(&'static str, &'static str)], text: &str| {
        parse_retry_after(&headers(pairs), text, now)
    };
    assert_eq!(
        parse(&[("retry-after", "55")], ""),
        Some(Duration::from_secs(55))
    );
    assert_eq!(
        parse(&[("retry-after", "1.5")], ""),
        Some(Duration::from_millis(1500))
    );
    assert_eq!(
        parse(&[("retry-after-ms", "250")], ""),
        Some(Duration::from_millis(250))
    );
    // The millisecond header wins over the seconds header.
    assert_eq!(
        parse(&[("retry-after", "9"), ("retry-after-ms", "120")], ""),
        Some(Duration::from_millis(120))
    );
    assert_eq!(
        parse(&[("retry-after", "Wed, 21 Oct 2015 07:28:00 GMT")], ""),
        Some(Duration::from_secs(30))
    );
    assert_eq!(
        parse(&[("retry-after", "Wed, 21 Oct 2015 07:00:00 GMT")], ""),
        Some(Duration::ZERO),
        "a date in the past means now"
    );
    let message = "Rate limit reached for gpt-4o in organization XXX on tokens per min (TPM): \
                   Limit 30000, Used 14567, Requested 24754. Please try again in 18.642s.";
    assert_eq!(parse(&[], message), Some(Duration::from_millis(18_642)));
    assert_eq!(
        parse(&[], "Please try again in 174ms."),
        Some(Duration::from_millis(174))
    );
    // A header beats the text; garbage is no hint at all.
    assert_eq!(
        parse(&[("retry-after", "2")], message),
        Some(Duration::from_secs(2))
    );
    assert_eq!(parse(&[("retry-after", "soon")], "slow down"), None);
    assert_eq!(parse(&[], ""), None);
}

fn http_date_in(seconds: u64) -> String {
    let at = time::OffsetDateTime::now_utc() + Duration::from_secs(seconds);
    let format = time::macros::format_description!(
        "[weekday repr:short], [day] [month repr:short] [year] [hour]:[minute]:[second] GMT"
    );
    at.format(&format).expect("format HTTP-date")
}

/// A 429 whose wait does not fit in the deadline is returned at once, with the wait.
async fn rate_limited_by(reply: Reply) -> (ProviderError, u32) {
    let fake = FakeProvider::start().await;
    fake.push([reply]);
    let config = single(
        ProviderApi::OpenaiChat,
        fake.base_url(),
        ModelConfig::default(),
    );
    let failure = client()
        .complete_json(&resolved(&config), &request(), Duration::from_secs(5))
        .await
        .expect_err("429");
    assert!(!failure.is_permanent());
    assert_eq!(
        fake.requests().len(),
        1,
        "a wait past the deadline is not taken"
    );
    (failure.error, failure.requests)
}

fn rate_limit_body(message: &str) -> Value {
    json!({"error": {"message": message, "type": "tokens", "code": "rate_limit_exceeded"}})
}

#[tokio::test]
async fn a_429_reports_its_wait_from_header_or_text() {
    let started = SystemTime::now();
    let (error, requests) = rate_limited_by(
        Reply::json(429, rate_limit_body("Rate limit reached")).with_header("retry-after", "60"),
    )
    .await;
    assert_eq!(requests, 1);
    let ProviderError::RateLimited {
        retry_after,
        retry_at,
        diagnostic,
    } = &error
    else {
        panic!("expected RateLimited, got {error:?}");
    };
    assert_eq!(*retry_after, Some(Duration::from_secs(60)));
    assert!(retry_at.is_some_and(|at| at >= started + Duration::from_secs(60)));
    assert_eq!(diagnostic.code.as_deref(), Some("rate_limit_exceeded"));

    let (error, _) = rate_limited_by(
        Reply::json(429, rate_limit_body("slow down")).with_header("retry-after-ms", "90000"),
    )
    .await;
    assert_eq!(error.retry_after(), Some(Duration::from_secs(90)));

    let (error, _) = rate_limited_by(
        Reply::json(429, rate_limit_body("slow down"))
            .with_header("retry-after", &http_date_in(120)),
    )
    .await;
    let wait = error.retry_after().expect("HTTP-date wait");
    assert!(
        wait > Duration::from_secs(100) && wait <= Duration::from_secs(120),
        "{wait:?}"
    );

    let (error, _) = rate_limited_by(Reply::json(
        429,
        rate_limit_body(
            "Rate limit reached for gpt-4o in organization XXX on tokens per min (TPM): \
             Limit 30000, Used 14567, Requested 24754. Please try again in 18.642s.",
        ),
    ))
    .await;
    assert_eq!(error.retry_after(), Some(Duration::from_millis(18_642)));
}

#[tokio::test]
async fn a_429_is_retried_when_its_wait_fits_the_deadline() {
    let fake = FakeProvider::start().await;
    fake.push([
        Reply::json(429, rate_limit_body("Please try again in 30ms.")),
        Reply::json(429, rate_limit_body("slow down")).with_header("retry-after-ms", "20"),
        Reply::answer(VALID),
    ]);
    let response = complete(&fake, ProviderApi::OpenaiChat)
        .await
        .expect("answer after rate limits");
    assert_eq!(response.requests, 3);
    assert!(!response.repaired);
    assert_eq!(fake.remaining(), 0);
}

#[tokio::test]
async fn a_retry_after_does_not_extend_the_retry_budget() {
    let fake = FakeProvider::start().await;
    fake.push((0..6).map(|_| {
        Reply::json(429, rate_limit_body("slow down")).with_header("retry-after-ms", "1")
    }));
    // The suite's client allows 3 retries.
    let failure = complete(&fake, ProviderApi::OpenaiChat)
        .await
        .expect_err("rate limited");
    assert!(
        matches!(failure.error, ProviderError::RateLimited { .. }),
        "{failure:?}"
    );
    assert_eq!(failure.requests, 4);
    assert_eq!(fake.remaining(), 2);
}

#[tokio::test]
async fn transient_failures_are_retried_then_succeed() {
    let fake = FakeProvider::start().await;
    fake.push([
        Reply::json(
            529,
            json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
        ),
        Reply::json(
            500,
            json!({"type": "error", "error": {"type": "api_error", "message": "Internal server error"}}),
        ),
        Reply::answer_with_usage(VALID, 10, 5),
    ]);
    let response = complete(&fake, ProviderApi::AnthropicMessages)
        .await
        .expect("answer after transient failures");
    assert_eq!(response.requests, 3);
    assert_eq!(
        response.usage,
        Usage {
            input_tokens: 10,
            output_tokens: 5
        }
    );
}

#[tokio::test]
async fn openrouter_429s_exhaust_the_retries_as_a_rate_limit() {
    let fake = FakeProvider::start().await;
    let recorded = Reply::cassette("openai-compatible-other/openrouter_error_429.yaml");
    assert_eq!(recorded.len(), 3);
    fake.push(recorded);
    let config = single(
        ProviderApi::OpenaiChat,
        fake.base_url(),
        ModelConfig::default(),
    );
    let client = client().with_retry_delays(Duration::from_millis(5), Duration::from_millis(10), 2);
    let failure = client
        .complete_json(&resolved(&config), &request(), TIMEOUT)
        .await
        .expect_err("rate limited");
    let ProviderError::RateLimited { diagnostic, .. } = &failure.error else {
        panic!("expected RateLimited, got {failure:?}");
    };
    assert_eq!(failure.requests, 3);
    assert_eq!(diagnostic.code.as_deref(), Some("429"));
    assert!(
        diagnostic
            .message
            .contains("temporarily rate-limited upstream"),
        "{diagnostic}"
    );
    assert!(!failure.is_permanent());
}

#[tokio::test]
async fn openrouter_metadata_headers_give_the_wait() {
    let (error, _) = rate_limited_by(Reply::json(
        429,
        json!({"error": {
            "code": 429,
            "message": "Rate limit exceeded: free-models-per-min.",
            "metadata": {"headers": {"X-RateLimit-Limit": "20", "X-RateLimit-Remaining": "0", "Retry-After": "45"}},
        }}),
    ))
    .await;
    assert_eq!(error.retry_after(), Some(Duration::from_secs(45)));
}

#[tokio::test]
async fn a_hang_past_the_deadline_is_a_timeout() {
    let fake = FakeProvider::start().await;
    fake.push([Reply::hang()]);
    let config = single(
        ProviderApi::OpenaiResponses,
        fake.base_url(),
        ModelConfig::default(),
    );
    let deadline = Duration::from_millis(300);
    let started = tokio::time::Instant::now();
    let failure = client()
        .complete_json(&resolved(&config), &request(), deadline)
        .await
        .expect_err("timeout");
    let elapsed = started.elapsed();
    assert_eq!(failure.error, ProviderError::Timeout { deadline });
    assert!(!failure.is_permanent());
    assert_eq!(failure.requests, 1);
    assert!(
        elapsed >= Duration::from_millis(250) && elapsed < Duration::from_secs(2),
        "{elapsed:?}"
    );
}

#[tokio::test]
async fn the_repair_shares_the_deadline() {
    let fake = FakeProvider::start().await;
    fake.push([Reply::answer("not json"), Reply::hang()]);
    let config = single(
        ProviderApi::OpenaiChat,
        fake.base_url(),
        ModelConfig::default(),
    );
    let deadline = Duration::from_millis(300);
    let started = tokio::time::Instant::now();
    let failure = client()
        .complete_json(&resolved(&config), &request(), deadline)
        .await
        .expect_err("timeout");
    assert_eq!(failure.error, ProviderError::Timeout { deadline });
    assert_eq!(failure.requests, 2);
    assert_eq!(
        failure.usage.input_tokens, 100,
        "the first answer's tokens still count"
    );
    assert!(started.elapsed() < Duration::from_secs(2));
}
