//! Storage scenarios: what the store keeps on disk.
//!
//! - `broker-disk`: bytes per message of the message log (table and indexes) after 100,000
//!   messages: 70 % channel posts in three channels, 20 % DMs between ten members, 10 % general
//!   posts, bodies of chat-line length. On SQLite the growth of the database file (WAL
//!   checkpointed) per message, and each table's and index's share (`dbstat`); on PostgreSQL
//!   (`AC7_BENCH_POSTGRES`) `pg_total_relation_size('messages')` per message. Also a `/history`
//!   page of 100 read in-process (median), for speed.
//! - `activity-storage`: bytes per `llm_exchange` of a long model session. The generator plays
//!   a coding agent's session: a system prompt and tool definitions sent with every request, a
//!   conversation that grows by one assistant turn (text, a tool call) and one tool result per
//!   exchange and is compacted into a summary when it gets long, and a small side call now and
//!   then. Every exchange is uploaded as the runner uploads it. Figures: the event's JSON
//!   (what a store keeping each row whole holds), the store's growth per exchange, their ratio,
//!   and the time to read a page of 200 exchanges back.

use std::time::Instant;

use ac7_protocol::domain::message::{Audience, LogLevel};
use ac7_protocol::trace::activity::{
    ActivityEvent, Block, LlmApi, LlmEntry, LlmEntryKind, LlmMessage, LlmRequest, LlmResponse,
    LlmTool, SystemPrompt, Usage,
};
use ac7_runtime::broker::bootstrap::bootstrap;
use ac7_runtime::broker::db::{Store, SyncMode};
use ac7_runtime::broker::messages::{self, Feed, Window};
use ac7_runtime::broker::pg::PgConfig;
use ac7_runtime::broker::publish::{Draft, log};
use ac7_runtime::broker::{activity, channels, now_ms, team};
use serde_json::json;

use super::Report;
use super::broker::BenchDb;

const MESSAGES: usize = 100_000;
const MEMBERS: usize = 10;
const EXCHANGES: usize = 1_500;

/// A small deterministic generator (SplitMix64): the same session on every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `lo..hi`.
    fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + (self.next() % (hi - lo) as u64) as usize
    }

    /// About `len` bytes of prose.
    fn text(&mut self, len: usize) -> String {
        const WORDS: &[&str] = &[
            "the",
            "broker",
            "member",
            "function",
            "returns",
            "a",
            "value",
            "of",
            "test",
            "file",
            "error",
            "when",
            "this",
            "objective",
            "config",
            "to",
            "store",
            "with",
            "channel",
            "message",
            "reads",
            "writes",
            "index",
            "query",
            "row",
            "and",
            "it",
            "is",
            "not",
            "runner",
            "session",
            "update",
            "fixes",
            "check",
            "build",
            "output",
            "line",
            "path",
        ];
        let mut s = String::with_capacity(len + 12);
        while s.len() < len {
            if !s.is_empty() {
                s.push(' ');
            }
            s.push_str(WORDS[self.range(0, WORDS.len())]);
        }
        s
    }
}

/// A store of its own: a SQLite file in a temporary directory, or a fresh database on the
/// `AC7_BENCH_POSTGRES` server. Bootstrapped with `director` and `m0`…`m9`.
struct BenchStore {
    store: Store,
    file: Option<std::path::PathBuf>,
    _dir: tempfile::TempDir,
    _pg: Option<BenchDb>,
}

impl BenchStore {
    fn open() -> anyhow::Result<BenchStore> {
        let dir = tempfile::tempdir()?;
        let pg = std::env::var("AC7_BENCH_POSTGRES")
            .ok()
            .map(|admin| BenchDb::create(&admin))
            .transpose()?;
        let (store, file) = match &pg {
            Some(pg) => (Store::open_postgres(PgConfig::parse(&pg.url)?)?, None),
            None => {
                let file = dir.path().join("bench.db");
                (Store::open(&file, SyncMode::Normal)?, Some(file))
            }
        };
        let config = super::broker::bench_team("Measure the store.", MEMBERS);
        bootstrap(&store, &config)?;
        Ok(BenchStore {
            store,
            file,
            _dir: dir,
            _pg: pg,
        })
    }

    /// SQLite: the database's size in bytes with the WAL checkpointed into it, less its free
    /// pages. PostgreSQL: `None` (see [`BenchStore::pg_bytes`]).
    fn sqlite_bytes(&self) -> Option<i64> {
        self.file.as_ref()?;
        Some(self.store.with(|conn| {
            conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
                .expect("checkpoint");
            let pages: i64 = conn
                .query_row("PRAGMA page_count", [], |r| r.get(0))
                .expect("page_count");
            let free: i64 = conn
                .query_row("PRAGMA freelist_count", [], |r| r.get(0))
                .expect("freelist_count");
            let size: i64 = conn
                .query_row("PRAGMA page_size", [], |r| r.get(0))
                .expect("page_size");
            (pages - free) * size
        }))
    }

