//! Turn logs: every event of a turn that is streamed (or runs in the
//! background), numbered and kept, so a client that lost its stream
//! resumes it with `Last-Event-ID` and misses nothing (issue #32).
//!
//! ```text
//! Sessions::start_turn(.., Some(sink)) ──TurnEvent──▶ feeder task ──push──▶ TurnLog (per turn: frames 0, 1, 2, ...)
//!                                                        └─ the outcome: a failure becomes `turn_failed`
//! readers (the POST's SSE reply, GET .../turns/{turn_id}/events, the OpenAI and A2A doors) ──read(after)──▶ frames, then live
//! ```
//!
//! Decisions:
//! - **Ids.** Frame `n` of a turn goes out as SSE `id: n`; the last one (a
//!   turn's `turn_completed`, `turn_paused`, `turn_interrupted` or
//!   `turn_failed`) as `id: n.end`. A client reconnects to `GET
//!   /v1/sessions/{id}/turns/{turn_id}/events` with `Last-Event-ID: n` (or
//!   `?after=n`) and gets frames `n+1..` exactly once, then the live ones;
//!   with `n.end` (it saw the end) it gets `204 No Content`, which makes
//!   an EventSource stop reconnecting (WHATWG: a non-200 answer fails the
//!   connection for good).
//! - **Retention.** A turn's log lives while the turn runs and
//!   [`TURN_LOG_RETENTION`] (5 min) after it ends, in the memory of the
//!   node that runs the turn (in a cluster every node forwards a session's
//!   requests to that node, so any node serves a reconnect). Past that, or
//!   after that node died (the turn was taken up by another node, which
//!   has no log of it), a reconnect is answered from the turn's durable
//!   record: the turn's end only (`turn_completed` with the whole answer,
//!   `turn_paused`, `turn_failed` or `turn_interrupted`; waited for while
//!   the turn runs), not the deltas in between.
//! - **Bounds.** A log holds at most [`MAX_TURN_LOG_BYTES`] (event JSON);
//!   past it its oldest frames are dropped, and a reader that was behind
//!   them gets a `lagged` event (`{missed}`) and goes on from the oldest
//!   kept (the final event carries the whole answer). All logs of a node
//!   together hold at most [`MAX_TURN_LOGS_BYTES`]: past it, the logs of
//!   ended turns go first, oldest first. A reader holds no buffer of its
//!   own: a slow client reads the log at its pace (this replaced the
//!   per-stream pacing buffer of SSE replies; the WebSocket keeps it).
//! - **A client that leaves.** A streamed turn queued behind another one
//!   is dropped, never run, if its client leaves before it starts (as
//!   before logs); once it started it runs to its end and its log is kept,
//!   read or not. A background turn (`Prefer: respond-async`) is logged
//!   without a reader.
//! - **A paused turn.** A turn paused for an approval ends its log with
//!   `turn_paused`; deciding resumes it in the background, without a log.
//!   A reader that reaches that `turn_paused` (or reconnects after it) and
//!   finds the turn moved on gets its end from the record, as above.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::Stream;
use tokio::sync::{mpsc, watch};

use super::error::{ApiError, TurnFailed};
use crate::conversation::actor::TurnEvent;
use crate::conversation::sessions::StartedTurn;
use crate::conversation::{SessionError, TurnEnd, TurnError};
use crate::error_code::ErrorCode;

/// How long a turn's log is kept after the turn ended.
pub const TURN_LOG_RETENTION: Duration = Duration::from_secs(300);
/// Most bytes (event JSON) one turn's log holds.
pub const MAX_TURN_LOG_BYTES: usize = super::streams::MAX_TURN_STREAM_LAG_BYTES;
/// Most bytes all turn logs of a node hold together.
pub const MAX_TURN_LOGS_BYTES: usize = 256 << 20;
/// The reconnection time (`retry:`) every turn stream starts with.
pub const RETRY: Duration = Duration::from_secs(2);

/// One event of a turn, as it goes out.
#[derive(Clone, Debug)]
pub struct Frame {
    pub seq: u64,
    /// The SSE event name (`turn_started`, `model_delta`, ...).
    pub name: &'static str,
    /// Its JSON.
    pub data: Arc<str>,
    /// The turn's last event (it ended or paused).
    pub last: bool,
}

impl Frame {
    /// The SSE `id:` of this frame (see the module doc).
    pub fn id(&self) -> String {
        if self.last {
            format!("{}.end", self.seq)
        } else {
            self.seq.to_string()
        }
    }

