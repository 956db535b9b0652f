//! Side-by-side benchmarks: numaframe against the frame allocators its users would pick instead,
//! the per-CPU cache throughput with 1, 2 and 4 threads, the zonelist hint on `fake-64`, and
//! experiments that report more than time (fragmentation after churn, `hot_add` latency).
//!
//! The peers ([`peers`]) are [`buddy_system_allocator::FrameAllocator`],
//! [`bitmap_allocator::BitAlloc1M`] (the smallest of its sizes — 16, 256, 4K, 64K, 1M, 16M,
//! 256M bits — that covers the 262 144 frames of 1 GiB), [`free_list::FreeList`] and a floor:
//! a plain `Vec<u64>` stack of free frame numbers. All of them, and numaframe through small
//! adapters ([`numa`]), implement [`Frames`], so every scenario is written once.
//!
//! The timed scenarios are built by [`visit`] ([`scenarios`], from the operations in [`ops`]),
//! which hands each [`Group`] of [`Cell`]s (one allocator in one scenario, a closure that runs
//! `iters` iterations and returns the time they took) to a [`Visitor`]. Two visitors exist:
//! [`run`] ([`runner`], the `numaframe bench` command: it calibrates every cell, takes samples
//! round-robin across the cells of a group so that load on the machine hits them alike, and
//! reports medians) and the criterion suite `benches/peers.rs`. So the CLI and criterion run the
//! same code. [`report`] holds what a run measured and prints it.
//!
//! Conventions:
//! - numaframe runs on simulated memory placed at 4 GiB (the `Normal` zone, where nearly all
//!   memory of a real machine lives; `pair 1GiB` also shows the same node at address 0, all
//!   `Dma32`, as `numaframe-below-4GiB`), with the min watermark at 0 (`min_free_kbytes = 0`: an
//!   allocation past the low watermark takes the walk's min pass) and no
//!   `lowmem_reserve_ratio`, so that "fill everything" means every managed frame, as for the
//!   peers. Its node is 1 GiB plus room
//!   for its own metadata (0.3 %), so that the aligned 1 GiB block is whole for order 18.
//! - The peers number their frames from 0; numaframe's are physical frame numbers.
//! - `numaframe` is the per-CPU path (`alloc_cpu` / `free_cpu`, caches on);
//!   `numaframe-nocache` is the same calls with [`PcpConfig::OFF`](numaframe::PcpConfig::OFF)
//!   (straight to the zone).
//! - Single-threaded, the peers run bare (`&mut`, no lock): numaframe pays for its locks and
//!   they do not. With threads, each peer sits behind one `spin::Mutex`, as its users run it.
//! - Time is read around the timed part only; untimed setup (shuffling, refilling) happens
//!   between reads.
//! - Threads: the wall time of all threads is what counts, so a thread that the OS runs at
//!   half speed (another process on its core) halves the measured scaling of every allocator.
//!   The `floor-per-thread` control (nothing shared) shows what the machine gave; [`Scaling`]
//!   also reports each allocator's scaling over the rounds in which the control scaled.
#![deny(unsafe_code)]

use std::io::{self, Write};

pub mod churn;
pub mod experiments;
pub mod guests;
pub mod handle;
pub mod held;
pub mod hotadd;
pub mod numa;
pub mod offline;
pub mod ops;
pub mod oracle;
pub mod peers;
pub mod report;
pub mod reporting;
pub mod runner;
pub mod scenarios;
pub mod teardown;

pub use handle::NumaHandle;
pub use numa::{NumaCpu, NumaNode, NumaPolicy, OneNode, set_caches};
pub use ops::{Rng, Sample};
pub use peers::{Bitmap, Buddy, Floor, Frames, FreeListPeer, Locked, Padded};
pub use report::{CONTROL_MIN, Measurement, Report, Scaling, Skipped, Target};
pub use runner::{Plan, run};
pub use scenarios::{Cell, Group, Sizes, Visitor, visit};

