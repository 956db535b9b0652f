//! The SMP run: every started CPU runs the same workload on one machine at the same time, then
//! they meet at a barrier and the boot CPU checks that the machine is as it was before.
//!
//! Each of [`ITERATIONS`] rounds on a CPU does:
//! - per-CPU traffic ([`crate::pcp`]): eight order-0 frames through the CPU's cache, half freed
//!   locally and half posted to the next CPU's mailbox, which frees them into *its* cache (a
//!   free of a frame another CPU allocated); it then frees what the previous CPU posted. Every
//!   frame carries a stamp written at allocation and checked at free, so a frame handed to two
//!   owners at once shows. Every eighth round drains the next CPU's cache from here;
//! - an order-2 block and an order-9 (2 MiB) block through the per-CPU API, which go straight
//!   to the zones, and a page from the 2 MiB huge-page pool when the pool has one;
//! - a bulk of 32 frames on the CPU's node and a weighted-interleave bulk of 24 over every node
//!   with memory (one policy, with its cursor, per CPU);
//! - heap traffic through the global allocator: a `Vec` and a `BTreeMap`.
//!
//! Before the rounds each CPU also adds to one atomic counter and to one counter behind a
//! spinlock, so the boot CPU can tell whether atomics and locks work on this platform at all.
//!
//! Then every CPU claims its cache ([`crate::pcp::Handle`]) and runs [`HANDLE_ROUNDS`] rounds
//! of the same order-0 traffic through it, with no lock: frames posted to the next CPU are
//! freed through *its* handle, into pageblocks the first CPU's claimed cache holds, and every
//! eighth round but the last drains the next CPU's claimed cache from here (a request it
//! honours at its next operation). Then the boot CPU gives its own cache back and drains every cache while
//! the other CPUs idle with their handles alive: each whose cache holds frames is kicked
//! ([`crate::pcp::Kicks`]), polls and gives them back, and the boot CPU waits until every
//! such CPU has.
//!
//! A CPU whose workload fails still meets the others at the barriers, so the boot CPU reports
//! that CPU's failure instead of hanging. Afterwards the boot CPU drains every cache, runs
//! `check_invariants`, and compares every zone's free pages and every huge-page pool with the
//! snapshot taken before the CPUs started. The heap may keep (or give back) frames it grew by
//! during the run, so on a node whose heap changed size the zones' sum plus the heap's frames
//! must match instead.

use alloc::collections::BTreeMap;
use alloc::vec::Vec;
use core::fmt;
use core::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use numaframe::heap::FrameMap;
use numaframe::policy::{Policy, TaskPolicy};
use numaframe::{
    AllocFlags, HugeCounts, HugeSize, Machine, NodeId, Order, Pfn, PhysRange, ZoneKind,
};
use spin::Mutex;

use crate::boot::Failure;
use crate::pcp::{self, Cpu, Handle, Kicks, Order0};

/// Rounds of the workload on every CPU.
pub const ITERATIONS: u32 = 256;
/// Increments of each shared counter per CPU in the atomics check.
pub const ATOMIC_ROUNDS: u64 = 2_000;
/// Frames in flight from one CPU to the next.
const MAILBOX: usize = 64;
/// Frames a CPU takes through its cache per round.
const HELD: usize = 8;
/// Rounds of order-0 traffic through each CPU's claimed handle.
pub const HANDLE_ROUNDS: u32 = 64;
/// Frames of the bulk a handle takes every eighth round.
const HANDLE_BULK: usize = 16;
/// Most spins the boot CPU waits for a kicked CPU to give its cache back.
const ANSWER_SPINS: u64 = 1 << 30;

/// Frames one CPU allocated for the next one to free, with the stamp written into each.
struct Mailbox {
    slots: [(Pfn, u64); MAILBOX],
    len: usize,
}

/// A sense-counting barrier for a fixed number of CPUs.
struct Barrier {
    parties: usize,
    arrived: AtomicUsize,
    generation: AtomicUsize,
}

