use serde_json::json;

use super::*;

fn check(schema: &Value, arguments: &Value) -> Result<(), SchemaError> {
    ArgumentCheck::compile([("t", schema)])
        .expect("the schema compiles")
        .check("t", arguments)
}

/// `(keyword, schema, arguments, valid)`: each row as JSON Schema Draft 2020-12 has it, both
/// ways round. Rows marked `*` (21 of 54) are ones a
/// hand-written check of a subset of the keywords gets wrong.
#[rustfmt::skip]
fn table() -> Vec<(&'static str, Value, Value, bool)> {
    vec![
        ("type object", json!({"type": "object"}), json!({}), true),
        ("type object refuses array", json!({"type": "object"}), json!([]), false),
        ("type integer takes 3.0", json!({"properties": {"n": {"type": "integer"}}}), json!({"n": 3.0}), true),
        ("type integer refuses 2.5", json!({"properties": {"n": {"type": "integer"}}}), json!({"n": 2.5}), false),
        ("type list", json!({"properties": {"n": {"type": ["string", "null"]}}}), json!({"n": null}), true),
        ("* const 5 is 5.0", json!({"properties": {"n": {"const": 5}}}), json!({"n": 5.0}), true),
        ("const mismatch", json!({"properties": {"n": {"const": "a"}}}), json!({"n": "b"}), false),
        ("* enum 1 is 1.0", json!({"properties": {"n": {"enum": [1, "x"]}}}), json!({"n": 1.0}), true),
        ("enum mismatch", json!({"properties": {"n": {"enum": ["a", "b"]}}}), json!({"n": "c"}), false),
        ("required", json!({"required": ["a"]}), json!({}), false),
        ("* patternProperties with additionalProperties false",
            json!({"patternProperties": {"^x-": {"type": "string"}}, "additionalProperties": false}),
            json!({"x-a": "1"}), true),
        ("* patternProperties checks values",
            json!({"patternProperties": {"^x-": {"type": "string"}}}), json!({"x-a": 1}), false),
        ("additionalProperties false", json!({"properties": {"a": {}}, "additionalProperties": false}), json!({"b": 1}), false),
        ("additionalProperties schema", json!({"additionalProperties": {"type": "integer"}}), json!({"b": "x"}), false),
        ("* pattern", json!({"properties": {"s": {"pattern": "^[a-z]+$"}}}), json!({"s": "AB"}), false),
        ("pattern matches", json!({"properties": {"s": {"pattern": "^[a-z]+$"}}}), json!({"s": "ab"}), true),
        ("* $ref to $defs", json!({"$defs": {"n": {"type": "integer"}}, "properties": {"a": {"$ref": "#/$defs/n"}}}), json!({"a": "x"}), false),
        ("$ref to $defs passes", json!({"$defs": {"n": {"type": "integer"}}, "properties": {"a": {"$ref": "#/$defs/n"}}}), json!({"a": 1}), true),
        ("* uniqueItems", json!({"properties": {"l": {"uniqueItems": true}}}), json!({"l": [1, 1.0]}), false),
        ("uniqueItems distinct", json!({"properties": {"l": {"uniqueItems": true}}}), json!({"l": [1, "1"]}), true),
        ("minLength counts characters", json!({"properties": {"s": {"minLength": 2}}}), json!({"s": "é€"}), true),
        ("maxLength", json!({"properties": {"s": {"maxLength": 1}}}), json!({"s": "ab"}), false),
        ("minimum", json!({"properties": {"n": {"minimum": 1}}}), json!({"n": 0.5}), false),
        ("exclusiveMaximum", json!({"properties": {"n": {"exclusiveMaximum": 3}}}), json!({"n": 3}), false),
        ("* multipleOf", json!({"properties": {"n": {"multipleOf": 0.5}}}), json!({"n": 1.25}), false),
        ("items", json!({"properties": {"l": {"items": {"type": "string"}}}}), json!({"l": ["a", 2]}), false),
        ("prefixItems", json!({"properties": {"l": {"prefixItems": [{"type": "string"}], "items": false}}}), json!({"l": ["a", 1]}), false),
        ("* prefixItems passes", json!({"properties": {"l": {"prefixItems": [{"type": "string"}], "items": {"type": "integer"}}}}), json!({"l": ["a", 1]}), true),
        ("* contains", json!({"properties": {"l": {"contains": {"const": 1}}}}), json!({"l": [2, 3]}), false),
        ("* minContains", json!({"properties": {"l": {"contains": {"const": 1}, "minContains": 2}}}), json!({"l": [1, 2]}), false),
        ("minItems", json!({"properties": {"l": {"minItems": 1}}}), json!({"l": []}), false),
        ("* minProperties", json!({"minProperties": 1}), json!({}), false),
        ("* maxProperties", json!({"maxProperties": 1}), json!({"a": 1, "b": 2}), false),
        ("* propertyNames", json!({"propertyNames": {"maxLength": 2}}), json!({"abc": 1}), false),
        ("* dependentRequired", json!({"dependentRequired": {"a": ["b"]}}), json!({"a": 1}), false),
        ("dependentSchemas", json!({"dependentSchemas": {"a": {"required": ["c"]}}}), json!({"a": 1, "c": 2}), true),
        ("* if/then/else", json!({"if": {"required": ["a"]}, "then": {"required": ["b"]}, "else": {"required": ["c"]}}), json!({"a": 1}), false),
        ("if/then/else, else branch", json!({"if": {"required": ["a"]}, "then": {"required": ["b"]}, "else": {"required": ["c"]}}), json!({"c": 1}), true),
        ("anyOf", json!({"anyOf": [{"required": ["a"]}, {"required": ["b"]}]}), json!({"c": 1}), false),
        ("oneOf: both match", json!({"oneOf": [{"required": ["a"]}, {"required": ["b"]}]}), json!({"a": 1, "b": 2}), false),
        ("allOf", json!({"allOf": [{"required": ["a"]}, {"required": ["b"]}]}), json!({"a": 1}), false),
        ("not", json!({"not": {"required": ["a"]}}), json!({"a": 1}), false),
        ("* unevaluatedProperties", json!({"allOf": [{"properties": {"a": {}}}], "unevaluatedProperties": false}), json!({"a": 1, "b": 2}), false),
        ("unevaluatedProperties passes", json!({"allOf": [{"properties": {"a": {}}}], "unevaluatedProperties": false}), json!({"a": 1}), true),
        ("* unevaluatedItems", json!({"properties": {"l": {"prefixItems": [{}], "unevaluatedItems": false}}}), json!({"l": [1, 2]}), false),
        ("* $anchor", json!({"$defs": {"n": {"$anchor": "num", "type": "number"}}, "properties": {"a": {"$ref": "#num"}}}), json!({"a": "x"}), false),
        ("* recursive $ref", json!({"$defs": {"node": {"type": "object", "properties": {"next": {"$ref": "#/$defs/node"}}}}, "$ref": "#/$defs/node"}), json!({"next": {"next": 1}}), false),
        ("format is an annotation", json!({"properties": {"e": {"format": "email"}}}), json!({"e": "not an email"}), true),
        ("unknown keywords are ignored", json!({"x-vendor": {"a": 1}, "properties": {"a": {"description": "d", "default": 1, "examples": [1]}}}), json!({"a": "s"}), true),
        ("boolean schema false", json!({"properties": {"a": false}}), json!({"a": 1}), false),
        ("boolean schema true", json!({"properties": {"a": true}}), json!({"a": 1}), true),
        ("* draft-07 by $schema: items as a list", json!({"$schema": "http://json-schema.org/draft-07/schema#", "properties": {"l": {"items": [{"type": "string"}], "additionalItems": false}}}), json!({"l": ["a", "b"]}), false),
        ("draft-07 definitions", json!({"$schema": "http://json-schema.org/draft-07/schema#", "definitions": {"s": {"type": "string"}}, "properties": {"a": {"$ref": "#/definitions/s"}}}), json!({"a": "x"}), true),
        ("empty schema takes anything", json!({}), json!({"a": [1, {"b": null}]}), true),
    ]
}

