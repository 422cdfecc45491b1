//! The three HTTP wire formats: request bodies and the parts of a success response learning
//! uses. The command-line kinds have no body (provider/cli.rs builds their argument vector).

use crate::config::ProviderApi;
use serde_json::{Map, Value, json};

use super::{LearningRequest, ResolvedModel, Usage};

/// A turn after the initial user prompt (only the repair adds any).
#[derive(Debug, Clone)]
pub(crate) enum Turn {
    Assistant(String),
    User(String),
}

/// The endpoint path below the base URL.
pub(crate) fn endpoint(api: ProviderApi) -> &'static str {
    match api {
        ProviderApi::OpenaiChat => "/chat/completions",
        ProviderApi::OpenaiResponses => "/responses",
        ProviderApi::AnthropicMessages => "/messages",
        // Not a path: what receipts show as the command-line kinds' "endpoint".
        ProviderApi::ClaudeCli => "claude -p --output-format json",
        ProviderApi::CodexCli => "codex exec --json",
    }
}

/// Body keys that carry the conversation rather than parameters; receipts record them as the
/// prompt instead.
pub(crate) fn conversation_keys(api: ProviderApi) -> &'static [&'static str] {
    match api {
        ProviderApi::OpenaiChat => &["messages"],
        ProviderApi::OpenaiResponses => &["instructions", "input"],
        ProviderApi::AnthropicMessages => &["system", "messages"],
        ProviderApi::ClaudeCli | ProviderApi::CodexCli => &[],
    }
}

/// The request body: model, the model's pass-through params, the conversation, exactly one
/// output-limit field, and the native schema option when enabled.
pub(crate) fn build_body(
    model: &ResolvedModel,
    request: &LearningRequest,
    turns: &[Turn],
) -> Value {
    let mut body = Map::new();
    body.insert(String::from("model"), Value::from(model.model.as_str()));
    for (key, value) in &model.params {
        body.insert(key.clone(), value.clone());
    }
    let mut conversation = vec![json!({ "role": "user", "content": request.user })];
    conversation.extend(turns.iter().map(|turn| match turn {
        Turn::Assistant(text) => json!({ "role": "assistant", "content": text }),
        Turn::User(text) => json!({ "role": "user", "content": text }),
    }));
    match model.api {
        ProviderApi::OpenaiChat => chat_fields(&mut body, model, request, conversation),
        ProviderApi::OpenaiResponses => responses_fields(&mut body, model, request, conversation),
        ProviderApi::AnthropicMessages => anthropic_fields(&mut body, model, request, conversation),
        // The prompt goes to the command's stdin and its flags carry the rest.
        ProviderApi::ClaudeCli | ProviderApi::CodexCli => {}
    }
    Value::Object(body)
}

/// Exactly one output-limit field, after the conversation (the order the APIs document).
fn insert_output_limit(body: &mut Map<String, Value>, model: &ResolvedModel) {
    body.insert(
        model.output_limit_field().to_owned(),
        Value::from(model.max_output_tokens),
    );
}

/// Chat Completions: the system prompt is the first message; the schema is `response_format`.
fn chat_fields(
    body: &mut Map<String, Value>,
    model: &ResolvedModel,
    request: &LearningRequest,
    mut conversation: Vec<Value>,
) {
    if !request.system.is_empty() {
        conversation.insert(0, json!({ "role": "system", "content": request.system }));
    }
    body.insert(String::from("messages"), Value::Array(conversation));
    insert_output_limit(body, model);
    if model.native_structured_output {
        body.insert(
            String::from("response_format"),
            json!({
                "type": "json_schema",
                "json_schema": {
                    "name": request.schema_name,
                    "schema": request.schema,
                    "strict": true,
                },
            }),
        );
    }
}

/// Responses: the system prompt is `instructions`; the schema is `text.format`.
fn responses_fields(
    body: &mut Map<String, Value>,
    model: &ResolvedModel,
    request: &LearningRequest,
    conversation: Vec<Value>,
) {
    if !request.system.is_empty() {
        body.insert(
            String::from("instructions"),
            Value::from(request.system.as_str()),
        );
    }
    body.insert(String::from("input"), Value::Array(conversation));
    insert_output_limit(body, model);
    // `text` may carry configured options (verbosity); only its `format` is ours.
    let mut text = match body.remove("text") {
        Some(Value::Object(text)) => text,
        _ => Map::new(),
    };
    text.remove("format");
    if model.native_structured_output {
        text.insert(
            String::from("format"),
            json!({
                "type": "json_schema",
                "name": request.schema_name,
                "schema": request.schema,
                "strict": true,
            }),
        );
    }
    if !text.is_empty() {
        body.insert(String::from("text"), Value::Object(text));
    }
}