impl Barrier {
    fn wait(&self) {
        // Acquire: the last CPU's bump below publishes what every CPU did before arriving.
        let generation = self.generation.load(Ordering::Acquire);
        // AcqRel: the last arrival sees every earlier arrival's writes.
        if self.arrived.fetch_add(1, Ordering::AcqRel) + 1 == self.parties {
            // Relaxed: ordered before the Release bump, which every waiter acquires.
            self.arrived.store(0, Ordering::Relaxed);
            // Release: publishes all writes before the barrier to the CPUs leaving it.
            self.generation.store(generation + 1, Ordering::Release);
        } else {
            // Acquire: pairs with the last arrival's Release bump.
            while self.generation.load(Ordering::Acquire) == generation {
                core::hint::spin_loop();
            }
        }
    }
}

/// What one CPU did: allocator calls by kind, and the heap allocations of its round.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Ops {
    /// Allocations through the per-CPU API (order 0, 2 and 9).
    pub allocs: u64,
    /// Frees of blocks this CPU allocated.
    pub local_frees: u64,
    /// Frees of frames another CPU allocated.
    pub remote_frees: u64,
    /// Bulk allocations and bulk frees (node and weighted interleave).
    pub bulks: u64,
    /// Huge-page pool allocations and frees.
    pub huge: u64,
    /// Remote cache drains.
    pub drains: u64,
    /// Heap allocations through the global allocator.
    pub heap: u64,
    /// Allocations and frees through the CPU's claimed handle, frames of its own.
    pub handle: u64,
    /// Frees through the handle of frames another CPU's handle allocated.
    pub handle_remote: u64,
}

impl Ops {
    /// Every operation counted.
    pub fn total(&self) -> u64 {
        self.allocs
            + self.local_frees
            + self.remote_frees
            + self.bulks
            + self.huge
            + self.drains
            + self.heap
            + self.handle
            + self.handle_remote
    }
}

/// What one round's [`Smp::exchange`] did.
#[derive(Clone, Copy, Debug, Default)]
struct Exchanged {
    allocs: u64,
    local_frees: u64,
    remote_frees: u64,
}

/// Free pages per zone, huge-page pools and heap frames of one node.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct NodeSnapshot {
    zones: [u64; 2],
    /// `(total, free)` of the 2 MiB and 1 GiB pools.
    huge: [HugeCounts; 2],
    heap: u64,
}

/// A failure of the SMP run: on one CPU (its machine index), or in the boot CPU's final checks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SmpFailure {
    /// The CPU whose workload failed; `None` for the final checks.
    pub cpu: Option<usize>,
    /// What failed.
    pub failure: Failure,
}

impl fmt::Display for SmpFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.cpu {
            Some(cpu) => write!(f, "smp: cpu{cpu}: {}", self.failure),
            None => write!(f, "smp: after the run: {}", self.failure),
        }
    }
}

/// What the SMP run did, once every check passed.
#[derive(Debug)]
pub struct Report {
    /// Machine index and operations of each CPU that ran.
    pub cpus: Vec<(usize, Ops)>,
    /// Frames the heap holds now minus before the run, summed over nodes.
    pub heap_delta: i64,
    /// Kicks the machine sent to claimed CPUs.
    pub kicks: u64,
    /// Idle CPUs whose claimed cache held frames when the boot CPU drained every cache.
    pub holding: u64,
    /// Of those, the ones woken by a kick that gave them back (all, or the run fails).
    pub woken: u64,
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let remote: u64 = self.cpus.iter().map(|(_, o)| o.remote_frees).sum();
        write!(
            f,
            "{} CPUs x {ITERATIONS} rounds, ops per CPU",
            self.cpus.len()
        )?;
        for (cpu, ops) in &self.cpus {
            write!(f, " {cpu}:{}", ops.total())?;
        }
        let handle: u64 = self.cpus.iter().map(|(_, o)| o.handle).sum();
        let into_claimed: u64 = self.cpus.iter().map(|(_, o)| o.handle_remote).sum();
        write!(
            f,
            ", {remote} remote frees, atomics {}x{ATOMIC_ROUNDS}; caches drained, invariants hold, free pages and pools as before (heap {:+} frames); handles: {HANDLE_ROUNDS} rounds, {handle} operations, {into_claimed} frees into other CPUs' claimed caches, {} kicks, {} of {} idle CPUs holding frames woken to give them back",
            self.cpus.len(),
            self.heap_delta,
            self.kicks,
            self.woken,
            self.holding
        )
    }
}

