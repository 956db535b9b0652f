//! Side-by-side benchmarks: numaframe against the frame allocators its users would pick instead
//! (issue 7), the per-CPU cache throughput with 1 and 2 threads (issue 6) and the zonelist hint on
//! `fake-64` (issue 3).
//!
//! The peers are [`buddy_system_allocator::FrameAllocator`], [`bitmap_allocator::BitAlloc1M`]
//! (the smallest of its sizes — 16, 256, 4K, 64K, 1M, 16M, 256M bits — that covers the 262 144
//! frames of 1 GiB), [`free_list::FreeList`] and a floor: a plain `Vec<u64>` stack of free frame
//! numbers. All of them, and numaframe through small adapters, implement [`Frames`], so every
//! scenario is written once.
//!
//! The scenarios are built by [`visit`], which hands each [`Group`] of [`Cell`]s (one allocator
//! in one scenario, a closure that runs `iters` iterations and returns the time they took) to a
//! [`Visitor`]. Two visitors exist: [`run`] (the `numaframe bench` command: it calibrates every
//! cell, takes samples round-robin across the cells of a group so that load on the machine hits
//! them alike, and reports medians) and the criterion suite `benches/peers.rs`. So the CLI and
//! criterion run the same code.
//!
//! Conventions:
//! - numaframe runs on simulated memory placed at 4 GiB (the `Normal` zone, where nearly all
//!   memory of a real machine lives; `pair 1GiB` also shows the same node at address 0, all
//!   `Dma32`, as `numaframe-below-4GiB`), with watermarks off (`min_free_kbytes = 0`) so that
//!   "fill everything" means every managed frame, as for the peers. Its node is 1 GiB plus room
//!   for its own metadata (0.3 %), so that the aligned 1 GiB block is whole for order 18.
//! - The peers number their frames from 0; numaframe's are physical frame numbers.
//! - `numaframe` is the per-CPU path (`alloc_cpu` / `free_cpu`, caches on);
//!   `numaframe-nocache` is the same calls with [`PcpConfig::OFF`] (straight to the zone).
//! - Single-threaded, the peers run bare (`&mut`, no lock): numaframe pays for its locks and
//!   they do not. With threads, each peer sits behind one `spin::Mutex`, as its users run it.
//! - Time is read around the timed part only; untimed setup (shuffling, refilling) happens
//!   between reads.
//! - Threads: the wall time of both threads is what counts, so a thread that the OS runs at
//!   half speed (another process on its core) halves the measured scaling of every allocator.
//!   The `floor-per-thread` control (nothing shared) shows what the machine gave; [`Scaling`]
//!   also reports each allocator's scaling over the rounds in which the control scaled.
#![deny(unsafe_code)]

use std::hint::black_box;
use std::io::{self, Write};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bitmap_allocator::{BitAlloc, BitAlloc1M};
use free_list::{FreeList, PageLayout, PageRange};
use numaframe::interleave::Weights;
use numaframe::policy::{Policy, TaskPolicy};
use numaframe::{
    AllocFlags, BootOptions, CpuId, Machine, MemoryRange, NodeId, NodeMask, Order, PAGE_SIZE,
    PcpConfig, Pfn, PhysAddr, PhysRange,
};
use serde::Serialize;

use crate::presets::preset;
use crate::sim::{Sim, SimMemory};
use crate::spec::{MachineSpec, NodeSpec};

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

    /// Every scenario, in run order.
    pub const ALL: &[&str] = &[
        PAIR_1G,
        PAIR_64G,
        FILL_1G,
        FILL_64G,
        BULK_ALLOC,
        BULK_FREE,
        THREADS_1,
        THREADS_2,
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
        _ => "",
    }
}

// ---------------------------------------------------------------------------------------------
// The allocators.

/// A frame allocator as the scenarios drive it: frame numbers in, frame numbers out.
pub trait Frames {
    /// One block of `2^order` frames; `None` when none is left.
    fn alloc(&mut self, order: u8) -> Option<u64>;
    /// Gives back a block from [`Frames::alloc`] with the same order.
    fn free(&mut self, frame: u64, order: u8);
    /// Fills `out` with order-0 frames; returns how many it placed. The default loops single
    /// allocations, as a peer's user would.
    fn alloc_bulk(&mut self, out: &mut [Pfn]) -> usize {
        for (i, slot) in out.iter_mut().enumerate() {
            match self.alloc(0) {
                Some(f) => *slot = Pfn::new(f),
                None => return i,
            }
        }
        out.len()
    }
    /// Frees order-0 frames; the default loops single frees.
    fn free_bulk(&mut self, frames: &[Pfn]) {
        for f in frames {
            self.free(f.get(), 0);
        }
    }
}

/// The floor: a `Vec<u64>` stack of free frame numbers, order 0 only.
#[derive(Debug)]
pub struct Floor(Vec<u64>);

impl Floor {
    /// Frames `0..frames`, handed out lowest first.
    pub fn new(frames: u64) -> Floor {
        Floor((0..frames).rev().collect())
    }
}

impl Frames for Floor {
    fn alloc(&mut self, order: u8) -> Option<u64> {
        if order != 0 {
            return None;
        }
        self.0.pop()
    }
    fn free(&mut self, frame: u64, _order: u8) {
        self.0.push(frame);
    }
}

/// `buddy_system_allocator::FrameAllocator` with orders up to 18.
pub struct Buddy(buddy_system_allocator::FrameAllocator<19>);

impl std::fmt::Debug for Buddy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Buddy").finish_non_exhaustive()
    }
}

impl Buddy {
    /// Frames `0..frames`.
    pub fn new(frames: u64) -> Buddy {
        let mut a = buddy_system_allocator::FrameAllocator::<19>::new();
        a.add_frame(0, frames as usize);
        Buddy(a)
    }
}

