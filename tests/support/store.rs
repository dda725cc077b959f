//! The store under a test's app, for tests that seed it before the app
//! starts or inspect it after the app stopped: by default the redb file of
//! the data dir, with `CADRE_TEST_STORE=postgres` a database on a real
//! PostgreSQL (the second pass of `scripts/test`).
//!
//! test ──open_store(dir)──▶ Store ─┐ the same data `spawn_app(.. .data_dir(dir))` serves
//!      ──spawn_app(dir)──▶ app ────┘ (redb: the file; PostgreSQL: the dir's database)
//!      ──rows_naming(dir, ids)──▶ every stored row mentioning an id (every table)
//!      ──redb_only("why")──▶ true on PostgreSQL, after printing why the test is redb's
//!
//! - One database per data dir, made on first use and found again by the
//!   next app or store on that dir (a restart finds its data).
//! - One PostgreSQL per test binary, held from its first use to the
//!   binary's exit (an `atexit` hook stops it and removes its files): a
//!   server that stopped between two apps of one test, because no other
//!   test held it then, would take the first app's database with it.
//! - A child process a test starts (the test binary again, to be killed)
//!   gets the parent's database for its data dir ([`share_with_child`]).
//! - Skips are never silent: [`redb_only`] prints the test's reason, and
//!   the reasons are few (a redb file's faults, its format migration).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use cadre::store::{NodeIdentity, Store};

use super::postgres::Postgres;

/// The node id of the apps on the database `url` (a one-node cluster):
/// one per data dir, so two apps of a test on two dirs are two nodes (their
/// events are told apart), and an app started again on a dir is the same
/// node (it owns its sessions at once).
pub fn node_id(url: &str) -> String {
    format!("test-{}", url.rsplit('/').next().unwrap_or("node"))
}

/// Which store the tests of this run put under their apps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Redb,
    Postgres,
}

/// `CADRE_TEST_STORE`: unset or `redb`, or `postgres`.
pub fn backend() -> Backend {
    match std::env::var("CADRE_TEST_STORE").as_deref() {
        Ok("postgres") => Backend::Postgres,
        Ok("redb") | Err(_) => Backend::Redb,
        Ok(other) => panic!("CADRE_TEST_STORE must be redb or postgres, not {other:?}"),
    }
}

/// True on PostgreSQL, after printing why the calling test checks redb
/// only; the test then returns. On redb: false, the test runs.
///
/// The line goes to the process's stderr itself, not through `eprintln!`,
/// which the test harness captures and shows only for failing tests.
pub fn redb_only(why: &str) -> bool {
    use std::io::Write;
    if backend() == Backend::Redb {
        return false;
    }
    let test = std::thread::current()
        .name()
        .unwrap_or("this test")
        .to_string();
    let _ = writeln!(
        std::io::stderr(),
        "SKIPPED on PostgreSQL (redb only): {test}: {why}"
    );
    true
}

static SERVER: Mutex<Option<Arc<Postgres>>> = Mutex::new(None);
static DATABASES: Mutex<Vec<(PathBuf, String)>> = Mutex::new(Vec::new());

/// At exit: an immediate shutdown (SIGQUIT: no checkpoint, shared memory
/// still released), since the server's files go with it: a fast shutdown's
/// checkpoint of every test's database took up to a minute per binary on a
/// busy 2-core machine. Then the usual stop, which finds it gone.
extern "C" fn stop_server() {
    let server = SERVER.lock().unwrap_or_else(|e| e.into_inner()).take();
    if let Some(pg) = &server {
        // SAFETY: a signal to the server's main process.
        unsafe { libc::kill(pg.pid(), libc::SIGQUIT) };
    }
    drop(server);
}

/// This binary's PostgreSQL, started on first use.
pub fn server() -> Arc<Postgres> {
    let mut slot = SERVER.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(pg) = slot.as_ref() {
        return pg.clone();
    }
    let pg = Postgres::shared();
    *slot = Some(pg.clone());
    // SAFETY: registers a plain function; it runs once, at exit.
    unsafe { libc::atexit(stop_server) };
    pg
}

/// The URL of `data_dir`'s database, when a test app or store used one.
fn known_database(data_dir: &Path) -> Option<String> {
    let known = DATABASES.lock().unwrap_or_else(|e| e.into_inner());
    known
        .iter()
        .find(|(d, _)| d == data_dir)
        .map(|(_, url)| url.clone())
}

/// What a child process (the test binary started again by a test) finds
/// its parent's database for a data dir in: `<dir>\n<url>`.
const INHERITED: &str = "CADRE_TEST_DATABASE";

/// Lets `child` (this test binary, started again) serve `data_dir` from
/// the same store as this process: on PostgreSQL, the dir's database (the
/// child starts no server of its own, which would die with it).
pub fn share_with_child(child: &mut std::process::Command, data_dir: &Path) {
    if let Some(url) = database_of(data_dir) {
        child.env(INHERITED, format!("{}\n{url}", data_dir.display()));
    }
}

/// On PostgreSQL: the URL of `data_dir`'s database (made on first use,
/// or the parent's when this process is a child it shared the dir with).
pub fn database_of(data_dir: &Path) -> Option<String> {
    if backend() == Backend::Redb {
        return None;
    }
    let mut known = DATABASES.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, url)) = known.iter().find(|(d, _)| d == data_dir) {
        return Some(url.clone());
    }
    let inherited = std::env::var(INHERITED).ok().and_then(|v| {
        let (dir, url) = v.split_once('\n')?;
        (Path::new(dir) == data_dir).then(|| url.to_string())
    });
    let url = inherited.unwrap_or_else(|| server().database("app"));
    known.push((data_dir.to_path_buf(), url.clone()));
    Some(url)
}

/// The store an app on `data_dir` runs on, opened by the test: close it
/// (drop) before an app starts on a redb dir, which takes the file's lock.
pub fn open_store(data_dir: &Path) -> Store {
    match database_of(data_dir) {
        None => Store::open(data_dir).expect("open the data dir"),
        Some(url) => cadre::cluster::postgres::open_store(
            &url,
            NodeIdentity {
                id: node_id(&url),
                addr: None,
                stale_after: std::time::Duration::from_secs_f64(
                    cadre::server_config::ServerConfig::default()
                        .cluster
                        .owner_stale_s,
                ),
            },
        )
        .expect("open the data dir's database"),
    }
}

/// Every row of the store of `data_dir` (its app stopped) that mentions one
/// of `ids`, as `table: row`: the dir's database when a test app ran on
/// PostgreSQL, else its redb file (also what a [`super::server::Server`]
/// writes). Panics when the store holds no row at all.
pub fn rows_naming(data_dir: &Path, ids: &[String]) -> Vec<String> {
    let rows: Vec<String> = match known_database(data_dir) {
        None => cadre::store::erase::dump_file(&data_dir.join("cadre.redb"))
            .expect("dump the store")
            .into_iter()
            .map(|r| format!("{}: {} = {}", r.table, r.key, r.value))
            .collect(),
        Some(url) => {
            let pg = server();
            let tables = pg.sql(
                &url,
                "SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY 1",
            );
            let mut rows = Vec::new();
            for table in tables.lines() {
                let out = pg.sql(
                    &url,
                    &format!("SELECT '{table}: ' || t::text FROM {table} t"),
                );
                rows.extend(out.lines().map(str::to_string));
            }
            rows
        }
    };
    assert!(!rows.is_empty(), "the store holds rows");
    rows.into_iter()
        .filter(|r| ids.iter().any(|id| r.contains(id.as_str())))
        .collect()
}
