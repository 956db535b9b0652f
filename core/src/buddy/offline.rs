//! Memory offlining, the zone's half: isolating a span so that no allocation lands in it,
//! checking that every frame of it is free, moving other spans' metadata out of its memory,
//! and removing it.
//!
//! *Isolation* (Linux's `start_isolate_page_range`) takes the span's free memory off every
//! zone-wide list and bucket: a whole free section is *parked* (free, on no list), a split
//! section leaves the section buckets, a split pageblock the occupancy buckets and the spare
//! slots. So no allocation, lending to a CPU, report, scrub or pool growth can take it. Frees
//! into the span still land (that is how a caller makes a busy range free): they merge inside
//! its sections and park instead of joining a zone-wide list, and a pageblock they leave wholly
//! free merges at once. Its free frames stay in `free_pages` and are counted in
//! `isolated_pages` too, which the watermarks leave out. The pool puts the span's metadata
//! memory (its region's seed slabs, the slabs carved from its frames) out of service
//! ([`Pool::quarantine`](crate::meta::Pool::quarantine)): nothing new is put there.
//!
//! A span can leave once every frame of it is free. Its metadata memory may still hold planes
//! and arrays of other spans' pageblocks and sections: the owner index names each plane's
//! pageblock, the other spans' sections name their arrays, and each moves into memory in
//! service ([`ZoneMeta::evacuate`](crate::meta::ZoneMeta::evacuate)). Then its own planes and
//! arrays go back, and it leaves the zone with its memory, which the machine unmaps.
#![deny(unsafe_code)]

use super::dirty::section_frames_dirty;
use super::{Big, FreeArea, pool_index};
use crate::addr::{MAX_ORDER, Order, Pfn};
use crate::bitmap::FRAMES;
use crate::error::InvariantError;
use crate::meta::{
    Class, Leaving, MAX_SPANS_PER_ZONE, NIL, PbRef, PbState, SecRef, Section, SectionState, Short,
    Which, flag, in_mask,
};
use crate::topology::NodeId;

/// Why a span cannot leave its zone yet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// `busy` pageblocks of it are in use (or a slab of its frames is on its way into the
    /// metadata pool); `first` is its first frame in use.
    Busy { busy: u64, first: Pfn },
    /// Moving other spans' metadata out of it needs the pool to grow by this kind first.
    Meta(Short),
}

impl FreeArea {
    /// `true` if the span in `span` is isolated.
    #[inline]
    pub(super) fn isolated(&self, span: u8) -> bool {
        self.iso_mask != 0 && (self.iso_mask >> (span & 31)) & 1 != 0
    }

    /// Counts `n` more free frames in span `span`, if it is isolated.
    #[inline]
    pub(super) fn iso_more(&mut self, span: u8, n: u64) {
        if self.isolated(span) {
            self.isolated_pages += n;
        }
    }

    /// Counts `n` fewer free frames in span `span`, if it is isolated.
    #[inline]
    pub(super) fn iso_less(&mut self, span: u8, n: u64) {
        if self.isolated(span) {
            self.isolated_pages -= n;
        }
    }

    /// The span slot of a block.
    pub(super) fn span_of(b: Big) -> u8 {
        match b {
            Big::Pb(r) => r.span,
            Big::Section(s) => s.span,
        }
    }

    /// Parks section `s` of an isolated span: one free block, on no list.
    pub(super) fn park(&mut self, s: SecRef) {
        self.meta.update_section(s, |x| {
            x.state = SectionState::Free;
            x.next = NIL;
            x.prev = NIL;
        });
    }

    /// A huge page of `order` at `pfn` given back to its pool, if it lies in an isolated span:
    /// it leaves the pool for the buddy instead, dirty. `false` (changing nothing) if not.
    pub(super) fn put_isolated(&mut self, pfn: Pfn, order: Order) -> bool {
        let span = if order == Order::MAX {
            self.sec_ref(pfn).map(|s| s.span)
        } else {
            self.pb_ref(pfn).map(|r| r.span)
        };
        let Some(i) = pool_index(order) else {
            return false;
        };
        if !span.is_some_and(|s| self.isolated(s)) {
            return false;
        }
        self.pools[i].total -= 1;
        self.free_big(pfn, order.get(), true);
        true
    }

