//! The invariant walk, and what a zone reports about its pageblocks.
#![deny(unsafe_code)]

use super::{BANDS, Big, FreeArea, PLAIN, SEC_BUCKETS, SMALL};
use crate::addr::{MAX_ORDER, NR_ORDERS, Order, Pfn};
use crate::bitmap::{FRAMES, Plane};
use crate::error::InvariantError;
use crate::meta::{
    Class, NIL, PB_SHIFT, PbRef, PbState, SECTION_LISTS, SecRef, SectionState, Use, Which,
};
use crate::topology::NodeId;

/// What one pageblock is doing, for occupancy maps and `/proc/pagetypeinfo`-style counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PageblockKind {
    /// Wholly free (part of a free block of whole pageblocks, or a class's spare).
    Free,
    /// Handed out whole, as part of a block of 2 MiB or more.
    Allocated,
    /// Part of a huge-page pool.
    Pool,
    /// Split below 2 MiB, serving a class.
    Split(Class),
    /// Split and lent to a CPU's cache.
    Cached(Class),
}

/// One pageblock's state, as [`Zone::for_each_pageblock`](crate::Zone::for_each_pageblock)
/// reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageblockInfo {
    /// The pageblock's first frame (its aligned start; edge pageblocks begin before their span).
    pub pfn: Pfn,
    /// What it is doing.
    pub kind: PageblockKind,
    /// Its free frames (of 512; all of them for a free pageblock, none for an allocated one;
    /// unknown, reported as 0, while lent to a CPU).
    pub free: u16,
}

/// Pageblock counts of a zone by state and class (Linux's `/proc/pagetypeinfo`, with classes
/// in place of migrate types).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PageblockCounts {
    /// Wholly free pageblocks.
    pub free: u64,
    /// Pageblocks handed out whole (2 MiB blocks and larger), huge-page pools included.
    pub whole: u64,
    /// Split pageblocks per class (indexed by [`Class::index`]), lent ones included.
    pub split: [u64; 2],
    /// Of those, the ones lent to CPUs.
    pub lent: u64,
}

impl FreeArea {
    /// Calls `f` for every pageblock of the zone, ascending within each span.
    pub(crate) fn for_each_pageblock(&self, mut f: impl FnMut(PageblockInfo)) {
        for (slot, span) in self.meta.spans() {
            for s in 0..span.sections() {
                let sec = self.meta.section(SecRef {
                    span: slot,
                    index: s,
                });
                for pb in span.section_pbs(s) {
                    let pfn = span.pb_base(pb);
                    let whole = |kind| PageblockInfo { pfn, kind, free: 0 };
                    let free = PageblockInfo {
                        pfn,
                        kind: PageblockKind::Free,
                        free: FRAMES as u16,
                    };
                    let info = match sec.map(|x| x.state) {
                        // Free, or free and held by a scrub for a moment.
                        Some(SectionState::Free | SectionState::Allocated(Use::Scrub)) => free,
                        Some(SectionState::Allocated(Use::Normal)) => {
                            whole(PageblockKind::Allocated)
                        }
                        Some(SectionState::Allocated(_)) => whole(PageblockKind::Pool),
                        _ => {
                            let r = PbRef {
                                span: slot,
                                index: pb,
                            };
                            let Some(h) = self.meta.pb(r) else {
                                continue;
                            };
                            match h.state {
                                PbState::Free { .. } | PbState::FreeTail => free,
                                // Free, held by a scrub for a moment.
                                PbState::Allocated { .. } | PbState::AllocatedTail
                                    if self.scrub_holds_block_of(r) =>
                                {
                                    free
                                }
                                PbState::Split if self.spare[h.class.index()] == Some(r) => {
                                    PageblockInfo {
                                        pfn,
                                        kind: PageblockKind::Free,
                                        free: h.free,
                                    }
                                }
                                // Frames a scrub holds are still free.
                                PbState::Split => PageblockInfo {
                                    pfn,
                                    kind: PageblockKind::Split(h.class),
                                    free: h.free + self.scrub_taken(r).count() as u16,
                                },
                                PbState::Hot => whole(PageblockKind::Cached(h.class)),
                                // The metadata pool's: long-lived, and none of its frames
                                // can be had.
                                PbState::Pool => PageblockInfo {
                                    pfn,
                                    kind: PageblockKind::Split(Class::Long),
                                    free: 0,
                                },
                                PbState::Allocated {
                                    what: Use::Normal, ..
                                }
                                | PbState::AllocatedTail => whole(PageblockKind::Allocated),
                                PbState::Allocated { .. } => whole(PageblockKind::Pool),
                            }
                        }
                    };
                    f(info);
                }
            }
        }
    }

