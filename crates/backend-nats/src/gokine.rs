//! Go kine's bucket format (kine's `pkg/drivers/nats/codec.go`), enough to recognise it: a
//! change is a message on `$KV.<bucket>.<tokens>`, each `/`-separated part of the key one
//! base58 token (Bitcoin alphabet; a key without a leading `/` starts with the token `meta`,
//! an empty part is base58 of `/`), whose payload is a JSON record
//! `{"KV":{"Key":…,"Value":…,…},"PrevRevision":…,"Create":…,"Delete":…}` compressed as an
//! S2 stream (klauspost/compress). Deletions add a `KV-Operation: DEL` marker with no payload.

use async_nats::HeaderMap;

/// What one message of a bucket without kine-rs's marker is.
#[derive(Debug, PartialEq, Eq)]
pub enum Looked {
    /// A Go kine record of this key (decoded from the subject, equal to the record's).
    GoKine { key: String },
    /// A deletion or purge marker: no payload to tell by.
    Marker,
    /// Neither Go kine's nor kine-rs's: why not.
    Neither(String),
}

/// Looks at one stored message.
pub fn look(subject: &str, headers: Option<&HeaderMap>, payload: &[u8]) -> Looked {
    let operation = headers.and_then(|h| h.get("KV-Operation")).map(|v| v.as_str().to_string());
    if payload.is_empty() && matches!(operation.as_deref(), Some("DEL" | "PURGE")) {
        return Looked::Marker;
    }
    let Some(tokens) = subject.strip_prefix("$KV.").and_then(|rest| rest.split_once('.')).map(|(_, t)| t) else {
        return Looked::Neither("the subject is not a key-value bucket's ($KV.<bucket>.<key>)".into());
    };
    let Some(subject_key) = decode_key(tokens) else {
        return Looked::Neither(format!("the subject's key {tokens} is not base58 tokens (Go kine's keys)"));
    };
    let json = if payload.starts_with(&[0xff, 0x06, 0x00, 0x00]) {
        match s2_decode(payload) {
            Ok(j) => j,
            Err(e) => return Looked::Neither(format!("the payload is not an S2 stream ({e})")),
        }
    } else {
        payload.to_vec()
    };
    let record: serde_json::Value = match serde_json::from_slice(&json) {
        Ok(v) => v,
        Err(_) => return Looked::Neither("the payload is neither S2-compressed nor plain JSON".into()),
    };
    match record.get("KV").and_then(|kv| kv.get("Key")).and_then(|k| k.as_str()) {
        Some(key) if key.as_bytes() == subject_key.as_slice() => Looked::GoKine { key: key.to_string() },
        Some(key) => Looked::Neither(format!("the record's key {key:?} is not the one the subject names")),
        None => Looked::Neither("the payload is JSON without Go kine's KV.Key".into()),
    }
}

/// Go kine's subject tokens → the key.
pub fn decode_key(tokens: &str) -> Option<Vec<u8>> {
    let mut parts = tokens.split('.').peekable();
    let rooted = parts.peek() != Some(&"meta");
    if !rooted {
        parts.next();
    }
    let mut key = Vec::new();
    let mut any = false;
    for (i, token) in parts.enumerate() {
        let part = base58_decode(token)?;
        if rooted || i > 0 {
            key.push(b'/');
        }
        if part != b"/" {
            key.extend_from_slice(&part);
        }
        any = true;
    }
    any.then_some(key)
}

const BASE58: &[u8; 58] = b"123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz";

/// Base58 (Bitcoin alphabet), as github.com/shengdoushi/base58 encodes: a leading `1` per
/// leading zero byte.
pub fn base58_decode(text: &str) -> Option<Vec<u8>> {
    if text.is_empty() {
        return None;
    }
    let zeros = text.bytes().take_while(|&b| b == b'1').count();
    // Little-endian base-256 digits of the number.
    let mut bytes: Vec<u8> = Vec::new();
    for c in text.bytes().skip(zeros) {
        let mut carry = BASE58.iter().position(|&a| a == c)? as u32;
        for b in bytes.iter_mut() {
            carry += u32::from(*b) * 58;
            *b = carry as u8;
            carry >>= 8;
        }
        while carry > 0 {
            bytes.push(carry as u8);
            carry >>= 8;
        }
    }
    let mut out = vec![0u8; zeros];
    out.extend(bytes.iter().rev());
    Some(out)
}

