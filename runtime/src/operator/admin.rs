//! Team administration through a running broker: `ac7 member …` (when a token is at hand; else
//! offline on the database file, `broker::cli::member_offline`),
//! `ac7 team get|set`, `ac7 presets`, `ac7 channels …`, `ac7 enroll …` and `ac7 backup`.
//!
//! Each verb is one or two calls of the broker's HTTP API with the caller's token (resolved as
//! for every operator verb: `--token` > `AC7_TOKEN` > the token `ac7 connect` stored for the
//! URL). Text output is a table with a header line; `--json` prints the broker's JSON.

use std::path::PathBuf;

use ac7_protocol::domain::toolbox::encode_component;
use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use reqwest::Method;
use serde_json::{Value, json};

use crate::broker::cli::MemberAction;
use crate::operator::{Client, OperatorConn, block_on, format_ts, out};

/// Lays `rows` out in columns under `header`, two spaces apart (the last column unpadded).
pub(crate) fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut width: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            if let Some(w) = width.get_mut(i) {
                *w = (*w).max(cell.chars().count());
            }
        }
    }
    let line = |cells: &mut dyn Iterator<Item = &str>| {
        let cells: Vec<&str> = cells.collect();
        let last = cells.len().saturating_sub(1);
        let mut text = String::new();
        for (i, cell) in cells.iter().enumerate() {
            text.push_str(cell);
            if i < last {
                let pad = width[i].saturating_sub(cell.chars().count()) + 2;
                text.push_str(&" ".repeat(pad));
            }
        }
        text
    };
    let mut lines = vec![line(&mut header.iter().copied())];
    for row in rows {
        lines.push(line(&mut row.iter().map(String::as_str)));
    }
    lines.join("\n")
}

fn text(v: &Value, pointer: &str) -> String {
    v.pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned()
}

fn names(v: &Value) -> String {
    let list: Vec<&str> = v
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    if list.is_empty() {
        "-".to_owned()
    } else {
        list.join(",")
    }
}

/// The member table of `ac7 member list` (`members`: the broker's `Member` or `Teammate`
/// objects).
pub(crate) fn member_table(members: &[Value]) -> String {
    let rows: Vec<Vec<String>> = members
        .iter()
        .map(|m| {
            vec![
                text(m, "/name"),
                text(m, "/role/title"),
                names(&m["permissions"]),
            ]
        })
        .collect();
    table(&["NAME", "ROLE", "PERMISSIONS"], &rows)
}

/// The token table of `ac7 member tokens` (`tokens`: the broker's `TokenInfo` objects).
pub(crate) fn token_table(tokens: &[Value]) -> String {
    let when = |v: &Value| v.as_i64().map_or_else(|| "never".to_owned(), format_ts);
    let rows: Vec<Vec<String>> = tokens
        .iter()
        .map(|t| {
            let label = text(t, "/label");
            vec![
                text(t, "/id"),
                text(t, "/origin"),
                if label.is_empty() { "-".into() } else { label },
                when(&t["createdAt"]),
                when(&t["lastUsedAt"]),
            ]
        })
        .collect();
    table(&["ID", "ORIGIN", "LABEL", "CREATED", "LAST USED"], &rows)
}

/// `ac7 member …`: through the running broker, or offline against the database file.
#[derive(Debug, Args)]
#[command(after_help = MEMBER_HELP)]
pub struct MemberArgs {
    /// Work offline on this SQLite database file (the broker stopped) instead of through the
    /// broker. See below for which applies when.
    #[arg(long, global = true, value_name = "FILE")]
    pub db: Option<PathBuf>,
    /// The running broker and the caller's token (an admin's for add, update, remove).
    #[command(flatten)]
    pub conn: OperatorConn,
    /// What to do.
    #[command(subcommand)]
    pub action: MemberAction,
}

/// How `ac7 member` picks between the broker and the database file.
const MEMBER_HELP: &str = "Where it works, first match:
  1. a token given (--token or AC7_TOKEN): through the running broker at --url;
  2. --db FILE: offline on that SQLite file (stop the broker first);
  3. a token `ac7 connect` stored for --url: through the running broker;
  4. the SQLite file AC7_DB names, else ./ac7.db, when it exists: offline.