    /// SQLite: bytes per table or index whose name starts with one of `prefixes` (`dbstat`).
    fn sqlite_objects(&self, prefixes: &[&str]) -> serde_json::Map<String, serde_json::Value> {
        let mut out = serde_json::Map::new();
        if self.file.is_none() {
            return out;
        }
        self.store.with(|conn| {
            let mut stmt = conn
                .prepare("SELECT name, SUM(pgsize) FROM dbstat GROUP BY name ORDER BY name")
                .expect("dbstat");
            let rows = stmt
                .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))
                .expect("dbstat rows");
            for row in rows {
                let (name, bytes) = row.expect("dbstat row");
                if prefixes.iter().any(|p| name.starts_with(p)) {
                    out.insert(name, json!(bytes));
                }
            }
        });
        out
    }

    /// PostgreSQL: `pg_total_relation_size` (table, TOAST and indexes) summed over the tables
    /// of `tables` that exist; `None` on SQLite.
    fn pg_bytes(&self, tables: &[&str]) -> anyhow::Result<Option<i64>> {
        if self.file.is_some() {
            return Ok(None);
        }
        let mut total = 0;
        for table in tables {
            total += self
                .store
                .view(|c| {
                    c.query_row(
                        "SELECT COALESCE(pg_total_relation_size(to_regclass(?1)), 0)::BIGINT",
                        ac7_runtime::params![*table],
                        |r| r.get::<i64>(0),
                    )
                })?
                .unwrap_or(0);
        }
        Ok(Some(total))
    }
}

/// The `broker-disk` scenario.
pub(crate) fn disk() -> anyhow::Result<Report> {
    let b = BenchStore::open()?;
    let mut rng = Rng(7);
    let now = now_ms();
    let channel_ids = b.store.tx(|c| -> anyhow::Result<Vec<String>> {
        let mut ids = Vec::new();
        for slug in ["dev", "ops", "design"] {
            let ch = channels::create(c, slug, "director", now)?;
            for i in 0..MEMBERS {
                channels::add_member(c, &ch.id, &format!("m{i}"), "member", now)?;
            }
            ids.push(ch.id);
        }
        Ok(ids)
    })?;
    let everyone: Audience = Audience::Everyone;
    let before = b.sqlite_bytes();
    let pg_before = b.pg_bytes(&["messages"])?;
    let started = Instant::now();
    for batch in 0..MESSAGES / 1_000 {
        b.store.tx(|c| -> anyhow::Result<()> {
            for i in batch * 1_000..(batch + 1) * 1_000 {
                let from = format!("m{}", rng.range(0, MEMBERS));
                let body_len = rng.range(40, 140);
                let body = rng.text(body_len);
                let kind = rng.range(0, 100);
                let mut data = serde_json::Map::new();
                let (to, audience) = if kind < 70 {
                    let id = &channel_ids[i % channel_ids.len()];
                    data.insert("thread".into(), json!(format!("chan:{id}")));
                    (
                        None,
                        Audience::Only((0..MEMBERS).map(|m| format!("m{m}")).collect()),
                    )
                } else if kind < 90 {
                    let to = format!("m{}", rng.range(0, MEMBERS));
                    let audience = Audience::Only([from.clone(), to.clone()].into());
                    (Some(to), audience)
                } else {
                    (None, everyone.clone())
                };
                log(
                    c,
                    Draft {
                        to,
                        from,
                        title: None,
                        body,
                        level: LogLevel::Info,
                        data,
                        attachments: Vec::new(),
                    },
                    &audience,
                    now + i as i64,
                )?;
            }
            Ok(())
        })?;
    }
    let seed_s = started.elapsed().as_secs_f64();
    let after = b.sqlite_bytes();
    let pg_after = b.pg_bytes(&["messages"])?;

    // A page of 100 for m0, newest first, read in-process.
    let mut samples = Vec::new();
    for _ in 0..200 {
        let t = Instant::now();
        let rows = b.store.view(|c| -> anyhow::Result<usize> {
            let scope = messages::viewer_scope(c, "m0", false)?;
            Ok(messages::page(c, "m0", &scope, &Feed::All, &Window::newest(100))?.len())
        })?;
        anyhow::ensure!(rows == 100, "a history page of {rows}");
        samples.push(t.elapsed().as_micros() as u64);
    }
    samples.sort_unstable();

    let mut r = Report::new();
    r.insert("scenario", json!("broker-disk"));
    r.insert("messages", json!(MESSAGES));
    r.insert(
        "backend",
        json!(if b.file.is_some() {
            "sqlite"
        } else {
            "postgres"
        }),
    );
    r.insert(
        "seed_messages_per_s",
        json!((MESSAGES as f64 / seed_s).round()),
    );
    if let (Some(before), Some(after)) = (before, after) {
        r.insert(
            "bytes_per_message",
            json!(((after - before) as f64 / MESSAGES as f64).round()),
        );
        r.insert(
            "sqlite_objects_bytes",
            json!(b.sqlite_objects(&["messages", "sqlite_autoindex_messages"])),
        );
    }
    if let (Some(before), Some(after)) = (pg_before, pg_after) {
        r.insert(
            "bytes_per_message",
            json!(((after - before) as f64 / MESSAGES as f64).round()),
        );
    }
    r.insert(
        "history_page_p50_us",
        json!(super::percentile(&samples, 50.0)),
    );
    Ok(r)
}

