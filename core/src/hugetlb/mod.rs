//! Huge-page pools: reserving them at boot as independent jobs, and reporting the result in
//! Linux's words.
//!
//! The pools themselves live in the zones ([`Machine::reserve_huge`], [`Machine::alloc_huge`],
//! [`Machine::free_huge`], [`Machine::huge_counts`]); [`cmdline`] reads what the kernel command
//! line asks for. This module turns a [`HugepageConfig`] into work that any number of CPUs can
//! share, without threads, a heap or a clock of its own:
//!
//! 1. [`ReservationPlan::new`] checks the config against the machine.
//! 2. [`ReservationPlan::next_batch`] hands out a [`Batch`] of [`HugeJob`]s. Any CPUs may run the
//!    jobs of one batch at the same time, in any order ([`Batch::job`] by index, or
//!    [`Batch::work`] with a shared [`JobCursor`]). All jobs of a batch must have finished before
//!    the next call to `next_batch`; the borrow of the plan that a `Batch` holds enforces that.
//! 3. [`ReservationPlan::report`] writes Linux's boot lines.
//!
//! ```
//! # use std::alloc::{Layout, alloc_zeroed};
//! # use std::ptr::NonNull;
//! use numaframe::hugetlb::cmdline::{parse};
//! use numaframe::HugeSize;
//! use numaframe::hugetlb::{JobCursor, ReservationPlan};
//! use numaframe::{BootOptions, Machine, MemoryRange, NodeId, NodeInfo, Pfn, PhysMemory};
//! use numaframe::{PhysRange, Topology};
//!
//! /// Metadata regions from the host's heap, never freed.
//! struct HostMemory;
//! // SAFETY: every call returns a fresh, page-aligned allocation of the range's size that
//! // nothing else uses.
//! unsafe impl PhysMemory for HostMemory {
//!     fn map(&self, range: PhysRange) -> Option<NonNull<u8>> {
//!         let layout = Layout::from_size_align(range.bytes() as usize, 4096).ok()?;
//!         // SAFETY: the layout has a non-zero size.
//!         NonNull::new(unsafe { alloc_zeroed(layout) })
//!     }
//! }
//!
//! // Two nodes of 16 MiB.
//! let infos = [NodeInfo { has_cpus: true, has_memory: true, ..NodeInfo::default() }; 2];
//! let distances = [10, 20, 20, 10];
//! let ranges = [0, 1].map(|i| MemoryRange {
//!     node: NodeId::new(i),
//!     range: PhysRange::new(Pfn::new(i as u64 * 4096), Pfn::new((i as u64 + 1) * 4096)).unwrap(),
//! });
//! let topo = Topology::new(&distances, &infos)?;
//! let opts = BootOptions { min_free_kbytes: Some(0), ..BootOptions::default() };
//! let machine = Machine::boot(topo, &HostMemory, &ranges, opts)?;
//!
//! let config = parse("hugepagesz=2M hugepages=0:3,1:2")?;
//! let mut plan = ReservationPlan::new(&config, &machine)?;
//! while let Some(batch) = plan.next_batch(&machine) {
//!     // Each CPU of the platform would run this loop; here one does.
//!     let cursor = JobCursor::new();
//!     batch.work(&machine, &cursor);
//! }
//! assert_eq!(machine.huge_counts(NodeId::new(0), HugeSize::Size2M), (3, 3));
//! assert_eq!(machine.huge_counts(NodeId::new(1), HugeSize::Size2M), (2, 2));
//! assert_eq!(
//!     plan.report(&machine).to_string(),
//!     "HugeTLB: registered 2.00 MiB page size, pre-allocated 5 pages\n\
//!      HugeTLB: registered 1.00 GiB page size, pre-allocated 0 pages\n"
//! );
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # What gets reserved where
//!
//! - The node form (`hugepages=0:4,1:2`) asks each listed node for its count, on that node
//!   alone, as Linux's `hugetlb_hstate_alloc_pages_onenode` does. A node that runs short keeps
//!   what it got.
//! - A node-balanced request (`hugepages=N`) spreads `N` pages over the nodes with memory the way
//!   Linux's sequential `hugetlb_hstate_alloc_pages` does: round-robin from the lowest node, so
//!   when memory suffices, node `k` of `M` gets `N / M` pages plus one if `k < N % M`. When a node
//!   runs out, Linux's round-robin skips it and the other nodes take its share; the result is a
//!   water-filling of the nodes' capacities with the lowest nodes taking the remainder. We get
//!   exactly that result in rounds: each round fills the nodes not yet found short to the level
//!   the request implies given what the short nodes hold, and a round that finds no new short
//!   node is the last. Every other round finds at least one, so there are at most as many
//!   rounds as nodes with memory, and one when memory suffices.
//! - 1 GiB pages are reserved before 2 MiB pages (Linux takes gigantic pages from memblock while
//!   it parses the command line, before the buddy allocator exists), so 2 MiB pages never break
//!   up blocks that a 1 GiB request could have used.
//!
//! # Same result for any number of CPUs
//!
//! A job takes only the zone locks of its own node, and every job of a batch works on one size.
//! Reserving pages of one order on one node is order-independent: a zone hands out blocks of
//! that order while it has one and stays above its min watermark, so the number a node ends up
//! with is `min(what its jobs ask for, what the node can give)`, however its jobs are split and
//! interleaved. (A chunk that comes up short found both zones exhausted, and nothing in a batch
//! gives memory back, so they stay exhausted for the other chunks too.) Batches of different
//! sizes, and the rounds of a balanced request, never overlap. So the per-node counts depend only
//! on the config and the machine. Which frames a node's pool holds may differ from run to run.
//!
//! # Chunks
//!
//! A node's work is cut into jobs of at most [`DEFAULT_CHUNK_PAGES`] pages, and job indices
//! go round the nodes first (chunk 0 of every node, then chunk 1, …), so CPUs that take
//! consecutive indices start on different nodes. See [`DEFAULT_CHUNK_PAGES`] for the size.
//!
//! # Assumptions
//!
//! Reservation is a boot-time step: the pools start empty (as [`Machine::boot`] leaves them) and
//! nothing else grows or shrinks them until the plan is done. Pages already in a pool count as
//! reserved by the plan.
#![deny(unsafe_code)]

