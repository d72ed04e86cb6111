//! Operator commands against a running broker: `ac7 push`, `ac7 roster`,
//! `ac7 history`, `ac7 objectives …` here; member activity and usage in [`activity`], team
//! administration in [`admin`].
//!
//! The broker is `AC7_URL` (default `http://127.0.0.1:8717`) and the caller's
//! bearer token is `AC7_TOKEN` (or `--url` / `--token`, else the token `ac7 connect` stored). A refused request prints
//! the broker's own error message and exits non-zero.

pub mod activity;
pub mod admin;

use ac7_protocol::domain::toolbox::encode_component;
use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use reqwest::Method;
use serde_json::{Map, Value, json};

use crate::client::tokens::{no_token, resolve_token_any};
use crate::client::{BrokerClient, DEFAULT_URL, broker_url};

/// Where the broker is and who we are.
#[derive(Debug, Clone, Args)]
pub struct OperatorConn {
    /// Broker URL; repeat it (or list them in AC7_URL, comma-separated) for replicas of one team, tried in order
    /// when one does not answer.
    #[arg(
        long,
        env = "AC7_URL",
        default_value = DEFAULT_URL,
        value_parser = broker_url,
        value_delimiter = ',',
        action = clap::ArgAction::Append,
        global = true
    )]
    pub url: Vec<String>,
    /// Bearer token.
    #[arg(long, env = "AC7_TOKEN", hide_env_values = true, global = true)]
    pub token: Option<String>,
    /// Print the broker's JSON instead of text.
    #[arg(long, global = true)]
    pub json: bool,
}

/// `ac7 push`.
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("target").required(true)))]
pub struct PushArgs {
    #[command(flatten)]
    conn: OperatorConn,
    /// Message text; `-` reads it from standard input (`git log -1 | ac7 push --to a --body -`).
    #[arg(long)]
    body: String,
    /// Direct message to this member (`--agent`/`-a` is the same; TypeScript ac7 spells it so).
    #[arg(long, short = 'a', visible_alias = "agent", group = "target")]
    to: Option<String>,
    /// Broadcast to the general channel.
    #[arg(long, group = "target")]
    broadcast: bool,
    /// Post in this channel (slug).
    #[arg(long, group = "target")]
    channel: Option<String>,
    /// Title.
    #[arg(long)]
    title: Option<String>,
    /// Level: debug, info, notice, warning, error, critical.
    #[arg(long)]
    level: Option<String>,
    /// Metadata `key=value` (repeatable).
    #[arg(long = "data", value_name = "KEY=VALUE")]
    data: Vec<String>,
}

/// `ac7 history`.
#[derive(Debug, Args)]
pub struct HistoryArgs {
    #[command(flatten)]
    conn: OperatorConn,
    /// Only DMs with this member.
    #[arg(long)]
    with: Option<String>,
    /// Only this channel (slug, or `general`).
    #[arg(long)]
    channel: Option<String>,
    /// How many (default 100, max 1000).
    #[arg(long)]
    limit: Option<u32>,
    /// Only messages before this time (epoch ms).
    #[arg(long)]
    before: Option<i64>,
}

/// `ac7 objectives`.
#[derive(Debug, Args)]
pub struct ObjectivesArgs {
    #[command(flatten)]
    conn: OperatorConn,
    #[command(subcommand)]
    action: ObjectivesAction,
}