    /// The SSE event.
    pub fn sse(&self) -> axum::response::sse::Event {
        axum::response::sse::Event::default()
            .id(self.id())
            .event(self.name)
            .data(&*self.data)
    }

    fn bytes(&self) -> usize {
        self.data.len() + 32
    }
}

/// A frame read back as what it says.
#[derive(Debug, Clone)]
pub enum Logged {
    Event(TurnEvent),
    /// `turn_failed`: the turn's error (its code and message).
    Failed {
        code: String,
        message: String,
    },
}

impl Frame {
    /// The event this frame carries; `None` for one that does not read
    /// back (it never happens to a frame this module wrote).
    pub fn decode(&self) -> Option<Logged> {
        match self.name {
            "turn_completed" => serde_json::from_str(&self.data)
                .ok()
                .map(|o| Logged::Event(TurnEvent::TurnCompleted(Box::new(o)))),
            "turn_paused" => serde_json::from_str(&self.data)
                .ok()
                .map(|o| Logged::Event(TurnEvent::TurnPaused(Box::new(o)))),
            "turn_failed" => {
                let failed: serde_json::Value = serde_json::from_str(&self.data).ok()?;
                let text = |k: &str| failed["error"][k].as_str().unwrap_or_default().to_string();
                Some(Logged::Failed {
                    code: text("code"),
                    message: text("message"),
                })
            }
            _ => serde_json::from_str(&self.data).ok().map(Logged::Event),
        }
    }
}

/// What a reader gets: a frame, or how many it missed (the log dropped
/// them for its bound).
#[derive(Clone, Debug)]
pub enum Read {
    Frame(Frame),
    Lagged(u64),
}

/// Where a reconnecting client is: `Last-Event-ID` or `?after=`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Position {
    /// The last frame it saw.
    pub seq: u64,
    /// That frame was the turn's last.
    pub ended: bool,
}

impl Position {
    /// `n` or `n.end`; anything else is `None` (read from the start).
    pub fn parse(text: &str) -> Option<Position> {
        let text = text.trim();
        let (number, ended) = match text.strip_suffix(".end") {
            Some(n) => (n, true),
            None => (text, false),
        };
        number.parse().ok().map(|seq| Position { seq, ended })
    }
}

/// The logs of the turns this node runs (see the module doc).
#[derive(Clone, Default)]
pub struct TurnLogs(Arc<Logs>);

#[derive(Default)]
struct Logs {
    by_turn: Mutex<LogIndex>,
    /// Bytes of every log's frames.
    bytes: Arc<AtomicUsize>,
}

#[derive(Default)]
struct LogIndex {
    logs: HashMap<String, Arc<TurnLog>>,
    /// Ended turns, oldest first, with when their logs expire.
    ended: VecDeque<(Instant, String)>,
}

/// Whether a turn nobody reads is dropped before it starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unread {
    /// A streamed reply: if its client leaves before the turn starts, the
    /// turn is dropped.
    Abandon,
    /// A background turn: logged for whoever comes.
    Keep,
}

impl TurnLogs {
    pub fn new() -> Self {
        Self::default()
    }

    /// Logs the turn `started` of session `session_id` from `events` (the
    /// sink given to `start_turn`); a reader from its first frame. A turn
    /// already logged (a retry that rejoined it) keeps its log.
    pub fn follow(
        &self,
        session_id: &str,
        started: StartedTurn,
        events: mpsc::UnboundedReceiver<TurnEvent>,
        unread: Unread,
    ) -> (Arc<TurnLog>, Reader) {
        let log = {
            let mut index = self.index();
            self.expire(&mut index);
            if let Some(log) = index.logs.get(&started.turn_id) {
                let log = log.clone();
                drop(index);
                let reader = log.reader(None);
                return (log, reader);
            }
            let log = Arc::new(TurnLog {
                session_id: session_id.to_string(),
                turn_id: started.turn_id.clone(),
                state: Mutex::default(),
                changed: watch::Sender::new(0),
                readers: watch::Sender::new(0),
                total: self.0.bytes.clone(),
            });
            index.logs.insert(started.turn_id.clone(), log.clone());
            log
        };
        let reader = log.reader(None);
        let logs = self.clone();
        let fed = log.clone();
        tokio::spawn(async move {
            feed(&fed, events, started.outcome, unread).await;
            logs.ended(&fed);
        });
        (log, reader)
    }