Through the broker, add, update and remove need the members.manage permission (an admin's
token); rotate-token also takes the member's own.";

/// Where `ac7 member` works (see [`MEMBER_HELP`]): `Ok(None)` through the broker, else the
/// database file.
fn member_target(args: &MemberArgs) -> anyhow::Result<Option<PathBuf>> {
    let given = args.conn.token.as_deref().is_some_and(|t| !t.is_empty());
    if given {
        return Ok(None);
    }
    if let Some(db) = &args.db {
        return Ok(Some(db.clone()));
    }
    if crate::client::tokens::resolve_token_any(None, &args.conn.url).is_some() {
        return Ok(None);
    }
    let db = std::env::var_os("AC7_DB")
        .filter(|p| !p.is_empty())
        .map_or_else(|| PathBuf::from("./ac7.db"), PathBuf::from);
    if db.exists() {
        return Ok(Some(db));
    }
    let url = args
        .conn
        .url
        .first()
        .map_or(crate::client::DEFAULT_URL, String::as_str);
    bail!(
        "no token for {url} and no database at {}: run `ac7 connect --url {url}` (or set \
         AC7_TOKEN) to work through the running broker, or pass --db FILE to work offline on \
         the broker's database (the broker stopped)",
        db.display()
    )
}

/// Runs `ac7 member …`: through the broker, or offline on the database file (which one:
/// `ac7 member --help`); both print the same JSON with `--json`, and the same text without.
pub fn member(args: MemberArgs) -> anyhow::Result<i32> {
    let render = member_text(&args.action);
    let value = match member_target(&args)? {
        None => member_online(&args.conn, args.action)?,
        Some(db) => crate::broker::cli::member_offline(&db, args.action)?,
    };
    out(&args.conn, &value, render);
    Ok(0)
}

/// How `ac7 member …` prints the JSON of `action`'s answer as text.
fn member_text(action: &MemberAction) -> fn(&Value) -> String {
    match action {
        MemberAction::List => {
            |v| member_table(v["members"].as_array().map_or(&[][..], Vec::as_slice))
        }
        MemberAction::Add(_) | MemberAction::RotateToken { .. } => |v| text(v, "/token"),
        MemberAction::Update(_) => |v| format!("updated {}", text(v, "/name")),
        MemberAction::Remove { .. } => |v| format!("removed {}", text(v, "/removed")),
        MemberAction::Tokens { .. } => {
            |v| token_table(v["tokens"].as_array().map_or(&[][..], Vec::as_slice))
        }
        MemberAction::RevokeToken { .. } => |v| {
            format!(
                "revoked {}'s token {}",
                text(v, "/member"),
                text(v, "/revoked")
            )
        },
    }
}

