//! What a run measured ([`Report`]): the median of every cell, the cells left out, the
//! scaling of the threaded scenarios and the targets, as JSON or as the text tables.
#![deny(unsafe_code)]

use std::io::{self, Write};

use serde::Serialize;

use super::{describe, name, scenario};

/// One measured cell.
#[derive(Clone, Debug, Serialize)]
pub struct Measurement {
    /// The scenario.
    pub scenario: &'static str,
    /// The allocator.
    pub allocator: &'static str,
    /// Median nanoseconds per operation (see the scenario for what an operation is).
    pub ns_per_op: f64,
    /// Samples the median was taken over.
    pub samples: usize,
    /// ns/op of each sample, in the order of the group's rounds (sample `k` of every cell of a
    /// group was taken in round `k`, so cells can be compared round by round).
    #[serde(skip)]
    pub per_sample: Vec<f64>,
    /// Fields of the scenarios that report more than time (documented with each scenario in
    /// [`scenario`]), flattened into the result's JSON object.
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
    /// Lines the text table prints under the row.
    #[serde(skip)]
    pub detail: Vec<String>,
}

impl Measurement {
    /// A cell's result: the median of `per_sample`.
    pub fn timed(scenario: &'static str, allocator: &'static str, per_sample: Vec<f64>) -> Self {
        Measurement {
            scenario,
            allocator,
            ns_per_op: median(&mut per_sample.clone()),
            samples: per_sample.len(),
            per_sample,
            extra: serde_json::Map::new(),
            detail: Vec::new(),
        }
    }
}

/// A cell the run left out, and why.
#[derive(Clone, Debug, Serialize)]
pub struct Skipped {
    /// The scenario.
    pub scenario: &'static str,
    /// The allocator.
    pub allocator: &'static str,
    /// Why.
    pub why: &'static str,
}

/// A target of the project, as a ratio or a bound, measured in this run.
#[derive(Clone, Debug, Serialize)]
pub struct Target {
    /// What is compared.
    pub name: &'static str,
    /// The measured value.
    pub value: f64,
    /// The bound.
    pub limit: f64,
    /// `value <= limit` (or `>=` for the targets that ask for at least).
    pub met: bool,
}

/// The control must scale at least this much in a round for the round to show what an
/// allocator's own scaling is (see [`Scaling::paired_ratio`]).
pub const CONTROL_MIN: f64 = 1.8;

/// One allocator's 2-thread over 1-thread throughput.
#[derive(Clone, Debug, Serialize)]
pub struct Scaling {
    /// The allocator.
    pub allocator: &'static str,
    /// `ns_per_op(1 thread) / ns_per_op(2 threads)` of the medians: 2.0 is perfect scaling.
    pub ratio: f64,
    /// The median of the same ratio over the rounds in which the control
    /// ([`name::FLOOR_PER_THREAD`], nothing shared) scaled at least [`CONTROL_MIN`]: the
    /// rounds in which the machine really ran both threads at once. `None` if there were none
    /// (another process kept a core busy throughout: then no allocator can scale).
    pub paired_ratio: Option<f64>,
    /// How many rounds that median is over.
    pub paired_rounds: usize,
    /// `ns_per_op(1 thread) / ns_per_op(4 threads)`: 4 threads on this machine's 2 cores, so
    /// 2.0 is the most it can give.
    pub four_threads: Option<f64>,
}

/// Everything a run measured.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Report {
    /// Every measured cell, in run order.
    pub results: Vec<Measurement>,
    /// Cells left out.
    pub skipped: Vec<Skipped>,
    /// The targets these scenarios are held to.
    pub targets: Vec<Target>,
    /// 2-thread over 1-thread throughput per allocator (see [`Report::scaling`]).
    pub scaling: Vec<Scaling>,
    /// Whether this was a `--quick` run.
    pub quick: bool,
}

impl Report {
    /// The median ns/op of a cell, if measured.
    pub fn get(&self, scenario: &str, allocator: &str) -> Option<f64> {
        self.results
            .iter()
            .find(|m| m.scenario == scenario && m.allocator == allocator)
            .map(|m| m.ns_per_op)
    }