    /// The log of turn `turn_id` of session `session_id`, while it is kept.
    pub fn get(&self, session_id: &str, turn_id: &str) -> Option<Arc<TurnLog>> {
        let mut index = self.index();
        self.expire(&mut index);
        index
            .logs
            .get(turn_id)
            .filter(|log| log.session_id == session_id)
            .cloned()
    }

    fn index(&self) -> std::sync::MutexGuard<'_, LogIndex> {
        self.0.by_turn.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A turn ended: its log expires after the retention, and the oldest
    /// ended logs go now while all logs hold more than their bound.
    fn ended(&self, log: &Arc<TurnLog>) {
        let mut index = self.index();
        index
            .ended
            .push_back((Instant::now() + TURN_LOG_RETENTION, log.turn_id.clone()));
        self.expire(&mut index);
    }

    fn expire(&self, index: &mut LogIndex) {
        let now = Instant::now();
        while let Some((expires, turn_id)) = index.ended.front().cloned() {
            let over = self.0.bytes.load(Ordering::Relaxed) > MAX_TURN_LOGS_BYTES;
            if expires > now && !over {
                break;
            }
            index.ended.pop_front();
            if let Some(log) = index.logs.remove(&turn_id) {
                log.release();
            }
        }
    }
}

/// Drains a turn's events into its log; then its outcome: a failure is
/// the log's `turn_failed`.
async fn feed(
    log: &Arc<TurnLog>,
    mut events: mpsc::UnboundedReceiver<TurnEvent>,
    outcome: std::pin::Pin<
        Box<
            dyn std::future::Future<Output = Result<crate::conversation::TurnOutcome, SessionError>>
                + Send,
        >,
    >,
    unread: Unread,
) {
    let mut readers = log.readers.subscribe();
    let mut started = unread == Unread::Keep;
    let mut outcome = outcome;
    // The outcome future holds a sink of its own (to start the turn again
    // on a fresh conversation), so the events end with the outcome, not
    // with the sink's close.
    let result = loop {
        tokio::select! {
            biased;
            event = events.recv() => match event {
                Some(event) => {
                    started |= matches!(event, TurnEvent::TurnStarted { .. });
                    log.push_event(&event);
                }
                None => break (&mut outcome).await,
            },
            result = &mut outcome => break result,
            // Its client left before it started: dropping the sink drops
            // the queued turn (the conversation sees the sink closed).
            _ = async { readers.wait_for(|n| *n == 0).await.map(|_| ()) }, if !started => {
                drop(events);
                log.finish();
                return;
            }
        }
    };
    // What was sent before the outcome.
    while let Ok(event) = events.try_recv() {
        log.push_event(&event);
    }
    match result {
        // Said by its own event.
        Err(SessionError::Turn(TurnError::Interrupted)) | Ok(_) => {}
        Err(e) => {
            if !log.has_ended() {
                log.push_failure(&ApiError::from(e));
            }
        }
    }
    log.finish();
}

/// One turn's frames (see the module doc).
pub struct TurnLog {
    session_id: String,
    turn_id: String,
    state: Mutex<LogState>,
    /// Bumped after every push and at the end.
    changed: watch::Sender<u64>,
    /// Readers attached.
    readers: watch::Sender<usize>,
    total: Arc<AtomicUsize>,
}

#[derive(Default)]
struct LogState {
    frames: VecDeque<Frame>,
    /// The seq of the next frame.
    next: u64,
    bytes: usize,
    /// No frame will follow.
    done: bool,
}

impl TurnLog {
    pub fn turn_id(&self) -> &str {
        &self.turn_id
    }

