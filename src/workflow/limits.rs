//! The limits of workflow runs: the `[workflows]` section of the server's
//! config (`CADRE_WORKFLOWS_*`).
//!
//! server config ──▶ [`WorkflowLimits`] ──▶ engine (`max_depth`, checked at start)
//!                                      └──▶ scheduler (`max_map_elements`, checked when a map node starts)

use serde::Deserialize;

/// Default of [`WorkflowLimits::max_map_elements`].
pub const DEFAULT_MAX_MAP_ELEMENTS: usize = 1_000;
/// Default of [`WorkflowLimits::max_depth`].
pub const DEFAULT_MAX_DEPTH: u32 = 4;

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WorkflowLimits {
    /// Elements a map node may fan out over; a node whose array is longer
    /// fails when it starts, naming the cap, and runs none of them.
    pub max_map_elements: usize,
    /// How deep runs may start runs: a run started by a tool call of
    /// another run (its request carries `x-cadre-parent-run`) is one deeper
    /// than that run; a start past this depth is refused with
    /// `WORKFLOW_DEPTH_EXCEEDED`.
    pub max_depth: u32,
}

impl Default for WorkflowLimits {
    fn default() -> Self {
        WorkflowLimits {
            max_map_elements: DEFAULT_MAX_MAP_ELEMENTS,
            max_depth: DEFAULT_MAX_DEPTH,
        }
    }
}
