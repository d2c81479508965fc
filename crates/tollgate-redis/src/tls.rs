//! The certificates a TLS connection trusts and presents: one value,
//! handed to every connection the backend makes (a server, a cluster's
//! nodes, the sentinels and the servers they name), so that none is made
//! with less than the others.

/// The CA to trust and the client certificate to present, as PEM.
#[derive(Clone, Default)]
pub(crate) struct TlsSettings {
    /// The only CA trusted (else the system and Mozilla roots).
    pub(crate) root_cert: Option<Vec<u8>>,
    /// The client certificate chain and its private key (mutual TLS).
    pub(crate) client: Option<ClientCert>,
}

/// A client certificate chain and its private key, as PEM.
#[derive(Clone)]
// Without the feature a client certificate is refused unread.
#[cfg_attr(not(feature = "tls"), allow(dead_code))]
pub(crate) struct ClientCert {
    pub(crate) cert: Vec<u8>,
    pub(crate) key: Vec<u8>,
}

impl TlsSettings {
    /// What redis-rs takes; `None` when there is nothing to add to its
    /// defaults.
    #[cfg(feature = "tls")]
    pub(crate) fn certificates(&self) -> Option<redis::TlsCertificates> {
        if self.root_cert.is_none() && self.client.is_none() {
            return None;
        }
        Some(redis::TlsCertificates {
            client_tls: self.client.as_ref().map(|c| redis::ClientTlsConfig {
                client_cert: c.cert.clone(),
                client_key: c.key.clone(),
            }),
            root_cert: self.root_cert.clone(),
        })
    }
}

/// Which half of a client certificate is wrong.
#[cfg(feature = "tls")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Part {
    /// The certificate chain.
    Cert,
    /// The private key, or the key does not belong to the certificate.
    Key,
}

/// Checks a client certificate as rustls will use it on every TLS
/// connection, so that a bad one stops the start-up instead of failing
/// every connection (redis-rs parses the PEM when a client is built, but
/// takes a PEM holding no certificate as an empty chain, and matches the
/// key to the certificate only when it connects).
///
/// Accepted: one or more `CERTIFICATE` blocks (the client's first, then
/// intermediates); one private key, PKCS#8 (`PRIVATE KEY`), PKCS#1 RSA
/// (`RSA PRIVATE KEY`) or SEC1 EC (`EC PRIVATE KEY`), unencrypted, of a key
/// type the ring provider signs with (RSA, ECDSA P-256/P-384, Ed25519).
#[cfg(feature = "tls")]
pub(crate) fn check_client_cert(cert: &[u8], key: &[u8]) -> Result<(), (Part, String)> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};

    let chain = CertificateDer::pem_slice_iter(cert)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| (Part::Cert, format!("not a PEM certificate chain: {e}")))?;
    if chain.is_empty() {
        return Err((Part::Cert, "holds no PEM `CERTIFICATE` block".into()));
    }
    let key = PrivateKeyDer::from_pem_slice(key).map_err(|e| {
        (
            Part::Key,
            format!(
                "no unencrypted PEM private key (PKCS#8 `PRIVATE KEY`, `RSA PRIVATE KEY` or \
                 `EC PRIVATE KEY`): {e}"
            ),
        )
    })?;
    let provider = rustls::crypto::ring::default_provider();
    rustls::sign::CertifiedKey::from_der(chain, key, &provider).map_err(|e| match e {
        rustls::Error::InconsistentKeys(_) => (
            Part::Key,
            "is not the private key of the certificate (the first in the chain)".into(),
        ),
        rustls::Error::InvalidCertificate(e) => {
            (Part::Cert, format!("not a usable certificate: {e}"))
        }
        e => (Part::Key, format!("cannot be used: {e}")),
    })?;
    Ok(())
}
