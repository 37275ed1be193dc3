//! kine-rs core: etcd's revision model and API semantics, independent of gRPC and of any
//! datastore. Backends plug in through [`backend::Backend`]; the shared write engine
//! ([`txn`]) and range logic ([`range`]) run over the narrow [`view`] traits.

pub mod alarm;
pub mod auth;
pub mod backend;
pub mod budget;
pub mod compactor;
pub mod duration;
pub mod election;
pub mod error;
pub mod foreign;
pub mod health;
pub mod id;
pub mod lease;
pub mod lock;
pub mod members;
pub mod memory;
pub mod metered;
pub mod metrics;
pub mod page_counts;
pub mod pages;
pub mod range;
pub mod range_stream;
pub mod request;
pub mod rounds;
pub mod shutdown;
pub mod snapshot;
pub mod store;
pub mod txn;
pub mod types;
pub mod validate;
pub mod view;
pub mod watch;

pub use error::{Error, Result};
pub use types::*;
