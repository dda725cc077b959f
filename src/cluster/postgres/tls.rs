//! TLS to PostgreSQL: when a node's connections are encrypted, and against
//! which roots the server is verified.
//!
//! `--store` URL ──[`prepare`]──▶ tokio-postgres `Config` + `sslrootcert` ──[`connector`]──▶ rustls (aws-lc-rs) or none
//!
//! Decisions:
//! - **The URL decides, as for libpq**, with one difference: cadre never
//!   connects with TLS it does not verify. `sslmode=require`,
//!   `verify-ca` and `verify-full` all mean: TLS, the server's certificate
//!   chained to a trusted root and naming the host of the URL (libpq's
//!   `verify-full`). `sslmode=disable`, `prefer` or none: no TLS — libpq's
//!   `prefer` accepts any certificate and falls back to plain text, which
//!   protects against nothing; a node that talks to a non-loopback host
//!   without TLS says so in a warning at start.
//! - **Roots:** the file of the URL's `sslrootcert=` (PEM, one or more
//!   certificates: a private CA), else the system's (rustls-native-certs).
//!   A root file that cannot be read or holds no certificate is an error
//!   at start, naming it.
//! - **rustls on aws-lc-rs**, the TLS stack reqwest already brings
//!   (tokio-postgres-rustls is its connector for tokio-postgres); no
//!   OpenSSL.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio_postgres::config::{Host, SslMode};
use tokio_postgres_rustls::MakeRustlsConnect;

/// The parts of `url` tokio-postgres does not parse, taken out: the
/// `sslrootcert` file and a libpq `sslmode` it does not know
/// (`verify-ca`, `verify-full`: both become `require`, which cadre
/// verifies fully). Works on `postgres://…?k=v&…` URLs and `k=v k=v` strings.
pub(super) fn prepare(url: &str) -> (String, Option<PathBuf>) {
    let mut root = None;
    let mut keep = |kv: &str| -> Option<String> {
        match kv.split_once('=') {
            Some(("sslrootcert", path)) => {
                root = Some(PathBuf::from(path));
                None
            }
            Some(("sslmode", "verify-ca" | "verify-full")) => Some("sslmode=require".into()),
            _ => Some(kv.to_string()),
        }
    };
    if url.contains("://") {
        let Some((base, query)) = url.split_once('?') else {
            return (url.to_string(), None);
        };
        let kept: Vec<String> = query.split('&').filter_map(&mut keep).collect();
        let url = if kept.is_empty() {
            base.to_string()
        } else {
            format!("{base}?{}", kept.join("&"))
        };
        (url, root)
    } else {
        let kept: Vec<String> = url.split_whitespace().filter_map(&mut keep).collect();
        (kept.join(" "), root)
    }
}

/// The TLS connector `config` asks for, or `None` for plain TCP.
pub(super) fn connector(
    config: &tokio_postgres::Config,
    root: Option<&Path>,
) -> Result<Option<MakeRustlsConnect>, String> {
    if config.get_ssl_mode() != SslMode::Require {
        let remote = config.get_hosts().iter().any(|h| match h {
            Host::Tcp(name) => !is_loopback(name),
            Host::Unix(_) => false,
        });
        if remote {
            tracing::warn!(
                "the connection to PostgreSQL is not encrypted: add sslmode=require (and sslrootcert=<CA file> for a private CA) to --store"
            );
        }
        return Ok(None);
    }
    let mut roots = rustls::RootCertStore::empty();
    match root {
        Some(path) => {
            let pem =
                std::fs::read(path).map_err(|e| format!("sslrootcert {}: {e}", path.display()))?;
            let mut n = 0;
            for cert in rustls_pki_types_certs(&pem) {
                let cert = cert.map_err(|e| format!("sslrootcert {}: {e}", path.display()))?;
                roots
                    .add(cert)
                    .map_err(|e| format!("sslrootcert {}: {e}", path.display()))?;
                n += 1;
            }
            if n == 0 {
                return Err(format!(
                    "sslrootcert {}: no PEM certificate in the file",
                    path.display()
                ));
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            for cert in found.certs {
                // A system root rustls cannot parse is skipped, as browsers do.
                let _ = roots.add(cert);
            }
            if roots.is_empty() {
                return Err(
                    "sslmode=require: the system has no trusted root certificates; set sslrootcert=<CA file>"
                        .into(),
                );
            }
        }
    }
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Some(MakeRustlsConnect::new(tls)))
}

fn rustls_pki_types_certs(
    pem: &[u8],
) -> impl Iterator<Item = Result<rustls::pki_types::CertificateDer<'static>, String>> + '_ {
    use rustls::pki_types::pem::PemObject;
    rustls::pki_types::CertificateDer::pem_slice_iter(pem).map(|c| c.map_err(|e| e.to_string()))
}

fn is_loopback(host: &str) -> bool {
    host == "localhost"
        || host
            .trim_matches(['[', ']'])
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sslrootcert_is_taken_out_and_verify_modes_become_require() {
        assert_eq!(
            prepare("postgres://u@h/db?sslmode=verify-full&sslrootcert=/ca.pem&application_name=x"),
            (
                "postgres://u@h/db?sslmode=require&application_name=x".to_string(),
                Some(PathBuf::from("/ca.pem"))
            )
        );
        assert_eq!(
            prepare("postgres://u@h/db?sslrootcert=/ca.pem"),
            (
                "postgres://u@h/db".to_string(),
                Some(PathBuf::from("/ca.pem"))
            )
        );
        assert_eq!(
            prepare("host=h sslmode=verify-ca sslrootcert=/ca.pem"),
            (
                "host=h sslmode=require".to_string(),
                Some(PathBuf::from("/ca.pem"))
            )
        );
        assert_eq!(
            prepare("postgres://u@h/db"),
            ("postgres://u@h/db".to_string(), None)
        );
    }
}
