//! Compact checkpoints. A checkpoint row holds what changed since its parent — how many of the
//! parent's messages it keeps (a prefix), the messages appended after them, the state keys set or
//! removed — or, every `runs.checkpoint_snapshot_every` steps, a full snapshot, so reading any
//! checkpoint replays at most that many deltas over one snapshot. A summarization or a rollback
//! that shrinks or replaces the message list is just a delta that keeps a shorter prefix (keeping
//! none writes a snapshot instead). Messages larger than `runs.checkpoint_blob_min_bytes` are
//! stored once per thread in `checkpoint_blobs`, keyed by the sha256 of their encoding, and
//! referenced from every row that holds them.
//!
//! Rows written before (`encoding` 0) hold a whole `Checkpoint`: a snapshot with no parent
//! to replay, read as they always were.

use std::collections::{BTreeSet, HashMap};

use antler_proto::common::Message;
use antler_proto::runs::Checkpoint;
use prost::Message as _;
use sea_orm::sea_query::OnConflict;
use sea_orm::{ColumnTrait, ConnectionTrait, EntityTrait, QueryFilter};
use sha2::Digest;

use crate::error::RunsError;
use crate::store::StoreError;
use crate::store::entity::{checkpoint_blobs, checkpoints};

/// `checkpoints.encoding` of a whole `Checkpoint` (every row written before compact checkpoints).
pub const ENCODING_FULL: i32 = 0;
/// `checkpoints.encoding` of a [`Stored`].
pub const ENCODING_STORED: i32 = 1;

/// A checkpoint row's `state` (encoding 1).
#[derive(Clone, PartialEq, prost::Message)]
pub struct Stored {
    /// The checkpoint's id, parent, step, run, source and time, without messages; with its full
    /// values on a snapshot, without them on a delta.
    #[prost(message, optional, tag = "1")]
    pub header: Option<Checkpoint>,
    /// A snapshot: `messages` is the whole list and `header.values` every value.
    #[prost(bool, tag = "2")]
    pub snapshot: bool,
    /// Deltas between this row and its snapshot (0 for a snapshot).
    #[prost(uint32, tag = "3")]
    pub depth: u32,
    /// Delta: how many of the parent's messages this checkpoint keeps, in order (fewer than the
    /// parent had when the list was truncated or rewritten).
    #[prost(uint64, tag = "4")]
    pub keep: u64,
    /// Snapshot: every message; delta: the messages after the kept ones.
    #[prost(message, repeated, tag = "5")]
    pub messages: Vec<StoredMessage>,
    /// Delta: the values set (added or changed) since the parent.
    #[prost(message, optional, tag = "6")]
    pub set_values: Option<prost_types::Struct>,
    /// Delta: the value keys removed since the parent.
    #[prost(string, repeated, tag = "7")]
    pub removed_keys: Vec<String>,
}

/// One message of a [`Stored`]: inline, or the sha256 of a row of `checkpoint_blobs`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct StoredMessage {
    #[prost(message, optional, tag = "1")]
    pub inline: Option<Message>,
    /// Hex sha256 of the message's encoding, stored in `checkpoint_blobs`.
    #[prost(string, tag = "2")]
    pub blob: String,
}

/// A checkpoint's whole state, as a writer keeps it to compute the next delta.
#[derive(Debug, Clone, Default)]
pub struct Full {
    pub checkpoint_id: String,
    pub messages: Vec<Message>,
    pub values: prost_types::Struct,
    /// Deltas since its snapshot.
    pub depth: u32,
}

/// How a writer stores checkpoints.
#[derive(Debug, Clone, Copy)]
pub struct Policy {
    /// A snapshot when the parent is this many deltas from its own (1: every checkpoint is one).
    pub snapshot_every: u32,
    /// Messages whose encoding is at least this large go to `checkpoint_blobs`.
    pub blob_min_bytes: u32,
}

/// A row to insert, the blobs it needs, and the state it stands for.
#[derive(Debug)]
pub struct Encoded {
    pub state: Vec<u8>,
    pub blobs: Vec<(String, Vec<u8>)>,
    pub depth: u32,
    pub snapshot: bool,
}

