//! What names a bucket's stream, and what a read-only copy follows (its origin): the leaf the
//! stream layout, the promotion record, fencing and start-up all build on.

use crate::config::MirrorSource;
use async_nats::jetstream::stream;

pub(super) fn stream_name(bucket: &str) -> String {
    format!("KV_{bucket}")
}

/// How long the stream remembers a write's message id (`Nats-Msg-Id`, `write.rs`). A write
/// sends its message again with the same id only within its own request (at most a few
/// seconds); the server keeps every id of the window in memory (about 100 bytes each), so the
/// window is short: NATS's 2 minutes would hold 1.2 million ids at 10,000 writes/s.
pub(super) const DEDUPE_WINDOW: std::time::Duration = std::time::Duration::from_secs(10);

/// What a read-only copy follows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Origin {
    /// The mirrored stream, `KV_<bucket>`.
    pub stream: String,
    /// The JetStream API prefix it is reached through (`$JS.edge.API`); `None`: this account's own.
    pub api: Option<String>,
}

impl Origin {
    pub fn bucket(&self) -> &str {
        self.stream.strip_prefix("KV_").unwrap_or(&self.stream)
    }

    /// The JetStream domain it lives in, when it is reached through one (`$JS.<domain>.API`).
    pub fn domain(&self) -> Option<&str> {
        let domain = self.api.as_deref()?.strip_prefix("$JS.")?.strip_suffix(".API")?;
        (!domain.contains('.')).then_some(domain)
    }

    /// `KV_kine (JetStream domain edge)`, for messages.
    pub fn describe(&self) -> String {
        match (self.domain(), self.api.as_deref()) {
            (Some(domain), _) => format!("{} (JetStream domain {domain})", self.stream),
            (None, Some(api)) => format!("{} (through {api})", self.stream),
            (None, None) => format!("{} (in this JetStream domain)", self.stream),
        }
    }

    pub(super) fn from_source(source: &stream::Source) -> Origin {
        let api = source
            .external
            .as_ref()
            .map(|e| e.api_prefix.clone())
            .or_else(|| source.domain.as_ref().map(|d| format!("$JS.{d}.API")))
            .filter(|a| !a.is_empty() && a != "$JS.API");
        Origin { stream: source.name.clone(), api }
    }

    pub(super) fn wanted(bucket: &str, source: &MirrorSource) -> Origin {
        let api = match source {
            MirrorSource::Local => None,
            MirrorSource::Domain(d) => Some(format!("$JS.{d}.API")),
            MirrorSource::Api(a) => Some(a.clone()),
        };
        Origin { stream: format!("KV_{bucket}"), api }
    }

    /// A mirror source for `stream_name` of the origin (its bucket's stream or meta stream).
    pub(super) fn source(&self, stream_name: String) -> stream::Source {
        stream::Source {
            name: stream_name,
            external: self.api.clone().map(|api_prefix| stream::External { api_prefix, delivery_prefix: None }),
            ..Default::default()
        }
    }
}
