//! The tables that hot-add rewrites: which nodes have memory, every node's fallback order, and
//! the index from frame number to zone.
//!
//! Allocations and frees read them on every call, so reads take no lock and write nothing:
//! the published copy lives in atomics under a [`SeqCount`], and a reader that overlapped a
//! publication reads again. Writers (boot, `hot_add`, `offline`) hold the hotplug lock, which
//! guards a plain staging copy they change at leisure; [`Layout::publish`] copies it into the
//! atomics in one short publication. So a writer never waits for readers (no reader holds anything), and
//! nothing an allocation does can deadlock against a hot-add.
//!
//! Each node's fallback order, staged and published, is a row of its own that boot carved from
//! the node's memory (a memoryless node's from its nearest node with memory), so a machine of
//! many small nodes needs no node with room for all of them; the rest is machine-wide.
#![deny(unsafe_code)]

use crate::addr::{Pfn, PhysRange};
use crate::error::BootError;
use crate::node::ZoneKind;
use crate::sync::{AtomicU16, AtomicU64, AtomicUsize, Mutex, MutexGuard, Ordering, SeqCount};
use crate::topology::{MAX_NODES, NodeId, NodeMask, Topology};
use crate::zonelist::{
    FallbackLine, FallbackOptions, FallbackTable, NodeStates, Scratch, build_fallback,
};

/// Where a span of frames lives, for the frame → zone lookup.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct SpanRef {
    /// The frames the zone manages.
    pub(crate) range: PhysRange,
    pub(crate) node: NodeId,
    pub(crate) zone: ZoneKind,
}

/// A span as the writers keep it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct StagedSpan {
    pub(crate) span: SpanRef,
    /// The frames the machine took for it, metadata and tables included.
    pub(crate) whole: PhysRange,
}

/// One published slot of the span index.
#[derive(Debug, Default)]
pub(crate) struct SpanSlot {
    start: AtomicU64,
    end: AtomicU64,
    /// `node << 1 | zone`.
    place: AtomicU64,
}

impl SpanSlot {
    /// Stores the fields of `r` that differ (for the one writer, under the sequence count).
    fn update(&self, r: &SpanRef) {
        let place = (r.node.index() as u64) << 1 | r.zone.index() as u64;
        for (field, v) in [
            (&self.start, r.range.start().get()),
            (&self.end, r.range.end().get()),
            (&self.place, place),
        ] {
            // Relaxed: published under the sequence count; the load reads this writer's own
            // last store.
            if field.load(Ordering::Relaxed) != v {
                field.store(v, Ordering::Relaxed);
            }
        }
    }

    /// The slot's span, if what was read is a valid one (it may be torn; the caller rechecks
    /// the sequence count).
    fn load(&self) -> Option<(PhysRange, NodeId, ZoneKind)> {
        // Relaxed: read under the sequence count.
        let start = Pfn::new(self.start.load(Ordering::Relaxed));
        let end = Pfn::new(self.end.load(Ordering::Relaxed));
        let place = self.place.load(Ordering::Relaxed);
        let node = NodeId::try_new(usize::try_from(place >> 1).ok()?)?;
        let zone = ZoneKind::ALL[(place & 1) as usize];
        Some((PhysRange::new(start, end)?, node, zone))
    }
}

/// What only writers touch, behind the hotplug lock.
#[derive(Debug)]
pub(crate) struct Staging<'a> {
    pub(crate) states: NodeStates,
    table: FallbackTable<'a>,
    scratch: Scratch<'a>,
    /// Sorted by start, disjoint; `index[..spans]` are in use.
    index: &'a mut [StagedSpan],
    spans: usize,
}

impl<'a> Staging<'a> {
    /// `true` if `range` overlaps memory the machine already has, metadata and tables included.
    pub(crate) fn overlaps(&self, range: PhysRange) -> bool {
        self.index[..self.spans]
            .iter()
            .any(|s| s.whole.overlaps(&range))
    }

    /// Room for `extra` more spans beyond those staged.
    pub(crate) fn has_room(&self, extra: usize) -> bool {
        self.spans + extra < self.index.len()
    }

    /// Adds a span to the index (published by the next [`Layout::publish`]).
    pub(crate) fn insert(&mut self, r: StagedSpan) -> Result<(), BootError> {
        if self.spans == self.index.len() {
            return Err(BootError::TooManyRanges);
        }
        let start = r.span.range.start();
        let at = self.index[..self.spans].partition_point(|s| s.span.range.start() < start);
        self.index.copy_within(at..self.spans, at + 1);
        self.index[at] = r;
        self.spans += 1;
        self.states.memory.insert(r.span.node);
        Ok(())
    }

    /// Takes the span staged with exactly the frames `whole` out of the index (published by the
    /// next [`Layout::publish`]); its node keeps memory only if another span has it.
    pub(crate) fn remove(&mut self, whole: PhysRange) -> Option<StagedSpan> {
        let i = self.index[..self.spans]
            .iter()
            .position(|s| s.whole == whole)?;
        let r = self.index[i];
        self.index.copy_within(i + 1..self.spans, i);
        self.spans -= 1;
        if !self.index[..self.spans]
            .iter()
            .any(|s| s.span.node == r.span.node)
        {
            self.states.memory.remove(r.span.node);
        }
        Some(r)
    }