/// The state the CPUs of one SMP run share.
pub struct Smp<'m, 'a> {
    machine: &'m Machine<'a>,
    frames: &'m (dyn FrameMap + Sync),
    heap_frames: fn(NodeId) -> u64,
    /// Machine CPU index of each participant, by slot.
    cpus: Vec<usize>,
    mailboxes: Vec<Mutex<Mailbox>>,
    results: Vec<Mutex<Option<Result<Ops, Failure>>>>,
    barrier: Barrier,
    counter: AtomicU64,
    locked: Mutex<u64>,
    before: Vec<NodeSnapshot>,
    /// How a claimed CPU is woken (the machine's [`CpuKick`](numaframe::CpuKick)).
    kicks: &'m Kicks,
    /// Per slot: its claimed cache held frames before the boot CPU's drain.
    holds: Vec<AtomicBool>,
    /// Per slot: woken by a kick, it gave its cache back.
    answered: Vec<AtomicBool>,
    /// The boot CPU's drain is done: the idle CPUs stop waiting.
    stop: AtomicBool,
}

impl fmt::Debug for Smp<'_, '_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Smp")
            .field("cpus", &self.cpus)
            .finish_non_exhaustive()
    }
}

impl<'m, 'a> Smp<'m, 'a> {
    /// A run of the machine CPUs `cpus` (indices; each runs [`Smp::run`] with its slot), and
    /// the snapshot the boot CPU compares with afterwards. `frames` maps frames the machine
    /// hands out (for the stamps), `heap_frames` says how many frames the global heap holds on
    /// a node, and `kicks` is the machine's [`CpuKick`](numaframe::CpuKick).
    pub fn new(
        machine: &'m Machine<'a>,
        frames: &'m (dyn FrameMap + Sync),
        heap_frames: fn(NodeId) -> u64,
        kicks: &'m Kicks,
        cpus: Vec<usize>,
    ) -> Self {
        let n = cpus.len();
        let mut smp = Smp {
            machine,
            frames,
            heap_frames,
            mailboxes: (0..n)
                .map(|_| {
                    Mutex::new(Mailbox {
                        slots: [(Pfn::new(0), 0); MAILBOX],
                        len: 0,
                    })
                })
                .collect(),
            results: (0..n).map(|_| Mutex::new(None)).collect(),
            barrier: Barrier {
                parties: n,
                arrived: AtomicUsize::new(0),
                generation: AtomicUsize::new(0),
            },
            cpus,
            counter: AtomicU64::new(0),
            locked: Mutex::new(0),
            before: Vec::with_capacity(machine.topology().len()),
            kicks,
            holds: (0..n).map(|_| AtomicBool::new(false)).collect(),
            answered: (0..n).map(|_| AtomicBool::new(false)).collect(),
            stop: AtomicBool::new(false),
        };
        // Every allocation of the run's own state is made: from here the heap stays put.
        for node in machine.topology().node_ids() {
            let snap = smp.snapshot(node);
            smp.before.push(snap);
        }
        smp
    }

    /// Participants.
    pub fn len(&self) -> usize {
        self.cpus.len()
    }

    /// The machine CPU index of `slot`.
    pub fn cpu_of(&self, slot: usize) -> Option<usize> {
        self.cpus.get(slot).copied()
    }

    fn snapshot(&self, node: NodeId) -> NodeSnapshot {
        let mut s = NodeSnapshot {
            heap: (self.heap_frames)(node),
            ..NodeSnapshot::default()
        };
        if let Some(n) = self.machine.node(node) {
            for kind in ZoneKind::ALL {
                s.zones[kind.index()] = n.zone(kind).counters().free;
            }
        }
        for (i, size) in HugeSize::ALL.into_iter().enumerate() {
            s.huge[i] = self.machine.huge_counts(node, size);
        }
        s
    }

    /// Runs the workload as participant `slot` (on the CPU it names), then meets the others.
    /// Every participant must call this once; it returns when all have finished.
    pub fn run(&self, slot: usize) {
        // Everyone is up: the rounds start together.
        self.barrier.wait();
        let result = self.work(slot);
        // Everyone has posted their last frames.
        self.barrier.wait();
        let result = result.and_then(|ops| self.empty_mailbox(slot, ops));
        let result = self.claimed(slot, result);
        if let Some(r) = self.results.get(slot) {
            *r.lock() = Some(result);
        }
        self.barrier.wait();
    }

