//! What the unikernel does once it knows its machine, written against numaframe's public API
//! only and free of anything platform-specific, so the host tests run it on a simulated machine
//! too.

use alloc::collections::BTreeMap;
use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;
use core::fmt::{self, Write};

use numaframe::HugeSize;
use numaframe::hugetlb::cmdline::{self, CmdlineError};
use numaframe::hugetlb::{JobCursor, ReservationPlan};
use numaframe::interleave::Weights;
use numaframe::policy::{Policy, TaskPolicy};
use numaframe::zonelist::FallbackOptions;
use numaframe::{
    AllocFlags, BulkFreeError, FreeError, InvariantError, Machine, MemoryRange, NodeId, NodeInfo,
    NodeMask, Order, PAGE_SIZE, Pfn, PhysRange, PolicyError, ZoneKind,
};

/// The most NUMA nodes the unikernel's static tables hold.
pub const MAX_NODES: usize = 32;
/// The most memory ranges (after carving out reservations).
pub const MAX_RANGES: usize = 64;
/// The most CPUs.
pub const MAX_CPUS: usize = 256;
/// Pieces of memory smaller than this many frames are left unused: too small to be worth their
/// metadata.
pub const MIN_RANGE_FRAMES: u64 = 64;

/// numaframe's bootargs, from `/chosen/bootargs` (QEMU's `-append`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Options {
    /// `numaframe.linux_boot_order`: print the order Linux prints at boot (no CPU penalty).
    pub linux_boot_order: bool,
    weights: [u8; MAX_NODES],
    nweights: usize,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            linux_boot_order: false,
            weights: [1; MAX_NODES],
            nweights: 0,
        }
    }
}

/// A `numaframe.` bootarg the unikernel does not understand.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BadArg<'a>(pub &'a str);

impl fmt::Display for BadArg<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "bad bootarg `{}` (numaframe.linux_boot_order[=0|1], numaframe.weights=W,W,...)",
            self.0
        )
    }
}

impl Options {
    /// Reads the `numaframe.*` words of a kernel command line; other words are left to others
    /// (`hugepages=` is read by [`reserve_hugepages`]).
    ///
    /// # Errors
    /// The first `numaframe.` word that is unknown or malformed.
    pub fn from_bootargs(args: &str) -> Result<Options, BadArg<'_>> {
        let mut o = Options::default();
        for word in args.split_ascii_whitespace() {
            let Some(rest) = word.strip_prefix("numaframe.") else {
                continue;
            };
            let (key, value) = rest.split_once('=').unwrap_or((rest, ""));
            match key {
                "linux_boot_order" => {
                    o.linux_boot_order = match value {
                        "" | "1" | "y" | "on" => true,
                        "0" | "n" | "off" => false,
                        _ => return Err(BadArg(word)),
                    };
                }
                "weights" => {
                    o.nweights = 0;
                    for w in value.split(',') {
                        let w = w.parse::<u8>().ok().filter(|w| *w > 0);
                        match (w, o.weights.get_mut(o.nweights)) {
                            (Some(w), Some(slot)) => *slot = w,
                            _ => return Err(BadArg(word)),
                        }
                        o.nweights += 1;
                    }
                }
                _ => return Err(BadArg(word)),
            }
        }
        Ok(o)
    }

    /// The fallback options these bootargs ask for.
    pub fn fallback(&self) -> FallbackOptions {
        FallbackOptions {
            linux_boot_order: self.linux_boot_order,
        }
    }

    /// The weighted-interleave weights given (node `i` weighs `weights()[i]`; others 1).
    pub fn weights(&self) -> &[u8] {
        &self.weights[..self.nweights]
    }
}

/// The frames covering the bytes `base..base + size`, rounded outwards.
pub fn frames_covering(base: u64, size: u64) -> PhysRange {
    let start = base / PAGE_SIZE;
    let end = base.saturating_add(size).div_ceil(PAGE_SIZE);
    PhysRange::new(Pfn::new(start), Pfn::new(end.max(start))).unwrap_or_default()
}

