//! Operator commands over member activity: `ac7 activity <member>` (one line per
//! model exchange, optionally one objective's, optionally following live) and
//! `ac7 usage` (tokens per member and per objective over a time range).
//!
//! Both read the broker's activity endpoints, so the caller needs
//! `activity.read` (or is looking at itself).

use std::collections::BTreeMap;

use anyhow::bail;
use clap::Args;
use futures_util::StreamExt;
use reqwest::Method;
use serde_json::{Value, json};

use crate::operator::{Client, OperatorConn, block_on, format_ts, out};

/// `ac7 activity`.
#[derive(Debug, Args)]
pub struct ActivityArgs {
    #[command(flatten)]
    conn: OperatorConn,
    /// The member whose activity to show.
    member: String,
    /// Only the exchanges made while the member worked on this objective.
    #[arg(long, value_name = "ID")]
    objective: Option<String>,
    /// After the recent exchanges, keep printing new ones as they arrive (Ctrl-C stops).
    #[arg(long)]
    follow: bool,
    /// How many recent exchanges to print first (default 50, at most 1000).
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..=1000))]
    limit: u32,
}

/// `ac7 usage`.
#[derive(Debug, Args)]
pub struct UsageArgs {
    #[command(flatten)]
    conn: OperatorConn,
    /// Start of the range: epoch ms, or an age like `30m`, `24h`, `7d` (default: everything).
    #[arg(long, value_name = "WHEN", value_parser = parse_when)]
    since: Option<i64>,
    /// End of the range: epoch ms, or an age like `1h` (default: now).
    #[arg(long, value_name = "WHEN", value_parser = parse_when)]
    until: Option<i64>,
    /// Only this member (repeatable; default: every member of the team).
    #[arg(long = "member", value_name = "NAME")]
    members: Vec<String>,
}

/// `WHEN`: epoch milliseconds, or `<n>ms|s|m|h|d` meaning that long ago.
fn parse_when(s: &str) -> Result<i64, String> {
    let s = s.trim();
    if let Ok(ms) = s.parse::<i64>() {
        return Ok(ms);
    }
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (n, unit) = s.split_at(split);
    let n: i64 = n
        .parse()
        .map_err(|_| format!("`{s}` is neither epoch ms nor an age like 30m, 24h, 7d"))?;
    let unit_ms = match unit.trim() {
        "ms" => 1,
        "s" => 1000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return Err(format!("unknown unit in `{s}`: use ms, s, m, h or d")),
    };
    Ok(crate::sys::clock::now_ms().saturating_sub(n.saturating_mul(unit_ms)))
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or(0)
}

/// One line for an exchange row (`None` for markers).
pub fn exchange_line(row: &Value) -> Option<String> {
    let ev = &row["event"];
    let when = format_ts(ev["ts"].as_i64().unwrap_or(0));
    let duration = u(&ev["duration"]);
    match ev["kind"].as_str()? {
        "llm_exchange" => {
            let entry = &ev["entry"];
            let model = entry["request"]["model"].as_str().unwrap_or("?");
            let resp = &entry["response"];
            let usage = &resp["usage"];
            let stop = resp["stopReason"]
                .as_str()
                .map(str::to_owned)
                .or_else(|| resp["status"].as_u64().map(|s| format!("http {s}")))
                .unwrap_or_else(|| "no response".to_owned());
            Some(format!(
                "{when}  {model}  in {} out {} cache {}w/{}r  {stop}  {duration} ms",
                u(&usage["inputTokens"]),
                u(&usage["outputTokens"]),
                u(&usage["cacheCreationInputTokens"]),
                u(&usage["cacheReadInputTokens"]),
            ))
        }
        "opaque_http" => {
            let entry = &ev["entry"];
            let status = entry["status"]
                .as_u64()
                .map_or_else(|| "no response".to_owned(), |s| s.to_string());
            Some(format!(
                "{when}  {} {}{}  {status}  {duration} ms",
                entry["method"].as_str().unwrap_or("?"),
                entry["host"].as_str().unwrap_or("?"),
                entry["url"].as_str().unwrap_or(""),
            ))
        }
        _ => None,
    }
}

