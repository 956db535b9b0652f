//! The `ops` target: operation sequences against a small machine, checked after every
//! operation against a reference model.
//!
//! The model is a map of the blocks handed out (start frame → order, kind, node). It is the
//! oracle for every free: a free is valid exactly when the model holds a block of that order and
//! kind at that frame (and, for a per-CPU free, the CPU is the machine's). A valid free must
//! succeed; anything else is misuse and must return `Err` with the allocator's counters (free
//! pages, buddyinfo, pools, caches) unchanged. Every allocation must hand out an aligned block
//! owned by the machine that overlaps no block the model holds.
//!
//! After every operation, `check_invariants()` must pass and every frame must be accounted for
//! exactly once: `free + cached + handed-out small blocks + pool pages == managed`; no zone counts
//! more dirty frames than free ones. At the end everything is given back, and every zone's
//! buddyinfo must return to its fully merged state.
//!
//! The machine clears through a recording clearer (the sparse memory has no frames to write):
//! a scrub may clear only free frames of its node, never a block the model holds, and never more
//! than its budget allows; any other operation may clear only inside the blocks it hands out.
//!
//! The `handles` target runs the same operations mixed with claimed CPU handles
//! ([`HandleOp`]): claims and drops, allocations, bulks, checked, clean and unchecked frees
//! and bulk frees through a handle, judged by the same model. While handles live, the
//! accounting adds the free frames their caches hold, and an offline may also find busy the
//! pageblocks a claimed cache holds in its range. A refused free through a handle may first
//! honour a drain request posted before it (frames move from its cache to the zones), so it is
//! judged by the frames it must not move: every frame stays free, cached or handed out as it
//! was.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Mutex, OnceLock};

use arbitrary::{Arbitrary, Unstructured};
use numaframe::HugeSize;
use numaframe::addr::NR_ORDERS;
use numaframe::interleave::{IlState, Weights};
use numaframe::policy::{Policy, TaskPolicy};
use numaframe::zonelist::FallbackOptions;
use numaframe::{
    AllocFlags, BootError, BootOptions, ClaimError, CpuHandle, CpuId, CpuKick, FrameClearer,
    FreeError, Machine, MemoryRange, NodeId, NodeMask, OfflineError, OfflineOptions, Order,
    PAGE_SIZE, PcpConfig, Pfn, PhysRange, PolicyError, REPORT_CAPACITY, ReportError, ZoneKind,
};
use numaframe_testkit::{Snap, SparseMem, Spec, memory_range};

/// Nodes of the machine (the kit's `Spec::with_hot_add_target`): 0 and 1 with CPUs and memory,
/// 2 CPU-less and memoryless at boot (initiator 0), the target of hot-adds; CPUs 0, 1 and 2 on
/// nodes 0, 1 and 0. Ids 3.. are unknown to it.
pub const NODES: usize = 3;
/// How many CPUs the donor machine registers: the ones past the fuzzed machine's three are
/// unknown to it.
const DONOR_CPUS: usize = 6;
/// 4 GiB, where `Dma32` ends.
const DMA32_END: u64 = 1 << 20;
/// The largest physical frame numaframe accepts (2^52 bytes... of frames, see `BootError`).
const PFN_LIMIT: u64 = 1 << 52;
/// Most operations one input runs.
const MAX_OPS: usize = 256;
/// Most frames the hot-adds of one input may add (64 TiB, 2^16 sections). The invariant walk
/// after every operation visits every section, so an input that hot-added more could outlive
/// libFuzzer's timeout; a hot-add that would pass this is skipped, unless it is too large for
/// any span (2^36 frames or more) and so is refused without cost.
const HOT_ADD_BUDGET: u64 = 1 << 34;
/// The frames a span must hold fewer of.
const SPAN_LIMIT: u64 = 1 << 36;

/// The machine shapes an input can pick, as `(node, start, frames)` ranges.
const SHAPES: [&[(usize, u64, u64)]; 3] = [
    // Node 0 straddles 4 GiB (a `Dma32` and a `Normal` piece); node 1 is 2 MiB aligned.
    &[(0, DMA32_END - 1500, 2800), (1, 2 * DMA32_END, 3000)],
    // Unaligned, two ranges on node 1 in one zone.
    &[(0, 3, 2100), (1, 4096 + 7, 1300), (1, 8192 + 512, 1024)],
    // Node 1 holds one 1 GiB block (and a bit): gigantic pages, lazy section metadata.
    &[(0, 0, 3000), (1, DMA32_END, (1 << 18) + 2000)],
];

/// Everything an input decodes to.
#[derive(Arbitrary, Debug)]
pub struct Input {
    header: Header,
    ops: Vec<Op>,
}

/// What every input decodes before its operations: the machine's shape and options. (Its fields
/// decode as they did when they were `Input`'s own, so saved inputs keep their meaning.)
#[derive(Arbitrary, Debug)]
struct Header {
    shape: u8,
    /// The byte fresh metadata regions are filled with.
    fill: u8,
    min_free: u8,
    pcp: (u16, u16),
}

/// One operation. Node, CPU and order fields are reduced into range (and a bit beyond, for the
/// unknown ones) by the harness.
#[allow(missing_docs)]
#[derive(Arbitrary, Debug, Clone)]
pub enum Op {
    Alloc {
        node: u8,
        order: u8,
        flags: u8,
    },
    AllocFrom {
        cpu_node: u8,
        node: u8,
        order: u8,
        flags: u8,
    },
    AllocBulk {
        node: u8,
        n: u16,
        flags: u8,
    },
    AllocCpu {
        cpu: u8,
        order: u8,
        flags: u8,
    },
    /// Frees a block the model holds, through `via`, possibly with a wrong order or frame.
    Free {
        pick: u16,
        via: u8,
        mutate: u8,
    },
    /// Frees an arbitrary frame near an interesting address.
    FreeRaw {
        anchor: u8,
        offset: i32,
        order: u8,
        via: u8,
    },
    /// Frees again a block freed earlier.
    FreeAgain {
        pick: u16,
        via: u8,
    },
    /// Frees several order-0 blocks at once; `bad` slips in a misuse.
    FreeBulk {
        picks: Vec<u16>,
        bad: Option<(u8, u16)>,
    },
    DrainCpu {
        cpu: u8,
    },
    DrainAll,
    SetPcp {
        batch: u16,
        high: u16,
    },
    NewPolicy {
        slot: bool,
        mode: u8,
        mask: u8,
        node: u8,
        socket_aware: bool,
    },
    PolicyAlloc {
        slot: bool,
        cpu_node: u8,
        order: u8,
        flags: u8,
    },
    PolicyBulk {
        slot: bool,
        cpu_node: u8,
        n: u16,
        flags: u8,
    },
    PolicyHuge {
        slot: bool,
        cpu_node: u8,
        gig: bool,
    },
    SetIlState {
        slot: bool,
        prev: u16,
        left: u8,
    },
    SetWeights {
        weights: Vec<u8>,
    },
    AutoWeights {
        bandwidths: Vec<Option<u32>>,
        mask: u8,
    },
    Reserve {
        node: u8,
        gig: bool,
        count: u8,
    },
    AllocHuge {
        node: u8,
        gig: bool,
    },
    FreeHuge {
        pick: u16,
        gig: bool,
        mutate: u8,
    },
    Release {
        node: u8,
        gig: bool,
        count: u8,
    },
    HotAdd {
        node: u8,
        anchor: u8,
        offset: i32,
        len: u32,
        scale: u8,
        boot_order: bool,
    },
    /// Gives the metadata pools' spare memory back.
    TrimMetadata,
    /// A background scrub of `budget << scale` frames.
    Scrub {
        node: u8,
        budget: u16,
        scale: u8,
    },
    /// Free-page reporting of blocks of at least `order`, in batches of `capacity`; the host
    /// refuses the batch after `take` batches.
    Report {
        node: u8,
        order: u8,
        capacity: u8,
        take: u8,
    },
    /// Takes the `pick`-th span present and the `extend` next ones offline, the range made a
    /// bad one by `mutate` (an edge moved by `offset`, an empty range, or one near an anchor);
    /// a refused range stays isolated with `keep`.
    Offline {
        pick: u8,
        extend: u8,
        mutate: u8,
        offset: i16,
        keep: bool,
        boot_order: bool,
    },
    /// Ends the isolation of the `pick`-th span present and the `extend` next ones.
    Unisolate {
        pick: u8,
        extend: u8,
    },
    /// Hot-adds a span that went offline back to its node.
    ReAdd {
        pick: u8,
        boot_order: bool,
    },
}

/// An input of the `handles` target: as [`Input`], with handle operations among the others.
#[derive(Arbitrary, Debug)]
pub struct HandleInput {
    header: Header,
    ops: Vec<HandleOp>,
}

/// One operation of the `handles` target: any of [`Op`], or one through the handle of CPU
/// `cpu` (reduced into range; an operation on a CPU without a live handle does nothing).
#[allow(missing_docs)]
#[derive(Arbitrary, Debug, Clone)]
pub enum HandleOp {
    Other(Op),
    /// Claims a CPU, possibly an unknown or a claimed one.
    Claim {
        cpu: u8,
    },
    /// Drops the CPU's handle.
    Release {
        cpu: u8,
    },
    Alloc {
        cpu: u8,
        order: u8,
        flags: u8,
    },
    AllocBulk {
        cpu: u8,
        n: u16,
        flags: u8,
    },
    /// Frees a block the model holds (or one freed before, with `again`), possibly with a
    /// wrong order or frame: `how` picks `free`, `free_clean`, or `free_unchecked` for a valid
    /// order-0 free (the checked `free` otherwise, as its contract demands).
    Free {
        cpu: u8,
        pick: u16,
        mutate: u8,
        how: u8,
        again: bool,
    },
    FreeBulk {
        cpu: u8,
        picks: Vec<u16>,
        bad: Option<(u8, u16)>,
    },
    /// Honours a drain request posted to the CPU, as an idle owner kicked by a drain does.
    Poll {
        cpu: u8,
    },
}

