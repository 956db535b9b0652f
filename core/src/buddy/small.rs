//! Blocks below 2 MiB: split pageblocks, their occupancy buckets, and the frees that land in
//! them.
//!
//! Placement, section first: a request goes to the fullest 1 GiB section that can serve it,
//! and there to the most occupied pageblock of its class, with sections in two bands by their
//! free pageblocks (band 1, *emptying*: at least three quarters free). An order-0 request takes
//! the most occupied split pageblock of its class in a band-0 section (the lowest non-empty
//! bucket of band 0, found in O(1) from the bucket mask); an order-1..=8 request the most
//! occupied one there with a free aligned run (a bounded look at the fullest candidates). If
//! none can serve, the most occupied pageblock of an emptying section serves, but only when no
//! band-0 section has a free pageblock. Then the class's spare, then a free pageblock from the
//! buddy (the smallest free block first, in a band-0 section first, so sections fill before a
//! new one is broken), and only when none is left does it steal the emptiest pageblock of the
//! other class.
//!
//! So small frames move out of a section whose whole blocks were freed (a guest torn down),
//! and it becomes a whole free section again once its last small frames are freed, rather
//! than keep serving the most occupied pageblocks wherever they lie. Two coarse bands rather
//! than an order by exact section fullness, because where every section is about equally full
//! (LLFree's churn) a section-first order gives up several points of `HBA_9` against the
//! fullest-pageblock order, and the bands leave that order alone there.
#![deny(unsafe_code)]

use super::dirty::{Got, split_dirty};
use super::{BANDS, Big, EMPTYING, FreeArea, NoBlock, PLAIN, PbBuckets, SMALL, band_of};
use crate::addr::{Order, Pfn};
use crate::bitmap::{FRAMES, Plane};
use crate::error::FreeError;
use crate::meta::{
    Class, NIL, Need, PB_SHIFT, PbHeader, PbRef, PbState, SecRef, SectionState, Short, SpanMeta,
    Use, Which, flag,
};

/// How many candidates an order-1..=8 request looks at before it takes a free pageblock.
const RUN_CANDIDATES: usize = 16;

/// What a free finds at its frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Found {
    /// An allocated block of `order` at offset `off` of the split pageblock `r`.
    Small { r: PbRef, off: usize, order: u8 },
    /// The head of a block of whole pageblocks allocated with `order` as `what`.
    Whole { order: u8, what: Use },
    /// A frame of a pageblock lent to a CPU (the CPU's state array knows more).
    Hot { r: PbRef, off: usize },
}

/// `true` if the walk of [`FreeArea::pick`] would take the pageblock `h` heading `bucket`'s
/// fullest band-0 bucket `b` for one frame: the bucket is up to date for it, or frees since
/// left it with more free frames but it is alone in its bucket and no bucket lies between its
/// old count and its new one (the walk would move it to the head of the bucket of its new
/// count and find it there first: a pageblock's count is never below its bucket's, so none in
/// a later bucket is fuller).
fn serves_single(bucket: &PbBuckets, b: usize, h: &PbHeader) -> bool {
    let free = usize::from(h.free);
    free == b
        || (free > b
            && h.next == NIL
            && bucket.nonempty(0).next_set(b + 1).is_none_or(|n| n >= free))
}

/// What settling a split pageblock reads of its header: its class, free frames and place in
/// the buckets. Read field by field from a header just written: a copy of the whole header
/// there loads it wider than the stores that changed it, and stalls on store forwarding (perf
/// on random order-0 frees).
#[derive(Clone, Copy, Debug)]
struct Place {
    class: Class,
    free: u16,
    bucket: u16,
    next: u32,
    prev: u32,
}

impl Place {
    #[inline(always)]
    fn of(h: &PbHeader) -> Place {
        Place {
            class: h.class,
            free: h.free,
            bucket: h.bucket,
            next: h.next,
            prev: h.prev,
        }
    }
}

/// Moves split pageblock `r` (at `at`) from its bucket to the bucket of `key`
/// (`band * FRAMES + free`, `free` in 1..FRAMES) when that touches no other header: it is alone
/// in its bucket, and the new bucket is empty or the same. `false`, with nothing changed,
/// otherwise; the caller records the new bucket in the header.
#[inline(always)]
fn move_alone(bucket: &mut PbBuckets, r: PbRef, at: Place, key: usize) -> bool {
    let old = usize::from(at.bucket);
    if old == 0 || at.next != NIL || at.prev != NIL || (key != old && bucket.occupied(key)) {
        return false;
    }
    bucket.set_head(old, NIL);
    bucket.set_head(key, r.pack());
    true
}

/// The offset of the free aligned run of `order` a split pageblock with planes `alloc` and
/// `extra` hands out: with `zero`, a clean one if it has one.
fn free_run(alloc: &Plane, extra: Option<&Plane>, order: u8, zero: bool) -> Option<usize> {
    let clean = extra
        .filter(|_| zero)
        .and_then(|x| super::dirty::union(alloc, x).find_clear_run(order));
    clean.or_else(|| alloc.find_clear_run(order))
}

/// A split pageblock's place after a free in it, whether it was full before, and how many
/// dirty free frames the free added (`split_dirty` after it less before it).
struct Freed {
    at: Place,
    was_full: bool,
    dirtied: u64,
}

/// The order of the block allocated at offset `off` of a split pageblock with planes `alloc`
/// and `extra`, given that `alloc` marks that frame allocated; `None` if the frame heads no
/// block (it lies inside one). Without an extra plane every allocated frame is an order-0
/// head; with one, the block runs to the next head or free frame.
fn allocated_order(alloc: &Plane, extra: Option<&Plane>, off: usize) -> Option<u8> {
    let Some(x) = extra else {
        return Some(0);
    };
    if !x.get(off) {
        return None;
    }
    let mut len = 1usize;
    while off + len < FRAMES && alloc.get(off + len) && !x.get(off + len) {
        len += 1;
    }
    Some(len.trailing_zeros() as u8)
}

