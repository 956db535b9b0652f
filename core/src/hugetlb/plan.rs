//! The reservation plan: the rounds a config needs, size by size, and the follow-up rounds of a
//! balanced request whose nodes ran short.
#![deny(unsafe_code)]

use super::RESERVE_ORDER;
use super::batch::Batch;
use super::cmdline::{CmdlineError, HugepageConfig, PoolRequest};
use super::jobs::{Round, RoundKind, Spread};
use super::report::Report;
use crate::addr::HugeSize;
use crate::machine::Machine;
use crate::topology::NodeMask;

/// The most pages one [`HugeJob`](super::HugeJob) asks for, unless
/// [`ReservationPlan::with_chunk_pages`] says otherwise.
///
/// A job holds its zone's lock for the whole chunk: numaframe's metadata is lazy, so there is no
/// per-page work outside the lock to spread over CPUs (Linux's boot-time cost is initialising
/// `struct page`s, which numaframe does not have). One page costs 35 to 50 ns on a current x86
/// core (1 GiB and 2 MiB pages), so a chunk of 1024 pages holds a lock for some 50 µs:
/// - short enough that no CPU waits long for a zone lock, and that the jobs of unequal nodes
///   even out over the CPUs (6 jobs per node for 11,776 1 GiB pages on 2 nodes, 245 for
///   500,000 2 MiB pages);
/// - long enough that taking a job (one atomic add, a lock and a few hundred instructions of
///   bookkeeping) costs under 1% of running it.
pub const DEFAULT_CHUNK_PAGES: u64 = 1024;

/// Boot-time reservation of the pools a [`HugepageConfig`] asks for, as batches of independent
/// jobs; see the [module docs](super).
///
/// It takes half a KiB and no heap. Use it with the machine it was made for.
#[derive(Debug)]
pub struct ReservationPlan<'c> {
    config: &'c HugepageConfig,
    chunk: u64,
    /// The nodes with memory when the plan was made.
    memory: NodeMask,
    /// Per size, indexed like [`RESERVE_ORDER`]: see [`Round::clamp`].
    clamp: [u64; 2],
    /// How many sizes of [`RESERVE_ORDER`] have been started.
    started: usize,
    /// The round handed out last, if its size may need another.
    round: Option<Round<'c>>,
}

impl<'c> ReservationPlan<'c> {
    /// Plans the reservation of `config` on `machine`, in chunks of [`DEFAULT_CHUNK_PAGES`].
    ///
    /// # Errors
    /// [`CmdlineErrorKind::UnknownNode`] at the first entry of a node list naming a node the
    /// machine does not have.
    ///
    /// [`CmdlineErrorKind::UnknownNode`]: super::cmdline::CmdlineErrorKind::UnknownNode
    pub fn new(config: &'c HugepageConfig, machine: &Machine<'_>) -> Result<Self, CmdlineError> {
        Self::with_chunk_pages(config, machine, DEFAULT_CHUNK_PAGES)
    }

    /// [`ReservationPlan::new`] with jobs of at most `chunk_pages` pages (at least 1). The
    /// chunk size changes how the work is cut, never the result.
    ///
    /// # Errors
    /// As [`ReservationPlan::new`].
    pub fn with_chunk_pages(
        config: &'c HugepageConfig,
        machine: &Machine<'_>,
        chunk_pages: u64,
    ) -> Result<Self, CmdlineError> {
        config.validate_nodes(machine.topology().len())?;
        let memory = machine.memory_nodes();
        let clamp = RESERVE_ORDER.map(|size| {
            let shift = size.order().get();
            let most = machine
                .nodes()
                .iter()
                .map(|n| n.managed_pages() >> shift)
                .max()
                .unwrap_or(0);
            most.saturating_add(1)
        });
        Ok(ReservationPlan {
            config,
            chunk: chunk_pages.max(1),
            memory,
            clamp,
            started: 0,
            round: None,
        })
    }

    /// The most pages one job asks for.
    pub fn chunk_pages(&self) -> u64 {
        self.chunk
    }