/// Writes the parts of `ranges` outside every `reserved` range into `out`, dropping pieces of
/// fewer than [`MIN_RANGE_FRAMES`] frames. Returns how many it wrote, or `None` if `out` is too
/// small.
pub fn carve(
    ranges: &[MemoryRange],
    reserved: &[PhysRange],
    out: &mut [MemoryRange],
) -> Option<usize> {
    fn emit(
        piece: MemoryRange,
        reserved: &[PhysRange],
        out: &mut [MemoryRange],
        n: &mut usize,
    ) -> Option<()> {
        let Some((r, rest)) = reserved.split_first() else {
            if piece.range.frames() >= MIN_RANGE_FRAMES {
                *out.get_mut(*n)? = piece;
                *n += 1;
            }
            return Some(());
        };
        if !piece.range.overlaps(r) {
            return emit(piece, rest, out, n);
        }
        let below = piece.range.split_at(r.start()).0;
        let above = piece.range.split_at(r.end()).1;
        for part in [below, above] {
            if !part.is_empty() {
                emit(
                    MemoryRange {
                        node: piece.node,
                        range: part,
                    },
                    rest,
                    out,
                    n,
                )?;
            }
        }
        Some(())
    }
    let mut n = 0;
    for r in ranges {
        emit(*r, reserved, out, &mut n)?;
    }
    Some(n)
}

/// Marks as memoryless the nodes that `ranges` no longer give memory to (all of it reserved).
pub fn sync_memory_states(infos: &mut [NodeInfo], ranges: &[MemoryRange]) {
    for (i, info) in infos.iter_mut().enumerate() {
        info.has_memory = ranges.iter().any(|r| r.node.index() == i);
    }
}

/// Something the unikernel's self-checks caught.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failure {
    /// A policy was refused.
    Policy(PolicyError),
    /// A free was refused.
    Free(FreeError),
    /// A bulk free was refused.
    BulkFree(BulkFreeError),
    /// The allocator's invariants broke.
    Invariant(InvariantError),
    /// The hugepage command line was refused.
    Cmdline(CmdlineError),
    /// An allocation that must succeed on this machine did not.
    OutOfMemory(&'static str),
    /// A heap check did not add up.
    Heap(&'static str),
    /// Writing to the console failed.
    Console,
    /// A frame from a CPU's own node came from elsewhere although the node has memory.
    Placement {
        /// The CPU's node.
        want: NodeId,
        /// Where the frame is.
        got: Option<NodeId>,
        /// The frame.
        pfn: Pfn,
    },
    /// A frame no longer holds the stamp its owner wrote: two owners at once.
    Stamp {
        /// The frame.
        pfn: Pfn,
        /// What its owner wrote.
        stamp: u64,
        /// What it holds.
        found: u64,
    },
    /// The platform cannot map a frame the machine handed out.
    Unmapped(Pfn),
    /// The machine has no CPU of this index.
    NoCpu(usize),
    /// The SMP run broke down.
    Smp(&'static str),
    /// Atomic or spin-locked increments of all CPUs went missing.
    Atomics {
        /// Increments made.
        want: u64,
        /// What the atomic counter holds.
        counted: u64,
        /// What the locked counter holds.
        locked: u64,
    },
    /// Frames are still cached after draining every CPU.
    Cached(u64),
    /// A node's huge-page pools are not as before the run.
    HugePool {
        /// The node.
        node: NodeId,
    },
    /// A zone's free pages are not as before the run.
    FreePages {
        /// The node.
        node: NodeId,
        /// The zone.
        zone: ZoneKind,
        /// Free pages before.
        before: u64,
        /// Free pages after.
        after: u64,
    },
    /// A node's free pages plus its heap frames are not as before the run.
    FreePagesWithHeap {
        /// The node.
        node: NodeId,
        /// Free pages and heap frames before.
        before: u64,
        /// Free pages and heap frames after.
        after: u64,
    },
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Policy(e) => write!(f, "policy: {e}"),
            Failure::Free(e) => write!(f, "free: {e}"),
            Failure::BulkFree(e) => write!(f, "bulk free: {e}"),
            Failure::Invariant(e) => write!(f, "invariant: {e}"),
            Failure::Cmdline(e) => write!(f, "hugepages: {e}"),
            Failure::OutOfMemory(what) => write!(f, "out of memory: {what}"),
            Failure::Heap(what) => write!(f, "heap: {what}"),
            Failure::Console => f.write_str("console write failed"),
            Failure::Placement { want, got, pfn } => {
                write!(f, "frame {pfn:?} of node {want} is on node {got:?}")
            }
            Failure::Stamp { pfn, stamp, found } => write!(
                f,
                "frame {pfn:?} holds {found:#x}, its owner wrote {stamp:#x}"
            ),
            Failure::Unmapped(pfn) => write!(f, "frame {pfn:?} cannot be mapped"),
            Failure::NoCpu(i) => write!(f, "the machine has no cpu{i}"),
            Failure::Smp(what) => write!(f, "smp: {what}"),
            Failure::Atomics {
                want,
                counted,
                locked,
            } => write!(
                f,
                "{want} increments left {counted} in the atomic counter and {locked} in the locked one"
            ),
            Failure::Cached(n) => write!(f, "{n} frames still cached after draining every CPU"),
            Failure::HugePool { node } => write!(f, "node {node}: huge-page pools changed"),
            Failure::FreePages {
                node,
                zone,
                before,
                after,
            } => write!(
                f,
                "node {node} {zone:?}: {after} free pages, {before} before"
            ),
            Failure::FreePagesWithHeap {
                node,
                before,
                after,
            } => write!(
                f,
                "node {node}: {after} free pages and heap frames, {before} before"
            ),
        }
    }
}

