//! The steps plans share: reading arguments, resolving attachments, calling the broker and turning
//! its answer into a tool text (texts and error texts as the TypeScript runner words them).

use serde_json::{Map, Value, json};

use super::format::s;
use super::lenient::{self, Shape};
use super::{Body, Method, Plan, Request, Response, ToolText, encode_component};

/// The paths of `attachments`, validated: absent or null → none.
pub(super) fn attachment_paths(
    tool: &str,
    args: &Map<String, Value>,
) -> Result<Vec<String>, ToolText> {
    match args.get("attachments") {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(items)) => items
            .iter()
            .map(|item| match item {
                Value::String(p) if !p.is_empty() => Ok(p.clone()),
                _ => Err(ToolText::error(format!(
                    "{tool}: `attachments` entries must be non-empty path strings"
                ))),
            })
            .collect(),
        Some(_) => Err(ToolText::error(format!(
            "{tool}: `attachments` must be an array of paths"
        ))),
    }
}

/// Looks each path up with `GET /fs/stat`, in order, and hands the attachment objects to `then`.
pub(super) fn resolve_attachments(
    tool: &'static str,
    mut paths: Vec<String>,
    then: impl FnOnce(Vec<Value>) -> Plan + Send + 'static,
) -> Plan {
    paths.reverse();
    resolve_next(tool, paths, Vec::new(), Box::new(then))
}

type Then = Box<dyn FnOnce(Vec<Value>) -> Plan + Send>;

fn resolve_next(
    tool: &'static str,
    mut rest: Vec<String>,
    mut done: Vec<Value>,
    then: Then,
) -> Plan {
    let Some(path) = rest.pop() else {
        return then(done);
    };
    request(Method::Get, stat_path(&path), Body::Empty, move |resp| {
        if resp.status == 404 {
            return fail(format!("{tool}: attachment not found: {path}"));
        }
        let entry = match broker_json(&resp) {
            Ok(body) => body["entry"].clone(),
            Err(error) => {
                return fail(format!(
                    "{tool}: attachment lookup failed for {path}: {}",
                    error.text
                ));
            }
        };
        if s(&entry["kind"]) == "directory" {
            return fail(format!("{tool}: attachment is a directory: {path}"));
        }
        let (Some(size), Some(mime)) = (entry["size"].as_u64(), entry["mimeType"].as_str()) else {
            return fail(format!("{tool}: attachment is corrupt: {path}"));
        };
        done.push(
            json!({"path": entry["path"], "name": entry["name"], "size": size, "mimeType": mime}),
        );
        resolve_next(tool, rest, done, then)
    })
}

/// A string argument; anything that is not a string reads as `""`.
pub(super) fn text(args: &Map<String, Value>, key: &str) -> String {
    args.get(key)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned()
}

/// The strings of an array argument (other items are skipped).
pub(super) fn strings(args: &Map<String, Value>, key: &str) -> Vec<String> {
    args.get(key)
        .map(string_list)
        .unwrap_or_default()
        .into_iter()
        .map(str::to_owned)
        .collect()
}

pub(super) fn string_list(v: &Value) -> Vec<&str> {
    v.as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

pub(super) fn stat_path(path: &str) -> String {
    format!("/fs/stat?path={}", encode_component(path))
}

pub(super) fn json_body(value: Value) -> Body {
    Body::Json(value)
}

pub(super) fn ok(text: impl Into<String>) -> Plan {
    Plan::Done(ToolText::ok(text))
}

pub(super) fn fail(text: impl Into<String>) -> Plan {
    Plan::Done(ToolText::error(text))
}

pub(super) fn request(
    method: Method,
    path: String,
    body: Body,
    then: impl FnOnce(Response) -> Plan + Send + 'static,
) -> Plan {
    Plan::Request(Request { method, path, body }, Box::new(then))
}

/// A request whose 2xx JSON answer goes to `then`; anything else ends the tool with the broker
/// error.
pub(super) fn call(
    method: Method,
    path: String,
    body: Body,
    then: impl FnOnce(Value) -> Plan + Send + 'static,
) -> Plan {
    request(method, path, body, move |resp| match broker_json(&resp) {
        Ok(value) => then(value),
        Err(error) => Plan::Done(error),
    })
}

pub(super) fn get(path: String, then: impl FnOnce(Value) -> Plan + Send + 'static) -> Plan {
    call(Method::Get, path, Body::Empty, then)
}

/// The JSON of a 2xx response (`null` for an empty body), or the tool error for anything else.
pub(super) fn broker_json(resp: &Response) -> Result<Value, ToolText> {
    match answer(resp)? {
        None => Ok(Value::Null),
        Some(body) => serde_json::from_slice(body).map_err(not_json),
    }
}

/// [`broker_json`] read as the lenient shape `T` (its empty value for an empty body), borrowing
/// from the response.
pub(super) fn broker_shape<'a, T: Shape<'a>>(resp: &'a Response) -> Result<T, ToolText> {
    match answer(resp)? {
        None => Ok(T::default()),
        Some(body) => lenient::read(body).map_err(not_json),
    }
}

/// The body of a 2xx response (`None` when empty), or the tool error for any other status.
fn answer(resp: &Response) -> Result<Option<&[u8]>, ToolText> {
    if !(200..300).contains(&resp.status) {
        return Err(broker_error(resp));
    }
    Ok((!resp.body.is_empty()).then_some(&resp.body[..]))
}

fn not_json(e: serde_json::Error) -> ToolText {
    ToolText::error(format!("broker sent a response that is not JSON: {e}"))
}

/// `broker error <status>: <body, or the status text when the body is empty>`.
pub(super) fn broker_error(resp: &Response) -> ToolText {
    let body = String::from_utf8_lossy(&resp.body);
    let detail = if body.trim().is_empty() {
        reason_phrase(resp.status).to_owned()
    } else {
        body.into_owned()
    };
    ToolText::error(format!("broker error {}: {detail}", resp.status))
}

fn reason_phrase(status: u16) -> &'static str {
    match status {
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        409 => "Conflict",
        410 => "Gone",
        413 => "Payload Too Large",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        _ => "",
    }
}
