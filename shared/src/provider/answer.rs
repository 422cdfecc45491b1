//! Decoding a model's answer text into JSON, locally.

use serde_json::Value;

/// Parses answer text as JSON: the whole text, else the first fenced block (```json … ```),
/// else the outermost `{…}` span (models like to announce "Here is the JSON:").
pub(crate) fn decode_json(text: &str) -> Result<Value, String> {
    let trimmed = text.trim();
    if trimmed.is_empty() {
        return Err(String::from("the answer is empty"));
    }
    let whole = serde_json::from_str::<Value>(trimmed);
    let first_error = match whole {
        Ok(value) => return Ok(value),
        Err(error) => error,
    };
    if let Some(fenced) = fenced_block(trimmed)
        && let Ok(value) = serde_json::from_str(fenced.trim())
    {
        return Ok(value);
    }
    if let (Some(start), Some(end)) = (trimmed.find('{'), trimmed.rfind('}'))
        && start < end
        && let Ok(value) = serde_json::from_str(&trimmed[start..=end])
    {
        return Ok(value);
    }
    Err(format!("the answer is not valid JSON ({first_error})"))
}

/// The body of the first ``` fence, without its language tag.
fn fenced_block(text: &str) -> Option<&str> {
    let open = text.find("```")?;
    let after_fence = &text[open + 3..];
    // The info string ("json") runs to the end of the fence line.
    let body_start = after_fence.find('\n').map_or(0, |newline| newline + 1);
    let body = &after_fence[body_start..];
    let close = body.find("```")?;
    Some(&body[..close])
}

/// Checks the top level of `value` against the top level of `schema`: its `type`
/// (object/array) and, for objects, the `required` keys. Deeper validation belongs to the
/// caller's validator, which knows the Rust type it will deserialize into.
pub(crate) fn check_top_level(schema: &Value, value: &Value) -> Result<(), String> {
    match schema.get("type").and_then(Value::as_str) {
        Some("object") => {
            let Some(object) = value.as_object() else {
                return Err(format!(
                    "expected a JSON object at the top level, got {}",
                    kind(value)
                ));
            };
            let missing: Vec<&str> = schema
                .get("required")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .filter(|key| !object.contains_key(*key))
                .collect();
            if missing.is_empty() {
                Ok(())
            } else {
                Err(format!("missing required keys: {}", missing.join(", ")))
            }
        }
        Some("array") if !value.is_array() => Err(format!(
            "expected a JSON array at the top level, got {}",
            kind(value)
        )),
        _ => Ok(()),
    }
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn decodes_plain_fenced_and_wrapped_json() {
        assert_eq!(decode_json(r#" {"a":1} "#), Ok(json!({"a": 1})));
        assert_eq!(decode_json("```json\n{\"a\": 1}\n```"), Ok(json!({"a": 1})));
        assert_eq!(
            decode_json("Here you go:\n```\n{\"a\": 1}\n```\nDone."),
            Ok(json!({"a": 1}))
        );
        assert_eq!(
            decode_json("Here is the JSON: {\"a\": 1} — hope it helps"),
            Ok(json!({"a": 1}))
        );
        assert!(decode_json("not json").is_err());
        assert!(decode_json("").is_err());
    }

    #[test]
    fn top_level_shape() {
        let schema = json!({"type": "object", "required": ["experiences", "memories"]});
        assert!(check_top_level(&schema, &json!({"experiences": [], "memories": []})).is_ok());
        assert_eq!(
            check_top_level(&schema, &json!({"experiences": []})),
            Err(String::from("missing required keys: memories"))
        );
        assert!(check_top_level(&schema, &json!([1])).is_err());
    }
}
