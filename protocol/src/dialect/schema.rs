//! The JSON Schema subset tool input schemas use, for checking arguments before they are sent.
//!
//! Supported keywords: `type` (one or a list; `integer` is a number without a fraction),
//! `enum`, `const`, `properties`, `required`, `additionalProperties` (`false` or a schema),
//! `items`, `minItems`, `maxItems`, `minLength`, `maxLength` (in characters), `minimum`,
//! `maximum`, `exclusiveMinimum`, `exclusiveMaximum`, `anyOf`, `allOf`, `oneOf`, `not`, and the
//! boolean schemas `true` / `false`. Other keywords (`description`, `default`, `format`, `$schema`,
//! ...) are ignored, so a schema never rejects more than it says.

use std::fmt;

use serde_json::Value;

/// Why an instance does not match its schema.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchemaError {
    /// Where: `arguments`, `arguments.items[2]`, ...
    pub path: String,
    /// What.
    pub message: String,
}

impl fmt::Display for SchemaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.message)
    }
}

/// Checks `instance` against `schema`; `root` names the instance in error paths.
pub fn validate(schema: &Value, instance: &Value, root: &str) -> Result<(), SchemaError> {
    check(schema, instance, &mut root.to_owned())
}

fn fail(path: &str, message: String) -> Result<(), SchemaError> {
    Err(SchemaError {
        path: path.to_owned(),
        message,
    })
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn has_type(v: &Value, ty: &str) -> bool {
    match ty {
        "integer" => v.as_f64().is_some_and(|f| f.fract() == 0.0),
        "number" => v.is_number(),
        other => type_name(v) == other,
    }
}

fn check(schema: &Value, v: &Value, path: &mut String) -> Result<(), SchemaError> {
    let schema = match schema {
        Value::Bool(true) => return Ok(()),
        Value::Bool(false) => return fail(path, "no value is allowed here".into()),
        Value::Object(schema) => schema,
        _ => return Ok(()),
    };
    if let Some(ty) = schema.get("type") {
        let allowed: Vec<&str> = match ty {
            Value::String(t) => vec![t.as_str()],
            Value::Array(ts) => ts.iter().filter_map(Value::as_str).collect(),
            _ => Vec::new(),
        };
        if !allowed.is_empty() && !allowed.iter().any(|t| has_type(v, t)) {
            return fail(
                path,
                format!("expected {}, got {}", allowed.join(" or "), type_name(v)),
            );
        }
    }
    if let Some(Value::Array(options)) = schema.get("enum")
        && !options.contains(v)
    {
        let list: Vec<String> = options.iter().map(Value::to_string).collect();
        return fail(path, format!("{v} is not one of {}", list.join(", ")));
    }
    if let Some(expected) = schema.get("const")
        && expected != v
    {
        return fail(path, format!("expected {expected}"));
    }
    match v {
        Value::Object(map) => {
            if let Some(Value::Array(required)) = schema.get("required") {
                for name in required.iter().filter_map(Value::as_str) {
                    if !map.contains_key(name) {
                        return fail(path, format!("missing required property '{name}'"));
                    }
                }
            }
            let properties = schema.get("properties").and_then(Value::as_object);
            for (key, value) in map {
                let sub = properties.and_then(|p| p.get(key));
                let len = path.len();
                path.push('.');
                path.push_str(key);
                let result = match (sub, schema.get("additionalProperties")) {
                    (Some(sub), _) => check(sub, value, path),
                    (None, Some(Value::Bool(false))) => {
                        fail(&path[..len], format!("unexpected property '{key}'"))
                    }
                    (None, Some(extra)) => check(extra, value, path),
                    (None, None) => Ok(()),
                };
                path.truncate(len);
                result?;
            }
        }
        Value::Array(items) => {
            if let Some(min) = schema.get("minItems").and_then(Value::as_u64)
                && (items.len() as u64) < min
            {
                return fail(path, format!("expected at least {min} items"));
            }
            if let Some(max) = schema.get("maxItems").and_then(Value::as_u64)
                && (items.len() as u64) > max
            {
                return fail(path, format!("expected at most {max} items"));
            }
            if let Some(item_schema) = schema.get("items") {
                for (i, item) in items.iter().enumerate() {
                    let len = path.len();
                    path.push_str(&format!("[{i}]"));
                    let result = check(item_schema, item, path);
                    path.truncate(len);
                    result?;
                }
            }
        }
        Value::String(s) => {
            let chars = s.chars().count() as u64;
            if let Some(min) = schema.get("minLength").and_then(Value::as_u64)
                && chars < min
            {
                return fail(path, format!("expected at least {min} characters"));
            }
            if let Some(max) = schema.get("maxLength").and_then(Value::as_u64)
                && chars > max
            {
                return fail(path, format!("expected at most {max} characters"));
            }
        }
        Value::Number(n) => {
            let x = n.as_f64().unwrap_or(f64::NAN);
            let bound = |key: &str| schema.get(key).and_then(Value::as_f64);
            if let Some(min) = bound("minimum")
                && x < min
            {
                return fail(path, format!("{n} is less than {min}"));
            }
            if let Some(max) = bound("maximum")
                && x > max
            {
                return fail(path, format!("{n} is greater than {max}"));
            }
            if let Some(min) = bound("exclusiveMinimum")
                && x <= min
            {
                return fail(path, format!("{n} is not greater than {min}"));
            }
            if let Some(max) = bound("exclusiveMaximum")
                && x >= max
            {
                return fail(path, format!("{n} is not less than {max}"));
            }
        }
        Value::Null | Value::Bool(_) => {}
    }
    if let Some(Value::Array(all)) = schema.get("allOf") {
        for sub in all {
            check(sub, v, path)?;
        }
    }
    if let Some(Value::Array(any)) = schema.get("anyOf")
        && !any
            .iter()
            .any(|sub| check(sub, v, &mut path.clone()).is_ok())
    {
        return fail(path, "matches none of the allowed schemas (anyOf)".into());
    }
    if let Some(Value::Array(one)) = schema.get("oneOf") {
        let matching = one
            .iter()
            .filter(|sub| check(sub, v, &mut path.clone()).is_ok())
            .count();
        if matching != 1 {
            return fail(
                path,
                format!("matches {matching} of the oneOf schemas, expected exactly 1"),
            );
        }
    }
    if let Some(not) = schema.get("not")
        && check(not, v, &mut path.clone()).is_ok()
    {
        return fail(path, "matches a schema it must not match (not)".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn err(schema: Value, v: Value) -> String {
        validate(&schema, &v, "arguments").unwrap_err().to_string()
    }

    #[test]
    fn objects_required_types_and_extras() {
        let schema = json!({
            "type": "object",
            "properties": {
                "text": {"type": "string", "minLength": 1},
                "count": {"type": "integer", "minimum": 0, "maximum": 10},
                "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 2},
                "mode": {"enum": ["a", "b"]}
            },
            "required": ["text"],
            "additionalProperties": false
        });
        assert_eq!(
            validate(
                &schema,
                &json!({"text": "hi", "count": 3, "tags": ["x"], "mode": "a"}),
                "arguments"
            ),
            Ok(())
        );
        assert_eq!(
            err(schema.clone(), json!({})),
            "arguments: missing required property 'text'"
        );
        assert_eq!(
            err(schema.clone(), json!({"text": 5})),
            "arguments.text: expected string, got integer"
        );
        assert_eq!(
            err(schema.clone(), json!({"text": ""})),
            "arguments.text: expected at least 1 characters"
        );
        assert_eq!(
            err(schema.clone(), json!({"text": "x", "count": 2.5})),
            "arguments.count: expected integer, got number"
        );
        assert_eq!(
            err(schema.clone(), json!({"text": "x", "count": 11})),
            "arguments.count: 11 is greater than 10"
        );
        assert_eq!(
            err(schema.clone(), json!({"text": "x", "tags": ["a", 1]})),
            "arguments.tags[1]: expected string, got integer"
        );
        assert_eq!(
            err(
                schema.clone(),
                json!({"text": "x", "tags": ["a", "b", "c"]})
            ),
            "arguments.tags: expected at most 2 items"
        );
        assert_eq!(
            err(schema.clone(), json!({"text": "x", "mode": "c"})),
            "arguments.mode: \"c\" is not one of \"a\", \"b\""
        );
        assert_eq!(
            err(schema, json!({"text": "x", "other": 1})),
            "arguments: unexpected property 'other'"
        );
        assert_eq!(
            err(json!({"type": "object"}), json!([])),
            "arguments: expected object, got array"
        );
    }

    #[test]
    fn combinators_and_lenient_unknowns() {
        let schema = json!({"anyOf": [{"type": "string"}, {"type": "null"}], "format": "whatever", "description": "x"});
        assert_eq!(validate(&schema, &json!(null), "a"), Ok(()));
        assert!(validate(&schema, &json!(1), "a").is_err());
        let one = json!({"oneOf": [{"type": "number"}, {"type": "integer"}]});
        assert!(
            validate(&one, &json!(1), "a").is_err(),
            "an integer is also a number"
        );
        assert_eq!(validate(&one, &json!(1.5), "a"), Ok(()));
        assert!(validate(&json!({"not": {"type": "string"}}), &json!("s"), "a").is_err());
        assert!(validate(&json!(false), &json!(1), "a").is_err());
        assert_eq!(validate(&json!(true), &json!(1), "a"), Ok(()));
        assert_eq!(
            validate(&json!({"type": ["string", "integer"]}), &json!(3), "a"),
            Ok(())
        );
        assert_eq!(
            validate(&json!({"type": "integer"}), &json!(3.0), "a"),
            Ok(())
        );
    }
}
