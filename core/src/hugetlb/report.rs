//! The report: Linux's boot lines about the pools, from the config and what the nodes hold.
#![deny(unsafe_code)]

use core::fmt;

use super::RESERVE_ORDER;
use super::cmdline::{HugepageConfig, PoolRequest, format_size};
use crate::addr::HugeSize;
use crate::machine::Machine;
use crate::topology::NodeId;

/// Linux's boot lines about the pools: shortfalls, then one `registered` line per size.
///
/// [`fmt::Display`] writes every line followed by `\n`; [`Report::lines`] yields them one by
/// one (for a logger that adds its own line ends). Nothing here allocates.
///
/// Lines come in Linux's order: the shortfalls of 1 GiB pages (Linux reserves them while
/// parsing the command line), those of 2 MiB pages, then `registered` for each size, both of
/// which numaframe always supports (Linux registers 1 GiB pages when the CPU has them, and
/// prints `pre-allocated 0 pages` for a size without a request). Linux registers sizes in the
/// order the command line first names them with `hugepagesz=` or `default_hugepagesz=` (while
/// it parses it), then 1 GiB (x86's `gigantic_pages_init`, an arch initcall), then 2 MiB (the
/// default size, in `hugetlb_init`): so the size named first, then the other, and 1 GiB first
/// when the line names none (a bare `hugepages=N` included).
#[derive(Clone, Copy, Debug)]
pub struct Report<'r, 'm> {
    config: &'r HugepageConfig,
    machine: &'r Machine<'m>,
}

impl<'r, 'm> Report<'r, 'm> {
    /// The report of `config` against the pools of `machine` as they are now.
    pub fn new(config: &'r HugepageConfig, machine: &'r Machine<'m>) -> Self {
        Self { config, machine }
    }

    /// The sizes in the order their `registered` lines come.
    pub fn sizes(&self) -> [HugeSize; 2] {
        use HugeSize::{Size1G, Size2M};
        match self.config.first_named() {
            Some(Size2M) => [Size2M, Size1G],
            Some(Size1G) | None => [Size1G, Size2M],
        }
    }

    /// Pages of `size` the config asks for.
    pub fn requested(&self, size: HugeSize) -> u64 {
        self.config.total(size)
    }

    /// Pages of `size` in the pools of all nodes.
    pub fn allocated(&self, size: HugeSize) -> u64 {
        self.machine
            .topology()
            .node_ids()
            .map(|n| self.pages(n, size))
            .fold(0, u64::saturating_add)
    }

    fn pages(&self, node: NodeId, size: HugeSize) -> u64 {
        self.machine.huge_counts(node, size).total
    }

    /// The lines, in order.
    pub fn lines(&self) -> ReportLines<'r, 'm> {
        ReportLines {
            report: *self,
            step: 0,
            after: None,
        }
    }

    /// Writes every line, each followed by `\n`, to `out`.
    ///
    /// # Errors
    /// What `out` returns.
    pub fn write_to(&self, out: &mut dyn fmt::Write) -> fmt::Result {
        for line in self.lines() {
            writeln!(out, "{line}")?;
        }
        Ok(())
    }

    /// The shortfall line of `size` for the first requested node above `after` that came up
    /// short (node form), or for the whole request (balanced).
    fn shortfall(&self, size: HugeSize, after: Option<NodeId>) -> Option<ReportLine> {
        match self.config.request(size)? {
            PoolRequest::PerNode(entries) => entries
                .iter()
                .filter(|e| after.is_none_or(|a| e.node > a) && e.count > 0)
                .filter_map(|e| {
                    let allocated = self.pages(e.node, size);
                    (allocated < e.count).then_some((e, allocated))
                })
                .min_by_key(|(e, _)| e.node)
                .map(|(e, allocated)| ReportLine::NodeShortfall {
                    size,
                    node: e.node,
                    requested: e.count,
                    allocated,
                }),
            &PoolRequest::Balanced(requested) => {
                let allocated = self.allocated(size);
                (after.is_none() && allocated < requested).then_some(ReportLine::Shortfall {
                    size,
                    requested,
                    allocated,
                })
            }
        }
    }
}

