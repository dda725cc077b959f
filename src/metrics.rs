//! Runtime metrics: counters and latency histograms, rendered in the
//! Prometheus text format at `GET /metrics`.
//!
//! conversation (turns, model calls) ─┐
//! executor (tool calls, refusals)   ─┼─▶ Metrics (atomics) ──▶ /metrics
//! store writer (commit latency)     ─┘
//!
//! One `Metrics` per runtime rather than a process-global recorder: tests
//! run several runtimes in one process and each must see its own numbers.
//! Recording is a few relaxed atomic adds (tool counters and the per-agent
//! counters take a short mutex); rendering reads them without stopping
//! anyone.
//!
//! Per tenant and agent (what a team puts on a dashboard):
//! `cadre_agent_turns_total{tenant,agent,outcome}` (`completed`, `failed`,
//! `interrupted`) and `cadre_agent_tokens_total{tenant,agent,kind}`
//! (`prompt`, `completion`; summaries' model calls included, as in
//! `/v1/usage`). Both label sets are bounded: tenants and agents are
//! created by admins (keys, agent files), and past [`MAX_AGENT_SERIES`]
//! distinct (tenant, agent) pairs a new pair counts under
//! `tenant="_other",agent="_other"`, so a runaway set of tenants cannot grow
//! the scrape without bound. The unlabelled `cadre_turns_*_total` counters
//! stay (the sums over every pair).
//!
//! Guardrails: `cadre_guardrail_trips_total{guardrail,stage}` (blocks) and
//! `cadre_guardrail_rewrites_total{guardrail,stage}` (redactions and
//! rewrites). Guardrail names come from agent files and tenant configs;
//! past [`MAX_GUARDRAIL_SERIES`] distinct (guardrail, stage) pairs a new
//! pair counts under `guardrail="_other"` with its stage.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Upper bounds (seconds) of the latency buckets: from a store commit's
/// half millisecond to a model call's minutes.
const BOUNDS: [f64; 17] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0, 300.0,
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
    /// How long tool calls took (admission to outcome), every tool.
    pub tool_latency: Histogram,
    pub rate_limited: AtomicU64,
    /// (tool, outcome) -> calls; outcome is `ok` or the error type; tool
    /// is a registered tool's name or [`UNREGISTERED`].
    tool_calls: Mutex<BTreeMap<(String, String), u64>>,
    /// (tenant, agent) -> turns and tokens; at most [`MAX_AGENT_SERIES`]
    /// pairs, the rest under [`OVERFLOW`].
    per_agent: Mutex<BTreeMap<(String, String), AgentCounters>>,
    /// (guardrail, stage) -> [blocks, redactions and rewrites]; at most
    /// [`MAX_GUARDRAIL_SERIES`] pairs, the rest under [`OVERFLOW`].
    guardrails: Mutex<BTreeMap<(String, String), [u64; 2]>>,
}

/// The `tool` label of calls naming no registered tool (invented names
/// would each be a new series).
pub const UNREGISTERED: &str = "_unregistered";

/// How many distinct (tenant, agent) pairs get series of their own.
pub const MAX_AGENT_SERIES: usize = 1000;
/// The tenant and agent label of the pairs past [`MAX_AGENT_SERIES`]
/// (and the guardrail label of the pairs past [`MAX_GUARDRAIL_SERIES`]).
pub const OVERFLOW: &str = "_other";

/// How many distinct (guardrail, stage) pairs get series of their own.
pub const MAX_GUARDRAIL_SERIES: usize = 1000;

/// How a turn ended, for the turn counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TurnEnd {
    Completed,
    Failed,
    Interrupted,
}

impl TurnEnd {
    const ALL: [TurnEnd; 3] = [TurnEnd::Completed, TurnEnd::Failed, TurnEnd::Interrupted];

    fn as_str(self) -> &'static str {
        match self {
            TurnEnd::Completed => "completed",
            TurnEnd::Failed => "failed",
            TurnEnd::Interrupted => "interrupted",
        }
    }
}

#[derive(Debug, Default, Clone, Copy)]
struct AgentCounters {
    /// By [`TurnEnd`], in its order.
    turns: [u64; 3],
    prompt_tokens: u64,
    completion_tokens: u64,
}

