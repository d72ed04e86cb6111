//! Tool input schemas as JSON Schema, for checking arguments before they are sent.
//!
//! The schemas are compiled by [`boon`], a complete JSON Schema validator (Draft 2020-12 by
//! default; a schema naming another draft in `$schema` — 2019-09, 7, 6, 4 — is read as that
//! draft), so an argument is refused exactly when the schema says it is invalid: `const: 5`
//! accepts `5.0`, `patternProperties` counts for `additionalProperties`, `pattern`, `$ref`,
//! `$defs`, `uniqueItems`, `if`/`then`/`else`, `dependentRequired`, `unevaluatedProperties`
//! and the rest are all checked. `format` is an annotation, as Draft 2020-12 has it, never an
//! assertion: a schema never rejects more than it says.
//!
//! Nothing is fetched: a `$ref` must point inside the schema itself (or at a draft's own
//! metaschema, which the validator carries). A schema that is not valid JSON Schema, or that
//! refers to any other document, does not compile, and [`ArgumentCheck::compile`] names the tool
//! and the reason.

use std::collections::HashMap;
use std::fmt;

use boon::{Compiler, Draft, ErrorKind, SchemaIndex, Schemas, UrlLoader, ValidationError};
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

/// A tool's `input_schema` could not be compiled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompileError {
    /// The tool.
    pub tool: String,
    /// Why, in the validator's words.
    pub reason: String,
}

impl fmt::Display for CompileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "tool '{}': input_schema is not a usable JSON Schema: {}",
            self.tool, self.reason
        )
    }
}

/// Refuses every document: schemas are checked offline, against themselves only.
struct NoFetch;

impl UrlLoader for NoFetch {
    fn load(&self, url: &str) -> Result<Value, Box<dyn std::error::Error>> {
        Err(format!("{url} is outside the schema, and nothing is fetched").into())
    }
}

/// The compiled input schemas of a set of tools.
pub struct ArgumentCheck {
    schemas: Schemas,
    tools: HashMap<String, Result<SchemaIndex, String>>,
}

impl fmt::Debug for ArgumentCheck {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ArgumentCheck")
            .field("tools", &self.tools.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl ArgumentCheck {
    /// Compiles each `(name, input_schema)`; the first that does not compile is the error.
    pub fn compile<'a>(
        tools: impl IntoIterator<Item = (&'a str, &'a Value)>,
    ) -> Result<Self, CompileError> {
        let check = Self::compile_lenient(tools);
        for (tool, compiled) in &check.tools {
            if let Err(reason) = compiled {
                return Err(CompileError {
                    tool: tool.clone(),
                    reason: reason.clone(),
                });
            }
        }
        Ok(check)
    }

    /// Compiles each `(name, input_schema)`, keeping the reason a schema did not compile: every
    /// call of such a tool is then refused with that reason ([`ArgumentCheck::check`]).
    pub fn compile_lenient<'a>(tools: impl IntoIterator<Item = (&'a str, &'a Value)>) -> Self {
        let mut schemas = Schemas::new();
        let mut out = HashMap::new();
        for (i, (name, schema)) in tools.into_iter().enumerate() {
            let compiled = compile_one(&mut schemas, i, schema);
            out.insert(name.to_owned(), compiled);
        }
        Self {
            schemas,
            tools: out,
        }
    }

    /// Checks the `arguments` of a call of `tool`. A tool without a schema here takes any
    /// object.
    pub fn check(&self, tool: &str, arguments: &Value) -> Result<(), SchemaError> {
        match self.tools.get(tool) {
            None if arguments.is_object() => Ok(()),
            None => Err(SchemaError {
                path: ROOT.into(),
                message: format!(
                    "want object, but got {}",
                    crate::codec::json::kind_name(arguments)
                ),
            }),
            Some(Err(reason)) => Err(SchemaError {
                path: ROOT.into(),
                message: format!("the tool's input_schema is not a usable JSON Schema: {reason}"),
            }),
            Some(Ok(index)) => self
                .schemas
                .validate(arguments, *index)
                .map_err(|e| describe(&e)),
        }
    }
}

/// The instance's name in error paths.
const ROOT: &str = "arguments";

fn compile_one(schemas: &mut Schemas, i: usize, schema: &Value) -> Result<SchemaIndex, String> {
    let mut compiler = Compiler::new();
    compiler.set_default_draft(Draft::V2020_12);
    compiler.use_loader(Box::new(NoFetch));
    let url = format!("ac7://tool-input-schema/{i}.json");
    let reason = |e: boon::CompileError| one_line(&format!("{e:#}"));
    compiler
        .add_resource(&url, schema.clone())
        .map_err(reason)?;
    compiler.compile(&url, schemas).map_err(reason)
}

/// The validator's multi-line texts, on one line.
fn one_line(text: &str) -> String {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("; ")
}

/// At most this many failures are named.
const MAX_NAMED: usize = 3;

/// The failures that say what is wrong: wrappers (a `$ref`, `allOf`, the schema itself) are
/// looked through; anything else (including `anyOf`/`oneOf`, whose alternatives all failed) is
/// one failure, at its place in the arguments.
fn describe(error: &ValidationError<'_, '_>) -> SchemaError {
    let mut found: Vec<&ValidationError<'_, '_>> = Vec::new();
    let mut total = 0usize;
    collect(error, &mut found, &mut total);
    let first = found.first().copied().unwrap_or(error);
    let mut message = found
        .iter()
        .enumerate()
        .map(|(i, e)| {
            if i == 0 {
                e.kind.to_string()
            } else {
                format!("{}: {}", path(e), e.kind)
            }
        })
        .collect::<Vec<_>>()
        .join("; ");
    if total > found.len() {
        message.push_str(&format!(" (and {} more)", total - found.len()));
    }
    SchemaError {
        path: path(first),
        message,
    }
}

fn collect<'e, 's, 'v>(
    e: &'e ValidationError<'s, 'v>,
    found: &mut Vec<&'e ValidationError<'s, 'v>>,
    total: &mut usize,
) {
    let wrapper = matches!(
        e.kind,
        ErrorKind::Group
            | ErrorKind::Schema { .. }
            | ErrorKind::Reference { .. }
            | ErrorKind::AllOf
    );
    if wrapper && !e.causes.is_empty() {
        for cause in &e.causes {
            collect(cause, found, total);
        }
        return;
    }
    *total += 1;
    if found.len() < MAX_NAMED {
        found.push(e);
    }
}

/// `arguments.items[2].name` for the instance location `/items/2/name`.
fn path(e: &ValidationError<'_, '_>) -> String {
    let mut out = String::from(ROOT);
    for token in &e.instance_location.tokens {
        match token {
            boon::InstanceToken::Prop(name) => {
                out.push('.');
                out.push_str(name);
            }
            boon::InstanceToken::Item(i) => out.push_str(&format!("[{i}]")),
        }
    }
    out
}

#[cfg(test)]
mod tests;