/// `true` if a free (`dirty` or not) into pageblock `h`, with its extra plane `extra`, must
/// first give it an extra plane: a dirty free into a clean pageblock without one (see
/// `keep_clean_apart`).
fn wants_extra(h: &PbHeader, extra: Option<&Plane>, dirty: bool) -> bool {
    dirty && h.flags & flag::DIRTY == 0 && extra.is_none()
}

/// Frees the allocated block of `order` at offset `off` of a split pageblock (its header `h`
/// and planes), dirty or not. With an extra plane, the block's frames were allocated, so they
/// add to the dirty free frames exactly when they are freed dirty; without one, the header
/// counts all free frames as dirty or none.
///
/// Inlined: its result, returned through memory by an out-of-line call and then copied out of
/// the `Option`s around it, cost three store-forwarding stalls per free (perf).
#[inline(always)]
fn free_in(
    h: &mut PbHeader,
    alloc: Option<&mut Plane>,
    extra: Option<&mut Plane>,
    off: usize,
    order: u8,
    dirty: bool,
) -> Freed {
    let len = 1usize << order;
    let was_full = h.free == 0;
    // Only the header counts them without an extra plane.
    let before = extra.is_none().then(|| split_dirty(h, None, None));
    if let Some(a) = alloc {
        a.fill(off, len, false);
    }
    if let Some(x) = extra {
        x.fill(off, len, dirty);
    }
    h.free += len as u16;
    h.multi -= u16::from(order > 0);
    if dirty {
        h.flags |= flag::DIRTY;
    }
    let dirtied = match before {
        // The flag only turns on and the count only grows.
        Some(before) => split_dirty(h, None, None) - before,
        None if dirty => len as u64,
        None => 0,
    };
    Freed {
        at: Place::of(h),
        was_full,
        dirtied,
    }
}

impl FreeArea {
    /// Puts split pageblock `r` of `class` into the bucket for its section's band and its
    /// `free` frames.
    pub(super) fn bucket_insert(&mut self, r: PbRef, class: Class) {
        if let Some(h) = self.meta.pb(r) {
            self.bucket_insert_as(r, class, h.free);
        }
    }

    /// [`FreeArea::bucket_insert`] of a pageblock with `free` free frames (its header in hand).
    /// A pageblock of an isolated span goes in no bucket: nothing is placed there.
    fn bucket_insert_as(&mut self, r: PbRef, class: Class, free: u16) {
        if self.isolated(r.span) {
            return;
        }
        let b = usize::from(free);
        if b == 0 || b >= FRAMES {
            return;
        }
        let band = self.band(r);
        self.bucket_link(r, class, band * FRAMES + b);
    }

    /// The band of the section of pageblock `r`, as its count says now.
    fn band(&self, r: PbRef) -> usize {
        // `r`'s section holds small frames, so it is in the `SMALL` set if it has a free
        // pageblock: while no section there is emptying, every band is 0.
        if self.sections[SMALL]
            .nonempty
            .next_set(Self::sec_bucket(EMPTYING))
            .is_none()
        {
            return 0;
        }
        self.sec_of(r)
            .and_then(|s| self.meta.section(s))
            .map_or(0, |x| band_of(x.free_pbs))
    }

    /// Links split pageblock `r` of `class` at the head of the bucket of `key`
    /// (`band * FRAMES + free`, `free` in 1..FRAMES).
    fn bucket_link(&mut self, r: PbRef, class: Class, key: usize) {
        let bucket = &mut self.buckets[class.index()];
        let head = bucket.head(key);
        bucket.set_head(key, r.pack());
        self.meta.update_pb(r, |h| {
            h.bucket = key as u16;
            h.next = head;
            h.prev = NIL;
        });
        if let Some(n) = PbRef::unpack(head) {
            self.meta.update_pb(n, |h| h.prev = r.pack());
        }
    }

    /// Takes split pageblock `r` out of the bucket it sits in, if any.
    pub(super) fn bucket_remove(&mut self, r: PbRef) {
        if let Some(h) = self.meta.pb(r) {
            self.bucket_remove_as(r, Place::of(&h));
        }
    }

    /// [`FreeArea::bucket_remove`] with `r`'s header `h` in hand.
    fn bucket_remove_as(&mut self, r: PbRef, at: Place) {
        let key = usize::from(at.bucket);
        if key == 0 {
            return;
        }
        let (next, prev) = (at.next, at.prev);
        let bucket = &mut self.buckets[at.class.index()];
        match PbRef::unpack(prev) {
            None => bucket.set_head(key, next),
            Some(p) => {
                self.meta.update_pb(p, |x| x.next = next);
            }
        }
        if let Some(n) = PbRef::unpack(next) {
            self.meta.update_pb(n, |x| x.prev = prev);
        }
        self.meta.update_pb(r, |x| {
            x.bucket = 0;
            x.next = NIL;
            x.prev = NIL;
        });
    }

    /// Makes an edge pageblock a split one with `flags`: its frames outside the span stay
    /// allocated forever.
    pub(super) fn add_edge_pb(
        &mut self,
        r: PbRef,
        span: &SpanMeta,
        flags: u8,
    ) -> Result<(), Short> {
        let (lo, hi) = span.pb_frames(r.index);
        let mut alloc = Plane::FULL;
        alloc.fill(lo, hi - lo, false);
        self.meta.set_planes(r, alloc, None, Need::Growth)?;
        self.meta.update_pb(r, |h| {
            h.state = PbState::Split;
            h.class = Class::Long;
            h.flags = flags;
            h.free = (hi - lo) as u16;
            h.multi = 0;
        });
        self.count_split(r, true);
        self.free_pages += (hi - lo) as u64;
        if flags & flag::DIRTY != 0 {
            self.dirty_pages += (hi - lo) as u64;
        }
        self.settle(r);
        Ok(())
    }

    /// Puts a split pageblock where its free count says: a bucket, the spare slot (merging the
    /// previous spare), or nowhere when it is full.
    pub(super) fn settle(&mut self, r: PbRef) {
        if let Some(h) = self.meta.pb(r) {
            self.settle_as(r, h.class, h.free);
        }
    }