    fn state(&self) -> std::sync::MutexGuard<'_, LogState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn push_event(&self, event: &TurnEvent) {
        let data = match event {
            TurnEvent::TurnCompleted(outcome) | TurnEvent::TurnPaused(outcome) => {
                serde_json::to_string(outcome)
            }
            other => serde_json::to_string(other),
        }
        .unwrap_or_default();
        let last = matches!(
            event,
            TurnEvent::TurnCompleted(_)
                | TurnEvent::TurnPaused(_)
                | TurnEvent::TurnInterrupted { .. }
        );
        self.push(event.name(), data.into(), last);
    }

    fn push_failure(&self, error: &ApiError) {
        self.push("turn_failed", failed_json(error).into(), true);
    }

    /// Appends a frame, dropping the oldest past the bound.
    pub fn push(&self, name: &'static str, data: Arc<str>, last: bool) {
        {
            let mut state = self.state();
            if state.done {
                return;
            }
            let frame = Frame {
                seq: state.next,
                name,
                data,
                last,
            };
            state.next += 1;
            state.bytes += frame.bytes();
            self.total.fetch_add(frame.bytes(), Ordering::Relaxed);
            state.frames.push_back(frame);
            while state.bytes > MAX_TURN_LOG_BYTES && state.frames.len() > 1 {
                let dropped = state.frames.pop_front().expect("more than one frame");
                state.bytes -= dropped.bytes();
                self.total.fetch_sub(dropped.bytes(), Ordering::Relaxed);
            }
        }
        self.changed.send_modify(|n| *n += 1);
    }

    fn finish(&self) {
        self.state().done = true;
        self.changed.send_modify(|n| *n += 1);
    }

    /// Its last frame is the turn's end.
    fn has_ended(&self) -> bool {
        self.state().frames.back().is_some_and(|f| f.last)
    }

    /// No frame will follow `seq`: the log is done and has no later
    /// frame, or its frame `seq` (or an earlier one) was the turn's end.
    pub fn is_done_after(&self, seq: u64) -> bool {
        let state = self.state();
        (state.done && state.next <= seq.saturating_add(1))
            || state.frames.back().is_some_and(|f| f.last && f.seq <= seq)
    }

    /// Its newest frame.
    pub fn last_frame(&self) -> Option<Frame> {
        self.state().frames.back().cloned()
    }

    /// The frame `seq`, while kept.
    pub fn frame(&self, seq: u64) -> Option<Frame> {
        let state = self.state();
        let first = state.frames.front()?.seq;
        state
            .frames
            .get(usize::try_from(seq.checked_sub(first)?).ok()?)
            .cloned()
    }

    /// Gives its bytes back to the node's total (it left the index).
    fn release(&self) {
        let mut state = self.state();
        self.total.fetch_sub(state.bytes, Ordering::Relaxed);
        state.bytes = 0;
        state.frames.clear();
    }

    /// A reader of the frames after `after` (all of them for `None`).
    pub fn reader(self: &Arc<Self>, after: Option<u64>) -> Reader {
        self.readers.send_modify(|n| *n += 1);
        Reader {
            log: self.clone(),
            next: after.map_or(0, |n| n.saturating_add(1)),
            changed: self.changed.subscribe(),
            finished: false,
        }
    }
}

/// Reads a log from a position on, then live; ends after the turn's last
/// frame or when the log is done.
pub struct Reader {
    log: Arc<TurnLog>,
    next: u64,
    changed: watch::Receiver<u64>,
    finished: bool,
}

impl Drop for Reader {
    fn drop(&mut self) {
        self.log.readers.send_modify(|n| *n = n.saturating_sub(1));
    }
}

impl Reader {
    /// The next frame (or what was missed); `None` at the end.
    pub async fn next(&mut self) -> Option<Read> {
        loop {
            if self.finished {
                return None;
            }
            self.changed.borrow_and_update();
            {
                let state = self.log.state();
                if let Some(first) = state.frames.front().map(|f| f.seq)
                    && self.next < first
                {
                    let missed = first - self.next;
                    self.next = first;
                    return Some(Read::Lagged(missed));
                }
                if let Some(first) = state.frames.front().map(|f| f.seq)
                    && let Some(frame) = state.frames.get((self.next - first) as usize)
                {
                    let frame = frame.clone();
                    self.next += 1;
                    self.finished = frame.last;
                    return Some(Read::Frame(frame));
                }
                if state.done {
                    self.finished = true;
                    return None;
                }
            }
            if self.changed.changed().await.is_err() {
                return None;
            }
        }
    }

    /// The seq of the next frame it reads.
    pub fn position(&self) -> u64 {
        self.next
    }

    /// As a stream.
    pub fn into_stream(self) -> impl Stream<Item = Read> + Send {
        futures::stream::unfold(self, |mut reader| async move {
            reader.next().await.map(|read| (read, reader))
        })
    }
}

/// The JSON of a `turn_failed` event.
pub fn failed_json(error: &ApiError) -> String {
    serde_json::to_string(&TurnFailed {
        error: error.detail(),
        status: error.status.as_u16(),
    })
    .unwrap_or_default()
}

