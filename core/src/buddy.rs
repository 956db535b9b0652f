//! One zone's buddy free lists, over the metadata of [`meta`](crate::meta).
//!
//! A [`FreeArea`] lives inside its zone's lock. Free lists are doubly linked through the
//! metadata entries of the blocks' head frames, with zone-relative indices, so the allocator
//! never reads or writes a free frame.
#![deny(unsafe_code)]

use crate::addr::{MAX_ORDER, NR_ORDERS, Order, Pfn, PhysRange};
use crate::error::{FreeError, InvariantError};
use crate::meta::{MAX_SPANS_PER_ZONE, NIL, Span, SpanList, tag};
use crate::topology::NodeId;

/// The free lists and counters of one zone.
///
/// Invariants (checked by [`FreeArea::check`]):
/// - list `k` holds exactly `counts[k]` blocks, each naturally aligned, inside one span, tagged
///   `FREE | k`, and doubly linked;
/// - no free block's buddy is free at the same order (they would have merged);
/// - `free_pages == Σ counts[k] · 2^k` and `free_pages <= managed_pages`;
/// - every frame of every span is in exactly one block, free or handed out.
#[derive(Debug)]
pub(crate) struct FreeArea {
    base: u64,
    heads: [u32; NR_ORDERS],
    counts: [u64; NR_ORDERS],
    pub(crate) free_pages: u64,
    pub(crate) managed_pages: u64,
    /// Huge-page pools, 2 MiB then 1 GiB.
    pools: [Pool; 2],
}

/// A huge-page pool of one size in one zone. Its pages are blocks taken from the buddy and
/// tagged `ALLOCATED | HUGE | order`; those free in the pool also carry `POOLED` and are linked
/// (singly, through `next`) from `head`.
#[derive(Clone, Copy, Debug)]
struct Pool {
    head: u32,
    free: u64,
    total: u64,
}

const POOL_EMPTY: Pool = Pool {
    head: NIL,
    free: 0,
    total: 0,
};

/// The pool index of a huge-page order: 9 (2 MiB) is 0, 18 (1 GiB) is 1.
pub(crate) fn pool_index(order: Order) -> Option<usize> {
    match order.get() {
        9 => Some(0),
        MAX_ORDER => Some(1),
        _ => None,
    }
}

impl FreeArea {
    /// An empty area.
    pub(crate) const fn new() -> Self {
        Self {
            base: 0,
            heads: [NIL; NR_ORDERS],
            counts: [0; NR_ORDERS],
            free_pages: 0,
            managed_pages: 0,
            pools: [POOL_EMPTY; 2],
        }
    }

    /// `true` if `range` can join this zone: room for another span, and zone-relative indices
    /// still fit in 32 bits.
    pub(crate) fn can_add(&self, sp: &SpanList, range: PhysRange) -> bool {
        let base = if sp.len() == 0 {
            range.start().get() & !((1 << MAX_ORDER) - 1)
        } else {
            self.base
        };
        sp.len() < MAX_SPANS_PER_ZONE
            && range.start().get() >= base
            && range.end().get() - base < u64::from(NIL)
    }

    /// Adds a span and frees all its frames as maximal aligned blocks: O(blocks).
    /// The caller has checked [`FreeArea::can_add`].
    pub(crate) fn add_span(&mut self, sp: &SpanList, span: Span) {
        if sp.len() == 0 {
            self.base = span.range().start().get() & !((1 << MAX_ORDER) - 1);
        }
        let range = span.range();
        if !sp.push(span) {
            return;
        }
        self.managed_pages += range.frames();
        let mut pfn = range.start().get();
        while pfn < range.end().get() {
            let align = if pfn == 0 {
                MAX_ORDER
            } else {
                (pfn.trailing_zeros() as u8).min(MAX_ORDER)
            };
            let fit = (63 - (range.end().get() - pfn).leading_zeros()) as u8;
            let order = Order::new(align.min(fit));
            self.push(sp, &span, Pfn::new(pfn), order);
            pfn += order.frames();
        }
    }

    fn idx(&self, pfn: Pfn) -> u32 {
        (pfn.get() - self.base) as u32
    }

    fn pfn(&self, idx: u32) -> Pfn {
        Pfn::new(self.base + u64::from(idx))
    }