/// What kind of block the model holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Small,
    Huge(HugeSize),
}

#[derive(Clone, Copy, Debug)]
struct Block {
    order: Order,
    kind: Kind,
}

/// How a free is made.
#[derive(Clone, Copy, Debug)]
enum Via {
    Free,
    Cpu(CpuId),
    Bulk,
    Huge(HugeSize),
    /// `free_clean`.
    Clean,
    /// `free_cpu_clean`.
    CpuClean(CpuId),
}

/// Records the ranges the machine clears, for the harness to judge after each operation.
#[derive(Debug, Default)]
struct Recorder(Mutex<Vec<PhysRange>>);

impl FrameClearer for Recorder {
    fn clear(&self, range: PhysRange) {
        self.0.lock().expect("recorder").push(range);
    }
}

impl Recorder {
    fn take(&self) -> Vec<PhysRange> {
        std::mem::take(&mut *self.0.lock().expect("recorder"))
    }
}

/// Records the CPUs the machine kicks, for the harness to judge after each operation.
#[derive(Debug, Default)]
struct Kicks(Mutex<Vec<CpuId>>);

impl CpuKick for Kicks {
    fn kick(&self, cpu: CpuId) {
        self.0.lock().expect("kicks").push(cpu);
    }
}

impl Kicks {
    fn take(&self) -> Vec<CpuId> {
        std::mem::take(&mut *self.0.lock().expect("kicks"))
    }
}

/// CPU ids of a donor machine with more CPUs: those past the fuzzed machine's are unknown to it.
fn donor_cpus() -> &'static [CpuId] {
    static CPUS: OnceLock<Vec<CpuId>> = OnceLock::new();
    CPUS.get_or_init(|| {
        let mem = crate::mem::sparse(0);
        let spec = Spec::uniform(1, 4096, 0).with_cpus(&[0; DONOR_CPUS]);
        let opts = BootOptions {
            cpus: &spec.cpus,
            ..BootOptions::default()
        };
        let m = spec.boot_with(&mem, opts);
        (0..DONOR_CPUS).filter_map(|i| m.cpu(i)).collect()
    })
}

fn order_of(x: u8) -> Order {
    Order::try_new(x % (numaframe::MAX_ORDER + 1)).unwrap_or(Order::ZERO)
}

fn flags_of(x: u8) -> AllocFlags {
    AllocFlags::from_bits_truncate(u32::from(x))
}

fn size_of(gig: bool) -> HugeSize {
    if gig {
        HugeSize::Size1G
    } else {
        HugeSize::Size2M
    }
}

/// A node id: mostly the machine's, sometimes one it does not have.
fn node_of(x: u8) -> NodeId {
    NodeId::new(usize::from(x) % (NODES + 2))
}

/// Runs one input; panics on any broken promise.
pub fn run(data: &[u8]) {
    if let Ok(input) = Input::arbitrary_take_rest(Unstructured::new(data)) {
        run_input(&input);
    }
}

/// Runs one decoded input; panics on any broken promise.
pub fn run_input(input: &Input) {
    run_ops(&input.header, &input.ops);
}

/// Runs one input of the `handles` target; panics on any broken promise.
pub fn run_handles(data: &[u8]) {
    if let Ok(input) = HandleInput::arbitrary_take_rest(Unstructured::new(data)) {
        let _ = run_handle_input(&input);
    }
}

/// Runs one decoded input of the `handles` target; panics on any broken promise. Returns
/// which handle paths it reached.
pub fn run_handle_input(input: &HandleInput) -> Reached {
    run_ops(&input.header, &input.ops)
}

/// An operation the harness applies.
trait Step {
    /// Applies it; returns the operation whose clearing rule judges what it cleared.
    fn apply<'s>(&'s self, h: &mut Harness<'_, '_>) -> &'s Op;
}

impl Step for Op {
    fn apply<'s>(&'s self, h: &mut Harness<'_, '_>) -> &'s Op {
        h.apply(self);
        self
    }
}

impl Step for HandleOp {
    fn apply<'s>(&'s self, h: &mut Harness<'_, '_>) -> &'s Op {
        match self {
            HandleOp::Other(op) => op.apply(h),
            op => {
                h.apply_handle(op);
                // No scrub: it may clear only inside the blocks it hands out.
                &Op::DrainAll
            }
        }
    }
}

/// Boots the machine `input` describes, runs `ops` on it, checking after each, and gives
/// everything back; returns which handle paths the operations reached.
fn run_ops(input: &Header, ops: &[impl Step]) -> Reached {
    let shape = SHAPES[usize::from(input.shape) % SHAPES.len()];
    let spec = Spec::with_hot_add_target(
        shape
            .iter()
            .map(|&(node, start, frames)| memory_range(node, start, start + frames))
            .collect(),
    );
    let mem = crate::mem::sparse(input.fill);
    let opts = BootOptions {
        pcp: PcpConfig {
            batch: u32::from(input.pcp.0 % 300),
            high: u32::from(input.pcp.1 % 600),
        },
        min_free_kbytes: match input.min_free % 3 {
            0 => None,
            1 => Some(0),
            _ => Some(u64::from(input.min_free) * 4),
        },
        // Node 0 of the first shape has both zones: Dma32's protection off, Linux's default,
        // and every Normal page (ratio 1).
        lowmem_reserve_ratio: [0, 256, 32, 1][usize::from(input.min_free / 3 % 4)],
        ..spec.options()
    };
    let cleared = Recorder::default();
    let kicks = Kicks::default();
    let m = spec
        .boot_with(&mem, opts)
        .with_clearer(&cleared)
        .with_kick(&kicks);
    m.check_invariants().expect("invariants after boot");
    let mut h = Harness::new(&m, &mem, &spec.ranges);
    h.check();
    for op in ops.iter().take(MAX_OPS) {
        let rule = op.apply(&mut h);
        h.check();
        h.check_cleared(rule, &cleared.take());
        h.check_kicks(&kicks.take());
    }
    let reached = h.reached;
    h.teardown();
    reached
}

/// Whether `range` has a part, below or above 4 GiB, too large for any span.
fn too_large(range: PhysRange) -> bool {
    let above = range
        .end()
        .get()
        .saturating_sub(range.start().get().max(DMA32_END));
    above >= SPAN_LIMIT
}

struct Harness<'m, 'a> {
    m: &'m Machine<'a>,
    mem: &'a SparseMem,
    model: BTreeMap<u64, Block>,
    /// Blocks freed earlier, for double frees.
    freed: Vec<(Pfn, Order, Kind)>,
    /// Frames freed with `free_unchecked` and not handed out since: its contract forbids any
    /// other free of them until then, so no operation frees them (nor a block over them).
    unchecked: BTreeSet<u64>,
    /// Every span the machine has (the zone parts of the ranges given at boot or by a
    /// successful hot-add, split at 4 GiB, metadata included), with its node.
    present: Vec<(NodeId, PhysRange)>,
    /// The spans that went offline, for re-adds.
    gone: Vec<(NodeId, PhysRange)>,
    /// The spans an offline left isolated.
    isolated: Vec<PhysRange>,
    /// Frames the successful hot-adds added.
    hot_added: u64,
    /// Interesting frame numbers for raw frees and hot-adds.
    anchors: Vec<u64>,
    /// Per zone: the buddyinfo when everything is free (boot, plus what hot-adds added).
    full: Vec<[u64; NR_ORDERS]>,
    /// The machine's CPUs, then CPUs it does not know.
    cpus: Vec<CpuId>,
    known_cpus: usize,
    policies: [Option<TaskPolicy>; 2],
    /// The live handle of each of the machine's CPUs.
    handles: Vec<Option<CpuHandle<'m, 'a>>>,
    /// Per CPU: kicked, and its handle has not run since (the request waits).
    kicked: Vec<bool>,
    /// The CPU whose handle the current operation runs on.
    acting: Option<usize>,
    /// Which of the handle paths the operations reached.
    reached: Reached,
}

/// Which handle paths a run of the `handles` target reached, so that a hand-written sequence
/// can show it exercises what it says.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Reached {
    /// Valid frees through [`CpuHandle::free_unchecked`].
    pub unchecked: u32,
    /// Offlines refused as busy while a handle lived (judged by the claimed-CPU rule).
    pub claimed_busy: u32,
    /// Kicks of claimed CPUs.
    pub kicks: u32,
    /// Polls that honoured a drain request.
    pub polls: u32,
}

impl<'m, 'a> Harness<'m, 'a> {
    fn new(m: &'m Machine<'a>, mem: &'a SparseMem, ranges: &[MemoryRange]) -> Self {
        let boot = Snap::of(m);
        let present: Vec<(NodeId, PhysRange)> = ranges
            .iter()
            .flat_map(|r| zone_parts(r.range).map(|p| (r.node, p)))
            .collect();
        let mut anchors = vec![0, DMA32_END, 3 * DMA32_END, 1 << 40, PFN_LIMIT - 64];
        for r in ranges {
            anchors.push(r.range.start().get());
            anchors.push(r.range.end().get());
        }
        let known_cpus = m.cpu_count();
        let mut cpus: Vec<CpuId> = (0..known_cpus).filter_map(|i| m.cpu(i)).collect();
        cpus.extend(donor_cpus().iter().skip(known_cpus));
        Harness {
            m,
            mem,
            model: BTreeMap::new(),
            freed: Vec::new(),
            unchecked: BTreeSet::new(),
            present,
            gone: Vec::new(),
            isolated: Vec::new(),
            hot_added: 0,
            anchors,
            full: boot.zones.iter().map(|z| z.buddyinfo).collect(),
            cpus,
            known_cpus,
            policies: [None, None],
            handles: (0..known_cpus).map(|_| None).collect(),
            kicked: vec![false; known_cpus],
            acting: None,
            reached: Reached::default(),
        }
    }

