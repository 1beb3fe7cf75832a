//! sea-orm entities, one file per table. Timestamps are milliseconds since the Unix epoch (portable
//! between SQLite and PostgreSQL, cheap to compare in lease checks).

pub mod facts;
pub mod profiles;
pub mod scopes;
pub mod updates;