impl Metrics {
    /// A turn of `agent` in `tenant` ended: the unlabelled counter and the
    /// pair's.
    pub fn turn_ended(&self, tenant: &str, agent: &str, end: TurnEnd) {
        let total = match end {
            TurnEnd::Completed => &self.turns_completed,
            TurnEnd::Failed => &self.turns_failed,
            TurnEnd::Interrupted => &self.turns_interrupted,
        };
        total.fetch_add(1, Ordering::Relaxed);
        self.for_agent(tenant, agent, |c| c.turns[end as usize] += 1);
    }

    /// Model tokens `agent`'s session in `tenant` spent.
    pub fn tokens(&self, tenant: &str, agent: &str, prompt: u64, completion: u64) {
        if prompt == 0 && completion == 0 {
            return;
        }
        self.for_agent(tenant, agent, |c| {
            c.prompt_tokens = c.prompt_tokens.saturating_add(prompt);
            c.completion_tokens = c.completion_tokens.saturating_add(completion);
        });
    }

    fn for_agent(&self, tenant: &str, agent: &str, f: impl FnOnce(&mut AgentCounters)) {
        let mut pairs = self.per_agent.lock().expect("metrics lock");
        let key = (tenant.to_string(), agent.to_string());
        let key = if pairs.contains_key(&key) || pairs.len() < MAX_AGENT_SERIES {
            key
        } else {
            (OVERFLOW.to_string(), OVERFLOW.to_string())
        };
        f(pairs.entry(key).or_default());
    }

    pub fn tool_call(&self, tool: &str, outcome: &str) {
        let mut calls = self.tool_calls.lock().expect("metrics lock");
        *calls
            .entry((tool.to_string(), outcome.to_string()))
            .or_default() += 1;
    }

    /// A guardrail at `stage` blocked (`blocked`), or redacted or rewrote
    /// what it checked. Plain strings: this module sits below `guardrails`.
    pub fn guardrail(&self, guardrail: &str, stage: &str, blocked: bool) {
        let mut pairs = self.guardrails.lock().expect("metrics lock");
        let key = (guardrail.to_string(), stage.to_string());
        let key = if pairs.contains_key(&key) || pairs.len() < MAX_GUARDRAIL_SERIES {
            key
        } else {
            (OVERFLOW.to_string(), stage.to_string())
        };
        let counts = pairs.entry(key).or_default();
        counts[usize::from(!blocked)] += 1;
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
        self.tool_latency.render(
            out,
            "cadre_tool_call_duration_seconds",
            "Duration of tool calls, from admission to outcome.",
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
        let guardrails = self.guardrails.lock().expect("metrics lock").clone();
        for (i, (name, help)) in [
            (
                "cadre_guardrail_trips_total",
                "Subjects blocked, by guardrail and stage.",
            ),
            (
                "cadre_guardrail_rewrites_total",
                "Subjects redacted or rewritten, by guardrail and stage.",
            ),
        ]
        .into_iter()
        .enumerate()
        {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
            for ((guardrail, stage), counts) in &guardrails {
                let _ = writeln!(
                    out,
                    "{name}{{guardrail=\"{}\",stage=\"{}\"}} {}",
                    escape(guardrail),
                    escape(stage),
                    counts[i]
                );
            }
        }
        let pairs = self.per_agent.lock().expect("metrics lock").clone();
        let _ = writeln!(
            out,
            "# HELP cadre_agent_turns_total Turns by tenant, agent and how they ended.\n# TYPE cadre_agent_turns_total counter"
        );
        for ((tenant, agent), c) in &pairs {
            for end in TurnEnd::ALL {
                let _ = writeln!(
                    out,
                    "cadre_agent_turns_total{{tenant=\"{}\",agent=\"{}\",outcome=\"{}\"}} {}",
                    escape(tenant),
                    escape(agent),
                    end.as_str(),
                    c.turns[end as usize]
                );
            }
        }
        let _ = writeln!(
            out,
            "# HELP cadre_agent_tokens_total Model tokens by tenant, agent and kind (prompt, completion).\n# TYPE cadre_agent_tokens_total counter"
        );
        for ((tenant, agent), c) in &pairs {
            for (kind, n) in [
                ("prompt", c.prompt_tokens),
                ("completion", c.completion_tokens),
            ] {
                let _ = writeln!(
                    out,
                    "cadre_agent_tokens_total{{tenant=\"{}\",agent=\"{}\",kind=\"{kind}\"}} {n}",
                    escape(tenant),
                    escape(agent),
                );
            }
        }
    }
}

/// `cadre_build_info` and the standard `process_*` metrics (Linux's
/// `/proc/self`; elsewhere only the build info), so a dashboard sees
/// memory, CPU and file descriptors without a node exporter. Read by hand
/// from three small files rather than through a crate: it is what the
/// Prometheus client libraries' process collectors read.
pub fn render_process(out: &mut String) {
    let _ = writeln!(
        out,
        "# HELP cadre_build_info cadre's version (the value is always 1).\n# TYPE cadre_build_info gauge\ncadre_build_info{{version=\"{}\"}} 1",
        env!("CARGO_PKG_VERSION")
    );
    let Some(p) = process::read() else {
        return;
    };
    let mut metric = |name: &str, help: &str, kind: &str, value: f64| {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}"
        );
    };
    metric(
        "process_cpu_seconds_total",
        "Total user and system CPU time spent in seconds.",
        "counter",
        p.cpu_seconds,
    );
    metric(
        "process_resident_memory_bytes",
        "Resident memory size in bytes.",
        "gauge",
        p.resident_bytes as f64,
    );
    metric(
        "process_virtual_memory_bytes",
        "Virtual memory size in bytes.",
        "gauge",
        p.virtual_bytes as f64,
    );
    metric(
        "process_start_time_seconds",
        "Start time of the process since unix epoch in seconds.",
        "gauge",
        p.start_time_seconds,
    );
    metric(
        "process_open_fds",
        "Number of open file descriptors.",
        "gauge",
        p.open_fds as f64,
    );
    if let Some(max) = p.max_fds {
        metric(
            "process_max_fds",
            "Maximum number of open file descriptors.",
            "gauge",
            max as f64,
        );
    }
}