    /// The boot CPU's checks after every participant returned from [`Smp::run`].
    ///
    /// # Errors
    /// The first CPU's failure, or the first final check that fails.
    pub fn finish(&self) -> Result<Report, SmpFailure> {
        let mut cpus = Vec::with_capacity(self.len());
        for (slot, r) in self.results.iter().enumerate() {
            let cpu = self.cpus[slot];
            match *r.lock() {
                Some(Ok(ops)) => cpus.push((cpu, ops)),
                Some(Err(failure)) => {
                    return Err(SmpFailure {
                        cpu: Some(cpu),
                        failure,
                    });
                }
                None => {
                    return Err(SmpFailure {
                        cpu: Some(cpu),
                        failure: Failure::Smp("no result"),
                    });
                }
            }
        }
        let fail = |failure| SmpFailure { cpu: None, failure };
        let want = ATOMIC_ROUNDS * self.len() as u64;
        // Relaxed: the barrier ordered every increment before this read.
        let (counted, locked) = (self.counter.load(Ordering::Relaxed), *self.locked.lock());
        if counted != want || locked != want {
            return Err(fail(Failure::Atomics {
                want,
                counted,
                locked,
            }));
        }
        let kicks = self.kicks.sent();
        // Relaxed: the barriers ordered the stores before these reads.
        let holding = self
            .holds
            .iter()
            .filter(|h| h.load(Ordering::Relaxed))
            .count() as u64;
        let woken = self
            .holds
            .iter()
            .zip(&self.answered)
            .filter(|(h, a)| h.load(Ordering::Relaxed) && a.load(Ordering::Relaxed))
            .count() as u64;
        pcp::drain_all(self.machine);
        let cached = self.machine.cached_pages();
        if cached != 0 {
            return Err(fail(Failure::Cached(cached)));
        }
        self.machine
            .check_invariants()
            .map_err(|e| fail(Failure::Invariant(e)))?;
        let mut heap_delta = 0i64;
        for (node, before) in self.machine.topology().node_ids().zip(&self.before) {
            let after = self.snapshot(node);
            if after.huge != before.huge {
                return Err(fail(Failure::HugePool { node }));
            }
            let sum = |s: &NodeSnapshot| s.zones.iter().sum::<u64>() + s.heap;
            if after.heap == before.heap {
                for kind in ZoneKind::ALL {
                    let (b, a) = (before.zones[kind.index()], after.zones[kind.index()]);
                    if a != b {
                        return Err(fail(Failure::FreePages {
                            node,
                            zone: kind,
                            before: b,
                            after: a,
                        }));
                    }
                }
            } else if sum(&after) != sum(before) {
                return Err(fail(Failure::FreePagesWithHeap {
                    node,
                    before: sum(before),
                    after: sum(&after),
                }));
            }
            heap_delta += after.heap as i64 - before.heap as i64;
        }
        Ok(Report {
            cpus,
            heap_delta,
            kicks,
            holding,
            woken,
        })
    }

    /// Writes `stamp` into the first word of `pfn`.
    fn stamp(&self, pfn: Pfn, stamp: u64) -> Result<(), Failure> {
        let p = self.word(pfn)?;
        // SAFETY: the machine handed `pfn` to this CPU and it is not freed yet, so the frame is
        // ours alone; `FrameMap` makes the mapping valid and page aligned for its 4 KiB.
        unsafe { p.write_volatile(stamp) };
        Ok(())
    }

    /// Checks that `pfn` still carries `stamp`.
    fn check(&self, pfn: Pfn, stamp: u64) -> Result<(), Failure> {
        let p = self.word(pfn)?;
        // SAFETY: as in `stamp`: the frame is allocated and owned by the caller until it frees it.
        let found = unsafe { p.read_volatile() };
        if found == stamp {
            Ok(())
        } else {
            Err(Failure::Stamp { pfn, stamp, found })
        }
    }

    fn word(&self, pfn: Pfn) -> Result<*mut u64, Failure> {
        pfn.checked_add(1)
            .and_then(|end| PhysRange::new(pfn, end))
            .and_then(|r| self.frames.map_frames(r))
            .map(|p| p.as_ptr().cast::<u64>())
            .ok_or(Failure::Unmapped(pfn))
    }