    /// Pageblock counts by state and class.
    pub(crate) fn pageblock_counts(&self) -> PageblockCounts {
        let mut c = PageblockCounts::default();
        self.for_each_pageblock(|p| match p.kind {
            PageblockKind::Free => c.free += 1,
            PageblockKind::Allocated | PageblockKind::Pool => c.whole += 1,
            PageblockKind::Split(class) => c.split[class.index()] += 1,
            PageblockKind::Cached(class) => {
                c.split[class.index()] += 1;
                c.lent += 1;
            }
        });
        c
    }

    /// Free blocks of each order (`/proc/buddyinfo`): whole-pageblock blocks from the lists,
    /// and inside split pageblocks the free frames cut into maximal aligned blocks.
    pub(crate) fn buddyinfo(&self) -> [u64; NR_ORDERS] {
        let mut counts = [0u64; NR_ORDERS];
        for k in PB_SHIFT as u8..=MAX_ORDER {
            counts[usize::from(k)] = self.counts[Self::list(k)];
        }
        // A unit a scrub holds is still free.
        if let Some(k) = self.scrub_held_block() {
            counts[usize::from(k)] += 1;
        }
        self.for_each_split(|r, _, alloc| {
            cut(
                &self.without_scrub_held(r, alloc),
                0,
                PB_SHIFT as u8,
                &mut counts,
            );
        });
        counts
    }

    /// Walks every list, bucket, split pageblock and counter; see the invariants on
    /// [`FreeArea`].
    pub(crate) fn check(&self, node: NodeId, cpus: usize) -> Result<(), InvariantError> {
        let counter = InvariantError::Counter { node };
        // A pageblock lent to a CPU names that CPU and one of its slots (`PbState::Hot`): a
        // CPU or slot the machine does not have would hold its frames for good. (Whether the
        // slot holds it is the cache's to say, under its own lock: `Caches::check`.)
        let mut lent_to_nobody = None;
        self.for_each_pb_of_split(|r, h| {
            if h.state == PbState::Hot
                && (h.next as usize >= cpus || h.prev as usize >= crate::percpu::SLOTS)
            {
                lent_to_nobody.get_or_insert(r);
            }
        });
        if let Some(r) = lent_to_nobody {
            return Err(InvariantError::Pageblock {
                pfn: self.pb_base(r),
            });
        }
        let mut free = 0u64;
        let mut found = [0u64; MAX_ORDER as usize - PB_SHIFT as usize + 1];
        self.walk_list(MAX_ORDER, self.whole, &mut found)?;
        let mut bucketed = 0u64;
        for (slot, span) in self.meta.spans() {
            for index in 0..span.sections() {
                let s = SecRef { span: slot, index };
                let Some(x) = self.meta.section(s) else {
                    return Err(counter);
                };
                let before: u64 = found.iter().sum::<u64>();
                let mut pbs = 0u64;
                let heads = self.meta.section_heads(s).unwrap_or([NIL; SECTION_LISTS]);
                for k in PB_SHIFT as u8..MAX_ORDER {
                    let n = self.walk_list(k, heads[Self::list(k)], &mut found)?;
                    pbs += n << (k - PB_SHIFT as u8);
                }
                let listed = found.iter().sum::<u64>() - before;
                let split = if x.state == SectionState::Split {
                    span.section_pbs(index)
                        .filter(|&i| {
                            let h = self.meta.pb(PbRef {
                                span: slot,
                                index: i,
                            });
                            matches!(
                                h.map(|h| h.state),
                                Some(PbState::Split | PbState::Hot | PbState::Pool)
                            )
                        })
                        .count()
                } else {
                    0
                };
                if listed > 0 && x.state != SectionState::Split
                    || pbs != u64::from(x.free_pbs)
                    || split != usize::from(x.split_pbs)
                {
                    return Err(InvariantError::Section {
                        pfn: span.section_start(index),
                    });
                }
                bucketed += u64::from(x.free_pbs > 0 && !self.isolated(slot));
                // A free section of an isolated span is parked, on no list.
                if x.state == SectionState::Free && self.isolated(slot) {
                    found[Self::list(MAX_ORDER)] += 1;
                }
            }
        }
        self.check_section_buckets(bucketed, node)?;
        for k in PB_SHIFT as u8..=MAX_ORDER {
            let n = found[Self::list(k)];
            if n != self.counts[Self::list(k)] {
                return Err(counter);
            }
            free += n << k;
        }
        let mut split_free = 0u64;
        let mut result = Ok(());
        self.for_each_split(|r, h, alloc| {
            if result.is_err() {
                return;
            }
            split_free += u64::from(h.free);
            result = self.check_split(r, h, &alloc, node);
        });
        result?;
        self.check_buckets(node)?;
        self.check_pool(node)?;
        self.check_owners(node)?;
        self.check_isolation(node)?;
        for c in Class::ALL {
            if let Some(r) = self.spare[c.index()] {
                let h = self.meta.pb(r).ok_or(counter)?;
                if h.state != PbState::Split || usize::from(h.free) != FRAMES || h.bucket != 0 {
                    return Err(InvariantError::Pageblock {
                        pfn: self.pb_base(r),
                    });
                }
            }
        }
        let (held, held_dirty) = self.scrub_held();
        free += split_free + held;
        if free != self.free_pages || self.free_pages + self.metadata_frames() > self.managed_pages
        {
            return Err(counter);
        }
        let marked = self.marked_dirty() + held_dirty;
        if marked != self.dirty_pages || marked > self.free_pages {
            return Err(InvariantError::Dirty {
                node,
                counted: self.dirty_pages,
                marked,
            });
        }
        let reported = self.marked_reported(node)?;
        if reported != self.reported_pages || reported > self.free_pages {
            return Err(InvariantError::Reported {
                node,
                counted: self.reported_pages,
                marked: reported,
            });
        }
        for (i, order) in [Order::HUGE_2M, Order::MAX].into_iter().enumerate() {
            let mut cur = self.pools[i].head;
            let mut n = 0;
            while let Some(b) = if i == 1 {
                SecRef::unpack(cur).map(Big::Section)
            } else {
                PbRef::unpack(cur).map(Big::Pb)
            } {
                let pfn = self.base(b);
                let pooled = match b {
                    Big::Section(s) => {
                        self.meta.section(s).map(|x| x.state)
                            == Some(SectionState::Allocated(Use::Pooled))
                    }
                    Big::Pb(r) => {
                        self.meta.pb(r).map(|h| h.state)
                            == Some(PbState::Allocated {
                                order: order.get(),
                                what: Use::Pooled,
                            })
                    }
                };
                if !pooled {
                    return Err(InvariantError::BadFreeTag { pfn, order });
                }
                n += 1;
                if n > self.pools[i].free {
                    return Err(InvariantError::BrokenLink { pfn });
                }
                cur = self.links(b).0;
            }
            if n != self.pools[i].free || self.pools[i].free > self.pools[i].total {
                return Err(counter);
            }
        }
        Ok(())
    }