    fn push(&mut self, sp: &SpanList, span: &Span, pfn: Pfn, order: Order) {
        let k = order.index();
        let head = self.heads[k];
        span.set_entry(pfn, tag::FREE | u32::from(order.get()), head, NIL);
        if head != NIL {
            let h = self.pfn(head);
            near(sp, span, h).set_prev(h, self.idx(pfn));
        }
        self.heads[k] = self.idx(pfn);
        self.counts[k] += 1;
        self.free_pages += order.frames();
    }

    /// Unlinks a free block and clears its tag.
    fn unlink(&mut self, sp: &SpanList, span: &Span, pfn: Pfn, order: Order) {
        let (next, prev) = span.links(pfn);
        if prev == NIL {
            self.heads[order.index()] = next;
        } else {
            let p = self.pfn(prev);
            near(sp, span, p).set_next(p, next);
        }
        if next != NIL {
            let n = self.pfn(next);
            near(sp, span, n).set_prev(n, prev);
        }
        span.set_tag(pfn, 0);
        self.counts[order.index()] -= 1;
        self.free_pages -= order.frames();
    }

    /// Takes the first block of the smallest non-empty list of order `>= order`.
    fn take(&mut self, sp: &SpanList, order: Order) -> Option<(Span, Pfn, Order)> {
        let k = (order.index()..NR_ORDERS).find(|&k| self.heads[k] != NIL)?;
        let pfn = self.pfn(self.heads[k]);
        let span = span_for(sp, pfn);
        let got = Order::new(k as u8);
        self.unlink(sp, &span, pfn, got);
        Some((span, pfn, got))
    }

    /// Allocates one block of `order`, marking it with `extra` tag bits beside `ALLOCATED`.
    pub(crate) fn alloc(&mut self, sp: &SpanList, order: Order, extra: u32) -> Option<Pfn> {
        let (span, pfn, mut got) = self.take(sp, order)?;
        while got > order {
            got = Order::new(got.get() - 1);
            self.push(sp, &span, Pfn::new(pfn.get() + got.frames()), got);
        }
        span.set_tag(pfn, tag::ALLOCATED | extra | u32::from(order.get()));
        Some(pfn)
    }

    /// Fills `out` with order-0 frames; returns how many it placed. Whole blocks that fit in
    /// what is left are handed out frame by frame without being split level by level.
    pub(crate) fn alloc_bulk(&mut self, sp: &SpanList, out: &mut [Pfn], extra: u32) -> usize {
        let mut n = 0;
        while n < out.len() {
            let Some((span, pfn, got)) = self.take(sp, Order::ZERO) else {
                break;
            };
            let want = (out.len() - n) as u64;
            let mut order = got;
            while order.frames() > want {
                order = Order::new(order.get() - 1);
                self.push(sp, &span, Pfn::new(pfn.get() + order.frames()), order);
            }
            for i in 0..order.frames() {
                let f = Pfn::new(pfn.get() + i);
                span.set_tag(f, tag::ALLOCATED | extra);
                out[n] = f;
                n += 1;
            }
        }
        n
    }

    /// Checks that `pfn` heads a block allocated with `order` whose tag also carries exactly
    /// the `extra` bits; returns its span. Changes nothing.
    pub(crate) fn check_allocated(
        &self,
        sp: &SpanList,
        pfn: Pfn,
        order: Order,
        extra: u32,
    ) -> Result<Span, FreeError> {
        let span = sp.find(pfn).ok_or(FreeError::Foreign { pfn })?;
        if !pfn.is_aligned(order) {
            return Err(FreeError::Misaligned { pfn, order });
        }
        classify(span.tag(pfn), pfn, order, extra)?;
        if !span.holds(pfn, order) {
            return Err(FreeError::Foreign { pfn });
        }
        Ok(span)
    }

    /// Frees a block that [`FreeArea::check_allocated`] accepted, merging it with free buddies.
    pub(crate) fn free_checked(&mut self, sp: &SpanList, span: &Span, pfn: Pfn, order: Order) {
        span.set_tag(pfn, 0);
        self.merge_in(sp, span, pfn, order);
    }