    /// Posts `pfn` to the mailbox of `slot`; `false` if it is full.
    fn post(&self, slot: usize, pfn: Pfn, stamp: u64) -> bool {
        let Some(m) = self.mailboxes.get(slot) else {
            return false;
        };
        let mut m = m.lock();
        let len = m.len;
        match m.slots.get_mut(len) {
            Some(s) => {
                *s = (pfn, stamp);
                m.len += 1;
                true
            }
            None => false,
        }
    }

    /// Frees through `cpu` every frame the previous CPU posted to `slot`; returns how many.
    fn take_mail(&self, slot: usize, cpu: &mut dyn Order0) -> Result<u64, Failure> {
        let Some(m) = self.mailboxes.get(slot) else {
            return Ok(0);
        };
        let (mail, len) = {
            let mut m = m.lock();
            let taken = (m.slots, m.len);
            m.len = 0;
            taken
        };
        for &(pfn, stamp) in &mail[..len] {
            self.check(pfn, stamp)?;
            cpu.free0(pfn).map_err(Failure::Free)?;
        }
        Ok(len as u64)
    }

    /// One round's order-0 exchange through `cpu`, as participant `slot`: [`HELD`] frames
    /// (`what` names them when memory runs out), each on `home` if it is given and stamped
    /// from `base`; half freed through `cpu`, half posted to slot `next` (freed here when its
    /// mailbox is full); then frees what the previous CPU posted to `slot`.
    fn exchange(
        &self,
        slot: usize,
        base: u64,
        home: Option<NodeId>,
        next: Option<usize>,
        cpu: &mut dyn Order0,
        what: &'static str,
    ) -> Result<Exchanged, Failure> {
        let mut done = Exchanged::default();
        let mut held = [Pfn::new(0); HELD];
        for (i, p) in held.iter_mut().enumerate() {
            *p = cpu.alloc0().ok_or(Failure::OutOfMemory(what))?;
            done.allocs += 1;
            if let Some(want) = home {
                let got = self.machine.node_of(*p);
                if got != Some(want) {
                    return Err(Failure::Placement { want, got, pfn: *p });
                }
            }
            self.stamp(*p, base | i as u64)?;
        }
        for (i, &p) in held.iter().enumerate() {
            let stamp = base | i as u64;
            self.check(p, stamp)?;
            if i >= HELD / 2 && next.is_some_and(|n| self.post(n, p, stamp)) {
                continue;
            }
            cpu.free0(p).map_err(Failure::Free)?;
            done.local_frees += 1;
        }
        done.remote_frees = self.take_mail(slot, cpu)?;
        Ok(done)
    }

    fn empty_mailbox(&self, slot: usize, mut ops: Ops) -> Result<Ops, Failure> {
        let index = self.cpus[slot];
        let mut cpu = Cpu::claim(self.machine, index).ok_or(Failure::NoCpu(index))?;
        ops.remote_frees += self.take_mail(slot, &mut cpu)?;
        Ok(ops)
    }

    /// The claimed phase as participant `slot`, after `prior` (the phases before): the rounds
    /// through the CPU's handle, then the boot CPU's drain of every cache, which the others
    /// answer while they idle. Meets the others at every barrier whatever fails.
    fn claimed(&self, slot: usize, prior: Result<Ops, Failure>) -> Result<Ops, Failure> {
        let index = self.cpus[slot];
        let mut handle = Handle::claim(self.machine, index);
        // Every CPU holds its handle before any frame moves between them.
        self.barrier.wait();
        let mut result = prior.and_then(|ops| match handle.as_mut() {
            Some(h) => self.handle_rounds(slot, h, ops),
            None => Err(Failure::Smp("a CPU's cache could not be claimed")),
        });
        // Everyone has posted their last frames.
        self.barrier.wait();
        let mut kept = None;
        if let Some(h) = handle.as_mut() {
            result = result.and_then(|mut ops| {
                ops.handle_remote += self.take_mail(slot, h)?;
                Ok(ops)
            });
            // The boot CPU gives its cache back itself. The others keep a frame: its pageblock
            // stays in their cache (a wholly free one goes back at its last free), with at least
            // 15 frames free (a cache borrows none with fewer than 16).
            if let Some(flag) = self.holds.get(slot).filter(|_| slot != 0) {
                kept = h.alloc();
                if kept.is_none() {
                    result = Err(Failure::OutOfMemory("kept handle frame"));
                }
                // Relaxed: the barrier below publishes it.
                flag.store(h.cached_pages() > 0, Ordering::Relaxed);
                // A mark left by a kick of the rounds' drains (answered by the operations
                // since) would pass for the boot CPU's kick: only a kick after the barrier
                // below counts as a wake-up.
                self.kicks.take(index);
            }
        }
        // Every CPU has said whether its cache holds frames.
        self.barrier.wait();
        if slot == 0 {
            // The boot CPU's own cache is drained on the spot once its handle is gone.
            drop(handle.take());
            result = result.and_then(|ops| self.drain_claimed().map(|()| ops));
            // Release: the others stop once they see it.
            self.stop.store(true, Ordering::Release);
            self.kicks.wake_all();
        } else if let Some(h) = handle.as_mut() {
            self.idle(slot, index, h);
            if let Some(p) = kept {
                result = result.and_then(|ops| h.free(p).map(|()| ops).map_err(Failure::Free));
            }
        }
        self.barrier.wait();
        drop(handle);
        result
    }