    /// The free frames of the span in `slot`, counted from its metadata: its free blocks,
    /// parked or listed, and the free frames of its split pageblocks.
    fn span_free(&self, slot: u8) -> u64 {
        let Some(span) = self.meta.span(slot) else {
            return 0;
        };
        let mut free = 0;
        for index in 0..span.sections() {
            match self
                .meta
                .section(SecRef { span: slot, index })
                .map(|x| x.state)
            {
                Some(SectionState::Free) => free += 1 << MAX_ORDER,
                Some(SectionState::Split) => {
                    for pb in span.section_pbs(index) {
                        let r = PbRef {
                            span: slot,
                            index: pb,
                        };
                        match self.meta.pb(r).map(|h| (h.state, h.free)) {
                            Some((PbState::Free { order }, _)) => free += 1 << order,
                            Some((PbState::Split, f)) => free += u64::from(f),
                            _ => {}
                        }
                    }
                }
                _ => {}
            }
        }
        free
    }

    /// Isolates the span in `slot` (see the module doc): its free huge-page pool pages and the
    /// spare pageblocks in it go back to the buddy first, then its free memory leaves every
    /// zone-wide list and bucket and counts in `isolated_pages`, and its metadata memory goes
    /// out of service. `false` if there is no such span; isolating an isolated span changes
    /// nothing.
    pub(crate) fn isolate(&mut self, slot: u8) -> bool {
        let Some(span) = self.meta.span(slot).copied() else {
            return false;
        };
        if self.isolated(slot) {
            return true;
        }
        for (i, order) in [(0, Order::HUGE_2M), (1, Order::MAX)] {
            // Pop them all, give back the span's, and push the others back in their order.
            let mut kept = NIL;
            while let Some(pfn) = self.pool_pop(i) {
                let Some(b) = self.pool_block(pfn, order) else {
                    continue;
                };
                if span.range.contains(pfn) {
                    self.pools[i].total -= 1;
                    let dirty = self.block_dirty(b, order.get()) > 0;
                    self.free_big(pfn, order.get(), dirty);
                } else {
                    self.set_links(b, Some(kept), Some(NIL));
                    kept = Self::pack(b);
                }
            }
            while let Some(b) = Self::unpack(order.get(), kept) {
                kept = self.links(b).0;
                self.pool_link(i, self.base(b));
            }
        }
        for c in Class::ALL {
            if let Some(r) = self.spare[c.index()]
                && r.span == slot
            {
                self.spare[c.index()] = None;
                self.unsplit(r);
            }
        }
        self.iso_mask |= 1 << slot;
        for index in 0..span.sections() {
            let s = SecRef { span: slot, index };
            let Some(x) = self.meta.section(s) else {
                continue;
            };
            match x.state {
                SectionState::Free => self.whole_remove(s, &x),
                SectionState::Split => {
                    if x.free_pbs > 0 {
                        self.sec_unbucket(s, &x);
                    }
                    for pb in span.section_pbs(index) {
                        let r = PbRef {
                            span: slot,
                            index: pb,
                        };
                        if self
                            .meta
                            .pb(r)
                            .is_some_and(|h| h.state == PbState::Split && h.bucket != 0)
                        {
                            self.bucket_remove(r);
                        }
                    }
                }
                SectionState::Allocated(_) => {}
            }
        }
        self.isolated_pages += self.span_free(slot);
        self.meta.quarantine(slot);
        true
    }