/// `ac7 member …` through the broker: the broker's answer.
fn member_online(conn: &OperatorConn, action: MemberAction) -> anyhow::Result<Value> {
    let client = Client::new(conn)?;
    let path = |name: &str| format!("/members/{}", encode_component(name));
    let value = match action {
        MemberAction::List => block_on(client.call(Method::GET, "/members", &[], None))?,
        MemberAction::Add(f) => {
            let mut body = json!({
                "name": f.name,
                "role": {"title": f.role.unwrap_or_else(|| "member".into()),
                         "description": f.description.unwrap_or_default()},
                "permissions": f.permissions.unwrap_or_default(),
            });
            if let Some(i) = f.instructions {
                body["instructions"] = json!(i);
            }
            block_on(client.call(Method::POST, "/members", &[], Some(body)))?
        }
        MemberAction::Update(f) => {
            block_on(async {
                let mut body = json!({});
                if f.role.is_some() || f.description.is_some() {
                    // The broker replaces the whole role: start from the member's own.
                    let all = client.call(Method::GET, "/members", &[], None).await?;
                    let current = all["members"]
                        .as_array()
                        .and_then(|m| m.iter().find(|m| m["name"] == f.name.as_str()))
                        .with_context(|| {
                            format!("no such member: {} (`ac7 member list` lists them)", f.name)
                        })?;
                    let mut role = current["role"].clone();
                    if let Some(t) = &f.role {
                        role["title"] = json!(t);
                    }
                    if let Some(d) = &f.description {
                        role["description"] = json!(d);
                    }
                    body["role"] = role;
                }
                if let Some(i) = &f.instructions {
                    body["instructions"] = json!(i);
                }
                if let Some(p) = &f.permissions {
                    body["permissions"] = json!(p);
                }
                if body.as_object().is_some_and(serde_json::Map::is_empty) {
                    bail!(
                        "nothing to update: pass --role, --description, --instructions or --permissions"
                    );
                }
                client
                    .call(Method::PATCH, &path(&f.name), &[], Some(body))
                    .await
            })?
        }
        MemberAction::Remove { name } => {
            block_on(client.call(Method::DELETE, &path(&name), &[], None))?;
            json!({"removed": name})
        }
        MemberAction::RotateToken { name } => block_on(client.call(
            Method::POST,
            &format!("{}/rotate-token", path(&name)),
            &[],
            None,
        ))?,
        MemberAction::Tokens { name } => {
            block_on(client.call(Method::GET, &format!("{}/tokens", path(&name)), &[], None))?
        }
        MemberAction::RevokeToken { name, id } => {
            block_on(client.call(
                Method::DELETE,
                &format!("{}/tokens/{}", path(&name), encode_component(&id)),
                &[],
                None,
            ))?;
            json!({"revoked": id, "member": name})
        }
    };
    Ok(value)
}

/// `ac7 team`.
#[derive(Debug, Args)]
pub struct TeamArgs {
    #[command(flatten)]
    conn: OperatorConn,
    #[command(subcommand)]
    action: TeamAction,
}

#[derive(Debug, Subcommand)]
enum TeamAction {
    /// Show the team's name, directive and context.
    Get,
    /// Change the team's name, directive or context (needs team.manage).
    Set {
        /// The new name.
        #[arg(long)]
        name: Option<String>,
        /// The new directive (what the team is for; every member's briefing starts with it).
        #[arg(long)]
        directive: Option<String>,
        /// The new context (background every member's briefing carries).
        #[arg(long)]
        context: Option<String>,
    },
}

fn team_text(v: &Value) -> String {
    let t = &v["team"];
    let mut lines = vec![
        format!("name:      {}", text(t, "/name")),
        format!("directive: {}", text(t, "/directive")),
    ];
    let context = text(t, "/context");
    lines.push(format!(
        "context:   {}",
        if context.is_empty() { "-" } else { &context }
    ));
    lines.join("\n")
}

/// Runs `ac7 team …`.
pub fn team(args: TeamArgs) -> anyhow::Result<i32> {
    let client = Client::new(&args.conn)?;
    let v = match args.action {
        TeamAction::Get => block_on(client.call(Method::GET, "/team", &[], None))?,
        TeamAction::Set {
            name,
            directive,
            context,
        } => {
            let mut body = json!({});
            for (key, value) in [
                ("name", name),
                ("directive", directive),
                ("context", context),
            ] {
                if let Some(value) = value {
                    body[key] = json!(value);
                }
            }
            if body.as_object().is_some_and(serde_json::Map::is_empty) {
                bail!("nothing to set: pass --name, --directive or --context");
            }
            block_on(client.call(Method::PATCH, "/team", &[], Some(body)))?
        }
    };
    out(&args.conn, &v, team_text);
    Ok(0)
}

/// `ac7 presets`.
#[derive(Debug, Args)]
pub struct PresetsArgs {
    #[command(flatten)]
    conn: OperatorConn,
    #[command(subcommand)]
    action: Option<PresetsAction>,
}

#[derive(Debug, Subcommand)]
enum PresetsAction {
    /// List the presets and the permissions each grants (the default).
    List,
    /// Create or replace a preset (needs team.manage).
    Set {
        /// The preset's name.
        name: String,
        /// The permissions it grants, comma-separated leaves (`objectives.create,activity.read`).
        #[arg(long, value_delimiter = ',', required = true)]
        permissions: Vec<String>,
    },
    /// Delete a preset (needs team.manage); members keep the permissions it gave them.
    Delete {
        /// The preset's name.
        name: String,
    },
}

