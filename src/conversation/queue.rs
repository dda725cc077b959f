//! A session's queue and its multitask rule, as data: part of the
//! [`super::machine::ConversationMachine`], no IO.
//!
//! UserTurn / RecordMessage ──offer──▶ queue ──next (when the session is free)──▶ the machine's turn
//!                               └── refused: Busy (reject) · QueueFull · or "interrupt first"
//!
//! Rules:
//! - one thing at a time: a turn (from its start until its final commit,
//!   and while it is paused for an approval), an operator's message, or the
//!   summary call after a turn ([`Activity`]); what arrives meanwhile waits
//!   in arrival order;
//! - `multitask = "reject"`: a message is refused while a turn runs, is
//!   paused, or waits (the summary after a turn does not count);
//!   `"interrupt"` and `"rollback"`: a message arriving while a turn runs or
//!   is paused asks for that turn to be cut first; `"enqueue"` (default):
//!   it waits;
//! - at most `max_queued` turns wait besides the running one: one more is
//!   refused with `QueueFull` before it is queued. Operator messages are
//!   not counted (their sender waits for each);
//! - entries whose callers left are forgotten ([`TurnQueue::forget`]); the
//!   actor keeps each caller's channels under the entry's ticket.
//! - an entry carries its turn's settings inline (a few hundred bytes), so
//!   an emptied queue's buffer is freed when the session goes quiet
//!   ([`TurnQueue::shed`]) instead of being kept by every idle
//!   conversation.

use std::collections::VecDeque;

use crate::agents::Multitask;
use crate::model::ChatMessage;

use super::settings::TurnSettings;

/// Turns a session's queue holds besides the running one, unless configured.
pub const DEFAULT_MAX_QUEUED_TURNS: usize = 8;

/// What occupies the session besides a paused turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activity {
    Idle,
    /// A turn runs (up to its final commit).
    Turn,
    /// An operator's message is stored, or the summary after a turn runs.
    Other,
}

/// One entry of the queue; the caller's channels wait under `ticket`.
#[derive(Debug, Clone)]
pub enum Queued {
    Turn {
        ticket: u64,
        content: String,
        settings: Option<TurnSettings>,
        turn_id: String,
        key: Option<String>,
    },
    Record {
        ticket: u64,
        message: ChatMessage,
    },
}

impl Queued {
    pub fn ticket(&self) -> u64 {
        match self {
            Queued::Turn { ticket, .. } | Queued::Record { ticket, .. } => *ticket,
        }
    }

    fn is_turn(&self) -> bool {
        matches!(self, Queued::Turn { .. })
    }
}

/// Why a message was not taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// `multitask = "reject"` and a turn is running, paused or waiting.
    Busy,
    /// `max` turns already wait.
    QueueFull { max: usize },
}

/// A message was taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// It waits for its turn (or starts at once if the session is free).
    Queued,
    /// The running (or paused) turn must be cut first (`interrupt`, or
    /// with `rollback`).
    InterruptFirst { rollback: bool },
}

#[derive(Debug)]
pub struct TurnQueue {
    entries: VecDeque<Queued>,
    activity: Activity,
    multitask: Multitask,
    max_queued: usize,
    next_ticket: u64,
}

impl TurnQueue {
    pub fn new(multitask: Multitask, max_queued: usize) -> Self {
        TurnQueue {
            entries: VecDeque::new(),
            activity: Activity::Idle,
            multitask,
            max_queued,
            next_ticket: 0,
        }
    }

    /// A ticket for the next entry.
    pub fn ticket(&mut self) -> u64 {
        self.next_ticket += 1;
        self.next_ticket
    }

    pub fn activity(&self) -> Activity {
        self.activity
    }

    pub fn set_activity(&mut self, activity: Activity) {
        self.activity = activity;
    }

    /// Takes `entry` (see the module doc); `turn_open`: a turn runs or is
    /// paused in the machine.
    pub fn offer(&mut self, entry: Queued, turn_open: bool) -> Result<Admission, Refusal> {
        let mut admission = Admission::Queued;
        if entry.is_turn() {
            let turn_pending = turn_open
                || self.activity == Activity::Turn
                || self.entries.iter().any(Queued::is_turn);
            match self.multitask {
                Multitask::Reject if turn_pending => return Err(Refusal::Busy),
                Multitask::Interrupt if turn_open => {
                    admission = Admission::InterruptFirst { rollback: false }
                }
                Multitask::Rollback if turn_open => {
                    admission = Admission::InterruptFirst { rollback: true }
                }
                _ => {}
            }
            // A turn about to be cut does not hold the new one back.
            let occupied = match admission {
                Admission::Queued => turn_open || self.activity != Activity::Idle,
                Admission::InterruptFirst { .. } => self.activity == Activity::Other,
            };
            let queued = self.entries.iter().filter(|e| e.is_turn()).count();
            if occupied && queued >= self.max_queued {
                return Err(Refusal::QueueFull {
                    max: self.max_queued,
                });
            }
        }
        self.entries.push_back(entry);
        Ok(admission)
    }

    /// The next entry to perform, when nothing occupies the session and no
    /// turn is open; its activity starts.
    pub fn next(&mut self, turn_open: bool) -> Option<Queued> {
        if turn_open || self.activity != Activity::Idle {
            return None;
        }
        let entry = self.entries.pop_front()?;
        self.activity = if entry.is_turn() {
            Activity::Turn
        } else {
            Activity::Other
        };
        Some(entry)
    }