    /// Undoes [`FreeArea::isolate`]: the span's free memory goes back on the zone's lists and
    /// buckets (a wholly free pageblock becomes its class's spare, as after any free), and its
    /// metadata memory back in service.
    pub(crate) fn unisolate(&mut self, slot: u8) {
        let Some(span) = self.meta.span(slot).copied() else {
            return;
        };
        if !self.isolated(slot) {
            return;
        }
        self.isolated_pages -= self.span_free(slot);
        self.iso_mask &= !(1 << slot);
        self.iso_kept &= !(1 << slot);
        self.meta.release_quarantine(slot);
        for index in 0..span.sections() {
            let s = SecRef { span: slot, index };
            match self.meta.section(s).map(|x| x.state) {
                Some(SectionState::Free) => self.whole_insert(s),
                Some(SectionState::Split) => {
                    self.sec_link(s);
                    for pb in span.section_pbs(index) {
                        let r = PbRef {
                            span: slot,
                            index: pb,
                        };
                        if !self.scrub_holds_pb(r)
                            && self
                                .meta
                                .pb(r)
                                .is_some_and(|h| h.state == PbState::Split && h.free > 0)
                        {
                            self.settle(r);
                        }
                    }
                }
                _ => {}
            }
        }
    }

    /// `true` if the span in `slot` is isolated.
    pub(crate) fn is_isolated(&self, slot: u8) -> bool {
        self.meta.span(slot).is_some() && self.isolated(slot)
    }

    /// Keeps the isolated span in `slot` isolated until [`FreeArea::unisolate`] (or its
    /// leaving), whatever later offlines of it do: an offline that failed with
    /// `keep_isolated`.
    pub(crate) fn keep_isolated(&mut self, slot: u8) {
        if self.is_isolated(slot) {
            self.iso_kept |= 1 << slot;
        }
    }

    /// Undoes the isolation of a failed offline without `keep_isolated`: [`FreeArea::unisolate`]
    /// unless an earlier failed offline kept the span isolated (then it stays as it was).
    pub(crate) fn unisolate_unless_kept(&mut self, slot: u8) {
        if (self.iso_kept >> (slot & 31)) & 1 == 0 {
            self.unisolate(slot);
        }
    }

    /// The packed list link of a block.
    fn pack(b: Big) -> u32 {
        match b {
            Big::Pb(r) => r.pack(),
            Big::Section(s) => s.pack(),
        }
    }

    /// Takes free section `s` (as read in `x`) off the zone's list of whole free sections and
    /// parks it; its count stays.
    fn whole_remove(&mut self, s: SecRef, x: &Section) {
        match SecRef::unpack(x.prev) {
            None => self.whole = x.next,
            Some(p) => {
                self.meta.update_section(p, |y| y.next = x.next);
            }
        }
        if let Some(n) = SecRef::unpack(x.next) {
            self.meta.update_section(n, |y| y.prev = x.prev);
        }
        self.park(s);
    }

    /// Puts section `s` (free, on no list: just freed whole, or parked) at the front of the
    /// zone's list of whole free sections.
    pub(super) fn whole_insert(&mut self, s: SecRef) {
        let head = self.whole;
        self.meta.update_section(s, |x| {
            x.next = head;
            x.prev = NIL;
        });
        if let Some(h) = SecRef::unpack(head) {
            self.meta.update_section(h, |x| x.prev = s.pack());
        }
        self.whole = s.pack();
    }

    /// Puts split section `s`, in no bucket, into the bucket of its free pageblocks (none if
    /// it has none).
    fn sec_link(&mut self, s: SecRef) {
        let Some(y) = self.meta.section(s) else {
            return;
        };
        if y.free_pbs == 0 {
            return;
        }
        let (set, b) = (Self::sec_set(&y), Self::sec_bucket(y.free_pbs));
        let head = self.sections[set].heads[b];
        self.sections[set].heads[b] = s.pack();
        self.sections[set].nonempty.put(b, true);
        self.meta.update_section(s, |x| {
            x.next = head;
            x.prev = NIL;
        });
        if let Some(h) = SecRef::unpack(head) {
            self.meta.update_section(h, |x| x.prev = s.pack());
        }
    }