/// The largest block an S2 stream holds (and a bound on what is decoded here).
const MAX_BLOCK: usize = 4 << 20;

/// Decodes an S2 (or Snappy) framed stream: stream identifier, then compressed and
/// uncompressed chunks (checksums not verified: a record that decodes to the JSON it should is
/// evidence enough).
pub fn s2_decode(src: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    let mut rest = src;
    let mut first = true;
    while !rest.is_empty() {
        if rest.len() < 4 {
            return Err("a chunk header is cut short".into());
        }
        let kind = rest[0];
        let len = usize::from(rest[1]) | usize::from(rest[2]) << 8 | usize::from(rest[3]) << 16;
        let body = rest.get(4..4 + len).ok_or("a chunk is cut short")?;
        rest = &rest[4 + len..];
        if first && kind != 0xff {
            return Err("no stream identifier".into());
        }
        first = false;
        match kind {
            0xff if body == b"S2sTwO" || body == b"sNaPpY" => {}
            0xff => return Err("an unknown stream identifier".into()),
            0x00 => {
                let block = body.get(4..).ok_or("a compressed chunk without its checksum")?;
                out.extend(decode_block(block)?);
            }
            0x01 => out.extend_from_slice(body.get(4..).ok_or("an uncompressed chunk without its checksum")?),
            0x80..=0xfe => {} // padding, index and other skippable chunks
            other => return Err(format!("a reserved chunk type {other:#x}")),
        }
        if out.len() > 16 * MAX_BLOCK {
            return Err("more than 64 MiB".into());
        }
    }
    Ok(out)
}

/// One S2 block: the decoded length as a varint, then literals and copies (Snappy's, plus S2's
/// repeat of the previous offset: a 1-byte-offset copy with offset 0).
fn decode_block(src: &[u8]) -> Result<Vec<u8>, String> {
    let (len, mut s) = uvarint(src).ok_or("a block without its length")?;
    if len > MAX_BLOCK as u64 {
        return Err(format!("a block of {len} bytes"));
    }
    let len = len as usize;
    let mut dst: Vec<u8> = Vec::with_capacity(len);
    let byte = |at: usize| src.get(at).copied().map(usize::from).ok_or_else(|| "a block is cut short".to_string());
    let mut offset = 0usize;
    while s < src.len() {
        let tag = usize::from(src[s]);
        let length;
        match tag & 3 {
            0 => {
                let x = tag >> 2;
                let (n, skip) = match x {
                    0..=59 => (x, 1),
                    60 => (byte(s + 1)?, 2),
                    61 => (byte(s + 1)? | byte(s + 2)? << 8, 3),
                    62 => (byte(s + 1)? | byte(s + 2)? << 8 | byte(s + 3)? << 16, 4),
                    _ => (byte(s + 1)? | byte(s + 2)? << 8 | byte(s + 3)? << 16 | byte(s + 4)? << 24, 5),
                };
                s += skip;
                let literal = src.get(s..s + n + 1).ok_or("a literal is cut short")?;
                if dst.len() + literal.len() > len {
                    return Err("a literal runs past the block's length".into());
                }
                dst.extend_from_slice(literal);
                s += n + 1;
                continue;
            }
            1 => {
                let to = (tag & 0xe0) << 3 | byte(s + 1)?;
                let l = (tag >> 2) & 7;
                s += 2;
                if to == 0 {
                    // S2's repeat: the previous offset again.
                    length = match l {
                        5 => {
                            s += 1;
                            byte(s - 1)? + 4
                        }
                        6 => {
                            s += 2;
                            (byte(s - 2)? | byte(s - 1)? << 8) + (1 << 8)
                        }
                        7 => {
                            s += 3;
                            (byte(s - 3)? | byte(s - 2)? << 8 | byte(s - 1)? << 16) + (1 << 16)
                        }
                        l => l,
                    } + 4;
                } else {
                    offset = to;
                    length = l + 4;
                }
            }
            2 => {
                length = 1 + (tag >> 2);
                offset = byte(s + 1)? | byte(s + 2)? << 8;
                s += 3;
            }
            _ => {
                length = 1 + (tag >> 2);
                offset = byte(s + 1)? | byte(s + 2)? << 8 | byte(s + 3)? << 16 | byte(s + 4)? << 24;
                s += 5;
            }
        }
        if offset == 0 || offset > dst.len() || dst.len() + length > len {
            return Err("a copy out of bounds".into());
        }
        let from = dst.len() - offset;
        for i in 0..length {
            let b = dst[from + i];
            dst.push(b);
        }
    }
    if dst.len() != len {
        return Err(format!("a block of {} bytes where its header says {len}", dst.len()));
    }
    Ok(dst)
}

