//! The OpenAPI document is generated from the routes and kept true: every documented operation
//! is routed, the served document is the generated one, and the committed copy matches.

use zuno_shared::config::Config;
use zuno_tests::TestDb;
use zuno_tests::server::TestServer;

#[tokio::test]
async fn the_served_document_is_the_generated_one_and_every_operation_is_routed() {
    let db = TestDb::sqlite().await;
    let server = TestServer::start(&db, Config::default(), None).await;
    let (status, served) = server.get("/api/openapi.json").await;
    assert_eq!(status, 200);
    let generated = serde_json::to_value(zuno_api::http::openapi_document()).unwrap();
    assert_eq!(served, generated);

    let paths = generated["paths"].as_object().unwrap();
    assert!(paths.len() >= 8, "{:?}", paths.keys());
    for (path, operations) in paths {
        let concrete = path
            .split('/')
            .map(|segment| {
                if segment.starts_with('{') {
                    "placeholder"
                } else {
                    segment
                }
            })
            .collect::<Vec<_>>()
            .join("/");
        for method in operations.as_object().unwrap().keys() {
            let method: reqwest::Method = method.to_uppercase().parse().unwrap();
            let response = server
                .client
                .request(method.clone(), server.url(&concrete))
                .json(&serde_json::json!({}))
                .send()
                .await
                .unwrap();
            let status = response.status().as_u16();
            let body = response.text().await.unwrap();
            assert_ne!(status, 405, "{method} {path} is documented but not routed");
            assert!(
                !body.contains("no route for"),
                "{method} {path} is documented but not routed"
            );
        }
    }
}

#[test]
fn the_committed_document_matches_the_code() {
    let generated =
        serde_json::to_string_pretty(&zuno_api::http::openapi_document()).unwrap() + "\n";
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/openapi.json");
    if std::env::var_os("ZUNO_UPDATE_OPENAPI").is_some() {
        std::fs::write(&path, &generated).unwrap();
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "docs/openapi.json is stale; regenerate with ZUNO_UPDATE_OPENAPI=1 cargo nextest run -p zuno-tests openapi"
    );
}

/// Every `$ref` of the document names a schema it defines (a dangling `MatchMode` once made
/// schemathesis skip the `match` parameter of experience search).
#[test]
fn every_reference_resolves() {
    fn refs<'a>(value: &'a serde_json::Value, out: &mut Vec<&'a str>) {
        match value {
            serde_json::Value::Object(map) => {
                for (key, item) in map {
                    match (key.as_str(), item.as_str()) {
                        ("$ref", Some(target)) => out.push(target),
                        _ => refs(item, out),
                    }
                }
            }
            serde_json::Value::Array(items) => items.iter().for_each(|item| refs(item, out)),
            _ => {}
        }
    }
    let document = serde_json::to_value(zuno_api::http::openapi_document()).unwrap();
    let mut found = Vec::new();
    refs(&document, &mut found);
    assert!(found.len() > 50, "{} references", found.len());
    let schemas = document["components"]["schemas"].as_object().unwrap();
    let dangling: Vec<&&str> = found
        .iter()
        .filter(|target| {
            target
                .strip_prefix("#/components/schemas/")
                .is_none_or(|name| !schemas.contains_key(name))
        })
        .collect();
    assert!(dangling.is_empty(), "dangling references: {dangling:?}");
}