    /// The staged spans, ascending.
    pub(crate) fn spans(&self) -> &[StagedSpan] {
        &self.index[..self.spans]
    }

    /// The fallback order of `node` as staged.
    pub(crate) fn order(&self, node: NodeId) -> &[NodeId] {
        self.table.order(node)
    }

    /// The boot-log line of `node` as staged.
    pub(crate) fn display(&self, node: NodeId) -> FallbackLine<'_> {
        self.table.display(node)
    }

    /// Rebuilds every fallback order from the staged node states.
    pub(crate) fn rebuild(&mut self, topo: &Topology<'_>, opts: FallbackOptions) {
        build_fallback(topo, &self.states, opts, &mut self.scratch, &mut self.table);
    }
}

/// Storage for a [`Layout`] of `n` nodes and `slots` spans, carved by the caller: `rows[i]`
/// and `published_rows[i]` are node `i`'s fallback order (`n` entries each, wherever the
/// caller put them), the rest holds one entry per node or per span slot.
#[derive(Debug)]
pub(crate) struct LayoutTables<'a> {
    pub(crate) rows: &'a mut [&'a mut [NodeId]],
    pub(crate) lens: &'a mut [u16],
    pub(crate) load: &'a mut [u32],
    pub(crate) keys: &'a mut [u64],
    pub(crate) index: &'a mut [StagedSpan],
    pub(crate) published_rows: &'a [&'a [AtomicU16]],
    pub(crate) published_lens: &'a [AtomicU16],
    pub(crate) published_index: &'a [SpanSlot],
}

/// The published layout; see the module doc.
#[derive(Debug)]
pub(crate) struct Layout<'a> {
    n: usize,
    seq: SeqCount,
    staging: Mutex<Staging<'a>>,
    memory: [AtomicU64; MAX_NODES / 64],
    /// Node `i`'s published fallback order: `rows[i][..lens[i]]`.
    rows: &'a [&'a [AtomicU16]],
    lens: &'a [AtomicU16],
    index: &'a [SpanSlot],
    spans: AtomicUsize,
}

/// The nodes a walk visits, read from the published layout.
#[derive(Clone, Copy, Debug)]
pub(crate) struct NodeList<'l> {
    /// `Some(node)`: this node alone (THISNODE); `None`: the published `row`.
    only: Option<NodeId>,
    row: &'l [AtomicU16],
    /// Nodes of the machine: an entry at or above it is torn.
    n: usize,
    len: usize,
}

impl NodeList<'_> {
    /// Number of entries.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Entry `i` (`None` past the end, or if a torn read produced no valid node).
    pub(crate) fn get(&self, i: usize) -> Option<NodeId> {
        if i >= self.len {
            return None;
        }
        if let Some(node) = self.only {
            return Some(node);
        }
        // Relaxed: read under the sequence count.
        let v = self.row.get(i)?.load(Ordering::Relaxed);
        NodeId::try_new(usize::from(v)).filter(|n| n.index() < self.n)
    }
}

impl<'a> Layout<'a> {
    /// An empty layout over `t` (no node has memory, every fallback order is empty).
    pub(crate) fn new(n: usize, cpus: NodeMask, t: LayoutTables<'a>) -> Option<Self> {
        let table = FallbackTable::from_rows(n, t.rows, t.lens)?;
        if t.published_rows.len() < n
            || t.published_rows.iter().any(|r| r.len() < n)
            || t.published_lens.len() < n
            || t.published_index.len() < t.index.len()
            || t.load.len() < n
            || t.keys.len() < n
        {
            return None;
        }
        Some(Self {
            n,
            seq: SeqCount::new(),
            staging: Mutex::new(Staging {
                states: NodeStates {
                    memory: NodeMask::EMPTY,
                    cpus,
                },
                table,
                scratch: Scratch {
                    load: t.load,
                    keys: t.keys,
                },
                index: t.index,
                spans: 0,
            }),
            memory: core::array::from_fn(|_| AtomicU64::new(0)),
            rows: t.published_rows,
            lens: t.published_lens,
            index: t.published_index,
            spans: AtomicUsize::new(0),
        })
    }

    /// Takes the hotplug lock: the staging copy, for a writer.
    pub(crate) fn stage(&self) -> MutexGuard<'_, Staging<'a>> {
        self.staging.lock()
    }