/// Frames in 1 GiB of 4 KiB pages: the size every peer manages.
pub const FRAMES_1G: u64 = 1 << 18;
/// Frames in 64 GiB: numaframe alone (the peers' structures are per frame or O(n²)).
pub const FRAMES_64G: u64 = 1 << 24;
/// The size of a bulk.
pub const BULK: usize = 512;
/// Pages in the weighted-interleave scenario.
pub const INTERLEAVE_PAGES: usize = 1 << 20;
/// Where numaframe's benchmark node starts: 4 GiB, the first frame of the `Normal` zone.
pub const NODE_BASE: u64 = 4 << 30;

/// Allocator names, as the results report them.
pub mod name {
    /// numaframe through the per-CPU caches (`alloc_cpu`/`free_cpu`), or its bulk API.
    pub const NUMAFRAME: &str = "numaframe";
    /// numaframe through a claimed CPU handle (`claim_cpu`, then `alloc`/`free`).
    pub const NUMAFRAME_HANDLE: &str = "numaframe-handle";
    /// The handle freeing with `free_unchecked`.
    pub const NUMAFRAME_UNCHECKED: &str = "numaframe-handle-unchecked";
    /// numaframe with the per-CPU caches off (`set_pcp(PcpConfig::OFF)`).
    pub const NUMAFRAME_NOCACHE: &str = "numaframe-nocache";
    /// numaframe through the per-CPU caches, its node at physical address 0 (all `Dma32`, as
    /// `Sim` lays out a small machine) instead of 4 GiB.
    pub const NUMAFRAME_DMA32: &str = "numaframe-below-4GiB";
    /// numaframe making one `TaskPolicy::alloc` call per page.
    pub const NUMAFRAME_SINGLES: &str = "numaframe-singles";
    /// `buddy_system_allocator::FrameAllocator`.
    pub const BUDDY: &str = "buddy_system_allocator";
    /// `bitmap_allocator::BitAlloc1M`.
    pub const BITMAP: &str = "bitmap-allocator";
    /// `free_list::FreeList`.
    pub const FREE_LIST: &str = "free-list";
    /// A `Vec<u64>` stack of free frame numbers.
    pub const FLOOR: &str = "floor";
    /// Threads only, the control: each thread its own unlocked floor, nothing shared.
    pub const FLOOR_PER_THREAD: &str = "floor-per-thread";
    /// numaframe through the node API (`Machine::alloc`/`free`), no per-CPU cache.
    pub const NUMAFRAME_NODE: &str = "numaframe-node";
    /// The node API with `AllocFlags::ZERO`, frames given back with `Machine::free_clean`
    /// (they stay clean, so nothing is ever cleared).
    pub const NUMAFRAME_NODE_ZERO: &str = "numaframe-node-zero";
    /// The node API with `AllocFlags::ZERO`, frames given back dirty (`Machine::free`), so
    /// every allocation clears its frame inline.
    pub const NUMAFRAME_NODE_ZERO_DIRTY: &str = "numaframe-node-zero-inline";
    /// The node API freeing with `Machine::free_clean` (the dirty state's control).
    pub const NUMAFRAME_NODE_CLEAN: &str = "numaframe-node-clean-free";
    /// The occupancy-aware oracle of [`crate::bench::oracle`].
    pub const ORACLE: &str = "oracle";
}