#[derive(Debug, Subcommand)]
enum ObjectivesAction {
    /// List objectives.
    List {
        /// Only this assignee.
        #[arg(long)]
        assignee: Option<String>,
        /// Only this status.
        #[arg(long)]
        status: Option<String>,
    },
    /// Show one objective with its event log.
    View {
        /// The objective's id.
        id: String,
    },
    /// Create an objective.
    Create {
        /// A short title (1–200 characters).
        #[arg(long)]
        title: String,
        /// The contractual outcome: what must be true when it is done.
        #[arg(long)]
        outcome: String,
        /// The member who does it.
        #[arg(long)]
        assignee: String,
        /// Details, context, links.
        #[arg(long)]
        body: Option<String>,
        /// Watcher (repeatable).
        #[arg(long = "watcher")]
        watchers: Vec<String>,
    },
    /// Block or unblock.
    Update {
        /// The objective's id.
        id: String,
        /// active or blocked.
        #[arg(long)]
        status: Option<String>,
        /// Block reason.
        #[arg(long)]
        reason: Option<String>,
    },
    /// Complete with a result.
    Complete {
        /// The objective's id.
        id: String,
        /// What was done, checked against the outcome.
        #[arg(long)]
        result: String,
    },
    /// Cancel.
    Cancel {
        /// The objective's id.
        id: String,
        /// Why it is cancelled.
        #[arg(long)]
        reason: Option<String>,
    },
    /// Hand to another member.
    Reassign {
        /// The objective's id.
        id: String,
        /// The new assignee.
        #[arg(long)]
        to: String,
        /// A note for the new assignee.
        #[arg(long)]
        note: Option<String>,
    },
    /// Add or remove watchers.
    Watchers {
        /// The objective's id.
        id: String,
        /// Add this watcher (repeatable).
        #[arg(long = "add")]
        add: Vec<String>,
        /// Remove this watcher (repeatable).
        #[arg(long = "remove")]
        remove: Vec<String>,
    },
}

/// The operator verbs' connection: the runner's [`BrokerClient`] (bearer token and
/// `X-AC7-Protocol: 1` on every request), with errors as one-line `anyhow` reports.
pub(crate) struct Client {
    pub(crate) broker: BrokerClient,
}

impl Client {
    pub(crate) fn new(conn: &OperatorConn) -> anyhow::Result<Client> {
        let first = conn.url.first().map_or(DEFAULT_URL, String::as_str);
        let token =
            resolve_token_any(conn.token.as_deref(), &conn.url).ok_or_else(|| no_token(first))?;
        Ok(Client {
            broker: BrokerClient::with_urls(&conn.url, &token)?,
        })
    }

    /// The broker's base URL.
    pub(crate) fn base(&self) -> &str {
        self.broker.url()
    }

    pub(crate) async fn call(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<Value>,
    ) -> anyhow::Result<Value> {
        let resp = self
            .send(&method, path, |req| {
                let req = req.query(query);
                match &body {
                    Some(b) => req.json(b),
                    None => req,
                }
            })
            .await?;
        let status = resp.status();
        let text = resp.text().await?;
        self.answer(&method, path, status, &text).await
    }

    /// Sends `method path` as `build` makes it; no answer at all is explained
    /// ([`explain_unreachable`]).
    pub(crate) async fn send(
        &self,
        method: &Method,
        path: &str,
        build: impl Fn(reqwest::RequestBuilder) -> reqwest::RequestBuilder,
    ) -> anyhow::Result<reqwest::Response> {
        match self.broker.send(method.clone(), path, build).await {
            Ok(resp) => Ok(resp),
            Err(e) => Err(explain_unreachable(&self.broker, e).await),
        }
    }

    /// The broker's JSON answer `text` (status `status`) to `method path`, or the error to
    /// report when it is not a success from an ac7 broker.
    pub(crate) async fn answer(
        &self,
        method: &Method,
        path: &str,
        status: reqwest::StatusCode,
        text: &str,
    ) -> anyhow::Result<Value> {
        let parsed = serde_json::from_str::<Value>(text);
        // Every answer of an ac7 broker but a 204 is JSON: anything else is another server.
        if parsed.is_err()
            && status != reqwest::StatusCode::NO_CONTENT
            && let Some(err) = not_a_broker(&self.broker).await
        {
            return Err(err);
        }
        let value = parsed.unwrap_or(Value::Null);
        if status == reqwest::StatusCode::UNAUTHORIZED {
            bail!(
                "the broker at {base} refused the token (401: {}): it was rotated, its member was \
                 removed, or it belongs to another broker. Connect this device again with `ac7 \
                 connect --url {base}`, or ask an admin for a new token (`ac7 member rotate-token \
                 NAME --url {base}`) and set AC7_TOKEN",
                broker_error(&value, text),
                base = self.base(),
            );
        }
        if !status.is_success() {
            let said = member_words(&broker_error(&value, text));
            let hint = match status {
                reqwest::StatusCode::FORBIDDEN
                    if said.contains("members.manage") || said.contains("team.manage") =>
                {
                    "\nthis needs an admin's token: pass one with --token or AC7_TOKEN \
                     (`ac7 whoami` shows what yours may do)"
                }
                reqwest::StatusCode::FORBIDDEN => "\n`ac7 whoami` shows what your token may do",
                reqwest::StatusCode::NOT_FOUND if said.starts_with("no such route") => {
                    "\nthis broker does not have that part of the API: it may be an older ac7 \
                     (`curl URL/healthz` shows its version)"
                }
                _ => "",
            };
            bail!("{method} {path} failed ({}): {said}{hint}", status.as_u16());
        }
        Ok(value)
    }
}