fn uvarint(src: &[u8]) -> Option<(u64, usize)> {
    let mut value = 0u64;
    for (i, &b) in src.iter().enumerate().take(10) {
        value |= u64::from(b & 0x7f) << (7 * i);
        if b < 0x80 {
            return Some((value, i + 1));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base58_as_go_kine_encodes() {
        // base58.Encode([]byte("registry"), BitcoinAlphabet) and of "/" (an empty part).
        assert_eq!(base58_decode("L8nZchjdPLL").as_deref(), Some(&b"registry"[..]));
        assert_eq!(base58_decode("p").as_deref(), Some(&b"/"[..]));
        assert_eq!(base58_decode("11").as_deref(), Some(&[0u8, 0][..]));
        assert_eq!(base58_decode("0OIl"), None);
        assert_eq!(decode_key("L8nZchjdPLL.tzCUBDXD").as_deref(), Some(&b"/registry/health"[..]));
        assert_eq!(decode_key("meta.tzCUBDXD").as_deref(), Some(&b"health"[..]));
        assert_eq!(decode_key("L8nZchjdPLL.p.tzCUBDXD").as_deref(), Some(&b"/registry//health"[..]));
    }

    /// An S2 stream as klauspost's writer makes it: the identifier, then one chunk.
    fn stream(chunk_type: u8, body: &[u8]) -> Vec<u8> {
        let mut s = vec![0xff, 6, 0, 0];
        s.extend_from_slice(b"S2sTwO");
        let len = body.len() + 4;
        s.extend_from_slice(&[chunk_type, len as u8, (len >> 8) as u8, (len >> 16) as u8]);
        s.extend_from_slice(&[0, 0, 0, 0]); // checksum, not checked
        s.extend_from_slice(body);
        s
    }

    #[test]
    fn s2_streams_decode() {
        let json = br#"{"KV":{"Key":"/registry/health","Value":"eyJoZWFsdGgiOiJ0cnVlIn0="},"Create":true}"#;
        assert_eq!(s2_decode(&stream(1, json)).unwrap(), json);
        // A compressed block of 13 bytes: the literal "abc", a copy of 6 bytes at offset 3,
        // then S2's repeat of offset 3 for 4 bytes.
        let mut block = vec![13u8]; // the decoded length, a varint
        block.push(2 << 2); // a literal of 3
        block.extend_from_slice(b"abc");
        block.extend_from_slice(&[0b0000_1001, 3]); // copy1: length 4 + 2, offset 3
        block.extend_from_slice(&[0b0000_0001, 0]); // copy1 with offset 0: repeat, length 4 + 0
        assert_eq!(s2_decode(&stream(0, &block)).unwrap(), b"abcabcabcabca");
        // The same ops past a declared length of 12: refused.
        block[0] = 12;
        assert!(s2_decode(&stream(0, &block)).is_err());
        assert!(s2_decode(b"\xff\x06\x00\x00S2sTwO\x00\x05\x00\x00").is_err());
        assert!(s2_decode(b"{}").is_err());
    }

    #[test]
    fn go_kine_records_are_recognised() {
        let json = br#"{"KV":{"Key":"/registry/health","Value":"e30="},"PrevRevision":0,"Create":true,"Delete":false}"#;
        let subject = "$KV.kine.L8nZchjdPLL.tzCUBDXD";
        assert_eq!(look(subject, None, &stream(1, json)), Looked::GoKine { key: "/registry/health".into() });
        assert_eq!(look(subject, None, json), Looked::GoKine { key: "/registry/health".into() });
        let mut del = HeaderMap::new();
        del.insert("KV-Operation", "DEL");
        assert_eq!(look(subject, Some(&del), b""), Looked::Marker);
        assert!(matches!(look("$KV.kine.L8nZchjdPLL.tzCUBDX", None, json), Looked::Neither(_)));
        assert!(matches!(look(subject, None, b"raw value"), Looked::Neither(_)));
        assert!(matches!(look("$KV.kine.a_b", None, json), Looked::Neither(_)));
    }
}