    /// The pageblocks of the span in `slot` in use, and its first frame in use: a section
    /// handed out whole counts all its pageblocks; a split pageblock with a frame handed out, a
    /// pageblock lent to a CPU, handed out whole or held by a scrub or a report counts one.
    /// Pool pageblocks do not count: their slabs can be moved out or given back.
    fn busy(&self, slot: u8) -> (u64, Option<Pfn>) {
        let Some(span) = self.meta.span(slot) else {
            return (0, None);
        };
        let (mut busy, mut first) = (0u64, None);
        let mut note = |n: u64, pfn: Pfn| {
            busy += n;
            first = Some(first.map_or(pfn, |f: Pfn| f.min(pfn)));
        };
        for index in 0..span.sections() {
            let Some(x) = self.meta.section(SecRef { span: slot, index }) else {
                continue;
            };
            match x.state {
                SectionState::Free => {}
                SectionState::Allocated(_) => {
                    note(
                        span.section_pbs(index).len() as u64,
                        span.section_start(index),
                    );
                }
                SectionState::Split => {
                    for pb in span.section_pbs(index) {
                        let r = PbRef {
                            span: slot,
                            index: pb,
                        };
                        let Some(h) = self.meta.pb(r) else {
                            continue;
                        };
                        let (lo, hi) = span.pb_frames(pb);
                        let base = span.pb_base(pb).get();
                        let off = match h.state {
                            PbState::Free { .. } | PbState::FreeTail | PbState::Pool => continue,
                            PbState::Split
                                if usize::from(h.free) == hi - lo && !self.scrub_holds_pb(r) =>
                            {
                                continue;
                            }
                            // The first frame handed out (or held by a scrub).
                            PbState::Split => self
                                .meta
                                .plane(r, Which::Alloc)
                                .and_then(|p| (lo..hi).find(|&i| p.get(i)))
                                .unwrap_or(lo),
                            _ => lo,
                        };
                        note(1, Pfn::new(base + off as u64));
                    }
                }
            }
        }
        (busy, first)
    }

    /// The first frame of a slab of the span in `slot` on its way into the metadata pool
    /// (taken by a growth that is mapping it with no lock held), if any: a frame a pool
    /// pageblock of the span has carved that no slab the pool knows of holds.
    fn in_flight(&self, slot: u8) -> Option<Pfn> {
        let span = self.meta.span(slot)?;
        for index in 0..span.sections() {
            if self
                .meta
                .section(SecRef { span: slot, index })
                .map(|x| x.state)
                != Some(SectionState::Split)
            {
                continue;
            }
            for pb in span.section_pbs(index) {
                let r = PbRef {
                    span: slot,
                    index: pb,
                };
                if self.meta.pb(r).map(|h| h.state) != Some(PbState::Pool) {
                    continue;
                }
                let base = span.pb_base(pb).get();
                let mut carved = self.meta.plane(r, Which::Alloc)?;
                self.meta.for_each_slab(|slab| {
                    let lo = slab.start().get().max(base);
                    let hi = slab.end().get().min(base + FRAMES as u64);
                    if lo < hi {
                        carved.fill((lo - base) as usize, (hi - lo) as usize, false);
                    }
                });
                if let Some(i) = carved.next_set(0) {
                    return Some(Pfn::new(base + i as u64));
                }
            }
        }
        None
    }

    /// Checks that the isolated span in `slot` can leave with the spans of mask `leaving` (its
    /// own bit among them), and gets it ready: every frame free and no slab of its frames on
    /// its way into the pool (else [`Refusal::Busy`]), and the planes and arrays of the spans
    /// that stay moved out of its metadata memory (else [`Refusal::Meta`]: the pool must grow
    /// first; what moved stays moved). Once it is ready it stays ready while it is isolated:
    /// nothing can allocate from it, and nothing new is put into its metadata memory.
    pub(crate) fn prepare(&mut self, slot: u8, leaving: u32) -> Result<(), Refusal> {
        self.check_free(slot)?;
        self.meta.evacuate(slot, leaving).map_err(Refusal::Meta)
    }