/// A coding agent's model session of `n` exchanges (see the module docs).
pub(crate) fn session(n: usize, seed: u64) -> Vec<ActivityEvent> {
    let mut rng = Rng(seed);
    let system = SystemPrompt::Blocks(vec![
        Block::Text {
            text: rng.text(2_500),
        },
        Block::Text {
            text: rng.text(4_000),
        },
    ]);
    let tools: Vec<LlmTool> = (0..14)
        .map(|i| {
            let description_len = rng.range(300, 900);
            LlmTool {
                name: format!("tool_{i}"),
                description: Some(rng.text(description_len)),
                input_schema: json!({
                    "type": "object",
                    "properties": {
                        "command": {"type": "string", "description": rng.text(120)},
                        "path": {"type": "string", "description": rng.text(80)},
                        "limit": {"type": "integer", "description": rng.text(60)},
                    },
                    "required": ["command"],
                    "additionalProperties": false,
                }),
            }
        })
        .collect();
    let side_system = SystemPrompt::Text(rng.text(300));
    let first = LlmMessage {
        role: "user".into(),
        content: vec![Block::Text {
            text: rng.text(600),
        }],
    };
    let mut conversation = vec![first];
    let mut conversation_bytes = 0usize;
    let mut ts = 1_700_000_000_000i64;
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        ts += rng.range(2_000, 30_000) as i64;
        let duration = rng.range(1_000, 20_000) as u64;
        if i % 20 == 19 {
            // A small side call (a title, a check) with a conversation of its own.
            let question_len = rng.range(200, 1_200);
            let answer_len = rng.range(20, 80);
            let request = LlmRequest {
                model: Some("claude-haiku-4-5".into()),
                max_tokens: Some(512.into()),
                temperature: Some(0.into()),
                system: Some(side_system.clone()),
                messages: vec![LlmMessage {
                    role: "user".into(),
                    content: vec![Block::Text {
                        text: rng.text(question_len),
                    }],
                }],
                tools: None,
            };
            let reply = LlmMessage {
                role: "assistant".into(),
                content: vec![Block::Text {
                    text: rng.text(answer_len),
                }],
            };
            out.push(exchange(ts, duration, request, reply, "end_turn", &mut rng));
            continue;
        }
        let request = LlmRequest {
            model: Some("claude-sonnet-4-5".into()),
            max_tokens: Some(32_000.into()),
            temperature: None,
            system: Some(system.clone()),
            messages: conversation.clone(),
            tools: Some(tools.clone()),
        };
        let mut content = Vec::new();
        if rng.range(0, 3) == 0 {
            let thinking_len = rng.range(100, 600);
            content.push(Block::Thinking {
                text: rng.text(thinking_len),
            });
        }
        let say_len = rng.range(60, 400);
        content.push(Block::Text {
            text: rng.text(say_len),
        });
        let call = format!("toolu_{:016x}", rng.next());
        let command_len = rng.range(20, 200);
        content.push(Block::ToolUse {
            id: call.clone(),
            name: format!("tool_{}", rng.range(0, 14)),
            input: json!({"command": rng.text(command_len), "path": "/work/src/lib.rs"}),
        });
        let reply = LlmMessage {
            role: "assistant".into(),
            content,
        };
        out.push(exchange(
            ts,
            duration,
            request,
            reply.clone(),
            "tool_use",
            &mut rng,
        ));
        // The next request carries the reply and the tool's result.
        let result_len = if rng.range(0, 10) == 0 {
            rng.range(3_000, 12_000)
        } else {
            rng.range(150, 2_500)
        };
        let result = LlmMessage {
            role: "user".into(),
            content: vec![Block::ToolResult {
                tool_use_id: call,
                content: json!(rng.text(result_len)),
                is_error: rng.range(0, 25) == 0,
            }],
        };
        conversation_bytes += serde_json::to_string(&reply).map_or(0, |s| s.len())
            + serde_json::to_string(&result).map_or(0, |s| s.len());
        conversation.push(reply);
        conversation.push(result);
        if conversation_bytes > 110_000 {
            // Compaction: the conversation starts again from a summary.
            conversation = vec![LlmMessage {
                role: "user".into(),
                content: vec![Block::Text {
                    text: rng.text(3_000),
                }],
            }];
            conversation_bytes = 0;
        }
    }
    out
}