impl From<fmt::Error> for Failure {
    fn from(_: fmt::Error) -> Self {
        Failure::Console
    }
}

/// Prints the kernel-format fallback line of every node, ascending.
pub fn print_zonelists(machine: &Machine<'_>, out: &mut dyn Write) -> fmt::Result {
    let mut result = Ok(());
    machine.for_each_fallback_line(|line| {
        if result.is_ok() {
            result = writeln!(out, "{line}");
        }
    });
    result
}

/// Huge pages reserved, per size.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HugeReport {
    /// Pages asked for: 2 MiB, 1 GiB.
    pub requested: [u64; 2],
    /// Pages reserved: 2 MiB, 1 GiB.
    pub allocated: [u64; 2],
}

/// Reserves the huge pages that `hugepagesz=`/`hugepages=` in `bootargs` ask for, with the
/// core's [`ReservationPlan`] (1 GiB pages first; a node list on each node alone, a plain count
/// spread over the nodes as Linux does), runs its jobs on this one CPU, and prints Linux's
/// lines plus the count on each node.
///
/// # Errors
/// [`Failure::Cmdline`] for a command line numaframe's parser refuses (a node outside the
/// machine included), [`Failure::Console`] if printing fails.
pub fn reserve_hugepages(
    machine: &Machine<'_>,
    bootargs: &str,
    out: &mut dyn Write,
) -> Result<HugeReport, Failure> {
    let config = cmdline::parse(bootargs).map_err(Failure::Cmdline)?;
    let mut plan = ReservationPlan::new(&config, machine).map_err(Failure::Cmdline)?;
    while let Some(batch) = plan.next_batch(machine) {
        // Any number of CPUs could share the batch through the cursor; here one does.
        batch.work(machine, &JobCursor::new());
    }
    let report = plan.report(machine);
    report.write_to(out)?;
    let mut r = HugeReport::default();
    for (i, size) in [HugeSize::Size2M, HugeSize::Size1G].into_iter().enumerate() {
        r.requested[i] = report.requested(size);
        r.allocated[i] = report.allocated(size);
    }
    for node in machine.topology().node_ids() {
        let n2 = machine.huge_counts(node, HugeSize::Size2M).total;
        let n1 = machine.huge_counts(node, HugeSize::Size1G).total;
        if n2 + n1 > 0 {
            writeln!(
                out,
                "HugeTLB: node {node}: {n2} x 2.00 MiB, {n1} x 1.00 GiB"
            )?;
        }
    }
    Ok(r)
}