    /// [`FreeArea::settle`] of a pageblock of `class` with `free` free frames, out of every
    /// bucket.
    fn settle_as(&mut self, r: PbRef, class: Class, free: u16) {
        let whole = self.meta.span(r.span).is_some_and(|s| {
            let (lo, hi) = s.pb_frames(r.index);
            lo == 0 && hi == FRAMES && usize::from(free) == FRAMES
        });
        if whole {
            if self.isolated(r.span) {
                // No spare in isolated memory: it merges into the span's free blocks at once.
                self.unsplit(r);
                return;
            }
            if let Some(old) = self.spare[class.index()].replace(r)
                && old != r
            {
                self.unsplit(old);
            }
        } else if free > 0 {
            self.bucket_insert_as(r, class, free);
        }
    }

    /// Allocates a block of `order` (below 9) for `class`; for a zeroed allocation (`zero`)
    /// a clean run of the pageblock is preferred. A request below 2 MiB never breaks a free
    /// pageblock while a split one can serve it, dirty or not: clearing a few frames is cheaper
    /// than losing a clean large block.
    pub(crate) fn alloc_small(
        &mut self,
        order: u8,
        class: Class,
        zero: bool,
    ) -> Result<Got, NoBlock> {
        if order == 0
            && let Some(got) = self.take_single(class, zero, u32::MAX)
        {
            return Ok(got);
        }
        let r = self.pick(order, class)?;
        if order > 0
            && let Err(short) = self.ensure_extra(r)
        {
            self.settle(r);
            return Err(short.into());
        }
        Ok(self.take_from(r, order, zero))
    }

    /// Gives split pageblock `r` an extra plane if it has none: until now every allocated frame
    /// was an order-0 head, and the free ones shared the pageblock's dirty flag.
    pub(super) fn ensure_extra(&mut self, r: PbRef) -> Result<(), Short> {
        if self.meta.has_plane(r, Which::Extra) {
            return Ok(());
        }
        let alloc = self.meta.plane(r, Which::Alloc).unwrap_or(Plane::FULL);
        let dirty = self.meta.pb(r).is_some_and(|h| h.flags & flag::DIRTY != 0);
        let extra = if dirty { Plane::FULL } else { alloc };
        self.meta.set_planes(r, alloc, Some(extra), self.need)
    }

    /// Before a dirty free into clean split pageblock `r` without an extra plane, gives it one
    /// if the pool can spare it: its clean free frames stay known clean (and
    /// [`FreeArea::bulk_undo`] restores the dirty count exactly). Without one, the whole
    /// pageblock's free frames turn dirty.
    fn keep_clean_apart(&mut self, r: PbRef) {
        let wants = self.meta.with_pb(r, |h, _, extra| {
            h.flags & flag::DIRTY == 0 && extra.is_none()
        });
        if wants == Some(true) {
            let _ = self.ensure_extra(r);
        }
    }

    /// Fills `out` with order-0 frames for `class`, taking every free frame of each pageblock it
    /// picks before the next. Returns how many it placed, how many of those may be dirty, and
    /// why it stopped short. With `zero`, the dirty frames are the last ones placed (so the
    /// caller clears only those); without it the dirty count is 0.
    pub(crate) fn alloc_bulk(
        &mut self,
        out: &mut [Pfn],
        class: Class,
        zero: bool,
    ) -> (usize, usize, Option<NoBlock>) {
        let len = out.len();
        // Clean frames fill `out` from the front, dirty ones (with `zero`) from the back.
        let (mut front, mut back) = (0, 0);
        let mut why = None;
        while front + back < len {
            let r = match self.pick(0, class) {
                Ok(r) => r,
                Err(e) => {
                    why = Some(e);
                    break;
                }
            };
            let base = self.pb_base(r).get();
            // One lookup for the header and planes; every free frame, word by word.
            let taken = self.meta.with_pb_mut(r, |h, alloc, mut extra| {
                let alloc = alloc?;
                let before = split_dirty(h, Some(alloc), extra.as_deref());
                let flag_dirty = h.flags & flag::DIRTY != 0;
                let mut got = 0u16;
                for w in 0..alloc.0.len() {
                    let mut free = !alloc.0[w];
                    let mut took = 0u64;
                    while free != 0 && front + back < len {
                        let bit = free.trailing_zeros();
                        free &= free - 1;
                        took |= 1 << bit;
                        let i = w * 64 + bit as usize;
                        let dirty = extra.as_deref().map_or(flag_dirty, |x| x.get(i));
                        let pfn = Pfn::new(base + i as u64);
                        if zero && dirty {
                            back += 1;
                            out[len - back] = pfn;
                        } else {
                            out[front] = pfn;
                            front += 1;
                        }
                    }
                    alloc.0[w] |= took;
                    if let Some(x) = extra.as_deref_mut() {
                        // Each frame heads its own block.
                        x.0[w] |= took;
                    }
                    got += took.count_ones() as u16;
                }
                h.free -= got;
                h.flags &= !flag::REPORTED;
                let after = split_dirty(h, Some(alloc), extra.as_deref());
                Some((got, before, after, h.class, h.free))
            });
            let Some(Some((got, before, after, class, free))) = taken else {
                self.settle(r);
                break;
            };
            self.dirty_pages = (self.dirty_pages + after).saturating_sub(before);
            self.free_pages -= u64::from(got);
            self.settle_as(r, class, free);
        }
        if back > 0 && front + back < len {
            out.copy_within(len - back..len, front);
        }
        (front + back, back, why)
    }

