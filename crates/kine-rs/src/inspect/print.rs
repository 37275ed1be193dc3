//! How `kine-rs inspect` prints: tab-separated text with a header (keys and values escaped
//! where they are not printable), or JSON, one object per line, with etcd's conventions (keys
//! and values in base64, as `etcdctl -w json` prints them).

use crate::cli::inspect::Output;
use base64::Engine as _;
use kine_core::{KeyValue, Revision};
use std::io::Write;

pub struct Printer {
    out: std::io::BufWriter<std::io::Stdout>,
    format: Output,
    /// The text header printed (once, before the first row).
    headed: bool,
}

/// Printable text as it is; anything else with its bytes escaped (`\x00`, `\n`, `\xc3`).
pub fn escaped(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(s) if !s.chars().any(char::is_control) => s.to_string(),
        _ => bytes.escape_ascii().to_string(),
    }
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn kv_json(kv: &KeyValue, with_value: bool) -> serde_json::Value {
    let mut o = serde_json::json!({
        "key": b64(&kv.key),
        "create_revision": kv.create_revision,
        "mod_revision": kv.mod_revision,
        "version": kv.version,
        "lease": kv.lease,
        "value_size": kv.value.len(),
    });
    if with_value {
        o["value"] = b64(&kv.value).into();
    }
    o
}

/// The text columns of a version (header and row share the order).
const KV_COLUMNS: &str = "KEY\tMOD_REVISION\tCREATE_REVISION\tVERSION\tLEASE\tBYTES";

fn kv_text(kv: &KeyValue, with_value: bool) -> String {
    let mut row = format!(
        "{}\t{}\t{}\t{}\t{}\t{}",
        escaped(&kv.key),
        kv.mod_revision,
        kv.create_revision,
        kv.version,
        kv.lease,
        kv.value.len()
    );
    if with_value {
        row.push('\t');
        row.push_str(&escaped(&kv.value));
    }
    row
}

impl Printer {
    pub fn new(format: Output) -> Printer {
        Printer { out: std::io::BufWriter::new(std::io::stdout()), format, headed: false }
    }

    fn header(&mut self, header: &str, with_value: bool) -> std::io::Result<()> {
        if self.format == Output::Text && !self.headed {
            self.headed = true;
            writeln!(self.out, "{header}{}", if with_value { "\tVALUE" } else { "" })?;
        }
        Ok(())
    }

    fn json(&mut self, value: serde_json::Value) -> std::io::Result<()> {
        writeln!(self.out, "{value}")
    }

    /// A key's version (list, get).
    pub fn kv(&mut self, kv: &KeyValue, with_value: bool) -> std::io::Result<()> {
        self.header(KV_COLUMNS, with_value)?;
        match self.format {
            Output::Text => writeln!(self.out, "{}", kv_text(kv, with_value)),
            Output::Json => self.json(kv_json(kv, with_value)),
        }
    }

    /// One change of a key's history: a put (the version written) or a delete.
    pub fn change(&mut self, revision: Revision, kind: &str, kv: &KeyValue, with_value: bool) -> std::io::Result<()> {
        self.header(&format!("REVISION\tEVENT\t{KV_COLUMNS}"), with_value)?;
        match self.format {
            Output::Text => writeln!(self.out, "{revision}\t{kind}\t{}", kv_text(kv, with_value)),
            Output::Json => {
                self.json(serde_json::json!({"revision": revision, "type": kind, "kv": kv_json(kv, with_value)}))
            }
        }
    }

    /// A key that differs between two revisions: `created`, `deleted` or `changed`.
    pub fn difference(
        &mut self,
        change: &str,
        key: &[u8],
        from: Option<&KeyValue>,
        to: Option<&KeyValue>,
    ) -> std::io::Result<()> {
        self.header("CHANGE\tKEY\tFROM_MOD_REVISION\tTO_MOD_REVISION", false)?;
        match self.format {
            Output::Text => {
                let rev = |kv: Option<&KeyValue>| kv.map_or("-".to_string(), |kv| kv.mod_revision.to_string());
                writeln!(self.out, "{change}\t{}\t{}\t{}", escaped(key), rev(from), rev(to))
            }
            Output::Json => {
                let side = |kv: Option<&KeyValue>| kv.map_or(serde_json::Value::Null, |kv| kv_json(kv, false));
                self.json(serde_json::json!({"change": change, "key": b64(key), "from": side(from), "to": side(to)}))
            }
        }
    }

    /// Named numbers (status), one per line in text.
    pub fn fields(&mut self, fields: &[(&str, serde_json::Value)]) -> std::io::Result<()> {
        match self.format {
            Output::Text => fields.iter().try_for_each(|(name, value)| writeln!(self.out, "{name}\t{value}")),
            Output::Json => {
                let map: serde_json::Map<String, serde_json::Value> =
                    fields.iter().map(|(name, value)| (name.to_string(), value.clone())).collect();
                self.json(map.into())
            }
        }
    }

    pub fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::escaped;

    #[test]
    fn values_print_as_text_only_when_printable() {
        assert_eq!(escaped(b"/registry/pods/default/a"), "/registry/pods/default/a");
        assert_eq!(escaped("ünïcode".as_bytes()), "ünïcode");
        assert_eq!(escaped(b"k8s\x00\n\x02"), "k8s\\x00\\n\\x02");
        assert_eq!(escaped(&[0xff, b'a']), "\\xffa");
    }
}
