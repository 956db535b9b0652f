//! Memory offlining: taking whole spans away from their zones, as Linux's `offline_pages`
//! does for memory blocks. The zone's half (isolation, the checks, moving metadata out,
//! removal) is `buddy::offline`; this is the machine's: finding the spans, draining the
//! per-CPU caches, growing metadata pools, and republishing the layout.
//!
//! Granularity: whole spans, the zone parts of a range given to boot or to `hot_add` (a range
//! straddling 4 GiB is two spans, in `Dma32` and `Normal`), each with the metadata carved from
//! its end (but at boot for a node's largest piece below 4 GiB, whose region may come off the
//! node's tables: that span then stays). A range may hold several adjacent spans; it may not cut one. Finer (sections of a
//! span) would need a span to shrink around a hole, its section table and edge arrays to be
//! rebuilt; not done.
#![deny(unsafe_code)]

use super::Machine;
use super::layout::{StagedSpan, Staging};
use crate::addr::{Pfn, PhysRange};
use crate::buddy::Refusal;
use crate::error::OfflineError;
use crate::meta::MAX_SPANS_PER_ZONE;
use crate::node::Zone;
use crate::platform::PhysMemory;
use crate::sync::MutexGuard;
use crate::zonelist::FallbackOptions;

/// How [`Machine::offline`] behaves.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OfflineOptions {
    /// When frames of the range are in use, keep it isolated (no allocation lands there) for
    /// a retry once the caller has freed them; [`Machine::unisolate`] ends that. Without it the
    /// range is as it was before the call: usable again at once, except spans an earlier call
    /// kept isolated, which stay so.
    pub keep_isolated: bool,
    /// How the fallback orders are rebuilt when the range leaves.
    pub fallback: FallbackOptions,
}

/// A span of the range, as the zone that holds it knows it.
#[derive(Clone, Copy, Debug)]
struct Part<'m> {
    staged: StagedSpan,
    zone: &'m Zone,
    slot: u8,
}

impl<'a> Machine<'a> {
    /// Takes the memory `range` away from the machine: the whole spans it covers leave their
    /// zones (see the granularity in `machine/offline.rs`'s module doc).
    ///
    /// As Linux's offlining: the range's pageblocks are isolated under their zone locks (no
    /// allocation, per-CPU lending, report, scrub or metadata growth lands there from then
    /// on), every per-CPU cache gives back the pageblocks it holds of the range, the free
    /// pages of huge-page pools in the range go back to the buddy (for good, as Linux
    /// dissolves them), and the range leaves only if every frame of it is then free. Other
    /// memory's metadata lying in the range (the zone's shared metadata pool takes slabs from
    /// every span) moves out first, the metadata pool growing elsewhere if it must. Then the
    /// spans leave their zones, a node left without memory becomes memoryless, and every
    /// fallback order is rebuilt and published at once, as `hot_add` does: allocations see
    /// the old layout or the new one, and a free of a frame of the range is refused as
    /// [`FreeError::Foreign`](crate::FreeError::Foreign) from then on. The platform gets the
    /// spans' metadata regions back through `mem`'s [`PhysMemory::unmap`] (`mem` is the one
    /// the range was added with), and the metadata slabs taken from the range through the
    /// machine's. [`Machine::hot_add`] of the range brings it back.
    ///
    /// Cost: O(pageblocks of the range's split sections + sections of its zones) under each
    /// zone lock, plus the per-CPU drains.
    ///
    /// # Errors
    /// [`OfflineError::Empty`], [`Foreign`](OfflineError::Foreign),
    /// [`Partial`](OfflineError::Partial) or [`Tables`](OfflineError::Tables) for a range that
    /// is not whole spans of the machine: nothing changed. [`Busy`](OfflineError::Busy) (with
    /// the pageblocks in use and the first frame in use) or
    /// [`NoMetadata`](OfflineError::NoMetadata): the range is usable as before, or with
    /// [`OfflineOptions::keep_isolated`] stays isolated for a retry. What the isolation did
    /// stays done, as after Linux's failed offlining: the pageblocks of the range that per-CPU
    /// caches held and the classes' spare pageblocks are back in the buddy, and the free pages
    /// of huge-page pools in it are dissolved; the frames handed out and the free memory
    /// (free and cached) are as before, but for one case of `NoMetadata`: metadata the call
    /// already moved out of the range stays moved, so a pool that grew to take it (of another
    /// span's zone, or of the refusing zone before it ran out) keeps those frames, and the free
    /// memory is lower by them (a slab or pageblock per growth). `trim_metadata` cannot give
    /// them back while they hold the moved metadata. Deciding beforehand whether every growth
    /// will succeed would mean replaying the pools' carving exactly, which this does not.
    pub fn offline<M: PhysMemory + ?Sized>(
        &self,
        mem: &M,
        range: PhysRange,
        opts: OfflineOptions,
    ) -> Result<(), OfflineError> {
        let mut staged = self.layout.stage();
        self.check_range(&staged, range)?;
        self.for_each_part(&staged, range, |p| {
            p.zone.with_area(|a| a.isolate(p.slot));
        });
        for i in 0..self.caches.len() {
            if let Some(cpu) = self.caches.cpu(i) {
                self.caches.drain_range(cpu, self.nodes, range);
            }
        }
        if let Err(e) = self.prepare(&staged, range) {
            // A span an earlier call kept isolated stays so either way: usable as before.
            self.for_each_part(&staged, range, |p| {
                p.zone.with_area(|a| {
                    if opts.keep_isolated {
                        a.keep_isolated(p.slot);
                    } else {
                        a.unisolate_unless_kept(p.slot);
                    }
                });
            });
            return Err(e);
        }
        // Every span is ready, and stays ready while isolated: nothing can allocate from it
        // and nothing new is put into its metadata memory. The spans of each zone leave it
        // together (frees of their frames are refused from then on), as one may hold another's
        // metadata; then the layout forgets them all at once.
        let mut at = range.start();
        while let Some(p) = self.part_from(&staged, range, at) {
            at = p.staged.whole.end();
            for q in self
                .remove_parts(mem, &staged, range, p.zone)
                .into_iter()
                .flatten()
            {
                staged.remove(q.staged.whole);
            }
        }
        self.republish(&mut staged, opts.fallback);
        // Nobody can look the range up any more: CPUs that freed into it last forget it.
        for i in 0..self.caches.len() {
            if let Some(cpu) = self.caches.cpu(i) {
                self.caches.forget_range(cpu, range);
            }
        }
        Ok(())
    }