    fn cpu(&self, x: u8) -> (CpuId, bool) {
        let i = usize::from(x) % self.cpus.len();
        (self.cpus[i], i < self.known_cpus)
    }

    /// The `pick`-th block of the model (wrapping), if any.
    fn pick(&self, pick: u16, filter: impl Fn(&Block) -> bool) -> Option<(Pfn, Block)> {
        let n = self.model.values().filter(|b| filter(b)).count();
        if n == 0 {
            return None;
        }
        self.model
            .iter()
            .filter(|(_, b)| filter(b))
            .nth(usize::from(pick) % n)
            .map(|(&p, &b)| (Pfn::new(p), b))
    }

    /// Records a block the machine handed out, checking it is aligned, owned by one node, and
    /// overlaps nothing handed out before.
    fn took(&mut self, pfn: Pfn, order: Order, kind: Kind) -> NodeId {
        assert!(pfn.is_aligned(order), "{pfn:?} is not aligned to {order:?}");
        let node = self
            .m
            .node_of(pfn)
            .unwrap_or_else(|| panic!("handed out {pfn:?}, which the machine does not own"));
        let last = Pfn::new(pfn.get() + order.frames() - 1);
        assert_eq!(
            self.m.node_of(last),
            Some(node),
            "block {pfn:?}/{order:?} leaves its node"
        );
        if let Some((&s, b)) = self.model.range(..=pfn.get()).next_back() {
            assert!(
                s + b.order.frames() <= pfn.get(),
                "{pfn:?}/{order:?} handed out while {:?}/{:?} is still out",
                Pfn::new(s),
                b.order
            );
        }
        if let Some((&s, b)) = self.model.range(pfn.get()..).next() {
            assert!(
                s >= pfn.get() + order.frames(),
                "{pfn:?}/{order:?} handed out while {:?}/{:?} is still out",
                Pfn::new(s),
                b.order
            );
        }
        let block = PhysRange::new(pfn, Pfn::new(pfn.get() + order.frames())).expect("ordered");
        assert!(
            !self.isolated.iter().any(|r| r.overlaps(&block)),
            "{pfn:?}/{order:?} handed out from isolated memory {:?}",
            self.isolated
        );
        self.model.insert(pfn.get(), Block { order, kind });
        let frames: Vec<u64> = self
            .unchecked
            .range(pfn.get()..pfn.get() + order.frames())
            .copied()
            .collect();
        for f in frames {
            self.unchecked.remove(&f);
        }
        node
    }

    /// `true` if a free of the block of `order` at `pfn` would cover a frame freed with
    /// `free_unchecked` and not handed out since (see `unchecked`).
    fn covers_unchecked(&self, pfn: Pfn, order: Order) -> bool {
        self.unchecked
            .range(pfn.get()..pfn.get().saturating_add(order.frames()))
            .next()
            .is_some()
    }

    fn took_flags(&mut self, pfn: Pfn, order: Order, flags: AllocFlags, preferred: NodeId) {
        let node = self.took(pfn, order, Kind::Small);
        if flags.contains(AllocFlags::THISNODE) {
            assert_eq!(node, preferred, "THISNODE allocation left the node");
        }
        if flags.contains(AllocFlags::DMA32) {
            assert!(
                pfn.get() + order.frames() <= DMA32_END,
                "DMA32 allocation {pfn:?} above 4 GiB"
            );
        }
    }

