//! A stream that holds messages but no kine-rs marker, looked at before anything is written to
//! it (or beside it: the meta bucket is created only after the marker is found): its first
//! messages are decoded as Go kine's records (`crate::gokine`). Go kine's bucket is refused
//! as such (`kine_core::foreign`, `ForeignKind::GoKine`: the binary names `kine-rs migrate`);
//! anything else is refused naming what it is not.

use super::origin::stream_name;
use crate::gokine::{self, Looked};
use async_nats::jetstream::{self, stream};
use kine_core::foreign::{Foreign, ForeignKind, thousands};

/// Messages looked at, at most, for one that tells (Go kine's deletions leave markers without
/// a payload; a record follows each).
const LOOK_AT: usize = 32;

/// The refusal of bucket `bucket`'s stream, which holds messages and no `~init` marker.
/// `mirrors`: the origin it mirrors (a read-only copy's), for the message.
pub(super) async fn refusal(js: &jetstream::Context, bucket: &str, mirrors: Option<&str>) -> anyhow::Error {
    let name = stream_name(bucket);
    let mut stream = match js.get_stream(&name).await {
        Ok(s) => s,
        Err(e) => return anyhow::anyhow!("read stream {name}: {e}"),
    };
    let info = match stream.info().await {
        Ok(i) => i.clone(),
        Err(e) => return anyhow::anyhow!("read stream {name}: {e}"),
    };
    let (messages, last) = (info.state.messages, info.state.last_sequence);
    let mut next = info.state.first_sequence.max(1);
    let mut neither = None;
    let mut go_kine = None;
    let mut seen = 0;
    for _ in 0..LOOK_AT {
        let message = match stream.get_first_raw_message_by_subject(">", next).await {
            Ok(m) => m,
            Err(e) if e.kind() == stream::RawMessageErrorKind::NoMessageFound => break,
            Err(e) => return anyhow::anyhow!("read stream {name} at sequence {next}: {e}"),
        };
        next = message.sequence + 1;
        seen += 1;
        let headers = (!message.headers.is_empty()).then_some(&message.headers);
        match gokine::look(&message.subject, headers, &message.payload) {
            Looked::Marker => continue,
            Looked::GoKine { key } => go_kine = Some((key, message.sequence)),
            Looked::Neither(why) => {
                neither =
                    Some(format!("its message at sequence {} (subject {}): {why}", message.sequence, message.subject))
            }
        }
        break;
    }
    let plural = if messages == 1 { "" } else { "s" };
    let counts = format!("{} message{plural}, last sequence {}", thousands(messages as i64), thousands(last as i64));
    let (kind, found) = match (go_kine, mirrors) {
        (Some((key, seq)), None) => (
            ForeignKind::GoKine,
            format!(
                "NATS bucket {bucket} is Go kine's (stream {name}: {counts}; S2-compressed JSON records under base58 key \
                 tokens, such as key {key} at revision {seq}), not kine-rs's"
            ),
        ),
        (Some((key, seq)), Some(origin)) => (
            ForeignKind::Other,
            format!(
                "NATS bucket {bucket} mirrors {origin}, which is Go kine's bucket (stream {name}: {counts}; such as \
                 key {key} at revision {seq}): a read-only copy follows a kine-rs bucket only; convert Go kine's \
                 bucket with kine-rs migrate first"
            ),
        ),
        (None, _) => {
            let why = neither.unwrap_or_else(|| match seen {
                0 => "no message is left in it to tell by".to_string(),
                n => format!("its first {n} messages are all deletion markers"),
            });
            let what = match mirrors {
                Some(origin) => format!("NATS bucket {bucket} mirrors {origin}, which is not a kine-rs bucket: it"),
                None => format!("NATS bucket {bucket} (stream {name})"),
            };
            (
                ForeignKind::Other,
                format!(
                    "{what} holds data that is neither kine-rs's (no kine-rs marker at its start) nor Go kine's: \
                     {why} ({counts}); kine-rs does not write to it: use another bucket (?bucket=NAME)"
                ),
            )
        }
    };
    anyhow::Error::new(Foreign::new(kind, found))
}
