//! The part of JSON Schema (draft 07) the Codex hook schemas use, to build hook payloads from
//! the input schemas and check hook answers against the output schemas: `type`, `const`,
//! `enum`, `required`, `properties`, `additionalProperties: false`, `$ref` into `definitions`,
//! `anyOf`, `allOf`, `if`/`then`, `pattern` and the `true` schema.

use serde_json::{Map, Value};

/// A schema file from the corpus (`codex-hooks-schema/<name>.schema.json`).
pub fn codex_schema(name: &str) -> Value {
    let path = crate::fixtures::corpus()
        .join("codex-hooks-schema")
        .join(format!("{name}.schema.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).expect("a JSON schema")
}

/// The violations of `value` against `schema` (empty when it conforms), each naming its path.
pub fn violations(schema: &Value, value: &Value) -> Vec<String> {
    let mut found = Vec::new();
    check(schema, schema, value, "$", &mut found);
    found
}

fn resolve<'a>(root: &'a Value, schema: &'a Value) -> &'a Value {
    match schema.get("$ref").and_then(Value::as_str) {
        Some(reference) => {
            let name = reference
                .strip_prefix("#/definitions/")
                .unwrap_or_else(|| panic!("unsupported $ref {reference}"));
            &root["definitions"][name]
        }
        None => schema,
    }
}

fn type_matches(expected: &str, value: &Value) -> bool {
    match expected {
        "string" => value.is_string(),
        "boolean" => value.is_boolean(),
        "null" => value.is_null(),
        "object" => value.is_object(),
        "array" => value.is_array(),
        "number" => value.is_number(),
        "integer" => value.is_i64() || value.is_u64(),
        other => panic!("unsupported type {other}"),
    }
}

fn check(root: &Value, schema: &Value, value: &Value, path: &str, found: &mut Vec<String>) {
    if schema == &Value::Bool(true) {
        return;
    }
    let schema = resolve(root, schema);
    match schema.get("type") {
        Some(Value::String(kind)) if !type_matches(kind, value) => {
            found.push(format!("{path}: not a {kind}"));
            return;
        }
        Some(Value::Array(kinds))
            if !kinds
                .iter()
                .any(|k| type_matches(k.as_str().unwrap_or(""), value)) =>
        {
            found.push(format!("{path}: not one of {kinds:?}"));
            return;
        }
        _ => {}
    }
    if let Some(expected) = schema.get("const")
        && expected != value
    {
        found.push(format!("{path}: must be {expected}"));
    }
    if let Some(options) = schema.get("enum").and_then(Value::as_array)
        && !options.contains(value)
    {
        found.push(format!("{path}: not in {options:?}"));
    }
    if let (Some(pattern), Some(text)) = (
        schema.get("pattern").and_then(Value::as_str),
        value.as_str(),
    ) && !regex::Regex::new(pattern).expect("pattern").is_match(text)
    {
        found.push(format!("{path}: does not match {pattern}"));
    }
    if let Some(any) = schema.get("anyOf").and_then(Value::as_array)
        && !any
            .iter()
            .any(|option| violations_in(root, option, value, path).is_empty())
    {
        found.push(format!("{path}: matches none of anyOf"));
    }
    for part in schema
        .get("allOf")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        if let Some(condition) = part.get("if") {
            if violations_in(root, condition, value, path).is_empty()
                && let Some(then) = part.get("then")
            {
                check(root, then, value, path, found);
            }
        } else {
            check(root, part, value, path, found);
        }
    }
    let Some(object) = value.as_object() else {
        return;
    };
    for name in schema
        .get("required")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let name = name.as_str().unwrap_or_default();
        if !object.contains_key(name) {
            found.push(format!("{path}: missing `{name}`"));
        }
    }
    let properties = schema.get("properties").and_then(Value::as_object);
    for (name, item) in object {
        match properties.and_then(|p| p.get(name)) {
            Some(property) => check(root, property, item, &format!("{path}.{name}"), found),
            None if schema.get("additionalProperties") == Some(&Value::Bool(false)) => {
                found.push(format!("{path}: unexpected `{name}`"));
            }
            None => {}
        }
    }
}

fn violations_in(root: &Value, schema: &Value, value: &Value, path: &str) -> Vec<String> {
    let mut found = Vec::new();
    check(root, schema, value, path, &mut found);
    found
}

/// A payload for `schema`: every required property, from `values` when given there, else the
/// schema's `const`, first `enum` value, `null` for a nullable string, an empty string or
/// `false`. Panics if `values` names a property the schema does not have, or if the payload
/// does not conform.
pub fn payload(schema: &Value, values: &Value) -> Value {
    let properties = schema["properties"].as_object().expect("properties");
    for name in values.as_object().expect("values").keys() {
        assert!(
            properties.contains_key(name),
            "`{name}` is not in the schema {}",
            schema["title"]
        );
    }
    let mut out = Map::new();
    for name in schema["required"].as_array().expect("required") {
        let name = name.as_str().unwrap();
        let value = values.get(name).cloned().unwrap_or_else(|| {
            let property = resolve(schema, &properties[name]);
            if let Some(constant) = property.get("const") {
                return constant.clone();
            }
            if let Some(first) = property.get("enum").and_then(|e| e.get(0)) {
                return first.clone();
            }
            match property.get("type") {
                Some(Value::Array(kinds)) if kinds.contains(&Value::from("null")) => Value::Null,
                Some(Value::String(kind)) if kind == "boolean" => Value::Bool(false),
                Some(Value::String(kind)) if kind == "string" => Value::from(""),
                _ => Value::Object(Map::new()),
            }
        });
        out.insert(name.to_owned(), value);
    }
    let payload = Value::Object(out);
    let problems = violations(schema, &payload);
    assert!(problems.is_empty(), "{problems:?}");
    payload
}