    /// Checks the metadata pool and its pageblocks: the pool's lists against its counts, every
    /// pool pageblock's `free` against its plane, their list (each of them once), and
    /// `pool_spare` against them all.
    fn check_pool(&self, node: NodeId) -> Result<(), InvariantError> {
        if !self.meta.pool.consistent() {
            return Err(InvariantError::Counter { node });
        }
        let (mut spare, mut pool_pbs) = (0u64, 0u64);
        let mut result = Ok(());
        self.for_each_pb_of_split(|r, h| {
            if h.state != PbState::Pool {
                return;
            }
            let clear = self.meta.plane(r, Which::Alloc).map(|p| FRAMES - p.count());
            if clear != Some(usize::from(h.free)) || self.meta.has_plane(r, Which::Extra) {
                result = Err(InvariantError::Pageblock {
                    pfn: self.pb_base(r),
                });
            }
            spare += u64::from(h.free);
            pool_pbs += 1;
        });
        result?;
        let (mut n, mut prev, mut cur) = (0u64, NIL, self.pool_pbs);
        while let Some(r) = PbRef::unpack(cur) {
            let h = self.meta.pb(r).ok_or(InvariantError::Counter { node })?;
            n += 1;
            if h.state != PbState::Pool || h.prev != prev || n > pool_pbs {
                return Err(InvariantError::Pageblock {
                    pfn: self.pb_base(r),
                });
            }
            (prev, cur) = (cur, h.next);
        }
        if n != pool_pbs {
            return Err(InvariantError::Counter { node });
        }
        if spare != self.pool_spare {
            return Err(InvariantError::Counter { node });
        }
        Ok(())
    }

