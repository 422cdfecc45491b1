//! `zuno mcp`: a real MCP client (rmcp) spawns the binary and talks to it over stdio:
//! initialize, tools/list (with input schemas), tools/call.

use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use rmcp::transport::TokioChildProcess;
use serde_json::{Value, json};
use zuno_shared::config::Config;
use zuno_tests::TestDb;
use zuno_tests::processes::binary;
use zuno_tests::server::TestServer;

/// `zuno mcp` as Claude Code starts it: the server's data directory, no token given (it reads
/// the local token from there).
fn mcp_command(server: &TestServer, project: &str, read_only: bool) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(binary("zuno"));
    command
        .env("ZUNO_HOME", server.home())
        .env_remove("ZUNO_API_TOKEN")
        .env_remove("ZUNO_SERVER_URL")
        .args(["mcp", "--server", &server.base, "--project", project]);
    if read_only {
        command.arg("--read-only");
    }
    command
}

fn arguments(value: Value) -> serde_json::Map<String, Value> {
    value.as_object().unwrap().clone()
}

#[tokio::test]
async fn an_mcp_client_handshakes_lists_and_calls_the_tools_over_stdio() {
    let db = TestDb::sqlite().await;
    let server = TestServer::start(&db, Config::default(), None).await;
    let (status, _) = server
        .post(
            "/api/projects",
            json!({"id": "mcp-demo", "name": "MCP demo"}),
        )
        .await;
    assert_eq!(status, 201);

    let (transport, _stderr) = TokioChildProcess::builder(mcp_command(&server, "mcp-demo", false))
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let client = ().serve(transport).await.expect("initialize");
    let info = client.peer_info().expect("server info after initialize");
    assert_eq!(info.server_info.as_ref().unwrap().name, "zuno");
    assert!(info.capabilities.tools.is_some());

    let mut tools = client.list_all_tools().await.unwrap();
    tools.sort_by(|a, b| a.name.cmp(&b.name));
    let names: Vec<&str> = tools.iter().map(|tool| tool.name.as_ref()).collect();
    assert_eq!(names, ["experience_search", "memory_read", "memory_update"]);
    // Annotations as the MCP revisions rmcp implements define them.
    for tool in &tools {
        let annotations = tool.annotations.as_ref().expect("annotations");
        let read_only = tool.name != "memory_update";
        assert_eq!(annotations.read_only_hint, Some(read_only), "{}", tool.name);
        assert_eq!(annotations.open_world_hint, Some(false), "{}", tool.name);
        assert!(annotations.title.is_some(), "{}", tool.name);
        if !read_only {
            assert_eq!(annotations.destructive_hint, Some(true));
        }
    }
    let search = Value::Object(tools[0].input_schema.as_ref().clone());
    assert_eq!(search["type"], "object");
    assert_eq!(search["required"], json!(["query"]), "{search}");
    let update = Value::Object(tools[2].input_schema.as_ref().clone());
    let mut required: Vec<&str> = update["required"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    required.sort_unstable();
    assert_eq!(
        required,
        ["action", "confidence", "reason", "target"],
        "{update}"
    );

    let added = client
        .call_tool(
            CallToolRequestParams::new("memory_update").with_arguments(arguments(json!({
                "target": "project", "action": "add",
                "content": "Run the linter with `cargo clippy -- -D warnings`.",
                "reason": "the project's CI does", "confidence": 0.9
            }))),
        )
        .await
        .unwrap();
    assert_eq!(added.is_error, Some(false), "{added:?}");
    let outcome = added.structured_content.clone().unwrap();
    assert!(outcome["candidate"]["id"].is_string(), "{outcome}");

    let read = client
        .call_tool(
            CallToolRequestParams::new("memory_read")
                .with_arguments(arguments(json!({"target": "project"}))),
        )
        .await
        .unwrap();
    assert_eq!(read.is_error, Some(false));
    let text = serde_json::to_string(&read.structured_content).unwrap();
    if outcome["applied"] == true {
        assert!(text.contains("cargo clippy"), "{text}");
    }

    let found = client
        .call_tool(
            CallToolRequestParams::new("experience_search")
                .with_arguments(arguments(json!({"query": "pnpm install", "limit": 5}))),
        )
        .await
        .unwrap();
    assert_eq!(found.is_error, Some(false), "{found:?}");
    assert!(found.structured_content.unwrap()["results"].is_array());

    // A failing call is a tool result the model can read, not a protocol error.
    let refused = client
        .call_tool(
            CallToolRequestParams::new("experience_search")
                .with_arguments(arguments(json!({"query": "x", "limit": 500}))),
        )
        .await
        .unwrap();
    assert_eq!(refused.is_error, Some(true));

    // Arguments that break the input schema are a malformed call: JSON-RPC -32602 naming the
    // failing field, not a tool result.
    for (arguments, field) in [
        (json!({"bogus": 1}), "bogus"),
        (json!({"target": "everything"}), "target"),
        (json!({"limit": "ten"}), "limit"),
    ] {
        let refused = client
            .call_tool(
                CallToolRequestParams::new("memory_read")
                    .with_arguments(self::arguments(arguments.clone())),
            )
            .await
            .expect_err("a schema violation is a protocol error");
        let rmcp::ServiceError::McpError(error) = refused else {
            panic!("{refused:?}");
        };
        assert_eq!(
            error.code,
            rmcp::model::ErrorCode::INVALID_PARAMS,
            "{arguments}"
        );
        assert_eq!(error.data, Some(json!({"field": field})), "{arguments}");
        assert!(
            error.message.contains(&format!("`{field}`")),
            "{}",
            error.message
        );
    }
    let missing = client
        .call_tool(
            CallToolRequestParams::new("experience_search")
                .with_arguments(self::arguments(json!({"limit": 5}))),
        )
        .await
        .expect_err("a missing required field");
    let rmcp::ServiceError::McpError(error) = missing else {
        panic!("{missing:?}");
    };
    assert_eq!(error.code, rmcp::model::ErrorCode::INVALID_PARAMS);
    assert_eq!(error.data, Some(json!({"field": "query"})));
    client.cancel().await.unwrap();
}

#[tokio::test]
async fn read_only_exposes_only_the_read_tools() {
    let db = TestDb::sqlite().await;
    let server = TestServer::start(&db, Config::default(), None).await;
    let (transport, _stderr) = TokioChildProcess::builder(mcp_command(&server, "p", true))
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let client = ().serve(transport).await.expect("initialize");
    let mut names: Vec<String> = client
        .list_all_tools()
        .await
        .unwrap()
        .into_iter()
        .map(|tool| tool.name.into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["experience_search", "memory_read"]);
    let refused = client
        .call_tool(CallToolRequestParams::new("memory_update").with_arguments(arguments(json!({
            "target": "project", "action": "add", "content": "x", "reason": "y", "confidence": 1.0
        }))))
        .await;
    assert!(
        refused.is_err(),
        "an unregistered tool is a protocol error: {refused:?}"
    );
    client.cancel().await.unwrap();
}