/// Frames placed under one policy, per node.
struct Tally([u64; MAX_NODES]);

impl fmt::Display for Tally {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for (node, &n) in self.0.iter().enumerate() {
            if n > 0 {
                write!(f, "{}{node}:{n}", if first { "" } else { " " })?;
                first = false;
            }
        }
        Ok(())
    }
}

/// Allocates and frees frames under every policy on behalf of a CPU of `cpu_node`, printing
/// where they landed: 16 single frames, one order-4 block and a bulk of 240, plus a huge page
/// when the pools hold one. Every frame is freed and the invariants checked afterwards.
///
/// # Errors
/// A [`Failure`] if an allocation that must succeed fails, or a free or check is refused.
pub fn exercise_policies(
    machine: &Machine<'_>,
    cpu_node: NodeId,
    weights: &[u8],
    out: &mut dyn Write,
) -> Result<u64, Failure> {
    let memory = machine.memory_nodes();
    let ids: Vec<NodeId> = memory.iter().collect();
    let (first, last) = match (ids.first(), ids.last()) {
        (Some(f), Some(l)) => (*f, *l),
        _ => return Err(Failure::OutOfMemory("no node has memory")),
    };
    machine.set_weights(Weights::new(weights).map_err(Failure::Policy)?);
    let two = NodeMask::from_nodes(ids.iter().copied().take(2));
    let policies = [
        ("local", Policy::Local),
        ("preferred", Policy::Preferred(last)),
        ("preferred-many", Policy::PreferredMany(two)),
        ("bind", Policy::Bind(NodeMask::single(first))),
        ("interleave", Policy::Interleave(memory)),
        ("weighted-interleave", Policy::WeightedInterleave(memory)),
    ];
    let mut total = 0;
    for (name, policy) in policies {
        let mut task = TaskPolicy::new(machine, policy, false).map_err(Failure::Policy)?;
        let mut tally = Tally([0; MAX_NODES]);
        let mut count = |pfn: Pfn, frames: u64| {
            if let Some(n) = machine.node_of(pfn)
                && let Some(t) = tally.0.get_mut(n.index())
            {
                *t += frames;
            }
        };
        let mut singles = [Pfn::new(0); 16];
        for slot in &mut singles {
            *slot = task
                .alloc(machine, cpu_node, Order::ZERO, AllocFlags::empty())
                .ok_or(Failure::OutOfMemory("single frame"))?;
            count(*slot, 1);
        }
        let block = task
            .alloc(machine, cpu_node, Order::new(4), AllocFlags::empty())
            .ok_or(Failure::OutOfMemory("order-4 block"))?;
        count(block, 16);
        let mut bulk = [Pfn::new(0); 240];
        let got = task
            .alloc_bulk(machine, cpu_node, AllocFlags::empty(), &mut bulk)
            .placed;
        if got != bulk.len() {
            return Err(Failure::OutOfMemory("bulk"));
        }
        for p in &bulk {
            count(*p, 1);
        }
        let huge = task.alloc_huge(machine, cpu_node, HugeSize::Size2M);
        if let Some(h) = huge {
            count(h, 512);
        }
        let frames: u64 = tally.0.iter().sum();
        writeln!(out, "policy {name}: {frames} frames on nodes {tally}")?;
        for p in singles {
            machine.free(p, Order::ZERO).map_err(Failure::Free)?;
        }
        machine.free(block, Order::new(4)).map_err(Failure::Free)?;
        machine.free_bulk(&bulk).map_err(Failure::BulkFree)?;
        if let Some(h) = huge {
            machine
                .free_huge(h, HugeSize::Size2M)
                .map_err(Failure::Free)?;
        }
        total += frames;
    }
    machine.check_invariants().map_err(Failure::Invariant)?;
    Ok(total)
}

