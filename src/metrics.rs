//! Runtime metrics: counters and latency histograms, rendered in the
//! Prometheus text format at `GET /metrics`.
//!
//! conversation (turns, model calls) ─┐
//! executor (tool calls, refusals)   ─┼─▶ Metrics (atomics) ──▶ /metrics
//! store writer (commit latency)     ─┘
//!
//! One `Metrics` per runtime rather than a process-global recorder: tests
//! run several runtimes in one process and each must see its own numbers.
//! Recording is a few relaxed atomic adds (tool counters take a short
//! mutex); rendering reads them without stopping anyone.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Upper bounds (seconds) of the latency buckets.
const BOUNDS: [f64; 12] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0,
];

#[derive(Default)]
pub struct Histogram {
    buckets: [AtomicU64; BOUNDS.len()],
    count: AtomicU64,
    sum_micros: AtomicU64,
}

impl Histogram {
    pub fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        for (i, b) in BOUNDS.iter().enumerate() {
            if secs <= *b {
                self.buckets[i].fetch_add(1, Ordering::Relaxed);
            }
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_micros
            .fetch_add(d.as_micros() as u64, Ordering::Relaxed);
    }

    pub fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        for (i, b) in BOUNDS.iter().enumerate() {
            let n = self.buckets[i].load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {n}");
        }
        let count = self.count.load(Ordering::Relaxed);
        let sum = self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6;
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {count}");
        let _ = writeln!(out, "{name}_sum {sum}\n{name}_count {count}");
    }
}

#[derive(Default)]
pub struct Metrics {
    pub turns_completed: AtomicU64,
    pub turns_failed: AtomicU64,
    /// Turns taken up after a restart cut them.
    pub turns_resumed: AtomicU64,
    /// Turns cut by a newer message, or by a restart past the resume window.
    pub turns_interrupted: AtomicU64,
    pub model_calls: AtomicU64,
    pub model_errors: AtomicU64,
    pub model_latency: Histogram,
    pub turn_latency: Histogram,
    pub rate_limited: AtomicU64,
    /// (tool, outcome) -> calls; outcome is `ok` or the error type.
    tool_calls: Mutex<BTreeMap<(String, String), u64>>,
}

impl Metrics {
    pub fn tool_call(&self, tool: &str, outcome: &str) {
        let mut calls = self.tool_calls.lock().expect("metrics lock");
        *calls
            .entry((tool.to_string(), outcome.to_string()))
            .or_default() += 1;
    }

    fn counter(out: &mut String, name: &str, help: &str, v: &AtomicU64) {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}",
            v.load(Ordering::Relaxed)
        );
    }

    /// Appends this runtime's metrics in the Prometheus text format.
    pub fn render(&self, out: &mut String) {
        Self::counter(
            out,
            "cadre_turns_completed_total",
            "Turns answered.",
            &self.turns_completed,
        );
        Self::counter(
            out,
            "cadre_turns_failed_total",
            "Turns that ended in an error.",
            &self.turns_failed,
        );
        Self::counter(
            out,
            "cadre_turns_resumed_total",
            "Turns taken up from their stored phase after a restart cut them.",
            &self.turns_resumed,
        );
        Self::counter(
            out,
            "cadre_turns_interrupted_total",
            "Turns cut by a newer message, or closed after a restart past the resume window.",
            &self.turns_interrupted,
        );
        self.turn_latency.render(
            out,
            "cadre_turn_duration_seconds",
            "Wall time of answered turns.",
        );
        Self::counter(
            out,
            "cadre_model_calls_total",
            "Model calls (after cadre's retries).",
            &self.model_calls,
        );
        Self::counter(
            out,
            "cadre_model_errors_total",
            "Model calls that failed.",
            &self.model_errors,
        );
        self.model_latency.render(
            out,
            "cadre_model_call_duration_seconds",
            "Duration of model calls.",
        );
        Self::counter(
            out,
            "cadre_rate_limited_total",
            "Tool calls refused by a rate limit.",
            &self.rate_limited,
        );
        let _ = writeln!(
            out,
            "# HELP cadre_tool_calls_total Tool calls by tool and outcome.\n# TYPE cadre_tool_calls_total counter"
        );
        for ((tool, outcome), n) in self.tool_calls.lock().expect("metrics lock").iter() {
            let _ = writeln!(
                out,
                "cadre_tool_calls_total{{tool=\"{}\",outcome=\"{}\"}} {n}",
                escape(tool),
                escape(outcome)
            );
        }
    }
}

fn escape(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counters_histograms_and_labels() {
        let m = Metrics::default();
        m.turns_completed.fetch_add(2, Ordering::Relaxed);
        m.model_latency.observe(Duration::from_millis(3));
        m.tool_call("calculator", "ok");
        m.tool_call("calculator", "ok");
        m.tool_call("echo", "validation_error");
        let mut out = String::new();
        m.render(&mut out);
        assert!(out.contains("cadre_turns_completed_total 2"));
        assert!(out.contains("cadre_model_call_duration_seconds_bucket{le=\"0.0025\"} 0"));
        assert!(out.contains("cadre_model_call_duration_seconds_bucket{le=\"0.005\"} 1"));
        assert!(out.contains("cadre_model_call_duration_seconds_count 1"));
        assert!(out.contains("cadre_tool_calls_total{tool=\"calculator\",outcome=\"ok\"} 2"));
        assert!(
            out.contains("cadre_tool_calls_total{tool=\"echo\",outcome=\"validation_error\"} 1")
        );
    }
}