/// Why a request to `broker` got no answer, said so that the user knows what to change:
/// `https://` against a broker that serves plain HTTP (tried once on `http://`), a refused
/// certificate, or no broker at all ([`crate::client::cannot_reach`]).
pub(crate) async fn explain_unreachable(
    broker: &BrokerClient,
    error: reqwest::Error,
) -> anyhow::Error {
    let base = broker.url().to_owned();
    if crate::sys::tls_client::certificate_problem(&error).is_none()
        && let Some(rest) = base.strip_prefix("https://")
    {
        let plain = format!("http://{}", rest.trim_end_matches('/'));
        let answered = reqwest::Client::builder()
            .timeout(std::time::Duration::from_secs(5))
            .build()
            .ok()
            .map(|c| c.get(format!("{plain}/healthz")).send());
        if let Some(probe) = answered
            && let Ok(resp) = probe.await
            && resp.text().await.is_ok_and(|t| t.contains("\"status\""))
        {
            return anyhow::anyhow!(
                "the broker at {base} serves plain HTTP, not HTTPS: use --url {plain} (or serve \
                 HTTPS with `ac7 serve --tls-cert … --tls-key …`)"
            );
        }
    }
    crate::client::cannot_reach(&base, error)
}

/// `Some` error when the server at `broker`'s URL is not an ac7 broker: its `GET /healthz`
/// is not the broker's `{"status": "ok", …}`.
async fn not_a_broker(broker: &BrokerClient) -> Option<anyhow::Error> {
    let base = broker.url().trim_end_matches('/').to_owned();
    let probe = broker
        .builder(Method::GET, "/healthz")
        .timeout(std::time::Duration::from_secs(5))
        .send()
        .await;
    let what = match probe {
        Ok(resp) => {
            let status = resp.status().as_u16();
            let body = resp.text().await.unwrap_or_default();
            let is_ac7 = serde_json::from_str::<Value>(&body)
                .is_ok_and(|v| v["status"] == "ok" && v.get("version").is_some());
            if is_ac7 {
                return None;
            }
            let mut first: String = body.trim().chars().take(60).collect();
            first = first.replace(['\n', '\r'], " ");
            format!("GET /healthz answered {status} {first:?}")
        }
        Err(e) => format!("GET /healthz failed: {e}"),
    };
    Some(anyhow::anyhow!(
        "{base} answers HTTP but is not an ac7 broker ({what}): check --url or AC7_URL \
         (`ac7 serve` prints its URL when it starts)"
    ))
}

/// The broker's wire text names members "agents" (`no such agent: NAME`); a person reading a
/// command's error knows them as members.
fn member_words(text: &str) -> String {
    text.replace("no such agent: ", "no such member: ")
}

/// The broker's error text, with each validation issue of `details` on a line of its own
/// (`  title: Too small: expected string to have >=1 characters`).
fn broker_error(value: &Value, text: &str) -> String {
    let mut msg = value
        .get("error")
        .and_then(Value::as_str)
        .map_or_else(|| text.to_owned(), str::to_owned);
    for issue in value
        .get("details")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let path: Vec<String> = issue
            .get("path")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .map(|p| p.as_str().map_or_else(|| p.to_string(), str::to_owned))
            .collect();
        let message = issue
            .get("message")
            .and_then(Value::as_str)
            .map_or_else(|| issue.to_string(), str::to_owned);
        if path.is_empty() {
            msg.push_str(&format!("\n  {message}"));
        } else {
            msg.push_str(&format!("\n  {}: {message}", path.join(".")));
        }
    }
    msg
}