/// Encodes `state` (already redacted, messages and values whole) against `parent`, its parent's
/// whole state (None: the thread's first checkpoint, or a parent not known → a snapshot).
pub fn encode(state: &Checkpoint, parent: Option<&Full>, policy: Policy) -> Encoded {
    // The header is the state without its messages (stored apart below) and, for a delta, without
    // its values. Built field by field: cloning the whole state and then emptying the clone's
    // messages copied the whole conversation at every step (heaptrack's largest site in ten-turn
    // runs, #32).
    let keep = parent.map(|p| common_prefix(&p.messages, &state.messages)).unwrap_or(0);
    let delta_parent = parent.filter(|p| p.depth + 1 < policy.snapshot_every && (keep > 0 || p.messages.is_empty()));
    let Checkpoint { checkpoint_id, parent_checkpoint_id, step, values, created_at, run_id, messages: _, source } = state;
    let header = Checkpoint {
        checkpoint_id: checkpoint_id.clone(),
        parent_checkpoint_id: parent_checkpoint_id.clone(),
        step: *step,
        values: if delta_parent.is_some() { None } else { values.clone() },
        created_at: *created_at,
        run_id: run_id.clone(),
        messages: Vec::new(),
        source: source.clone(),
    };
    let no_values = prost_types::Struct::default();
    let values = values.as_ref().unwrap_or(&no_values);
    let mut blobs = Vec::new();
    let mut stored_message = |m: &Message| {
        let len = m.encoded_len();
        if len >= policy.blob_min_bytes as usize {
            let bytes = m.encode_to_vec();
            let sha = hex::encode(sha2::Sha256::digest(&bytes));
            blobs.push((sha.clone(), bytes));
            StoredMessage { inline: None, blob: sha }
        } else {
            StoredMessage { inline: Some(m.clone()), blob: String::new() }
        }
    };
    let stored = match delta_parent {
        Some(parent) => {
            let mut set = prost_types::Struct::default();
            for (key, value) in &values.fields {
                if parent.values.fields.get(key) != Some(value) {
                    set.fields.insert(key.clone(), value.clone());
                }
            }
            let removed = parent.values.fields.keys().filter(|k| !values.fields.contains_key(*k)).cloned().collect();
            Stored {
                header: Some(header),
                snapshot: false,
                depth: parent.depth + 1,
                keep: keep as u64,
                messages: state.messages[keep..].iter().map(&mut stored_message).collect(),
                set_values: (!set.fields.is_empty()).then_some(set),
                removed_keys: removed,
            }
        }
        None => Stored {
            header: Some(header),
            snapshot: true,
            depth: 0,
            keep: 0,
            messages: state.messages.iter().map(&mut stored_message).collect(),
            set_values: None,
            removed_keys: Vec::new(),
        },
    };
    Encoded { state: stored.encode_to_vec(), blobs, depth: stored.depth, snapshot: stored.snapshot }
}

