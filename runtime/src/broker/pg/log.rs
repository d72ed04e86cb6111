//! The message log: appends whose commit order is their sequence order, and ordered reads.
//!
//! Every message gets the next number of one counter, the row `log_head`. An append updates
//! that row first (`last_seq = last_seq + n`), which takes its row lock until the transaction
//! ends; it then inserts its messages with the numbers it took, rings the doorbell
//! (`pg_notify('ac7_log', '<last seq>')`, delivered by the server only at commit) and commits.
//! A second append blocks on the row until the first has committed (or rolled back, in which
//! case it gets the same numbers), so sequence numbers become visible in order with no hole
//! that fills later: a reader that has seen `n` can continue at `n + 1` for ever. A plain
//! `BIGSERIAL` would not do: numbers would be taken at insert and become visible at commit,
//! in any order.
//!
//! The price is that appends are serialized on one row for the length of their transaction;
//! batching messages into one append (the `/push` group commit) is what keeps that cheap.

use std::ops::Range;

use tokio_postgres::{Client, GenericClient, Row, Transaction};

use super::PgError;
use crate::broker::messages;

/// The `LISTEN`/`NOTIFY` channel of the log doorbell. Its payload is the sequence of the last
/// message of the committed append, in decimal, and nothing else.
pub const LOG_CHANNEL: &str = "ac7_log";

/// A message to append (the columns of `messages` but the sequence).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogMessage {
    /// The message id (unique).
    pub id: String,
    /// Its time (epoch ms).
    pub ts: i64,
    /// The recipient of a direct message.
    pub to_name: Option<String>,
    /// The sender.
    pub from_name: Option<String>,
    /// Its thread (`chan:<id>`, `obj:<id>`).
    pub thread: Option<String>,
    /// The message as served, JSON text.
    pub json: String,
}

/// A logged message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogRow {
    /// Its sequence number.
    pub seq: i64,
    /// The message.
    pub message: LogMessage,
}

/// Appends `batch` in a transaction of its own and commits; returns the sequence numbers it
/// got (contiguous, in batch order; empty for an empty batch).
pub async fn append(client: &mut Client, batch: &[LogMessage]) -> Result<Range<i64>, PgError> {
    let tx = client.transaction().await?;
    let seqs = append_in(&tx, batch).await?;
    tx.commit().await?;
    Ok(seqs)
}