    /// [`HANDLE_ROUNDS`] rounds of order-0 traffic through the claimed handle `h`: as the
    /// locked rounds, with a bulk every eighth round.
    fn handle_rounds(
        &self,
        slot: usize,
        h: &mut Handle<'_, '_>,
        mut ops: Ops,
    ) -> Result<Ops, Failure> {
        let machine = self.machine;
        let index = self.cpus[slot];
        let node = Cpu::claim(machine, index)
            .and_then(|c| c.node())
            .ok_or(Failure::NoCpu(index))?;
        let home = machine.memory_nodes().contains(node).then_some(node);
        let next = (self.len() > 1).then(|| (slot + 1) % self.len());
        for round in 0..HANDLE_ROUNDS {
            // The top bit tells these stamps from the locked rounds'.
            let base = 1 << 63 | (index as u64) << 32 | u64::from(round) << 8;
            let done = self.exchange(slot, base, home, next, h, "handle frame")?;
            ops.handle += done.allocs + done.local_frees;
            ops.handle_remote += done.remote_frees;
            if round % 8 == 7 {
                let mut bulk = [Pfn::new(0); HANDLE_BULK];
                if h.alloc_bulk(&mut bulk) != bulk.len() {
                    return Err(Failure::OutOfMemory("handle bulk"));
                }
                for (i, &p) in bulk.iter().enumerate() {
                    self.stamp(p, base | 0x80 | i as u64)?;
                }
                for (i, &p) in bulk.iter().enumerate() {
                    self.check(p, base | 0x80 | i as u64)?;
                    h.free(p).map_err(Failure::Free)?;
                }
                ops.handle += 2 * bulk.len() as u64;
                // Not in the last round: each CPU ends its rounds holding its pageblock, for
                // the boot CPU's drain to ask back.
                if let Some(n) = next.filter(|_| round + 1 < HANDLE_ROUNDS) {
                    pcp::drain_remote(machine, self.cpus[n]);
                    ops.drains += 1;
                }
            }
        }
        Ok(ops)
    }

    /// The boot CPU's drain of every cache while the other CPUs idle with their handles: waits
    /// until each whose cache held frames has been kicked and has given them back.
    fn drain_claimed(&self) -> Result<(), Failure> {
        pcp::drain_all(self.machine);
        for (holds, answered) in self.holds.iter().zip(&self.answered) {
            // Relaxed: published by the barrier before this phase.
            if !holds.load(Ordering::Relaxed) {
                continue;
            }
            let mut spins = 0u64;
            // Acquire: pairs with the idle CPU's Release once its cache is back.
            while !answered.load(Ordering::Acquire) {
                spins += 1;
                if spins > ANSWER_SPINS {
                    return Err(Failure::Smp(
                        "a CPU kicked to give its cache back never did",
                    ));
                }
                core::hint::spin_loop();
            }
        }
        Ok(())
    }