pub mod cmdline;

use core::fmt;

use self::cmdline::{CmdlineError, HugepageConfig, NodeCount, PoolRequest, format_size};
use crate::addr::HugeSize;
use crate::machine::Machine;
use crate::sync::{AtomicUsize, Ordering};
use crate::topology::{NodeId, NodeMask};

/// The most pages one [`HugeJob`] asks for, unless [`ReservationPlan::with_chunk_pages`] says
/// otherwise.
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

/// The order in which sizes are reserved: gigantic pages first.
const RESERVE_ORDER: [HugeSize; 2] = [HugeSize::Size1G, HugeSize::Size2M];

/// Pages the `rank`-th node of a spread is filled to: `level`, one more for the first `extra`
/// nodes, at most `clamp`.
fn spread_target(level: u64, extra: usize, rank: usize, clamp: u64) -> u64 {
    level.saturating_add(u64::from(rank < extra)).min(clamp)
}

/// One round of a node-balanced request.
///
/// The `active` nodes (those with memory not yet found short) are filled to `level` pages, one
/// more for the first `extra` of them; the nodes found short keep what they hold.
#[derive(Clone, Copy, Debug)]
struct Spread {
    requested: u64,
    active: NodeMask,
    level: u64,
    extra: usize,
    /// The previous round's `(active, level, extra)`, whose targets the active nodes reached;
    /// `None` in the first round, when every node starts from 0.
    prev: Option<(NodeMask, u64, usize)>,
}

impl Spread {
    /// A round that spreads what `requested` leaves after `kept` over `active`.
    fn new(
        requested: u64,
        kept: u64,
        active: NodeMask,
        prev: Option<(NodeMask, u64, usize)>,
    ) -> Self {
        let left = requested.saturating_sub(kept);
        let m = active.count().max(1) as u64;
        Spread {
            requested,
            active,
            level: left / m,
            // `left % m < m <= MAX_NODES`.
            extra: (left % m) as usize,
            prev,
        }
    }
}

#[derive(Clone, Debug)]
#[allow(
    clippy::large_enum_variant,
    reason = "no heap to box the spread in; a plan holds one round"
)]
enum RoundKind<'c> {
    /// The node form: the entries of the command line, each on its own node.
    PerNode(&'c [NodeCount]),
    /// A node-balanced request.
    Balanced(Spread),
}