    /// The first half of [`FreeArea::prepare`], changing nothing: every frame of the isolated
    /// span in `slot` free and no slab of its frames on its way into the pool, else
    /// [`Refusal::Busy`].
    pub(crate) fn check_free(&self, slot: u8) -> Result<(), Refusal> {
        let (busy, first) = self.busy(slot);
        if busy > 0 {
            return Err(Refusal::Busy {
                busy,
                first: first.unwrap_or_default(),
            });
        }
        if let Some(first) = self.in_flight(slot) {
            return Err(Refusal::Busy { busy: 1, first });
        }
        Ok(())
    }

    /// Removes the isolated spans of mask `leaving`, each ready by [`FreeArea::prepare`] with
    /// that mask, from the zone together: their free memory leaves the counters and the counts
    /// of free blocks, their own pageblocks' planes and their sections' pool arrays go back to
    /// the pool, their pool pageblocks leave their list, and the spans and their metadata
    /// memory leave the zone's metadata. One span's planes or arrays may lie in another's
    /// metadata memory, so every span gives its own back before any memory leaves. Returns
    /// that memory per slot, to unmap; `None` (changing nothing) unless every span is isolated
    /// and ready.
    pub(crate) fn remove_spans(
        &mut self,
        leaving: u32,
    ) -> Option<[Option<Leaving>; MAX_SPANS_PER_ZONE]> {
        let slots = || (0..MAX_SPANS_PER_ZONE as u8).filter(|&i| in_mask(leaving, i));
        let ready = |a: &Self, slot| {
            a.meta.span(slot).is_some()
                && a.isolated(slot)
                && a.busy(slot).0 == 0
                && a.in_flight(slot).is_none()
                && a.meta.evacuated(slot, leaving)
        };
        if leaving >> MAX_SPANS_PER_ZONE != 0 || !slots().all(|slot| ready(self, slot)) {
            return None;
        }
        for slot in slots() {
            self.give_up_metadata(slot);
        }
        let mut out = [const { None }; MAX_SPANS_PER_ZONE];
        for slot in slots() {
            let frames = self.meta.span(slot)?.range.frames();
            out[usize::from(slot)] = Some(self.meta.remove(slot)?);
            self.managed_pages -= frames;
            self.iso_mask &= !(1 << slot);
            self.iso_kept &= !(1 << slot);
        }
        Some(out)
    }

    /// The first step of [`FreeArea::remove_spans`] for the span in `slot`: its free memory
    /// leaves the counters and the counts of free blocks, and its pageblocks' planes, its
    /// sections' pool arrays and its pool pageblocks go back to the pool.
    fn give_up_metadata(&mut self, slot: u8) {
        let Some(span) = self.meta.span(slot).copied() else {
            return;
        };
        let (mut free, mut dirty, mut reported) = (0u64, 0u64, 0u64);
        for index in 0..span.sections() {
            let s = SecRef { span: slot, index };
            let Some(x) = self.meta.section(s) else {
                continue;
            };
            match x.state {
                SectionState::Free => {
                    self.counts[Self::list(MAX_ORDER)] -= 1;
                    free += 1 << MAX_ORDER;
                    dirty += section_frames_dirty(&x);
                    if x.flags & flag::REPORTED != 0 {
                        reported += 1 << MAX_ORDER;
                    }
                }
                SectionState::Split => {
                    for pb in span.section_pbs(index) {
                        let r = PbRef {
                            span: slot,
                            index: pb,
                        };
                        let Some(h) = self.meta.pb(r) else {
                            continue;
                        };
                        match h.state {
                            PbState::Free { order } => {
                                self.counts[Self::list(order)] -= 1;
                                free += 1 << order;
                                dirty += self.block_dirty(Big::Pb(r), order);
                                if self.is_reported(Big::Pb(r)) {
                                    reported += 1 << order;
                                }
                            }
                            PbState::Split => {
                                free += u64::from(h.free);
                                dirty += self.pb_dirty(r);
                            }
                            PbState::Pool => {
                                self.pool_pb_unlink(r);
                                self.pool_spare -= u64::from(h.free);
                            }
                            _ => {}
                        }
                        self.meta.drop_planes(r);
                    }
                    self.meta.drop_array(s);
                }
                SectionState::Allocated(_) => {}
            }
        }
        self.free_pages -= free;
        self.isolated_pages -= free;
        self.dirty_pages -= dirty;
        self.reported_pages -= reported;
    }

