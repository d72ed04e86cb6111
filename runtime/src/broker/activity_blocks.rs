//! The shared parts of `llm_exchange` activity rows, stored once.
//!
//! A model call sends the whole conversation so far, the system prompt and the tool
//! definitions with every request: successive exchanges of one session repeat almost all of
//! what the one before sent. A `member_activity` row of kind `llm_exchange` keeps in
//! `event_json` the event without those three parts (`system` and `tools` null, `messages`
//! empty) and points at blocks of `activity_blocks` for them:
//!
//! - `system_block`, `tools_block`: a *value block*, whose `data` is the JSON of the system
//!   prompt or of the tool list;
//! - `messages_block`: the last block of a *chain*. A chain block's `data` is a JSON array of
//!   messages and its `parent` the chain block of the messages before them (NULL: these are
//!   the first). The conversation is the concatenation of the chain from its first block.
//!
//! Blocks are content-addressed (`hash`, SHA-256). A value block's hash is that of `v` and
//! its JSON. A chain block's hash names the whole conversation up to its last message,
//! whatever the blocks it was cut into: `h(0) = SHA-256("ac7 messages")` and
//! `h(k) = SHA-256("m" ‖ h(k-1) ‖ JSON of message k)`. Storing a conversation looks for the
//! longest prefix already stored (usually the previous exchange's) and adds one block with the
//! messages after it, so an exchange costs the bytes of its new turns, not of its history.
//! Identical system prompts and tool lists are one block for every row of every member.
//!
//! `refs` counts the references to a block: rows pointing at it plus chain blocks whose
//! `parent` it is. Deleting rows ([`release`]) drops their references; a block left with none
//! is deleted and drops its own reference to its parent, and so on up the chain. A row stored
//! before blocks existed keeps its event whole in `event_json` and points at none.
//!
//! On PostgreSQL block changes are serialized by the `activity_head` row lock, which activity
//! uploads take first ([`super::activity::append`]) and retention takes before releasing.

use std::collections::HashMap;
use std::rc::Rc;

use ac7_protocol::trace::activity::{ActivityEvent, LlmMessage, LlmTool, SystemPrompt};
use sha2::{Digest, Sha256};

use super::db::StoreError;
use super::store::{Conn, ToValue, Value};
use crate::params;

/// The request parts of an `llm_exchange` kept in blocks.
#[derive(Debug, Default)]
pub struct Parts {
    /// `entry.request.system`.
    pub system: Option<SystemPrompt>,
    /// `entry.request.tools`.
    pub tools: Option<Vec<LlmTool>>,
    /// `entry.request.messages`.
    pub messages: Vec<LlmMessage>,
}

impl Parts {
    /// Takes the parts out of `event` (an `llm_exchange`), leaving `None` and `[]`.
    pub fn take(event: &mut ActivityEvent) -> Option<Parts> {
        match event {
            ActivityEvent::LlmExchange { entry, .. } => Some(Parts {
                system: entry.request.system.take(),
                tools: entry.request.tools.take(),
                messages: std::mem::take(&mut entry.request.messages),
            }),
            _ => None,
        }
    }

    /// Puts the parts back into `event` (an `llm_exchange`).
    pub fn put(self, event: &mut ActivityEvent) {
        if let ActivityEvent::LlmExchange { entry, .. } = event {
            entry.request.system = self.system;
            entry.request.tools = self.tools;
            entry.request.messages = self.messages;
        }
    }
}

/// The blocks one row points at (`member_activity.system_block`, `tools_block`,
/// `messages_block`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Refs {
    /// The system prompt's value block.
    pub system: Option<i64>,
    /// The tool list's value block.
    pub tools: Option<i64>,
    /// The last chain block of the conversation.
    pub messages: Option<i64>,
}

impl Refs {
    /// Whether the row points at no block (its event is whole in `event_json`).
    pub fn is_empty(&self) -> bool {
        *self == Refs::default()
    }

    fn ids(&self) -> impl Iterator<Item = i64> {
        [self.system, self.tools, self.messages]
            .into_iter()
            .flatten()
    }
}

type Hash = [u8; 32];