/// The jobs of one batch: `targets` nodes, each with up to `slots` chunks. Job `i` is chunk
/// `i / targets` of target `i % targets`.
#[derive(Clone, Debug)]
struct Round<'c> {
    size: HugeSize,
    chunk: u64,
    /// One more than the most pages of `size` any node could hold: a target at or beyond it
    /// cannot be met, whatever its exact value, so targets are capped there (and so are job
    /// counts, whatever the command line asks for).
    clamp: u64,
    targets: usize,
    slots: u64,
    kind: RoundKind<'c>,
}

impl<'c> Round<'c> {
    fn new(size: HugeSize, chunk: u64, clamp: u64, kind: RoundKind<'c>) -> Self {
        let (targets, most) = match &kind {
            RoundKind::PerNode(entries) => (
                entries.len(),
                entries
                    .iter()
                    .map(|e| e.count.min(clamp))
                    .max()
                    .unwrap_or(0),
            ),
            RoundKind::Balanced(s) => {
                let now = spread_target(s.level, s.extra, 0, clamp);
                let before = s.prev.map_or(0, |(_, level, _)| level.min(clamp));
                (s.active.count(), now.saturating_sub(before))
            }
        };
        Round {
            size,
            chunk,
            clamp,
            targets,
            slots: most.div_ceil(chunk),
            kind,
        }
    }

    fn job_count(&self) -> usize {
        (self.targets as u64)
            .checked_mul(self.slots)
            .and_then(|n| usize::try_from(n).ok())
            .unwrap_or(usize::MAX)
    }

    /// The node of target `t` and the pages this round asks of it.
    fn target(&self, t: usize) -> Option<(NodeId, u64)> {
        match &self.kind {
            RoundKind::PerNode(entries) => {
                entries.get(t).map(|e| (e.node, e.count.min(self.clamp)))
            }
            RoundKind::Balanced(s) => {
                let node = s.active.nth(t)?;
                let now = spread_target(s.level, s.extra, t, self.clamp);
                let before = s.prev.map_or(0, |(active, level, extra)| {
                    spread_target(level, extra, active.rank(node), self.clamp)
                });
                Some((node, now.saturating_sub(before)))
            }
        }
    }

    fn job(&self, i: usize) -> Option<HugeJob> {
        if self.targets == 0 {
            return None;
        }
        let slot = (i / self.targets) as u64;
        if slot >= self.slots {
            return None;
        }
        let (node, pages) = self.target(i % self.targets)?;
        // `slot < slots = ceil(most / chunk)`, so this does not overflow.
        let count = pages.checked_sub(slot * self.chunk)?.min(self.chunk);
        (count > 0).then_some(HugeJob {
            node,
            size: self.size,
            count,
        })
    }
}

/// Boot-time reservation of the pools a [`HugepageConfig`] asks for, as batches of independent
/// jobs; see the [module docs](self).
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
    /// [`CmdlineErrorKind::UnknownNode`](cmdline::CmdlineErrorKind::UnknownNode) at the first
    /// entry of a node list naming a node the machine does not have.
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
        self.round.as_ref().map(|round| Batch { round })
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
        let mut active = s.active;
        let mut short = false;
        for (rank, node) in s.active.iter().enumerate() {
            let target = spread_target(s.level, s.extra, rank, done.clamp);
            if machine.huge_counts(node, done.size).0 < target {
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
            .map(|n| machine.huge_counts(n, done.size).0)
            .fold(0u64, u64::saturating_add);
        let spread = Spread::new(
            s.requested,
            kept,
            active,
            Some((s.active, s.level, s.extra)),
        );
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

/// Jobs that any CPUs may run at the same time, in any order; made by
/// [`ReservationPlan::next_batch`].
#[derive(Clone, Copy, Debug)]
pub struct Batch<'p> {
    round: &'p Round<'p>,
}

impl<'p> Batch<'p> {
    /// The page size every job of the batch reserves.
    pub fn size(&self) -> HugeSize {
        self.round.size
    }

    /// Job indices run from 0 to this (exclusive). Some indices hold no job.
    pub fn job_count(&self) -> usize {
        self.round.job_count()
    }

    /// Job `i`, or `None` if index `i` holds none (past [`Batch::job_count`], or a chunk slot
    /// its node does not need).
    pub fn job(&self, i: usize) -> Option<HugeJob> {
        self.round.job(i)
    }

    /// The jobs of the batch, in index order.
    pub fn jobs(&self) -> impl Iterator<Item = HugeJob> + 'p {
        let round = self.round;
        (0..round.job_count()).filter_map(move |i| round.job(i))
    }

    /// Runs jobs whose indices `cursor` hands out until none are left, and returns how many
    /// pages they reserved. Each CPU taking part calls this with the same cursor, fresh for the
    /// batch.
    pub fn work(&self, machine: &Machine<'_>, cursor: &JobCursor) -> u64 {
        let n = self.job_count();
        let mut got = 0;
        loop {
            let i = cursor.claim();
            if i >= n {
                return got;
            }
            if let Some(job) = self.job(i) {
                got += job.run(machine);
            }
        }
    }

    /// Runs every job on the calling CPU; returns how many pages they reserved.
    pub fn run(&self, machine: &Machine<'_>) -> u64 {
        self.jobs().map(|job| job.run(machine)).sum()
    }
}

