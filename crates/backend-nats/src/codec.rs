//! Keys ↔ NATS subject tokens.
//!
//! etcd keys are arbitrary bytes; subjects are dot-separated tokens of printable characters.
//! A key is split at `/`; each segment becomes one token: kept as is when it is made only of
//! `[A-Za-z0-9_-]` (the common case, so subjects stay readable), otherwise `=` followed by its
//! unpadded base64url form (an empty segment is `=`). The mapping is reversible, and every key
//! under a `/`-terminated prefix lies under that prefix's tokens, so a prefix maps to one
//! subject wildcard (`tokens.>`).

const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

fn literal(segment: &[u8]) -> bool {
    !segment.is_empty() && segment.iter().all(|b| b.is_ascii_alphanumeric() || *b == b'_' || *b == b'-')
}

fn b64_encode(input: &[u8], out: &mut String) {
    for chunk in input.chunks(3) {
        let n = chunk.iter().enumerate().fold(0u32, |acc, (i, b)| acc | (u32::from(*b) << (16 - 8 * i)));
        let chars = chunk.len() + 1;
        for i in 0..chars {
            out.push(B64[((n >> (18 - 6 * i)) & 63) as usize] as char);
        }
    }
}

fn b64_decode(input: &str) -> Option<Vec<u8>> {
    let value = |c: u8| B64.iter().position(|x| *x == c).map(|p| p as u32);
    let bytes = input.as_bytes();
    if bytes.len() % 4 == 1 {
        return None;
    }
    let mut out = Vec::with_capacity(bytes.len() * 3 / 4);
    for chunk in bytes.chunks(4) {
        let mut n = 0u32;
        for (i, c) in chunk.iter().enumerate() {
            n |= value(*c)? << (18 - 6 * i);
        }
        for i in 0..chunk.len() - 1 {
            out.push((n >> (16 - 8 * i)) as u8);
        }
    }
    Some(out)
}

/// The subject tokens (dot-joined) of a key. `key` must not be empty.
pub fn encode_key(key: &[u8]) -> String {
    let mut out = String::with_capacity(key.len() + 8);
    for (i, segment) in key.split(|b| *b == b'/').enumerate() {
        if i > 0 {
            out.push('.');
        }
        if literal(segment) {
            // Safe: literal segments are ASCII.
            out.push_str(std::str::from_utf8(segment).unwrap_or_default());
        } else {
            out.push('=');
            b64_encode(segment, &mut out);
        }
    }
    out
}

/// The key of subject tokens made by [`encode_key`]; `None` if they are not such tokens.
pub fn decode_key(tokens: &str) -> Option<Vec<u8>> {
    let mut key = Vec::with_capacity(tokens.len());
    for (i, token) in tokens.split('.').enumerate() {
        if i > 0 {
            key.push(b'/');
        }
        match token.strip_prefix('=') {
            Some(encoded) => key.extend(b64_decode(encoded)?),
            None if literal(token.as_bytes()) => key.extend_from_slice(token.as_bytes()),
            None => return None,
        }
    }
    Some(key)
}

/// A subject filter (relative to the bucket) that matches at least every key starting with
/// `prefix`: the tokens of its complete `/` segments followed by `>`, or `>` alone.
pub fn prefix_filter(prefix: &[u8]) -> String {
    match prefix.iter().rposition(|b| *b == b'/') {
        Some(last_slash) => format!("{}.>", encode_key(&prefix[..last_slash])),
        None => ">".to_string(),
    }
}

/// FNV-1a: a stable 64-bit hash of bytes (ids from names, lock stripes from keys).
pub fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readable_and_reversible() {
        assert_eq!(encode_key(b"/registry/pods/default/nginx-1"), "=.registry.pods.default.nginx-1");
        assert_eq!(encode_key(b"compact_rev_key"), "compact_rev_key");
        assert_eq!(encode_key(b"a.b/c d/"), "=YS5i.=YyBk.=");
        for key in [
            &b"/registry/pods/default/nginx-1"[..],
            b"a.b/c d/",
            b"//",
            b"\0",
            b"\xff\xfe/x",
            b"=/==",
            b"abc",
            b"ab",
            b"a",
            b"*>.",
        ] {
            let enc = encode_key(key);
            assert!(!enc.split('.').any(|t| t.is_empty() || t.contains(['*', '>', ' '])), "{enc}");
            assert_eq!(decode_key(&enc).as_deref(), Some(key), "{enc}");
        }
        assert_eq!(decode_key("bad token"), None);
        assert_eq!(decode_key("=!!"), None);
    }

    #[test]
    fn prefixes_map_to_one_wildcard() {
        assert_eq!(prefix_filter(b"/registry/pods/"), "=.registry.pods.>");
        assert_eq!(prefix_filter(b"/registry/po"), "=.registry.>");
        assert_eq!(prefix_filter(b"abc"), ">");
        let key = b"/registry/pods/x";
        let filter = prefix_filter(b"/registry/pods/");
        assert!(encode_key(key).starts_with(filter.trim_end_matches('>')));
    }
}