impl Frames for Buddy {
    fn alloc(&mut self, order: u8) -> Option<u64> {
        self.0.alloc(1 << order).map(|f| f as u64)
    }
    fn free(&mut self, frame: u64, order: u8) {
        self.0.dealloc(frame as usize, 1 << order);
    }
}

/// `bitmap_allocator::BitAlloc1M`: 2^20 bits, the smallest size that covers 1 GiB of frames.
pub struct Bitmap(Box<BitAlloc1M>);

impl std::fmt::Debug for Bitmap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bitmap").finish_non_exhaustive()
    }
}

impl Bitmap {
    /// Frames `0..frames` (at most 2^20).
    pub fn new(frames: u64) -> Bitmap {
        let mut a = Box::new(BitAlloc1M::DEFAULT);
        a.insert(0..frames as usize);
        Bitmap(a)
    }
}

impl Frames for Bitmap {
    fn alloc(&mut self, order: u8) -> Option<u64> {
        let f = if order == 0 {
            self.0.alloc()
        } else {
            self.0
                .alloc_contiguous(None, 1 << order, usize::from(order))
        };
        f.map(|f| f as u64)
    }
    fn free(&mut self, frame: u64, order: u8) {
        if order == 0 {
            self.0.dealloc(frame as usize);
        } else {
            self.0.dealloc_contiguous(frame as usize, 1 << order);
        }
    }
}

/// `free_list::FreeList` with 16 ranges inline.
#[derive(Debug)]
pub struct FreeListPeer(FreeList<16>);

impl FreeListPeer {
    /// Frames `0..frames`.
    pub fn new(frames: u64) -> FreeListPeer {
        let mut list = FreeList::new();
        let all = PageRange::new(0, (frames * PAGE_SIZE) as usize).expect("a non-empty range");
        give_back(&mut list, all);
        FreeListPeer(list)
    }
}

/// The one unsafe call in this module: `FreeList::deallocate` trusts that the range is free to
/// hand out again.
#[allow(unsafe_code)]
fn give_back(list: &mut FreeList<16>, range: PageRange) {
    // SAFETY: `range` names simulated frame numbers only (no memory is behind them), and it is
    // either the initial range or a range this list handed out and the benchmark no longer uses.
    let r = unsafe { list.deallocate(range) };
    r.expect("free-list refused a range it handed out");
}

impl Frames for FreeListPeer {
    fn alloc(&mut self, order: u8) -> Option<u64> {
        let bytes = (PAGE_SIZE as usize) << order;
        let layout = PageLayout::from_size_align(bytes, bytes).ok()?;
        self.0
            .allocate(layout)
            .ok()
            .map(|r| (r.start() / PAGE_SIZE as usize) as u64)
    }
    fn free(&mut self, frame: u64, order: u8) {
        let range =
            PageRange::from_start_len((frame * PAGE_SIZE) as usize, (PAGE_SIZE as usize) << order)
                .expect("a range this list handed out");
        give_back(&mut self.0, range);
    }
}

/// An allocator alone on its cache lines (128 bytes, two lines for the adjacent-line
/// prefetcher), so that per-thread instances in one array share nothing.
#[derive(Debug)]
#[repr(align(128))]
pub struct Padded<A>(pub A);

impl<A: Frames> Frames for Padded<A> {
    fn alloc(&mut self, order: u8) -> Option<u64> {
        self.0.alloc(order)
    }
    fn free(&mut self, frame: u64, order: u8) {
        self.0.free(frame, order);
    }
}

/// A peer behind a `spin::Mutex`, locked for every call, as its users share it between CPUs.
#[derive(Debug)]
pub struct Locked<'l, A>(pub &'l spin::Mutex<A>);

impl<A: Frames> Frames for Locked<'_, A> {
    fn alloc(&mut self, order: u8) -> Option<u64> {
        self.0.lock().alloc(order)
    }
    fn free(&mut self, frame: u64, order: u8) {
        self.0.lock().free(frame, order);
    }
}

/// numaframe through one CPU: `alloc_cpu` / `free_cpu` (the per-CPU caches for order 0, when
/// they are on), and the node bulk API of the CPU's node for bulks.
#[derive(Debug)]
pub struct NumaCpu<'m, 'a> {
    machine: &'m Machine<'a>,
    cpu: CpuId,
    node: NodeId,
}

impl<'m, 'a> NumaCpu<'m, 'a> {
    /// CPU `index` of `machine`.
    ///
    /// # Panics
    /// If the machine has no such CPU.
    pub fn new(machine: &'m Machine<'a>, index: usize) -> Self {
        let cpu = machine.cpu(index).expect("a CPU registered at boot");
        let node = machine.cpu_node(cpu).expect("a CPU has a node");
        NumaCpu { machine, cpu, node }
    }
}

impl Frames for NumaCpu<'_, '_> {
    fn alloc(&mut self, order: u8) -> Option<u64> {
        self.machine
            .alloc_cpu(self.cpu, Order::new(order), AllocFlags::empty())
            .map(Pfn::get)
    }
    fn free(&mut self, frame: u64, order: u8) {
        self.machine
            .free_cpu(self.cpu, Pfn::new(frame), Order::new(order))
            .expect("numaframe refused a frame it handed out");
    }
    fn alloc_bulk(&mut self, out: &mut [Pfn]) -> usize {
        self.machine.alloc_bulk(self.node, AllocFlags::empty(), out)
    }
    fn free_bulk(&mut self, frames: &[Pfn]) {
        self.machine
            .free_bulk(frames)
            .expect("numaframe refused frames it handed out");
    }
}

/// numaframe through the node API (`alloc` / `free`, no CPU cache): the zonelist walk.
#[derive(Debug)]
pub struct NumaNode<'m, 'a> {
    machine: &'m Machine<'a>,
    node: NodeId,
    flags: AllocFlags,
}