    /// The pageblock a request of `order` (below 9) for `class` takes a block from, out of every
    /// bucket (`settle` puts it back after the allocation): the fullest that can serve it in a
    /// section of band 0; else, unless a section of band 0 has a free pageblock, the fullest
    /// one in an emptying section; else the spare, or a claimed pageblock (of a band-0 section
    /// if one has a free pageblock).
    pub(super) fn pick(&mut self, order: u8, class: Class) -> Result<PbRef, NoBlock> {
        if order == 0
            && let Some(r) = self.pick_single(class)
        {
            return Ok(r);
        }
        if let Some(r) = self.pick_bucket(order, class, 0) {
            self.bucket_remove(r);
            return Ok(r);
        }
        let fuller = self.fuller_sets();
        if fuller.is_none()
            && let Some(r) = self.pick_bucket(order, class, 1)
        {
            self.bucket_remove(r);
            return Ok(r);
        }
        if let Some(r) = self.spare[class.index()].take() {
            return Ok(r);
        }
        match self.claim_in(class, fuller.unwrap_or([SMALL, PLAIN])) {
            Err(NoBlock::Empty) => {}
            r => return r,
        }
        let other = Class::ALL.into_iter().find(|c| *c != class);
        if let Some(other) = other
            && let Some(r) = self.spare[other.index()]
                .take()
                .or_else(|| self.emptiest(other, order))
        {
            self.bucket_remove(r);
            self.meta.update_pb(r, |h| h.class = class);
            return Ok(r);
        }
        Err(NoBlock::Empty)
    }

    /// The common cases of [`FreeArea::pick`] for one frame, with one look at the header: the
    /// first pageblock of `class`'s fullest band-0 bucket, out of it, if the general walk would
    /// take it too (`serves_single`); else `None`.
    fn pick_single(&mut self, class: Class) -> Option<PbRef> {
        let bucket = &self.buckets[class.index()];
        let (b, head) = bucket.first_from(0, 1)?;
        let r = PbRef::unpack(head)?;
        let h = self.meta.pb(r)?;
        if !serves_single(bucket, b, &h) || self.band(r) != 0 {
            return None;
        }
        self.bucket_remove_as(r, Place::of(&h));
        Some(r)
    }

    /// The common order-0 allocation in one look at the pageblock: the frame [`FreeArea::pick`]
    /// and [`FreeArea::take_from`] would take from the pageblock [`FreeArea::pick_single`]
    /// finds, with the same result. When the pageblock is alone in its bucket and the bucket
    /// of its new count is empty, it moves there without touching another header; otherwise
    /// (or when it fills up) it leaves its bucket and settles as usual. `None`, with nothing
    /// changed, when `pick_single` would not take it, or when it has `under` free frames or
    /// more.
    ///
    /// Inlined: the node API's order-0 allocation runs it, and a call (it has two callers)
    /// cost it about 20 instructions (callgrind); there `under` is `u32::MAX`, a bound no
    /// count reaches, so the check folds away.
    #[inline(always)]
    pub(super) fn take_single(&mut self, class: Class, zero: bool, under: u32) -> Option<Got> {
        let bucket = &self.buckets[class.index()];
        let (b, head) = bucket.first_from(0, 1)?;
        let r = PbRef::unpack(head)?;
        if self.band(r) != 0 {
            return None;
        }
        let (off, dirty, at) = self.meta.with_pb_mut(r, |h, alloc, extra| {
            if u32::from(h.free) >= under || !serves_single(&self.buckets[class.index()], b, h) {
                return None;
            }
            let alloc = alloc?;
            let off = free_run(alloc, extra.as_deref(), 0, zero)?;
            // What the frame adds to the dirty free count (`split_dirty`) leaves it.
            let dirty = extra
                .as_deref()
                .map_or(h.flags & flag::DIRTY != 0, |x| x.get(off));
            alloc.put(off, true);
            if let Some(x) = extra {
                // An order-0 block is its own head.
                x.put(off, true);
            }
            h.free -= 1;
            h.flags &= !flag::REPORTED;
            let key = usize::from(h.free);
            if key > 0 && move_alone(&mut self.buckets[class.index()], r, Place::of(h), key) {
                h.bucket = key as u16;
                return Some((off, dirty, None));
            }
            // Its bucket links, still those it had.
            Some((off, dirty, Some(Place::of(h))))
        })??;
        if let Some(at) = at {
            self.bucket_remove_as(r, at);
            self.settle_as(r, at.class, at.free);
        }
        self.dirty_pages -= u64::from(dirty);
        self.free_pages -= 1;
        let pfn = Pfn::new(self.pb_base(r).get() + off as u64);
        Some(Got::one(pfn, dirty))
    }

    /// The fullest pageblock of `class` with at least `min_free` free frames, out of its bucket,
    /// by the order of [`FreeArea::pick`].
    pub(super) fn pick_min(&mut self, class: Class, min_free: usize) -> Option<PbRef> {
        if min_free <= 1 {
            return None;
        }
        let from = min_free.min(FRAMES - 1);
        let r = match self.fullest(class, 0, from, |_, _| Some(true)) {
            Some(r) => r,
            None if self.fuller_sets().is_none() => {
                self.fullest(class, 1, from, |_, _| Some(true))?
            }
            None => return None,
        };
        self.bucket_remove(r);
        Some(r)
    }

    /// The fullest pageblock of `class`'s buckets of `band` that can serve `order`, still in its
    /// bucket; gives up after [`RUN_CANDIDATES`] pageblocks with enough free frames but no free
    /// run.
    fn pick_bucket(&mut self, order: u8, class: Class, band: usize) -> Option<PbRef> {
        let mut looked = 0;
        self.fullest(class, band, 1usize << order, |area, r| {
            let fits = order == 0
                || area
                    .meta
                    .plane(r, Which::Alloc)
                    .and_then(|p| p.find_clear_run(order))
                    .is_some();
            looked += 1;
            (fits || looked < RUN_CANDIDATES).then_some(fits)
        })
    }

    /// Walks `class`'s buckets of `band` from `from` free frames up, fullest first, and returns
    /// the first pageblock `accept` takes (`Some(true)`), still in its bucket; `accept` stops
    /// the walk with `None`. Pageblocks found out of date (frees since they were bucketed, or
    /// in band 0 while their section is emptying) move to the buckets they belong in on the
    /// way.
    fn fullest(
        &mut self,
        class: Class,
        band: usize,
        from: usize,
        mut accept: impl FnMut(&Self, PbRef) -> Option<bool>,
    ) -> Option<PbRef> {
        match self.walk_buckets(class, band, from, &mut accept) {
            Walk::Took(r) => Some(r),
            Walk::GaveUp => None,
            // Frees leave a pageblock in the bucket of a smaller count, so one below `from`
            // may have `from` free frames or more: before the caller breaks a free pageblock,
            // those move where they belong and the walk runs again.
            Walk::Exhausted if from > 1 && self.rebucket_below(class, band, from) => {
                match self.walk_buckets(class, band, from, &mut accept) {
                    Walk::Took(r) => Some(r),
                    Walk::GaveUp | Walk::Exhausted => None,
                }
            }
            Walk::Exhausted => None,
        }
    }