/// Anthropic Messages: the system prompt is `system`; native structured output is one tool the
/// model is forced to call, whose `input` is the answer.
fn anthropic_fields(
    body: &mut Map<String, Value>,
    model: &ResolvedModel,
    request: &LearningRequest,
    conversation: Vec<Value>,
) {
    if !request.system.is_empty() {
        body.insert(String::from("system"), Value::from(request.system.as_str()));
    }
    body.insert(String::from("messages"), Value::Array(conversation));
    insert_output_limit(body, model);
    if model.native_structured_output {
        body.insert(
            String::from("tools"),
            json!([{
                "name": request.schema_name,
                "description": "Record the answer. Its input is the complete answer.",
                "input_schema": request.schema,
            }]),
        );
        body.insert(
            String::from("tool_choice"),
            json!({ "type": "tool", "name": request.schema_name }),
        );
    }
}

/// What learning takes from a success response.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Answer {
    /// The answer text (for a forced Anthropic tool, its input serialised).
    pub text: String,
    /// The already-structured answer of a forced Anthropic tool.
    pub structured: Option<Value>,
    pub usage: Usage,
}

/// Reads a success body. `None` when it is not the API's envelope at all.
pub(crate) fn read_answer(api: ProviderApi, schema_name: &str, body: &Value) -> Option<Answer> {
    let count = |value: Option<&Value>| value.and_then(Value::as_u64).unwrap_or(0);
    match api {
        ProviderApi::ClaudeCli | ProviderApi::CodexCli => None,
        ProviderApi::OpenaiChat => {
            let choices = body.get("choices")?.as_array()?;
            let message = choices.first().and_then(|choice| choice.get("message"));
            // An empty choice list or a null content (a refusal, a stray tool call) is an
            // empty answer, which the repair handles, not a broken envelope.
            let text = message
                .and_then(|m| m.get("content"))
                .map(content_text)
                .filter(|text| !text.is_empty())
                .or_else(|| message.and_then(|m| m.get("refusal")?.as_str().map(str::to_owned)))
                .unwrap_or_default();
            let usage = body.get("usage");
            Some(Answer {
                text,
                structured: None,
                usage: Usage {
                    input_tokens: count(usage.and_then(|u| u.get("prompt_tokens"))),
                    output_tokens: count(usage.and_then(|u| u.get("completion_tokens"))),
                },
            })
        }
        ProviderApi::OpenaiResponses => {
            let output = body.get("output")?.as_array()?;
            let mut text = String::new();
            for item in output.iter().filter(|item| item["type"] == "message") {
                for part in item
                    .get("content")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    match part["type"].as_str() {
                        Some("output_text") => text.push_str(part["text"].as_str().unwrap_or("")),
                        Some("refusal") => text.push_str(part["refusal"].as_str().unwrap_or("")),
                        _ => {}
                    }
                }
            }
            let usage = body.get("usage");
            Some(Answer {
                text,
                structured: None,
                usage: Usage {
                    input_tokens: count(usage.and_then(|u| u.get("input_tokens"))),
                    output_tokens: count(usage.and_then(|u| u.get("output_tokens"))),
                },
            })
        }
        ProviderApi::AnthropicMessages => {
            let content = body.get("content")?.as_array()?;
            let tool_input = content
                .iter()
                .find(|block| block["type"] == "tool_use" && block["name"] == schema_name)
                .and_then(|block| block.get("input"))
                .cloned();
            let text = match &tool_input {
                Some(input) => input.to_string(),
                None => content
                    .iter()
                    .filter(|block| block["type"] == "text")
                    .filter_map(|block| block["text"].as_str())
                    .collect(),
            };
            let usage = body.get("usage");
            Some(Answer {
                text,
                structured: tool_input,
                usage: Usage {
                    input_tokens: count(usage.and_then(|u| u.get("input_tokens"))),
                    output_tokens: count(usage.and_then(|u| u.get("output_tokens"))),
                },
            })
        }
    }
}

/// Chat content is a string, or (some compatible servers) a list of text parts.
fn content_text(content: &Value) -> String {
    match content {
        Value::String(text) => text.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|part| part.get("text").and_then(Value::as_str))
            .collect(),
        _ => String::new(),
    }
}