impl Frames for NumaNode<'_, '_> {
    fn alloc(&mut self, order: u8) -> Option<u64> {
        self.machine
            .alloc(self.node, Order::new(order), self.flags)
            .map(Pfn::get)
    }
    fn free(&mut self, frame: u64, order: u8) {
        self.machine
            .free(Pfn::new(frame), Order::new(order))
            .expect("numaframe refused a frame it handed out");
    }
}

/// numaframe through a task's memory policy (`TaskPolicy::alloc`, then `Machine::free`).
#[derive(Debug)]
pub struct NumaPolicy<'m, 'a> {
    machine: &'m Machine<'a>,
    policy: TaskPolicy,
    cpu_node: NodeId,
}

impl Frames for NumaPolicy<'_, '_> {
    fn alloc(&mut self, order: u8) -> Option<u64> {
        self.policy
            .alloc(
                self.machine,
                self.cpu_node,
                Order::new(order),
                AllocFlags::empty(),
            )
            .map(Pfn::get)
    }
    fn free(&mut self, frame: u64, order: u8) {
        self.machine
            .free(Pfn::new(frame), Order::new(order))
            .expect("numaframe refused a frame it handed out");
    }
}

/// A one-node simulated machine for numaframe: `frames` usable frames (plus room for the
/// metadata) at [`NODE_BASE`], with 2 CPUs.
#[derive(Debug)]
pub struct OneNode {
    spec: MachineSpec,
    memory: SimMemory,
    ranges: Vec<MemoryRange>,
}

impl OneNode {
    /// Maps the simulated memory (untouched until the allocator writes its metadata).
    ///
    /// # Errors
    /// If the kernel refuses the mapping.
    pub fn new(frames: u64) -> io::Result<OneNode> {
        OneNode::at(frames, NODE_BASE)
    }

    /// The same node starting at physical address `base` (a multiple of 1 GiB); below 4 GiB it
    /// is in the `Dma32` zone.
    ///
    /// # Errors
    /// If the kernel refuses the mapping.
    pub fn at(frames: u64, base: u64) -> io::Result<OneNode> {
        let bytes = frames * PAGE_SIZE;
        // Metadata is 12 bytes per frame (0.3 %); 1/256 (0.4 %) covers it and the tables.
        let total = bytes + (bytes / 256).max(8 << 20);
        let node = NodeSpec {
            cpus: vec![0, 1],
            memory_bytes: total,
            socket: Some(0),
            ..NodeSpec::default()
        };
        let spec = MachineSpec::new(format!("bench-{frames}"), vec![node], vec![10], None)
            .map_err(|e| io::Error::other(e.to_string()))?;
        let range = PhysRange::from_bytes(PhysAddr::new(base), total)
            .ok_or_else(|| io::Error::other("bench node range"))?;
        Ok(OneNode {
            memory: SimMemory::new(&[(base, total)])?,
            ranges: vec![MemoryRange {
                node: NodeId::new(0),
                range,
            }],
            spec,
        })
    }

    /// Boots numaframe over it: 2 CPUs on node 0, default per-CPU caches, watermarks off.
    ///
    /// # Errors
    /// The core's boot error, as text.
    pub fn boot(&self) -> io::Result<Machine<'_>> {
        let cpus = [NodeId::new(0); 2];
        Machine::boot(
            self.spec.topology(),
            &self.memory,
            &self.ranges,
            BootOptions {
                cpus: &cpus,
                min_free_kbytes: Some(0),
                ..BootOptions::default()
            },
        )
        .map_err(|e| io::Error::other(format!("boot: {e}")))
    }
}

/// Turns numaframe's per-CPU caches on (Linux's defaults) or off; off also drains them.
pub fn set_caches(machine: &Machine<'_>, on: bool) {
    if on {
        machine.set_pcp(PcpConfig::default());
    } else {
        machine.set_pcp(PcpConfig::OFF);
        machine.drain_all();
    }
}

// ---------------------------------------------------------------------------------------------
// The scenarios, each generic over `Frames`.

/// What one call of a cell measured: the timed part and the operations it contained.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Sample {
    /// Time of the timed part.
    pub time: Duration,
    /// Operations in it (pairs, frames, allocations + frees, boots: see the scenario).
    pub ops: u64,
}

/// `iters` alloc+free pairs of `order`.
pub fn pairs<A: Frames + ?Sized>(a: &mut A, order: u8, iters: u64) -> Sample {
    let start = Instant::now();
    for _ in 0..iters {
        let f = a.alloc(order).expect("a fresh allocator has a free block");
        a.free(black_box(f), order);
    }
    Sample {
        time: start.elapsed(),
        ops: iters,
    }
}

/// SplitMix64: a small, fast, seeded generator for the random free order.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Fisher–Yates.
    pub fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = (self.next_u64() % (i as u64 + 1)) as usize;
            v.swap(i, j);
        }
    }
}

/// `iters` times: allocate order-0 frames until none is left (timed), shuffle them (untimed),
/// free them in that order (timed). `ops` counts allocations and frees.
pub fn fill_random_free<A: Frames + ?Sized>(
    a: &mut A,
    held: &mut Vec<u64>,
    rng: &mut Rng,
    iters: u64,
) -> Sample {
    let mut s = Sample::default();
    for _ in 0..iters {
        held.clear();
        let start = Instant::now();
        while let Some(f) = a.alloc(0) {
            held.push(f);
        }
        s.time += start.elapsed();
        rng.shuffle(held);
        let start = Instant::now();
        for &f in held.iter() {
            a.free(f, 0);
        }
        s.time += start.elapsed();
        s.ops += 2 * held.len() as u64;
    }
    s
}

/// `iters` bulks of `out.len()` frames, timing the allocation (`time_alloc`) or the free;
/// `ops` counts frames.
pub fn bulk<A: Frames + ?Sized>(
    a: &mut A,
    out: &mut [Pfn],
    time_alloc: bool,
    iters: u64,
) -> Sample {
    let mut s = Sample::default();
    for _ in 0..iters {
        let start = Instant::now();
        let got = a.alloc_bulk(out);
        let mid = Instant::now();
        assert_eq!(got, out.len(), "a fresh allocator fills a bulk");
        black_box(&mut *out);
        a.free_bulk(out);
        let end = Instant::now();
        s.time += if time_alloc { mid - start } else { end - mid };
        s.ops += out.len() as u64;
    }
    s
}