    /// The free frames the headers and planes mark dirty, counted from scratch: free sections
    /// by their flags, every pageblock of split sections by its own.
    fn marked_dirty(&self) -> u64 {
        let mut dirty = 0;
        for (slot, span) in self.meta.spans() {
            for s in 0..span.sections() {
                let sec = SecRef {
                    span: slot,
                    index: s,
                };
                match self.meta.section(sec) {
                    Some(x) if x.state == SectionState::Free => {
                        dirty += super::dirty::section_frames_dirty(&x);
                    }
                    Some(x) if x.state == SectionState::Split => {
                        dirty += span
                            .section_pbs(s)
                            .map(|pb| {
                                self.pb_dirty(PbRef {
                                    span: slot,
                                    index: pb,
                                })
                            })
                            .sum::<u64>();
                    }
                    _ => {}
                }
            }
        }
        dirty
    }

    /// Walks the free list of `order` from `head` (the zone's for order 18, a section's below),
    /// checking states, alignment, back links and that no block could have merged; adds the
    /// blocks to `found` and returns how many there were.
    fn walk_list(&self, order: u8, head: u32, found: &mut [u64]) -> Result<u64, InvariantError> {
        let list = Self::list(order);
        let (mut cur, mut prev, mut n) = (head, NIL, 0u64);
        while let Some(b) = Self::unpack(order, cur) {
            let pfn = self.base(b);
            let ok = match b {
                Big::Section(s) => {
                    self.meta.section(s).map(|x| x.state) == Some(SectionState::Free)
                }
                Big::Pb(r) => self.meta.pb(r).map(|h| h.state) == Some(PbState::Free { order }),
            };
            if !ok || !pfn.is_aligned(Order::new(order)) {
                return Err(InvariantError::BadFreeTag {
                    pfn,
                    order: Order::new(order),
                });
            }
            let (next, back) = self.links(b);
            if back != prev {
                return Err(InvariantError::BrokenLink { pfn });
            }
            if let Big::Pb(r) = b {
                self.check_unmerged(r, order, pfn)?;
            }
            n += 1;
            found[list] += 1;
            if found[list] > self.counts[list] {
                return Err(InvariantError::BrokenLink { pfn });
            }
            prev = cur;
            cur = next;
        }
        Ok(n)
    }

    /// Every split section with free pageblocks sits in the bucket of its count, once (there are
    /// `expected` of them), and the buckets' bits say which are not empty.
    fn check_section_buckets(&self, expected: u64, node: NodeId) -> Result<(), InvariantError> {
        let mut n = 0u64;
        let all = [PLAIN, SMALL].map(|set| (0..SEC_BUCKETS).map(move |b| (set, b)));
        for (set, b) in all.into_iter().flatten() {
            let head = self.sections[set].heads[b];
            if self.sections[set].nonempty.get(b) != (head != NIL) {
                return Err(InvariantError::Counter { node });
            }
            let (mut cur, mut prev) = (head, NIL);
            while let Some(s) = SecRef::unpack(cur) {
                let x = self
                    .meta
                    .section(s)
                    .ok_or(InvariantError::BrokenLink { pfn: Pfn::new(0) })?;
                let pfn = self
                    .meta
                    .span(s.span)
                    .map_or(Pfn::new(0), |y| y.section_start(s.index));
                if x.prev != prev {
                    return Err(InvariantError::BrokenLink { pfn });
                }
                if x.state != SectionState::Split
                    || x.free_pbs == 0
                    || Self::sec_bucket(x.free_pbs) != b
                    || Self::sec_set(&x) != set
                {
                    return Err(InvariantError::Section { pfn });
                }
                n += 1;
                if n > expected {
                    return Err(InvariantError::BrokenLink { pfn });
                }
                prev = cur;
                cur = x.next;
            }
        }
        if n == expected {
            Ok(())
        } else {
            Err(InvariantError::Counter { node })
        }
    }

    /// A free block of `order` at `pfn` (pageblock `r`) must not have a free buddy of its order.
    fn check_unmerged(&self, r: PbRef, order: u8, pfn: Pfn) -> Result<(), InvariantError> {
        let Some(span) = self.meta.span(r.span) else {
            return Ok(());
        };
        let buddy = Pfn::new(pfn.get() ^ (1u64 << order));
        if !span.range.contains(buddy)
            || buddy.get() + (1u64 << order) > span.range.end().get()
            || !span.pb_is_whole(span.pb_of(buddy))
        {
            return Ok(());
        }
        let b = PbRef {
            span: r.span,
            index: span.pb_of(buddy),
        };
        if order + 1 < MAX_ORDER
            && self.meta.pb(b).map(|h| h.state) == Some(PbState::Free { order })
        {
            return Err(InvariantError::Unmerged { pfn });
        }
        Ok(())
    }