/// Stores `parts` as blocks (reusing those already stored), each referenced once more by the
/// row about to point at them. Inside the caller's transaction.
pub fn store(c: &Conn<'_>, parts: &Parts) -> Result<Refs, StoreError> {
    let system = match &parts.system {
        Some(s) => Some(value_block(c, &serde_json::to_string(s)?)?),
        None => None,
    };
    let tools = match &parts.tools {
        Some(t) => Some(value_block(c, &serde_json::to_string(t)?)?),
        None => None,
    };
    let messages = if parts.messages.is_empty() {
        None
    } else {
        Some(chain(c, &parts.messages)?)
    };
    Ok(Refs {
        system,
        tools,
        messages,
    })
}

fn sha(parts: &[&[u8]]) -> Hash {
    let mut h = Sha256::new();
    for p in parts {
        h.update(p);
    }
    h.finalize().into()
}

/// The value block holding `json`, referenced once more (created if new).
fn value_block(c: &Conn<'_>, json: &str) -> Result<i64, StoreError> {
    let hash = sha(&[b"v", json.as_bytes()]);
    if let Some(id) = c.query_row(
        "SELECT id FROM activity_blocks WHERE hash = ?1",
        params![hash.as_slice()],
        |r| r.get::<i64>(0),
    )? {
        add_ref(c, id, 1)?;
        return Ok(id);
    }
    insert(c, &hash, None, json)
}

fn insert(c: &Conn<'_>, hash: &Hash, parent: Option<i64>, data: &str) -> Result<i64, StoreError> {
    c.query_row(
        "INSERT INTO activity_blocks (hash, parent, refs, data) VALUES (?1, ?2, 1, ?3) RETURNING id",
        params![hash.as_slice(), parent, data],
        |r| r.get::<i64>(0),
    )?
    .ok_or_else(|| StoreError::Corrupt("a block insert returned no id".into()))
}

fn add_ref(c: &Conn<'_>, id: i64, n: i64) -> Result<(), StoreError> {
    let changed = c.execute(
        "UPDATE activity_blocks SET refs = refs + ?2 WHERE id = ?1",
        params![id, n],
    )?;
    if changed != 1 {
        return Err(StoreError::Corrupt(format!("activity block {id} is gone")));
    }
    Ok(())
}

/// Statement sizes for lists of keys: a list is cut into chunks of the largest size that it
/// fills, the last chunk padded with NULL, so only these few statements are ever prepared.
const CHUNKS: [usize; 3] = [512, 64, 8];

/// Splits `keys` into chunks of a size of [`CHUNKS`], padded with NULL.
fn chunks(keys: Vec<Value>) -> Vec<Vec<Value>> {
    let mut out = Vec::new();
    let mut rest = keys.as_slice();
    while !rest.is_empty() {
        let size = CHUNKS
            .into_iter()
            .find(|&s| rest.len() >= s)
            .unwrap_or(CHUNKS[CHUNKS.len() - 1]);
        let (head, tail) = rest.split_at(size.min(rest.len()));
        let mut chunk = head.to_vec();
        chunk.resize(size, Value::Null);
        out.push(chunk);
        rest = tail;
    }
    out
}