    /// Checks and frees one block; on error nothing changes.
    pub(crate) fn free(
        &mut self,
        sp: &SpanList,
        pfn: Pfn,
        order: Order,
        extra: u32,
    ) -> Result<(), FreeError> {
        let span = self.check_allocated(sp, pfn, order, extra)?;
        // A per-CPU free may race on the same frame without this lock: whoever swaps the tag
        // owns the free, the other sees the misuse.
        let held = tag::ALLOCATED | extra | u32::from(order.get());
        if let Err(found) = span.swap_tag(pfn, held, 0) {
            return Err(classify(found, pfn, order, extra)
                .err()
                .unwrap_or(FreeError::NotAllocated { pfn }));
        }
        self.merge_in(sp, &span, pfn, order);
        Ok(())
    }

    fn merge_in(&mut self, sp: &SpanList, span: &Span, mut pfn: Pfn, mut order: Order) {
        while order.get() < MAX_ORDER {
            let buddy = Pfn::new(pfn.get() ^ order.frames());
            if !span.holds(buddy, order) || span.tag(buddy) != tag::FREE | u32::from(order.get()) {
                break;
            }
            self.unlink(sp, span, buddy, order);
            pfn = Pfn::new(pfn.get() & !order.frames());
            order = Order::new(order.get() + 1);
        }
        self.push(sp, span, pfn, order);
    }

    /// Moves one block of a huge-page `order` from the buddy into the pool; `false` if the
    /// buddy has none.
    pub(crate) fn pool_grow(&mut self, sp: &SpanList, order: Order) -> bool {
        let Some(i) = pool_index(order) else {
            return false;
        };
        let Some(pfn) = self.alloc(sp, order, tag::HUGE | tag::POOLED) else {
            return false;
        };
        self.pool_link(sp, i, pfn);
        self.pools[i].total += 1;
        true
    }

    fn pool_link(&mut self, sp: &SpanList, i: usize, pfn: Pfn) {
        let span = span_for(sp, pfn);
        span.set_next(pfn, self.pools[i].head);
        self.pools[i].head = self.idx(pfn);
        self.pools[i].free += 1;
    }

    fn pool_pop(&mut self, sp: &SpanList, i: usize) -> Option<(Span, Pfn)> {
        let head = self.pools[i].head;
        if head == NIL {
            return None;
        }
        let pfn = self.pfn(head);
        let span = span_for(sp, pfn);
        self.pools[i].head = span.links(pfn).0;
        self.pools[i].free -= 1;
        Some((span, pfn))
    }

    /// Takes a free page from the pool of `order`.
    pub(crate) fn pool_take(&mut self, sp: &SpanList, order: Order) -> Option<Pfn> {
        let (span, pfn) = self.pool_pop(sp, pool_index(order)?)?;
        span.set_tag(pfn, tag::ALLOCATED | tag::HUGE | u32::from(order.get()));
        Some(pfn)
    }

    /// Returns a pool page; on error nothing changes.
    pub(crate) fn pool_put(
        &mut self,
        sp: &SpanList,
        pfn: Pfn,
        order: Order,
    ) -> Result<(), FreeError> {
        let i = pool_index(order).ok_or(FreeError::NotAllocated { pfn })?;
        let span = self.check_allocated(sp, pfn, order, tag::HUGE)?;
        span.set_tag(
            pfn,
            tag::ALLOCATED | tag::HUGE | tag::POOLED | u32::from(order.get()),
        );
        self.pool_link(sp, i, pfn);
        Ok(())
    }

    /// Gives one free pool page of `order` back to the buddy; `false` if none is free.
    pub(crate) fn pool_shrink(&mut self, sp: &SpanList, order: Order) -> bool {
        let Some(i) = pool_index(order) else {
            return false;
        };
        let Some((span, pfn)) = self.pool_pop(sp, i) else {
            return false;
        };
        self.pools[i].total -= 1;
        self.free_checked(sp, &span, pfn, order);
        true
    }

    /// `(total, free)` pages of the pool of `order`.
    pub(crate) fn pool_counts(&self, order: Order) -> (u64, u64) {
        pool_index(order).map_or((0, 0), |i| (self.pools[i].total, self.pools[i].free))
    }