/// Uses the global allocator (a numaframe `NumaHeap` in the unikernel): a vector, a map of
/// strings, a string. Returns the bytes it allocated at the peak, roughly.
///
/// # Errors
/// [`Failure::Heap`] if what was stored does not read back.
pub fn exercise_heap() -> Result<usize, Failure> {
    let v: Vec<u64> = (0..20_000).collect();
    let sum: u64 = v.iter().sum();
    if sum != 20_000 * 19_999 / 2 {
        return Err(Failure::Heap("vector sum"));
    }
    let mut map = BTreeMap::new();
    for i in 0..1_000u32 {
        map.insert(i, format!("frame {i:#x}"));
    }
    if map.get(&999).map(String::as_str) != Some("frame 0x3e7") {
        return Err(Failure::Heap("map lookup"));
    }
    let mut s = String::new();
    for (k, text) in map.iter().take(100) {
        s.push_str(text);
        s.push(if k % 2 == 0 { ',' } else { ';' });
    }
    if !s.starts_with("frame 0x0,frame 0x1;") {
        return Err(Failure::Heap("string"));
    }
    let big: Vec<u8> = alloc::vec![0x5a; 1 << 20];
    if big.iter().any(|b| *b != 0x5a) {
        return Err(Failure::Heap("1 MiB buffer"));
    }
    Ok(v.capacity() * 8 + map.len() * 32 + s.capacity() + big.len())
}

#[cfg(test)]
mod tests {
    use std::alloc::{Layout, alloc_zeroed};
    use std::ptr::NonNull;

    use numaframe::{BootOptions, PhysMemory, Topology};

    use super::*;

    /// Metadata regions from the host's heap, never freed.
    struct HostMemory;
    // SAFETY: every call returns a fresh, page-aligned, zeroed allocation of the range's size
    // that nothing else uses and that is never freed.
    unsafe impl PhysMemory for HostMemory {
        fn map(&self, range: PhysRange) -> Option<NonNull<u8>> {
            let layout = Layout::from_size_align(range.bytes() as usize, 4096).ok()?;
            // SAFETY: the layout has a non-zero size (ranges are never empty here).
            NonNull::new(unsafe { alloc_zeroed(layout) })
        }
    }

    fn r(node: usize, start: u64, end: u64) -> MemoryRange {
        MemoryRange {
            node: NodeId::new(node),
            range: PhysRange::new(Pfn::new(start), Pfn::new(end)).unwrap(),
        }
    }

    #[test]
    fn bootargs() {
        let o = Options::from_bootargs(
            "console=ttyAMA0 numaframe.linux_boot_order hugepages=4 numaframe.weights=3,3,1,1",
        )
        .unwrap();
        assert!(o.linux_boot_order);
        assert_eq!(o.weights(), &[3, 3, 1, 1]);
        assert!(!Options::from_bootargs("").unwrap().linux_boot_order);
        assert!(
            !Options::from_bootargs("numaframe.linux_boot_order=0")
                .unwrap()
                .linux_boot_order
        );
        assert_eq!(
            Options::from_bootargs("numaframe.weights=1,0"),
            Err(BadArg("numaframe.weights=1,0"))
        );
        assert_eq!(
            Options::from_bootargs("numaframe.bogus"),
            Err(BadArg("numaframe.bogus"))
        );
    }

