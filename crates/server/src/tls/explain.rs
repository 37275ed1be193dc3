//! Why a TLS handshake on the etcd port failed, and what fixes it, logged once per reason
//! every 10 s (a client retrying in a loop does not flood the log).

use rustls::{AlertDescription, CertificateError};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How often the same reason is logged.
const EVERY: Duration = Duration::from_secs(10);

/// A refused handshake, as the server saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The client spoke something other than TLS (plain HTTP/2, most often).
    PlainText,
    /// --trusted-ca-file is set and the client sent no certificate.
    NoClientCertificate,
    /// The client's certificate does not chain to --trusted-ca-file.
    UnknownIssuer,
    ClientCertificateExpired,
    ClientCertificateNotYetValid,
    /// The client's certificate lacks extendedKeyUsage clientAuth.
    NotForClientAuth,
    /// Another fault of the client's certificate.
    BadClientCertificate(String),
    /// The client refused kine-rs's certificate (the alert it sent).
    ClientRefusedOurs(String),
    /// No TLS version, cipher suite or application protocol in common.
    Incompatible(String),
    /// A connection that ended or failed before the handshake did (probes, resets): not
    /// explained at info level.
    Dropped(String),
    /// Anything else rustls refused.
    Other(String),
}

impl Refusal {
    /// From the error tokio-rustls's accept returned.
    pub fn from_io(e: &std::io::Error) -> Refusal {
        match e.get_ref().and_then(|inner| inner.downcast_ref::<rustls::Error>()) {
            Some(tls) => Refusal::from_tls(tls),
            None => Refusal::Dropped(e.to_string()),
        }
    }

    pub fn from_tls(e: &rustls::Error) -> Refusal {
        use rustls::Error as E;
        match e {
            E::NoCertificatesPresented => Refusal::NoClientCertificate,
            E::InvalidCertificate(c) => match c {
                CertificateError::UnknownIssuer | CertificateError::BadSignature => Refusal::UnknownIssuer,
                CertificateError::Expired | CertificateError::ExpiredContext { .. } => {
                    Refusal::ClientCertificateExpired
                }
                CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. } => {
                    Refusal::ClientCertificateNotYetValid
                }
                CertificateError::InvalidPurpose | CertificateError::InvalidPurposeContext { .. } => {
                    Refusal::NotForClientAuth
                }
                other => Refusal::BadClientCertificate(format!("{other:?}")),
            },
            E::AlertReceived(alert) => match alert {
                AlertDescription::BadCertificate
                | AlertDescription::UnknownCA
                | AlertDescription::CertificateUnknown
                | AlertDescription::CertificateExpired
                | AlertDescription::UnsupportedCertificate
                | AlertDescription::DecryptError => Refusal::ClientRefusedOurs(format!("{alert:?}")),
                AlertDescription::ProtocolVersion
                | AlertDescription::HandshakeFailure
                | AlertDescription::NoApplicationProtocol => {
                    Refusal::Incompatible(format!("the client's alert {alert:?}"))
                }
                other => Refusal::Other(format!("the client sent the alert {other:?}")),
            },
            E::PeerIncompatible(why) => Refusal::Incompatible(format!("{why:?}")),
            E::NoApplicationProtocol => {
                Refusal::Incompatible("no application protocol in common (h2, http/1.1)".into())
            }
            E::InvalidMessage(_) | E::InappropriateMessage { .. } | E::InappropriateHandshakeMessage { .. } => {
                Refusal::PlainText
            }
            other => Refusal::Other(other.to_string()),
        }
    }

    /// A key per kind of refusal, for the rate limit.
    fn kind(&self) -> &'static str {
        match self {
            Refusal::PlainText => "plain",
            Refusal::NoClientCertificate => "no-cert",
            Refusal::UnknownIssuer => "issuer",
            Refusal::ClientCertificateExpired => "expired",
            Refusal::ClientCertificateNotYetValid => "not-yet",
            Refusal::NotForClientAuth => "purpose",
            Refusal::BadClientCertificate(_) => "bad-cert",
            Refusal::ClientRefusedOurs(_) => "ours",
            Refusal::Incompatible(_) => "incompatible",
            Refusal::Dropped(_) => "dropped",
            Refusal::Other(_) => "other",
        }
    }
}

/// Explains refusals; knows the files the server was started with, to name them.
pub struct Explainer {
    /// --trusted-ca-file as given (None: client certificates are not asked for).
    pub client_ca: Option<String>,
    /// --server-cert-file as given.
    pub server_cert: String,
    logged: Mutex<HashMap<&'static str, (Instant, u64)>>,
}

impl Explainer {
    pub fn new(server_cert: String, client_ca: Option<String>) -> Explainer {
        Explainer { client_ca, server_cert, logged: Mutex::new(HashMap::new()) }
    }