fn exchange(
    ts: i64,
    duration: u64,
    request: LlmRequest,
    reply: LlmMessage,
    stop: &str,
    rng: &mut Rng,
) -> ActivityEvent {
    ActivityEvent::LlmExchange {
        ts,
        duration,
        entry: LlmEntry {
            kind: LlmEntryKind::AnthropicMessages,
            api: Some(LlmApi::AnthropicMessages),
            started_at: ts,
            ended_at: ts + i64::try_from(duration).unwrap_or(0),
            request,
            response: Some(LlmResponse {
                stop_reason: Some(stop.into()),
                stop_sequence: None,
                messages: vec![reply],
                usage: Some(Usage {
                    input_tokens: Some(rng.range(1, 50) as u64),
                    output_tokens: Some(rng.range(20, 900) as u64),
                    cache_creation_input_tokens: Some(rng.range(0, 3_000) as u64),
                    cache_read_input_tokens: Some(rng.range(5_000, 60_000) as u64),
                }),
                status: Some(200),
                error: None,
            }),
            truncated: Vec::new(),
        },
    }
}

/// The `activity-storage` scenario.
pub(crate) fn activity_storage() -> anyhow::Result<Report> {
    let b = BenchStore::open()?;
    let events = session(EXCHANGES, 11);
    let json_bytes: usize = events
        .iter()
        .map(|e| serde_json::to_string(e).map_or(0, |s| s.len()))
        .sum();
    let tables = ["member_activity", "activity_blocks"];
    let before = b.sqlite_bytes();
    let pg_before = b.pg_bytes(&tables)?;
    let member_seq = b
        .store
        .view(|c| team::member_seq(c, "m0"))?
        .ok_or_else(|| anyhow::anyhow!("no member m0"))?;
    let started = Instant::now();
    for event in events {
        b.store
            .tx(|c| activity::append(c, "m0", member_seq, vec![event], now_ms()))?;
    }
    let upload_s = started.elapsed().as_secs_f64();
    let after = b.sqlite_bytes();
    let pg_after = b.pg_bytes(&tables)?;
    let stored = match (before, after, pg_before, pg_after) {
        (Some(before), Some(after), _, _) | (_, _, Some(before), Some(after)) => after - before,
        _ => anyhow::bail!("no size measured"),
    };

    // Reading back: the newest page of 200, and one from the middle.
    let mut newest = Vec::new();
    let mut middle = Vec::new();
    for _ in 0..5 {
        for (before_id, samples) in [(None, &mut newest), (Some(800), &mut middle)] {
            let t = Instant::now();
            let rows = b.store.view(|c| {
                activity::list(
                    c,
                    "m0",
                    &activity::Query {
                        limit: 200,
                        before_id,
                        ..Default::default()
                    },
                    false,
                )
            })?;
            anyhow::ensure!(rows.len() == 200, "a page of {}", rows.len());
            samples.push(t.elapsed().as_micros() as u64);
        }
    }
    newest.sort_unstable();
    middle.sort_unstable();

    let mut r = Report::new();
    r.insert("scenario", json!("activity-storage"));
    r.insert(
        "backend",
        json!(if b.file.is_some() {
            "sqlite"
        } else {
            "postgres"
        }),
    );
    r.insert("exchanges", json!(EXCHANGES));
    r.insert(
        "event_json_bytes_per_exchange",
        json!((json_bytes as f64 / EXCHANGES as f64).round()),
    );
    r.insert("event_json_total_bytes", json!(json_bytes));
    r.insert(
        "stored_bytes_per_exchange",
        json!((stored as f64 / EXCHANGES as f64).round()),
    );
    r.insert("stored_total_bytes", json!(stored));
    r.insert(
        "stored_vs_event_json",
        json!(((stored as f64 / json_bytes as f64) * 1000.0).round() / 1000.0),
    );
    r.insert(
        "upload_exchanges_per_s",
        json!((EXCHANGES as f64 / upload_s).round()),
    );
    r.insert(
        "list_200_newest_p50_us",
        json!(super::percentile(&newest, 50.0)),
    );
    r.insert(
        "list_200_middle_p50_us",
        json!(super::percentile(&middle, 50.0)),
    );
    if b.file.is_some() {
        r.insert(
            "sqlite_objects_bytes",
            json!(b.sqlite_objects(&["member_activity", "activity_", "sqlite_autoindex_activity"])),
        );
    }
    Ok(r)
}
