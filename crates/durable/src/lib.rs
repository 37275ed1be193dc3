//! S3 durability for the SQLite datastore (issue 23; work in progress on branch `s3`): every
//! committed revision shipped to object storage as WAL segments, periodic checkpoints, a
//! manifest naming both, and a writer lock with a term (docs: /work/notes/s3-design.md until
//! it lands).

pub mod lock;
pub mod manifest;
pub mod segment;