    /// The sentence logged for `refusal`: what happened, then the fix.
    pub fn message(&self, refusal: &Refusal) -> String {
        let ca = self.client_ca.as_deref().unwrap_or("(none)");
        let cert = &self.server_cert;
        match refusal {
            Refusal::PlainText => "the client spoke plain text (not TLS) to this TLS port: give it an https:// \
                 endpoint and kine-rs's CA (kube-apiserver: --etcd-servers=https://… with --etcd-cafile; etcdctl: \
                 --cacert)"
                .to_string(),
            Refusal::NoClientCertificate => format!(
                "the client sent no certificate, and --trusted-ca-file {ca} requires one: give it a certificate \
                 and key signed by that CA (kube-apiserver: --etcd-certfile and --etcd-keyfile; etcdctl: --cert and \
                 --key)"
            ),
            Refusal::UnknownIssuer => format!(
                "the client's certificate is not signed by the CA in --trusted-ca-file {ca}: sign it with that CA, \
                 or add the CA that signed it to that file"
            ),
            Refusal::ClientCertificateExpired => {
                "the client's certificate has expired: issue it a new one (or check this machine's clock)".to_string()
            }
            Refusal::ClientCertificateNotYetValid => {
                "the client's certificate is not valid yet: check the clocks of both machines".to_string()
            }
            Refusal::NotForClientAuth => {
                "the client's certificate is not for client authentication: issue it with extendedKeyUsage \
                 clientAuth (a server-only certificate cannot log in)"
                    .to_string()
            }
            Refusal::BadClientCertificate(why) => format!("the client's certificate was refused ({why})"),
            Refusal::ClientRefusedOurs(alert) => format!(
                "the client refused kine-rs's certificate --server-cert-file {cert} (its alert: {alert}): give the \
                 client the CA that signed it (kube-apiserver: --etcd-cafile; etcdctl: --cacert), and make sure \
                 its subjectAltName lists the host name or IP address the client dials"
            ),
            Refusal::Incompatible(why) => {
                format!(
                    "no TLS version or cipher suite in common with the client ({why}); kine-rs speaks TLS 1.2 and 1.3"
                )
            }
            Refusal::Dropped(why) => format!("the connection ended during the TLS handshake ({why})"),
            Refusal::Other(why) => format!("TLS handshake failed: {why}"),
        }
    }

    /// Logs `refusal` from `peer`: a warning the first time in 10 s for its kind (with how
    /// many were not logged since), debug otherwise; a dropped connection at debug only.
    pub fn refused(&self, peer: &str, refusal: &Refusal) {
        if matches!(refusal, Refusal::Dropped(_)) {
            tracing::debug!(%peer, "{}", self.message(refusal));
            return;
        }
        let now = Instant::now();
        let unlogged = {
            let mut logged = self.logged.lock().unwrap_or_else(|p| p.into_inner());
            let entry = logged.entry(refusal.kind()).or_insert((now - EVERY - EVERY, 0));
            if now.duration_since(entry.0) < EVERY {
                entry.1 += 1;
                None
            } else {
                let unlogged = entry.1;
                *entry = (now, 0);
                Some(unlogged)
            }
        };
        match unlogged {
            Some(0) => tracing::warn!(%peer, "TLS handshake refused: {}", self.message(refusal)),
            Some(n) => tracing::warn!(
                %peer,
                "TLS handshake refused: {} ({n} more refused for this reason in the last 10 s)",
                self.message(refusal)
            ),
            None => tracing::debug!(%peer, "TLS handshake refused: {}", self.message(refusal)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rustls_errors_map_to_refusals() {
        use rustls::Error as E;
        assert_eq!(Refusal::from_tls(&E::NoCertificatesPresented), Refusal::NoClientCertificate);
        assert_eq!(Refusal::from_tls(&E::InvalidCertificate(CertificateError::UnknownIssuer)), Refusal::UnknownIssuer);
        assert_eq!(
            Refusal::from_tls(&E::InvalidCertificate(CertificateError::Expired)),
            Refusal::ClientCertificateExpired
        );
        assert_eq!(
            Refusal::from_tls(&E::InvalidCertificate(CertificateError::InvalidPurpose)),
            Refusal::NotForClientAuth
        );
        assert!(matches!(
            Refusal::from_tls(&E::AlertReceived(AlertDescription::UnknownCA)),
            Refusal::ClientRefusedOurs(_)
        ));
        let io = std::io::Error::new(std::io::ErrorKind::InvalidData, E::NoCertificatesPresented);
        assert_eq!(Refusal::from_io(&io), Refusal::NoClientCertificate);
        let reset = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
        assert!(matches!(Refusal::from_io(&reset), Refusal::Dropped(_)));
    }

    #[test]
    fn messages_name_the_flags_at_fault() {
        let e = Explainer::new("/etc/kine-rs/server.crt".into(), Some("/etc/kine-rs/ca.crt".into()));
        assert!(e.message(&Refusal::UnknownIssuer).contains("--trusted-ca-file /etc/kine-rs/ca.crt"));
        assert!(e.message(&Refusal::NoClientCertificate).contains("--etcd-certfile"));
        assert!(e.message(&Refusal::ClientRefusedOurs("UnknownCA".into())).contains("--etcd-cafile"));
    }
}