    #[test]
    fn carving_splits_and_drops_slivers() {
        let ranges = [r(0, 0x40000, 0x80000), r(1, 0x80000, 0xc0000)];
        let dtb = frames_covering(0x4000_0000, 0x10_0000);
        let image = frames_covering(0x4020_0000, 0x12_3456);
        let sliver = frames_covering(0x8000_0000 + 10 * 4096, 4096);
        let mut out = [r(0, 0, 1); 8];
        let n = carve(&ranges, &[dtb, image, sliver], &mut out).unwrap();
        assert_eq!(
            &out[..n],
            &[
                r(0, 0x40100, 0x40200),
                r(0, 0x40324, 0x80000),
                r(1, 0x8000b, 0xc0000)
            ]
        );
        let tiny = [r(0, 0x40000, 0x40010)];
        assert_eq!(
            carve(&tiny, &[], &mut out),
            Some(0),
            "16 frames is a sliver"
        );
        assert_eq!(carve(&ranges, &[], &mut out[..1]), None);
        let mut infos = [NodeInfo::default(); 3];
        sync_memory_states(&mut infos, &out[..1]);
        assert!(infos[0].has_memory && !infos[1].has_memory && !infos[2].has_memory);
        assert_eq!(
            frames_covering(4095, 2),
            PhysRange::new(Pfn::new(0), Pfn::new(2)).unwrap()
        );
    }

    /// The whole run, on a host machine shaped like the QEMU test's CPU-less/memoryless layout.
    #[test]
    fn the_run_works_on_a_hosted_machine() {
        let distances = [
            10, 20, 15, 20, 20, 10, 25, 12, 15, 25, 10, 25, 20, 12, 25, 10,
        ];
        let infos = [
            NodeInfo {
                has_cpus: true,
                has_memory: true,
                ..NodeInfo::default()
            },
            NodeInfo {
                has_cpus: true,
                has_memory: true,
                ..NodeInfo::default()
            },
            NodeInfo {
                has_cpus: false,
                has_memory: true,
                ..NodeInfo::default()
            },
            NodeInfo {
                has_cpus: true,
                has_memory: false,
                ..NodeInfo::default()
            },
        ];
        // Three nodes of 64 MiB from 1 GiB.
        let ranges =
            [0, 1, 2].map(|i| r(i, 0x40000 + i as u64 * 0x4000, 0x44000 + i as u64 * 0x4000));
        let topo = Topology::new(&distances, &infos).unwrap();
        let cpus = [NodeId::new(0), NodeId::new(1), NodeId::new(3)];
        let opts = BootOptions {
            cpus: &cpus,
            ..BootOptions::default()
        };
        let m = Machine::boot(topo, &HostMemory, &ranges, opts).unwrap();
        let mut text = String::new();
        print_zonelists(&m, &mut text).unwrap();
        assert_eq!(text.lines().count(), 4);
        assert!(
            text.starts_with("Fallback order for Node 0: 0 2 "),
            "{text}"
        );
        let rep = reserve_hugepages(&m, "hugepagesz=2M hugepages=5", &mut text).unwrap();
        assert_eq!(rep.allocated, [5, 0]);
        assert_eq!(rep.requested, [5, 0]);
        assert!(text.contains("HugeTLB: registered 2.00 MiB page size, pre-allocated 5 pages"));
        assert!(text.contains("HugeTLB: node 0: 2 x 2.00 MiB, 0 x 1.00 GiB"));
        let frames = exercise_policies(&m, NodeId::new(3), &[2, 1, 1], &mut text).unwrap();
        assert!(frames >= 6 * 272, "{text}");
        assert!(text.contains("policy bind: "), "{text}");
        assert!(exercise_heap().unwrap() > 1 << 20);
        assert!(matches!(
            reserve_hugepages(&m, "hugepages=9:1", &mut text),
            Err(Failure::Cmdline(_))
        ));
    }
}