/// Runs `f` to its end on a current-thread runtime.
///
/// The runtime's polling loop is compiled once, for a boxed future, instead of once per verb's
/// future: each copy of it costs the binary kilobytes, and a verb waits on the network anyway.
pub(crate) fn block_on<T>(f: impl Future<Output = anyhow::Result<T>>) -> anyhow::Result<T> {
    let mut result = None;
    run_boxed(Box::pin(async {
        result = Some(f.await);
    }))?;
    result.unwrap_or_else(|| Err(anyhow::anyhow!("the request was not run to its end")))
}

fn run_boxed(f: std::pin::Pin<Box<dyn Future<Output = ()> + '_>>) -> anyhow::Result<()> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(f);
    Ok(())
}

/// Formats epoch ms as `YYYY-MM-DD HH:MM:SS UTC`.
pub fn format_ts(ms: i64) -> String {
    let t = ac7_protocol::civil::UtcDateTime::from_epoch_ms(ms);
    format!(
        "{:04}-{:02}-{:02} {:02}:{:02}:{:02} UTC",
        t.year, t.month, t.day, t.hour, t.minute, t.second
    )
}

#[allow(clippy::print_stdout)]
pub(crate) fn out(conn: &OperatorConn, value: &Value, text: impl FnOnce(&Value) -> String) {
    if conn.json {
        println!(
            "{}",
            serde_json::to_string_pretty(value).unwrap_or_default()
        );
    } else {
        println!("{}", text(value));
    }
}

fn s<'a>(v: &'a Value, k: &str) -> &'a str {
    v.get(k).and_then(Value::as_str).unwrap_or("")
}

/// `ac7 push`.
pub fn push(args: PushArgs) -> anyhow::Result<i32> {
    let client = Client::new(&args.conn)?;
    let body = if args.body == "-" {
        let mut body = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut body)
            .context("--body -: cannot read the message from standard input")?;
        let body = body.strip_suffix('\n').unwrap_or(&body).to_owned();
        if body.trim().is_empty() {
            bail!("--body -: standard input held no message");
        }
        body
    } else {
        args.body.clone()
    };
    let mut data = Map::new();
    for kv in &args.data {
        let (k, v) = kv
            .split_once('=')
            .with_context(|| format!("--data {kv:?}: expected KEY=VALUE"))?;
        data.insert(k.to_owned(), Value::String(v.to_owned()));
    }
    let result = block_on(async {
        if let Some(slug) = &args.channel {
            let ch = client
                .call(
                    Method::GET,
                    &format!("/channels/{}", encode_component(slug)),
                    &[],
                    None,
                )
                .await?;
            let id = ch
                .pointer("/channel/id")
                .and_then(Value::as_str)
                .context("broker returned no channel id")?;
            data.insert("thread".into(), Value::String(format!("chan:{id}")));
        }
        let mut body = json!({"body": body, "data": data});
        if let Some(to) = &args.to {
            body["to"] = json!(to);
        }
        if let Some(t) = &args.title {
            body["title"] = json!(t);
        }
        if let Some(l) = &args.level {
            body["level"] = json!(l);
        }
        client.call(Method::POST, "/push", &[], Some(body)).await
    })?;
    out(&args.conn, &result, |v| {
        format!(
            "sent {} (live={}, targets={})",
            v.pointer("/message/id")
                .and_then(Value::as_str)
                .unwrap_or("?"),
            v.pointer("/delivery/live")
                .and_then(Value::as_u64)
                .unwrap_or(0),
            v.pointer("/delivery/targets")
                .and_then(Value::as_u64)
                .unwrap_or(0)
        )
    });
    Ok(0)
}