    fn apply(&mut self, op: &Op) {
        let m = self.m;
        match *op {
            Op::Alloc { node, order, flags } => {
                let (node, order, flags) = (node_of(node), order_of(order), flags_of(flags));
                let got = m.alloc(node, order, flags);
                self.allocated(got, node, order, flags);
            }
            Op::AllocFrom {
                cpu_node,
                node,
                order,
                flags,
            } => {
                let (node, order, flags) = (node_of(node), order_of(order), flags_of(flags));
                let got = m.alloc_from(node_of(cpu_node), node, order, flags);
                self.allocated(got, node, order, flags);
            }
            Op::AllocBulk { node, n, flags } => {
                let (node, flags) = (node_of(node), flags_of(flags));
                let mut out = vec![Pfn::new(u64::MAX); usize::from(n % 600)];
                let got = m.alloc_bulk(node, flags, &mut out);
                assert!(got <= out.len());
                if node.index() >= NODES {
                    assert_eq!(got, 0, "bulk on an unknown node");
                }
                for &p in &out[..got] {
                    self.took_flags(p, Order::ZERO, flags, node);
                }
            }
            Op::AllocCpu { cpu, order, flags } => {
                let (cpu, known) = self.cpu(cpu);
                let (order, flags) = (order_of(order), flags_of(flags));
                let got = m.alloc_cpu(cpu, order, flags);
                if !known {
                    assert_eq!(got, None, "allocation from an unknown CPU");
                }
                if let Some(p) = got {
                    let node = m.cpu_node(cpu).expect("known CPU");
                    self.took_flags(p, order, flags, node);
                }
            }
            Op::Free { pick, via, mutate } => {
                let Some((pfn, b)) = self.pick(pick, |_| true) else {
                    return;
                };
                let (mut pfn, mut order) = (pfn, b.order);
                match mutate {
                    0..=191 => {}
                    192..=223 => {
                        order = order_of(order.get().wrapping_add(1 + mutate % 3));
                    }
                    _ => pfn = Pfn::new(pfn.get() + 1 + u64::from(mutate % 7)),
                }
                let via = self.via(via, order, b.kind);
                self.free(pfn, order, via);
            }
            Op::FreeRaw {
                anchor,
                offset,
                order,
                via,
            } => {
                let base = self.anchors[usize::from(anchor) % self.anchors.len()];
                let pfn = Pfn::new(base.saturating_add_signed(i64::from(offset)));
                let order = order_of(order);
                let via = self.via(via, order, Kind::Small);
                self.free(pfn, order, via);
            }
            Op::FreeAgain { pick, via } => {
                if self.freed.is_empty() {
                    return;
                }
                let (pfn, order, kind) = self.freed[usize::from(pick) % self.freed.len()];
                let via = self.via(via, order, kind);
                self.free(pfn, order, via);
            }
            Op::FreeBulk { ref picks, bad } => self.free_bulk(picks, bad, None),
            Op::DrainCpu { cpu } => {
                let (cpu, known) = self.cpu(cpu);
                let before = Snap::of(m);
                m.drain_cpu(cpu);
                if !known {
                    assert_eq!(
                        Snap::of(m),
                        before,
                        "draining an unknown CPU changed the machine"
                    );
                }
            }
            Op::DrainAll => {
                m.drain_all();
                assert_eq!(m.cached_pages(), 0, "drain_all left frames cached");
            }
            Op::TrimMetadata => {
                let free = |m: &Machine<'_>| m.nodes().iter().map(|n| n.free_pages()).sum::<u64>();
                let (meta, before) = (m.metadata_bytes(), free(m));
                let gave = m.trim_metadata();
                assert_eq!(gave, meta - m.metadata_bytes(), "trim_metadata miscounted");
                assert_eq!(
                    free(m) - before,
                    gave / PAGE_SIZE,
                    "the metadata given back is not free memory"
                );
            }
            Op::SetPcp { batch, high } => m.set_pcp(PcpConfig {
                batch: u32::from(batch),
                high: u32::from(high),
            }),
            Op::NewPolicy {
                slot,
                mode,
                mask,
                node,
                socket_aware,
            } => self.new_policy(slot, mode, mask, node, socket_aware),
            Op::PolicyAlloc {
                slot,
                cpu_node,
                order,
                flags,
            } => {
                let Some(mut p) = self.policies[usize::from(slot)].take() else {
                    return;
                };
                let (cpu_node, order, flags) =
                    (node_of(cpu_node), order_of(order), flags_of(flags));
                if let Some(pfn) = p.alloc(m, cpu_node, order, flags) {
                    let node = self.took(pfn, order, Kind::Small);
                    if let Policy::Bind(mask) = p.policy() {
                        assert!(mask.contains(node), "Bind({mask:?}) allocated on {node:?}");
                    }
                    if flags.contains(AllocFlags::DMA32) {
                        assert!(pfn.get() + order.frames() <= DMA32_END, "DMA32 above 4 GiB");
                    }
                }
                self.policies[usize::from(slot)] = Some(p);
            }
            Op::PolicyBulk {
                slot,
                cpu_node,
                n,
                flags,
            } => {
                let Some(mut p) = self.policies[usize::from(slot)].take() else {
                    return;
                };
                let (cpu_node, flags) = (node_of(cpu_node), flags_of(flags));
                let mut out = vec![Pfn::new(u64::MAX); usize::from(n % 600)];
                let r = p.alloc_bulk(m, cpu_node, flags, &mut out);
                assert!(r.placed <= out.len());
                let most_calls = match p.policy() {
                    Policy::Local | Policy::Preferred(_) | Policy::Bind(_) => 1,
                    Policy::PreferredMany(_) => 2,
                    Policy::Interleave(mask) | Policy::WeightedInterleave(mask) => mask.count(),
                    other => panic!("no bound on the node calls of {other:?} yet"),
                };
                assert!(
                    r.node_calls <= most_calls,
                    "{:?}: {} node calls",
                    p.policy(),
                    r.node_calls
                );
                for &pfn in &out[..r.placed] {
                    let node = self.took(pfn, Order::ZERO, Kind::Small);
                    if let Policy::Bind(mask) = p.policy() {
                        assert!(
                            mask.contains(node),
                            "Bind({mask:?}) bulk landed on {node:?}"
                        );
                    }
                }
                self.policies[usize::from(slot)] = Some(p);
            }
            Op::PolicyHuge {
                slot,
                cpu_node,
                gig,
            } => {
                let Some(mut p) = self.policies[usize::from(slot)].take() else {
                    return;
                };
                let size = size_of(gig);
                if let Some(pfn) = p.alloc_huge(m, node_of(cpu_node), size) {
                    self.took(pfn, size.order(), Kind::Huge(size));
                }
                self.policies[usize::from(slot)] = Some(p);
            }
            Op::SetIlState { slot, prev, left } => {
                if let Some(p) = self.policies[usize::from(slot)].as_mut() {
                    let prev = NodeId::new(usize::from(prev) % numaframe::MAX_NODES);
                    p.set_il_state(IlState::from_raw(prev, left));
                }
            }
            Op::SetWeights { ref weights } => {
                let r = Weights::new(weights);
                match weights.iter().position(|&w| w == 0) {
                    _ if weights.len() > numaframe::MAX_NODES => assert_eq!(
                        r,
                        Err(PolicyError::WeightCount {
                            given: weights.len(),
                            nodes: numaframe::MAX_NODES
                        })
                    ),
                    Some(i) => assert_eq!(
                        r,
                        Err(PolicyError::ZeroWeight {
                            node: NodeId::new(i)
                        })
                    ),
                    None => {
                        let w = r.expect("weights 1..=255 are accepted");
                        for (i, &x) in weights.iter().enumerate() {
                            assert_eq!(w.get(NodeId::new(i)), x);
                        }
                        m.set_weights(w);
                    }
                }
            }
            Op::AutoWeights {
                ref bandwidths,
                mask,
            } => {
                let mask = mask_of(mask);
                let r = Weights::auto(bandwidths, &mask);
                let missing = mask
                    .iter()
                    .find(|n| bandwidths.get(n.index()).copied().flatten().is_none());
                match (mask.is_empty(), missing) {
                    _ if bandwidths.len() > numaframe::MAX_NODES => {
                        assert!(matches!(r, Err(PolicyError::WeightCount { .. })));
                    }
                    (true, _) => assert_eq!(r, Err(PolicyError::EmptyMask)),
                    (false, Some(node)) => {
                        assert_eq!(r, Err(PolicyError::MissingBandwidth { node }));
                    }
                    (false, None) => {
                        let w = r.expect("auto weights with every bandwidth");
                        assert!(mask.iter().all(|n| w.get(n) >= 1));
                        m.set_weights(w);
                    }
                }
            }
            Op::Reserve { node, gig, count } => {
                let (node, size) = (node_of(node), size_of(gig));
                let before = m.huge_counts(node, size);
                let got = m.reserve_huge(node, size, u64::from(count));
                assert!(got <= u64::from(count));
                let after = m.huge_counts(node, size);
                assert_eq!(
                    (after.total - before.total, after.free - before.free),
                    (got, got),
                    "reserve_huge reported {got} pages"
                );
            }
            Op::AllocHuge { node, gig } => {
                let size = size_of(gig);
                if let Some(pfn) = m.alloc_huge(node_of(node), size) {
                    self.took(pfn, size.order(), Kind::Huge(size));
                }
            }
            Op::FreeHuge { pick, gig, mutate } => {
                let Some((pfn, b)) = self.pick(pick, |_| true) else {
                    return;
                };
                let size = match (mutate % 4, b.kind) {
                    (0, _) => size_of(gig),
                    (_, Kind::Huge(s)) => s,
                    (_, Kind::Small) => size_of(b.order == Order::MAX),
                };
                let pfn = if mutate >= 240 {
                    Pfn::new(pfn.get() + u64::from(mutate % 3) + 1)
                } else {
                    pfn
                };
                self.free(pfn, size.order(), Via::Huge(size));
            }
            Op::Release { node, gig, count } => {
                let (node, size) = (node_of(node), size_of(gig));
                let before = m.huge_counts(node, size);
                let got = m.release_huge(node, size, u64::from(count));
                assert!(got <= u64::from(count) && got <= before.free);
                let after = m.huge_counts(node, size);
                assert_eq!(
                    (before.total - after.total, before.free - after.free),
                    (got, got)
                );
            }
            Op::Scrub {
                node,
                budget,
                scale,
            } => {
                let node = node_of(node);
                let budget = u64::from(budget) << (scale % 8);
                let before = Snap::of(m);
                let dirty = m.node(node).map_or(0, |n| n.dirty_pages());
                let left = m.scrub(node, budget);
                assert!(left <= dirty, "{left} dirty frames left of {dirty}");
                match m.node(node) {
                    Some(n) => assert_eq!(left, n.dirty_pages()),
                    None => assert_eq!(left, 0, "a scrub of an unknown node"),
                }
                // A scrub moves no frame: what was free is free, in the same blocks.
                assert_eq!(Snap::of(m), before, "a scrub changed the free lists");
            }
            Op::Report {
                node,
                order,
                capacity,
                take,
            } => self.report(
                node_of(node),
                order_of(order),
                usize::from(capacity) % 40,
                take,
            ),
            Op::HotAdd {
                node,
                anchor,
                offset,
                len,
                scale,
                boot_order,
            } => {
                let base = self.anchors[usize::from(anchor) % self.anchors.len()];
                let start = base.saturating_add_signed(i64::from(offset));
                let frames = u64::from(len) << (scale % 24);
                let range = PhysRange::new(Pfn::new(start), Pfn::new(start.saturating_add(frames)))
                    .expect("end >= start");
                if !too_large(range) && self.hot_added + range.frames() > HOT_ADD_BUDGET {
                    return;
                }
                let opts = FallbackOptions {
                    linux_boot_order: boot_order,
                };
                self.hot_add(node_of(node), range, opts);
            }
            Op::Offline {
                pick,
                extend,
                mutate,
                offset,
                keep,
                boot_order,
            } => {
                let range = self.pick_spans(pick, extend, mutate, offset);
                let opts = OfflineOptions {
                    keep_isolated: keep,
                    fallback: FallbackOptions {
                        linux_boot_order: boot_order,
                    },
                };
                self.offline(range, opts);
            }
            Op::Unisolate { pick, extend } => {
                let range = self.pick_spans(pick, extend, 0, 0);
                self.unisolate(range);
            }
            Op::ReAdd { pick, boot_order } => {
                if self.gone.is_empty() {
                    return;
                }
                let (node, range) = self.gone[usize::from(pick) % self.gone.len()];
                let opts = FallbackOptions {
                    linux_boot_order: boot_order,
                };
                self.hot_add(node, range, opts);
                assert_eq!(m.node_of(range.start()), Some(node), "{range:?} came back");
            }
        }
    }

    /// One operation through a CPU handle, judged by the model.
    fn apply_handle(&mut self, op: &HandleOp) {
        let m = self.m;
        match *op {
            HandleOp::Other(ref op) => self.apply(op),
            HandleOp::Claim { cpu } => {
                let (cpu, known) = self.cpu(cpu);
                let before = Snap::of(m);
                let held = known && self.handles[cpu.index()].is_some();
                match m.claim_cpu(cpu) {
                    Ok(h) => {
                        assert!(
                            known && !held,
                            "claimed {cpu} (known: {known}, held: {held})"
                        );
                        self.handles[cpu.index()] = Some(h);
                    }
                    Err(e) => {
                        let index = cpu.index() as u32;
                        let want = if known {
                            assert!(held, "claim of the free {cpu} refused: {e:?}");
                            ClaimError::Claimed { cpu: index }
                        } else {
                            ClaimError::UnknownCpu { cpu: index }
                        };
                        assert_eq!(e, want);
                        assert_eq!(Snap::of(m), before, "a refused claim changed the machine");
                    }
                }
            }
            HandleOp::Release { cpu } => {
                let Some(i) = self.handle_index(cpu) else {
                    return;
                };
                self.acts(i);
                self.handles[i] = None;
            }
            HandleOp::Alloc { cpu, order, flags } => {
                let Some(i) = self.handle_index(cpu) else {
                    return;
                };
                self.acts(i);
                let (order, flags) = (order_of(order), flags_of(flags));
                let Some(h) = self.handles[i].as_mut() else {
                    return;
                };
                let node = m.cpu_node(h.cpu()).expect("a claimed CPU is known");
                if let Some(p) = h.alloc(order, flags) {
                    self.took_flags(p, order, flags, node);
                }
            }
            HandleOp::AllocBulk { cpu, n, flags } => {
                let Some(i) = self.handle_index(cpu) else {
                    return;
                };
                self.acts(i);
                let flags = flags_of(flags);
                let Some(h) = self.handles[i].as_mut() else {
                    return;
                };
                let node = m.cpu_node(h.cpu()).expect("a claimed CPU is known");
                let mut out = vec![Pfn::new(u64::MAX); usize::from(n % 600)];
                let got = h.alloc_bulk(flags, &mut out);
                assert!(got <= out.len());
                for &p in &out[..got] {
                    self.took_flags(p, Order::ZERO, flags, node);
                }
            }
            HandleOp::Free {
                cpu,
                pick,
                mutate,
                how,
                again,
            } => {
                let Some(i) = self.handle_index(cpu) else {
                    return;
                };
                // A huge page of the model given to a handle is misuse, which the model judges.
                let (mut pfn, mut order) = if again {
                    let Some(&(pfn, order, _)) =
                        self.freed.get(usize::from(pick) % self.freed.len().max(1))
                    else {
                        return;
                    };
                    (pfn, order)
                } else {
                    let Some((pfn, b)) = self.pick(pick, |_| true) else {
                        return;
                    };
                    (pfn, b.order)
                };
                match mutate {
                    0..=191 => {}
                    192..=223 => order = order_of(order.get().wrapping_add(1 + mutate % 3)),
                    _ => pfn = Pfn::new(pfn.get() + 1 + u64::from(mutate % 7)),
                }
                self.handle_free(i, pfn, order, how);
            }
            HandleOp::FreeBulk {
                cpu,
                ref picks,
                bad,
            } => {
                let Some(i) = self.handle_index(cpu) else {
                    return;
                };
                if self.handles[i].is_some() {
                    self.free_bulk(picks, bad, Some(i));
                }
            }
            HandleOp::Poll { cpu } => {
                let Some(i) = self.handle_index(cpu) else {
                    return;
                };
                let kicked = self.kicked[i];
                self.acts(i);
                let Some(h) = self.handles[i].as_mut() else {
                    return;
                };
                let before = Snap::of(m);
                let cached = h.cached_pages();
                let asked = h.poll();
                // The only requests left waiting after an operation are those another CPU's
                // drain posted to a claimed one. Each kicked the CPU if its cache held a
                // pageblock (nothing since changed what it holds: only its handle does), so a
                // kick waits for every request that found free frames cached; one that found
                // none may wait unkicked (a cache of wholly allocated pageblocks is kicked).
                assert!(
                    asked == kicked || (asked && cached == 0),
                    "{}'s poll found a request: {asked}, with {cached} frames cached; kicked \
                     since its handle last ran: {kicked}",
                    h.cpu()
                );
                if asked {
                    self.reached.polls += 1;
                    assert_eq!(
                        h.cached_pages(),
                        0,
                        "a poll that honoured a drain kept frames"
                    );
                } else {
                    assert_eq!(
                        Snap::of(m),
                        before,
                        "a poll with nothing to honour changed the machine"
                    );
                }
            }
        }
    }