/// How many leading messages two lists share.
fn common_prefix(a: &[Message], b: &[Message]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// Inserts a row's blobs (those already stored are left as they are).
pub async fn insert_blobs<C: ConnectionTrait>(
    db: &C,
    user_id: &str,
    thread_id: &str,
    blobs: &[(String, Vec<u8>)],
    now: i64,
) -> Result<(), sea_orm::DbErr> {
    let mut seen = BTreeSet::new();
    for (sha, bytes) in blobs {
        if !seen.insert(sha) {
            continue;
        }
        let row = checkpoint_blobs::Model {
            user_id: user_id.to_owned(),
            thread_id: thread_id.to_owned(),
            sha256: sha.clone(),
            content: bytes.clone(),
            created_at: now,
        };
        checkpoint_blobs::Entity::insert(checkpoint_blobs::ActiveModel::from(row))
            .on_conflict(
                OnConflict::columns([
                    checkpoint_blobs::Column::UserId,
                    checkpoint_blobs::Column::ThreadId,
                    checkpoint_blobs::Column::Sha256,
                ])
                .do_nothing()
                .to_owned(),
            )
            .exec_without_returning(db)
            .await?;
    }
    Ok(())
}

fn corrupt(message: String) -> RunsError {
    RunsError::Store(StoreError::Corrupt(message))
}

/// The whole checkpoint a row stands for (messages left empty unless `with_messages`), replaying
/// its deltas over their snapshot. Returns the state and the row's depth.
pub async fn read<C: ConnectionTrait>(db: &C, row: &checkpoints::Model, with_messages: bool) -> Result<(Checkpoint, u32), RunsError> {
    if row.encoding == ENCODING_FULL {
        let mut checkpoint = Checkpoint::decode(row.state.as_slice())?;
        if !with_messages {
            checkpoint.messages.clear();
        }
        return Ok((checkpoint, 0));
    }
    // The chain from this row back to its snapshot (or to a whole checkpoint of before).
    let mut chain: Vec<Stored> = Vec::new();
    let mut base: Option<Checkpoint> = None;
    let mut current = row.clone();
    loop {
        if current.encoding == ENCODING_FULL {
            base = Some(Checkpoint::decode(current.state.as_slice())?);
            break;
        }
        if current.encoding != ENCODING_STORED {
            return Err(corrupt(format!("checkpoint {} has unknown encoding {}", current.checkpoint_id, current.encoding)));
        }
        let stored = Stored::decode(current.state.as_slice())?;
        let snapshot = stored.snapshot;
        chain.push(stored);
        if snapshot {
            break;
        }
        // A delta's depth bounds its chain; a longer one is damage, not a reason to loop.
        if chain.len() > 100_000 {
            return Err(corrupt(format!("checkpoint {} replays more than 100000 deltas", row.checkpoint_id)));
        }
        let Some(parent_id) = current.parent_checkpoint_id.clone() else {
            return Err(corrupt(format!("delta checkpoint {} has no parent", current.checkpoint_id)));
        };
        current = checkpoints::Entity::find_by_id(parent_id.clone())
            .filter(checkpoints::Column::UserId.eq(row.user_id.as_str()))
            .filter(checkpoints::Column::ThreadId.eq(row.thread_id.as_str()))
            .one(db)
            .await?
            .ok_or_else(|| corrupt(format!("checkpoint {parent_id}, parent of delta {}, is missing", current.checkpoint_id)))?;
    }
    let blobs = if with_messages { load_blobs(db, row, &chain).await? } else { HashMap::new() };
    let resolve = |m: &StoredMessage| -> Result<Message, RunsError> {
        match &m.inline {
            Some(message) => Ok(message.clone()),
            None => blobs.get(&m.blob).cloned().ok_or_else(|| corrupt(format!("checkpoint blob {} is missing", m.blob))),
        }
    };
    let mut messages: Vec<Message> = Vec::new();
    let mut values = prost_types::Struct::default();
    if let Some(base) = base {
        messages = if with_messages { base.messages } else { Vec::new() };
        values = base.values.unwrap_or_default();
    }
    // Oldest first: the snapshot (or whole checkpoint), then each delta.
    let mut count: u64 = messages.len() as u64;
    for stored in chain.iter().rev() {
        if stored.snapshot {
            values = stored.header.as_ref().and_then(|h| h.values.clone()).unwrap_or_default();
            messages.clear();
            count = 0;
        } else {
            if stored.keep > count {
                return Err(corrupt(format!("a delta keeps {} messages of a parent with {count}", stored.keep)));
            }
            if with_messages {
                messages.truncate(stored.keep as usize);
            }
            count = stored.keep;
            for key in &stored.removed_keys {
                values.fields.remove(key);
            }
            if let Some(set) = &stored.set_values {
                values.fields.extend(set.fields.iter().map(|(k, v)| (k.clone(), v.clone())));
            }
        }
        count += stored.messages.len() as u64;
        if with_messages {
            for m in &stored.messages {
                messages.push(resolve(m)?);
            }
        }
    }
    let depth = chain.first().map(|s| s.depth).unwrap_or(0);
    let mut checkpoint = match chain.into_iter().next().and_then(|s| s.header) {
        Some(header) => header,
        None => return Err(corrupt(format!("checkpoint {} has no header", row.checkpoint_id))),
    };
    checkpoint.values = Some(values);
    checkpoint.messages = messages;
    Ok((checkpoint, depth))
}

/// The blobs a chain references, in one query per 500.
async fn load_blobs<C: ConnectionTrait>(db: &C, row: &checkpoints::Model, chain: &[Stored]) -> Result<HashMap<String, Message>, RunsError> {
    let wanted: BTreeSet<String> =
        chain.iter().flat_map(|s| s.messages.iter()).filter(|m| m.inline.is_none()).map(|m| m.blob.clone()).collect();
    let wanted: Vec<String> = wanted.into_iter().collect();
    let mut out = HashMap::with_capacity(wanted.len());
    for chunk in wanted.chunks(500) {
        let rows = checkpoint_blobs::Entity::find()
            .filter(checkpoint_blobs::Column::UserId.eq(row.user_id.as_str()))
            .filter(checkpoint_blobs::Column::ThreadId.eq(row.thread_id.as_str()))
            .filter(checkpoint_blobs::Column::Sha256.is_in(chunk.iter().cloned()))
            .all(db)
            .await?;
        for blob in rows {
            out.insert(blob.sha256, Message::decode(blob.content.as_slice())?);
        }
    }
    Ok(out)
}

/// Reads a checkpoint of a thread by id (None if there is no such row).
pub async fn find<C: ConnectionTrait>(
    db: &C,
    user_id: &str,
    thread_id: &str,
    checkpoint_id: &str,
    with_messages: bool,
) -> Result<Option<(Checkpoint, u32)>, RunsError> {
    let row = checkpoints::Entity::find_by_id(checkpoint_id.to_owned())
        .filter(checkpoints::Column::UserId.eq(user_id))
        .filter(checkpoints::Column::ThreadId.eq(thread_id))
        .one(db)
        .await?;
    match row {
        Some(row) => Ok(Some(read(db, &row, with_messages).await?)),
        None => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use antler_proto::common::{ContentPart, Role, TextPart, content_part};

    fn text(t: &str) -> Message {
        Message {
            role: Role::User as i32,
            content: vec![ContentPart { part: Some(content_part::Part::Text(TextPart { text: t.to_owned() })) }],
            ..Message::default()
        }
    }

    fn state(id: &str, messages: Vec<Message>, keys: &[(&str, &str)]) -> Checkpoint {
        let mut values = prost_types::Struct::default();
        for (k, v) in keys {
            values
                .fields
                .insert((*k).to_owned(), prost_types::Value { kind: Some(prost_types::value::Kind::StringValue((*v).to_owned())) });
        }
        Checkpoint { checkpoint_id: id.to_owned(), values: Some(values), messages, ..Checkpoint::default() }
    }

    const POLICY: Policy = Policy { snapshot_every: 4, blob_min_bytes: 1024 };

    #[test]
    fn a_delta_holds_only_what_changed_and_a_snapshot_comes_every_n() -> Result<(), prost::DecodeError> {
        let parent = Full {
            checkpoint_id: "a".into(),
            messages: vec![text("one"), text("two")],
            values: state("a", vec![], &[("title", "t"), ("gone", "x")]).values.unwrap_or_default(),
            depth: 0,
        };
        let next = state("b", vec![text("one"), text("two"), text("three")], &[("title", "t"), ("todos", "y")]);
        let encoded = encode(&next, Some(&parent), POLICY);
        let stored = Stored::decode(encoded.state.as_slice())?;
        assert!(!stored.snapshot);
        assert_eq!((stored.depth, stored.keep, stored.messages.len()), (1, 2, 1));
        assert_eq!(stored.set_values.map(|s| s.fields.keys().cloned().collect::<Vec<_>>()), Some(vec!["todos".to_owned()]));
        assert_eq!(stored.removed_keys, vec!["gone".to_owned()]);
        // A delta's header is the state without messages or values; a snapshot's keeps the values.
        let header = stored.header.unwrap_or_default();
        assert_eq!(header, Checkpoint { messages: Vec::new(), values: None, ..next.clone() });
        // The parent is 3 deltas from its snapshot: the next is a snapshot.
        let deep = Full { depth: 3, ..parent.clone() };
        let snapshot = Stored::decode(encode(&next, Some(&deep), POLICY).state.as_slice())?;
        assert!(snapshot.snapshot);
        assert_eq!(snapshot.header.unwrap_or_default(), Checkpoint { messages: Vec::new(), ..next.clone() });
        // A list replaced from the first message on (a summarization) is a snapshot.
        let replaced = state("c", vec![text("summary"), text("two")], &[]);
        assert!(Stored::decode(encode(&replaced, Some(&parent), POLICY).state.as_slice())?.snapshot);
        // A truncated list keeps a shorter prefix.
        let truncated = state("d", vec![text("one")], &[]);
        let stored = Stored::decode(encode(&truncated, Some(&parent), POLICY).state.as_slice())?;
        assert_eq!((stored.snapshot, stored.keep, stored.messages.len()), (false, 1, 0));
        Ok(())
    }

    #[test]
    fn large_messages_go_to_blobs_by_content() {
        let big = text(&"x".repeat(4096));
        let next = state("b", vec![text("small"), big.clone(), big], &[]);
        let encoded = encode(&next, None, POLICY);
        assert_eq!(encoded.blobs.len(), 2);
        assert_eq!(encoded.blobs[0].0, encoded.blobs[1].0);
        assert!(encoded.state.len() < 1024, "{} bytes", encoded.state.len());
    }
}
