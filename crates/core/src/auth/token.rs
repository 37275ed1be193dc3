//! Simple tokens that every node on the datastore can check.
//!
//! etcd keeps its simple tokens in each member's memory (every member learns each one through
//! raft). kine-rs nodes share no memory, so a token carries what checking it needs, signed with
//! the key kept in the auth record: the user, the auth revision and the time it was issued, and
//! random bytes. It is void once the user is deleted or changes password, once auth is disabled,
//! or after the TTL. As in etcd the TTL restarts with every use; the node a token is used on
//! remembers the use, so on another node it counts from its issue or its last use there.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use hmac::{Hmac, Mac};
use sha2::Sha256;

const FORMAT: u8 = 1;
const NONCE: usize = 12;

/// What a token says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Claims {
    pub user: String,
    /// The auth revision when it was issued.
    pub revision: u64,
    /// Unix milliseconds when it was issued.
    pub issued: u64,
}

fn mac(key: &[u8]) -> Hmac<Sha256> {
    // HMAC takes a key of any length.
    Hmac::<Sha256>::new_from_slice(key).unwrap_or_else(|_| unreachable!("HMAC accepts any key length"))
}

/// A signed token for `claims`.
pub fn issue(key: &[u8], claims: &Claims) -> String {
    let mut payload = Vec::with_capacity(1 + 16 + NONCE + claims.user.len());
    payload.push(FORMAT);
    payload.extend_from_slice(&claims.revision.to_be_bytes());
    payload.extend_from_slice(&claims.issued.to_be_bytes());
    let mut nonce = [0u8; NONCE];
    super::random_bytes(&mut nonce);
    payload.extend_from_slice(&nonce);
    payload.extend_from_slice(claims.user.as_bytes());
    let mut m = mac(key);
    m.update(&payload);
    let sig = m.finalize().into_bytes();
    format!("{}.{}", B64.encode(&payload), B64.encode(sig))
}

/// The claims of a token signed with `key`; `None` for anything else.
pub fn verify(key: &[u8], token: &str) -> Option<Claims> {
    let (payload, sig) = token.split_once('.')?;
    let payload = B64.decode(payload).ok()?;
    let sig = B64.decode(sig).ok()?;
    let mut m = mac(key);
    m.update(&payload);
    m.verify_slice(&sig).ok()?;
    let (&format, rest) = payload.split_first()?;
    if format != FORMAT || rest.len() < 16 + NONCE {
        return None;
    }
    let revision = u64::from_be_bytes(rest[..8].try_into().ok()?);
    let issued = u64::from_be_bytes(rest[8..16].try_into().ok()?);
    let user = String::from_utf8(rest[16 + NONCE..].to_vec()).ok()?;
    Some(Claims { user, revision, issued })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_forgeries() {
        let claims = Claims { user: "alice".into(), revision: 7, issued: 1_700_000_000_000 };
        let t = issue(b"key", &claims);
        assert_eq!(verify(b"key", &t), Some(claims.clone()));
        assert_ne!(issue(b"key", &claims), t, "two tokens for the same claims differ");
        assert_eq!(verify(b"other key", &t), None);
        let (payload, sig) = t.split_once('.').unwrap();
        let mut forged = B64.decode(payload).unwrap();
        *forged.last_mut().unwrap() ^= 1;
        assert_eq!(verify(b"key", &format!("{}.{sig}", B64.encode(&forged))), None);
        for garbage in ["", ".", "abc", "abc.def", "a.b.c", &t[..t.len() - 2], "ü.ü"] {
            assert_eq!(verify(b"key", garbage), None, "{garbage:?}");
        }
    }
}