    /// Copies the staged tables into the published ones, as one publication. Only values that
    /// changed are stored: readers have fewer writes to overlap with, and a model checker fewer
    /// stale values to try.
    pub(crate) fn publish(&self, staged: &MutexGuard<'_, Staging<'a>>) {
        // Relaxed throughout: the publication orders these (see `SeqCount`); the loads read
        // this writer's own last stores (writers are serialised by the hotplug lock).
        let update16 = |slot: &AtomicU16, v: u16| {
            if slot.load(Ordering::Relaxed) != v {
                slot.store(v, Ordering::Relaxed);
            }
        };
        self.seq.publish(staged, || {
            let words = self.n.div_ceil(64);
            for (w, v) in self.memory[..words]
                .iter()
                .zip(staged.states.memory.words())
            {
                if w.load(Ordering::Relaxed) != *v {
                    w.store(*v, Ordering::Relaxed);
                }
            }
            for node in 0..self.n {
                let row = staged.table.order(NodeId::new(node));
                update16(&self.lens[node], row.len() as u16);
                for (slot, id) in self.rows[node].iter().zip(row) {
                    update16(slot, id.index() as u16);
                }
            }
            for (slot, r) in self.index.iter().zip(staged.spans()) {
                slot.update(&r.span);
            }
            if self.spans.load(Ordering::Relaxed) != staged.spans {
                self.spans.store(staged.spans, Ordering::Relaxed);
            }
        });
    }

    /// Runs `f` on the published layout until it reads it without a publication in between.
    fn read<R>(&self, mut f: impl FnMut(&Self) -> R) -> R {
        loop {
            let s = self.seq.read_begin();
            let r = f(self);
            if !self.seq.read_retry(s) {
                return r;
            }
        }
    }

    /// A read that may proceed on a possibly torn view, for a walk: returns the count that
    /// [`Layout::changed`] checks.
    pub(crate) fn begin(&self) -> u64 {
        self.seq.read_begin()
    }

    /// A number that changes with every publication, from a count [`Layout::begin`] returned
    /// (hints remember it to notice that the fallback orders they index were replaced).
    pub(crate) fn generation(seq: u64) -> u32 {
        (seq >> 1) as u32
    }

    /// `true` if a publication happened since [`Layout::begin`] returned `start`.
    pub(crate) fn changed(&self, start: u64) -> bool {
        self.seq.read_retry(start)
    }

    /// The nodes a walk from `node` visits: `node` alone, or its fallback order. Read it
    /// between [`Layout::begin`] and [`Layout::changed`].
    pub(crate) fn list(&self, node: NodeId, this_node_only: bool) -> NodeList<'_> {
        if this_node_only {
            return NodeList {
                only: Some(node),
                row: &[],
                n: self.n,
                len: 1,
            };
        }
        let (Some(row), Some(len)) = (self.rows.get(node.index()), self.lens.get(node.index()))
        else {
            return NodeList {
                only: None,
                row: &[],
                n: self.n,
                len: 0,
            };
        };
        // Relaxed: read under the sequence count; a torn length is bounded by the row.
        let len = usize::from(len.load(Ordering::Relaxed)).min(row.len());
        NodeList {
            only: None,
            row,
            n: self.n,
            len,
        }
    }

    /// The span holding `pfn`.
    pub(crate) fn find(&self, pfn: Pfn) -> Option<SpanRef> {
        self.read(|l| {
            // Relaxed: read under the sequence count; a torn count is bounded by the table.
            let spans = l.spans.load(Ordering::Relaxed).min(l.index.len());
            let live = &l.index[..spans];
            // The spans are sorted and disjoint, so their ends are sorted too: the search
            // reads one field a probe, and only the slot it lands on whole.
            let i = live.partition_point(|s| s.end.load(Ordering::Relaxed) <= pfn.get());
            let (range, node, zone) = live.get(i)?.load()?;
            range.contains(pfn).then_some(SpanRef { range, node, zone })
        })
    }

    /// Nodes that have memory.
    /// `true` if every node of `mask` has memory now: one relaxed load per word of the mask
    /// that names a node, no sequence count (a node that gains or loses memory meanwhile may
    /// be seen either way, as by a read just before or after).
    pub(crate) fn all_have_memory(&self, mask: &NodeMask) -> bool {
        mask.words().iter().enumerate().all(|(i, &w)| {
            w == 0
                || self
                    .memory
                    .get(i)
                    // Relaxed: a single word, as above.
                    .is_some_and(|m| w & !m.load(Ordering::Relaxed) == 0)
        })
    }

    pub(crate) fn memory_nodes(&self) -> NodeMask {
        self.read(|l| {
            // Relaxed: read under the sequence count.
            let words = l.n.div_ceil(64);
            NodeMask::from_words(core::array::from_fn(|i| {
                if i < words {
                    l.memory[i].load(Ordering::Relaxed)
                } else {
                    0
                }
            }))
        })
    }

    /// Copies the fallback order of `node` into `out`; returns how many entries it wrote.
    pub(crate) fn copy_order(&self, node: NodeId, out: &mut [NodeId]) -> usize {
        self.read(|l| {
            let list = l.list(node, false);
            let n = list.len().min(out.len());
            for (i, slot) in out[..n].iter_mut().enumerate() {
                *slot = list.get(i).unwrap_or_default();
            }
            n
        })
    }
}