    /// The current operation calls CPU `i`'s handle, if it lives: every call honours a request
    /// waiting for it, so a kick since is for a new one.
    fn acts(&mut self, i: usize) {
        if self.handles[i].is_some() {
            self.acting = Some(i);
            self.kicked[i] = false;
        }
    }

    /// Judges the kicks of the last operation: each of a claimed CPU other than the one whose
    /// handle ran it (that handle honours its own request), and at most one per request: none
    /// while a kick waits for the CPU's handle to run.
    fn check_kicks(&mut self, kicks: &[CpuId]) {
        for &cpu in kicks {
            let i = cpu.index();
            assert!(
                self.handles.get(i).is_some_and(Option::is_some),
                "kicked {cpu}, which no handle holds"
            );
            assert_ne!(self.acting, Some(i), "{cpu}'s own walk kicked it");
            assert!(!self.kicked[i], "{cpu} kicked again before its handle ran");
            self.kicked[i] = true;
            self.reached.kicks += 1;
        }
        self.acting = None;
    }

    /// The index of the machine's CPU `x` names, as [`Harness::cpu`] names it; `None` for a
    /// CPU the machine does not know (which has no handle).
    fn handle_index(&self, x: u8) -> Option<usize> {
        let (cpu, known) = self.cpu(x);
        known.then_some(cpu.index())
    }

    /// Every frame's place that no operation may change by failing: free in a zone, cached
    /// (by a CPU or a live handle) or pooled, per zone, with the total.
    fn places(&self) -> (Vec<u64>, u64) {
        let m = self.m;
        let zones: Vec<u64> = m
            .nodes()
            .iter()
            .flat_map(|n| ZoneKind::ALL.map(|k| n.zone(k).counters().free))
            .collect();
        let pooled: u64 = m
            .nodes()
            .iter()
            .flat_map(|n| {
                HugeSize::ALL.map(|s| m.huge_counts(n.id(), s).total * s.order().frames())
            })
            .sum();
        let total = zones.iter().sum::<u64>() + m.cached_pages() + self.handle_cached() + pooled;
        (zones, total)
    }

    /// The free frames the live handles' caches hold.
    fn handle_cached(&self) -> u64 {
        self.handles
            .iter()
            .flatten()
            .map(CpuHandle::cached_pages)
            .sum()
    }

    /// A free through handle `i` (nothing without one), judged by the model: `how` picks
    /// `free`, `free_clean`, or, for a valid order-0 free only, `free_unchecked`.
    fn handle_free(&mut self, i: usize, pfn: Pfn, order: Order, how: u8) {
        if self.covers_unchecked(pfn, order) {
            return;
        }
        let held = self.model.get(&pfn.get()).copied();
        let valid = held.is_some_and(|b| b.order == order && b.kind == Kind::Small);
        let (_, before) = self.places();
        self.acts(i);
        let Some(h) = self.handles[i].as_mut() else {
            return;
        };
        let cpu = h.cpu();
        let unchecked = how.is_multiple_of(3) && valid && order == Order::ZERO;
        let result = if unchecked {
            self.reached.unchecked += 1;
            // SAFETY: the model holds `pfn` as an order-0 block handed out and not freed
            // since; the harness runs one operation at a time, and no operation frees `pfn`
            // (or a block over it) again until it is handed out again (`unchecked`).
            #[allow(unsafe_code)]
            unsafe {
                h.free_unchecked(pfn)
            }
        } else if how % 3 == 1 {
            h.free_clean(pfn, order)
        } else {
            h.free(pfn, order)
        };
        if valid {
            if let Err(e) = result {
                panic!("valid free of {pfn:?}/{order:?} through {cpu}'s handle refused: {e:?}");
            }
            self.model.remove(&pfn.get());
            if unchecked {
                self.unchecked.insert(pfn.get());
            } else {
                self.freed.push((pfn, order, Kind::Small));
            }
            return;
        }
        let Err(e) = result else {
            panic!(
                "misuse accepted: free of {pfn:?}/{order:?} through {cpu}'s handle, model holds {held:?}"
            );
        };
        assert_eq!(
            self.places().1,
            before,
            "a refused free ({e:?}) through {cpu}'s handle moved frames"
        );
        self.check_error(e, pfn, order, Via::Cpu(cpu), held, true);
    }

    /// The spans present, ascending.
    fn spans(&self) -> Vec<(NodeId, PhysRange)> {
        let mut v = self.present.clone();
        v.sort_by_key(|(_, r)| r.start());
        v
    }

    /// A range for offlining: from the `pick`-th span present through `extend % 3` more, or
    /// with `mutate` made a bad one.
    fn pick_spans(&self, pick: u8, extend: u8, mutate: u8, offset: i16) -> PhysRange {
        let spans = self.spans();
        let (start, end) = if spans.is_empty() || mutate >= 240 {
            let base = self.anchors[usize::from(pick) % self.anchors.len()];
            let start = base.saturating_add_signed(i64::from(offset));
            (start, start.saturating_add(u64::from(extend) << 9))
        } else {
            let i = usize::from(pick) % spans.len();
            let j = (i + usize::from(extend % 3)).min(spans.len() - 1);
            (spans[i].1.start().get(), spans[j].1.end().get())
        };
        let moved = |x: u64| x.saturating_add_signed(i64::from(offset));
        let (start, end) = match mutate {
            160..=191 => (moved(start), end),
            192..=223 => (start, moved(end)),
            224..=239 => (start, start),
            _ => (start, end),
        };
        PhysRange::new(Pfn::new(start), Pfn::new(end.max(start))).expect("ordered")
    }

    /// The rule a range to take offline (or unisolate) must follow, transcribed: not empty,
    /// every frame in a span, no span cut by it, none holding tables boot carved. The spans
    /// it covers, or the error.
    fn whole_spans(&self, range: PhysRange) -> Result<Vec<(NodeId, PhysRange)>, OfflineError> {
        if range.is_empty() {
            return Err(OfflineError::Empty);
        }
        // Every table boot carved: the machine's, each node's and each CPU's.
        let tables: Vec<PhysRange> = core::iter::once(self.m.machine_tables().frames)
            .chain(
                (0..self.m.nodes().len())
                    .filter_map(|i| self.m.node_tables(NodeId::new(i)))
                    .map(|t| t.frames),
            )
            .chain(
                (0..self.m.cpu_count())
                    .filter_map(|i| self.m.cpu_tables(self.m.cpu(i)?))
                    .map(|t| t.frames),
            )
            .collect();
        let spans: Vec<(NodeId, PhysRange)> = self
            .spans()
            .into_iter()
            .filter(|(_, s)| s.overlaps(&range))
            .collect();
        let mut at = range.start();
        for (_, s) in &spans {
            if s.start() < range.start() {
                return Err(OfflineError::Partial { pfn: range.start() });
            }
            if s.start() > at {
                return Err(OfflineError::Foreign { pfn: at });
            }
            if s.end() > range.end() {
                return Err(OfflineError::Partial { pfn: range.end() });
            }
            if tables.iter().any(|t| s.overlaps(t)) {
                return Err(OfflineError::Tables { start: s.start() });
            }
            at = s.end();
        }
        if at < range.end() {
            return Err(OfflineError::Foreign { pfn: at });
        }
        Ok(spans)
    }