fn rows(v: &Value) -> Vec<Value> {
    v["activity"].as_array().cloned().unwrap_or_default()
}

/// `ac7 activity`.
#[allow(clippy::print_stdout)]
pub fn activity(args: ActivityArgs) -> anyhow::Result<i32> {
    let client = Client::new(&args.conn)?;
    let limit = args.limit.to_string();
    let member = args.member.clone();
    let v = match &args.objective {
        None => block_on(client.call(
            Method::GET,
            &format!(
                "/members/{}/activity",
                ac7_protocol::domain::toolbox::encode_component(&member)
            ),
            &[
                ("kind", "llm_exchange".to_owned()),
                ("kind", "opaque_http".to_owned()),
                ("limit", limit),
            ],
            None,
        ))?,
        Some(id) => {
            // Across assignees: keep this member's rows.
            let mut v = block_on(client.call(
                Method::GET,
                &format!("/objectives/{id}/activity"),
                &[("limit", "1000".to_owned())],
                None,
            ))?;
            let mine: Vec<Value> = rows(&v)
                .into_iter()
                .filter(|r| r["memberName"] == member.as_str())
                .take(args.limit as usize)
                .collect();
            v["activity"] = Value::Array(mine);
            v
        }
    };
    let recent = rows(&v);
    if recent.is_empty() {
        // The broker answers an empty list for a name nobody has; say which it is.
        let roster = block_on(client.call(Method::GET, "/roster", &[], None))?;
        let known = roster["teammates"]
            .as_array()
            .is_some_and(|all| all.iter().any(|t| t["name"] == member.as_str()));
        if !known {
            bail!("no such member: {member} (`ac7 roster` lists the team)");
        }
    }
    out(&args.conn, &v, |_| {
        let lines: Vec<String> = recent.iter().rev().filter_map(exchange_line).collect();
        if lines.is_empty() {
            "(no exchanges)".to_owned()
        } else {
            lines.join("\n")
        }
    });
    if !args.follow {
        return Ok(0);
    }
    let last = recent.first().and_then(|r| r["id"].as_u64());
    block_on(follow(
        &client,
        &args.conn,
        &member,
        last,
        args.objective.as_deref(),
    ))?;
    Ok(0)
}

/// Prints one row of the live stream (with `--objective`, only while that objective is open).
#[allow(clippy::print_stdout)]
fn emit(row: &Value, conn: &OperatorConn, objective: Option<&str>, open: &mut bool) {
    if row.get("type").is_some() {
        return; // a reset: the recent rows were printed already
    }
    let ev = &row["event"];
    if let Some(id) = objective {
        match ev["kind"].as_str() {
            Some("objective_open") if ev["objectiveId"] == id => *open = true,
            Some("objective_close") if ev["objectiveId"] == id => *open = false,
            _ => {}
        }
        if !*open {
            return;
        }
    }
    if conn.json {
        println!("{row}");
    } else if let Some(line) = exchange_line(row) {
        println!("{line}");
    }
}

