//! sea-orm entities, one file per table. Timestamps are milliseconds since the Unix epoch (portable
//! between SQLite and PostgreSQL, and cheap to compare in lease checks); protobuf-shaped values
//! (requests, usage, receipts, events, checkpoints) are stored as their protobuf encoding.

pub mod checkpoint_blobs;
pub mod checkpoints;
pub mod feedback;
pub mod run_events;
pub mod run_inputs;
pub mod runs;
pub mod threads;
pub mod tool_effects;
pub mod workers;