/// The frame that says how a turn ended, from its record: what a reader
/// without the turn's log gets, numbered `seq`.
pub fn end_frame(end: &TurnEnd, seq: u64) -> Frame {
    let (name, data) = match end {
        TurnEnd::Completed(outcome) => (
            "turn_completed",
            serde_json::to_string(outcome).unwrap_or_default(),
        ),
        TurnEnd::Paused(outcome) => (
            "turn_paused",
            serde_json::to_string(outcome).unwrap_or_default(),
        ),
        TurnEnd::Failed(failure) => {
            let code = ErrorCode::ALL
                .iter()
                .copied()
                .find(|c| c.as_str() == failure.code)
                .unwrap_or(ErrorCode::InternalError);
            (
                "turn_failed",
                failed_json(&ApiError::new(code, failure.message.clone())),
            )
        }
        TurnEnd::Interrupted => (
            "turn_interrupted",
            serde_json::json!({ "type": "turn_interrupted" }).to_string(),
        ),
    };
    Frame {
        seq,
        name,
        data: data.into(),
        last: true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log() -> Arc<TurnLog> {
        Arc::new(TurnLog {
            session_id: "s".into(),
            turn_id: "t".into(),
            state: Mutex::default(),
            changed: watch::Sender::new(0),
            readers: watch::Sender::new(0),
            total: Arc::default(),
        })
    }

    #[test]
    fn positions_parse_with_and_without_the_end_mark() {
        assert_eq!(
            Position::parse("7"),
            Some(Position {
                seq: 7,
                ended: false
            })
        );
        assert_eq!(
            Position::parse(" 12.end"),
            Some(Position {
                seq: 12,
                ended: true
            })
        );
        assert_eq!(Position::parse("x"), None);
        assert_eq!(Position::parse("-1"), None);
    }

    #[tokio::test]
    async fn a_reader_gets_every_frame_after_its_position_then_the_live_ones() {
        let log = log();
        for i in 0..3 {
            log.push("model_delta", format!("{i}").into(), false);
        }
        let mut reader = log.reader(Some(0));
        let Some(Read::Frame(f)) = reader.next().await else {
            panic!()
        };
        assert_eq!((f.seq, &*f.data), (1, "1"));
        let Some(Read::Frame(f)) = reader.next().await else {
            panic!()
        };
        assert_eq!(f.seq, 2);
        let live = tokio::spawn(async move {
            let mut seen = Vec::new();
            while let Some(Read::Frame(f)) = reader.next().await {
                seen.push(f.id());
            }
            seen
        });
        log.push("model_delta", "3".into(), false);
        log.push("turn_completed", "{}".into(), true);
        log.push("never", "{}".into(), false);
        assert_eq!(live.await.unwrap(), vec!["3", "4.end"]);
    }

    #[tokio::test]
    async fn past_its_bound_a_log_drops_its_oldest_frames_and_a_reader_behind_them_is_told() {
        let log = log();
        let big: Arc<str> = "x".repeat(MAX_TURN_LOG_BYTES / 4).into();
        let mut reader = log.reader(None);
        for _ in 0..8 {
            log.push("model_delta", big.clone(), false);
        }
        let kept = log.state().frames.len() as u64;
        assert!(kept < 8 && log.state().bytes <= MAX_TURN_LOG_BYTES);
        let Some(Read::Lagged(missed)) = reader.next().await else {
            panic!("the reader was told what it missed")
        };
        assert_eq!(missed, 8 - kept);
        let Some(Read::Frame(f)) = reader.next().await else {
            panic!()
        };
        assert_eq!(f.seq, 8 - kept);
    }

    #[test]
    fn frames_read_back_as_the_events_they_were() {
        let log = log();
        log.push_event(&TurnEvent::ModelDelta { text: "hi".into() });
        log.push_failure(&ApiError::new(ErrorCode::ModelUnavailable, "down"));
        let delta = log.frame(0).unwrap().decode();
        assert!(
            matches!(delta, Some(Logged::Event(TurnEvent::ModelDelta { text })) if text == "hi")
        );
        let failed = log.frame(1).unwrap().decode();
        assert!(
            matches!(failed, Some(Logged::Failed { code, message }) if code == "MODEL_UNAVAILABLE" && message == "down")
        );
    }

    #[test]
    fn readers_are_counted_while_they_live() {
        let log = log();
        let a = log.reader(None);
        let b = log.reader(None);
        assert_eq!(*log.readers.borrow(), 2);
        drop((a, b));
        assert_eq!(*log.readers.borrow(), 0);
    }
}