    /// Free blocks of each order (`/proc/buddyinfo`).
    pub(crate) fn buddyinfo(&self) -> [u64; NR_ORDERS] {
        self.counts
    }

    /// Walks every list and counter; see the invariants on [`FreeArea`].
    pub(crate) fn check(&self, sp: &SpanList, node: NodeId) -> Result<(), InvariantError> {
        let mut pages = 0u64;
        for order in Order::all() {
            let k = order.index();
            let mut prev = NIL;
            let mut cur = self.heads[k];
            let mut n = 0u64;
            while cur != NIL {
                let pfn = self.pfn(cur);
                let span = sp.find(pfn).ok_or(InvariantError::BrokenLink { pfn })?;
                if !pfn.is_aligned(order)
                    || !span.holds(pfn, order)
                    || span.tag(pfn) != tag::FREE | u32::from(order.get())
                {
                    return Err(InvariantError::BadFreeTag { pfn, order });
                }
                let (next, back) = span.links(pfn);
                if back != prev {
                    return Err(InvariantError::BrokenLink { pfn });
                }
                let buddy = Pfn::new(pfn.get() ^ order.frames());
                if order.get() < MAX_ORDER
                    && span.holds(buddy, order)
                    && span.tag(buddy) == tag::FREE | u32::from(order.get())
                {
                    return Err(InvariantError::Unmerged { pfn });
                }
                n += 1;
                if n > self.counts[k] {
                    return Err(InvariantError::BrokenLink { pfn });
                }
                prev = cur;
                cur = next;
            }
            if n != self.counts[k] {
                return Err(InvariantError::Counter { node });
            }
            pages += n << k;
        }
        if pages != self.free_pages || self.free_pages > self.managed_pages {
            return Err(InvariantError::Counter { node });
        }
        for (i, order) in [Order::HUGE_2M, Order::MAX].into_iter().enumerate() {
            let want = tag::ALLOCATED | tag::HUGE | tag::POOLED | u32::from(order.get());
            let mut cur = self.pools[i].head;
            let mut n = 0;
            while cur != NIL {
                let pfn = self.pfn(cur);
                let span = sp.find(pfn).ok_or(InvariantError::BrokenLink { pfn })?;
                if span.tag(pfn) != want {
                    return Err(InvariantError::BadFreeTag { pfn, order });
                }
                n += 1;
                if n > self.pools[i].free {
                    return Err(InvariantError::BrokenLink { pfn });
                }
                cur = span.links(pfn).0;
            }
            if n != self.pools[i].free || self.pools[i].free > self.pools[i].total {
                return Err(InvariantError::Counter { node });
            }
        }
        Ok(())
    }
}

/// The span of `pfn`, trying `span` first: list neighbours mostly share a span.
fn near(sp: &SpanList, span: &Span, pfn: Pfn) -> Span {
    if span.range().contains(pfn) {
        *span
    } else {
        span_for(sp, pfn)
    }
}

/// The span of a block on one of this zone's lists: it exists, or the lists are corrupt.
fn span_for(sp: &SpanList, pfn: Pfn) -> Span {
    sp.find(pfn).expect("free-list block outside every span")
}

/// Maps the tag found at `pfn` to the free error it means, if any.
pub(crate) fn classify(found: u32, pfn: Pfn, order: Order, extra: u32) -> Result<(), FreeError> {
    if found == 0 {
        return Err(FreeError::NotAllocated { pfn });
    }
    if found & (tag::FREE | tag::POOLED) != 0 {
        return Err(FreeError::DoubleFree { pfn });
    }
    if found & tag::HUGE != 0 && extra & tag::HUGE == 0 {
        return Err(FreeError::HugePage { pfn });
    }
    if found & tag::CACHED != 0 && extra & tag::CACHED == 0 {
        return Err(FreeError::DoubleFree { pfn });
    }
    let Some(allocated) = Order::try_new((found & tag::ORDER_MASK) as u8) else {
        return Err(FreeError::NotAllocated { pfn });
    };
    if allocated != order {
        return Err(FreeError::WrongOrder {
            pfn,
            given: order,
            allocated,
        });
    }
    if found != tag::ALLOCATED | extra | u32::from(order.get()) {
        return Err(FreeError::NotAllocated { pfn });
    }
    Ok(())
}
