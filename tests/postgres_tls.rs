//! The PostgreSQL store over TLS, on a real PostgreSQL with `ssl = on` and
//! certificates made for the test (rcgen): `sslmode=require` connects
//! encrypted and verifies the server against `sslrootcert`; a server that
//! another CA signed, or that names another host, or that has no TLS, is
//! refused at open, with an error naming the setting.
//!
//! cadre::cluster::postgres::open_store(url with sslmode/sslrootcert) ──rustls──▶ PostgreSQL (ssl = on)

mod support;

use cadre::store::{NodeIdentity, Store, StoreError};
use rcgen::{CertificateParams, CertifiedIssuer, KeyPair};
use support::postgres::Postgres;

fn node() -> NodeIdentity {
    NodeIdentity {
        id: "tls-node".into(),
        addr: None,
        stale_after: cadre::cluster::postgres::NODE_STALE_AFTER,
    }
}

/// A CA, and a server certificate it signed for `names`: (CA PEM, server
/// certificate PEM, server key PEM).
fn certificates(names: &[&str]) -> (String, String, String) {
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().unwrap()).unwrap();
    let key = KeyPair::generate().unwrap();
    let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    let cert = CertificateParams::new(names)
        .unwrap()
        .signed_by(&key, &ca)
        .unwrap();
    (ca.pem(), cert.pem(), key.serialize_pem())
}

fn url(pg: &Postgres, host: &str, query: &str) -> String {
    format!("postgres://postgres@{host}:{}/postgres?{query}", pg.port)
}

fn refused(result: Result<Store, StoreError>) -> String {
    match result {
        Err(e @ StoreError::Unreachable { .. }) => e.to_string(),
        Err(e) => panic!("another error: {e}"),
        Ok(_) => panic!("the store opened"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sslmode_require_connects_encrypted_and_verifies_the_server() {
    let dir = tempfile::tempdir().unwrap();
    let (ca, cert, key) = certificates(&["127.0.0.1", "localhost"]);
    let pg = Postgres::start_tls(&cert, &key);
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, &ca).unwrap();
    let root = format!("sslrootcert={}", ca_file.display());

    let store = cadre::cluster::postgres::open_store(
        &url(&pg, "127.0.0.1", &format!("sslmode=require&{root}")),
        node(),
    )
    .expect("opened over TLS");
    store.heartbeat().await.unwrap();
    let encrypted = pg.sql(
        &pg.url("postgres"),
        "SELECT bool_and(s.ssl)::text FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) \
         WHERE a.application_name = 'cadre tls-node'",
    );
    assert_eq!(encrypted, "true", "every connection of the node is TLS");
    drop(store);

    // libpq's verify-full means the same here.
    cadre::cluster::postgres::open_store(
        &url(&pg, "localhost", &format!("sslmode=verify-full&{root}")),
        node(),
    )
    .expect("verify-full");

    // Another CA: the server is not trusted.
    let (other_ca, _, _) = certificates(&["127.0.0.1"]);
    let other = dir.path().join("other.pem");
    std::fs::write(&other, other_ca).unwrap();
    let e = refused(cadre::cluster::postgres::open_store(
        &url(
            &pg,
            "127.0.0.1",
            &format!("sslmode=require&sslrootcert={}", other.display()),
        ),
        node(),
    ));
    assert!(e.contains("--store"), "{e}");
    assert!(e.to_lowercase().contains("certificate"), "{e}");

    // A root file that is not there is named.
    let e = refused(cadre::cluster::postgres::open_store(
        &url(
            &pg,
            "127.0.0.1",
            "sslmode=require&sslrootcert=/nonexistent/ca.pem",
        ),
        node(),
    ));
    assert!(e.contains("/nonexistent/ca.pem"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_for_another_host_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (ca, cert, key) = certificates(&["db.example.internal"]);
    let pg = Postgres::start_tls(&cert, &key);
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, &ca).unwrap();
    let e = refused(cadre::cluster::postgres::open_store(
        &url(
            &pg,
            "127.0.0.1",
            &format!("sslmode=require&sslrootcert={}", ca_file.display()),
        ),
        node(),
    ));
    assert!(e.to_lowercase().contains("certificate"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sslmode_require_against_a_server_without_tls_is_refused() {
    let pg = Postgres::shared();
    let e = refused(cadre::cluster::postgres::open_store(
        &url(&pg, "127.0.0.1", "sslmode=require"),
        node(),
    ));
    assert!(e.contains("--store"), "{e}");
}
