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
//! assert_eq!(machine.huge_counts(NodeId::new(0), HugeSize::Size2M).total, 3);
//! assert_eq!(machine.huge_counts(NodeId::new(1), HugeSize::Size2M).total, 2);
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
//! on the config and the machine, with one exception, found by a review and not fixed: on a
//! node asked for more than it holds, two jobs that both need the zone's metadata pool to grow
//! can both grow it (one's growth is on its way, outside the zone lock, when the other looks),
//! and the pageblock the second growth takes leaves the node a page short of what one thread
//! reserves (one 2 MiB page in the runs seen). Making the second job wait for the first growth
//! let a loom model of two growths spin without end, so it is left as it is. Which frames a
//! node's pool holds may differ from run to run.
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
//! nothing else grows or shrinks them until the plan is done. A plan run on pools that already
//! hold pages reserves the node form's counts on top of them, but a node-balanced request
//! counts the pages a node holds already toward that node's share, so it may reserve fewer
//! pages than it asks for, and the report counts the pages that were there before.
//!
//! [`Machine::reserve_huge`]: crate::machine::Machine::reserve_huge
//! [`Machine::alloc_huge`]: crate::machine::Machine::alloc_huge
//! [`Machine::free_huge`]: crate::machine::Machine::free_huge
//! [`Machine::huge_counts`]: crate::machine::Machine::huge_counts
//! [`Machine::boot`]: crate::machine::Machine::boot
//! [`HugepageConfig`]: cmdline::HugepageConfig
#![deny(unsafe_code)]

mod batch;
pub mod cmdline;
mod jobs;
mod plan;
mod report;
#[cfg(test)]
mod test_support;

pub use self::batch::{Batch, JobCursor};
pub use self::jobs::HugeJob;
pub use self::plan::{DEFAULT_CHUNK_PAGES, ReservationPlan};
pub use self::report::{Report, ReportLine, ReportLines};
use crate::addr::HugeSize;

/// The order in which sizes are reserved: gigantic pages first.
const RESERVE_ORDER: [HugeSize; 2] = [HugeSize::Size1G, HugeSize::Size2M];