/// Scenario names, in the order they run. Every one of them is reported by a full run and by a
/// `--quick` run.
pub mod scenario {
    /// Hot order-0 alloc+free pair over 1 GiB.
    pub const PAIR_1G: &str = "pair 1GiB";
    /// Hot order-0 alloc+free pair over 64 GiB (numaframe only).
    pub const PAIR_64G: &str = "pair 64GiB";
    /// Fill 1 GiB with single frames, free them in random order.
    pub const FILL_1G: &str = "fill+random-free 1GiB";
    /// The same over 64 GiB (numaframe only).
    pub const FILL_64G: &str = "fill+random-free 64GiB";
    /// The frees of [`FILL_1G`] alone, after an untimed fill.
    pub const RANDOM_FREE_1G: &str = "random free 1GiB";
    /// 512 frames in one bulk (numaframe) or 512 single allocations (peers).
    pub const BULK_ALLOC: &str = "bulk-512 alloc";
    /// Freeing those 512 frames: one bulk free or 512 single frees.
    pub const BULK_FREE: &str = "bulk-512 free";
    /// Order-0 alloc+free pairs on one thread (peers behind `spin::Mutex`).
    pub const THREADS_1: &str = "pair 1 thread";
    /// The same on 2 threads at once, aggregate ns per pair.
    pub const THREADS_2: &str = "pair 2 threads";
    /// A weighted-interleave bulk of 1M pages across 4 nodes against 1M single-page calls.
    pub const INTERLEAVE: &str = "weighted-interleave 1M pages";
    /// Order-9 (2 MiB) alloc+free pair over 1 GiB.
    pub const ORDER9_1G: &str = "order-9 pair 1GiB";
    /// Order-18 (1 GiB) alloc+free pair over 1 GiB.
    pub const ORDER18_1G: &str = "order-18 pair 1GiB";
    /// Order-9 alloc+free pair over 64 GiB (numaframe only).
    pub const ORDER9_64G: &str = "order-9 pair 64GiB";
    /// Order-18 alloc+free pair over 64 GiB (numaframe only).
    pub const ORDER18_64G: &str = "order-18 pair 64GiB";
    /// Booting `1tb-2node`, without mapping its simulated memory.
    pub const BOOT_1T: &str = "boot 1TiB";
    /// Booting `12tb-2node`, without mapping its simulated memory.
    pub const BOOT_12T: &str = "boot 12TiB";
    /// `fake-64`: order-0 alloc+free from node 0 while node 0 has memory.
    pub const HINT_LOCAL: &str = "fake-64 local hit";
    /// `fake-64`: the same with the first 63 nodes of node 0's list exhausted (the hint).
    pub const HINT_SKIP: &str = "fake-64 63 nodes exhausted";
    /// The same walk without the hint: a `Bind` policy over all 64 nodes (a filtered walk
    /// never uses the hint), so it scans the 63 exhausted nodes every time.
    pub const HINT_NONE: &str = "fake-64 63 exhausted, full walk";
    /// Context: a THISNODE alloc+free on the 64th node itself.
    pub const HINT_THISNODE: &str = "fake-64 THISNODE on 64th node";
    /// Order-0 alloc+free pairs on 4 threads at once on this 2-core machine (oversubscribed:
    /// two threads per core), aggregate ns per pair, next to the 1- and 2-thread runs.
    pub const THREADS_4: &str = "pair 4 threads (oversubscribed: 2 cores)";
    /// Node-API (`Machine::alloc`/`free`) order-0 pair on a node of exactly 1 GiB; the peers
    /// manage exactly 1 GiB too. The first pair splits the one order-18 block; the freed
    /// pageblock then stays split as its class's spare, so later pairs do not touch it.
    pub const NODE_ORDER0: &str = "node API order-0 pair, exactly 1GiB";
    /// The same at order 9.
    pub const NODE_ORDER9: &str = "node API order-9 pair, exactly 1GiB";
    /// The same at order 18: the whole node.
    pub const NODE_ORDER18: &str = "node API order-18 pair, exactly 1GiB";
    /// Node-API order-0 pair on a 1 GiB node booted zeroed: plain, with `ZERO` from clean
    /// memory, and with `ZERO` on a frame freed dirty (inline clearing).
    pub const ZERO_CLEAN: &str = "node API order-0 pair, ZERO from clean memory";
    /// LLFree's "rand" pattern on full memory: all of 1 GiB allocated in 4 KiB frames, then a
    /// free of a random held frame followed by an allocation, over and over; ns per
    /// free+allocation. The name is the fast-path issue's ("LLFree's repeat: free then allocate again
    /// at random positions"); LLFree's own `rand` holds half the memory, and its `repeat`
    /// allocates and frees one frame over and over with half the memory held, as the hot-pair
    /// rows do with none held.
    pub const REPEAT: &str = "repeat 1GiB: random free + alloc, memory full";
    /// LLFree's fragmentation recipe ([`crate::bench::churn`]) over one node of 16 GiB
    /// (1 GiB with `--quick`); `ns_per_op` is per allocation or free. JSON fields:
    /// `frames`; `checkpoints`: `[{"round","hba9","hba18"}]` at rounds 0, 1, 10, 50 and 100
    /// (`null` when no frame is free); `order9`: `{"found","free_blocks"}` after round 100,
    /// or `null` where the allocator cannot allocate aligned 2 MiB blocks.
    pub const CHURN: &str = "churn: HBA_9/HBA_18 after random 4KiB churn";
    /// Host and guests ([`crate::bench::guests`]) over one node of 16 GiB (8 GiB with
    /// `--quick`); `ns_per_op` is per allocation or free. JSON fields: `frames`, `days`;
    /// `checkpoints`: `[{"day","hba18","hba9","free"}]`; `share_1g`, `share_2m`,
    /// `share_1g_possible` of the memory of guests created after day 0; `guests`, `failed`.
    pub const GUESTS: &str =
        "host and guests: HBA_18 and 1GiB-backed guest share after days of churn";
    /// `Machine::hot_add` from request to return while 2 threads allocate and free through
    /// the per-CPU API ([`crate::bench::hotadd`]); `ns_per_op` is the median wait. JSON
    /// fields: `calls`, `timeouts` (calls that had not returned after `timeout_ns`, when the
    /// load stepped aside), `timeout_ns`, `median_ns`, `worst_ns`, `load_pairs_per_s`.
    pub const HOTADD_LOAD: &str = "hot_add latency, 2 threads allocating";
    /// The control: the same calls on an idle machine.
    pub const HOTADD_IDLE: &str = "hot_add latency, idle machine";
    /// Teardown of a guest and a zeroed reallocation of the same memory
    /// ([`crate::bench::teardown`]), 16 GiB (1 GiB with `--quick`); `ns_per_op` is the
    /// background scrub's time per frame. JSON fields: `bytes`; `inline`, `background`,
    /// `floor`: `{"teardown_ns","scrub_ns","realloc_ns"}`; `memset_ns`, `scrub_vs_memset`,
    /// `inline_vs_memset`.
    pub const TEARDOWN: &str = "guest teardown + zeroed reallocation";
    /// Free-page reporting speed ([`crate::bench::reporting`]) over a 16 GiB node (1 GiB with
    /// `--quick`) half free after 2 MiB churn; `ns_per_op` is ns per reported GiB with a
    /// no-op callback. JSON fields: `noop`, `madvise_untouched`, `madvise_resident` (a 4 GiB
    /// node whose memory the guests wrote; 1 GiB with `--quick`), each
    /// `{"node_bytes","reported_bytes","blocks","ns","gib_per_s","vs_hyperalloc"}`.
    pub const REPORT_SPEED: &str = "free-page reporting: GiB/s of free memory reported";
    /// The hot pair and a 512-frame bulk with reporting off and on (a reporter thread every
    /// 10 ms); `ns_per_op` is the pair's ns with reporting on. JSON fields: `pair`, `bulk`:
    /// `{"off_ns","on_ns","ratio"}`; `reports`.
    pub const REPORT_HOT: &str = "hot pair and bulk, reporting off vs on";
    /// Memory offlining ([`crate::bench::offline`]) of a 16 GiB range (1 GiB with `--quick`)
    /// sharing its zone with a 1 GiB boot range; `ns_per_op` is the offline of the free range
    /// after use. JSON fields: `range_bytes`; `fresh`, `after_use`, `busy` (1% of the frames
    /// in use: refused), `re_add` (`hot_add` again): `{"ns","gib_per_s"}`; `busy_pageblocks`.
    pub const OFFLINE: &str = "memory offline: a free range, 1% busy, and re-add";