/// Appends `batch` inside the caller's transaction (for a use case that commits messages with
/// other changes). The log is locked for other appends until that transaction ends, and the
/// doorbell rings at its commit: keep the transaction short after this call.
pub async fn append_in(tx: &Transaction<'_>, batch: &[LogMessage]) -> Result<Range<i64>, PgError> {
    if batch.is_empty() {
        return Ok(0..0);
    }
    let n = i64::try_from(batch.len())
        .map_err(|_| PgError::Corrupt("a batch larger than i64".to_owned()))?;
    let last: i64 = tx
        .query_one(
            "UPDATE log_head SET last_seq = last_seq + $1 WHERE id = 1 RETURNING last_seq",
            &[&n],
        )
        .await?
        .try_get(0)?;
    let first = last - n + 1;
    let seqs: Vec<i64> = (first..=last).collect();
    let stored = batch
        .iter()
        .map(|m| {
            messages::encode_logged(
                &m.id,
                m.ts,
                m.to_name.as_deref(),
                m.from_name.as_deref(),
                m.thread.as_deref(),
                &m.json,
            )
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| PgError::Corrupt(e.to_string()))?;
    // Each name and thread key once, and `null` (everyone) for the audience.
    let mut keys: Vec<&str> = vec!["null"];
    for m in batch {
        keys.extend(
            [&m.to_name, &m.from_name, &m.thread]
                .into_iter()
                .filter_map(|k| k.as_deref()),
        );
    }
    tx.execute(
        "INSERT INTO message_keys (key) SELECT DISTINCT k FROM unnest($1::TEXT[]) AS k ORDER BY k
         ON CONFLICT (key) DO NOTHING",
        &[&keys],
    )
    .await?;
    let ids: Vec<Option<&[u8]>> = stored.iter().map(|s| s.id.as_deref()).collect();
    let id_texts: Vec<Option<&str>> = stored.iter().map(|s| s.id_text.as_deref()).collect();
    let ts: Vec<i64> = batch.iter().map(|m| m.ts).collect();
    let to: Vec<Option<&str>> = batch.iter().map(|m| m.to_name.as_deref()).collect();
    let from: Vec<Option<&str>> = batch.iter().map(|m| m.from_name.as_deref()).collect();
    let thread: Vec<Option<&str>> = batch.iter().map(|m| m.thread.as_deref()).collect();
    let body: Vec<&str> = stored.iter().map(|s| s.body.as_str()).collect();
    let extra: Vec<Option<&str>> = stored.iter().map(|s| s.extra.as_deref()).collect();
    tx.execute(
        "INSERT INTO messages (seq, id, id_text, ts, to_key, from_key, thread, body, extra, audience)
         SELECT u.seq, u.id, u.id_text, u.ts,
                (SELECT k.id FROM message_keys k WHERE k.key = u.to_name),
                (SELECT k.id FROM message_keys k WHERE k.key = u.from_name),
                CASE WHEN u.thread LIKE 'obj:%' THEN -1 ELSE 1 END
                    * (SELECT k.id FROM message_keys k WHERE k.key = u.thread),
                u.body, u.extra,
                (SELECT k.id FROM message_keys k WHERE k.key = 'null')
         FROM unnest($1::BIGINT[], $2::BYTEA[], $3::TEXT[], $4::BIGINT[], $5::TEXT[],
                     $6::TEXT[], $7::TEXT[], $8::TEXT[], $9::TEXT[])
              AS u(seq, id, id_text, ts, to_name, from_name, thread, body, extra)",
        &[
            &seqs, &ids, &id_texts, &ts, &to, &from, &thread, &body, &extra,
        ],
    )
    .await?;
    tx.execute(
        "SELECT pg_notify($1, $2)",
        &[&LOG_CHANNEL, &last.to_string()],
    )
    .await?;
    Ok(first..last + 1)
}

/// Up to `limit` messages with a sequence above `after`, in order.
pub async fn read_after(
    client: &impl GenericClient,
    after: i64,
    limit: i64,
) -> Result<Vec<LogRow>, PgError> {
    let rows = client
        .query(
            "SELECT m.seq, m.id, m.id_text, m.ts, tk.key, fk.key, hk.key, m.body, m.extra
             FROM messages m
             LEFT JOIN message_keys tk ON tk.id = m.to_key
             LEFT JOIN message_keys fk ON fk.id = m.from_key
             LEFT JOIN message_keys hk ON hk.id = abs(m.thread)
             WHERE m.seq > $1 ORDER BY m.seq LIMIT $2",
            &[&after, &limit.max(0)],
        )
        .await?;
    rows.iter().map(log_row).collect()
}

/// The last sequence number given out (0 for an empty log); messages pruned since keep theirs.
pub async fn head(client: &impl GenericClient) -> Result<i64, PgError> {
    Ok(client
        .query_one("SELECT last_seq FROM log_head WHERE id = 1", &[])
        .await?
        .try_get(0)?)
}

fn log_row(row: &Row) -> Result<LogRow, PgError> {
    let corrupt = |e: crate::broker::db::StoreError| PgError::Corrupt(e.to_string());
    let id =
        messages::id_of(row.try_get::<_, Option<&[u8]>>(1)?, row.try_get(2)?).map_err(corrupt)?;
    let ts: i64 = row.try_get(3)?;
    let to_name: Option<String> = row.try_get(4)?;
    let from_name: Option<String> = row.try_get(5)?;
    let thread: Option<String> = row.try_get(6)?;
    let json = messages::decode(
        &id,
        ts,
        to_name.as_deref(),
        from_name.as_deref(),
        thread.as_deref(),
        row.try_get(7)?,
        row.try_get(8)?,
    )
    .map_err(corrupt)?;
    Ok(LogRow {
        seq: row.try_get(0)?,
        message: LogMessage {
            id,
            ts,
            to_name,
            from_name,
            thread,
            json,
        },
    })
}