    /// Ends the isolation [`OfflineOptions::keep_isolated`] left on `range`: its free memory
    /// can be allocated again.
    ///
    /// # Errors
    /// As [`Machine::offline`] for a range that is not whole spans, and
    /// [`OfflineError::NotIsolated`] if a span of it is not isolated; nothing changed then.
    pub fn unisolate(&self, range: PhysRange) -> Result<(), OfflineError> {
        let staged = self.layout.stage();
        self.check_range(&staged, range)?;
        let mut loose = None;
        self.for_each_part(&staged, range, |p| {
            if loose.is_none() && !p.zone.with_area(|a| a.is_isolated(p.slot)) {
                loose = Some(p.staged.whole.start());
            }
        });
        if let Some(pfn) = loose {
            return Err(OfflineError::NotIsolated { pfn });
        }
        self.for_each_part(&staged, range, |p| {
            p.zone.with_area(|a| a.unisolate(p.slot));
        });
        Ok(())
    }

    /// Checks that `range` is whole spans of the machine, none bound to tables carved at boot
    /// (holding the machine-wide tables, a node's or a CPU's: [`Machine::machine_tables`],
    /// [`Machine::node_tables`], [`Machine::cpu_tables`]; or holding, or being the span of, a
    /// metadata region boot carved among a node's tables).
    fn check_range(&self, staged: &Staging<'a>, range: PhysRange) -> Result<(), OfflineError> {
        if range.is_empty() {
            return Err(OfflineError::Empty);
        }
        let mut at = range.start();
        for s in staged.spans().iter().filter(|s| s.whole.overlaps(&range)) {
            if s.whole.start() < range.start() {
                return Err(OfflineError::Partial { pfn: range.start() });
            }
            if s.whole.start() > at {
                return Err(OfflineError::Foreign { pfn: at });
            }
            if s.whole.end() > range.end() {
                return Err(OfflineError::Partial { pfn: range.end() });
            }
            if self.tables.bind(&s.whole) {
                return Err(OfflineError::Tables {
                    start: s.whole.start(),
                });
            }
            at = s.whole.end();
        }
        if at < range.end() {
            return Err(OfflineError::Foreign { pfn: at });
        }
        Ok(())
    }