#[test]
fn the_table_both_ways() {
    let rows = table();
    assert!(rows.len() >= 30);
    let mut wrong = Vec::new();
    for (name, schema, arguments, valid) in &rows {
        let got = check(schema, arguments);
        if got.is_ok() != *valid {
            wrong.push(format!("{name}: expected valid={valid}, got {got:?}"));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    let valid = rows.iter().filter(|r| r.3).count();
    assert!(
        valid >= 10 && rows.len() - valid >= 10,
        "both directions: {valid} valid rows of {}",
        rows.len()
    );
}

#[test]
fn failures_name_the_place_and_the_reason() {
    let schema = json!({
        "type": "object",
        "properties": {
            "text": {"type": "string", "minLength": 1},
            "tags": {"type": "array", "items": {"type": "string"}}
        },
        "required": ["text"],
        "additionalProperties": false
    });
    let text = |args: Value| check(&schema, &args).unwrap_err().to_string();
    assert_eq!(text(json!({})), "arguments: missing properties 'text'");
    assert_eq!(
        text(json!({"text": 5})),
        "arguments.text: want string, but got number"
    );
    assert_eq!(
        text(json!({"text": "x", "tags": ["a", 1]})),
        "arguments.tags[1]: want string, but got number"
    );
    assert_eq!(
        text(json!({"text": "x", "other": 1})),
        "arguments: additionalProperties 'other' not allowed"
    );
    // Several failures: the first names its place first, the others theirs.
    assert_eq!(
        text(json!({"text": "", "tags": [1], "x": 1})),
        "arguments.text: length must be >=1, but got 0; arguments.tags[0]: want string, but \
         got number; arguments: additionalProperties 'x' not allowed"
    );
}

#[test]
fn a_schema_that_is_not_json_schema_is_named() {
    let bad = json!({"type": "object", "properties": {"a": {"type": "text"}}});
    let err = ArgumentCheck::compile([("ok", &json!({})), ("broken", &bad)]).unwrap_err();
    assert_eq!(err.tool, "broken");
    assert!(
        err.to_string()
            .starts_with("tool 'broken': input_schema is not a usable JSON Schema: "),
        "{err}"
    );
    // Leniently compiled, the broken tool's calls are refused with the reason; the others work.
    let check = ArgumentCheck::compile_lenient([("ok", &json!({})), ("broken", &bad)]);
    assert_eq!(check.check("ok", &json!({"a": 1})), Ok(()));
    let refused = check.check("broken", &json!({})).unwrap_err();
    assert!(
        refused
            .message
            .starts_with("the tool's input_schema is not a usable JSON Schema"),
        "{refused}"
    );
}

#[test]
fn nothing_outside_the_schema_is_read() {
    let dir = std::env::temp_dir().join(format!("ac7-schema-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("s.json");
    std::fs::write(&file, r#"{"type": "integer"}"#).unwrap();
    for reference in [
        format!("file://{}", file.display()),
        "https://example.com/schema.json".to_owned(),
        "other.json".to_owned(),
    ] {
        let schema = json!({"properties": {"a": {"$ref": reference}}});
        let err = ArgumentCheck::compile([("t", &schema)]).unwrap_err();
        assert!(
            err.reason.contains("nothing is fetched"),
            "{reference}: {err}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_tool_without_a_schema_takes_any_object() {
    let check = ArgumentCheck::compile([("t", &json!({"type": "object"}))]).unwrap();
    assert_eq!(check.check("unknown", &json!({"a": 1})), Ok(()));
    assert_eq!(
        check.check("unknown", &json!([1])).unwrap_err().to_string(),
        "arguments: want object, but got array"
    );
}