/// Runs `ac7 presets …`.
pub fn presets(args: PresetsArgs) -> anyhow::Result<i32> {
    let client = Client::new(&args.conn)?;
    match args.action.unwrap_or(PresetsAction::List) {
        PresetsAction::List => {
            let v = block_on(client.call(Method::GET, "/team/presets", &[], None))?;
            out(&args.conn, &v, |v| {
                let rows: Vec<Vec<String>> = v["presets"]
                    .as_object()
                    .into_iter()
                    .flatten()
                    .map(|(name, perms)| vec![name.clone(), names(perms)])
                    .collect();
                table(&["PRESET", "PERMISSIONS"], &rows)
            });
        }
        PresetsAction::Set { name, permissions } => {
            let v = block_on(client.call(
                Method::PUT,
                &format!("/team/presets/{}", encode_component(&name)),
                &[],
                Some(json!({"permissions": permissions})),
            ))?;
            out(&args.conn, &v, |v| {
                format!(
                    "preset {}: {}",
                    text(v, "/preset/name"),
                    names(&v["preset"]["permissions"])
                )
            });
        }
        PresetsAction::Delete { name } => {
            let v = block_on(client.call(
                Method::DELETE,
                &format!("/team/presets/{}", encode_component(&name)),
                &[],
                None,
            ))?;
            out(&args.conn, &v, |_| format!("deleted preset {name}"));
        }
    }
    Ok(0)
}

/// `ac7 channels`.
#[derive(Debug, Args)]
pub struct ChannelsArgs {
    #[command(flatten)]
    conn: OperatorConn,
    #[command(subcommand)]
    action: ChannelsAction,
}

#[derive(Debug, Subcommand)]
enum ChannelsAction {
    /// List the open channels (with `general`), newest first.
    List,
    /// Create a channel; you become its admin.
    Create {
        /// The channel's slug: 1-32 lowercase letters, digits and single dashes.
        slug: String,
    },
    /// Archive a channel (its admins only); its history stays readable.
    Archive {
        /// The channel's slug.
        slug: String,
    },
    /// List a channel's members, or change them with --add / --remove.
    Members {
        /// The channel's slug.
        slug: String,
        /// Add this member (repeatable; a channel admin may add anyone, anyone may add
        /// themselves).
        #[arg(long = "add", value_name = "NAME")]
        add: Vec<String>,
        /// With --add: as a channel admin rather than a member.
        #[arg(long, requires = "add")]
        admin: bool,
        /// Remove this member (repeatable; yourself, or anyone if you are a channel admin).
        #[arg(long = "remove", value_name = "NAME")]
        remove: Vec<String>,
    },
}

fn channel_members_text(v: &Value) -> String {
    if v.pointer("/channel/slug") == Some(&json!("general")) {
        return "general: every member of the team".to_owned();
    }
    let rows: Vec<Vec<String>> = v["members"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|m| {
            vec![
                text(m, "/memberName"),
                text(m, "/role"),
                format_ts(m["joinedAt"].as_i64().unwrap_or(0)),
            ]
        })
        .collect();
    table(&["MEMBER", "ROLE", "JOINED"], &rows)
}

