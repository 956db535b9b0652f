//! The scenarios that report more than time: `hot_add` latency ([`super::hotadd`]). Each runs
//! once per allocator (no calibration, no samples), so they are not criterion cells; the
//! runner calls [`run`] after the timed groups.
#![deny(unsafe_code)]

use std::io;
use std::time::Duration;

use serde_json::{Map, Value};

use super::{Measurement, Report, hotadd, name, scenario};

/// How big the experiments are.
#[derive(Clone, Copy, Debug)]
pub struct Sizes {
    /// `hot_add` calls per run.
    pub hotadd_calls: usize,
    /// When a `hot_add` call counts as timed out.
    pub hotadd_timeout: Duration,
}

impl Sizes {
    /// The full run.
    pub const FULL: Sizes = Sizes {
        hotadd_calls: 20,
        hotadd_timeout: Duration::from_millis(500),
    };
    /// `--quick`: fewer calls.
    pub const QUICK: Sizes = Sizes {
        hotadd_calls: 5,
        hotadd_timeout: Duration::from_millis(100),
    };
}

/// Where the experiments report: `progress` before each run, `done` after each scenario.
pub struct Sink<'s> {
    /// The report the results go into.
    pub report: &'s mut Report,
    /// Told what starts next.
    pub progress: &'s mut dyn FnMut(&str) -> io::Result<()>,
    /// Told each time a scenario is complete.
    pub done: &'s mut dyn FnMut(&Report, &str) -> io::Result<()>,
}

impl std::fmt::Debug for Sink<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sink").finish_non_exhaustive()
    }
}

/// Runs every experiment at `sizes`.
///
/// # Errors
/// If a machine cannot be built, an allocator misbehaves (a frame handed out twice, a fill
/// that does not take all memory) or a callback fails.
pub fn run(sizes: Sizes, sink: &mut Sink<'_>) -> io::Result<()> {
    hot_add(sizes, sink)?;
    Ok(())
}

fn measurement(
    scenario: &'static str,
    allocator: &'static str,
    ns_per_op: f64,
    extra: Value,
    detail: Vec<String>,
) -> Measurement {
    let mut m = Measurement::timed(scenario, allocator, vec![ns_per_op]);
    if let Value::Object(map) = extra {
        m.extra = map;
    } else {
        m.extra = Map::new();
    }
    m.detail = detail;
    m
}

fn hot_add(sizes: Sizes, sink: &mut Sink<'_>) -> io::Result<()> {
    for (s, load) in [(scenario::HOTADD_LOAD, 2), (scenario::HOTADD_IDLE, 0)] {
        (sink.progress)(s)?;
        let l = hotadd::run(sizes.hotadd_calls, load, sizes.hotadd_timeout)?;
        let detail = vec![format!(
            "{} calls: median {:.1} us, worst {:.1} us, {} timed out (> {} ms, load paused){}",
            l.calls,
            l.median_ns / 1e3,
            l.worst_ns / 1e3,
            l.timeouts,
            sizes.hotadd_timeout.as_millis(),
            if load > 0 {
                format!("; load {:.1} M pairs/s", l.load_pairs_per_s / 1e6)
            } else {
                String::new()
            }
        )];
        let extra = serde_json::to_value(&l).map_err(io::Error::other)?;
        sink.report
            .results
            .push(measurement(s, name::NUMAFRAME, l.median_ns, extra, detail));
        (sink.done)(sink.report, s)?;
    }
    Ok(())
}