mod process {
    //! This process's figures from `/proc/self` (Linux).

    pub struct Figures {
        pub cpu_seconds: f64,
        pub resident_bytes: u64,
        pub virtual_bytes: u64,
        pub start_time_seconds: f64,
        pub open_fds: usize,
        pub max_fds: Option<u64>,
    }

    pub fn read() -> Option<Figures> {
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        // The command name (field 2) may hold spaces: count after its ')'.
        let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
        // Fields 14, 15 (utime, stime), 22 (starttime), 23 (vsize), 24
        // (rss pages); `fields[0]` is field 3.
        let at = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
        // SAFETY: sysconf only reads a configuration value.
        let (ticks, page) = unsafe {
            (
                libc::sysconf(libc::_SC_CLK_TCK),
                libc::sysconf(libc::_SC_PAGESIZE),
            )
        };
        let (ticks, page) = (u64::try_from(ticks).ok()?.max(1), u64::try_from(page).ok()?);
        let boot = std::fs::read_to_string("/proc/stat")
            .ok()?
            .lines()
            .find_map(|l| l.strip_prefix("btime ")?.trim().parse::<u64>().ok())?;
        let max_fds = std::fs::read_to_string("/proc/self/limits")
            .ok()
            .and_then(|l| {
                l.lines()
                    .find(|l| l.starts_with("Max open files"))?
                    .split_whitespace()
                    .nth(3)?
                    .parse()
                    .ok()
            });
        Some(Figures {
            cpu_seconds: (at(14)? + at(15)?) as f64 / ticks as f64,
            resident_bytes: at(24)? * page,
            virtual_bytes: at(23)?,
            start_time_seconds: boot as f64 + at(22)? as f64 / ticks as f64,
            open_fds: std::fs::read_dir("/proc/self/fd").ok()?.count(),
            max_fds,
        })
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
        m.tool_call("echo", "VALIDATION_ERROR");
        let mut out = String::new();
        m.render(&mut out);
        render_process(&mut out);
        assert!(out.contains("cadre_build_info{version=\""), "{out}");
        assert!(out.contains("\nprocess_resident_memory_bytes "), "{out}");
        assert!(out.contains("\nprocess_open_fds "), "{out}");
        assert!(out.contains("cadre_turns_completed_total 2"));
        assert!(out.contains("cadre_model_call_duration_seconds_bucket{le=\"0.0025\"} 0"));
        assert!(out.contains("cadre_model_call_duration_seconds_bucket{le=\"0.005\"} 1"));
        assert!(out.contains("cadre_model_call_duration_seconds_count 1"));
        assert!(out.contains("cadre_tool_calls_total{tool=\"calculator\",outcome=\"ok\"} 2"));
        assert!(
            out.contains("cadre_tool_calls_total{tool=\"echo\",outcome=\"VALIDATION_ERROR\"} 1")
        );
    }