impl fmt::Display for Report<'_, '_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.write_to(f)
    }
}

/// Iterator over the lines of a [`Report`]; made by [`Report::lines`].
#[derive(Clone, Debug)]
pub struct ReportLines<'r, 'm> {
    report: Report<'r, 'm>,
    /// 0 and 1: shortfalls of `RESERVE_ORDER[step]`; 2 and 3: `registered` of
    /// `sizes()[step - 2]`.
    step: usize,
    /// The node of the last node-form shortfall line of the current step.
    after: Option<NodeId>,
}

impl Iterator for ReportLines<'_, '_> {
    type Item = ReportLine;

    fn next(&mut self) -> Option<ReportLine> {
        loop {
            match self.step {
                0 | 1 => {
                    let line = self.report.shortfall(RESERVE_ORDER[self.step], self.after);
                    match line {
                        Some(ReportLine::NodeShortfall { node, .. }) => self.after = Some(node),
                        _ => {
                            self.step += 1;
                            self.after = None;
                        }
                    }
                    if line.is_some() {
                        return line;
                    }
                }
                2 | 3 => {
                    let size = self.report.sizes()[self.step - 2];
                    self.step += 1;
                    return Some(ReportLine::Registered {
                        size,
                        pages: self.report.allocated(size),
                    });
                }
                _ => return None,
            }
        }
    }
}

/// One boot line about the pools, shown as Linux's `mm/hugetlb.c` prints it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum ReportLine {
    /// A node of the node form could not hold its count:
    /// `HugeTLB: allocating 64 of page size 1.00 GiB failed node1.  Only allocated 60 hugepages.`
    NodeShortfall {
        /// The page size.
        size: HugeSize,
        /// The node.
        node: NodeId,
        /// Pages asked of it.
        requested: u64,
        /// Pages it holds.
        allocated: u64,
    },
    /// A node-balanced request could not be met on all nodes together:
    /// `HugeTLB: allocating 64 of page size 1.00 GiB failed.  Only allocated 60 hugepages.`
    Shortfall {
        /// The page size.
        size: HugeSize,
        /// Pages asked for.
        requested: u64,
        /// Pages all nodes hold.
        allocated: u64,
    },
    /// `HugeTLB: registered 1.00 GiB page size, pre-allocated 8 pages`.
    Registered {
        /// The page size.
        size: HugeSize,
        /// Pages all nodes hold.
        pages: u64,
    },
}