    /// Every scenario, in run order.
    pub const ALL: &[&str] = &[
        PAIR_1G,
        PAIR_64G,
        FILL_1G,
        FILL_64G,
        RANDOM_FREE_1G,
        BULK_ALLOC,
        BULK_FREE,
        THREADS_1,
        THREADS_2,
        THREADS_4,
        INTERLEAVE,
        ORDER9_1G,
        ORDER18_1G,
        ORDER9_64G,
        ORDER18_64G,
        BOOT_1T,
        BOOT_12T,
        HINT_LOCAL,
        HINT_SKIP,
        HINT_NONE,
        HINT_THISNODE,
        NODE_ORDER0,
        NODE_ORDER9,
        NODE_ORDER18,
        ZERO_CLEAN,
        REPEAT,
        HOTADD_LOAD,
        HOTADD_IDLE,
        CHURN,
        GUESTS,
        TEARDOWN,
        REPORT_SPEED,
        REPORT_HOT,
        OFFLINE,
    ];
}

/// What one scenario measures, one line per scenario for the human output.
pub fn describe(scenario: &str) -> &'static str {
    use scenario::*;
    match scenario {
        PAIR_1G => {
            "hot order-0 alloc+free pair on a fresh 1 GiB allocator; ns per pair (peers bare)"
        }
        PAIR_64G => "hot order-0 alloc+free pair on a fresh 64 GiB numaframe; ns per pair",
        FILL_1G => {
            "allocate every frame of 1 GiB one by one, free them in random order; ns per alloc or free"
        }
        FILL_64G => "the same over 64 GiB, numaframe only; ns per alloc or free",
        RANDOM_FREE_1G => {
            "the random frees of that alone, after an untimed fill of 1 GiB; ns per free"
        }
        BULK_ALLOC => {
            "512 order-0 frames: numaframe one Machine::alloc_bulk, peers 512 single allocations; ns per frame"
        }
        BULK_FREE => {
            "freeing them: numaframe one Machine::free_bulk, peers 512 single frees; ns per frame"
        }
        THREADS_1 => {
            "order-0 alloc+free pairs, 1 thread; peers behind spin::Mutex; numaframe alloc_cpu/free_cpu; ns per pair"
        }
        THREADS_2 => {
            "the same on 2 threads at once (numaframe: one CpuId each); wall time / all pairs of both threads"
        }
        INTERLEAVE => {
            "cxl-2socket, weights 3,3,1,1: one TaskPolicy::alloc_bulk of 2^20 pages vs 2^20 TaskPolicy::alloc; ns per page"
        }
        ORDER9_1G => "order-9 (2 MiB) alloc+free pair on a fresh 1 GiB allocator; ns per pair",
        ORDER18_1G => "order-18 (1 GiB) alloc+free pair on a fresh 1 GiB allocator; ns per pair",
        ORDER9_64G => "order-9 alloc+free pair on a fresh 64 GiB numaframe; ns per pair",
        ORDER18_64G => "order-18 alloc+free pair on a fresh 64 GiB numaframe; ns per pair",
        BOOT_1T => {
            "Machine::boot of 1tb-2node (mapping the simulated memory not timed); ns per boot"
        }
        BOOT_12T => {
            "Machine::boot of 12tb-2node (mapping the simulated memory not timed); ns per boot"
        }
        HINT_LOCAL => "fake-64, node API: order-0 alloc+free from node 0 while node 0 has memory",
        HINT_SKIP => {
            "fake-64, node API: the same with the first 63 nodes of node 0's list exhausted"
        }
        HINT_NONE => {
            "the same through a Bind policy over all 64 nodes: a filtered walk ignores the hint and scans 63 nodes"
        }
        HINT_THISNODE => "context: THISNODE alloc+free on the 64th node of node 0's list",
        THREADS_4 => {
            "the same on 4 threads, two per core: oversubscribed on this 2-core machine; wall time / all pairs"
        }
        NODE_ORDER0 => {
            "Machine::alloc/free order-0 pair on a node of exactly 1 GiB (the first pair splits its 1 GiB block; the pageblock then stays split as the class's spare); ns per pair"
        }
        NODE_ORDER9 => "the same at order 9 (2 MiB); ns per pair",
        NODE_ORDER18 => "the same at order 18 (the whole 1 GiB); ns per pair",
        ZERO_CLEAN => {
            "order-0 Machine::alloc + free on 1 GiB booted zeroed: plain with free_clean; AllocFlags::ZERO with free_clean (clean memory, nothing cleared; target within 10% of plain); ZERO with dirty frees (4 KiB cleared per pair); ns per pair"
        }
        REPEAT => {
            "all of 1 GiB held in 4 KiB frames, then free a random held frame and allocate one, repeatedly; ns per free+alloc"
        }
        CHURN => {
            "fill with 4 KiB, free a random 50%, then rounds of freeing a random 10% of held frames and allocating as many; HBA_k = free frames in whole aligned 2^k blocks / free frames, from the bench's record; numaframe-node frees dirty, numaframe-node-clean-free clean (dirty state must not change HBA); ns per alloc or free"
        }
        GUESTS => {
            "guests of 0.5-3 GiB backed with 1 GiB, then 2 MiB, then 4 KiB frames, one torn down a day, their 4 KiB pools churned; the host's 4 KiB allocations (3%) outlive them; ns per alloc or free"
        }
        HOTADD_LOAD => {
            "Machine::hot_add of 64 MiB, request to return, while 2 threads run alloc_cpu/free_cpu windows of 1024 frames; ns = median wait"
        }
        HOTADD_IDLE => "the same calls with no other thread running; ns = median wait",
        TEARDOWN => {
            "a guest backed by 2 MiB blocks writes all its memory and is torn down (dirty frees), then the same memory is allocated with ZERO: inline zeroing, a background scrub on one thread in between, and no zeroing (floor); clearing throughput against one memset of the same memory (target >= 80%); ns = scrub per frame"
        }
        REPORT_SPEED => {
            "2 MiB blocks fill a node, a random half is freed, 10 rounds churn 10%; one Machine::report (order 9, batches of 32) hands over the free half: no-op callback, hosted madvise(MADV_DONTNEED) of untouched memory, and of memory the guests wrote; GiB/s, against HyperAlloc's published 345 GiB/s"
        }
        REPORT_HOT => {
            "alloc_cpu/free_cpu order-0 pair and alloc_bulk/free_bulk of 512 frames on 1 GiB, reporter off vs a thread reporting the node (hosted madvise) every 10 ms, samples alternating; ns per pair or frame, on/off ratio (target <= 1.05)"
        }
        OFFLINE => {
            "a range hot-added next to a 1 GiB boot range (one zone): Machine::offline of it as added, after every frame was used in 4 KiB and freed, and with 1% of its frames in use (refused after isolating, draining, checking), then hot_add of it again; ms per call, GiB/s of the range"
        }
        _ => "",
    }
}