    /// [`FreeArea::fullest`]'s walk over the buckets from `from` free frames up.
    fn walk_buckets(
        &mut self,
        class: Class,
        band: usize,
        from: usize,
        accept: &mut impl FnMut(&Self, PbRef) -> Option<bool>,
    ) -> Walk {
        let mut from = from;
        while let Some((b, head)) = self.buckets[class.index()].first_from(band, from) {
            let mut cur = head;
            while let Some(r) = PbRef::unpack(cur) {
                let Some(h) = self.meta.pb(r) else {
                    return Walk::GaveUp;
                };
                cur = h.next;
                // Out of date, or its section started emptying since. (One left in band 1
                // by a section that has filled up again moves back when an allocation next
                // finds it there.)
                if usize::from(h.free) != b || band == 0 && self.band(r) != 0 {
                    self.bucket_remove(r);
                    self.bucket_insert(r, class);
                    continue;
                }
                match accept(self, r) {
                    Some(true) => return Walk::Took(r),
                    Some(false) => {}
                    None => return Walk::GaveUp,
                }
            }
            from = b + 1;
        }
        Walk::Exhausted
    }

    /// Moves the out-of-date pageblocks of `class`'s buckets of `band` below `below` free
    /// frames to the buckets they belong in; `true` if one of them now lies at `below` or
    /// above.
    fn rebucket_below(&mut self, class: Class, band: usize, below: usize) -> bool {
        let mut moved_up = false;
        let mut low = 1;
        while let Some((b, head)) = self.buckets[class.index()].first_from(band, low) {
            if b >= below {
                break;
            }
            let mut cur = head;
            while let Some(r) = PbRef::unpack(cur) {
                let Some(h) = self.meta.pb(r) else {
                    return moved_up;
                };
                cur = h.next;
                if usize::from(h.free) != b || band == 0 && self.band(r) != 0 {
                    self.bucket_remove(r);
                    self.bucket_insert(r, class);
                    moved_up |= usize::from(h.free) >= below;
                }
            }
            low = b + 1;
        }
        moved_up
    }

    /// The emptiest split pageblock of `class` with a free run of `order`, in the emptiest band
    /// that has one (for stealing). Frees leave pageblocks in buckets of smaller counts, so
    /// every bucketed pageblock is looked at by its own count (a steal is rare: no free
    /// pageblock is left).
    fn emptiest(&mut self, class: Class, order: u8) -> Option<PbRef> {
        for band in (0..BANDS).rev() {
            let mut best: Option<(u16, PbRef)> = None;
            let mut from = 1;
            while let Some((b, head)) = self.buckets[class.index()].first_from(band, from) {
                let mut cur = head;
                while let Some(r) = PbRef::unpack(cur) {
                    let h = self.meta.pb(r)?;
                    cur = h.next;
                    if best.is_some_and(|(f, _)| f >= h.free) || h.free < 1 << order {
                        continue;
                    }
                    if self
                        .meta
                        .plane(r, Which::Alloc)
                        .and_then(|p| p.find_clear_run(order))
                        .is_some()
                    {
                        best = Some((h.free, r));
                    }
                }
                from = b + 1;
            }
            if let Some((_, r)) = best {
                return Some(r);
            }
        }
        None
    }

    /// Takes a free pageblock from the buddy and splits it for `class`: from the fullest split
    /// section with small frames, else the fullest without, else a whole section.
    pub(super) fn claim(&mut self, class: Class) -> Result<PbRef, NoBlock> {
        self.claim_in(class, [SMALL, PLAIN])
    }

    /// [`FreeArea::claim`] from the section bucket sets in the order `sets`.
    fn claim_in(&mut self, class: Class, sets: [usize; 2]) -> Result<PbRef, NoBlock> {
        let b = self.take_big(PB_SHIFT as u8, sets)?;
        let Big::Pb(r) = b else {
            return Err(NoBlock::Empty);
        };
        if let Err(short) = self.meta.set_planes(r, Plane::EMPTY, None, self.need) {
            // Back merged: `take_big` may have split its buddy off a larger block.
            self.merge_big(r, PB_SHIFT as u8);
            return Err(short.into());
        }
        self.reuse(b, PB_SHIFT as u8);
        let dirty = self
            .meta
            .pb(r)
            .map_or(flag::DIRTY, |h| h.flags & flag::DIRTY);
        self.meta.update_pb(r, |h| {
            h.state = PbState::Split;
            h.class = class;
            h.flags = dirty;
            h.free = FRAMES as u16;
            h.multi = 0;
            h.bucket = 0;
        });
        self.count_split(r, true);
        Ok(r)
    }

    /// Takes a block of `order` from split pageblock `r`, which can serve it (it has a free run,
    /// and an extra plane above order 0), then settles `r`. With `zero`, a run of clean frames
    /// is taken if the pageblock has one.
    pub(super) fn take_from(&mut self, r: PbRef, order: u8, zero: bool) -> Got {
        let base = self.pb_base(r);
        let len = 1usize << order;
        // One lookup for the header and planes; the dirty count changes by what the block
        // takes out of the dirty free frames.
        let (off, dirty, before, after, class, free) = self
            .meta
            .with_pb_mut(r, |h, alloc, mut extra| {
                let alloc = alloc?;
                let before = split_dirty(h, Some(alloc), extra.as_deref());
                let off = free_run(alloc, extra.as_deref(), order, zero)?;
                let dirty = match extra.as_deref() {
                    Some(x) => {
                        let first = (off..off + len).find(|&i| x.get(i));
                        let last = (off..off + len).rev().find(|&i| x.get(i));
                        first.zip(last).map(|(f, l)| (f - off, l - f + 1))
                    }
                    None => (h.flags & flag::DIRTY != 0).then_some((0, len)),
                };
                alloc.fill(off, len, true);
                if let Some(x) = extra.as_deref_mut() {
                    // The head is marked, the rest of the block is not.
                    x.fill(off, len, false);
                    x.put(off, true);
                }
                h.free -= len as u16;
                h.multi += u16::from(order > 0);
                h.flags &= !flag::REPORTED;
                let after = split_dirty(h, Some(alloc), extra.as_deref());
                Some((off, dirty, before, after, h.class, h.free))
            })
            .flatten()
            .unwrap_or((0, None, 0, 0, Class::Long, 0));
        self.dirty_pages = (self.dirty_pages + after).saturating_sub(before);
        self.free_pages -= len as u64;
        self.settle_as(r, class, free);
        let pfn = Pfn::new(base.get() + off as u64);
        let (o, n) = dirty.unwrap_or((0, 0));
        Got::part(pfn, o as u64, n as u64)
    }