    /// An offline, judged by the model: bad ranges are refused as the rule says, with nothing
    /// changed; a range holding blocks the model has handed out is refused as busy, with the
    /// pageblocks they touch and the first one's frame; any other range leaves, its nodes
    /// memoryless if it was their last memory, and its frames are the machine's no more.
    fn offline(&mut self, range: PhysRange, opts: OfflineOptions) {
        let m = self.m;
        let before = Snap::of(m);
        let want = self.whole_spans(range);
        let usable: Vec<PhysRange> = want
            .iter()
            .flatten()
            .map(|&(_, s)| usable_part(m, s))
            .collect();
        let result = m.offline(self.mem, range, opts);
        let spans = match want {
            Err(e) => {
                assert_eq!(result, Err(e), "offline of {range:?}");
                assert_eq!(
                    Snap::of(m),
                    before,
                    "a refused offline ({e:?}) changed the machine"
                );
                return;
            }
            Ok(spans) => spans,
        };
        // Pageblocks with a block of the model in the range, and the first frame in use.
        let mut pbs = std::collections::BTreeSet::new();
        let mut first = None;
        for (&p, b) in self.model.range(..range.end().get()) {
            let end = p + b.order.frames();
            if end <= range.start().get() {
                continue;
            }
            first = first.or(Some(Pfn::new(p)));
            pbs.extend((p >> 9)..=((end - 1) >> 9));
        }
        // A claimed cache's pageblocks in the range are busy too (at most its four slots), and
        // may come first.
        let claimed = self.handles.iter().flatten().count() as u64;
        match (result, first) {
            (Ok(()), None) => {}
            (Err(OfflineError::Busy { busy, pfn }), first) if claimed > 0 => {
                self.reached.claimed_busy += 1;
                let model = pbs.len() as u64;
                assert!(
                    (model.max(1)..=model + 4 * claimed).contains(&busy)
                        && range.contains(pfn)
                        && first.is_none_or(|f| pfn <= f),
                    "busy offline of {range:?} with {claimed} claimed CPUs: {busy} pageblocks \
                     from {pfn:?}, the model's {model} from {first:?}"
                );
                if opts.keep_isolated {
                    for (_, s) in &spans {
                        if !self.isolated.contains(s) {
                            self.isolated.push(*s);
                        }
                    }
                }
                return;
            }
            (Err(OfflineError::Busy { busy, pfn }), Some(f)) => {
                assert_eq!(
                    (busy, pfn),
                    (pbs.len() as u64, f),
                    "busy offline of {range:?}"
                );
                if opts.keep_isolated {
                    for (_, s) in &spans {
                        if !self.isolated.contains(s) {
                            self.isolated.push(*s);
                        }
                    }
                }
                return;
            }
            // Moving other memory's metadata out may need memory the nodes do not have.
            (Err(OfflineError::NoMetadata { node }), None) => {
                assert!(spans.iter().any(|(n, _)| *n == node), "{node:?}");
                if opts.keep_isolated {
                    self.isolated.extend(spans.iter().map(|(_, s)| *s));
                }
                return;
            }
            (r, _) => panic!("offline of {range:?} ({spans:?}): {r:?}, model holds {first:?}"),
        }
        for ((node, s), u) in spans.into_iter().zip(usable) {
            self.present.retain(|(_, r)| *r != s);
            self.isolated.retain(|r| *r != s);
            self.gone.push((node, s));
            assert_eq!(m.node_of(s.start()), None, "{s:?} left");
            let zone = node.index() * 2 + usize::from(s.start().get() >= DMA32_END);
            for (k, n) in greedy(u).iter().enumerate() {
                self.full[zone][k] -= n;
            }
            let left = self.present.iter().any(|(n, _)| *n == node);
            assert_eq!(m.memory_nodes().contains(node), left, "{node:?}'s memory");
        }
    }

    /// An unisolate, judged by the model: the rule of [`Harness::whole_spans`], then every
    /// span must be isolated; a refusal changes nothing.
    fn unisolate(&mut self, range: PhysRange) {
        let m = self.m;
        let before = Snap::of(m);
        let want = self.whole_spans(range).and_then(|spans| {
            match spans.iter().find(|(_, s)| !self.isolated.contains(s)) {
                Some((_, s)) => Err(OfflineError::NotIsolated { pfn: s.start() }),
                None => Ok(spans),
            }
        });
        let result = m.unisolate(range);
        match want {
            Err(e) => {
                assert_eq!(result, Err(e), "unisolate of {range:?}");
                assert_eq!(
                    Snap::of(m),
                    before,
                    "a refused unisolate changed the machine"
                );
            }
            Ok(spans) => {
                assert_eq!(result, Ok(()), "unisolate of {range:?}");
                self.isolated.retain(|r| !spans.iter().any(|(_, s)| s == r));
            }
        }
    }

    fn allocated(&mut self, got: Option<Pfn>, node: NodeId, order: Order, flags: AllocFlags) {
        if node.index() >= NODES {
            assert_eq!(got, None, "allocation preferring an unknown node");
        }
        if let Some(p) = got {
            self.took_flags(p, order, flags, node);
        }
    }

    fn via(&self, via: u8, order: Order, kind: Kind) -> Via {
        match via % 7 {
            0 | 1 => Via::Free,
            2 => Via::Cpu(self.cpu(via / 7).0),
            3 => Via::Bulk,
            5 => Via::Clean,
            6 => Via::CpuClean(self.cpu(via / 7).0),
            _ => Via::Huge(match kind {
                Kind::Huge(s) => s,
                Kind::Small => size_of(order == Order::MAX),
            }),
        }
    }

    /// One free through `via`, judged by the model.
    fn free(&mut self, pfn: Pfn, order: Order, via: Via) {
        let m = self.m;
        let (order, kind) = match via {
            Via::Bulk => (Order::ZERO, Kind::Small),
            Via::Huge(s) => (s.order(), Kind::Huge(s)),
            Via::Free | Via::Cpu(_) | Via::Clean | Via::CpuClean(_) => (order, Kind::Small),
        };
        if self.covers_unchecked(pfn, order) {
            return;
        }
        let known_cpu = match via {
            Via::Cpu(c) | Via::CpuClean(c) => c.index() < self.known_cpus,
            _ => true,
        };
        let held = self.model.get(&pfn.get()).copied();
        let valid = known_cpu && held.is_some_and(|b| b.order == order && b.kind == kind);
        let before = (!valid).then(|| Snap::of(m));
        let result = match via {
            Via::Free => m.free(pfn, order),
            Via::Cpu(c) => m.free_cpu(c, pfn, order),
            Via::Bulk => m.free_bulk(&[pfn]).map_err(|e| {
                assert_eq!(e.index, 0, "a one-frame bulk free names entry {}", e.index);
                e.error
            }),
            Via::Huge(s) => m.free_huge(pfn, s),
            Via::Clean => m.free_clean(pfn, order),
            Via::CpuClean(c) => m.free_cpu_clean(c, pfn, order),
        };
        if valid {
            if let Err(e) = result {
                panic!("valid free of {pfn:?}/{order:?} via {via:?} refused: {e:?}");
            }
            self.model.remove(&pfn.get());
            self.freed.push((pfn, order, kind));
            return;
        }
        let Err(e) = result else {
            panic!("misuse accepted: free of {pfn:?}/{order:?} via {via:?}, model holds {held:?}");
        };
        assert_eq!(
            Some(Snap::of(m)),
            before,
            "a refused free ({e:?}) changed the machine"
        );
        self.check_error(e, pfn, order, via, held, known_cpu);
    }

    /// The error a refused free must carry, as far as the model can tell.
    fn check_error(
        &self,
        e: FreeError,
        pfn: Pfn,
        order: Order,
        via: Via,
        held: Option<Block>,
        known_cpu: bool,
    ) {
        let m = self.m;
        let ok = if !known_cpu {
            matches!(e, FreeError::UnknownCpu { .. })
        } else if m.node_of(pfn).is_none() {
            e == FreeError::Foreign { pfn }
        } else if !pfn.is_aligned(order) {
            e == FreeError::Misaligned { pfn, order }
        } else if let Some(b) = held {
            match (b.kind, via) {
                (
                    Kind::Huge(_),
                    Via::Free | Via::Cpu(_) | Via::Bulk | Via::Clean | Via::CpuClean(_),
                ) => e == FreeError::HugePage { pfn },
                (Kind::Small, Via::Huge(_)) if b.order == order => {
                    e == FreeError::NotAllocated { pfn }
                }
                // A small frame of a pageblock lent to a CPU: the zone does not know its order
                // (the CPU's state array does), so it answers as for any frame that is not a
                // huge page; docs/promises.md allows either.
                (Kind::Small, Via::Huge(_)) => {
                    e == FreeError::NotAllocated { pfn }
                        || e == FreeError::WrongOrder {
                            pfn,
                            given: order,
                            allocated: b.order,
                        }
                }
                _ => {
                    e == FreeError::WrongOrder {
                        pfn,
                        given: order,
                        allocated: b.order,
                    }
                }
            }
        } else {
            matches!(
                e,
                FreeError::NotAllocated { .. } | FreeError::DoubleFree { .. }
            )
        };
        assert!(
            ok,
            "free of {pfn:?}/{order:?} via {via:?} (model: {held:?}) refused with {e:?}"
        );
    }

