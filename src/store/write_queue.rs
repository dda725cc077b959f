//! The queue from `RedbStore`'s callers to its writer thread.
//!
//! RedbStore::write / write_behind ──send──▶ WriteQueue ──recv──▶ Writer::run
//!
//! A channel that wakes the writer only when the writer has something to do
//! at once. A write someone waits for always wakes it. A write sent behind
//! ([`WriteRequest::behind`]) is only held until the next commit anyway
//! (up to [`super::HOLD_BEHIND`]), so it wakes the writer only when the
//! writer sleeps with no deadline (it then starts the hold's clock); while
//! the writer holds writes, is committing, or waits out a hold, it finds
//! the later ones in the queue when it looks next. With a channel, every
//! behind write of a turn (its steps, its call records, its usage) was a
//! wake-up of the writer thread, which then went back to sleep holding it:
//! two context switches each, for nothing.
//!
//! Order is the send order, as with a channel. The sender's drop closes the
//! queue (the writer drains it and ends); the receiver's drop refuses later
//! sends, so a caller learns the writer is gone.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use super::{StoreError, WriteOp};

/// One caller's write, on its way to the writer.
pub(super) struct WriteRequest {
    pub(super) ops: Vec<WriteOp>,
    pub(super) durable: bool,
    /// Refuse unless the store is still at this generation.
    pub(super) generation: Option<u64>,
    /// Sent behind: nobody waits for it, so it may wait for the next commit.
    pub(super) behind: bool,
    pub(super) done: oneshot::Sender<Result<(), Arc<StoreError>>>,
}

struct State {
    queue: VecDeque<WriteRequest>,
    /// The writer waits with no deadline: a behind write must wake it.
    idle: bool,
    /// The sender is gone: nothing more will come.
    closed: bool,
    /// The receiver is gone: nothing more is taken.
    gone: bool,
    /// Times a send woke the writer (for the tests).
    wakes: u64,
}

struct Shared {
    state: Mutex<State>,
    wake: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The callers' end (one, owned by the store; dropping it closes the queue).
pub(super) struct Sender(Arc<Shared>);

/// The writer's end.
pub(super) struct Receiver(Arc<Shared>);

/// Why nothing was received.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum RecvError {
    /// The wait ran out with the queue empty.
    Timeout,
    /// Closed and drained.
    Closed,
}

pub(super) fn channel() -> (Sender, Receiver) {
    let shared = Arc::new(Shared {
        state: Mutex::new(State {
            queue: VecDeque::new(),
            idle: false,
            closed: false,
            gone: false,
            wakes: 0,
        }),
        wake: Condvar::new(),
    });
    (Sender(shared.clone()), Receiver(shared))
}

impl Sender {
    /// Queues `request`; gives it back when the writer is gone.
    pub(super) fn send(&self, request: WriteRequest) -> Result<(), WriteRequest> {
        let mut state = self.0.lock();
        if state.gone {
            return Err(request);
        }
        let wake = !request.behind || state.idle;
        state.queue.push_back(request);
        if wake {
            state.idle = false;
            state.wakes += 1;
            drop(state);
            self.0.wake.notify_one();
        }
        Ok(())
    }
}

impl Drop for Sender {
    fn drop(&mut self) {
        self.0.lock().closed = true;
        self.0.wake.notify_one();
    }
}

impl Receiver {
    /// The next request, waiting up to `wait` (`None`: as long as it takes).
    pub(super) fn recv(&self, wait: Option<Duration>) -> Result<WriteRequest, RecvError> {
        let deadline = wait.map(|w| Instant::now() + w);
        let mut state = self.0.lock();
        loop {
            if let Some(request) = state.queue.pop_front() {
                state.idle = false;
                return Ok(request);
            }
            if state.closed {
                return Err(RecvError::Closed);
            }
            match deadline {
                None => {
                    state.idle = true;
                    state = self.0.wake.wait(state).unwrap_or_else(|e| e.into_inner());
                }
                Some(deadline) => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Err(RecvError::Timeout);
                    }
                    state.idle = false;
                    state = self
                        .0
                        .wake
                        .wait_timeout(state, left)
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                }
            }
        }
    }

    /// The next request if one is queued.
    pub(super) fn try_recv(&self) -> Option<WriteRequest> {
        self.0.lock().queue.pop_front()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let mut state = self.0.lock();
        state.gone = true;
        // Their senders learn nothing more: the writer ended.
        state.queue.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(behind: bool) -> WriteRequest {
        WriteRequest {
            ops: Vec::new(),
            durable: false,
            generation: None,
            behind,
            done: oneshot::channel().0,
        }
    }

    #[test]
    fn requests_come_out_in_the_order_they_went_in() {
        let (tx, rx) = channel();
        for behind in [true, false, true] {
            tx.send(request(behind)).map_err(|_| ()).unwrap();
        }
        let order: Vec<bool> = (0..3)
            .map(|_| rx.recv(Some(Duration::ZERO)).unwrap().behind)
            .collect();
        assert_eq!(order, [true, false, true]);
        assert!(rx.try_recv().is_none());
        assert_eq!(
            rx.recv(Some(Duration::from_millis(1))).err(),
            Some(RecvError::Timeout)
        );
    }

    #[test]
    fn a_behind_write_wakes_an_idle_writer_only() {
        let (tx, rx) = channel();
        let wakes = |rx: &Receiver| rx.0.lock().wakes;
        // The writer holds writes (a timed wait) or is committing.
        tx.send(request(true)).map_err(|_| ()).unwrap();
        assert_eq!(wakes(&rx), 0, "a behind write waits for the writer to look");
        tx.send(request(false)).map_err(|_| ()).unwrap();
        assert_eq!(wakes(&rx), 1, "a waited write wakes it");
        // The writer sleeps with no deadline: the first behind write wakes
        // it, the next finds it woken.
        rx.0.lock().idle = true;
        tx.send(request(true)).map_err(|_| ()).unwrap();
        tx.send(request(true)).map_err(|_| ()).unwrap();
        assert_eq!(wakes(&rx), 2);
    }

    #[test]
    fn an_idle_writer_wakes_for_a_behind_write() {
        let (tx, rx) = channel();
        let (got_tx, got) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = got_tx.send(rx.recv(None).map(|r| r.behind));
        });
        tx.send(request(true)).map_err(|_| ()).unwrap();
        assert_eq!(got.recv_timeout(Duration::from_secs(10)), Ok(Ok(true)));
    }

    #[test]
    fn dropping_the_sender_closes_after_the_queue_is_drained() {
        let (tx, rx) = channel();
        tx.send(request(true)).map_err(|_| ()).unwrap();
        drop(tx);
        assert!(rx.recv(None).is_ok());
        assert_eq!(rx.recv(None).err(), Some(RecvError::Closed));
    }

    #[test]
    fn a_send_after_the_writer_is_gone_is_given_back() {
        let (tx, rx) = channel();
        drop(rx);
        assert!(tx.send(request(false)).is_err());
    }
}