    /// What `pfn` holds, for a free of a block of `order`; changes nothing.
    ///
    /// Inlined: returned through memory by an out-of-line call, its result was read back wider
    /// than it was written, and every free above order 0 stalled on store forwarding (perf).
    #[inline(always)]
    pub(crate) fn find(&self, pfn: Pfn, order: Order) -> Result<Found, FreeError> {
        let r = self.pb_ref(pfn).ok_or(FreeError::Foreign { pfn })?;
        if !pfn.is_aligned(order) {
            return Err(FreeError::Misaligned { pfn, order });
        }
        // `pb_ref` found `pfn` inside its span, so `off` is a frame of the span.
        let off = (pfn.get() - self.pb_base(r).get()) as usize;
        // One lookup for the header and planes, in a split section (`whole_at`'s answer for
        // its blocks of whole pageblocks too).
        let found = self.meta.with_pb(r, |h, alloc, extra| match h.state {
            // The metadata pool's own frames: never the caller's.
            PbState::Pool => Err(FreeError::Foreign { pfn }),
            PbState::Split => self.find_small(r, off, pfn, alloc, extra),
            PbState::Hot => Ok(Found::Hot { r, off }),
            PbState::Free { .. }
            | PbState::FreeTail
            | PbState::Allocated {
                what: Use::Scrub, ..
            } => Err(FreeError::DoubleFree { pfn }),
            PbState::Allocated { order, what } if off == 0 => Ok(Found::Whole { order, what }),
            PbState::Allocated { .. } => Err(FreeError::NotAllocated { pfn }),
            // A tail of a free block a scrub or a report holds is free to every other path.
            PbState::AllocatedTail if self.tail_of_held(pfn) => Err(FreeError::DoubleFree { pfn }),
            PbState::AllocatedTail => Err(FreeError::NotAllocated { pfn }),
        });
        if let Some(found) = found {
            return found;
        }
        // The section is not split: it is one whole block, or free.
        match self.whole_at(pfn)? {
            Some((o, what)) => Ok(Found::Whole { order: o, what }),
            None => Err(FreeError::NotAllocated { pfn }),
        }
    }

    /// `true` if `pfn`, in an `AllocatedTail` pageblock, lies in a block of whole pageblocks
    /// that a scrub or a report holds (`Use::Scrub`): its head is the nearest aligned pageblock
    /// below it allocated with an order that reaches `pfn`. At most 8 header reads.
    fn tail_of_held(&self, pfn: Pfn) -> bool {
        for order in PB_SHIFT as u8 + 1..crate::addr::MAX_ORDER {
            let head = Pfn::new(pfn.get() >> order << order);
            let Some(r) = self.pb_ref(head) else {
                continue;
            };
            if let Some(PbState::Allocated { order: o, what }) = self.meta.pb(r).map(|h| h.state)
                && o >= order
            {
                return what == Use::Scrub;
            }
        }
        false
    }

    /// [`FreeArea::find`] at frame `off` of split pageblock `r`, from its planes.
    fn find_small(
        &self,
        r: PbRef,
        off: usize,
        pfn: Pfn,
        alloc: Option<&Plane>,
        extra: Option<&Plane>,
    ) -> Result<Found, FreeError> {
        let alloc = alloc.ok_or(FreeError::Foreign { pfn })?;
        if !alloc.get(off) || self.scrub_holds(r, off) {
            return Err(FreeError::DoubleFree { pfn });
        }
        let order = allocated_order(alloc, extra, off).ok_or(FreeError::NotAllocated { pfn })?;
        Ok(Found::Small { r, off, order })
    }

    /// Frees an allocated block of `order` at offset `off` of split pageblock `r` (found by
    /// [`FreeArea::find`]); its frames become free, and dirty unless the caller cleared them.
    /// Without an extra plane, clean frames freed into a dirty pageblock count as dirty.
    pub(crate) fn free_small(&mut self, r: PbRef, off: usize, order: u8, dirty: bool) {
        let free = |h: &mut PbHeader, alloc: Option<&mut Plane>, extra: Option<&mut Plane>| {
            free_in(h, alloc, extra, off, order, dirty)
        };
        // A dirty free into a clean pageblock without an extra plane first gives it one (see
        // `keep_clean_apart`); otherwise one lookup does it all.
        let first = self.meta.with_pb_mut(r, |h, alloc, extra| {
            (!wants_extra(h, extra.as_deref(), dirty)).then(|| free(h, alloc, extra))
        });
        let done = match first {
            Some(Some(done)) => Some(done),
            Some(None) => {
                self.keep_clean_apart(r);
                self.meta.with_pb_mut(r, free)
            }
            None => None,
        };
        if let Some(freed) = done {
            self.settle_freed(r, 1 << order, freed);
        }
    }

