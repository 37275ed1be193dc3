//! etcd's `--auth-token` setting: simple tokens, or JWTs signed with a key pair (or an HMAC
//! secret) from files, with etcd's claims (`username`, `revision`, `exp`), so a token from etcd
//! or from any kine-rs node with the same keys is accepted.

use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Duration;

/// How Authenticate makes tokens.
#[derive(Clone, Default)]
pub enum TokenKind {
    #[default]
    Simple,
    Jwt(std::sync::Arc<Jwt>),
}

impl std::fmt::Debug for TokenKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TokenKind::Simple => write!(f, "simple"),
            TokenKind::Jwt(j) => write!(f, "jwt ({:?}, ttl {:?}, signs: {})", j.alg, j.ttl, j.signer.is_some()),
        }
    }
}

pub struct Jwt {
    alg: Algorithm,
    signer: Option<EncodingKey>,
    verifier: DecodingKey,
    ttl: Duration,
}

/// A key from PEM.
type PemReader<K> = fn(&[u8]) -> jsonwebtoken::errors::Result<K>;

#[derive(Serialize, Deserialize)]
struct Claims {
    username: String,
    revision: u64,
    exp: u64,
}

impl TokenKind {
    /// etcd's `TYPE[,KEY=VALUE…]`: `simple`, or `jwt,sign-method=…,pub-key=FILE[,priv-key=FILE]
    /// [,ttl=DURATION]` (etcd's option names; ttl in Go's form, default 5m). Reads the key files.
    pub fn parse(text: &str) -> Result<TokenKind, String> {
        let mut parts = text.split(',');
        let kind = parts.next().unwrap_or_default();
        let mut options = BTreeMap::new();
        for part in parts {
            let (k, v) = part.split_once('=').ok_or_else(|| format!("option {part:?} is not KEY=VALUE"))?;
            if options.insert(k, v).is_some() {
                return Err(format!("option {k:?} is given twice"));
            }
        }
        match kind {
            "simple" if options.is_empty() => Ok(TokenKind::Simple),
            "simple" => Err("simple tokens take no options".into()),
            "jwt" => Ok(TokenKind::Jwt(std::sync::Arc::new(Jwt::from_options(&options)?))),
            other => Err(format!("unknown token type {other:?}: etcd's are \"simple\" and \"jwt\"")),
        }
    }
}

fn read(path: &str, what: &str) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("{what} {path}: {e}"))
}

impl Jwt {
    fn from_options(options: &BTreeMap<&str, &str>) -> Result<Jwt, String> {
        for key in options.keys() {
            if !matches!(*key, "sign-method" | "pub-key" | "priv-key" | "ttl") {
                return Err(format!("unknown option {key:?} (etcd's are sign-method, pub-key, priv-key, ttl)"));
            }
        }
        let method = options.get("sign-method").ok_or("sign-method is required")?;
        let alg: Algorithm = method
            .parse()
            .map_err(|_| format!("sign-method {method:?} is not supported (HS256/384/512, RS256/384/512, PS256/384/512, ES256/384, EdDSA)"))?;
        let ttl = match options.get("ttl") {
            None => Duration::from_secs(300),
            Some(t) => crate::duration::parse(t).map_err(|e| format!("ttl {t:?}: {e}"))?,
        };
        let private = options.get("priv-key").map(|p| read(p, "priv-key")).transpose()?;
        let public = options.get("pub-key").map(|p| read(p, "pub-key")).transpose()?;
        let bad = |what: &str, e: jsonwebtoken::errors::Error| format!("{what} is not a {method} key: {e}");
        let (signer, verifier) = match alg {
            Algorithm::HS256 | Algorithm::HS384 | Algorithm::HS512 => {
                let secret = private.ok_or("an HMAC sign-method needs priv-key (the secret)")?;
                let e = EncodingKey::from_secret(&secret).map_err(|e| bad("priv-key", e))?;
                (Some(e), DecodingKey::from_secret(&secret).map_err(|e| bad("priv-key", e))?)
            }
            _ => {
                let public = public.ok_or("pub-key is required (kine-rs does not derive it from priv-key)")?;
                let (enc, dec): (PemReader<EncodingKey>, PemReader<DecodingKey>) = match alg {
                    Algorithm::ES256 | Algorithm::ES384 => (EncodingKey::from_ec_pem, DecodingKey::from_ec_pem),
                    Algorithm::EdDSA => (EncodingKey::from_ed_pem, DecodingKey::from_ed_pem),
                    _ => (EncodingKey::from_rsa_pem, DecodingKey::from_rsa_pem),
                };
                let signer = private.map(|p| enc(&p).map_err(|e| bad("priv-key", e))).transpose()?;
                (signer, dec(&public).map_err(|e| bad("pub-key", e))?)
            }
        };
        let jwt = Jwt { alg, signer, verifier, ttl };
        if jwt.signer.is_some() {
            let probe = jwt.sign("probe", 1, 0).ok_or("cannot sign with priv-key")?;
            if jwt.verify_at(&probe, 0).is_none() {
                return Err("auth: public and private keys don't match".into());
            }
        }
        Ok(jwt)
    }