/// Runs `ac7 channels …`.
pub fn channels(args: ChannelsArgs) -> anyhow::Result<i32> {
    let client = Client::new(&args.conn)?;
    let conn = &args.conn;
    let at = |slug: &str| format!("/channels/{}", encode_component(slug));
    match args.action {
        ChannelsAction::List => {
            let v = block_on(client.call(Method::GET, "/channels", &[], None))?;
            out(conn, &v, |v| {
                let rows: Vec<Vec<String>> = v["channels"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|c| {
                        vec![
                            text(c, "/slug"),
                            c["memberCount"].as_u64().unwrap_or(0).to_string(),
                            c["myRole"].as_str().unwrap_or("-").to_owned(),
                            text(c, "/createdBy"),
                            format_ts(c["createdAt"].as_i64().unwrap_or(0)),
                        ]
                    })
                    .collect();
                table(&["SLUG", "MEMBERS", "YOU", "CREATED-BY", "CREATED"], &rows)
            });
        }
        ChannelsAction::Create { slug } => {
            let v =
                block_on(client.call(Method::POST, "/channels", &[], Some(json!({"slug": slug}))))?;
            out(conn, &v, |v| format!("created #{}", text(v, "/slug")));
        }
        ChannelsAction::Archive { slug } => {
            let v = block_on(client.call(Method::DELETE, &at(&slug), &[], None))?;
            out(conn, &v, |v| format!("archived #{}", text(v, "/slug")));
        }
        ChannelsAction::Members {
            slug,
            add,
            admin,
            remove,
        } => {
            let v = block_on(async {
                let mut last = None;
                for name in &add {
                    let role = if admin { "admin" } else { "member" };
                    last = Some(
                        client
                            .call(
                                Method::POST,
                                &format!("{}/members", at(&slug)),
                                &[],
                                Some(json!({"member": name, "role": role})),
                            )
                            .await?,
                    );
                }
                for name in &remove {
                    last = Some(
                        client
                            .call(
                                Method::DELETE,
                                &format!("{}/members/{}", at(&slug), encode_component(name)),
                                &[],
                                None,
                            )
                            .await?,
                    );
                }
                match last {
                    Some(v) => Ok(v),
                    None => client.call(Method::GET, &at(&slug), &[], None).await,
                }
            })?;
            out(conn, &v, channel_members_text);
        }
    }
    Ok(0)
}

/// `ac7 enroll`.
#[derive(Debug, Args)]
pub struct EnrollArgs {
    #[command(flatten)]
    conn: OperatorConn,
    #[command(subcommand)]
    action: EnrollAction,
}

#[derive(Debug, Subcommand)]
enum EnrollAction {
    /// List the devices waiting for approval (`ac7 connect` shows each its code).
    List,
    /// Approve a device: give it a token of an existing member, or with --new of a new one.
    Approve {
        /// The code the device shows (`ABCD-EFGH`).
        code: String,
        /// The member the device acts as.
        #[arg(long, value_name = "NAME")]
        member: String,
        /// Create the member (with --role, --permissions, --instructions) instead of binding
        /// the device to an existing one.
        #[arg(long, requires = "role")]
        new: bool,
        /// With --new: the new member's role title.
        #[arg(long, requires = "new")]
        role: Option<String>,
        /// With --new: its permissions or presets, comma-separated.
        #[arg(long, value_delimiter = ',', requires = "new")]
        permissions: Vec<String>,
        /// With --new: its private instructions.
        #[arg(long, requires = "new")]
        instructions: Option<String>,
        /// The token's label, as the member's token list shows it (default: what the device
        /// asked for).
        #[arg(long)]
        label: Option<String>,
    },
    /// Refuse a device: its `ac7 connect` stops and saves nothing.
    Reject {
        /// The code the device shows.
        code: String,
        /// Why, shown to the device.
        #[arg(long)]
        reason: Option<String>,
    },
}