/// `iters` order-0 alloc+free pairs on each handle, each on its own thread, all started at
/// once; the time is the wall time from the first start to the last end, `ops` all pairs.
///
/// The threads meet at a spinning barrier, so that all of them are running when the clock
/// starts (a parked thread on an idle virtual CPU can take milliseconds to wake).
pub fn pairs_threads<H: Frames + Send>(handles: &mut [H], iters: u64) -> Sample {
    let arrived = AtomicUsize::new(0);
    let n = handles.len();
    let spans: Vec<(Instant, Instant)> = std::thread::scope(|s| {
        let joins: Vec<_> = handles
            .iter_mut()
            .map(|h| {
                let arrived = &arrived;
                s.spawn(move || {
                    // Relaxed is enough: the counter only decides when to start the clock.
                    arrived.fetch_add(1, Ordering::Relaxed);
                    let mut spins = 0u32;
                    while arrived.load(Ordering::Relaxed) < n {
                        spins += 1;
                        if spins.is_multiple_of(4096) {
                            // Fewer cores than threads: let the others arrive.
                            std::thread::yield_now();
                        }
                        std::hint::spin_loop();
                    }
                    let start = Instant::now();
                    pairs(h, 0, iters);
                    (start, Instant::now())
                })
            })
            .collect();
        joins
            .into_iter()
            .map(|j| j.join().expect("a benchmark thread panicked"))
            .collect()
    });
    let start = spans
        .iter()
        .map(|s| s.0)
        .min()
        .expect("at least one thread");
    let end = spans
        .iter()
        .map(|s| s.1)
        .max()
        .expect("at least one thread");
    Sample {
        time: end - start,
        ops: iters * n as u64,
    }
}

/// `iters` weighted-interleave allocations of `out.len()` pages (one bulk call, or one
/// `TaskPolicy::alloc` per page), freed untimed; `ops` counts pages.
pub fn interleave(
    machine: &Machine<'_>,
    policy: &mut TaskPolicy,
    out: &mut [Pfn],
    use_bulk: bool,
    iters: u64,
) -> Sample {
    let node0 = NodeId::new(0);
    let mut s = Sample::default();
    for _ in 0..iters {
        let start = Instant::now();
        if use_bulk {
            let r = policy.alloc_bulk(machine, node0, AllocFlags::empty(), out);
            assert_eq!(r.placed, out.len(), "the machine has room for the bulk");
        } else {
            for slot in out.iter_mut() {
                *slot = policy
                    .alloc(machine, node0, Order::ZERO, AllocFlags::empty())
                    .expect("the machine has room");
            }
        }
        s.time += start.elapsed();
        s.ops += out.len() as u64;
        machine
            .free_bulk(out)
            .expect("numaframe refused frames it handed out");
    }
    s
}

/// `iters` boots of `spec`, each over freshly mapped simulated memory (mapping not timed).
pub fn boot(spec: &MachineSpec, iters: u64) -> io::Result<Sample> {
    let mut s = Sample::default();
    for _ in 0..iters {
        let sim = Sim::new(spec)?;
        let start = Instant::now();
        let m = sim
            .boot(BootOptions::default())
            .map_err(|e| io::Error::other(format!("boot {}: {e}", spec.name())))?;
        s.time += start.elapsed();
        s.ops += 1;
        black_box(&m);
    }
    Ok(s)
}

// ---------------------------------------------------------------------------------------------
// Cells, groups and the visitor.

/// One allocator in one scenario: `run(iters)` runs `iters` iterations and says what it timed.
pub struct Cell<'a> {
    /// The scenario (one of [`scenario::ALL`]).
    pub scenario: &'static str,
    /// The allocator (one of [`name`]).
    pub allocator: &'static str,
    /// Runs iterations.
    pub run: Box<dyn FnMut(u64) -> Sample + 'a>,
    /// Operations in one iteration (what `run` reports as `ops` per iteration).
    pub ops_per_iter: u64,
    /// One iteration takes seconds (a whole fill of 64 GiB, free-list's O(n²) random free):
    /// `numaframe bench` runs it once, without a warm-up run.
    pub once: bool,
    /// `--quick` and criterion (unless `NUMAFRAME_BENCH_SLOW=1`) leave the cell out.
    pub slow: bool,
}

impl Cell<'_> {
    fn per_iter(mut self, ops: u64) -> Self {
        self.ops_per_iter = ops;
        self
    }
    fn once(mut self, slow: bool) -> Self {
        self.once = true;
        self.slow = slow;
        self
    }
}

impl std::fmt::Debug for Cell<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cell")
            .field("scenario", &self.scenario)
            .field("allocator", &self.allocator)
            .field("ops_per_iter", &self.ops_per_iter)
            .field("once", &self.once)
            .field("slow", &self.slow)
            .finish_non_exhaustive()
    }
}

/// Cells measured together (their samples interleaved), under one title.
#[derive(Debug)]
pub struct Group<'a> {
    /// The group's title (the criterion group name).
    pub title: &'static str,
    /// An iteration is heavy (a whole fill, a boot, 1M pages): take few samples.
    pub heavy: bool,
    /// The cells.
    pub cells: Vec<Cell<'a>>,
}