    #[test]
    fn turns_and_tokens_count_per_tenant_and_agent() {
        let m = Metrics::default();
        m.turn_ended("acme", "support", TurnEnd::Completed);
        m.turn_ended("acme", "support", TurnEnd::Completed);
        m.turn_ended("acme", "support", TurnEnd::Failed);
        m.turn_ended("globex", "trader", TurnEnd::Interrupted);
        m.tokens("acme", "support", 120, 30);
        m.tokens("acme", "support", 5, 0);
        let mut out = String::new();
        m.render(&mut out);
        for line in [
            "cadre_turns_completed_total 2",
            "cadre_turns_failed_total 1",
            "cadre_turns_interrupted_total 1",
            "cadre_agent_turns_total{tenant=\"acme\",agent=\"support\",outcome=\"completed\"} 2",
            "cadre_agent_turns_total{tenant=\"acme\",agent=\"support\",outcome=\"failed\"} 1",
            "cadre_agent_turns_total{tenant=\"globex\",agent=\"trader\",outcome=\"interrupted\"} 1",
            "cadre_agent_tokens_total{tenant=\"acme\",agent=\"support\",kind=\"prompt\"} 125",
            "cadre_agent_tokens_total{tenant=\"acme\",agent=\"support\",kind=\"completion\"} 30",
        ] {
            assert!(out.contains(line), "no {line} in\n{out}");
        }
    }

    #[test]
    fn guardrail_trips_and_rewrites_count_apart_and_are_bounded() {
        let m = Metrics::default();
        m.guardrail("pii", "output", false);
        m.guardrail("pii", "output", false);
        m.guardrail("pii", "output", true);
        m.guardrail("topics", "input", true);
        for i in 0..MAX_GUARDRAIL_SERIES {
            m.guardrail(&format!("g{i}"), "tool_output", true);
        }
        let mut out = String::new();
        m.render(&mut out);
        for line in [
            "# TYPE cadre_guardrail_trips_total counter",
            "cadre_guardrail_trips_total{guardrail=\"pii\",stage=\"output\"} 1",
            "cadre_guardrail_rewrites_total{guardrail=\"pii\",stage=\"output\"} 2",
            "cadre_guardrail_trips_total{guardrail=\"topics\",stage=\"input\"} 1",
            "cadre_guardrail_rewrites_total{guardrail=\"topics\",stage=\"input\"} 0",
            // Two pairs were there first: the last two names count as `_other`.
            "cadre_guardrail_trips_total{guardrail=\"_other\",stage=\"tool_output\"} 2",
        ] {
            assert!(out.contains(line), "no {line} in the scrape");
        }
        let series = out
            .lines()
            .filter(|l| l.starts_with("cadre_guardrail_trips_total{"))
            .count();
        assert_eq!(series, MAX_GUARDRAIL_SERIES + 1);
    }

    #[test]
    fn pairs_past_the_bound_count_under_other() {
        let m = Metrics::default();
        for i in 0..MAX_AGENT_SERIES + 50 {
            m.turn_ended(&format!("t{i}"), "a", TurnEnd::Completed);
        }
        // A pair that has its series keeps it past the bound.
        m.turn_ended("t0", "a", TurnEnd::Completed);
        let mut out = String::new();
        m.render(&mut out);
        let series = out
            .lines()
            .filter(|l| l.starts_with("cadre_agent_turns_total{") && l.contains("completed"))
            .count();
        assert_eq!(series, MAX_AGENT_SERIES + 1);
        assert!(out.contains(
            "cadre_agent_turns_total{tenant=\"_other\",agent=\"_other\",outcome=\"completed\"} 50"
        ));
        assert!(out.contains(
            "cadre_agent_turns_total{tenant=\"t0\",agent=\"a\",outcome=\"completed\"} 2"
        ));
    }
}