    /// An idle CPU holding handle `h`: polls when kicked, until the boot CPU's drain is done.
    fn idle(&self, slot: usize, index: usize, h: &mut Handle<'_, '_>) {
        loop {
            if self.kicks.take(index)
                && h.poll()
                && h.cached_pages() == 0
                && let Some(a) = self.answered.get(slot)
            {
                // Release: its cache is back in the zones before the boot CPU reads it.
                a.store(true, Ordering::Release);
            }
            // Acquire: pairs with the boot CPU's Release.
            if self.stop.load(Ordering::Acquire) {
                return;
            }
            self.kicks.wait();
        }
    }

    fn work(&self, slot: usize) -> Result<Ops, Failure> {
        let machine = self.machine;
        let index = self.cpus[slot];
        let mut cpu = Cpu::claim(machine, index).ok_or(Failure::NoCpu(index))?;
        let node = cpu.node().ok_or(Failure::NoCpu(index))?;
        // With one CPU there is no other to hand frames to.
        let next = (self.len() > 1).then(|| (slot + 1) % self.len());
        let memory = machine.memory_nodes();
        let local = memory.contains(node);
        let mut interleave = TaskPolicy::new(machine, Policy::WeightedInterleave(memory), false)
            .map_err(Failure::Policy)?;
        let mut ops = Ops::default();

        for _ in 0..ATOMIC_ROUNDS {
            // Relaxed: only the total matters, read after the barriers.
            self.counter.fetch_add(1, Ordering::Relaxed);
            *self.locked.lock() += 1;
        }

        for round in 0..ITERATIONS {
            let base = ((index as u64) << 32) | (u64::from(round) << 8);
            let home = local.then_some(node);
            let done = self.exchange(slot, base, home, next, &mut cpu, "per-CPU frame")?;
            ops.allocs += done.allocs;
            ops.local_frees += done.local_frees;
            ops.remote_frees += done.remote_frees;
            if let Some(n) = next.filter(|_| round % 8 == 7) {
                pcp::drain_remote(machine, self.cpus[n]);
                ops.drains += 1;
            }

            for order in [Order::new(2), Order::HUGE_2M] {
                let b = cpu
                    .alloc(order)
                    .ok_or(Failure::OutOfMemory("per-CPU block"))?;
                ops.allocs += 1;
                self.stamp(b, base | 0xff)?;
                self.check(b, base | 0xff)?;
                cpu.free(b, order).map_err(Failure::Free)?;
                ops.local_frees += 1;
            }
            if let Some(h) = machine.alloc_huge(node, HugeSize::Size2M) {
                self.stamp(h, base | 0xfe)?;
                self.check(h, base | 0xfe)?;
                machine
                    .free_huge(h, HugeSize::Size2M)
                    .map_err(Failure::Free)?;
                ops.huge += 2;
            }

            let mut bulk = [Pfn::new(0); 32];
            if machine.alloc_bulk(node, AllocFlags::empty(), &mut bulk) != bulk.len() {
                return Err(Failure::OutOfMemory("node bulk"));
            }
            machine.free_bulk(&bulk).map_err(Failure::BulkFree)?;
            let placed = interleave
                .alloc_bulk(machine, node, AllocFlags::empty(), &mut bulk[..24])
                .placed;
            if placed != 24 {
                return Err(Failure::OutOfMemory("weighted-interleave bulk"));
            }
            machine.free_bulk(&bulk[..24]).map_err(Failure::BulkFree)?;
            ops.bulks += 4;

            let v: Vec<u64> = (0..128u64).map(|i| i ^ base).collect();
            let mut map = BTreeMap::new();
            for i in 0..24u64 {
                map.insert(i ^ u64::from(round), base + i);
            }
            let want: u64 = (0..128u64).map(|i| i ^ base).sum();
            if v.iter().sum::<u64>() != want
                || map.len() != 24
                || map.get(&(3 ^ u64::from(round))) != Some(&(base + 3))
            {
                return Err(Failure::Heap("SMP vector or map"));
            }
            ops.heap += 2;
        }
        Ok(ops)
    }
}

#[cfg(test)]
mod tests {
    use std::alloc::{Layout, alloc_zeroed};
    use std::ptr::NonNull;

    use numaframe::heap::IdentityMap;
    use numaframe::{BootOptions, MemoryRange, NodeInfo, PhysMemory, Topology};

    use super::*;