    /// Calls `f` with each span of `range` (a checked range), ascending.
    fn for_each_part<'m>(
        &'m self,
        staged: &Staging<'a>,
        range: PhysRange,
        mut f: impl FnMut(Part<'m>),
    ) {
        for s in staged.spans().iter().filter(|s| s.whole.overlaps(&range)) {
            let zone = self.zone_of(&s.span);
            let start = s.span.range.start();
            if let Some(slot) = zone.with_area(|a| a.meta.span_of(start)) {
                f(Part {
                    staged: *s,
                    zone,
                    slot,
                });
            }
        }
    }

    /// The first span of `range` (a checked range) at or after `at`.
    fn part_from(&self, staged: &Staging<'a>, range: PhysRange, at: Pfn) -> Option<Part<'_>> {
        let mut found = None;
        self.for_each_part(staged, range, |p| {
            if found.is_none() && p.staged.whole.start() >= at {
                found = Some(p);
            }
        });
        found
    }

    /// Gets every span of `range` (isolated) ready to leave, growing metadata pools where the
    /// spans' metadata must move out; the pageblocks in use over all spans if any are.
    fn prepare(&self, staged: &Staging<'a>, range: PhysRange) -> Result<(), OfflineError> {
        let (mut busy, mut first, mut short) = (0u64, None::<Pfn>, None);
        // Every span must be free before any metadata moves out: a move may grow the pool
        // (taking free memory), which a refused offline must not do.
        self.for_each_part(staged, range, |p| {
            if let Err(Refusal::Busy { busy: n, first: f }) =
                p.zone.with_area(|a| a.check_free(p.slot))
            {
                busy += n;
                first = Some(first.map_or(f, |x| x.min(f)));
            }
        });
        if let Some(pfn) = first {
            return Err(OfflineError::Busy { busy, pfn });
        }
        self.for_each_part(staged, range, |p| {
            let leaving = self.parts_of(staged, range, p.zone).0;
            loop {
                match p.zone.with_area(|a| a.prepare(p.slot, leaving)) {
                    Ok(()) => return,
                    Err(Refusal::Busy { busy: n, first: f }) => {
                        busy += n;
                        first = Some(first.map_or(f, |x| x.min(f)));
                        return;
                    }
                    Err(Refusal::Meta(what)) => {
                        if !self.grow(p.zone, what) {
                            short = short.or(Some(p.staged.span.node));
                            return;
                        }
                    }
                }
            }
        });
        if let Some(pfn) = first {
            return Err(OfflineError::Busy { busy, pfn });
        }
        match short {
            Some(node) => Err(OfflineError::NoMetadata { node }),
            None => Ok(()),
        }
    }

    /// The spans of `range` (a checked range) in `zone`, by slot, and their mask.
    fn parts_of<'m>(
        &'m self,
        staged: &Staging<'a>,
        range: PhysRange,
        zone: &Zone,
    ) -> (u32, [Option<Part<'m>>; MAX_SPANS_PER_ZONE]) {
        let mut parts = [None; MAX_SPANS_PER_ZONE];
        let mut mask = 0;
        self.for_each_part(staged, range, |p| {
            if core::ptr::eq(p.zone, zone)
                && let Some(at) = parts.get_mut(usize::from(p.slot))
            {
                *at = Some(p);
                mask |= 1 << p.slot;
            }
        });
        (mask, parts)
    }

    /// Removes the ready spans of `range` in `zone` from it, together, and unmaps the memory
    /// they leave with: their regions through `mem`, the pool slabs of their frames through the
    /// machine's. Returns the spans removed: none (changing nothing) if they were not all ready
    /// after all.
    fn remove_parts<'m, M: PhysMemory + ?Sized>(
        &'m self,
        mem: &M,
        staged: &Staging<'a>,
        range: PhysRange,
        zone: &Zone,
    ) -> [Option<Part<'m>>; MAX_SPANS_PER_ZONE] {
        let (mask, parts) = self.parts_of(staged, range, zone);
        let Some(mut leaving) = zone.with_area(|a| a.remove_spans(mask)) else {
            return [None; MAX_SPANS_PER_ZONE];
        };
        for (p, l) in parts.iter().zip(&mut leaving) {
            if let (Some(p), Some(mut l)) = (p, l.take()) {
                zone.shrink_managed(p.staged.span.range.frames());
                while let Some((slab, at)) = l.pop() {
                    self.mem.unmap(slab, at);
                }
                let (region, at) = l.region;
                mem.unmap(region, at);
            }
        }
        parts
    }

