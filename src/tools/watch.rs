//! Hot reload of tool files: a file watcher, with a periodic rescan as the
//! fallback (some filesystems and editors defeat watchers).
//!
//! notify (debounced) ─┐
//! interval tick      ─┴─▶ registry.reload_dir(dir) on a blocking thread ──▶ events
//!
//! A reload that finds nothing changed costs one read of each file and
//! publishes nothing. [`spawn_with`] runs any reload the same way (the
//! workflow definitions use it).

use std::path::PathBuf;
use std::time::Duration;

use notify_debouncer_mini::notify::RecursiveMode;
use tokio::sync::mpsc;

use super::ToolRegistry;

/// Starts watching `dir`; runs until the tokio runtime shuts down.
pub fn spawn(registry: ToolRegistry, dir: PathBuf, interval: Duration) {
    let watched = dir.clone();
    spawn_with(watched, interval, "tool", move || {
        registry.reload_dir(&dir);
    });
}

/// Runs `reload` on a blocking thread whenever a file in `dir` changes,
/// and every `interval`; `what` names the files in log lines.
pub fn spawn_with(
    dir: PathBuf,
    interval: Duration,
    what: &'static str,
    reload: impl Fn() + Send + Sync + 'static,
) {
    let reload = std::sync::Arc::new(reload);
    let (tx, mut rx) = mpsc::channel::<()>(1);
    let debouncer = notify_debouncer_mini::new_debouncer(Duration::from_millis(150), move |_| {
        // A full channel already holds a pending reload.
        let _ = tx.try_send(());
    });
    let debouncer = match debouncer {
        Ok(mut d) => match d.watcher().watch(&dir, RecursiveMode::NonRecursive) {
            Ok(()) => Some(d),
            Err(e) => {
                tracing::warn!(dir = %dir.display(), error = %e, "cannot watch {what} files; rescanning every {interval:?}");
                None
            }
        },
        Err(e) => {
            tracing::warn!(error = %e, "no file watcher; rescanning every {interval:?}");
            None
        }
    };
    tokio::spawn(async move {
        let _keep = debouncer;
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                got = rx.recv() => if got.is_none() { break },
            }
            let reload = reload.clone();
            if tokio::task::spawn_blocking(move || reload()).await.is_err() {
                tracing::error!("{what} reload panicked");
            }
        }
    });
}