/// Receives the groups of [`visit`] one by one, while their machines and peers are alive.
pub trait Visitor {
    /// Measures (or registers) the group's cells.
    ///
    /// # Errors
    /// Whatever the visitor's output fails with.
    fn group(&mut self, group: Group<'_>) -> io::Result<()>;
}

/// Sizes [`visit`] uses. Scenario names assume [`Sizes::FULL`]; smaller sizes serve tools that
/// cannot map 64 GiB (valgrind).
#[derive(Clone, Copy, Debug)]
pub struct Sizes {
    /// Frames of the peers' (and the small numaframe) memory.
    pub small: u64,
    /// Frames of numaframe's large memory.
    pub large: u64,
}

impl Sizes {
    /// 1 GiB and 64 GiB, as the issue asks.
    pub const FULL: Sizes = Sizes {
        small: FRAMES_1G,
        large: FRAMES_64G,
    };
}

fn cell<'a>(
    scenario: &'static str,
    allocator: &'static str,
    run: impl FnMut(u64) -> Sample + 'a,
) -> Cell<'a> {
    Cell {
        scenario,
        allocator,
        run: Box::new(run),
        ops_per_iter: 1,
        once: false,
        slow: false,
    }
}

/// Builds every scenario and hands its groups to `v`.
///
/// # Errors
/// If simulated memory cannot be mapped, a machine does not boot, or `v` fails.
pub fn visit(sizes: Sizes, v: &mut dyn Visitor) -> io::Result<()> {
    use scenario::*;
    let n = sizes.small;
    let small = OneNode::new(n)?;
    let m = small.boot()?;
    let large = OneNode::new(sizes.large)?;
    let big = large.boot()?;

    // The peers, fresh for each group so that no group inherits another's fragmentation.
    let peers = || {
        (
            Buddy::new(n),
            Bitmap::new(n),
            FreeListPeer::new(n),
            Floor::new(n),
        )
    };

    // Hot order-0 pair.
    {
        let low = OneNode::at(n, 0)?;
        let lm = low.boot()?;
        let mut d0 = NumaCpu::new(&lm, 0);
        let (mut b, mut bm, mut fl, mut fo) = peers();
        let (mut c0, mut c1) = (NumaCpu::new(&m, 0), NumaCpu::new(&m, 0));
        let (mut g0, mut g1) = (NumaCpu::new(&big, 0), NumaCpu::new(&big, 0));
        let (m, big) = (&m, &big);
        v.group(Group {
            title: "pair",
            heavy: false,
            cells: vec![
                cell(PAIR_1G, name::NUMAFRAME, move |i| {
                    set_caches(m, true);
                    pairs(&mut c0, 0, i)
                }),
                cell(PAIR_1G, name::NUMAFRAME_NOCACHE, move |i| {
                    set_caches(m, false);
                    pairs(&mut c1, 0, i)
                }),
                cell(PAIR_1G, name::NUMAFRAME_DMA32, move |i| {
                    pairs(&mut d0, 0, i)
                }),
                cell(PAIR_1G, name::BUDDY, move |i| pairs(&mut b, 0, i)),
                cell(PAIR_1G, name::BITMAP, move |i| pairs(&mut bm, 0, i)),
                cell(PAIR_1G, name::FREE_LIST, move |i| pairs(&mut fl, 0, i)),
                cell(PAIR_1G, name::FLOOR, move |i| pairs(&mut fo, 0, i)),
                cell(PAIR_64G, name::NUMAFRAME, move |i| {
                    set_caches(big, true);
                    pairs(&mut g0, 0, i)
                }),
                cell(PAIR_64G, name::NUMAFRAME_NOCACHE, move |i| {
                    set_caches(big, false);
                    pairs(&mut g1, 0, i)
                }),
            ],
        })?;
    }

    // Fill everything, free in random order.
    {
        let (mut b, mut bm, mut fl, mut fo) = peers();
        let (mut c0, mut c1) = (NumaCpu::new(&m, 0), NumaCpu::new(&m, 0));
        let (mut g0, mut g1) = (NumaCpu::new(&big, 0), NumaCpu::new(&big, 0));
        let (m, big) = (&m, &big);
        // Watermarks are off, so a fill takes every managed frame: 2 operations each.
        let (ops, big_ops) = (2 * managed(m), 2 * managed(big));
        let cells = vec![
            cell(FILL_1G, name::NUMAFRAME, {
                let mut f = fill(&mut c0, 1);
                move |i| {
                    set_caches(m, true);
                    f(i)
                }
            })
            .per_iter(ops),
            cell(FILL_1G, name::NUMAFRAME_NOCACHE, {
                let mut f = fill(&mut c1, 2);
                move |i| {
                    set_caches(m, false);
                    f(i)
                }
            })
            .per_iter(ops),
            cell(FILL_1G, name::BUDDY, fill(&mut b, 3)).per_iter(2 * n),
            cell(FILL_1G, name::BITMAP, fill(&mut bm, 4)).per_iter(2 * n),
            // free-list scans its whole range list on every free: O(n²) over a random order.
            cell(FILL_1G, name::FREE_LIST, fill(&mut fl, 5))
                .per_iter(2 * n)
                .once(true),
            cell(FILL_1G, name::FLOOR, fill(&mut fo, 6)).per_iter(2 * n),
            cell(FILL_64G, name::NUMAFRAME, {
                let mut f = fill(&mut g0, 7);
                move |i| {
                    set_caches(big, true);
                    f(i)
                }
            })
            .per_iter(big_ops)
            .once(false),
            cell(FILL_64G, name::NUMAFRAME_NOCACHE, {
                let mut f = fill(&mut g1, 8);
                move |i| {
                    set_caches(big, false);
                    f(i)
                }
            })
            .per_iter(big_ops)
            .once(true),
        ];
        v.group(Group {
            title: "fill+random-free",
            heavy: true,
            cells,
        })?;
    }

    // Bulk of 512.
    {
        let (mut b, mut bm, mut fl, mut fo) = peers();
        set_caches(&m, true);
        let mut c = NumaCpu::new(&m, 0);
        let peers: [(&'static str, &mut dyn Frames); 5] = [
            (name::NUMAFRAME, &mut c),
            (name::BUDDY, &mut b),
            (name::BITMAP, &mut bm),
            (name::FREE_LIST, &mut fl),
            (name::FLOOR, &mut fo),
        ];
        // Each allocator serves both cells: the closures take turns through a RefCell.
        let shared: Vec<(&'static str, std::cell::RefCell<&mut dyn Frames>)> = peers
            .into_iter()
            .map(|(n, a)| (n, std::cell::RefCell::new(a)))
            .collect();
        let mut cells = Vec::new();
        for (scenario, time_alloc) in [(BULK_ALLOC, true), (BULK_FREE, false)] {
            for (allocator, a) in &shared {
                let mut out = vec![Pfn::new(0); BULK];
                cells.push(
                    cell(scenario, allocator, move |i| {
                        bulk(&mut **a.borrow_mut(), &mut out, time_alloc, i)
                    })
                    .per_iter(BULK as u64),
                );
            }
        }
        v.group(Group {
            title: "bulk-512",
            heavy: false,
            cells,
        })?;
    }

    // 1 and 2 threads: issue 6's caches on and off, the peers behind spin::Mutex.
    {
        let (b, bm, fl, fo) = peers();
        let (b, bm, fl, fo) = (
            spin::Mutex::new(b),
            spin::Mutex::new(bm),
            spin::Mutex::new(fl),
            spin::Mutex::new(fo),
        );
        let m = &m;
        // Each allocator's 1- and 2-thread cells run back to back in every round, the control
        // first, so that a round compares them under the same load.
        let rows = [(THREADS_1, 1usize), (THREADS_2, 2)];
        let mut cells = Vec::new();
        // The control: each thread its own unlocked floor, nothing shared. Its scaling is
        // what this machine gives two threads at the moment (2 cores, other processes).
        for (scenario, threads) in rows {
            let mut own: Vec<Padded<Floor>> = (0..threads).map(|_| Padded(Floor::new(n))).collect();
            cells.push(
                cell(scenario, name::FLOOR_PER_THREAD, move |i| {
                    pairs_threads(&mut own, i)
                })
                .per_iter(threads as u64),
            );
        }
        for caches in [true, false] {
            let allocator = if caches {
                name::NUMAFRAME
            } else {
                name::NUMAFRAME_NOCACHE
            };
            for (scenario, threads) in rows {
                let mut handles: Vec<NumaCpu<'_, '_>> =
                    (0..threads).map(|t| NumaCpu::new(m, t)).collect();
                cells.push(
                    cell(scenario, allocator, move |i| {
                        set_caches(m, caches);
                        pairs_threads(&mut handles, i)
                    })
                    .per_iter(threads as u64),
                );
            }
        }
        for (scenario, threads) in rows {
            cells.push(locked_cell(scenario, name::BUDDY, &b, threads));
        }
        for (scenario, threads) in rows {
            cells.push(locked_cell(scenario, name::BITMAP, &bm, threads));
        }
        for (scenario, threads) in rows {
            cells.push(locked_cell(scenario, name::FREE_LIST, &fl, threads));
        }
        for (scenario, threads) in rows {
            cells.push(locked_cell(scenario, name::FLOOR, &fo, threads));
        }
        v.group(Group {
            title: "threads",
            heavy: false,
            cells,
        })?;
    }

    // Weighted interleave across the 4 nodes of cxl-2socket.
    {
        let spec = preset("cxl-2socket").ok_or_else(|| io::Error::other("preset cxl-2socket"))?;
        let sim = Sim::new(&spec)?;
        let wm = sim
            .boot(BootOptions::default())
            .map_err(|e| io::Error::other(format!("boot cxl-2socket: {e}")))?;
        wm.set_weights(Weights::new(&[3, 3, 1, 1]).map_err(|e| io::Error::other(e.to_string()))?);
        let wm = &wm;
        let policy = || {
            TaskPolicy::new(wm, Policy::WeightedInterleave(NodeMask::first_n(4)), false)
                .map_err(|e| io::Error::other(e.to_string()))
        };
        let (mut pb, mut ps) = (policy()?, policy()?);
        let (mut ob, mut os) = (
            vec![Pfn::new(0); INTERLEAVE_PAGES],
            vec![Pfn::new(0); INTERLEAVE_PAGES],
        );
        v.group(Group {
            title: "weighted-interleave",
            heavy: true,
            cells: vec![
                cell(INTERLEAVE, name::NUMAFRAME, move |i| {
                    interleave(wm, &mut pb, &mut ob, true, i)
                })
                .per_iter(INTERLEAVE_PAGES as u64),
                cell(INTERLEAVE, name::NUMAFRAME_SINGLES, move |i| {
                    interleave(wm, &mut ps, &mut os, false, i)
                })
                .per_iter(INTERLEAVE_PAGES as u64),
            ],
        })?;
    }

    // Order 9 and order 18.
    {
        set_caches(&m, true);
        set_caches(&big, true);
        let mut cells = Vec::new();
        for (order, s1, s64) in [(9u8, ORDER9_1G, ORDER9_64G), (18, ORDER18_1G, ORDER18_64G)] {
            let (mut b, mut bm, mut fl, _) = peers();
            let (mut c, mut g) = (NumaCpu::new(&m, 0), NumaCpu::new(&big, 0));
            cells.push(cell(s1, name::NUMAFRAME, move |i| pairs(&mut c, order, i)));
            cells.push(cell(s1, name::BUDDY, move |i| pairs(&mut b, order, i)));
            cells.push(cell(s1, name::BITMAP, move |i| pairs(&mut bm, order, i)));
            cells.push(cell(s1, name::FREE_LIST, move |i| pairs(&mut fl, order, i)));
            cells.push(cell(s64, name::NUMAFRAME, move |i| pairs(&mut g, order, i)));
        }
        v.group(Group {
            title: "orders",
            heavy: false,
            cells,
        })?;
    }
    // Unmap the 64 GiB arena before the boot scenarios map 13 TiB more.
    drop(large);

    // Boot.
    {
        let mut cells = Vec::new();
        for (scenario, p) in [(BOOT_1T, "1tb-2node"), (BOOT_12T, "12tb-2node")] {
            let spec = preset(p).ok_or_else(|| io::Error::other(format!("preset {p}")))?;
            cells.push(cell(scenario, name::NUMAFRAME, move |i| {
                boot(&spec, i).expect("booting a preset")
            }));
        }
        v.group(Group {
            title: "boot",
            heavy: true,
            cells,
        })?;
    }

    // The zonelist hint on fake-64.
    hint(v)
}

/// Frames `machine` manages (all free on a fresh boot with watermarks off).
fn managed(machine: &Machine<'_>) -> u64 {
    machine.nodes().iter().map(|n| n.managed_pages()).sum()
}

fn fill<'a>(a: &'a mut dyn Frames, seed: u64) -> impl FnMut(u64) -> Sample + 'a {
    let mut held = Vec::new();
    let mut rng = Rng::new(seed);
    move |i| fill_random_free(a, &mut held, &mut rng, i)
}