    pub(super) fn compute_targets(&mut self) {
        use scenario::*;
        let mut t = Vec::new();
        let mut push = |name, value: Option<f64>, limit, at_most: bool| {
            if let Some(value) = value.filter(|v| v.is_finite()) {
                let met = if at_most {
                    value <= limit
                } else {
                    value >= limit
                };
                t.push(Target {
                    name,
                    value,
                    limit,
                    met,
                });
            }
        };
        let nf = self.get(PAIR_1G, name::NUMAFRAME);
        let floor = self.get(PAIR_1G, name::FLOOR);
        let best_peer = [name::BUDDY, name::BITMAP, name::FREE_LIST]
            .iter()
            .filter_map(|a| self.get(PAIR_1G, a))
            .reduce(f64::min);
        push(
            "pair 1GiB: numaframe / floor (at most)",
            nf.zip(floor).map(|(a, b)| a / b),
            2.0,
            true,
        );
        push(
            "pair 1GiB: fastest peer / numaframe (at least)",
            best_peer.zip(nf).map(|(a, b)| a / b),
            3.0,
            false,
        );
        push(
            "bulk-512 alloc: numaframe ns per frame (at most)",
            self.get(BULK_ALLOC, name::NUMAFRAME),
            3.0,
            true,
        );
        push(
            "bulk-512 free: numaframe ns per frame (at most)",
            self.get(BULK_FREE, name::NUMAFRAME),
            3.0,
            true,
        );
        let scaling = |a| {
            self.get(THREADS_1, a)
                .zip(self.get(THREADS_2, a))
                .map(|(one, two)| one / two)
        };
        push(
            "2-thread / 1-thread throughput, caches on (at least)",
            scaling(name::NUMAFRAME),
            1.8,
            false,
        );
        push(
            "fake-64: 63 exhausted / local hit (at most)",
            self.get(HINT_SKIP, name::NUMAFRAME)
                .zip(self.get(HINT_LOCAL, name::NUMAFRAME))
                .map(|(a, b)| a / b),
            2.0,
            true,
        );
        self.targets = t;
        let paired = self
            .scaling()
            .into_iter()
            .find(|x| x.allocator == name::NUMAFRAME)
            .and_then(|x| x.paired_ratio);
        if let Some(v) = paired {
            self.targets.push(Target {
                name: "the same, in rounds where the control scaled >= 1.8 (at least)",
                value: v,
                limit: 1.8,
                met: v >= 1.8,
            });
        }
        self.scaling = self.scaling();
    }

    fn per_sample(&self, scenario: &str, allocator: &str) -> Option<&[f64]> {
        self.results
            .iter()
            .find(|m| m.scenario == scenario && m.allocator == allocator)
            .map(|m| m.per_sample.as_slice())
    }

    /// 2-thread over 1-thread throughput of every allocator of the thread scenarios, overall
    /// and over the rounds in which the control scaled.
    pub fn scaling(&self) -> Vec<Scaling> {
        use scenario::{THREADS_1, THREADS_2};
        let good: Vec<usize> = match (
            self.per_sample(THREADS_1, name::FLOOR_PER_THREAD),
            self.per_sample(THREADS_2, name::FLOOR_PER_THREAD),
        ) {
            (Some(one), Some(two)) => one
                .iter()
                .zip(two)
                .enumerate()
                .filter(|(_, (a, b))| *a / *b >= CONTROL_MIN)
                .map(|(k, _)| k)
                .collect(),
            _ => Vec::new(),
        };
        self.results
            .iter()
            .filter(|m| m.scenario == THREADS_1)
            .filter_map(|m| {
                let two = self.get(THREADS_2, m.allocator)?;
                let two_samples = self.per_sample(THREADS_2, m.allocator)?;
                let mut paired: Vec<f64> = good
                    .iter()
                    .filter_map(|&k| Some(m.per_sample.get(k)? / two_samples.get(k)?))
                    .collect();
                let paired_rounds = paired.len();
                Some(Scaling {
                    allocator: m.allocator,
                    ratio: m.ns_per_op / two,
                    paired_ratio: (paired_rounds > 0).then(|| median(&mut paired)),
                    paired_rounds,
                    four_threads: self
                        .get(scenario::THREADS_4, m.allocator)
                        .map(|four| m.ns_per_op / four),
                })
            })
            .collect()
    }