    /// A split pageblock's header agrees with its planes: the free count, the allocated blocks'
    /// shapes (aligned powers of two from a head to the next head or free frame), the count of
    /// blocks above order 0, and frames outside the span allocated.
    fn check_split(
        &self,
        r: PbRef,
        h: crate::meta::PbHeader,
        alloc: &Plane,
        node: NodeId,
    ) -> Result<(), InvariantError> {
        let pfn = self.pb_base(r);
        let bad = InvariantError::Pageblock { pfn };
        let span = self
            .meta
            .span(r.span)
            .ok_or(InvariantError::Counter { node })?;
        let (lo, hi) = span.pb_frames(r.index);
        if !alloc.all(0, lo, true) || !alloc.all(hi, FRAMES - hi, true) {
            return Err(bad);
        }
        if usize::from(h.free) != FRAMES - alloc.count() {
            return Err(bad);
        }
        let Some(extra) = self.meta.plane(r, Which::Extra) else {
            return if h.multi == 0 { Ok(()) } else { Err(bad) };
        };
        let (mut i, mut multi) = (lo, 0u16);
        while i < hi {
            if !alloc.get(i) {
                i += 1;
                continue;
            }
            if !extra.get(i) {
                return Err(bad);
            }
            let mut len = 1;
            while i + len < hi && alloc.get(i + len) && !extra.get(i + len) {
                len += 1;
            }
            if !len.is_power_of_two() || i % len != 0 {
                return Err(bad);
            }
            multi += u16::from(len > 1);
            i += len;
        }
        if multi != h.multi {
            return Err(bad);
        }
        Ok(())
    }

    /// Every bucket lists split pageblocks of its class with at least its free count, each
    /// recorded in that bucket (its band and count), none wholly free; every other split
    /// pageblock with free frames is a spare.
    fn check_buckets(&self, node: NodeId) -> Result<(), InvariantError> {
        let mut listed = 0u64;
        for c in Class::ALL {
            let bucket = &self.buckets[c.index()];
            for key in (0..BANDS * FRAMES).filter(|k| k % FRAMES != 0) {
                let b = key % FRAMES;
                // A bucket marked empty has no head (`PbBuckets`): a pageblock left in one is
                // caught by the count below.
                let mut cur = bucket.head(key);
                let mut prev = NIL;
                while let Some(r) = PbRef::unpack(cur) {
                    let pfn = self.pb_base(r);
                    let h = self.meta.pb(r).ok_or(InvariantError::BrokenLink { pfn })?;
                    if h.state != PbState::Split
                        || h.class != c
                        || usize::from(h.bucket) != key
                        || usize::from(h.free) < b
                        || h.prev != prev
                    {
                        return Err(InvariantError::Pageblock { pfn });
                    }
                    listed += 1;
                    if listed > self.managed_pages {
                        return Err(InvariantError::BrokenLink { pfn });
                    }
                    prev = cur;
                    cur = h.next;
                }
            }
            if (0..BANDS).any(|band| bucket.nonempty(band).get(0)) {
                return Err(InvariantError::Counter { node });
            }
        }
        let mut expected = 0u64;
        let mut unlisted_with_bucket = None;
        self.for_each_split(|r, h, _| {
            if h.free > 0
                && self.spare[h.class.index()] != Some(r)
                && !self.scrub_holds_pb(r)
                && !self.isolated(r.span)
            {
                expected += 1;
            } else if h.bucket != 0 {
                // In no bucket, so it must record none.
                unlisted_with_bucket.get_or_insert(r);
            }
        });
        if let Some(r) = unlisted_with_bucket {
            return Err(InvariantError::Pageblock {
                pfn: self.pb_base(r),
            });
        }
        if listed != expected {
            return Err(InvariantError::Counter { node });
        }
        Ok(())
    }
}

/// Counts the free frames of `alloc` in `off..off + 2^order` as maximal aligned free blocks.
fn cut(alloc: &Plane, off: usize, order: u8, counts: &mut [u64; NR_ORDERS]) {
    let len = 1usize << order;
    if alloc.all(off, len, false) {
        counts[usize::from(order)] += 1;
    } else if order > 0 && !alloc.all(off, len, true) {
        cut(alloc, off, order - 1, counts);
        cut(alloc, off + len / 2, order - 1, counts);
    }
}