fn locked_cell<'a, A: Frames + Send>(
    scenario: &'static str,
    allocator: &'static str,
    a: &'a spin::Mutex<A>,
    threads: usize,
) -> Cell<'a> {
    let mut handles: Vec<Locked<'a, A>> = (0..threads).map(|_| Locked(a)).collect();
    cell(scenario, allocator, move |i| pairs_threads(&mut handles, i)).per_iter(threads as u64)
}

/// Issue 3, item 7: on `fake-64` with the first 63 nodes of node 0's list exhausted, an order-0
/// allocation from node 0 against a local hit, against the same walk without the hint, and
/// against a THISNODE allocation on the 64th node.
fn hint(v: &mut dyn Visitor) -> io::Result<()> {
    use scenario::*;
    let spec = preset("fake-64").ok_or_else(|| io::Error::other("preset fake-64"))?;
    let sim = Sim::new(&spec)?;
    let m = sim
        .boot(BootOptions::default())
        .map_err(|e| io::Error::other(format!("boot fake-64: {e}")))?;
    let node0 = NodeId::new(0);
    let mut order = vec![NodeId::new(0); spec.len()];
    let len = m.fallback_order(node0, &mut order);
    if len != 64 {
        return Err(io::Error::other("fake-64: node 0's list has not 64 nodes"));
    }
    let mut local = NumaNode {
        machine: &m,
        node: node0,
        flags: AllocFlags::empty(),
    };
    v.group(Group {
        title: "fake-64 local",
        heavy: false,
        cells: vec![cell(HINT_LOCAL, name::NUMAFRAME, move |i| {
            pairs(&mut local, 0, i)
        })],
    })?;

    let mut held = Vec::new();
    for &node in &order[..63] {
        while let Some(p) = m.alloc(node, Order::ZERO, AllocFlags::THISNODE) {
            held.push(p);
        }
    }
    let last = order[63];
    let probe = m
        .alloc(node0, Order::ZERO, AllocFlags::empty())
        .ok_or_else(|| io::Error::other("fake-64: the 64th node is empty"))?;
    if m.node_of(probe) != Some(last) {
        return Err(io::Error::other(
            "fake-64: the walk did not reach the 64th node",
        ));
    }
    m.free(probe, Order::ZERO)
        .map_err(|e| io::Error::other(e.to_string()))?;
    let mut hinted = NumaNode {
        machine: &m,
        node: node0,
        flags: AllocFlags::empty(),
    };
    let mut full = NumaPolicy {
        machine: &m,
        policy: TaskPolicy::new(&m, Policy::Bind(NodeMask::first_n(64)), false)
            .map_err(|e| io::Error::other(e.to_string()))?,
        cpu_node: node0,
    };
    let mut thisnode = NumaNode {
        machine: &m,
        node: last,
        flags: AllocFlags::THISNODE,
    };
    v.group(Group {
        title: "fake-64 exhausted",
        heavy: false,
        cells: vec![
            cell(HINT_SKIP, name::NUMAFRAME, move |i| {
                pairs(&mut hinted, 0, i)
            }),
            cell(HINT_NONE, name::NUMAFRAME, move |i| pairs(&mut full, 0, i)),
            cell(HINT_THISNODE, name::NUMAFRAME, move |i| {
                pairs(&mut thisnode, 0, i)
            }),
        ],
    })?;
    m.free_bulk(&held)
        .map_err(|e| io::Error::other(e.to_string()))?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The `numaframe bench` runner.

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
}