/// Hands out job indices to the CPUs sharing a [`Batch`]: each index once.
#[derive(Debug, Default)]
pub struct JobCursor(AtomicUsize);

impl JobCursor {
    /// A cursor at index 0.
    pub fn new() -> Self {
        Self(AtomicUsize::new(0))
    }

    /// The next index nobody has claimed.
    pub fn claim(&self) -> usize {
        // Relaxed: the index only has to be unique. The jobs are read from the batch, which was
        // published to the CPUs before they started, and what a job does is ordered by zone
        // locks and by however the platform waits for the CPUs to finish.
        self.0.fetch_add(1, Ordering::Relaxed)
    }
}

/// Reserve up to `count` pages of `size` on `node`: one independent piece of a [`Batch`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct HugeJob {
    /// The node whose pool grows; the job touches only its zones.
    pub node: NodeId,
    /// The page size.
    pub size: HugeSize,
    /// Pages to reserve, at least 1.
    pub count: u64,
}

impl HugeJob {
    /// Reserves the pages ([`Machine::reserve_huge`], taking each of the node's zone locks
    /// once) and returns how many it got: fewer than `count` only when the node ran out.
    pub fn run(&self, machine: &Machine<'_>) -> u64 {
        machine.reserve_huge(self.node, self.size, self.count)
    }
}