    /// [`FreeArea::free`] of order-0 frame `pfn` in one lookup of its pageblock, when it is a
    /// lone allocated frame of a split pageblock that needs no extra plane for the free: the
    /// checks [`FreeArea::find`] makes there and the change of [`FreeArea::free_small`].
    /// `None`, with nothing changed, in every other case (the general path then answers,
    /// errors included).
    fn free_single(&mut self, pfn: Pfn, dirty: bool) -> Option<Found> {
        let r = self.pb_ref(pfn)?;
        let off = (pfn.get() - self.pb_base(r).get()) as usize;
        if self.scrub_holds(r, off) {
            return None;
        }
        let freed = self.meta.with_pb_mut(r, |h, alloc, extra| {
            let a = alloc.as_deref()?;
            // As `find_small` sees an allocated block of order 0.
            let ok = h.state == PbState::Split
                && a.get(off)
                && allocated_order(a, extra.as_deref(), off) == Some(0)
                && !wants_extra(h, extra.as_deref(), dirty);
            ok.then(|| free_in(h, alloc, extra, off, 0, dirty))
        })??;
        self.settle_freed(r, 1, freed);
        Some(Found::Small { r, off, order: 0 })
    }

    /// The counts and the place in the buckets of split pageblock `r` after `len` of its frames
    /// were freed (`freed`, from [`free_in`]).
    fn settle_freed(&mut self, r: PbRef, len: usize, freed: Freed) {
        let Freed {
            at,
            was_full,
            dirtied,
        } = freed;
        self.dirty_pages += dirtied;
        self.free_pages += len as u64;
        self.iso_more(r.span, len as u64);
        if self.scrub_holds_pb(r) {
            // Out of every bucket until the scrub puts its frames back and settles it.
            return;
        }
        let frames = self.meta.span(r.span).map(|s| {
            let (lo, hi) = s.pb_frames(r.index);
            hi - lo
        });
        if frames == Some(usize::from(at.free)) {
            // Wholly free: a whole pageblock becomes the spare; one at the span's edge goes
            // back to a bucket, with one write to its header if it is alone in its bucket and
            // the new one is empty.
            let edge = at.free < FRAMES as u16 && !self.isolated(r.span);
            if edge
                && let key = self.band(r) * FRAMES + usize::from(at.free)
                && move_alone(&mut self.buckets[at.class.index()], r, at, key)
            {
                self.meta.update_pb(r, |x| x.bucket = key as u16);
            } else {
                self.bucket_remove_as(r, at);
                self.settle_as(r, at.class, at.free);
            }
        } else if was_full {
            self.bucket_insert_as(r, at.class, at.free);
        }
    }

    /// `true` if split pageblock `r` is clean and has no extra plane: what a bulk free into it
    /// marks [`flag::BULK`], so that an undo restores exactly that (the extra plane
    /// `keep_clean_apart` gives it included).
    fn clean_without_extra(&self, r: PbRef) -> bool {
        !self.meta.has_plane(r, Which::Extra)
            && self.meta.pb(r).is_some_and(|h| h.flags & flag::DIRTY == 0)
    }

    /// Frees order-0 frame `off` of split pageblock `r` for a bulk free, without settling the
    /// pageblock: [`FreeArea::bulk_undo`] can still take it back exactly, or
    /// [`FreeArea::resettle`] finish it.
    pub(crate) fn bulk_free(&mut self, r: PbRef, off: usize) {
        let fresh = self.clean_without_extra(r);
        self.keep_clean_apart(r);
        self.tracking(r, |a| {
            a.meta.update_planes(r, |alloc, extra| {
                alloc.put(off, false);
                if let Some(x) = extra {
                    x.put(off, true);
                }
            });
            a.meta.update_pb(r, |h| {
                h.free += 1;
                if fresh {
                    h.flags |= flag::BULK;
                }
                h.flags |= flag::DIRTY;
            });
        });
        self.free_pages += 1;
        self.iso_more(r.span, 1);
    }

    /// Frees the order-0 frames `mask` of the split pageblock holding `pfn` for a bulk free,
    /// all or none: `false`, with nothing changed, unless each is an allocated order-0 block
    /// no scrub holds. Like [`FreeArea::bulk_free`] frame by frame, in one look at the planes.
    pub(crate) fn bulk_free_run(&mut self, pfn: Pfn, mask: &Plane) -> bool {
        let Some(r) = self.pb_ref(pfn) else {
            return false;
        };
        if self.scrub_holds_any(r, mask) {
            return false;
        }
        let singles = self.meta.with_pb(r, |h, alloc, extra| {
            h.state == PbState::Split
                && alloc.is_some_and(|a| {
                    a.covers(mask)
                        && extra.is_none_or(|x| {
                            // Each heads a block (its extra bit) that ends at the next frame: a
                            // free frame, another head, or the pageblock's end.
                            let mut ends = a.following();
                            for (e, n) in ends.0.iter_mut().zip(x.following().0) {
                                *e = !*e | n;
                            }
                            x.covers(mask) && ends.covers(mask)
                        })
                })
        });
        if singles != Some(true) {
            return false;
        }
        let fresh = self.clean_without_extra(r);
        self.keep_clean_apart(r);
        let n = mask.count();
        let counts = self.meta.with_pb_mut(r, |h, mut alloc, mut extra| {
            let before = split_dirty(h, alloc.as_deref(), extra.as_deref());
            if let Some(a) = alloc.as_deref_mut() {
                a.clear_from(mask);
            }
            if let Some(x) = extra.as_deref_mut() {
                x.set_from(mask);
            }
            h.free += n as u16;
            if fresh {
                h.flags |= flag::BULK;
            }
            h.flags |= flag::DIRTY;
            (before, split_dirty(h, alloc.as_deref(), extra.as_deref()))
        });
        if let Some((before, after)) = counts {
            self.dirty_pages = (self.dirty_pages + after).saturating_sub(before);
            self.free_pages += n as u64;
            self.iso_more(r.span, n as u64);
        }
        true
    }

    /// Undoes [`FreeArea::bulk_free`] of the frame at `pfn` (nothing else touched it: the zone's
    /// lock was held throughout).
    pub(crate) fn bulk_undo(&mut self, pfn: Pfn) {
        let Some(r) = self.pb_ref(pfn) else {
            return;
        };
        let off = (pfn.get() - self.pb_base(r).get()) as usize;
        self.tracking(r, |a| {
            a.meta.update_planes(r, |alloc, extra| {
                alloc.put(off, true);
                if let Some(x) = extra {
                    // An order-0 block is its own head.
                    x.put(off, true);
                }
            });
            a.meta.update_pb(r, |h| h.free -= 1);
        });
        self.free_pages -= 1;
        self.iso_less(r.span, 1);
    }