    /// Drops the entries `gone` says nobody waits for; how many.
    pub fn forget(&mut self, gone: impl Fn(u64) -> bool) -> usize {
        let before = self.entries.len();
        self.entries.retain(|e| !gone(e.ticket()));
        before - self.entries.len()
    }

    /// Every entry, emptied (the actor stops).
    pub fn drain(&mut self) -> Vec<Queued> {
        self.entries.drain(..).collect()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Frees the buffer an emptied queue keeps (a few entries of a few
    /// hundred bytes each: [`Queued`] carries the turn's settings inline).
    pub fn shed(&mut self) {
        self.entries.shrink_to_fit();
    }

    /// Whether turn `turn_id` waits here.
    pub fn holds_turn(&self, turn_id: &str) -> bool {
        self.entries
            .iter()
            .any(|e| matches!(e, Queued::Turn { turn_id: t, .. } if t == turn_id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn turn(q: &mut TurnQueue, id: &str) -> Queued {
        Queued::Turn {
            ticket: q.ticket(),
            content: id.into(),
            settings: None,
            turn_id: id.into(),
            key: None,
        }
    }

    fn record(q: &mut TurnQueue) -> Queued {
        Queued::Record {
            ticket: q.ticket(),
            message: ChatMessage::assistant("operator"),
        }
    }

    #[test]
    fn enqueue_runs_one_thing_at_a_time_in_arrival_order_and_bounds_the_waiting_turns() {
        let mut q = TurnQueue::new(Multitask::Enqueue, 1);
        let a = turn(&mut q, "a");
        assert_eq!(q.offer(a, false), Ok(Admission::Queued));
        let Some(Queued::Turn { turn_id, .. }) = q.next(false) else {
            panic!("a starts")
        };
        assert_eq!(turn_id, "a");
        assert_eq!(q.activity(), Activity::Turn);
        let b = turn(&mut q, "b");
        assert_eq!(q.offer(b, true), Ok(Admission::Queued));
        let r = record(&mut q);
        assert_eq!(
            q.offer(r, true),
            Ok(Admission::Queued),
            "records are not counted"
        );
        let c = turn(&mut q, "c");
        assert_eq!(q.offer(c, true), Err(Refusal::QueueFull { max: 1 }));
        assert!(q.next(true).is_none(), "nothing starts beside a turn");
        q.set_activity(Activity::Other);
        assert!(q.next(false).is_none(), "nor beside the summary");
        q.set_activity(Activity::Idle);
        assert!(matches!(q.next(false), Some(Queued::Turn { turn_id, .. }) if turn_id == "b"));
        q.set_activity(Activity::Idle);
        assert!(matches!(q.next(false), Some(Queued::Record { .. })));
        assert_eq!(q.activity(), Activity::Other);
    }

    #[test]
    fn reject_refuses_while_a_turn_runs_is_paused_or_waits_but_not_during_the_summary() {
        let mut q = TurnQueue::new(Multitask::Reject, 8);
        let a = turn(&mut q, "a");
        q.offer(a, false).unwrap();
        q.next(false).unwrap();
        let b = turn(&mut q, "b");
        assert_eq!(q.offer(b, true), Err(Refusal::Busy), "running");
        q.set_activity(Activity::Idle);
        let b = turn(&mut q, "b");
        assert_eq!(q.offer(b, true), Err(Refusal::Busy), "paused");
        q.set_activity(Activity::Other);
        let b = turn(&mut q, "b");
        assert_eq!(q.offer(b, false), Ok(Admission::Queued), "summary only");
        let c = turn(&mut q, "c");
        assert_eq!(q.offer(c, false), Err(Refusal::Busy), "one waits");
        let r = record(&mut q);
        assert_eq!(
            q.offer(r, false),
            Ok(Admission::Queued),
            "an operator's message"
        );
    }

    #[test]
    fn interrupt_and_rollback_ask_to_cut_an_open_turn_and_queue_otherwise() {
        for (mode, rollback) in [(Multitask::Interrupt, false), (Multitask::Rollback, true)] {
            let mut q = TurnQueue::new(mode, 0);
            let a = turn(&mut q, "a");
            assert_eq!(q.offer(a, false), Ok(Admission::Queued));
            q.next(false).unwrap();
            let b = turn(&mut q, "b");
            assert_eq!(
                q.offer(b, true),
                Ok(Admission::InterruptFirst { rollback }),
                "a queue of 0 does not refuse the turn that cuts"
            );
            assert!(q.holds_turn("b"));
        }
    }

    #[test]
    fn forgotten_entries_leave_the_queue() {
        let mut q = TurnQueue::new(Multitask::Enqueue, 8);
        let a = turn(&mut q, "a");
        let gone = a.ticket();
        q.offer(a, true).unwrap();
        let b = turn(&mut q, "b");
        q.offer(b, true).unwrap();
        assert_eq!(q.forget(|t| t == gone), 1);
        assert!(!q.holds_turn("a") && q.holds_turn("b"));
        assert_eq!(q.drain().len(), 1);
        assert!(q.is_empty());
    }
}