    /// Checks the metadata pool's owner index against the planes: every pageblock with planes
    /// is the owner of their slot, and every slot in use of the pool's listed slabs names the
    /// pageblock whose planes it holds.
    pub(super) fn check_owners(&self, node: NodeId) -> Result<(), InvariantError> {
        if !self.meta.owners_consistent() {
            return Err(InvariantError::Counter { node });
        }
        let mut bad = None;
        self.for_each_pb_of_split(|r, _| {
            if bad.is_none() && !self.meta.owner_agrees(r) {
                bad = Some(self.pb_base(r));
            }
        });
        match bad {
            Some(pfn) => Err(InvariantError::Pageblock { pfn }),
            None => Ok(()),
        }
    }

    /// Checks isolation: the isolated slots are spans, their free frames (counted from the
    /// metadata) are `isolated_pages`, none of their pageblocks is a spare or a free huge-page
    /// pool page, and the metadata pool holds exactly their memory out of service. (That their
    /// free memory is on no zone-wide list or bucket the list and bucket walks check.)
    pub(super) fn check_isolation(&self, node: NodeId) -> Result<(), InvariantError> {
        let counter = InvariantError::Counter { node };
        let mut free = 0u64;
        let mut isolated = 0u32;
        for (slot, _) in self.meta.spans() {
            if self.isolated(slot) {
                free += self.span_free(slot);
                isolated |= 1 << slot;
                if !self.meta.quarantined(slot) {
                    return Err(counter);
                }
            }
        }
        if isolated != self.iso_mask
            || self.iso_kept & !self.iso_mask != 0
            || self.meta.quarantined_spans() != isolated.count_ones() as usize
            || free != self.isolated_pages
            || free > self.free_pages
        {
            return Err(counter);
        }
        for r in self.spare.iter().flatten() {
            if self.isolated(r.span) {
                return Err(InvariantError::Pageblock {
                    pfn: self.pb_base(*r),
                });
            }
        }
        for (i, order) in [(0, Order::HUGE_2M), (1, Order::MAX)] {
            let mut cur = self.pools[i].head;
            while let Some(b) = Self::unpack(order.get(), cur) {
                if self.isolated(Self::span_of(b)) {
                    return Err(InvariantError::BadFreeTag {
                        pfn: self.base(b),
                        order,
                    });
                }
                cur = self.links(b).0;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::test_util::{SparseMem, Spec, n};
    use crate::*;

    #[test]
    fn the_invariant_walk_finds_planes_their_owner_index_does_not_name() {
        let spec = Spec::uniform(1, 4 * 512, 0);
        let mem = SparseMem::default();
        let m = spec.boot(&mem);
        let a = m.alloc(n(0), Order::ZERO, AllocFlags::empty()).unwrap();
        let b = m.alloc(n(0), Order::ZERO, AllocFlags::SHORT_LIVED).unwrap();
        assert_ne!(a.get() >> 9, b.get() >> 9, "two classes, two pageblocks");
        m.check_invariants().unwrap();
        let zone = m.node(n(0)).unwrap().zone(ZoneKind::Dma32);
        let swap = || {
            zone.with_area(|area| {
                let (ra, rb) = (area.pb_ref(a).unwrap(), area.pb_ref(b).unwrap());
                area.meta.swap_planes(ra, rb);
            });
        };
        swap();
        assert!(matches!(
            m.check_invariants(),
            Err(InvariantError::Pageblock { .. } | InvariantError::Counter { .. })
        ));
        swap();
        m.check_invariants().unwrap();
        m.free(a, Order::ZERO).unwrap();
        m.free(b, Order::ZERO).unwrap();
        m.check_invariants().unwrap();
    }
}