impl Plan {
    /// The full run (about a minute and a half on an idle 2-core machine).
    pub const FULL: Plan = Plan {
        sample: Duration::from_millis(15),
        samples: 15,
        heavy_samples: 5,
        cell_budget: Duration::from_millis(1500),
        skip_slow: false,
    };
    /// `--quick`: a smoke run of a few seconds; its numbers are rough.
    pub const QUICK: Plan = Plan {
        sample: Duration::from_millis(1),
        samples: 3,
        heavy_samples: 1,
        cell_budget: Duration::from_millis(50),
        skip_slow: true,
    };
}

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

/// A target of the issues, as a ratio or a bound, measured in this run.
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
}

/// Everything a run measured.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Report {
    /// Every measured cell, in run order.
    pub results: Vec<Measurement>,
    /// Cells left out.
    pub skipped: Vec<Skipped>,
    /// The targets of issues 3, 6 and 7.
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

    fn compute_targets(&mut self) {
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
        let nf = self.get(scenario, name::NUMAFRAME);
        let floor = self.get(scenario, name::FLOOR);
        writeln!(
            out,
            "  {:<24} {:>14} {:>13} {:>10} {:>8}",
            "allocator", "ns/op", "x numaframe", "x floor", "samples"
        )?;
        for m in rows {
            let ratio = |base: Option<f64>| {
                base.map_or(String::from("-"), |b| format!("{:.2}x", m.ns_per_op / b))
            };
            writeln!(
                out,
                "  {:<24} {:>14} {:>13} {:>10} {:>8}",
                m.allocator,
                format_ns(m.ns_per_op),
                ratio(nf),
                ratio(floor),
                m.samples
            )?;
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
            "\nscaling (throughput with 2 threads / with 1 thread; 2.00 is perfect):"
        )?;
        writeln!(
            out,
            "  {:<24} {:>8} {:>34}",
            "allocator", "medians", "rounds where the control scaled"
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
            writeln!(
                out,
                "  {:<24} {:>8.2} {:>34}{note}",
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

fn median(v: &mut [f64]) -> f64 {
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

/// The `numaframe bench` visitor: calibrates each cell, samples round-robin, keeps medians.
struct Runner<'o> {
    plan: Plan,
    report: Report,
    /// Called with each scenario's name once all its cells are measured.
    on_scenario: &'o mut dyn FnMut(&Report, &str) -> io::Result<()>,
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
            self.report.results.push(Measurement {
                scenario: st.cell.scenario,
                allocator: st.cell.allocator,
                ns_per_op: median(&mut st.per_op.clone()),
                samples: st.per_op.len(),
                per_sample: st.per_op.clone(),
            });
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

/// Runs every scenario under `plan`; `on_scenario` sees the report each time a scenario is
/// complete (the text output prints it then).
///
/// # Errors
/// If simulated memory cannot be mapped, a machine does not boot, or `on_scenario` fails.
pub fn run(
    plan: Plan,
    on_scenario: &mut dyn FnMut(&Report, &str) -> io::Result<()>,
) -> io::Result<Report> {
    let mut runner = Runner {
        plan,
        report: Report {
            quick: plan.skip_slow,
            ..Report::default()
        },
        on_scenario,
    };
    visit(Sizes::FULL, &mut runner)?;
    let mut report = runner.report;
    report.compute_targets();
    Ok(report)
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
    _progress: &mut dyn Write,
) -> io::Result<()> {
    let plan = if quick { Plan::QUICK } else { Plan::FULL };
    if !json {
        writeln!(
            out,
            "numaframe bench{}: numaframe against buddy_system_allocator 0.13, bitmap-allocator 0.4 \
             (BitAlloc1M), free-list 0.3 and a Vec<u64> floor.\n\
             1 GiB = {FRAMES_1G} frames of 4 KiB; medians over samples taken round-robin; \
             single-threaded peers run bare, threaded ones behind spin::Mutex.\n\
             numaframe = alloc_cpu/free_cpu with per-CPU caches (bulk: alloc_bulk/free_bulk); \
             numaframe-nocache = the same calls with PcpConfig::OFF.",
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
    let report = run(plan, &mut print)?;
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

    /// Every peer, driven through `Frames`, hands out each frame once and takes it back.
    fn round_trip(a: &mut dyn Frames, first: u64, frames: u64, orders: &[u8]) {
        let mut held = Vec::new();
        while let Some(f) = a.alloc(0) {
            assert!(
                (first..first + frames).contains(&f),
                "frame {f} outside {first}..+{frames}"
            );
            held.push(f);
        }
        let mut sorted = held.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len() as u64, frames, "every frame once");
        Rng::new(9).shuffle(&mut held);
        for &f in &held {
            a.free(f, 0);
        }
        for &order in orders {
            let f = a.alloc(order).expect("a free allocator has a block");
            assert_eq!(f % (1 << order), 0, "order {order} aligned");
            a.free(f, order);
        }
        let mut out = vec![Pfn::new(0); 64];
        assert_eq!(a.alloc_bulk(&mut out), 64);
        a.free_bulk(&out);
        let all: Vec<u64> = std::iter::from_fn(|| a.alloc(0)).collect();
        assert_eq!(all.len() as u64, frames, "everything came back");
        for f in all {
            a.free(f, 0);
        }
    }

    #[test]
    fn peers_round_trip() {
        let n = 1 << 12;
        round_trip(&mut Buddy::new(n), 0, n, &[9, 12]);
        round_trip(&mut Bitmap::new(n), 0, n, &[9, 12]);
        round_trip(&mut FreeListPeer::new(n), 0, n, &[9, 12]);
        round_trip(&mut Floor::new(n), 0, n, &[]);
        let lock = spin::Mutex::new(Floor::new(n));
        round_trip(&mut Locked(&lock), 0, n, &[]);
    }

    #[test]
    fn numaframe_adapters_round_trip() {
        let node = OneNode::new(1 << 12).unwrap();
        let m = node.boot().unwrap();
        let n = managed(&m);
        assert!(n >= 1 << 12);
        // The node starts at 4 GiB, its usable frames first.
        let first = NODE_BASE / PAGE_SIZE;
        round_trip(&mut NumaCpu::new(&m, 1), first, n, &[9, 12]);
        set_caches(&m, false);
        round_trip(&mut NumaCpu::new(&m, 0), first, n, &[9, 12]);
        m.check_invariants().unwrap();
    }

    #[test]
    fn threads_count_every_pair() {
        let mut own: Vec<Padded<Floor>> = (0..2).map(|_| Padded(Floor::new(8))).collect();
        let s = pairs_threads(&mut own, 1000);
        assert_eq!(s.ops, 2000);
        assert!(own.iter().all(|f| f.0.0.len() == 8));
    }

    #[test]
    fn medians() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(median(&mut []).is_nan());
    }

    fn m(scenario: &'static str, allocator: &'static str, ns_per_op: f64) -> Measurement {
        Measurement {
            scenario,
            allocator,
            ns_per_op,
            samples: 3,
            per_sample: vec![ns_per_op; 3],
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

    #[test]
    fn every_scenario_is_described() {
        for s in scenario::ALL {
            assert!(!describe(s).is_empty(), "{s}");
        }
    }
}