/// Runs `ac7 enroll …`.
pub fn enroll(args: EnrollArgs) -> anyhow::Result<i32> {
    let client = Client::new(&args.conn)?;
    let conn = &args.conn;
    match args.action {
        EnrollAction::List => {
            let v = block_on(client.call(Method::GET, "/enroll/pending", &[], None))?;
            out(conn, &v, |v| {
                let list = v["enrollments"].as_array().map_or(&[][..], Vec::as_slice);
                if list.is_empty() {
                    return "(no devices waiting)".to_owned();
                }
                let rows: Vec<Vec<String>> = list
                    .iter()
                    .map(|e| {
                        let label = text(e, "/labelHint");
                        vec![
                            text(e, "/userCode"),
                            if label.is_empty() { "-".into() } else { label },
                            e["sourceIp"].as_str().unwrap_or("-").to_owned(),
                            format_ts(e["expiresAt"].as_i64().unwrap_or(0)),
                        ]
                    })
                    .collect();
                table(&["CODE", "LABEL", "FROM", "EXPIRES"], &rows)
            });
        }
        EnrollAction::Approve {
            code,
            member,
            new,
            role,
            permissions,
            instructions,
            label,
        } => {
            let mut body = json!({"mode": if new { "create" } else { "bind" },
                                  "userCode": code, "memberName": member});
            if new {
                body["role"] = json!({"title": role.unwrap_or_default()});
                body["permissions"] = json!(permissions);
                if let Some(i) = instructions {
                    body["instructions"] = json!(i);
                }
            }
            if let Some(l) = label {
                body["label"] = json!(l);
            }
            let v = block_on(client.call(Method::POST, "/enroll/approve", &[], Some(body)))?;
            out(conn, &v, |v| {
                format!(
                    "approved {code}: the device is {} (token {})",
                    text(v, "/member/name"),
                    text(v, "/tokenInfo/id")
                )
            });
        }
        EnrollAction::Reject { code, reason } => {
            let mut body = json!({"userCode": code});
            if let Some(r) = reason {
                body["reason"] = json!(r);
            }
            block_on(client.call(Method::POST, "/enroll/reject", &[], Some(body)))?;
            out(conn, &json!({"rejected": code}), |_| {
                format!("rejected {code}")
            });
        }
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    #[test]
    fn tables_align_under_their_header() {
        let t = super::table(
            &["NAME", "ROLE", "PERMISSIONS"],
            &[
                vec!["director".into(), "lead".into(), "team.manage".into()],
                vec!["b".into(), "engineer".into(), "-".into()],
            ],
        );
        assert_eq!(
            t,
            "NAME      ROLE      PERMISSIONS\ndirector  lead      team.manage\nb         engineer  -"
        );
    }
}

/// `ac7 backup`.
#[derive(Debug, Args)]
pub struct BackupArgs {
    #[command(flatten)]
    conn: OperatorConn,
    /// The file to write the copy to (a new one).
    file: PathBuf,
}

/// `ac7 backup FILE`: a consistent copy of the running broker's database (`GET /backup`), written
/// to `FILE.partial` as it arrives (0600), synced, and renamed to `FILE` once whole.
#[allow(clippy::print_stdout)]
pub fn backup(args: BackupArgs) -> anyhow::Result<i32> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let file = &args.file;
    if file.exists() {
        bail!("{} exists: name a new file", file.display());
    }
    let mut partial = file.clone().into_os_string();
    partial.push(".partial");
    let partial = PathBuf::from(partial);
    let client = Client::new(&args.conn)?;
    let written = block_on(async {
        let mut resp = client.send(&Method::GET, "/backup", |r| r).await?;
        let status = resp.status();
        if !status.is_success() {
            // Reported as every verb reports a refusal (`answer` fails on every status but a
            // success).
            let text = resp.text().await?;
            client
                .answer(&Method::GET, "/backup", status, &text)
                .await?;
            bail!("GET /backup failed ({status})");
        }
        let mut out = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&partial)
            .with_context(|| format!("cannot create {}", partial.display()))?;
        let mut head = Vec::new();
        let mut n = 0u64;
        let copied = async {
            while let Some(chunk) = resp.chunk().await? {
                if head.len() < 16 {
                    head.extend_from_slice(&chunk[..chunk.len().min(16 - head.len())]);
                }
                out.write_all(&chunk)?;
                n += chunk.len() as u64;
            }
            out.sync_all()?;
            if head != b"SQLite format 3\0" {
                bail!("the broker's answer is not a SQLite database");
            }
            Ok(n)
        }
        .await;
        if copied.is_err() {
            let _ = std::fs::remove_file(&partial);
        }
        copied.with_context(|| format!("the copy to {} did not complete", file.display()))
    })?;
    if let Err(e) = std::fs::rename(&partial, file) {
        let _ = std::fs::remove_file(&partial);
        return Err(e).with_context(|| format!("cannot move the copy to {}", file.display()));
    }
    // The new name survives a power loss too.
    if let Some(dir) = file.parent().filter(|d| !d.as_os_str().is_empty())
        && let Ok(dir) = std::fs::File::open(dir)
    {
        let _ = dir.sync_all();
    }
    println!(
        "wrote the team's database to {} ({written} bytes)",
        file.display()
    );
    Ok(0)
}