/// `numaframe bench [--json] [--quick]`: runs the scenarios and writes the table (as each
/// scenario completes) or the JSON document.
///
/// # Errors
/// If a machine cannot be built or writing fails.
pub fn run_cli(
    quick: bool,
    json: bool,
    out: &mut dyn Write,
    progress: &mut dyn Write,
) -> io::Result<()> {
    let plan = if quick { Plan::QUICK } else { Plan::FULL };
    if !json {
        writeln!(
            out,
            "numaframe bench{}: numaframe against buddy_system_allocator 0.13, bitmap-allocator 0.4 \
             (BitAlloc1M; BitAlloc16M for the 16 GiB churn), free-list 0.3, a Vec<u64> floor and, \
             for fragmentation, an oracle.\n\
             1 GiB = {FRAMES_1G} frames of 4 KiB; medians over samples taken round-robin; \
             single-threaded peers run bare, threaded ones behind spin::Mutex.\n\
             numaframe = alloc_cpu/free_cpu with per-CPU caches (bulk: alloc_bulk/free_bulk); \
             numaframe-nocache = the same calls with PcpConfig::OFF; \
             numaframe-node = Machine::alloc/free.",
            if quick {
                " --quick (rough numbers)"
            } else {
                ""
            }
        )?;
        out.flush()?;
    }
    let mut print = |r: &Report, s: &str| -> io::Result<()> {
        if !json {
            r.write_scenario(s, out)?;
            out.flush()?;
        }
        Ok(())
    };
    let start = std::time::Instant::now();
    let mut tell = |what: &str| -> io::Result<()> {
        writeln!(
            progress,
            "bench: {:6.1} s: {what}",
            start.elapsed().as_secs_f64()
        )?;
        progress.flush()
    };
    let report = run(plan, &mut print, &mut tell)?;
    if json {
        serde_json::to_writer(&mut *out, &report)?;
        writeln!(out)?;
    } else {
        report.write_summary(out)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_scenario_is_described() {
        for s in scenario::ALL {
            assert!(!describe(s).is_empty(), "{s}");
        }
    }
}