/// Prints rows from the live stream until it ends: server-sent events, or a WebSocket when
/// the broker answers the SSE request with something else.
async fn follow(
    client: &Client,
    conn: &OperatorConn,
    member: &str,
    last: Option<u64>,
    objective: Option<&str>,
) -> anyhow::Result<()> {
    let path = format!(
        "/members/{}/activity/stream",
        ac7_protocol::domain::toolbox::encode_component(member)
    );
    let mut req = client
        .broker
        .builder(Method::GET, &path)
        .header("accept", "text/event-stream")
        .timeout(std::time::Duration::from_secs(365 * 86_400));
    if let Some(id) = last {
        req = req.header("last-event-id", id.to_string());
    }
    let resp = match req.send().await {
        Ok(resp) => resp,
        Err(e) => return Err(crate::operator::explain_unreachable(&client.broker, e).await),
    };
    let status = resp.status();
    let content_type = resp
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    if status.is_client_error() {
        let text = resp.text().await.unwrap_or_default();
        bail!(
            "following {member}'s activity failed ({}): {text}",
            status.as_u16()
        );
    }
    let mut open = false;
    if !(status.is_success() && content_type.starts_with("text/event-stream")) {
        drop(resp);
        let sse = format!(
            "{} {}",
            status.as_u16(),
            if content_type.is_empty() {
                "without a content type"
            } else {
                &content_type
            }
        );
        return follow_ws(client, &path, last, |row| {
            emit(row, conn, objective, &mut open);
        })
        .await
        .map_err(|ws| {
            anyhow::anyhow!(
                "the broker at {} does not stream {member}'s activity: {path} answered {sse} \
                 instead of server-sent events, and a WebSocket on it failed ({ws}). \
                 `ac7 activity {member}` without --follow shows the recent exchanges",
                client.base()
            )
        });
    }
    let mut buf = String::new();
    let mut body = resp.bytes_stream();
    while let Some(chunk) = body.next().await {
        buf.push_str(&String::from_utf8_lossy(&chunk?));
        while let Some(i) = buf.find("\n\n") {
            let block: String = buf.drain(..i + 2).collect();
            let Some(data) = block.lines().find_map(|l| l.strip_prefix("data: ")) else {
                continue;
            };
            if let Ok(row) = serde_json::from_str::<Value>(data) {
                emit(&row, conn, objective, &mut open);
            }
        }
    }
    Ok(())
}

/// The live stream as a WebSocket (one row per text frame) until the broker closes it; `Err`
/// with the reason when it cannot be opened.
async fn follow_ws(
    client: &Client,
    path: &str,
    last: Option<u64>,
    mut each: impl FnMut(&Value),
) -> Result<(), String> {
    use tokio_tungstenite::tungstenite::{self, client::IntoClientRequest};
    let mut url = format!(
        "{}{path}",
        client
            .base()
            .trim_end_matches('/')
            .replacen("http", "ws", 1)
    );
    if let Some(id) = last {
        url.push_str(&format!("?lastEventId={id}"));
    }
    let mut request = url
        .as_str()
        .into_client_request()
        .map_err(|e| e.to_string())?;
    let headers = request.headers_mut();
    if let Ok(v) = format!("Bearer {}", client.broker.token()).parse() {
        headers.insert("Authorization", v);
    }
    if let Ok(v) = "1".parse() {
        headers.insert("X-AC7-Protocol", v);
    }
    let (mut socket, _) = crate::sys::tls_client::connect_ws(request)
        .await
        .map_err(|e| e.to_string())?;
    while let Some(frame) = socket.next().await {
        match frame {
            Ok(tungstenite::Message::Text(text)) => {
                if let Ok(row) = serde_json::from_str::<Value>(&text) {
                    each(&row);
                }
            }
            Ok(tungstenite::Message::Close(_)) | Err(_) => break,
            Ok(_) => {}
        }
    }
    Ok(())
}

/// Token counts.
#[derive(Debug, Default, Clone, Copy)]
struct Tokens {
    exchanges: u64,
    input: u64,
    output: u64,
    cache_write: u64,
    cache_read: u64,
}

impl Tokens {
    fn add(&mut self, usage: &Value) {
        self.exchanges += 1;
        self.input += u(&usage["inputTokens"]);
        self.output += u(&usage["outputTokens"]);
        self.cache_write += u(&usage["cacheCreationInputTokens"]);
        self.cache_read += u(&usage["cacheReadInputTokens"]);
    }

    fn json(&self) -> Value {
        json!({"exchanges": self.exchanges, "inputTokens": self.input, "outputTokens": self.output,
               "cacheCreationInputTokens": self.cache_write, "cacheReadInputTokens": self.cache_read})
    }

