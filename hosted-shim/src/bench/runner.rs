//! The `numaframe bench` visitor: calibrates each cell, takes samples round-robin across the
//! cells of a group, keeps medians ([`run`]).
#![deny(unsafe_code)]

use std::io;
use std::time::Duration;

use super::experiments;
use super::ops::Sample;
use super::{Cell, Group, Measurement, Report, Sizes, Skipped, Visitor, visit};

/// How long the runner measures.
#[derive(Clone, Copy, Debug)]
pub struct Plan {
    /// A sample of a light cell lasts about this long.
    pub sample: Duration,
    /// Samples per cell (the median is reported).
    pub samples: usize,
    /// Samples per cell of a heavy group.
    pub heavy_samples: usize,
    /// A cell stops taking samples once its samples add up to this.
    pub cell_budget: Duration,
    /// Skip slow cells (free-list's O(n²) fill).
    pub skip_slow: bool,
    /// The sizes of the experiments that run after the timed groups.
    pub experiments: experiments::Sizes,
}

impl Plan {
    /// The full run (about a minute and a half on an idle 2-core machine).
    pub const FULL: Plan = Plan {
        sample: Duration::from_millis(15),
        samples: 15,
        heavy_samples: 5,
        cell_budget: Duration::from_millis(1500),
        skip_slow: false,
        experiments: experiments::Sizes::FULL,
    };
    /// `--quick`: a smoke run of a few seconds; its numbers are rough.
    pub const QUICK: Plan = Plan {
        sample: Duration::from_millis(1),
        samples: 3,
        heavy_samples: 1,
        cell_budget: Duration::from_millis(50),
        skip_slow: true,
        experiments: experiments::Sizes::QUICK,
    };
}

/// The `numaframe bench` visitor: calibrates each cell, samples round-robin, keeps medians.
struct Runner<'o> {
    plan: Plan,
    report: Report,
    /// Called with each scenario's name once all its cells are measured.
    on_scenario: &'o mut dyn FnMut(&Report, &str) -> io::Result<()>,
    /// Told what is measured next.
    progress: &'o mut dyn FnMut(&str) -> io::Result<()>,
}

impl Visitor for Runner<'_> {
    fn group(&mut self, group: Group<'_>) -> io::Result<()> {
        let plan = self.plan;
        let want = if group.heavy {
            plan.heavy_samples
        } else {
            plan.samples
        };
        struct State<'c, 'a> {
            cell: &'c mut Cell<'a>,
            iters: u64,
            per_op: Vec<f64>,
            spent: Duration,
        }
        let mut cells = group.cells;
        let mut done: Vec<&'static str> = Vec::new();
        for c in &cells {
            if !done.contains(&c.scenario) {
                done.push(c.scenario);
            }
        }
        (self.progress)(&done.join(", "))?;
        let mut states = Vec::new();
        for c in cells.iter_mut() {
            if c.slow && plan.skip_slow {
                self.report.skipped.push(Skipped {
                    scenario: c.scenario,
                    allocator: c.allocator,
                    why: "seconds per run; left out of --quick",
                });
                continue;
            }
            // Calibrate: the first call warms up (page faults, caches) and is not a sample,
            // except for a slow cell, which runs once.
            let mut iters = 1u64;
            let mut per_op = Vec::new();
            let mut spent = Duration::ZERO;
            loop {
                let s = (c.run)(iters);
                if c.once {
                    per_op.push(ns_per_op(s));
                    spent += s.time;
                    break;
                }
                if s.time >= plan.sample / 2 {
                    break;
                }
                let scale = plan.sample.as_secs_f64() / s.time.as_secs_f64().max(1e-7);
                iters = (iters as f64 * scale.clamp(2.0, 100.0)).ceil() as u64;
            }
            states.push(State {
                cell: c,
                iters,
                per_op,
                spent,
            });
        }
        for _ in 0..want {
            let mut any = false;
            for st in states.iter_mut() {
                let full = st.per_op.len() >= want
                    || st.cell.once
                    || (st.spent >= plan.cell_budget && !st.per_op.is_empty());
                if full {
                    continue;
                }
                let s = (st.cell.run)(st.iters);
                st.per_op.push(ns_per_op(s));
                st.spent += s.time;
                any = true;
            }
            if !any {
                break;
            }
        }
        for st in states.iter_mut() {
            self.report.results.push(Measurement::timed(
                st.cell.scenario,
                st.cell.allocator,
                st.per_op.clone(),
            ));
        }
        for s in done {
            (self.on_scenario)(&self.report, s)?;
        }
        Ok(())
    }
}

fn ns_per_op(s: Sample) -> f64 {
    s.time.as_nanos() as f64 / s.ops.max(1) as f64
}

/// Runs every scenario under `plan`: the timed groups of [`visit`], then the experiments.
/// `on_scenario` sees the report each time a scenario is complete (the text output prints it
/// then); `progress` is told what is measured next.
///
/// # Errors
/// If simulated memory cannot be mapped, a machine does not boot, an allocator misbehaves in
/// an experiment, or a callback fails.
pub fn run(
    plan: Plan,
    on_scenario: &mut dyn FnMut(&Report, &str) -> io::Result<()>,
    progress: &mut dyn FnMut(&str) -> io::Result<()>,
) -> io::Result<Report> {
    let mut runner = Runner {
        plan,
        report: Report {
            quick: plan.skip_slow,
            ..Report::default()
        },
        on_scenario,
        progress,
    };
    visit(Sizes::FULL, &mut runner)?;
    let Runner {
        mut report,
        on_scenario,
        progress,
        ..
    } = runner;
    experiments::run(
        plan.experiments,
        &mut experiments::Sink {
            report: &mut report,
            progress,
            done: on_scenario,
        },
    )?;
    report.compute_targets();
    Ok(report)
}