impl fmt::Display for ReportLine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            ReportLine::NodeShortfall {
                size,
                node,
                requested,
                allocated,
            } => write!(
                f,
                "HugeTLB: allocating {requested} of page size {} failed node{}.  Only allocated {allocated} hugepages.",
                format_size(size),
                node.index()
            ),
            ReportLine::Shortfall {
                size,
                requested,
                allocated,
            } => write!(
                f,
                "HugeTLB: allocating {requested} of page size {} failed.  Only allocated {allocated} hugepages.",
                format_size(size)
            ),
            ReportLine::Registered { size, pages } => write!(
                f,
                "HugeTLB: registered {} page size, pre-allocated {pages} pages",
                format_size(size)
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::string::{String, ToString};
    use std::vec::Vec;

    use super::super::ReservationPlan;
    use super::super::cmdline::parse;
    use super::super::test_support::{counts, n, spec};
    use super::*;
    use crate::test_util::SparseMem;
    use HugeSize::{Size1G, Size2M};

    #[test]
    fn balanced_shortfall_line() {
        let spec = spec(&[2048, 4096]);
        let mem = SparseMem::default();
        let m = spec.boot(&mem);
        let cfg = parse("hugepages=100").unwrap();
        let mut plan = ReservationPlan::new(&cfg, &m).unwrap();
        plan.run(&m);
        let got = counts(&m, Size2M);
        let total: u64 = got.iter().sum();
        assert!(total > 0 && total < 100);
        let report = plan.report(&m);
        assert_eq!(report.requested(Size2M), 100);
        assert_eq!(report.allocated(Size2M), total);
        let lines: Vec<String> = report.lines().map(|l| l.to_string()).collect();
        assert_eq!(
            lines,
            [
                std::format!(
                    "HugeTLB: allocating 100 of page size 2.00 MiB failed.  Only allocated {total} hugepages."
                ),
                // A bare `hugepages=N` names no size: 1 GiB is registered first, as x86 Linux
                // registers it in an arch initcall before `hugetlb_init` adds the default.
                "HugeTLB: registered 1.00 GiB page size, pre-allocated 0 pages".to_string(),
                std::format!("HugeTLB: registered 2.00 MiB page size, pre-allocated {total} pages"),
            ]
        );
    }

    #[test]
    fn empty_config_reports_both_sizes() {
        let spec = spec(&[4096]);
        let mem = SparseMem::default();
        let m = spec.boot(&mem);
        let cfg = HugepageConfig::default();
        let mut plan = ReservationPlan::new(&cfg, &m).unwrap();
        assert!(plan.next_batch(&m).is_none());
        let mut s = String::new();
        plan.report(&m).write_to(&mut s).unwrap();
        assert_eq!(
            s,
            "HugeTLB: registered 1.00 GiB page size, pre-allocated 0 pages\n\
             HugeTLB: registered 2.00 MiB page size, pre-allocated 0 pages\n"
        );
        let cfg = parse("hugepagesz=1G hugepages=0 hugepagesz=2M hugepages=0:0").unwrap();
        let mut plan = ReservationPlan::new(&cfg, &m).unwrap();
        assert!(plan.next_batch(&m).is_none());
        assert_eq!(plan.report(&m).lines().count(), 2);
    }

    #[test]
    fn registered_lines_come_in_linuxs_order() {
        // Linux registers sizes in the order the command line first names them with
        // `hugepagesz=` or `default_hugepagesz=`, then 1 GiB, then 2 MiB.
        let cases = [
            // Names 2 MiB first and asks for both: Linux registers 2 MiB first.
            (
                "hugepagesz=2M hugepages=4 hugepagesz=1G hugepages=1",
                [Size2M, Size1G],
            ),
            // Names nothing: 1 GiB (the arch's initcall), then the default 2 MiB.
            ("hugepages=5", [Size1G, Size2M]),
            // Names 1 GiB first, asks for 2 MiB only: Linux registers 1 GiB first.
            ("hugepagesz=1G hugepagesz=2M hugepages=5", [Size1G, Size2M]),
            (
                "default_hugepagesz=1G hugepagesz=2M hugepages=5",
                [Size1G, Size2M],
            ),
            // Names 2 MiB first, asks for 1 GiB only: Linux registers 2 MiB first.
            ("hugepagesz=2M hugepagesz=1G hugepages=1", [Size2M, Size1G]),
            // Names 2 MiB only, asks for nothing: 2 MiB, then 1 GiB.
            ("hugepagesz=2M", [Size2M, Size1G]),
        ];
        let spec = spec(&[4096]);
        let mem = SparseMem::default();
        let m = spec.boot(&mem);
        let wrong: Vec<(&str, [HugeSize; 2])> = cases
            .iter()
            .map(|&(line, _)| (line, Report::new(&parse(line).unwrap(), &m).sizes()))
            .filter(|&(line, got)| cases.iter().any(|&(l, linux)| l == line && linux != got))
            .collect();
        assert!(wrong.is_empty(), "not in Linux's order: {wrong:?}");
    }

    #[test]
    fn line_formats() {
        let lines = [
            ReportLine::NodeShortfall {
                size: Size1G,
                node: n(1),
                requested: 64,
                allocated: 60,
            },
            ReportLine::Shortfall {
                size: Size2M,
                requested: 500_000,
                allocated: 7,
            },
            ReportLine::Registered {
                size: Size1G,
                pages: 8,
            },
        ];
        let text: Vec<String> = lines.iter().map(ToString::to_string).collect();
        assert_eq!(
            text,
            [
                "HugeTLB: allocating 64 of page size 1.00 GiB failed node1.  Only allocated 60 hugepages.",
                "HugeTLB: allocating 500000 of page size 2.00 MiB failed.  Only allocated 7 hugepages.",
                "HugeTLB: registered 1.00 GiB page size, pre-allocated 8 pages",
            ]
        );
    }
}