/// `ac7 whoami`: who the token is, on which team, with which permissions.
pub fn whoami(conn: OperatorConn) -> anyhow::Result<i32> {
    let client = Client::new(&conn)?;
    let v = block_on(client.call(Method::GET, "/briefing", &[], None))?;
    let base = client.base().to_owned();
    out(&conn, &v, |v| {
        let permissions: Vec<&str> = v["permissions"]
            .as_array()
            .map(|p| p.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        format!(
            "{} ({}) on team {} at {base}\npermissions: {}",
            s(v, "name"),
            v.pointer("/role/title")
                .and_then(Value::as_str)
                .unwrap_or(""),
            v.pointer("/team/name")
                .and_then(Value::as_str)
                .unwrap_or(""),
            if permissions.is_empty() {
                "none".to_owned()
            } else {
                permissions.join(", ")
            }
        )
    });
    Ok(0)
}

/// `ac7 roster`.
pub fn roster(conn: OperatorConn) -> anyhow::Result<i32> {
    let client = Client::new(&conn)?;
    let v = block_on(client.call(Method::GET, "/roster", &[], None))?;
    out(&conn, &v, |v| {
        let empty = Vec::new();
        let presence = v
            .get("connected")
            .and_then(Value::as_array)
            .unwrap_or(&empty);
        let mut lines = Vec::new();
        for t in v
            .get("teammates")
            .and_then(Value::as_array)
            .unwrap_or(&empty)
        {
            let name = s(t, "name");
            let entry = presence.iter().find(|p| s(p, "name") == name);
            let connected = entry
                .and_then(|p| p.get("connected").and_then(Value::as_u64))
                .unwrap_or(0);
            let busy = entry.is_some_and(|p| p["busy"] == true);
            let state = match (connected > 0, busy) {
                (true, true) => format!("connected={connected} busy"),
                (true, false) => format!("connected={connected}"),
                (false, _) => "offline".into(),
            };
            let role = t
                .pointer("/role/title")
                .and_then(Value::as_str)
                .unwrap_or("");
            lines.push(format!("- {name} [{role}] {state}"));
        }
        lines.join("\n")
    });
    Ok(0)
}

fn message_line(m: &Value) -> String {
    let from = m.get("from").and_then(Value::as_str).unwrap_or("?");
    let to = m
        .get("to")
        .and_then(Value::as_str)
        .map(|t| format!(" → {t}"))
        .unwrap_or_default();
    let title = m
        .get("title")
        .and_then(Value::as_str)
        .map(|t| format!(" [{t}]"))
        .unwrap_or_default();
    format!(
        "{} {from}{to}{title}: {}",
        format_ts(m.get("ts").and_then(Value::as_i64).unwrap_or(0)),
        s(m, "body")
    )
}

/// `ac7 history`.
pub fn history(args: HistoryArgs) -> anyhow::Result<i32> {
    let client = Client::new(&args.conn)?;
    let mut q = Vec::new();
    if let Some(w) = &args.with {
        q.push(("with", w.clone()));
    }
    if let Some(c) = &args.channel {
        q.push(("channel", c.clone()));
    }
    if let Some(l) = args.limit {
        q.push(("limit", l.to_string()));
    }
    if let Some(b) = args.before {
        q.push(("before", b.to_string()));
    }
    let v = block_on(async {
        let page = client.call(Method::GET, "/history", &q, None).await?;
        // The broker answers an empty page for a name nobody has; say which it is.
        let empty = page["messages"].as_array().is_none_or(Vec::is_empty);
        if let (true, Some(with)) = (empty, &args.with) {
            let roster = client.call(Method::GET, "/roster", &[], None).await?;
            let known = roster["teammates"]
                .as_array()
                .is_some_and(|all| all.iter().any(|t| t["name"] == with.as_str()));
            if !known {
                bail!("no such member: {with} (`ac7 roster` lists the team)");
            }
        }
        Ok(page)
    })?;
    out(&args.conn, &v, |v| {
        let msgs = v
            .get("messages")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        if msgs.is_empty() {
            return "(no messages)".into();
        }
        // Oldest first reads naturally in a terminal.
        msgs.iter()
            .rev()
            .map(message_line)
            .collect::<Vec<_>>()
            .join("\n")
    });
    Ok(0)
}

fn objective_line(o: &Value) -> String {
    format!(
        "{} [{}] {} → {} (by {})\n  outcome: {}",
        s(o, "id"),
        s(o, "status"),
        s(o, "title"),
        s(o, "assignee"),
        s(o, "originator"),
        s(o, "outcome")
    )
}

/// `ac7 objectives …`.
pub fn objectives(args: ObjectivesArgs) -> anyhow::Result<i32> {
    let client = Client::new(&args.conn)?;
    let conn = args.conn.clone();
    let enc = encode_component;
    let v = block_on(async {
        match args.action {
            ObjectivesAction::List { assignee, status } => {
                let mut q = Vec::new();
                if let Some(a) = assignee {
                    q.push(("assignee", a));
                }
                if let Some(st) = status {
                    q.push(("status", st));
                }
                client.call(Method::GET, "/objectives", &q, None).await
            }
            ObjectivesAction::View { id } => {
                client
                    .call(Method::GET, &format!("/objectives/{}", enc(&id)), &[], None)
                    .await
            }
            ObjectivesAction::Create {
                title,
                outcome,
                assignee,
                body,
                watchers,
            } => {
                let mut b = json!({"title": title, "outcome": outcome, "assignee": assignee, "watchers": watchers});
                if let Some(body) = body {
                    b["body"] = json!(body);
                }
                client.call(Method::POST, "/objectives", &[], Some(b)).await
            }
            ObjectivesAction::Update { id, status, reason } => {
                let mut b = json!({});
                if let Some(st) = status {
                    b["status"] = json!(st);
                }
                if let Some(r) = reason {
                    b["blockReason"] = json!(r);
                }
                client
                    .call(
                        Method::PATCH,
                        &format!("/objectives/{}", enc(&id)),
                        &[],
                        Some(b),
                    )
                    .await
            }
            ObjectivesAction::Complete { id, result } => {
                client
                    .call(
                        Method::POST,
                        &format!("/objectives/{}/complete", enc(&id)),
                        &[],
                        Some(json!({"result": result})),
                    )
                    .await
            }
            ObjectivesAction::Cancel { id, reason } => {
                let b = reason.map_or_else(|| json!({}), |r| json!({"reason": r}));
                client
                    .call(
                        Method::POST,
                        &format!("/objectives/{}/cancel", enc(&id)),
                        &[],
                        Some(b),
                    )
                    .await
            }
            ObjectivesAction::Reassign { id, to, note } => {
                let mut b = json!({"to": to});
                if let Some(n) = note {
                    b["note"] = json!(n);
                }
                client
                    .call(
                        Method::POST,
                        &format!("/objectives/{}/reassign", enc(&id)),
                        &[],
                        Some(b),
                    )
                    .await
            }
            ObjectivesAction::Watchers { id, add, remove } => {
                client
                    .call(
                        Method::POST,
                        &format!("/objectives/{}/watchers", enc(&id)),
                        &[],
                        Some(json!({"add": add, "remove": remove})),
                    )
                    .await
            }
        }
    })?;
    out(&conn, &v, |v| {
        if let Some(list) = v.get("objectives").and_then(Value::as_array) {
            if list.is_empty() {
                return "(no objectives)".into();
            }
            return list
                .iter()
                .map(objective_line)
                .collect::<Vec<_>>()
                .join("\n");
        }
        if let Some(o) = v.get("objective") {
            let mut text = objective_line(o);
            if !s(o, "body").is_empty() {
                text.push_str(&format!("\n  body: {}", s(o, "body")));
            }
            if let Some(r) = o.get("blockReason").and_then(Value::as_str) {
                text.push_str(&format!("\n  blocked: {r}"));
            }
            if let Some(r) = o.get("result").and_then(Value::as_str) {
                text.push_str(&format!("\n  result: {r}"));
            }
            for e in v
                .get("events")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                text.push_str(&format!(
                    "\n  {} {} {} {}",
                    format_ts(e.get("ts").and_then(Value::as_i64).unwrap_or(0)),
                    s(e, "actor"),
                    s(e, "kind"),
                    e.get("payload").map(Value::to_string).unwrap_or_default()
                ));
            }
            return text;
        }
        objective_line(v)
    });
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::format_ts;

    #[test]
    fn timestamps() {
        assert_eq!(format_ts(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(format_ts(1_713_190_000_000), "2024-04-15 14:06:40 UTC");
        assert_eq!(format_ts(951_782_400_000), "2000-02-29 00:00:00 UTC");
    }
}
