//! Hot reload of tool files: a file watcher, with a periodic rescan as the
//! fallback (some filesystems and editors defeat watchers).
//!
//! notify (changes only) ─▶ pending paths ─┐ 150 ms quiet
//! interval tick ─────────────────────────┴─▶ reload() on a blocking thread (the runtime's pass) ──▶ events
//!
//! Only create, modify (data, rename) and remove events start a reload
//! ([`is_change`]): a reload reads every file, and inotify reports those
//! reads as open/access events, so a watcher that took them would reload
//! forever (each reload's reads triggering the next). Metadata changes
//! (`chmod`, atime) change no text and are ignored too. Events arriving in
//! one quiet period make one reload; the paths that started it are logged
//! at debug (`cadre::tools::watch`).
//!
//! A reload that finds nothing changed costs one read of each file (up to
//! `[tools] max_file_bytes`) and publishes nothing. [`spawn_with`] runs any
//! reload the same way; the runtime runs one pass over several folders
//! ([`spawn_over`]: tool files, then agents, then workflows), so a change
//! in any of them never reloads an agent before the tools it names.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use notify::event::{EventKind, ModifyKind};
use notify::{RecursiveMode, Watcher};
use tokio::sync::mpsc;

/// How long a burst of events (an editor's save) has to be quiet before
/// the reload runs.
const DEBOUNCE: Duration = Duration::from_millis(150);

/// Whether an event can change what a file holds: created, written,
/// renamed or removed. Opens, reads and closes (a reload's own reads) and
/// metadata changes are not.
pub fn is_change(kind: &EventKind) -> bool {
    match kind {
        EventKind::Create(_) | EventKind::Remove(_) => true,
        EventKind::Modify(m) => !matches!(m, ModifyKind::Metadata(_)),
        EventKind::Access(_) | EventKind::Any | EventKind::Other => false,
    }
}

/// Runs `reload` on a blocking thread whenever a file in `dir` changes,
/// and every `interval`; `what` names the files in log lines.
pub fn spawn_with(
    dir: PathBuf,
    interval: Duration,
    what: &'static str,
    reload: impl Fn() + Send + Sync + 'static,
) {
    spawn_over(vec![dir], interval, what, reload);
}

/// [`spawn_with`] over several folders: one watcher, one rescan tick, and
/// one `reload` at a time for a change in any of them (the runtime's pass
/// over tools, agents and workflows, in that order).
pub fn spawn_over(
    dirs: Vec<PathBuf>,
    interval: Duration,
    what: &'static str,
    reload: impl Fn() + Send + Sync + 'static,
) {
    let reload = Arc::new(reload);
    let pending: Arc<Mutex<BTreeSet<PathBuf>>> = Arc::default();
    let (tx, mut rx) = mpsc::channel::<()>(1);
    let seen = pending.clone();
    let watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        match event {
            Ok(event) if is_change(&event.kind) => {
                seen.lock().expect("watch paths lock").extend(event.paths);
                // A full channel already holds a pending reload.
                let _ = tx.try_send(());
            }
            Ok(_) => {}
            Err(e) => tracing::debug!(error = %e, "{what} file watcher error"),
        }
    });
    let watcher = match watcher {
        Ok(mut w) => {
            for dir in &dirs {
                if let Err(e) = w.watch(dir, RecursiveMode::NonRecursive) {
                    tracing::warn!(dir = %dir.display(), error = %e, "cannot watch {what} files; rescanning every {interval:?}");
                }
            }
            Some(w)
        }
        Err(e) => {
            tracing::warn!(error = %e, "no file watcher; rescanning every {interval:?}");
            None
        }
    };
    tokio::spawn(async move {
        let _keep = watcher;
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    tracing::debug!(trigger = "rescan", "reloading {what} files");
                }
                got = rx.recv() => {
                    if got.is_none() {
                        break;
                    }
                    tokio::time::sleep(DEBOUNCE).await;
                    while rx.try_recv().is_ok() {}
                    let paths = std::mem::take(&mut *pending.lock().expect("watch paths lock"));
                    // The paths of a signal drained above went with an
                    // earlier batch.
                    if paths.is_empty() {
                        continue;
                    }
                    tracing::debug!(trigger = "watcher", ?paths, "reloading {what} files");
                }
            }
            let reload = reload.clone();
            if tokio::task::spawn_blocking(move || reload()).await.is_err() {
                tracing::error!("{what} reload panicked");
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use notify::event::{
        AccessKind, AccessMode, CreateKind, DataChange, MetadataKind, RemoveKind, RenameMode,
    };

    #[test]
    fn only_events_that_can_change_a_file_start_a_reload() {
        let changes = [
            EventKind::Create(CreateKind::File),
            EventKind::Modify(ModifyKind::Data(DataChange::Any)),
            EventKind::Modify(ModifyKind::Name(RenameMode::To)),
            EventKind::Modify(ModifyKind::Any),
            EventKind::Remove(RemoveKind::File),
        ];
        for kind in changes {
            assert!(is_change(&kind), "{kind:?}");
        }
        let reads = [
            EventKind::Access(AccessKind::Open(AccessMode::Any)),
            EventKind::Access(AccessKind::Read),
            EventKind::Access(AccessKind::Close(AccessMode::Read)),
            EventKind::Modify(ModifyKind::Metadata(MetadataKind::AccessTime)),
            EventKind::Any,
        ];
        for kind in reads {
            assert!(!is_change(&kind), "{kind:?}");
        }
    }
}