    /// Writes the human table of one scenario: ns/op, and the ratio to numaframe and to the
    /// floor where the scenario has them.
    ///
    /// # Errors
    /// If writing fails.
    pub fn write_scenario(&self, scenario: &str, out: &mut dyn Write) -> io::Result<()> {
        let rows: Vec<&Measurement> = self
            .results
            .iter()
            .filter(|m| m.scenario == scenario)
            .collect();
        if rows.is_empty() {
            return Ok(());
        }
        writeln!(out, "\n{scenario}: {}", describe(scenario))?;
        // Ratios to numaframe: its per-CPU API where the scenario has it, else the first
        // numaframe row.
        let base = rows
            .iter()
            .find(|m| m.allocator == name::NUMAFRAME)
            .or_else(|| {
                rows.iter()
                    .find(|m| m.allocator.starts_with(name::NUMAFRAME))
            })
            .map(|m| (m.allocator, m.ns_per_op));
        let floor = self.get(scenario, name::FLOOR);
        writeln!(
            out,
            "  {:<24} {:>14} {:>22} {:>10} {:>8}",
            "allocator",
            "ns/op",
            format!("x {}", base.map_or(name::NUMAFRAME, |b| b.0)),
            "x floor",
            "samples"
        )?;
        for m in rows {
            let ratio = |base: Option<f64>| {
                base.map_or(String::from("-"), |b| format!("{:.2}x", m.ns_per_op / b))
            };
            writeln!(
                out,
                "  {:<24} {:>14} {:>22} {:>10} {:>8}",
                m.allocator,
                format_ns(m.ns_per_op),
                ratio(base.map(|b| b.1)),
                ratio(floor),
                m.samples
            )?;
            for line in &m.detail {
                writeln!(out, "      {line}")?;
            }
        }
        for s in self.skipped.iter().filter(|s| s.scenario == scenario) {
            writeln!(out, "  {:<24} skipped: {}", s.allocator, s.why)?;
        }
        Ok(())
    }

    /// Writes the scaling ratios and the targets.
    ///
    /// # Errors
    /// If writing fails.
    pub fn write_summary(&self, out: &mut dyn Write) -> io::Result<()> {
        writeln!(
            out,
            "\nscaling (throughput with 2 threads / with 1 thread; 2.00 is perfect; and with 4 threads, \
             oversubscribed on 2 cores):"
        )?;
        writeln!(
            out,
            "  {:<24} {:>8} {:>34} {:>10}",
            "allocator", "medians", "rounds where the control scaled", "4 threads"
        )?;
        for x in &self.scaling {
            let paired = x.paired_ratio.map_or(String::from("-"), |r| {
                format!("{r:.2} over {} rounds", x.paired_rounds)
            });
            let note = if x.allocator == name::FLOOR_PER_THREAD {
                "  <- control: nothing shared"
            } else {
                ""
            };
            let four = x
                .four_threads
                .map_or(String::from("-"), |r| format!("{r:.2}"));
            writeln!(
                out,
                "  {:<24} {:>8.2} {:>34} {four:>10}{note}",
                x.allocator, x.ratio, paired
            )?;
        }
        if self.scaling.iter().all(|x| x.paired_ratio.is_none()) && !self.scaling.is_empty() {
            writeln!(
                out,
                "  (the control never scaled >= {CONTROL_MIN}: another process kept a core busy; \
                 rerun on an idle machine)"
            )?;
        }
        writeln!(out, "\ntargets:")?;
        for t in &self.targets {
            writeln!(
                out,
                "  {:<56} {:>9.2} (limit {:.1}) {}",
                t.name,
                t.value,
                t.limit,
                if t.met { "met" } else { "MISSED" }
            )?;
        }
        Ok(())
    }
}

fn format_ns(ns: f64) -> String {
    if ns >= 1e6 {
        format!("{:.3} ms", ns / 1e6)
    } else if ns >= 1e4 {
        format!("{:.2} us", ns / 1e3)
    } else {
        format!("{ns:.1}")
    }
}

