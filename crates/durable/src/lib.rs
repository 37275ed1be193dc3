//! S3 durability for kine-rs's datastores (issue 23; in progress, not wired into the binary
//! yet): every committed revision shipped to object storage as WAL segments, checkpoints of
//! the whole key space, a manifest naming the newest checkpoint, a writer lock with a term, and
//! the restore that rebuilds a store from them. It works through the core `Backend` API, so it
//! knows no SQL.

pub mod backend;
pub mod checkpoint;
pub mod keeper;
pub mod lock;
pub mod manifest;
pub mod node;
pub mod restore;
pub mod segment;
pub mod ship;