/// Linux's boot lines about the pools: shortfalls, then one `registered` line per size.
///
/// [`fmt::Display`] writes every line followed by `\n`; [`Report::lines`] yields them one by
/// one (for a logger that adds its own line ends). Nothing here allocates.
///
/// Lines come in Linux's order: the shortfalls of 1 GiB pages (Linux reserves them while
/// parsing the command line), those of 2 MiB pages, then `registered` for each size, both of
/// which numaframe always supports (Linux registers 1 GiB pages when the CPU has them, and
/// prints `pre-allocated 0 pages` for a size without a request). Linux registers sizes in the
/// order the command line first names them with `hugepagesz=` or `default_hugepagesz=`, then
/// 1 GiB, then 2 MiB; a [`HugepageConfig`] does not record that order, so sizes with a request
/// come first here (1 GiB before 2 MiB when both have one), then the others. That differs from
/// Linux only for a line that names 2 MiB before 1 GiB and asks for both, and for a bare
/// `hugepages=N`, which Linux lists after 1 GiB.
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
        let has = |size| self.config.request(size).is_some();
        if has(HugeSize::Size2M) && !has(HugeSize::Size1G) {
            [HugeSize::Size2M, HugeSize::Size1G]
        } else {
            [HugeSize::Size1G, HugeSize::Size2M]
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
        self.machine.huge_counts(node, size).0
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

    use super::cmdline::parse;
    use super::*;
    use crate::addr::{Pfn, PhysRange};
    use crate::machine::MemoryRange;
    use crate::test_util::{SparseMem, Spec};
    use crate::topology::NodeInfo;
    use HugeSize::{Size1G, Size2M};

    fn n(i: usize) -> NodeId {
        NodeId::new(i)
    }

    /// Nodes of the given sizes in frames, back to back from 0; a size of 0 is memoryless.
    fn spec(frames: &[u64]) -> Spec {
        let k = frames.len();
        let distances = (0..k * k)
            .map(|i| if i / k == i % k { 10 } else { 20 })
            .collect();
        let infos = frames
            .iter()
            .map(|&f| NodeInfo {
                has_cpus: true,
                has_memory: f > 0,
                ..NodeInfo::default()
            })
            .collect();
        let mut base = 0;
        let mut ranges = Vec::new();
        for (i, &f) in frames.iter().enumerate() {
            if f > 0 {
                ranges.push(MemoryRange {
                    node: n(i),
                    range: PhysRange::new(Pfn::new(base), Pfn::new(base + f)).unwrap(),
                });
                base += f;
            }
        }
        Spec {
            distances,
            infos,
            ranges,
        }
    }

    fn counts(m: &Machine<'_>, size: HugeSize) -> Vec<u64> {
        m.topology()
            .node_ids()
            .map(|id| m.huge_counts(id, size).0)
            .collect()
    }

    /// xorshift64.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            let mut x = self.0;
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            self.0 = x;
            x
        }
    }

    /// Runs the plan with every batch's jobs in a shuffled order; returns how many batches
    /// there were.
    fn run_shuffled(m: &Machine<'_>, cfg: &HugepageConfig, chunk: u64, seed: u64) -> usize {
        let mut rng = Rng(seed | 1);
        let mut plan = ReservationPlan::with_chunk_pages(cfg, m, chunk).unwrap();
        let mut batches = 0;
        while let Some(batch) = plan.next_batch(m) {
            batches += 1;
            let mut jobs: Vec<HugeJob> = batch.jobs().collect();
            for i in (1..jobs.len()).rev() {
                jobs.swap(i, (rng.next() % (i as u64 + 1)) as usize);
            }
            for job in jobs {
                assert_eq!(job.size, batch.size());
                assert!(job.count >= 1 && job.count <= chunk);
                job.run(m);
            }
            m.check_invariants().unwrap();
        }
        batches
    }

    /// Linux's sequential node-balanced allocation, page by page: round-robin from the first
    /// node with memory, skipping nodes that fail.
    fn linux_balanced(m: &Machine<'_>, size: HugeSize, pages: u64) {
        let nodes: Vec<NodeId> = m.memory_nodes().iter().collect();
        let mut next = 0;
        let mut done = 0;
        'pages: while done < pages {
            for k in 0..nodes.len() {
                let at = (next + k) % nodes.len();
                if m.reserve_huge(nodes[at], size, 1) == 1 {
                    next = at + 1;
                    done += 1;
                    continue 'pages;
                }
            }
            break;
        }
    }

    #[test]
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
                std::format!("HugeTLB: registered 2.00 MiB page size, pre-allocated {total} pages"),
                "HugeTLB: registered 1.00 GiB page size, pre-allocated 0 pages".to_string(),
            ]
        );
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
    fn jobs_are_chunked_and_interleave_nodes() {
        let spec = spec(&[4096, 4096]);
        let mem = SparseMem::default();
        let m = spec.boot(&mem);
        let cfg = parse("hugepages=0:5,1:2").unwrap();
        let mut plan = ReservationPlan::with_chunk_pages(&cfg, &m, 2).unwrap();
        let batch = plan.next_batch(&m).unwrap();
        assert_eq!(batch.size(), Size2M);
        assert_eq!(batch.job_count(), 6);
        let jobs: Vec<(usize, u64)> = (0..batch.job_count() + 3)
            .map(|i| batch.job(i).map_or((9, 0), |j| (j.node.index(), j.count)))
            .collect();
        assert_eq!(
            jobs,
            [
                (0, 2),
                (1, 2),
                (0, 2),
                (9, 0),
                (0, 1),
                (9, 0),
                (9, 0),
                (9, 0),
                (9, 0)
            ]
        );
        let cursor = JobCursor::new();
        assert_eq!(batch.work(&m, &cursor), 7);
        assert!(cursor.claim() > batch.job_count());
        assert!(plan.next_batch(&m).is_none());
        assert!(plan.next_batch(&m).is_none());
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