    /// Frames are host memory at their own address: a leaked buffer, so the stamps land in it.
    struct Identity;
    // SAFETY: the machine maps only the ranges it was given, which lie in the leaked buffer.
    unsafe impl PhysMemory for Identity {
        fn map(&self, range: PhysRange) -> Option<NonNull<u8>> {
            NonNull::new(std::ptr::with_exposed_provenance_mut(
                range.start().addr().get() as usize,
            ))
        }
    }

    /// The whole SMP run on four host threads over a two-node machine with a memoryless CPU
    /// node, checked as the boot CPU checks it.
    #[test]
    fn four_threads_run_the_workload_and_leave_the_machine_as_before() {
        const FRAMES: u64 = 8192;
        let layout = Layout::from_size_align((2 * FRAMES * 4096) as usize, 1 << 21).unwrap();
        // SAFETY: the layout has a non-zero size.
        let base = unsafe { alloc_zeroed(layout) }.expose_provenance() as u64 / 4096;
        let ranges = [0, 1].map(|i| MemoryRange {
            node: NodeId::new(i),
            range: PhysRange::new(
                Pfn::new(base + i as u64 * FRAMES),
                Pfn::new(base + (i as u64 + 1) * FRAMES),
            )
            .unwrap(),
        });
        let cpu_node = NodeInfo {
            has_cpus: true,
            has_memory: true,
            ..NodeInfo::default()
        };
        let memoryless = NodeInfo {
            has_cpus: true,
            ..NodeInfo::default()
        };
        let infos = [cpu_node, cpu_node, memoryless];
        let distances = [10, 20, 20, 20, 10, 20, 20, 20, 10];
        let topo = Topology::new(&distances, &infos).unwrap();
        let cpus = [0, 0, 1, 2].map(NodeId::new);
        let opts = BootOptions {
            cpus: &cpus,
            ..BootOptions::default()
        };
        static KICKS: Kicks = Kicks::new(|| {}, std::thread::yield_now);
        let machine = Machine::boot(topo, &Identity, &ranges, opts)
            .unwrap()
            .with_kick(&KICKS);
        machine.reserve_huge(NodeId::new(1), HugeSize::Size2M, 2);
        // SAFETY: frames are host memory at their own address (see `Identity`).
        let frames = unsafe { IdentityMap::new() };
        let smp = Smp::new(&machine, &frames, |_| 0, &KICKS, vec![2, 0, 1, 3]);
        std::thread::scope(|s| {
            for slot in 0..smp.len() {
                let smp = &smp;
                s.spawn(move || smp.run(slot));
            }
        });
        let report = smp.finish().unwrap();
        assert_eq!(report.cpus.len(), 4);
        assert_eq!(report.cpus[0].0, 2, "slot 0 is the CPU named first");
        assert!(
            report
                .cpus
                .iter()
                .all(|(_, o)| o.allocs >= u64::from(ITERATIONS) * 10)
        );
        let line = report.to_string();
        assert!(
            line.starts_with("4 CPUs x 256 rounds, ops per CPU 2:"),
            "{line}"
        );
        assert!(
            report
                .cpus
                .iter()
                .all(|(_, o)| o.handle >= u64::from(HANDLE_ROUNDS) * 8),
            "{line}"
        );
        // Each handle round moves 2 x HELD frames (each allocated, then freed by its CPU or by
        // the next), every eighth round also a HANDLE_BULK bulk both ways; every eighth round
        // of either phase drains the next CPU, but the last handle round.
        let moved = u64::from(HANDLE_ROUNDS) * 2 * HELD as u64
            + u64::from(HANDLE_ROUNDS / 8) * 2 * HANDLE_BULK as u64;
        let handle_ops: u64 = report
            .cpus
            .iter()
            .map(|(_, o)| o.handle + o.handle_remote)
            .sum();
        assert_eq!(handle_ops, 4 * moved, "{line}");
        let drains = u64::from(ITERATIONS / 8 + HANDLE_ROUNDS / 8 - 1);
        assert!(
            report.cpus.iter().all(|(_, o)| o.drains == drains),
            "{line}"
        );
        // Every idle CPU ended its rounds holding frames (half of each round's are freed into
        // its own pageblock), and each was kicked and gave them back.
        assert_eq!((report.holding, report.woken), (3, 3), "{line}");
        assert!(report.kicks >= 3, "{line}");
    }
}