/// `?1, ?2, …, ?n`.
fn marks(n: usize) -> String {
    (1..=n)
        .map(|i| format!("?{i}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The chain block of `messages`, referenced once more: the stored block of the whole
/// conversation if there is one, else a new block with the messages after the longest stored
/// prefix.
fn chain(c: &Conn<'_>, messages: &[LlmMessage]) -> Result<i64, StoreError> {
    let jsons = messages
        .iter()
        .map(serde_json::to_string)
        .collect::<Result<Vec<_>, _>>()?;
    let mut hashes: Vec<Hash> = Vec::with_capacity(jsons.len());
    let mut h = sha(&[b"ac7 messages"]);
    for json in &jsons {
        h = sha(&[b"m", &h, json.as_bytes()]);
        hashes.push(h);
    }
    // The longest stored prefix: the last few positions first (the previous exchange of the
    // session ends two messages back), then the rest, from the end, until one is found.
    let n = hashes.len();
    let mut found: Option<(usize, i64)> = None;
    let mut end = n;
    while end > 0 && found.is_none() {
        let start = if end == n {
            end.saturating_sub(8)
        } else {
            end.saturating_sub(512)
        };
        let keys: Vec<Value> = hashes[start..end]
            .iter()
            .map(|h| Value::Blob(h.to_vec()))
            .collect();
        for chunk in chunks(keys) {
            let sql = format!(
                "SELECT id, hash FROM activity_blocks WHERE hash IN ({})",
                marks(chunk.len())
            );
            let args: Vec<&dyn ToValue> = chunk.iter().map(|v| v as &dyn ToValue).collect();
            for (id, hash) in c.query(&sql, &args, |r| {
                Ok((r.get::<i64>(0)?, r.get::<Vec<u8>>(1)?))
            })? {
                if let Some(k) = hashes[start..end].iter().position(|h| h[..] == hash[..]) {
                    let k = start + k + 1;
                    if found.is_none_or(|(best, _)| k > best) {
                        found = Some((k, id));
                    }
                }
            }
        }
        end = start;
    }
    match found {
        Some((k, id)) if k == n => {
            add_ref(c, id, 1)?;
            Ok(id)
        }
        found => {
            let (k, parent) = found.map_or((0, None), |(k, id)| (k, Some(id)));
            let mut data = String::with_capacity(jsons[k..].iter().map(|j| j.len() + 1).sum());
            data.push('[');
            data.push_str(&jsons[k..].join(","));
            data.push(']');
            let id = insert(c, &hashes[n - 1], parent, &data)?;
            if let Some(parent) = parent {
                add_ref(c, parent, 1)?;
            }
            Ok(id)
        }
    }
}

/// Drops one reference to each block of `refs` (a block named twice loses two); deletes the
/// blocks left without references, and so on up their chains. Returns how many blocks were
/// deleted. Inside the caller's transaction.
pub fn release(c: &Conn<'_>, refs: &[Refs]) -> Result<usize, StoreError> {
    let mut drop: HashMap<i64, i64> = HashMap::new();
    for id in refs.iter().flat_map(Refs::ids) {
        *drop.entry(id).or_default() += 1;
    }
    let mut deleted = 0;
    while !drop.is_empty() {
        // Group by how many references each block loses: one statement per group and chunk.
        let mut by_count: HashMap<i64, Vec<Value>> = HashMap::new();
        for (id, n) in &drop {
            by_count.entry(*n).or_default().push(Value::Int(*id));
        }
        let mut touched: Vec<Value> = Vec::with_capacity(drop.len());
        for (n, ids) in by_count {
            touched.extend(ids.iter().cloned());
            for chunk in chunks(ids) {
                let sql = format!(
                    "UPDATE activity_blocks SET refs = refs - ?1 WHERE id IN ({})",
                    (2..=chunk.len() + 1)
                        .map(|i| format!("?{i}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                );
                let mut args: Vec<&dyn ToValue> = vec![&n];
                args.extend(chunk.iter().map(|v| v as &dyn ToValue));
                c.execute(&sql, &args)?;
            }
        }
        // The blocks left without references go; their parents lose one each.
        let mut next: HashMap<i64, i64> = HashMap::new();
        for chunk in chunks(touched) {
            let sql = format!(
                "DELETE FROM activity_blocks WHERE refs <= 0 AND id IN ({}) RETURNING parent",
                marks(chunk.len())
            );
            let args: Vec<&dyn ToValue> = chunk.iter().map(|v| v as &dyn ToValue).collect();
            for parent in c.query(&sql, &args, |r| r.get::<Option<i64>>(0))? {
                deleted += 1;
                if let Some(parent) = parent {
                    *next.entry(parent).or_default() += 1;
                }
            }
        }
        drop = next;
    }
    Ok(deleted)
}

/// Blocks read for a set of rows, each decoded once.
#[derive(Debug, Default)]
pub struct Loaded {
    /// `id -> (parent, data)`.
    raw: HashMap<i64, (Option<i64>, String)>,
    systems: HashMap<i64, Rc<SystemPrompt>>,
    tools: HashMap<i64, Rc<Vec<LlmTool>>>,
    messages: HashMap<i64, Rc<Vec<LlmMessage>>>,
}

/// Reads every block `refs` point at, with the whole chains behind them (each block once).
pub fn load(c: &Conn<'_>, refs: &[Refs]) -> Result<Loaded, StoreError> {
    let mut ids: Vec<i64> = refs.iter().flat_map(Refs::ids).collect();
    ids.sort_unstable();
    ids.dedup();
    let mut loaded = Loaded::default();
    // First the blocks and their parents, walking each chain from its last block (UNION
    // visits a block shared by several chains once); then their data.
    let mut parents: Vec<(i64, Option<i64>)> = Vec::new();
    for chunk in chunks(ids.into_iter().map(Value::Int).collect()) {
        let sql = format!(
            "WITH RECURSIVE chain(id, parent) AS (
                 SELECT id, parent FROM activity_blocks WHERE id IN ({})
                 UNION
                 SELECT b.id, b.parent FROM activity_blocks b JOIN chain ON b.id = chain.parent
             )
             SELECT id, parent FROM chain",
            marks(chunk.len())
        );
        let args: Vec<&dyn ToValue> = chunk.iter().map(|v| v as &dyn ToValue).collect();
        parents.extend(c.query(&sql, &args, |r| {
            Ok((r.get::<i64>(0)?, r.get::<Option<i64>>(1)?))
        })?);
    }
    parents.sort_unstable();
    parents.dedup();
    let parent_of: HashMap<i64, Option<i64>> = parents.iter().copied().collect();
    let keys: Vec<Value> = parents.iter().map(|(id, _)| Value::Int(*id)).collect();
    for chunk in chunks(keys) {
        let sql = format!(
            "SELECT id, data FROM activity_blocks WHERE id IN ({})",
            marks(chunk.len())
        );
        let args: Vec<&dyn ToValue> = chunk.iter().map(|v| v as &dyn ToValue).collect();
        for (id, data) in c.query(&sql, &args, |r| Ok((r.get::<i64>(0)?, r.get::<String>(1)?)))? {
            let parent = parent_of.get(&id).copied().flatten();
            loaded.raw.insert(id, (parent, data));
        }
    }
    Ok(loaded)
}

impl Loaded {
    /// The parts `refs` point at; `None` when a block is missing or does not decode.
    pub fn parts(&mut self, refs: &Refs) -> Option<Parts> {
        let system = match refs.system {
            Some(id) => Some(SystemPrompt::clone(&*self.system(id)?)),
            None => None,
        };
        let tools = match refs.tools {
            Some(id) => Some(Vec::clone(&*self.tool_list(id)?)),
            None => None,
        };
        let messages = match refs.messages {
            Some(id) => self.conversation(id)?,
            None => Vec::new(),
        };
        Some(Parts {
            system,
            tools,
            messages,
        })
    }

    fn system(&mut self, id: i64) -> Option<Rc<SystemPrompt>> {
        if let Some(s) = self.systems.get(&id) {
            return Some(Rc::clone(s));
        }
        let s = Rc::new(serde_json::from_str(&self.raw.get(&id)?.1).ok()?);
        self.systems.insert(id, Rc::clone(&s));
        Some(s)
    }

    fn tool_list(&mut self, id: i64) -> Option<Rc<Vec<LlmTool>>> {
        if let Some(t) = self.tools.get(&id) {
            return Some(Rc::clone(t));
        }
        let t = Rc::new(serde_json::from_str(&self.raw.get(&id)?.1).ok()?);
        self.tools.insert(id, Rc::clone(&t));
        Some(t)
    }

    /// The messages of one chain block (not its parents').
    fn segment(&mut self, id: i64) -> Option<(Option<i64>, Rc<Vec<LlmMessage>>)> {
        let (parent, data) = self.raw.get(&id)?;
        let parent = *parent;
        if let Some(m) = self.messages.get(&id) {
            return Some((parent, Rc::clone(m)));
        }
        let m = Rc::new(serde_json::from_str::<Vec<LlmMessage>>(data).ok()?);
        self.messages.insert(id, Rc::clone(&m));
        Some((parent, m))
    }

    /// The whole conversation ending with chain block `id`.
    fn conversation(&mut self, id: i64) -> Option<Vec<LlmMessage>> {
        let mut segments = Vec::new();
        let mut next = Some(id);
        while let Some(id) = next {
            let (parent, m) = self.segment(id)?;
            segments.push(m);
            next = parent;
            if segments.len() > self.raw.len() {
                // A cycle: the store is corrupt.
                return None;
            }
        }
        let mut out = Vec::with_capacity(segments.iter().map(|s| s.len()).sum());
        for s in segments.iter().rev() {
            out.extend(s.iter().cloned());
        }
        Some(out)
    }
}