    /// A bulk free of order-0 blocks of the model, through the machine or handle `handle`,
    /// with `bad` slipping in a misuse. A refused bulk through the machine changes nothing; one
    /// through a handle moves no frame (it may honour a drain request first).
    fn free_bulk(&mut self, picks: &[u16], bad: Option<(u8, u16)>, handle: Option<usize>) {
        let m = self.m;
        let smalls: Vec<Pfn> = self
            .model
            .iter()
            .filter(|(_, b)| b.order == Order::ZERO && b.kind == Kind::Small)
            .map(|(&p, _)| Pfn::new(p))
            .collect();
        let mut list: Vec<Pfn> = Vec::new();
        if !smalls.is_empty() {
            // Distinct picks: a repeat would be a misuse by itself, which `bad` covers.
            for &p in picks.iter().take(700) {
                let pfn = smalls[usize::from(p) % smalls.len()];
                if !list.contains(&pfn) {
                    list.push(pfn);
                }
            }
        }
        if let Some((what, at)) = bad {
            let at = usize::from(at) % (list.len() + 1);
            let intruder = match what % 4 {
                // A repeat of an entry.
                0 if !list.is_empty() => list[usize::from(what) % list.len()],
                // Any block of the model (huge pages and larger orders included).
                1 => self
                    .pick(at as u16, |_| true)
                    .map_or(Pfn::new(0), |(p, _)| p),
                // A block freed before.
                2 if !self.freed.is_empty() => self.freed[usize::from(what) % self.freed.len()].0,
                _ => Pfn::new(self.anchors[usize::from(what) % self.anchors.len()]),
            };
            list.insert(at, intruder);
        }
        if list.iter().any(|&p| self.covers_unchecked(p, Order::ZERO)) {
            return;
        }
        // The first entry that is not a distinct order-0 block of the model.
        let first_bad = list.iter().enumerate().position(|(i, p)| {
            list[..i].contains(p)
                || !self
                    .model
                    .get(&p.get())
                    .is_some_and(|b| b.order == Order::ZERO && b.kind == Kind::Small)
        });
        let before = Snap::of(m);
        let (_, places) = self.places();
        if let Some(i) = handle {
            self.acts(i);
        }
        let result = match handle.and_then(|i| self.handles[i].as_mut()) {
            Some(h) => h.free_bulk(&list),
            None => m.free_bulk(&list),
        };
        match (result, first_bad) {
            (Ok(()), None) => {
                for p in &list {
                    self.model.remove(&p.get());
                    self.freed.push((*p, Order::ZERO, Kind::Small));
                }
            }
            (Err(e), Some(i)) => {
                assert_eq!(
                    e.index, i,
                    "bulk free of {list:?} blamed the wrong entry: {e:?}"
                );
                if handle.is_some() {
                    assert_eq!(
                        self.places().1,
                        places,
                        "a refused bulk free ({e:?}) through a handle moved frames"
                    );
                } else {
                    assert_eq!(
                        Snap::of(m),
                        before,
                        "a refused bulk free ({e:?}) changed the machine"
                    );
                }
                if list[..i].contains(&list[i]) {
                    assert_eq!(e.error, FreeError::Duplicate { pfn: list[i] });
                }
            }
            (Ok(()), Some(i)) => {
                panic!("bulk free of {list:?} accepted; entry {i} is misuse")
            }
            (Err(e), None) => panic!("valid bulk free of {list:?} refused: {e:?}"),
        }
    }

    fn new_policy(&mut self, slot: bool, mode: u8, mask: u8, node: u8, socket_aware: bool) {
        let nodes = mask_of(mask);
        let node = node_of(node);
        let policy = match mode % 6 {
            0 => Policy::Local,
            1 => Policy::Preferred(node),
            2 => Policy::PreferredMany(nodes),
            3 => Policy::Bind(nodes),
            4 => Policy::Interleave(nodes),
            _ => Policy::WeightedInterleave(nodes),
        };
        let r = TaskPolicy::new(self.m, policy, socket_aware);
        let unknown = nodes.iter().find(|n| n.index() >= NODES);
        let want = match policy {
            Policy::Local => Ok(()),
            Policy::Preferred(n) if n.index() >= NODES => Err(PolicyError::UnknownNode { node: n }),
            Policy::Preferred(_) => Ok(()),
            _ if nodes.is_empty() => Err(PolicyError::EmptyMask),
            _ => match unknown {
                Some(n) => Err(PolicyError::UnknownNode { node: n }),
                None => Ok(()),
            },
        };
        assert_eq!(r.as_ref().map(|_| ()).map_err(|e| *e), want, "{policy:?}");
        self.policies[usize::from(slot)] = r.ok();
    }

    fn hot_add(&mut self, node: NodeId, range: PhysRange, opts: FallbackOptions) {
        let m = self.m;
        let before = Snap::of(m);
        let result = m.hot_add(self.mem, node, range, opts);
        let overlaps = self.present.iter().any(|(_, r)| r.overlaps(&range));
        if node.index() >= NODES {
            assert_eq!(result, Err(BootError::UnknownNode { node }));
        } else if range.is_empty() || range.end().get() > PFN_LIMIT {
            assert_eq!(
                result,
                Err(BootError::BadRange {
                    start: range.start()
                }),
                "{range:?}"
            );
        } else if too_large(range) {
            assert!(
                result.is_err(),
                "hot-add of {range:?} is too large for a span"
            );
        } else if overlaps {
            assert!(
                result.is_err(),
                "hot-add of {range:?} on {node:?} overlaps present memory {:?}, but was accepted",
                self.present
            );
        }
        let after = Snap::of(m);
        if let Err(e) = result {
            assert_eq!(
                after, before,
                "a refused hot-add ({e:?}) changed the machine"
            );
            return;
        }
        assert_eq!(
            m.node_of(range.start()),
            Some(node),
            "hot-added frames belong to the node"
        );
        assert!(after.memory_nodes.contains(node));
        for (i, (a, b)) in after.zones.iter().zip(&before.zones).enumerate() {
            assert!(
                a.managed >= b.managed && a.free - b.free == a.managed - b.managed,
                "hot-add adds free, managed pages"
            );
            for k in 0..NR_ORDERS {
                self.full[i][k] += a.buddyinfo[k] - b.buddyinfo[k];
            }
        }
        self.present.extend(zone_parts(range).map(|p| (node, p)));
        self.gone.retain(|(_, r)| !r.overlaps(&range));
        self.hot_added += range.frames();
        self.anchors.push(range.start().get());
        self.anchors.push(range.end().get());
    }

    /// A report, judged by the model: every block handed over is free (no block the model
    /// holds overlaps it), aligned, of at least `order` and on `node`'s memory; the blocks
    /// come back as they were, so the free lists are unchanged; a refused call changes nothing.
    fn report(&mut self, node: NodeId, order: Order, capacity: usize, take: u8) {
        let m = self.m;
        let before = Snap::of(m);
        let mut seen: Vec<PhysRange> = Vec::new();
        let mut batches = 0u64;
        let result = m.report(node, order, capacity, |batch| {
            assert!(
                !batch.is_empty() && batch.len() <= capacity,
                "a batch of {}",
                batch.len()
            );
            seen.extend_from_slice(batch);
            batches += 1;
            batches <= u64::from(take)
        });
        assert_eq!(Snap::of(m), before, "a report changed the free lists");
        let got = match result {
            Err(e) => {
                let expected = if node.index() >= NODES {
                    ReportError::UnknownNode { node }
                } else if order < Order::HUGE_2M {
                    ReportError::BadOrder { order }
                } else {
                    ReportError::BadCapacity { capacity }
                };
                assert_eq!(e, expected);
                assert!(seen.is_empty(), "a refused report handed out {seen:?}");
                return;
            }
            Ok(got) => got,
        };
        assert!((1..=REPORT_CAPACITY).contains(&capacity) && order >= Order::HUGE_2M);
        for r in &seen {
            let len = r.frames();
            assert!(
                len.is_power_of_two()
                    && len >= order.frames()
                    && r.start().is_aligned(
                        Order::try_new(len.trailing_zeros() as u8).unwrap_or(Order::MAX)
                    ),
                "reported {r:?}: not an aligned block of order {order:?} or more"
            );
            assert_eq!(
                m.node_of(r.start()),
                Some(node),
                "reported {r:?} off its node"
            );
            let held = self
                .model
                .range(..r.end().get())
                .next_back()
                .is_some_and(|(&s, b)| s + b.order.frames() > r.start().get());
            assert!(!held, "reported {r:?}, which is handed out");
        }
        let frames: u64 = seen.iter().map(PhysRange::frames).sum();
        assert!(got.frames <= frames && got.batches <= batches);
        assert_eq!(
            got.refused,
            batches > u64::from(take),
            "{got:?} after {batches} batches"
        );
    }

    /// The invariants that hold after every operation.
    fn check(&self) {
        let m = self.m;
        if let Err(e) = m.check_invariants() {
            panic!("check_invariants: {e}");
        }
        let (mut free, mut managed, mut meta) = (0u64, 0u64, 0u64);
        let mut pooled = 0u64;
        for node in m.nodes() {
            for kind in ZoneKind::ALL {
                let c = node.zone(kind).counters();
                assert!(
                    c.dirty <= c.free,
                    "{:?} {kind:?}: {} dirty frames, {} free",
                    node.id(),
                    c.dirty,
                    c.free
                );
                let (f, mg) = (c.free, c.managed);
                free += f;
                managed += mg;
                meta += c.metadata;
            }
            for size in HugeSize::ALL {
                pooled += m.huge_counts(node.id(), size).total * size.order().frames();
            }
        }
        let small: u64 = self
            .model
            .values()
            .filter(|b| b.kind == Kind::Small)
            .map(|b| b.order.frames())
            .sum();
        let handles = self.handle_cached();
        assert_eq!(
            free + m.cached_pages() + handles + small + pooled + meta,
            managed,
            "frames unaccounted for: free {free}, cached {} (handles {handles}), handed out \
             {small}, pooled {pooled}, metadata {meta}",
            m.cached_pages()
        );
    }