    fn line(&self, who: &str) -> String {
        format!(
            "{who:<24} {:>6} {:>12} {:>12} {:>12} {:>12}",
            self.exchanges, self.input, self.output, self.cache_write, self.cache_read
        )
    }
}

/// Every row of `member` matching `query`, oldest first (pages of 1000).
async fn all_rows(
    client: &Client,
    member: &str,
    query: &[(&str, String)],
) -> anyhow::Result<Vec<Value>> {
    let mut got = Vec::new();
    let mut before: Option<u64> = None;
    loop {
        let mut q = query.to_vec();
        q.push(("limit", "1000".to_owned()));
        if let Some(b) = before {
            q.push(("before_id", b.to_string()));
        }
        let page = rows(
            &client
                .call(
                    Method::GET,
                    &format!(
                        "/members/{}/activity",
                        ac7_protocol::domain::toolbox::encode_component(member)
                    ),
                    &q,
                    None,
                )
                .await?,
        );
        let n = page.len();
        before = page.last().and_then(|r| r["id"].as_u64());
        got.extend(page);
        if n < 1000 || before.is_none() {
            break;
        }
    }
    got.reverse();
    Ok(got)
}

/// `ac7 usage`.
pub fn usage(args: UsageArgs) -> anyhow::Result<i32> {
    let client = Client::new(&args.conn)?;
    let (since, until) = (args.since, args.until);
    let (per_member, per_objective) = block_on(async {
        let members = if args.members.is_empty() {
            let roster = client.call(Method::GET, "/roster", &[], None).await?;
            roster["teammates"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|t| t["name"].as_str().map(str::to_owned))
                .collect()
        } else {
            args.members.clone()
        };
        let mut per_member: BTreeMap<String, Tokens> = BTreeMap::new();
        let mut per_objective: BTreeMap<String, Tokens> = BTreeMap::new();
        for m in members {
            let mut q = vec![
                ("kind", "llm_exchange".to_owned()),
                ("kind", "objective_open".to_owned()),
                ("kind", "objective_close".to_owned()),
            ];
            if let Some(u) = until {
                q.push(("to", u.to_string()));
            }
            // Markers from all time (an objective opened before `since` still counts);
            // exchanges before `since` are skipped below.
            let mut open: Vec<String> = Vec::new();
            let total = per_member.entry(m.clone()).or_default();
            for row in all_rows(&client, &m, &q).await? {
                let ev = &row["event"];
                let id = ev["objectiveId"].as_str().unwrap_or("").to_owned();
                match ev["kind"].as_str() {
                    Some("objective_open") if !open.contains(&id) => open.push(id),
                    Some("objective_close") => open.retain(|o| *o != id),
                    Some("llm_exchange") if since.is_none_or(|s| ev["ts"].as_i64() >= Some(s)) => {
                        let usage = &ev["entry"]["response"]["usage"];
                        total.add(usage);
                        for o in &open {
                            per_objective.entry(o.clone()).or_default().add(usage);
                        }
                    }
                    _ => {}
                }
            }
        }
        Ok((per_member, per_objective))
    })?;
    let value = json!({
        "since": since, "until": until,
        "members": per_member.iter().map(|(k, t)| (k.clone(), t.json())).collect::<serde_json::Map<_, _>>(),
        "objectives": per_objective.iter().map(|(k, t)| (k.clone(), t.json())).collect::<serde_json::Map<_, _>>(),
    });
    out(&args.conn, &value, |_| {
        let head = format!(
            "{:<24} {:>6} {:>12} {:>12} {:>12} {:>12}",
            "", "calls", "input", "output", "cache write", "cache read"
        );
        let mut lines = vec![format!("by member\n{head}")];
        lines.extend(per_member.iter().map(|(k, t)| t.line(k)));
        lines.push(format!("\nby objective\n{head}"));
        if per_objective.is_empty() {
            lines.push("(none)".to_owned());
        }
        lines.extend(per_objective.iter().map(|(k, t)| t.line(k)));
        lines.join("\n")
    });
    Ok(0)
}