    /// The config being reserved.
    pub fn config(&self) -> &'c HugepageConfig {
        self.config
    }

    /// The next batch of jobs, or `None` when the reservation is complete.
    ///
    /// Every job of the previous batch must have run (on any CPUs) before this is called: the
    /// next batch depends on what the previous one reserved. It reads the pool counts of
    /// `machine`, taking each node's zone locks once.
    pub fn next_batch(&mut self, machine: &Machine<'_>) -> Option<Batch<'_>> {
        let mut next = self.round.take().and_then(|r| self.follow_up(&r, machine));
        while next.is_none() {
            let size = *RESERVE_ORDER.get(self.started)?;
            self.started += 1;
            next = self.first_round(size);
        }
        self.round = next;
        self.round.as_ref().map(Batch::new)
    }

    /// Runs every batch on the calling CPU.
    pub fn run(&mut self, machine: &Machine<'_>) {
        while let Some(batch) = self.next_batch(machine) {
            batch.run(machine);
        }
    }

    /// Linux's boot lines for the pools as `machine` holds them now (after the last batch: the
    /// result of the reservation).
    pub fn report<'r, 'm>(&'r self, machine: &'r Machine<'m>) -> Report<'r, 'm> {
        Report::new(self.config, machine)
    }

    fn clamp_of(&self, size: HugeSize) -> u64 {
        match size {
            HugeSize::Size1G => self.clamp[0],
            HugeSize::Size2M => self.clamp[1],
        }
    }

    /// The first round of `size`, or `None` if it has no work.
    fn first_round(&self, size: HugeSize) -> Option<Round<'c>> {
        let kind = match self.config.request(size)? {
            PoolRequest::PerNode(entries) => RoundKind::PerNode(entries.as_slice()),
            &PoolRequest::Balanced(n) => {
                if n == 0 || self.memory.count() == 0 {
                    return None;
                }
                RoundKind::Balanced(Spread::new(n, 0, self.memory, None))
            }
        };
        let round = Round::new(size, self.chunk, self.clamp_of(size), kind);
        (round.slots > 0).then_some(round)
    }

    /// The round after `done` for the same size, or `None` if that size is complete.
    fn follow_up(&self, done: &Round<'c>, machine: &Machine<'_>) -> Option<Round<'c>> {
        let RoundKind::Balanced(s) = &done.kind else {
            return None;
        };
        let mut active = s.fill.active;
        let mut short = false;
        for (rank, node) in s.fill.active.iter().enumerate() {
            let target = s.fill.target(rank, done.clamp);
            if machine.huge_counts(node, done.size).total < target {
                active.remove(node);
                short = true;
            }
        }
        if !short || active.count() == 0 {
            return None;
        }
        let kept = self
            .memory
            .iter()
            .filter(|n| !active.contains(*n))
            .map(|n| machine.huge_counts(n, done.size).total)
            .fold(0u64, u64::saturating_add);
        let spread = Spread::new(s.requested, kept, active, Some(s.fill));
        let round = Round::new(
            done.size,
            done.chunk,
            done.clamp,
            RoundKind::Balanced(spread),
        );
        // A round that asks for nothing more (every remaining node is at the clamp) ends it.
        (round.slots > 0).then_some(round)
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::string::ToString;
    use std::vec::Vec;

    use super::super::ReportLine;
    use super::super::cmdline::{self, parse};
    use super::super::test_support::{counts, linux_balanced, n, run_shuffled, spec};
    use super::*;
    use crate::test_util::SparseMem;
    use HugeSize::{Size1G, Size2M};

    #[test]
    #[cfg_attr(miri, ignore = "boots dozens of machines")]
    fn balanced_spreads_round_robin_from_the_lowest_node() {
        // Four nodes of 16 MiB hold 7 aligned 2 MiB blocks each (metadata takes the rest).
        let spec = spec(&[4096, 4096, 4096, 4096]);
        for pages in [0, 1, 5, 6, 7, 22] {
            let mem = SparseMem::default();
            let m = spec.boot(&mem);
            let cfg = parse(&std::format!("hugepages={pages}")).unwrap();
            assert_eq!(run_shuffled(&m, &cfg, 2, pages), usize::from(pages > 0));
            let want: Vec<u64> = (0..4)
                .map(|k| pages / 4 + u64::from(k < pages % 4))
                .collect();
            assert_eq!(counts(&m, Size2M), want, "{pages} pages");
        }
    }

    #[test]
    fn node_form_is_exact_and_short_nodes_keep_what_they_got() {
        let spec = spec(&[4096, 4096, 0, 2048]);
        let mem = SparseMem::default();
        let m = spec.boot(&mem);
        let cfg = parse("hugepagesz=2M hugepages=3:9,0:5,2:1,1:0").unwrap();
        let mut plan = ReservationPlan::with_chunk_pages(&cfg, &m, 2).unwrap();
        plan.run(&m);
        let got = counts(&m, Size2M);
        assert_eq!(got[0], 5);
        assert_eq!(got[1], 0);
        assert_eq!(got[2], 0, "a memoryless node gets nothing");
        assert!(got[3] < 9 && got[3] > 0);
        m.check_invariants().unwrap();
        let text = plan.report(&m).to_string();
        let expected = std::format!(
            "HugeTLB: allocating 1 of page size 2.00 MiB failed node2.  Only allocated 0 hugepages.\n\
             HugeTLB: allocating 9 of page size 2.00 MiB failed node3.  Only allocated {} hugepages.\n\
             HugeTLB: registered 2.00 MiB page size, pre-allocated {} pages\n\
             HugeTLB: registered 1.00 GiB page size, pre-allocated 0 pages\n",
            got[3],
            5 + got[3]
        );
        assert_eq!(text, expected);
    }

    #[test]
    #[cfg_attr(miri, ignore = "boots dozens of machines")]
    fn shortfall_spills_like_linux_for_any_chunk_and_order() {
        // Unequal nodes; one memoryless.
        let shapes: [&[u64]; 4] = [
            &[2048, 8192, 4096],
            &[8192, 1024, 0, 3000, 600],
            &[700, 700, 9000],
            &[4096],
        ];
        let mut most_batches = 0;
        for frames in shapes {
            let spec = spec(frames);
            let cap: u64 = {
                let mem = SparseMem::default();
                let m = spec.boot(&mem);
                linux_balanced(&m, Size2M, u64::MAX);
                counts(&m, Size2M).iter().sum()
            };
            for pages in [
                1,
                3,
                cap.saturating_sub(2),
                cap,
                cap + 1,
                cap + 17,
                u64::MAX,
            ] {
                let reference = {
                    let mem = SparseMem::default();
                    let m = spec.boot(&mem);
                    linux_balanced(&m, Size2M, pages);
                    counts(&m, Size2M)
                };
                for (chunk, seed) in [(1, 1), (2, 7), (3, 99), (DEFAULT_CHUNK_PAGES, 5)] {
                    let mem = SparseMem::default();
                    let m = spec.boot(&mem);
                    let cfg = parse(&std::format!("hugepages={pages}")).unwrap();
                    let batches = run_shuffled(&m, &cfg, chunk, seed);
                    most_batches = most_batches.max(batches);
                    let nodes = frames.iter().filter(|&&f| f > 0).count();
                    assert!(batches <= nodes, "{batches} batches");
                    assert_eq!(
                        counts(&m, Size2M),
                        reference,
                        "{frames:?}: {pages} pages, chunk {chunk}"
                    );
                }
            }
        }
        assert!(most_batches >= 3, "some case spills twice");
    }

    #[test]
    #[cfg_attr(miri, ignore = "boots dozens of machines")]
    fn gigantic_pages_come_first_and_both_sizes_share_a_node() {
        // Node 0: 3 GiB, so 2 whole 1 GiB blocks once metadata is carved off the end.
        let g = 1u64 << 18;
        let spec = spec(&[3 * g, g / 2]);
        let cfg = parse("hugepagesz=2M hugepages=0:600,1:3 hugepagesz=1G hugepages=0:2").unwrap();
        let reference = {
            let mem = SparseMem::default();
            let m = spec.boot(&mem);
            let a = m.reserve_huge(n(0), Size1G, 2);
            let b = m.reserve_huge(n(0), Size2M, 600);
            let c = m.reserve_huge(n(1), Size2M, 3);
            (a, b, c)
        };
        assert_eq!(reference.0, 2);
        for (chunk, seed) in [(1, 3), (7, 4), (1024, 5)] {
            let mem = SparseMem::default();
            let m = spec.boot(&mem);
            run_shuffled(&m, &cfg, chunk, seed);
            assert_eq!(
                (
                    counts(&m, Size1G)[0],
                    counts(&m, Size2M)[0],
                    counts(&m, Size2M)[1]
                ),
                reference
            );
        }
    }

    #[test]
    fn huge_counts_are_clamped_to_what_nodes_can_hold() {
        let spec = spec(&[4096, 4096]);
        let mem = SparseMem::default();
        let m = spec.boot(&mem);
        let cfg = parse("hugepagesz=2M hugepages=0:18446744073709551615").unwrap();
        let mut plan = ReservationPlan::new(&cfg, &m).unwrap();
        let batch = plan.next_batch(&m).unwrap();
        assert!(batch.job_count() <= 2, "{}", batch.job_count());
        batch.run(&m);
        assert!(plan.next_batch(&m).is_none());
        let line = plan.report(&m).lines().next().unwrap();
        assert_eq!(
            line,
            ReportLine::NodeShortfall {
                size: Size2M,
                node: n(0),
                requested: u64::MAX,
                allocated: counts(&m, Size2M)[0]
            }
        );
    }

    #[test]
    fn unknown_nodes_are_refused_with_their_offset() {
        let spec = spec(&[4096, 4096]);
        let mem = SparseMem::default();
        let m = spec.boot(&mem);
        let cfg = parse("hugepagesz=1G hugepages=0:1,2:1").unwrap();
        let e = ReservationPlan::new(&cfg, &m).unwrap_err();
        assert_eq!(e.offset, 28);
        assert_eq!(e.kind, cmdline::CmdlineErrorKind::UnknownNode);
    }
}