    /// After [`FreeArea::bulk_undo`] of every frame a refused bulk freed into the pageblock
    /// holding `pfn`: a pageblock the bulk turned dirty is clean again, and without the extra
    /// plane the bulk gave it (the slot that plane's pair replaced went back to the pool, so a
    /// single one is free for it).
    pub(crate) fn bulk_restore(&mut self, pfn: Pfn) {
        let Some(r) = self.pb_ref(pfn) else {
            return;
        };
        if self.meta.pb(r).is_some_and(|h| h.flags & flag::BULK != 0) {
            self.tracking(r, |a| {
                if a.meta.has_plane(r, Which::Extra)
                    && let Some(alloc) = a.meta.plane(r, Which::Alloc)
                {
                    // If even the reserve had no single left, the pageblock keeps its pair:
                    // still exact, only larger.
                    let _ = a
                        .meta
                        .set_planes(r, alloc, None, Need::Normal)
                        .or_else(|_| a.meta.set_planes(r, alloc, None, Need::Growth));
                }
                a.meta
                    .update_pb(r, |h| h.flags &= !(flag::BULK | flag::DIRTY));
            });
        }
    }

    /// Puts the split pageblock holding `pfn` where its free count says, after frees that did
    /// not settle it; calling it again for the same pageblock changes nothing.
    pub(crate) fn resettle(&mut self, pfn: Pfn) {
        let Some(r) = self.pb_ref(pfn) else {
            return;
        };
        // The bulk stands: the pageblock stays dirty.
        self.meta.update_pb(r, |h| h.flags &= !flag::BULK);
        let Some(h) = self.meta.pb(r) else {
            return;
        };
        if h.state != PbState::Split
            || self.spare[h.class.index()] == Some(r)
            || self.scrub_holds_pb(r)
        {
            return;
        }
        let wholly = self.meta.span(r.span).is_some_and(|s| {
            let (lo, hi) = s.pb_frames(r.index);
            usize::from(h.free) == hi - lo && s.pb_is_whole(r.index)
        });
        if wholly {
            self.bucket_remove(r);
            self.settle(r);
        } else if h.bucket == 0 && h.free > 0 {
            self.bucket_insert(r, h.class);
        }
    }

    /// Checks and frees the block of `order` at `pfn` (allocated normally, not from a pool and
    /// not lent to a CPU), dirty or clean; on error nothing changes.
    pub(crate) fn free(&mut self, pfn: Pfn, order: Order, dirty: bool) -> Result<Found, FreeError> {
        if order == Order::ZERO
            && let Some(found) = self.free_single(pfn, dirty)
        {
            return Ok(found);
        }
        let found = self.find(pfn, order)?;
        match found {
            Found::Small { r, off, order: o } if o == order.get() => {
                self.free_small(r, off, o, dirty);
            }
            Found::Small { order: o, .. } => {
                return Err(FreeError::WrongOrder {
                    pfn,
                    given: order,
                    allocated: Order::new(o),
                });
            }
            // What `find` found is what `free_whole` would look up again.
            Found::Whole {
                order: o,
                what: Use::Normal,
            } if o == order.get() => self.free_big(pfn, o, dirty),
            Found::Whole { order: o, what } => {
                self.free_whole(pfn, order.get(), Use::Normal, dirty)
                    .map_err(|e| match (e, what) {
                        (FreeError::WrongOrder { .. }, Use::Normal) => FreeError::WrongOrder {
                            pfn,
                            given: order,
                            allocated: Order::new(o),
                        },
                        (e, _) => e,
                    })?;
            }
            Found::Hot { .. } => {}
        }
        Ok(found)
    }

    /// Free frames of split pageblocks that lie in free aligned blocks of at least `order`
    /// (below 9), pageblock by pageblock.
    pub(super) fn small_free_in_blocks_of(&self, order: Order) -> u64 {
        if order.get() >= PB_SHIFT as u8 {
            return 0;
        }
        let mut total = 0;
        self.for_each_split(|r, _, alloc| {
            let alloc = self.without_scrub_held(r, alloc);
            let len = 1usize << order.get();
            total += (0..FRAMES)
                .step_by(len)
                .filter(|&s| alloc.all(s, len, false))
                .count() as u64
                * len as u64;
        });
        total
    }

    /// Calls `f(pageblock, header, allocation plane)` for every split (not hot) pageblock.
    pub(super) fn for_each_split(&self, mut f: impl FnMut(PbRef, crate::meta::PbHeader, Plane)) {
        self.for_each_pb_of_split(|r, h| {
            if h.state == PbState::Split
                && let Some(alloc) = self.meta.plane(r, Which::Alloc)
            {
                f(r, h, alloc);
            }
        });
    }

    /// Calls `f(pageblock, header)` for every pageblock of the split sections.
    pub(super) fn for_each_pb_of_split(&self, mut f: impl FnMut(PbRef, crate::meta::PbHeader)) {
        for (slot, span) in self.meta.spans() {
            for s in 0..span.sections() {
                let sec = SecRef {
                    span: slot,
                    index: s,
                };
                // Only a split section holds split pageblocks: the others have no pageblock
                // array to look at, and a 256 TiB span has 2^27 pageblocks.
                if self.meta.section(sec).map(|x| x.state) != Some(SectionState::Split) {
                    continue;
                }
                for pb in span.section_pbs(s) {
                    let r = PbRef {
                        span: slot,
                        index: pb,
                    };
                    if let Some(h) = self.meta.pb(r) {
                        f(r, h);
                    }
                }
            }
        }
    }
}

/// How [`FreeArea::fullest`]'s walk ended.
enum Walk {
    /// The pageblock the caller's test took.
    Took(PbRef),
    /// The caller's test stopped the walk.
    GaveUp,
    /// No pageblock from the starting count up was taken.
    Exhausted,
}
