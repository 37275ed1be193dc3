//! S3 durability for kine-rs's SQLite datastore (`--s3-bucket`, docs/s3.md): every committed
//! revision shipped to object storage as WAL segments, checkpoints of the whole key space, a
//! manifest naming the newest checkpoint, a writer lock with a term, the restore that rebuilds a
//! store from them, and followers that serve a read-only copy and keep their local database
//! current until they take the lock. It works through the core `Backend` API, so it knows no
//! SQL.
pub mod apply;
pub mod backend;
pub mod checkpoint;
pub mod copy;
pub mod follow;
pub mod following;
pub mod keeper;
pub mod lock;
pub mod manifest;
pub mod marker;
pub mod node;
pub mod options;
pub mod restore;
pub mod runner;
pub mod segment;
pub mod ship;
pub mod standby;
pub(crate) mod standby_apply;