    /// Rebuilds every fallback order from the staged node states, publishes the layout in one
    /// publication, and resets the watermarks for the machine's new size.
    fn republish(&self, staged: &mut MutexGuard<'_, Staging<'a>>, opts: FallbackOptions) {
        staged.rebuild(&self.topo, opts);
        self.layout.publish(staged);
        self.reset_watermarks();
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::vec::Vec;

    use crate::test_util::{SparseMem, Spec, n};
    use crate::zonelist::FallbackOptions;
    use crate::*;

    fn range(start: u64, frames: u64) -> PhysRange {
        PhysRange::new(Pfn::new(start), Pfn::new(start + frames)).unwrap()
    }

    /// Two nodes with memory at boot and a memoryless third; `extra` hot-added to node 2.
    fn with_memoryless(frames: u64) -> Spec {
        let mut spec = Spec::uniform(3, frames, 0);
        spec.infos[2].has_memory = false;
        spec.ranges.pop();
        spec
    }

    /// Every frame node `node` can hand out, one at a time.
    fn drain_node(m: &Machine<'_>, node: usize) -> Vec<Pfn> {
        core::iter::from_fn(|| m.alloc(n(node), Order::ZERO, AllocFlags::THISNODE)).collect()
    }

    fn order(m: &Machine<'_>, node: usize) -> Vec<usize> {
        let mut row = [NodeId::default(); 3];
        let k = m.fallback_order(n(node), &mut row);
        row[..k].iter().map(|x| x.index()).collect()
    }

    const ADDED: u64 = 1 << 21;

    #[test]
    fn a_free_hot_added_range_goes_offline_and_comes_back() {
        let spec = with_memoryless(2048);
        let mem = SparseMem::default();
        let m = spec.boot(&mem);
        let r = range(ADDED, 3 * 512 + 100);
        m.hot_add(&mem, n(2), r, FallbackOptions::default())
            .unwrap();
        assert_eq!(order(&m, 0), [0, 1, 2]);
        let node2 = m.node(n(2)).unwrap();
        let managed = node2.managed_pages();
        let meta = m.metadata_bytes();
        // Use it and give it all back.
        let held = drain_node(&m, 2);
        assert_eq!(held.len() as u64, managed);
        m.free_bulk(&held).unwrap();
        m.offline(&mem, r, OfflineOptions::default()).unwrap();
        m.check_invariants().unwrap();
        assert_eq!(node2.managed_pages(), 0);
        assert_eq!(node2.free_pages(), 0);
        assert!(!m.memory_nodes().contains(n(2)));
        assert_eq!(order(&m, 0), [0, 1]);
        assert_eq!(order(&m, 2), [0, 1], "a memoryless node keeps a list");
        assert!(m.metadata_bytes() < meta, "its metadata left with it");
        assert_eq!(m.alloc(n(2), Order::ZERO, AllocFlags::THISNODE), None);
        assert_eq!(
            m.free(held[0], Order::ZERO),
            Err(FreeError::Foreign { pfn: held[0] })
        );
        assert_eq!(m.node_of(held[0]), None);
        // The platform got the region back: mapping it again works.
        m.hot_add(&mem, n(2), r, FallbackOptions::default())
            .unwrap();
        assert_eq!(node2.managed_pages(), managed);
        assert_eq!(m.metadata_bytes(), meta);
        assert_eq!(order(&m, 0), [0, 1, 2]);
        let p = m.alloc(n(2), Order::ZERO, AllocFlags::THISNODE).unwrap();
        m.free(p, Order::ZERO).unwrap();
        m.check_invariants().unwrap();
    }

    #[test]
    #[cfg_attr(
        miri,
        ignore = "thousands of allocations; the other tests cover its unsafe paths"
    )]
    fn a_busy_range_stays_and_names_its_first_frame_in_use() {
        let spec = with_memoryless(2048);
        let mem = SparseMem::default();
        let m = spec.boot(&mem);
        let r = range(ADDED, 4 * 512);
        m.hot_add(&mem, n(2), r, FallbackOptions::default())
            .unwrap();
        let held = drain_node(&m, 2);
        let keep: Vec<Pfn> = [700usize, 5, 1500].iter().map(|&i| held[i]).collect();
        let rest: Vec<Pfn> = held.iter().copied().filter(|p| !keep.contains(p)).collect();
        m.free_bulk(&rest).unwrap();
        let first = *keep.iter().min().unwrap();
        let pbs = {
            let mut v: Vec<u64> = keep.iter().map(|p| p.get() >> 9).collect();
            v.sort();
            v.dedup();
            v.len() as u64
        };
        let free = m.node(n(2)).unwrap().free_pages();
        assert_eq!(
            m.offline(&mem, r, OfflineOptions::default()),
            Err(OfflineError::Busy {
                busy: pbs,
                pfn: first
            })
        );
        m.check_invariants().unwrap();
        // Usable as before: every free frame can be allocated again.
        assert_eq!(m.node(n(2)).unwrap().free_pages(), free);
        let again = drain_node(&m, 2);
        assert_eq!(again.len() as u64, free);
        m.free_bulk(&again).unwrap();
        // Kept isolated: nothing lands there, and a retry after the frees succeeds.
        let opts = OfflineOptions {
            keep_isolated: true,
            ..OfflineOptions::default()
        };
        assert!(matches!(
            m.offline(&mem, r, opts),
            Err(OfflineError::Busy { .. })
        ));
        m.check_invariants().unwrap();
        assert_eq!(m.alloc(n(2), Order::ZERO, AllocFlags::THISNODE), None);
        assert_eq!(m.node(n(2)).unwrap().free_pages(), free);
        m.free(keep[0], Order::ZERO).unwrap();
        m.free(keep[1], Order::ZERO).unwrap();
        m.check_invariants().unwrap();
        assert!(matches!(
            m.offline(&mem, r, opts),
            Err(OfflineError::Busy { busy: 1, .. })
        ));
        m.free(keep[2], Order::ZERO).unwrap();
        m.check_invariants().unwrap();
        m.offline(&mem, r, opts).unwrap();
        m.check_invariants().unwrap();
        assert_eq!(m.node(n(2)).unwrap().managed_pages(), 0);
    }

    /// A failed offline without `keep_isolated` gives back only what it isolated itself: a span
    /// an earlier call kept isolated for a retry stays isolated (fuzz `ops` found an allocation
    /// served from it).
    #[test]
    #[cfg_attr(
        miri,
        ignore = "thousands of allocations; the other tests cover its unsafe paths"
    )]
    fn a_failed_offline_leaves_a_range_kept_isolated_before_it_isolated() {
        let spec = with_memoryless(2048);
        let mem = SparseMem::default();
        let m = spec.boot(&mem);
        let (a, b) = (range(ADDED, 1024), range(ADDED + 1024, 1024));
        for r in [a, b] {
            m.hot_add(&mem, n(2), r, FallbackOptions::default())
                .unwrap();
        }
        // One frame in use in each span.
        let held = drain_node(&m, 2);
        let busy: Vec<Pfn> = [a, b]
            .iter()
            .map(|r| *held.iter().find(|p| r.contains(**p)).unwrap())
            .collect();
        let rest: Vec<Pfn> = held.iter().copied().filter(|p| !busy.contains(p)).collect();
        m.free_bulk(&rest).unwrap();
        let kept = OfflineOptions {
            keep_isolated: true,
            ..OfflineOptions::default()
        };
        assert!(matches!(
            m.offline(&mem, a, kept),
            Err(OfflineError::Busy { busy: 1, .. })
        ));
        let both = range(ADDED, 2048);
        assert!(matches!(
            m.offline(&mem, both, OfflineOptions::default()),
            Err(OfflineError::Busy { busy: 2, .. })
        ));
        m.check_invariants().unwrap();
        // `b` is usable again, `a` is still isolated: nothing is allocated from it.
        let again = drain_node(&m, 2);
        assert!(again.iter().all(|p| b.contains(*p)), "allocated from {a:?}");
        let in_b = held.iter().filter(|p| b.contains(**p)).count();
        assert_eq!(again.len(), in_b - 1);
        m.free_bulk(&again).unwrap();
        assert_eq!(m.unisolate(a), Ok(()));
        assert_eq!(
            m.unisolate(b),
            Err(OfflineError::NotIsolated { pfn: b.start() })
        );
        m.free_bulk(&busy).unwrap();
        m.check_invariants().unwrap();
    }

    #[test]
    fn unisolate_gives_an_isolated_range_back() {
        let spec = with_memoryless(2048);
        let mem = SparseMem::default();
        let m = spec.boot(&mem);
        let r = range(ADDED, 2 * 512);
        m.hot_add(&mem, n(2), r, FallbackOptions::default())
            .unwrap();
        assert_eq!(
            m.unisolate(r),
            Err(OfflineError::NotIsolated { pfn: r.start() })
        );
        let p = m.alloc(n(2), Order::ZERO, AllocFlags::THISNODE).unwrap();
        let opts = OfflineOptions {
            keep_isolated: true,
            ..OfflineOptions::default()
        };
        assert!(m.offline(&mem, r, opts).is_err());
        assert_eq!(m.alloc(n(2), Order::ZERO, AllocFlags::THISNODE), None);
        m.unisolate(r).unwrap();
        m.check_invariants().unwrap();
        let q = m.alloc(n(2), Order::ZERO, AllocFlags::THISNODE).unwrap();
        m.free(p, Order::ZERO).unwrap();
        m.free(q, Order::ZERO).unwrap();
        m.check_invariants().unwrap();
    }

    #[test]
    #[cfg_attr(
        miri,
        ignore = "checks of the range only; the other tests cover its unsafe paths"
    )]
    fn bad_ranges_are_refused_and_change_nothing() {
        let spec = with_memoryless(2048);
        let mem = SparseMem::default();
        let m = spec.boot(&mem);
        let (a, b) = (range(ADDED, 1024), range(ADDED + 1024, 1024));
        m.hot_add(&mem, n(2), a, FallbackOptions::default())
            .unwrap();
        m.hot_add(&mem, n(2), b, FallbackOptions::default())
            .unwrap();
        let meta = m.metadata_bytes();
        let free: Vec<u64> = m.nodes().iter().map(Node::free_pages).collect();
        let opts = OfflineOptions::default();
        let cases = [
            (range(ADDED, 0), OfflineError::Empty),
            (
                range(ADDED - 10, 1034),
                OfflineError::Foreign {
                    pfn: Pfn::new(ADDED - 10),
                },
            ),
            (
                range(ADDED + 4, 1020),
                OfflineError::Partial {
                    pfn: Pfn::new(ADDED + 4),
                },
            ),
            (
                range(ADDED, 1000),
                OfflineError::Partial {
                    pfn: Pfn::new(ADDED + 1000),
                },
            ),
            (
                range(ADDED + 512, 1024),
                OfflineError::Partial {
                    pfn: Pfn::new(ADDED + 512),
                },
            ),
            (
                range(ADDED, 3000),
                OfflineError::Foreign {
                    pfn: Pfn::new(ADDED + 2048),
                },
            ),
            (range(0, 2048), OfflineError::Tables { start: Pfn::new(0) }),
        ];
        for (r, e) in cases {
            assert_eq!(m.offline(&mem, r, opts), Err(e), "{r:?}");
            assert_eq!(m.unisolate(r), Err(e), "{r:?}");
        }
        m.check_invariants().unwrap();
        assert_eq!(m.metadata_bytes(), meta);
        let after: Vec<u64> = m.nodes().iter().map(Node::free_pages).collect();
        assert_eq!(after, free);
        // Both ranges at once are whole spans.
        m.offline(&mem, range(ADDED, 2048), opts).unwrap();
        m.check_invariants().unwrap();
        assert_eq!(m.node(n(2)).unwrap().managed_pages(), 0);
    }

    /// A CPU remembers the span it freed into last, to find the zone of its next free without a
    /// lookup. After the span goes offline and its range comes back on another node, a free of
    /// a frame of it must go to the new zone, through a cache held by a handle or not.
    #[test]
    fn cpus_forget_a_span_that_went_offline() {
        let spec = with_memoryless(2048);
        let mem = SparseMem::default();
        let m = spec.boot_with_cpus(&mem, &[n(0), n(0)]);
        let r = range(ADDED, 3 * 512);
        let (c0, c1) = (m.cpu(0).unwrap(), m.cpu(1).unwrap());
        m.hot_add(&mem, n(2), r, FallbackOptions::default())
            .unwrap();
        let mut h = m.claim_cpu(c0).unwrap();
        let p = m.alloc(n(2), Order::ZERO, AllocFlags::THISNODE).unwrap();
        let q = m.alloc(n(2), Order::ZERO, AllocFlags::THISNODE).unwrap();
        h.free(p, Order::ZERO).unwrap();
        m.free_cpu(c1, q, Order::ZERO).unwrap();
        m.offline(&mem, r, OfflineOptions::default()).unwrap();
        m.hot_add(&mem, n(1), r, FallbackOptions::default())
            .unwrap();
        let p = m.alloc(n(1), Order::ZERO, AllocFlags::THISNODE).unwrap();
        let q = m.alloc(n(1), Order::ZERO, AllocFlags::THISNODE).unwrap();
        assert!(r.contains(p) && r.contains(q));
        h.free(p, Order::ZERO).unwrap();
        m.free_cpu(c1, q, Order::ZERO).unwrap();
        drop(h);
        m.check_invariants().unwrap();
        assert_eq!(
            m.node(n(1)).unwrap().free_pages(),
            m.node(n(1)).unwrap().managed_pages()
        );
    }

    /// The smallest case of the next test, for Miri: `b`'s whole section takes its array from
    /// `a`'s seed, a pageblock of it its plane (a short-lived frame: the pageblocks `a` and `b`
    /// split for themselves serve long-lived ones), then `a` goes offline.
    #[test]
    fn an_array_and_a_plane_move_out_of_a_leaving_seed() {
        let spec = with_memoryless(2048);
        let mem = SparseMem::default();
        let m = spec.boot(&mem);
        let b = range(ADDED + (1 << 18), (1 << 18) + 3 * 512);
        let a = range(ADDED, 64);
        m.hot_add(&mem, n(2), b, FallbackOptions::default())
            .unwrap();
        m.hot_add(&mem, n(2), a, FallbackOptions::default())
            .unwrap();
        let whole = range(ADDED + (1 << 18), 1 << 18);
        let mut held = Vec::new();
        while !held.iter().any(|&(p, _)| whole.contains(p)) {
            let p = m.alloc(n(2), Order::HUGE_2M, AllocFlags::THISNODE).unwrap();
            held.push((p, Order::HUGE_2M));
        }
        let p = m
            .alloc(
                n(2),
                Order::ZERO,
                AllocFlags::THISNODE | AllocFlags::SHORT_LIVED,
            )
            .unwrap();
        held.push((p, Order::ZERO));
        for &(p, order) in &held {
            if a.contains(p) {
                m.free(p, order).unwrap();
            }
        }
        held.retain(|&(p, _)| !a.contains(p));
        assert!(whole.contains(p), "the frame lies in `b`'s split section");
        let zone = m.node(n(2)).unwrap().zone(ZoneKind::Normal);
        let foreign = zone.with_area(|x| {
            let slot = x.meta.span_of(a.start()).unwrap();
            x.meta.foreign_objects(slot)
        });
        assert_eq!(foreign, 2, "`b`'s array and plane lie in `a`'s seed");
        m.offline(&mem, a, OfflineOptions::default()).unwrap();
        m.check_invariants().unwrap();
        for (p, order) in held {
            m.free(p, order).unwrap();
        }
        m.check_invariants().unwrap();
        let node = m.node(n(2)).unwrap();
        assert_eq!(node.free_pages(), node.managed_pages());
    }

    /// The first span of a zone whose seed slabs hold the planes and arrays of a later span's
    /// pageblocks and sections goes offline: they move out, and the later span works on.
    #[test]
    #[cfg_attr(miri, ignore = "thousands of allocations over a 1 GiB span")]
    fn other_spans_metadata_moves_out_of_a_leaving_span() {
        let spec = with_memoryless(2048);
        let mem = SparseMem::default();
        let m = spec.boot(&mem);
        // `b` first, then `a`: `a`'s seed comes first in the pool, so `b`'s growth (the planes
        // of its edge pageblocks aside) lands there. Whole sections need 1 GiB: `b` has one.
        let b = range(ADDED + (1 << 18), (1 << 18) + 4096);
        let a = range(ADDED, 3 * 512);
        m.hot_add(&mem, n(2), b, FallbackOptions::default())
            .unwrap();
        m.hot_add(&mem, n(2), a, FallbackOptions::default())
            .unwrap();
        // Split `b`'s whole section (its array from `a`'s seed) and many of its pageblocks
        // (their planes from `a`'s seed first).
        let whole = range(ADDED + (1 << 18), 1 << 18);
        let held = split_pageblocks_of(&m, whole);
        // Frames of `a` that got handed out go back, so `a` is free.
        let (ina, inb): (Vec<Pfn>, Vec<Pfn>) = held.iter().partition(|p| a.contains(**p));
        for p in &ina {
            m.free(*p, Order::new(1)).unwrap();
        }
        // Free huge pages in `a` leave their pool with it; the others stay.
        let huge = m.reserve_huge(n(2), HugeSize::Size2M, 4);
        let pages: Vec<Pfn> = (0..huge)
            .map(|_| m.alloc_huge(n(2), HugeSize::Size2M).unwrap())
            .collect();
        for p in &pages {
            m.free_huge(*p, HugeSize::Size2M).unwrap();
        }
        let outside = pages.iter().filter(|p| !a.contains(**p)).count() as u64;
        assert!(outside < huge, "a huge page in `a` too");
        m.check_invariants().unwrap();
        let zone = m.node(n(2)).unwrap().zone(ZoneKind::Normal);
        let moved = zone.with_area(|x| {
            let slot = x.meta.span_of(a.start()).unwrap();
            x.meta.foreign_objects(slot)
        });
        assert!(moved > 0, "`b`'s metadata lies in `a`");
        m.offline(&mem, a, OfflineOptions::default()).unwrap();
        m.check_invariants().unwrap();
        assert!(m.node(n(2)).unwrap().managed_pages() > 0);
        let huge = m.huge_counts(n(2), HugeSize::Size2M).total;
        assert_eq!(huge, outside);
        for p in inb {
            m.free(p, Order::new(1)).unwrap();
        }
        m.check_invariants().unwrap();
        assert_eq!(m.release_huge(n(2), HugeSize::Size2M, huge), huge);
        m.offline(&mem, b, OfflineOptions::default()).unwrap();
        m.check_invariants().unwrap();
        assert_eq!(m.node(n(2)).unwrap().managed_pages(), 0);
        m.hot_add(&mem, n(2), a, FallbackOptions::default())
            .unwrap();
        m.hot_add(&mem, n(2), b, FallbackOptions::default())
            .unwrap();
        m.check_invariants().unwrap();
    }

    /// Order-1 blocks of node 2, one class then the other, until 40 pageblocks of `whole` hold
    /// some (filling what each pageblock has, so the next goes on to another): splits `whole`'s
    /// section and many of its pageblocks. Returns every block handed out.
    fn split_pageblocks_of(m: &Machine<'_>, whole: PhysRange) -> Vec<Pfn> {
        let mut held = Vec::new();
        let mut pbs = std::collections::BTreeSet::new();
        let alloc = |class| {
            m.alloc(n(2), Order::new(1), AllocFlags::THISNODE | class)
                .unwrap()
        };
        while pbs.len() < 40 {
            let class = if held.len() % 2 == 0 {
                AllocFlags::empty()
            } else {
                AllocFlags::SHORT_LIVED
            };
            let p = alloc(class);
            if whole.contains(p) {
                pbs.insert(p.get() >> 9);
            }
            held.push(p);
            if held.len() % 64 == 0 {
                held.extend((0..200).map(|_| alloc(class)));
            }
        }
        held
    }

    /// A refused offline leaves the free memory as it was ("the frames handed out and the
    /// free memory (free and cached) are as before"): here `a`'s seed holds metadata of `b`
    /// (which stays), `c` (offlined with `a`) has a frame in use. The offline is refused for
    /// `c` before it moves `b`'s metadata out of `a`, which would grow the metadata pool into
    /// free memory.
    #[test]
    #[cfg_attr(miri, ignore = "thousands of allocations over a 1 GiB span")]
    fn a_busy_offline_does_not_grow_the_metadata_pool() {
        let spec = with_memoryless(2048);
        let mem = SparseMem::default();
        let m = spec.boot(&mem);
        let b = range(ADDED + (1 << 18), (1 << 18) + 4096);
        let a = range(ADDED, 3 * 512);
        let c = range(ADDED + 3 * 512, 2000);
        for r in [c, b, a] {
            m.hot_add(&mem, n(2), r, FallbackOptions::default())
                .unwrap();
        }
        // `b`'s whole section split into many pageblocks, their planes and its array in `a`'s
        // seed.
        let whole = range(ADDED + (1 << 18), 1 << 18);
        let held = split_pageblocks_of(&m, whole);
        // `a` is free; one block of `c` stays in use.
        let busy = *held.iter().find(|p| c.contains(**p)).unwrap();
        for p in held.iter().filter(|p| **p != busy && !b.contains(**p)) {
            m.free(*p, Order::new(1)).unwrap();
        }
        m.trim_metadata();
        m.check_invariants().unwrap();
        let node = m.node(n(2)).unwrap();
        let (free, meta) = (node.free_pages(), m.metadata_bytes());
        let both = range(ADDED, 3 * 512 + 2000);
        assert!(matches!(
            m.offline(&mem, both, OfflineOptions::default()),
            Err(OfflineError::Busy { busy: 1, .. })
        ));
        m.check_invariants().unwrap();
        assert_eq!(
            m.metadata_bytes(),
            meta,
            "a refused offline grew the metadata"
        );
        assert_eq!(
            node.free_pages(),
            free,
            "a refused offline changed the free memory"
        );
    }
}