    /// Judges the ranges `op` cleared. A scrub clears free frames of its node, at most one
    /// pageblock (512 frames) past its budget; anything else clears only inside blocks the
    /// model holds once it returns (the ones it handed out zeroed).
    fn check_cleared(&self, op: &Op, cleared: &[PhysRange]) {
        let m = self.m;
        let inside = |r: &PhysRange| {
            self.model
                .range(..=r.start().get())
                .next_back()
                .is_some_and(|(&s, b)| r.end().get() <= s + b.order.frames())
        };
        let overlaps_held = |r: &PhysRange| {
            self.model
                .range(..r.end().get())
                .next_back()
                .is_some_and(|(&s, b)| s + b.order.frames() > r.start().get())
        };
        for r in cleared {
            assert!(r.frames() > 0, "an empty clear");
            let last = Pfn::new(r.end().get() - 1);
            let node = m.node_of(r.start());
            assert!(
                node.is_some() && m.node_of(last) == node,
                "{op:?} cleared {r:?}, not within one node"
            );
            match *op {
                Op::Scrub { node: n, .. } => {
                    assert_eq!(node, Some(node_of(n)), "{op:?} cleared {r:?} off its node");
                    assert!(!overlaps_held(r), "{op:?} cleared {r:?}, handed out");
                }
                _ => assert!(inside(r), "{op:?} cleared {r:?}, not a block it handed out"),
            }
        }
        if let Op::Scrub { budget, scale, .. } = *op {
            let budget = u64::from(budget) << (scale % 8);
            let total: u64 = cleared.iter().map(PhysRange::frames).sum();
            let most = if budget == 0 { 0 } else { budget + 511 };
            assert!(total <= most, "{op:?} cleared {total} frames");
        }
    }

    /// Gives everything back: every zone must merge back to its fully free state.
    fn teardown(mut self) {
        let m = self.m;
        self.handles.clear();
        let blocks: Vec<(u64, Block)> = std::mem::take(&mut self.model).into_iter().collect();
        for (p, b) in blocks {
            let r = match b.kind {
                Kind::Small => m.free(Pfn::new(p), b.order),
                Kind::Huge(s) => m.free_huge(Pfn::new(p), s),
            };
            r.unwrap_or_else(|e| panic!("teardown free of {:?}/{:?}: {e:?}", Pfn::new(p), b.order));
        }
        m.drain_all();
        for node in m.topology().node_ids() {
            for size in HugeSize::ALL {
                m.release_huge(node, size, u64::MAX);
                assert_eq!(
                    m.huge_counts(node, size),
                    numaframe::HugeCounts::default(),
                    "pool pages stuck"
                );
            }
        }
        // A zone whose metadata pool grew keeps one pool pageblock after a trim (documented):
        // its free blocks cannot all merge back while it does.
        m.trim_metadata();
        self.check();
        let s = Snap::of(m);
        let metas = m
            .nodes()
            .iter()
            .flat_map(|n| ZoneKind::ALL.map(|k| n.zone(k).counters().metadata));
        for ((i, z), meta) in s.zones.iter().enumerate().zip(metas) {
            assert_eq!(
                z.free + meta,
                z.managed,
                "zone {i}: not every page came back"
            );
            if meta == 0 {
                assert_eq!(
                    z.buddyinfo, self.full[i],
                    "zone {i}: free blocks did not merge back"
                );
            } else {
                assert!(
                    meta <= 512,
                    "zone {i}: {meta} frames of metadata after a trim"
                );
            }
        }
    }
}

/// The parts of `range` below and above 4 GiB (the spans a range becomes).
fn zone_parts(range: PhysRange) -> impl Iterator<Item = PhysRange> {
    let (a, b) = range.split_at(Pfn::new(DMA32_END));
    [a, b].into_iter().filter(|r| !r.is_empty())
}

/// The frames of span `s` the machine manages: its start up to the first frame it does not
/// own (the metadata, and the tables, are carved from its end).
fn usable_part(m: &Machine<'_>, s: PhysRange) -> PhysRange {
    let (mut lo, mut hi) = (s.start().get(), s.end().get());
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if m.node_of(Pfn::new(mid)).is_some() {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    PhysRange::new(s.start(), Pfn::new(lo)).expect("ordered")
}

/// The free blocks of a wholly free span over `range`: its maximal aligned blocks, 1 GiB at
/// most (buddies never cross a span).
fn greedy(range: PhysRange) -> [u64; NR_ORDERS] {
    let mut counts = [0; NR_ORDERS];
    let (mut p, end) = (range.start().get(), range.end().get());
    while p < end {
        let mut k = p.trailing_zeros().min(u32::from(numaframe::MAX_ORDER));
        while p + (1 << k) > end {
            k -= 1;
        }
        counts[k as usize] += 1;
        p += 1 << k;
    }
    counts
}

/// A node mask over ids 0..8 (3.. unknown to the machine).
fn mask_of(bits: u8) -> NodeMask {
    NodeMask::from_nodes((0..8).filter(|i| bits & (1 << i) != 0).map(NodeId::new))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A hand-written sequence through the harness's offline model: a hot-added span refused
    /// while a frame of it is out, kept isolated, offlined once the frame is back, re-added;
    /// bad ranges; and node 1's boot memory offlined and re-added. (The fuzzer finds the rest.)
    #[test]
    fn offline_ops_follow_the_model() {
        let offline = |pick, mutate, keep| Op::Offline {
            pick,
            extend: 0,
            mutate,
            offset: 3,
            keep,
            boot_order: false,
        };
        let input = Input {
            header: Header {
                shape: 0,
                fill: 0x5a,
                min_free: 1,
                pcp: (1, 64),
            },
            ops: vec![
                Op::HotAdd {
                    node: 2,
                    anchor: 2,
                    offset: 0,
                    len: 4096,
                    scale: 0,
                    boot_order: false,
                },
                Op::Alloc {
                    node: 2,
                    order: 0,
                    flags: 1,
                },
                offline(3, 0, true),
                Op::Alloc {
                    node: 2,
                    order: 0,
                    flags: 1,
                },
                Op::Unisolate { pick: 3, extend: 0 },
                Op::Unisolate { pick: 3, extend: 0 },
                offline(3, 0, true),
                Op::Free {
                    pick: 0,
                    via: 0,
                    mutate: 0,
                },
                offline(3, 170, false),
                offline(3, 200, false),
                offline(3, 230, false),
                offline(0, 0, false),
                offline(3, 0, false),
                Op::FreeAgain { pick: 0, via: 0 },
                Op::ReAdd {
                    pick: 0,
                    boot_order: true,
                },
                offline(2, 0, false),
                Op::AllocCpu {
                    cpu: 1,
                    order: 0,
                    flags: 0,
                },
                Op::ReAdd {
                    pick: 0,
                    boot_order: false,
                },
            ],
        };
        run_input(&input);
    }

    /// A hand-written sequence through the handle operations: claims (a claimed CPU and an
    /// unknown one refused), hot and bulk allocations, unchecked, clean and checked frees, a
    /// double free, a wrong order, a drain request that kicks the CPU (its cache holding a
    /// pageblock) and is honoured by a poll (a second poll finds none), another honoured at the
    /// next operation, a bulk free with a
    /// misuse, the locked API of a claimed CPU, a busy offline of a hot-added span while a CPU
    /// is claimed, and a drop. (The fuzzer finds the rest.) It checks that it reached the
    /// unchecked free, the claimed-CPU offline rule, the kicks and a poll that honoured one.
    #[test]
    fn handle_ops_follow_the_model() {
        let free = |pick, mutate, how, again| HandleOp::Free {
            cpu: 1,
            pick,
            mutate,
            how,
            again,
        };
        let alloc = |order| HandleOp::Alloc {
            cpu: 1,
            order,
            flags: 0,
        };
        let input = HandleInput {
            header: Header {
                shape: 0,
                fill: 0x5a,
                min_free: 1,
                pcp: (4, 64),
            },
            ops: vec![
                HandleOp::Claim { cpu: 1 },
                HandleOp::Claim { cpu: 1 },
                HandleOp::Claim { cpu: 4 },
                alloc(0),
                alloc(3),
                HandleOp::AllocBulk {
                    cpu: 1,
                    n: 40,
                    flags: 0,
                },
                free(0, 0, 0, false),
                free(0, 0, 0, true),
                free(1, 0, 1, false),
                free(1, 200, 2, false),
                free(2, 250, 2, false),
                free(1, 0, 0, false),
                HandleOp::Other(Op::AllocCpu {
                    cpu: 1,
                    order: 0,
                    flags: 0,
                }),
                // The frees gave the cache's pageblock back: a drain now would wake nobody.
                alloc(0),
                HandleOp::Other(Op::DrainCpu { cpu: 1 }),
                HandleOp::Poll { cpu: 1 },
                HandleOp::Poll { cpu: 1 },
                alloc(0),
                HandleOp::Other(Op::DrainAll),
                alloc(0),
                HandleOp::FreeBulk {
                    cpu: 1,
                    picks: vec![0, 1, 2, 3],
                    bad: Some((0, 2)),
                },
                HandleOp::FreeBulk {
                    cpu: 1,
                    picks: vec![0, 1, 2, 3],
                    bad: None,
                },
                HandleOp::Other(Op::HotAdd {
                    node: 2,
                    anchor: 2,
                    offset: 0,
                    len: 4096,
                    scale: 0,
                    boot_order: false,
                }),
                HandleOp::Other(Op::Alloc {
                    node: 2,
                    order: 0,
                    flags: 1,
                }),
                HandleOp::Other(Op::Offline {
                    pick: 3,
                    extend: 0,
                    mutate: 0,
                    offset: 3,
                    keep: false,
                    boot_order: false,
                }),
                free(0, 0, 2, false),
                HandleOp::Release { cpu: 1 },
                alloc(0),
            ],
        };
        let reached = run_handle_input(&input);
        assert!(
            reached.unchecked > 0
                && reached.claimed_busy > 0
                && reached.kicks >= 2
                && reached.polls > 0,
            "the sequence missed a path it names: {reached:?}"
        );
    }
}