    /// A token for `username` at auth revision `revision`, or `None` for a verify-only key.
    pub fn sign(&self, username: &str, revision: u64, now: u64) -> Option<String> {
        let signer = self.signer.as_ref()?;
        let claims = Claims { username: username.to_string(), revision, exp: now + self.ttl.as_secs() };
        jsonwebtoken::encode(&Header::new(self.alg), &claims, signer).ok()
    }

    pub fn can_sign(&self) -> bool {
        self.signer.is_some()
    }

    /// The user and auth revision of a valid, unexpired token signed with this method and key.
    pub fn verify(&self, token: &str) -> Option<(String, u64)> {
        let mut v = Validation::new(self.alg);
        v.leeway = 0;
        v.validate_aud = false;
        let data = jsonwebtoken::decode::<Claims>(token, &self.verifier, &v).ok()?;
        Some((data.claims.username, data.claims.revision))
    }

    /// `verify` without the expiry check (start-up's key check).
    fn verify_at(&self, token: &str, _now: u64) -> Option<(String, u64)> {
        let mut v = Validation::new(self.alg);
        v.validate_exp = false;
        v.required_spec_claims.clear();
        v.validate_aud = false;
        let data = jsonwebtoken::decode::<Claims>(token, &self.verifier, &v).ok()?;
        Some((data.claims.username, data.claims.revision))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> String {
        match TokenKind::parse(text) {
            Err(e) => e,
            Ok(k) => panic!("{text} parsed as {k:?}"),
        }
    }

    #[test]
    fn options_are_checked_as_etcd_names_them() {
        assert!(matches!(TokenKind::parse("simple"), Ok(TokenKind::Simple)));
        assert!(err("magic").contains("unknown token type"));
        assert!(err("jwt").contains("sign-method is required"));
        assert!(err("jwt,sign-method=none").contains("not supported"));
        assert!(err("jwt,sign-method=HS256,sign-method=HS256").contains("twice"));
        assert!(err("jwt,sign-method=HS256").contains("needs priv-key"));
        assert!(err("jwt,sign-method=RS256,priv-key=/nonexistent").contains("priv-key /nonexistent"));
        assert!(err("jwt,sign-method=HS256,frobnicate=1").contains("unknown option"));
    }

    #[test]
    fn hmac_tokens_round_trip_and_expire() {
        let dir = std::env::temp_dir().join(format!("kine-rs-jwt-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let key = dir.join("secret");
        std::fs::write(&key, b"a secret of some length").unwrap();
        let TokenKind::Jwt(jwt) =
            TokenKind::parse(&format!("jwt,sign-method=HS256,priv-key={},ttl=1m", key.display())).unwrap()
        else {
            panic!("not jwt")
        };
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
        let token = jwt.sign("alice", 7, now).unwrap();
        assert_eq!(jwt.verify(&token), Some(("alice".to_string(), 7)));
        assert_eq!(jwt.verify(&jwt.sign("alice", 7, now - 120).unwrap()), None, "expired");
        assert_eq!(jwt.verify(&format!("{token}x")), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