/// The median of `v` (sorted in place); NaN for none.
pub fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n == 0 {
        f64::NAN
    } else if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(median(&mut []).is_nan());
    }

    fn m(scenario: &'static str, allocator: &'static str, ns_per_op: f64) -> Measurement {
        Measurement::timed(scenario, allocator, vec![ns_per_op; 3])
    }

    /// The keys of each object of `bench --json` are those of docs/cli.md's example: the
    /// document's, a result's (a timed scenario's, without extra fields), a skipped cell's, a
    /// target's and a scaling entry's.
    #[test]
    fn json_objects_have_the_keys_of_the_documented_example() {
        use scenario::*;
        use std::collections::BTreeSet;
        let cli_md =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/cli.md"))
                .unwrap();
        let block = &cli_md[cli_md
            .find("### `numaframe bench")
            .expect("the bench section")..];
        let start = block.find("```json\n").unwrap() + "```json\n".len();
        let example = &block[start..start + block[start..].find("```").unwrap()];
        let doc: serde_json::Value =
            serde_json::from_str(&example.replace(",…", "")).expect("the example");

        let mut r = Report {
            results: vec![
                m(PAIR_1G, name::NUMAFRAME, 4.0),
                m(PAIR_1G, name::FLOOR, 2.0),
                m(THREADS_1, name::NUMAFRAME, 10.0),
                m(THREADS_2, name::NUMAFRAME, 5.5),
                m(THREADS_4, name::NUMAFRAME, 6.0),
                m(THREADS_1, name::FLOOR_PER_THREAD, 1.0),
                m(THREADS_2, name::FLOOR_PER_THREAD, 0.5),
            ],
            skipped: vec![Skipped {
                scenario: FILL_1G,
                allocator: name::FREE_LIST,
                why: "seconds per run; left out of --quick",
            }],
            quick: true,
            ..Report::default()
        };
        r.compute_targets();
        r.scaling = r.scaling();
        let got = serde_json::to_value(&r).unwrap();
        let keys = |v: &serde_json::Value| -> BTreeSet<String> {
            v.as_object().unwrap().keys().cloned().collect()
        };
        assert_eq!(keys(&got), keys(&doc), "the document");
        for list in ["results", "skipped", "targets", "scaling"] {
            assert_eq!(
                keys(&got[list][0]),
                keys(&doc[list][0]),
                "an entry of {list}"
            );
        }
    }

    #[test]
    fn report_ratios_targets_and_text() {
        use scenario::*;
        let mut r = Report {
            results: vec![
                m(PAIR_1G, name::NUMAFRAME, 4.0),
                m(PAIR_1G, name::BITMAP, 12.0),
                m(PAIR_1G, name::FREE_LIST, 20.0),
                m(PAIR_1G, name::FLOOR, 2.0),
                m(BULK_ALLOC, name::NUMAFRAME, 2.5),
                m(BULK_FREE, name::NUMAFRAME, 5.0),
                m(THREADS_1, name::NUMAFRAME, 10.0),
                m(THREADS_2, name::NUMAFRAME, 5.5),
                m(THREADS_1, name::FLOOR_PER_THREAD, 1.0),
                m(THREADS_2, name::FLOOR_PER_THREAD, 0.5),
                m(HINT_LOCAL, name::NUMAFRAME, 100.0),
                m(HINT_SKIP, name::NUMAFRAME, 150.0),
            ],
            ..Report::default()
        };
        r.compute_targets();
        let met: Vec<(&str, bool)> = r.targets.iter().map(|t| (t.name, t.met)).collect();
        assert_eq!(
            met.iter().map(|(_, m)| *m).collect::<Vec<_>>(),
            [true, true, true, false, true, true, true],
            "{met:?}"
        );
        assert_eq!(r.scaling.len(), 2);
        assert!((r.scaling[0].ratio - 10.0 / 5.5).abs() < 1e-9);
        assert_eq!(
            r.scaling[0].paired_rounds, 3,
            "the control scaled 2.0 in every round"
        );
        assert!((r.scaling[0].paired_ratio.unwrap() - 10.0 / 5.5).abs() < 1e-9);
        let mut out = Vec::new();
        r.write_scenario(PAIR_1G, &mut out).unwrap();
        r.write_summary(&mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.contains("pair 1GiB: hot order-0"), "{text}");
        // bitmap-allocator: 3x numaframe, 6x the floor.
        let line = text
            .lines()
            .find(|l| l.trim_start().starts_with(name::BITMAP))
            .unwrap();
        assert!(line.contains("3.00x") && line.contains("6.00x"), "{line}");
        assert!(text.contains("control"), "{text}");
        assert!(text.contains("MISSED") && text.contains("met"), "{text}");
        let json = serde_json::to_value(&r).unwrap();
        assert!(json["results"][0]["ns_per_op"].is_number());
    }
}
