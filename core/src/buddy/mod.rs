//! One zone's free memory, over the two-level metadata of [`meta`](crate::meta).
//!
//! Above, a buddy allocator of whole pageblocks: free lists of orders 9..=17 (blocks of
//! pageblocks inside a section) and 18 (whole sections). Inside a split pageblock, its
//! allocation plane says which frames are free (`small`). A request below 2 MiB takes the most
//! occupied split pageblock of its class that can serve it in a section that is not emptying
//! (occupancy buckets by section band and free frames, see `small`), else a free pageblock of
//! such a section, and only then a pageblock of an emptying section or a free pageblock
//! elsewhere; a pageblock that becomes wholly free is
//! kept split as its class's *spare* until another one empties, so one frame allocated and
//! freed over and over does not split and merge a section each time.
//!
//! A [`FreeArea`] lives inside its zone's lock; so does its [`ZoneMeta`].
#![deny(unsafe_code)]

mod check;
mod dirty;
mod hot;
mod offline;
mod report;
mod scrub;
mod small;

pub use check::{PageblockCounts, PageblockInfo, PageblockKind};
pub(crate) use dirty::Got;
pub(crate) use hot::{HotFrames, LEND_MIN, Lent};
pub(crate) use offline::Refusal;

use core::ops::Range;
use core::ptr::NonNull;

use crate::addr::{MAX_ORDER, Order, Pfn, PhysRange};
use crate::bitmap::{FRAMES, Occupancy, Plane};
use crate::error::FreeError;
use crate::meta::{
    BANDS, Class, HeadRoom, Heads, NIL, Need, PB_SHIFT, PBS_PER_SECTION, PbBuckets, PbHeader,
    PbRef, PbState, SecRef, Section, SectionState, Seed, Short, SpanMeta, Use, Which, ZoneMeta,
    flag, section_is_whole,
};

/// The bucket sets of split sections: without, and with pageblocks split below 2 MiB.
const PLAIN: usize = 0;
const SMALL: usize = 1;

/// Orders of whole-pageblock blocks: 9..=18.
const BIG: usize = (MAX_ORDER as usize) - PB_SHIFT as usize + 1;

/// Occupancy buckets of split sections by their free pageblocks: bucket `i` lists the sections
/// with `(i - 1) * SEC_WIDTH` up to `i * SEC_WIDTH - 1` of them ([`FreeArea::sec_bucket`]), in no
/// order. A change of a section's free lists moves it only when it crosses a bucket's bounds, so
/// most leave its links alone; the fullest section is then found to within `SEC_WIDTH`
/// pageblocks (16 MiB of a 1 GiB section). `nonempty` has bit `i` set while bucket `i` is not
/// empty.
#[derive(Debug)]
struct Buckets {
    heads: [u32; SEC_BUCKETS],
    nonempty: Occupancy,
}

/// Free pageblocks per section bucket: a divisor of [`EMPTYING`], so that no bucket holds both
/// emptying sections and others.
const SEC_WIDTH: u16 = 8;
const _: () = assert!(EMPTYING.is_multiple_of(SEC_WIDTH));
/// Section buckets: 0 (unused: a section with no free pageblock is in none) to the bucket of a
/// section with all its pageblocks free.
const SEC_BUCKETS: usize = PBS_PER_SECTION / SEC_WIDTH as usize + 2;

/// Free pageblocks from which a split section is *emptying*, band 1 of [`BANDS`] (band 0 holds
/// the rest): three quarters. Small frames avoid an emptying section while a fuller one has a
/// free pageblock, so that it can become whole again.
const EMPTYING: u16 = 384;
/// The band of a section with `free_pbs` free pageblocks.
fn band_of(free_pbs: u16) -> usize {
    usize::from(free_pbs >= EMPTYING)
}

/// A huge-page pool of one size in one zone: blocks taken from the buddy, marked `Pooled` while
/// free in the pool (linked from `head`) and `Huge` while handed out.
#[derive(Clone, Copy, Debug)]
struct HugePool {
    head: u32,
    free: u64,
    total: u64,
}

/// A block of whole pageblocks: its head pageblock, or a whole section.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Big {
    Pb(PbRef),
    Section(SecRef),
}

/// The free memory and counters of one zone.
///
/// Free blocks of whole pageblocks are kept per section (orders 9..=17, in the section's own
/// lists) and zone-wide (order 18, whole free sections), so that a request for pageblocks is
/// served from the fullest split section that can serve it, in O(1) for one pageblock: sections
/// fill before a whole one is broken, and 1 GiB blocks survive small-frame churn.
///
/// Invariants (checked by [`FreeArea::check`]):
/// - the lists of order `k` (orders 9..=18) hold exactly `counts[k - 9]` free blocks, each
///   naturally aligned inside one span and section, and no free block's buddy is free at the
///   same order;
/// - a split section with free pageblocks sits in section bucket `free_pbs`, which is the sum of
///   its lists' pageblocks;
/// - every split pageblock of a class is in exactly one place: its class's bucket
///   `header.bucket`, the spare slot, a CPU (state `Hot`), or nowhere when it has no free frame;
///   its `free` equals the clear bits of its allocation plane;
/// - `free_pages` is the sum of free frames over the lists and split pageblocks (a hot
///   pageblock's frames count as handed out), and `free_pages <= managed_pages`;
/// - `dirty_pages` is the number of those free frames the metadata marks dirty (see `dirty`);
/// - `reported_pages` is the number of them in free blocks marked reported, each of which is
///   clean and marked on all its pageblocks (see `report`).
#[derive(Debug)]
pub(crate) struct FreeArea {
    pub(crate) meta: ZoneMeta,
    /// The head of the list of whole free sections (order 18).
    whole: u32,
    /// Split sections with free pageblocks, by how many (clamped to the last bucket): those
    /// without pageblocks split below 2 MiB (`PLAIN`), and those with some (`SMALL`).
    sections: [Buckets; 2],
    counts: [u64; BIG],
    buckets: [PbBuckets; Class::ALL.len()],
    spare: [Option<PbRef>; Class::ALL.len()],
    /// The head of the list of pool pageblocks.
    pool_pbs: u32,
    /// The frames of pool pageblocks no slab uses.
    pool_spare: u64,
    /// A slab or a hosted section is on its way into the pool (handed out by
    /// [`FreeArea::alloc_slab`] or [`FreeArea::section_for_array`], not yet added): while it is,
    /// no other CPU hosts a section, so racing CPUs do not each spend a section's first
    /// pageblock on arrays.
    pub(crate) growing: bool,
    pub(crate) free_pages: u64,
    pub(crate) managed_pages: u64,
    dirty_pages: u64,
    reported_pages: u64,
    /// What runs before reported memory is used again, if the platform gave a hook.
    install: Option<report::Install>,
    /// The host gives reported memory back zeroed, so a reported block counts clean.
    reports_zeroed: bool,
    /// The unit a scrub holds, if any, and the section its next search starts from.
    scrub: Option<scrub::Scrubbing>,
    scrub_cursor: u32,
    /// Huge-page pools, 2 MiB then 1 GiB.
    pools: [HugePool; 2],
    /// Whom the metadata pool serves right now: its own growth may use its reserve.
    need: Need,
    /// Bit `i` set: the span in slot `i` is isolated for offlining (see `offline`): its free
    /// memory is on none of the zone-wide lists and buckets, so no allocation lands there.
    iso_mask: u32,
    /// Bit `i` set: the isolated span in slot `i` is kept isolated for a retry
    /// (`OfflineOptions::keep_isolated`): only `Machine::unisolate` or its leaving ends that, not
    /// a later offline that fails. Always within `iso_mask`.
    iso_kept: u32,
    /// The free frames of isolated spans (counted in `free_pages` too; no allocation can have
    /// them, so the watermarks leave them out).
    pub(crate) isolated_pages: u64,
}

/// The pool index of a huge-page order: 9 (2 MiB) is 0, 18 (1 GiB) is 1.
pub(crate) fn pool_index(order: Order) -> Option<usize> {
    match order.get() {
        9 => Some(0),
        MAX_ORDER => Some(1),
        _ => None,
    }
}

/// log2 of the frames of a slab of `what` (rounded up to a power of two, so slabs of one size
/// tile a pageblock).
pub(crate) fn slab_order(what: Short) -> u8 {
    crate::meta::Pool::slab_frames(what)
        .next_power_of_two()
        .trailing_zeros() as u8
}

/// What [`FreeArea::section_for_array`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Hosting {
    /// Another CPU's growth is on its way, or the pool is no longer short of arrays.
    Wait,
    /// No free section.
    Nothing,
    /// This free section, taken (marked allocated) to hold its own array.
    Section(Pfn),
}

/// A failed allocation: no memory (for a zone: none above the watermark the request keeps), or
/// no metadata to describe the split it needs (the caller grows the pool outside the lock and
/// tries again). The buddy and the zone share it, so that a result passes up unconverted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum NoBlock {
    Empty,
    Meta(Short),
}

impl From<Short> for NoBlock {
    fn from(s: Short) -> Self {
        NoBlock::Meta(s)
    }
}

impl FreeArea {
    /// An empty area, the heads of each class's occupancy buckets in `heads`.
    pub(crate) fn new(heads: [HeadRoom; Class::ALL.len()]) -> Self {
        Self {
            meta: ZoneMeta::default(),
            whole: NIL,
            sections: core::array::from_fn(|_| Buckets {
                heads: [NIL; SEC_BUCKETS],
                nonempty: Occupancy::EMPTY,
            }),
            counts: [0; BIG],
            buckets: heads.map(PbBuckets::new),
            spare: [None; Class::ALL.len()],
            pool_pbs: NIL,
            pool_spare: 0,
            growing: false,
            free_pages: 0,
            managed_pages: 0,
            dirty_pages: 0,
            reported_pages: 0,
            install: None,
            reports_zeroed: false,
            scrub: None,
            scrub_cursor: 0,
            pools: [HugePool {
                head: NIL,
                free: 0,
                total: 0,
            }; 2],
            need: Need::Normal,
            iso_mask: 0,
            iso_kept: 0,
            isolated_pages: 0,
        }
    }

    /// Frames for a new slab of the metadata pool (contiguous, so the platform maps them in one
    /// range), from a pool pageblock: a pageblock the pool keeps for itself, which refuses every
    /// free (`PbState::Pool`), so no caller can free the pool's memory. The first pool
    /// pageblock with room takes it (there are few: one per 2 MiB of metadata); when none has,
    /// a free pageblock becomes one (the claim may use the pool's reserve). `None`
    /// when the pool is no longer low (another CPU grew it meanwhile).
    pub(crate) fn alloc_slab(&mut self, what: Short) -> Result<Option<Pfn>, NoBlock> {
        if !self.meta.pool.low(what) {
            return Ok(None);
        }
        let len = 1usize << slab_order(what);
        let mut cur = self.pool_pbs;
        while let Some(r) = PbRef::unpack(cur) {
            cur = self.meta.pb(r).map_or(NIL, |h| h.next);
            if self.isolated(r.span) {
                continue;
            }
            if let Some(off) = self.carve(r, len) {
                self.growing = true;
                return Ok(Some(Pfn::new(self.pb_base(r).get() + off as u64)));
            }
        }
        self.need = Need::Growth;
        let r = self.claim(Class::Long);
        self.need = Need::Normal;
        let r = r?;
        self.free_pages -= FRAMES as u64;
        // Its frames leave the free ones, dirty or not.
        self.tracking(r, |a| a.make_pool_pb(r));
        let off = self.carve(r, len).ok_or(NoBlock::Empty)?;
        self.growing = true;
        Ok(Some(Pfn::new(self.pb_base(r).get() + off as u64)))
    }

    /// Makes split pageblock `r`, wholly free and taken off `free_pages` by the caller, a pool
    /// pageblock with no slab yet.
    fn make_pool_pb(&mut self, r: PbRef) {
        self.meta.update_planes(r, |alloc, _| *alloc = Plane::EMPTY);
        self.meta.update_pb(r, |h| {
            h.state = PbState::Pool;
            h.free = FRAMES as u16;
        });
        self.pool_spare += FRAMES as u64;
        self.pool_pb_link(r);
    }

    /// Takes `len` frames (a power of two, aligned) from pool pageblock `r` if it has them: their
    /// offset in it.
    fn carve(&mut self, r: PbRef, len: usize) -> Option<usize> {
        let h = self.meta.pb(r)?;
        if h.state != PbState::Pool || usize::from(h.free) < len {
            return None;
        }
        let off = self.meta.update_planes(r, |alloc, _| {
            let off = alloc.find_clear_run(len.trailing_zeros() as u8)?;
            alloc.fill(off, len, true);
            Some(off)
        })??;
        self.meta.update_pb(r, |h| h.free -= len as u16);
        self.pool_spare -= len as u64;
        Some(off)
    }

    /// Gives the frames `slab` (a slab's) back to their pool pageblock; one that no slab uses
    /// any more goes back to the buddy, dirty if it was when the pool took it (the slabs'
    /// frames were zeroed, the others never touched).
    fn release_slab(&mut self, slab: PhysRange) {
        let Some(r) = self.pb_ref(slab.start()) else {
            return;
        };
        if self.meta.pb(r).map(|h| h.state) != Some(PbState::Pool) {
            return;
        }
        let off = (slab.start().get() - self.pb_base(r).get()) as usize;
        let len = slab.frames() as usize;
        self.meta
            .update_planes(r, |alloc, _| alloc.fill(off, len, false));
        let Some(free) = self.meta.update_pb(r, |h| {
            h.free += len as u16;
            h.free
        }) else {
            return;
        };
        self.pool_spare += len as u64;
        if usize::from(free) == FRAMES {
            self.pool_pb_unlink(r);
            self.pool_spare -= FRAMES as u64;
            self.meta.update_pb(r, |h| h.state = PbState::Split);
            self.free_pages += FRAMES as u64;
            self.iso_more(r.span, FRAMES as u64);
            self.dirty_pages += self.pb_dirty(r);
            self.unsplit(r);
        }
    }

    /// Retires what the metadata pool can spare and hands out up to `out.len()` retired
    /// slabs, zeroed, with the pointers they were mapped at, for the caller to unmap (with no
    /// lock held) and give back with [`FreeArea::release_metadata`]; how many it handed out.
    /// Until then their frames stay in their pool pageblocks, used.
    pub(crate) fn retire_metadata(
        &mut self,
        out: &mut [Option<(PhysRange, NonNull<u8>)>],
    ) -> usize {
        self.meta.pool.retire_spare();
        let mut n = 0;
        for slot in out.iter_mut() {
            *slot = self.meta.pool.pop_retired();
            if slot.is_none() {
                break;
            }
            n += 1;
        }
        n
    }

    /// Gives the frames of unmapped retired slabs back to their pool pageblocks, and every
    /// pool pageblock no slab uses any more to the buddy (which may leave further slabs free:
    /// their planes and arrays go back to the pool). Then helps the emptiest pool pageblock to
    /// empty if the others have room for what it holds (see [`FreeArea::empty_emptiest`]),
    /// which may retire more for the next [`FreeArea::retire_metadata`].
    pub(crate) fn release_metadata(&mut self, slabs: impl IntoIterator<Item = PhysRange>) {
        for slab in slabs {
            self.release_slab(slab);
        }
        self.empty_emptiest();
    }

    /// The pool pageblock with the fewest frames in use, of those that can empty (not the
    /// first pageblock of a section holding its own array), unless the pool pageblocks leave
    /// less than a pageblock's worth of frames unused or the others lack the room for its
    /// frames in use: then packing them tighter would not give a pageblock back. With its
    /// frames in use.
    fn emptiest_pool_pb(&self) -> Option<(PbRef, u64)> {
        if self.pool_spare < FRAMES as u64 {
            return None;
        }
        let mut best: Option<(PbRef, u64)> = None;
        let mut cur = self.pool_pbs;
        while let Some(r) = PbRef::unpack(cur) {
            let h = self.meta.pb(r)?;
            cur = h.next;
            let used = (FRAMES - usize::from(h.free)) as u64;
            let base = self.pb_base(r);
            let hosts = PhysRange::new(base, Pfn::new(base.get() + FRAMES as u64))
                .zip(self.sec_of(r))
                .is_some_and(|(away, s)| self.meta.hosts_array_in(s, away));
            if !hosts && best.is_none_or(|(_, b)| used < b) {
                best = Some((r, used));
            }
        }
        let (r, used) = best?;
        // The others' unused frames: the pool's less this one's.
        (used <= self.pool_spare - (FRAMES as u64 - used)).then_some((r, used))
    }

    /// Helps the emptiest pool pageblock to empty when the others have room for what it
    /// holds: the classes' spare pageblocks go back first (their planes and their sections'
    /// arrays are free memory the pool would rather give back), then its planes and arrays
    /// still in use move into the pool's room elsewhere and its slabs the pool keeps spare
    /// retire; the slabs this empties come back through [`FreeArea::retire_metadata`]. Costs
    /// a walk of the pool pageblocks, of the pool's slabs in use and of the sections.
    fn empty_emptiest(&mut self) {
        let Some((r, _)) = self.emptiest_pool_pb() else {
            return;
        };
        self.release_spares();
        let base = self.pb_base(r);
        if let Some(away) = PhysRange::new(base, Pfn::new(base.get() + FRAMES as u64)) {
            self.meta.move_all_out(away);
            self.meta.pool.retire_in(away);
        }
    }

    /// Frames for a slab that lets the emptiest pool pageblock empty, when what still holds it
    /// (an array, or a plane, in use) found no room elsewhere in the pool: carved from the
    /// fullest other pool pageblock that has them, as growth on its way (`growing`) until the
    /// caller maps them and adds the slab with [`FreeArea::add_slab_to_empty`] (or gives them
    /// back with [`FreeArea::unalloc_slab`]). With the kind of slab. `None` when nothing is
    /// stuck, another growth is on its way, or no other pool pageblock (outside memory going
    /// offline) has the frames.
    pub(crate) fn slab_to_empty(&mut self) -> Option<(Short, Pfn)> {
        if self.growing {
            return None;
        }
        let (r, _) = self.emptiest_pool_pb()?;
        let base = self.pb_base(r);
        let what = self
            .meta
            .stuck_in(PhysRange::new(base, Pfn::new(base.get() + FRAMES as u64))?)?;
        let order = slab_order(what);
        let mut best: Option<(PbRef, u16)> = None;
        let mut cur = self.pool_pbs;
        while let Some(q) = PbRef::unpack(cur) {
            let h = self.meta.pb(q)?;
            cur = h.next;
            let room = q != r
                && !self.isolated(q.span)
                && self
                    .meta
                    .plane(q, Which::Alloc)
                    .is_some_and(|p| p.find_clear_run(order).is_some());
            if room && best.is_none_or(|(_, free)| h.free < free) {
                best = Some((q, h.free));
            }
        }
        let (q, _) = best?;
        let off = self.carve(q, 1 << order)?;
        self.growing = true;
        Some((what, Pfn::new(self.pb_base(q).get() + off as u64)))
    }

    /// Adds the slab [`FreeArea::slab_to_empty`] carved, now mapped, and moves into it.
    pub(crate) fn add_slab_to_empty(&mut self, what: Short, slab: crate::platform::Mapped) {
        self.meta.pool.add_slab(what, slab);
        self.growing = false;
        self.empty_emptiest();
    }

    /// Puts pool pageblock `r` on their list.
    fn pool_pb_link(&mut self, r: PbRef) {
        let head = self.pool_pbs;
        self.meta.update_pb(r, |h| {
            h.next = head;
            h.prev = NIL;
        });
        if let Some(n) = PbRef::unpack(head) {
            self.meta.update_pb(n, |h| h.prev = r.pack());
        }
        self.pool_pbs = r.pack();
    }

    /// Takes pool pageblock `r` off that list.
    fn pool_pb_unlink(&mut self, r: PbRef) {
        let Some(h) = self.meta.pb(r) else {
            return;
        };
        match PbRef::unpack(h.prev) {
            Some(p) => {
                self.meta.update_pb(p, |x| x.next = h.next);
            }
            None => self.pool_pbs = h.next,
        }
        if let Some(n) = PbRef::unpack(h.next) {
            self.meta.update_pb(n, |x| x.prev = h.prev);
        }
        self.meta.update_pb(r, |x| {
            x.next = NIL;
            x.prev = NIL;
        });
    }

    /// Gives back the last slab [`FreeArea::alloc_slab`] handed out (the platform could not map
    /// it), if `pfn` heads it.
    pub(crate) fn unalloc_slab(&mut self, what: Short, pfn: Pfn) {
        self.growing = false;
        let len = 1u64 << slab_order(what);
        if let Some(range) = PhysRange::new(pfn, Pfn::new(pfn.get() + len)) {
            self.release_slab(range);
        }
    }

    /// Bytes of the zone's metadata: the spans' regions, the pool's slabs, and the frames of
    /// pool pageblocks no slab uses.
    pub(crate) fn metadata_bytes(&self) -> u64 {
        self.meta.bytes() + self.pool_spare * crate::addr::PAGE_SIZE
    }

    /// Frames of the zone's own (managed) memory its metadata holds: the pool's slabs taken
    /// from the zone and the frames of pool pageblocks no slab uses.
    pub(crate) fn metadata_frames(&self) -> u64 {
        self.meta.pool.bytes / crate::addr::PAGE_SIZE + self.pool_spare
    }

    /// Takes a free section off its list for [`FreeArea::host_section`] (marked allocated
    /// meanwhile); `None` if there is none.
    ///
    /// Like a slab, the section counts as growth on its way (`growing`) until
    /// [`FreeArea::host_section`] or [`FreeArea::end_growth`]; [`Hosting::Wait`] while another
    /// CPU's growth is.
    pub(crate) fn section_for_array(&mut self) -> Hosting {
        if self.growing || !self.meta.pool.low(Short::Arrays) {
            return Hosting::Wait;
        }
        let Some(s) = SecRef::unpack(self.whole) else {
            return Hosting::Nothing;
        };
        let b = Big::Section(s);
        self.growing = true;
        self.dirty_pages -= self.block_dirty(b, MAX_ORDER);
        self.unlink_big(b, MAX_ORDER);
        self.mark_allocated(b, MAX_ORDER, Use::Normal);
        self.free_pages -= Order::MAX.frames();
        Hosting::Section(self.base(b))
    }

    /// The growth on its way ended without adding to the pool.
    pub(crate) fn end_growth(&mut self) {
        self.growing = false;
    }

    /// Splits the section taken by [`FreeArea::section_for_array`] with its own first frames,
    /// mapped as `slab`, as its array: those frames stay allocated for good, the rest of the
    /// section is free. With a slab the section cannot use, the section just goes back.
    pub(crate) fn host_section(&mut self, base: Pfn, slab: crate::platform::Mapped) {
        self.growing = false;
        let Some(s) = self.sec_ref(base) else {
            return;
        };
        let used = slab.range.frames() as usize;
        let template = PbHeader {
            state: PbState::FreeTail,
            flags: flag::DIRTY,
            ..PbHeader::NEW
        };
        if !self.meta.host_section(s, slab, template) {
            self.free_big(base, MAX_ORDER, true);
            return;
        }
        let first = self.meta.span(s.span).map_or(0, |x| x.first_pb(s.index));
        let r = PbRef {
            span: s.span,
            index: first,
        };
        // Pageblocks 1.. are free blocks of orders 9..=17; pageblock 0 is split, its first
        // frames the array.
        for k in (PB_SHIFT as u8..MAX_ORDER).rev() {
            self.push_big(Big::Pb(Self::pb_plus(r, 1 << (k - PB_SHIFT as u8))), k);
        }
        self.free_pages += Order::MAX.frames() - FRAMES as u64;
        self.dirty_pages += Order::MAX.frames() - FRAMES as u64;
        if self
            .meta
            .set_planes(r, Plane::EMPTY, None, Need::Growth)
            .is_err()
        {
            // No plane for the first pageblock: it stays allocated whole (2 MiB of metadata).
            self.mark_allocated(Big::Pb(r), PB_SHIFT as u8, Use::Normal);
            return;
        }
        self.meta.update_pb(r, |h| {
            h.state = PbState::Split;
            h.class = Class::Long;
        });
        self.count_split(r, true);
        // The rest of its first pageblock serves the pool's next array slabs; the array's own
        // frames stay carved for good.
        self.make_pool_pb(r);
        self.carve(r, used);
    }

    /// `true` if `range` can join this zone: room for another span, and its pageblocks
    /// addressable in list links.
    pub(crate) fn can_add(&self, range: PhysRange) -> bool {
        self.meta.spans().count() < crate::meta::MAX_SPANS_PER_ZONE
            && range.frames() < 1 << crate::meta::SPAN_LIMIT_SHIFT
    }

    /// Adds a span and frees all its frames, dirty unless `zeroed`: whole sections as 1 GiB
    /// blocks, the whole pageblocks of edge sections as the fewest aligned blocks, edge
    /// pageblocks as split ones. Costs O(sections + pageblocks of edge sections). The caller
    /// checked [`FreeArea::can_add`].
    pub(crate) fn add_span(
        &mut self,
        span: SpanMeta,
        seed: Seed,
        zeroed: bool,
    ) -> Result<(), Short> {
        let flags = if zeroed { 0 } else { flag::DIRTY };
        let range = span.range;
        let Some(slot) = self.meta.add(span, seed) else {
            return Ok(());
        };
        self.managed_pages += range.frames();
        let whole = |s: u32| section_is_whole(range, u64::from(s));
        let mut s = 0;
        while s < span.sections() {
            if whole(s) {
                let end = (s + 1..span.sections())
                    .find(|&e| !whole(e))
                    .unwrap_or(span.sections());
                self.add_whole_sections(slot, s..end, flags);
                s = end;
                continue;
            }
            let mut pbs = span.section_pbs(s).peekable();
            while let Some(pb) = pbs.next() {
                if !span.pb_is_whole(pb) {
                    self.add_edge_pb(
                        PbRef {
                            span: slot,
                            index: pb,
                        },
                        &span,
                        flags,
                    )?;
                    continue;
                }
                let mut end = pb + 1;
                while pbs.next_if(|&q| q == end && span.pb_is_whole(q)).is_some() {
                    end += 1;
                }
                self.add_whole_pbs(slot, &span, pb..end, flags);
            }
            s += 1;
        }
        Ok(())
    }

    /// Frees the whole sections `secs` of the span in `slot`, with `flags`, as 1 GiB blocks:
    /// the list ends as pushing each in turn would leave it (the last at the front), with
    /// each section written once.
    fn add_whole_sections(&mut self, slot: u8, secs: Range<u32>, flags: u8) {
        let sec = |index| SecRef { span: slot, index };
        let n = u64::from(secs.end - secs.start);
        if n == 0 {
            return;
        }
        self.free_pages += n * Order::MAX.frames();
        if flags & flag::DIRTY != 0 {
            self.dirty_pages += n * Order::MAX.frames();
        }
        if self.isolated(slot) {
            for s in secs {
                self.meta.update_section(sec(s), |x| {
                    x.flags = flags;
                    x.first_dirty = 0;
                });
                self.push_big(Big::Section(sec(s)), MAX_ORDER);
            }
            return;
        }
        let old = self.whole;
        for s in secs.clone() {
            let next = if s == secs.start {
                old
            } else {
                sec(s - 1).pack()
            };
            let prev = if s + 1 == secs.end {
                NIL
            } else {
                sec(s + 1).pack()
            };
            self.meta.update_section(sec(s), |x| {
                x.flags = flags;
                x.first_dirty = 0;
                x.state = SectionState::Free;
                x.next = next;
                x.prev = prev;
            });
        }
        if let Some(h) = SecRef::unpack(old) {
            self.meta
                .update_section(h, |x| x.prev = sec(secs.start).pack());
        }
        self.whole = sec(secs.end - 1).pack();
        self.counts[Self::list(MAX_ORDER)] += n;
    }

    /// Frees the whole pageblocks `pbs` of the span in `slot` (within one section), with
    /// `flags`, as the fewest aligned blocks: the blocks that freeing them one by one would
    /// merge into, with each tail written once rather than at every merge on the way up.
    fn add_whole_pbs(&mut self, slot: u8, span: &SpanMeta, pbs: Range<u32>, flags: u8) {
        let mut pb = pbs.start;
        while pb < pbs.end {
            // The largest aligned block starting at `pb` that fits: a half section at most,
            // as the section is not whole.
            let number = span.pb_base(pb).get() >> PB_SHIFT;
            let k = number
                .trailing_zeros()
                .min((pbs.end - pb).ilog2())
                .min(u32::from(MAX_ORDER) - 1 - PB_SHIFT);
            let r = PbRef {
                span: slot,
                index: pb,
            };
            self.meta.update_pbs(r, 1 << k, |h| h.flags = flags);
            let frames = 1u64 << (k + PB_SHIFT);
            self.free_pages += frames;
            if flags & flag::DIRTY != 0 {
                self.dirty_pages += frames;
            }
            self.merge_big(r, (k + PB_SHIFT) as u8);
            pb += 1 << k;
        }
    }

    /// The span slot and pageblock of `pfn`.
    pub(crate) fn pb_ref(&self, pfn: Pfn) -> Option<PbRef> {
        let slot = self.meta.span_of(pfn)?;
        let span = self.meta.span(slot)?;
        Some(PbRef {
            span: slot,
            index: span.pb_of(pfn),
        })
    }

    fn sec_ref(&self, pfn: Pfn) -> Option<SecRef> {
        let slot = self.meta.span_of(pfn)?;
        let span = self.meta.span(slot)?;
        Some(SecRef {
            span: slot,
            index: span.section_of(pfn),
        })
    }

    /// The first frame of a pageblock.
    pub(crate) fn pb_base(&self, r: PbRef) -> Pfn {
        self.meta
            .span(r.span)
            .map_or(Pfn::new(0), |s| s.pb_base(r.index))
    }

    /// The first frame of a block.
    fn base(&self, b: Big) -> Pfn {
        match b {
            Big::Pb(r) => self.pb_base(r),
            Big::Section(s) => self
                .meta
                .span(s.span)
                .map_or(Pfn::new(0), |x| x.section_start(s.index)),
        }
    }

    /// The pageblock `pbs` pageblocks after `r`, in the same span.
    fn pb_plus(r: PbRef, pbs: u32) -> PbRef {
        PbRef {
            span: r.span,
            index: r.index + pbs,
        }
    }

    fn list(order: u8) -> usize {
        usize::from(order) - PB_SHIFT as usize
    }

    fn unpack(order: u8, v: u32) -> Option<Big> {
        if order == MAX_ORDER {
            SecRef::unpack(v).map(Big::Section)
        } else {
            PbRef::unpack(v).map(Big::Pb)
        }
    }

    fn links(&self, b: Big) -> (u32, u32) {
        match b {
            Big::Pb(r) => self.meta.pb(r).map_or((NIL, NIL), |h| (h.next, h.prev)),
            Big::Section(s) => self
                .meta
                .section(s)
                .map_or((NIL, NIL), |x| (x.next, x.prev)),
        }
    }

    /// The links of `b`, which this leaves `NIL`, in one access to its entry.
    fn take_links(&mut self, b: Big) -> (u32, u32) {
        let take = |next: &mut u32, prev: &mut u32| {
            (core::mem::replace(next, NIL), core::mem::replace(prev, NIL))
        };
        match b {
            Big::Pb(r) => self.meta.update_pb(r, |h| take(&mut h.next, &mut h.prev)),
            Big::Section(s) => self
                .meta
                .update_section(s, |x| take(&mut x.next, &mut x.prev)),
        }
        .unwrap_or((NIL, NIL))
    }

    fn set_links(&mut self, b: Big, next: Option<u32>, prev: Option<u32>) {
        match b {
            Big::Pb(r) => {
                self.meta.update_pb(r, |h| {
                    h.next = next.unwrap_or(h.next);
                    h.prev = prev.unwrap_or(h.prev);
                });
            }
            Big::Section(s) => {
                self.meta.update_section(s, |x| {
                    x.next = next.unwrap_or(x.next);
                    x.prev = prev.unwrap_or(x.prev);
                });
            }
        }
    }

    /// The section holding pageblock `r`.
    fn sec_of(&self, r: PbRef) -> Option<SecRef> {
        let span = self.meta.span(r.span)?;
        Some(SecRef {
            span: r.span,
            index: span.locate_pb(r.index).0,
        })
    }

    /// The section bucket of `free_pbs` free pageblocks (1 or more).
    fn sec_bucket(free_pbs: u16) -> usize {
        usize::from(free_pbs / SEC_WIDTH) + 1
    }

    /// The bucket set of a section: whether small frames live in it.
    fn sec_set(x: &Section) -> usize {
        if x.split_pbs > 0 { SMALL } else { PLAIN }
    }

    /// The bucket (set and number) of a split section with `x`'s counts; `None` without free
    /// pageblocks.
    fn sec_key(x: &Section) -> Option<(usize, usize)> {
        (x.free_pbs > 0).then(|| (Self::sec_set(x), Self::sec_bucket(x.free_pbs)))
    }

    /// Changes split section `s` through `f` (with its heads), moving it to the bucket its
    /// counts then call for. `f` runs on the entry in place; its old and new bucket neighbours
    /// are touched only if it changes buckets.
    fn sec_update<R>(
        &mut self,
        s: SecRef,
        f: impl FnOnce(&mut Section, Option<&mut Heads>) -> R,
    ) -> Option<R> {
        if self.isolated(s.span) {
            // In no bucket while isolated.
            return self.meta.update_split(s, f);
        }
        let (r, was, now, next, prev) = self.meta.update_split(s, |x, heads| {
            let was = Self::sec_key(x);
            let r = f(x, heads);
            let now = Self::sec_key(x);
            let links = (x.next, x.prev);
            if was != now {
                x.next = NIL;
                x.prev = NIL;
            }
            (r, was, now, links.0, links.1)
        })?;
        if was == now {
            return Some(r);
        }
        if let Some(key) = was {
            self.sec_unlink(key, next, prev);
        }
        if let Some((set, b)) = now {
            let head = self.sections[set].heads[b];
            self.sections[set].heads[b] = s.pack();
            self.sections[set].nonempty.put(b, true);
            if let Some(h) = SecRef::unpack(head) {
                self.meta.update_section(s, |x| x.next = head);
                self.meta.update_section(h, |z| z.prev = s.pack());
            }
        }
        Some(r)
    }

    /// Counts pageblock `r` as split below 2 MiB (`true`) or no longer (`false`) in its section.
    pub(super) fn count_split(&mut self, r: PbRef, split: bool) {
        if let Some(s) = self.sec_of(r) {
            self.sec_update(s, |x, _| {
                x.split_pbs = if split {
                    x.split_pbs + 1
                } else {
                    x.split_pbs - 1
                };
            });
        }
    }

    /// Takes split section `s` (as read in `x`) out of its bucket.
    fn sec_unbucket(&mut self, s: SecRef, x: &Section) {
        if let Some(key) = Self::sec_key(x) {
            self.sec_unlink(key, x.next, x.prev);
        }
        self.meta.update_section(s, |y| {
            y.next = NIL;
            y.prev = NIL;
        });
    }

    /// Points the neighbours of a split section in bucket `(set, b)`, linked to `next` and
    /// `prev` there, past it; its own links are the caller's to clear.
    fn sec_unlink(&mut self, (set, b): (usize, usize), next: u32, prev: u32) {
        match SecRef::unpack(prev) {
            None => {
                self.sections[set].heads[b] = next;
                if next == NIL {
                    self.sections[set].nonempty.put(b, false);
                }
            }
            Some(p) => {
                self.meta.update_section(p, |y| y.next = next);
            }
        }
        if let Some(n) = SecRef::unpack(next) {
            self.meta.update_section(n, |y| y.prev = prev);
        }
    }

    /// Marks `b` a free block of `order` (its head `Free`, the rest `FreeTail`) and puts it at
    /// the front of its list: the zone's for a section, its section's for pageblocks.
    fn push_big(&mut self, b: Big, order: u8) {
        match b {
            Big::Section(s) if self.isolated(s.span) => self.park(s),
            Big::Section(s) => {
                self.meta
                    .update_section(s, |x| x.state = SectionState::Free);
                self.whole_insert(s);
            }
            Big::Pb(r) => {
                let Some(s) = self.sec_of(r) else {
                    return;
                };
                let k = Self::list(order);
                let head = self
                    .sec_update(s, |x, heads| {
                        debug_assert!(heads.is_some(), "a block pushed in a section unsplit");
                        x.free_pbs += 1 << (order - PB_SHIFT as u8);
                        heads.map(|h| core::mem::replace(&mut h[k], r.pack()))
                    })
                    .flatten()
                    .unwrap_or(NIL);
                let tails = (1 << (order - PB_SHIFT as u8)) - 1;
                if tails > 0 {
                    self.meta.update_pbs(Self::pb_plus(r, 1), tails, |h| {
                        h.state = PbState::FreeTail;
                        h.next = NIL;
                        h.prev = NIL;
                    });
                }
                self.meta.update_pb(r, |h| {
                    h.state = PbState::Free { order };
                    h.next = head;
                    h.prev = NIL;
                });
                if let Some(h) = PbRef::unpack(head) {
                    self.meta.update_pb(h, |x| x.prev = r.pack());
                }
            }
        }
        self.counts[Self::list(order)] += 1;
        self.iso_more(Self::span_of(b), 1 << order);
    }

    /// Takes the free block `b` of `order` off its list (its state is left to the caller).
    fn unlink_big(&mut self, b: Big, order: u8) {
        let (next, prev) = self.take_links(b);
        match b {
            // Parked: on no list.
            Big::Section(s) if self.isolated(s.span) => {}
            Big::Section(_) => {
                match SecRef::unpack(prev) {
                    None => self.whole = next,
                    Some(p) => {
                        self.meta.update_section(p, |x| x.next = next);
                    }
                }
                if let Some(n) = SecRef::unpack(next) {
                    self.meta.update_section(n, |x| x.prev = prev);
                }
            }
            Big::Pb(r) => {
                let Some(s) = self.sec_of(r) else {
                    return;
                };
                let k = Self::list(order);
                if let Some(p) = PbRef::unpack(prev) {
                    self.meta.update_pb(p, |x| x.next = next);
                }
                if let Some(n) = PbRef::unpack(next) {
                    self.meta.update_pb(n, |x| x.prev = prev);
                }
                self.sec_update(s, |x, heads| {
                    if prev == NIL
                        && let Some(h) = heads
                    {
                        h[k] = next;
                    }
                    x.free_pbs -= 1 << (order - PB_SHIFT as u8);
                });
            }
        }
        self.counts[Self::list(order)] -= 1;
        self.iso_less(Self::span_of(b), 1 << order);
    }

    /// The order in which [`FreeArea::take_big`] should look at the section bucket sets for a
    /// pageblock in a section that is not emptying (below [`EMPTYING`] free pageblocks): the
    /// set with small frames first if it has one, else the other; `None` if neither has.
    fn fuller_sets(&self) -> Option<[usize; 2]> {
        let fuller = |set: usize| {
            self.sections[set]
                .nonempty
                .next_set(1)
                .is_some_and(|b| b < Self::sec_bucket(EMPTYING))
        };
        if fuller(SMALL) {
            Some([SMALL, PLAIN])
        } else if fuller(PLAIN) {
            Some([PLAIN, SMALL])
        } else {
            None
        }
    }

    /// The smallest free block of at least `order` (9..=17) in the fullest split section of
    /// bucket set `set` that has one: its head and order. The first section looked at serves
    /// one pageblock; a larger order may walk on through sections whose free pageblocks are
    /// scattered.
    fn fullest_section(&self, set: usize, order: u8) -> Option<(PbRef, u8)> {
        let mut from = 1;
        while let Some(b) = self.sections[set].nonempty.next_set(from) {
            let mut cur = self.sections[set].heads[b];
            while let Some(s) = SecRef::unpack(cur) {
                let (found, next) = self.meta.with_split(s, |x, heads| {
                    let k = (order..MAX_ORDER).find(|&k| heads[Self::list(k)] != NIL);
                    (k.map(|k| (heads[Self::list(k)], k)), x.next)
                })?;
                if let Some((head, k)) = found {
                    return PbRef::unpack(head).map(|r| (r, k));
                }
                cur = next;
            }
            from = b + 1;
        }
        None
    }

    /// Takes a block of at least `order` (9..=18) off the lists, splitting it down to `order`:
    /// from the fullest split section that can serve it, in the bucket set `sets[0]` first, else
    /// a whole free section. Its head is left `Free` for the caller to mark.
    ///
    /// Pageblocks to split for small frames come from sections that hold small frames already
    /// (`[SMALL, PLAIN]`), whole blocks from sections that do not (`[PLAIN, SMALL]`): long-lived
    /// small frames then gather in few sections, and the sections of whole blocks (a guest's
    /// memory) become whole again when those are freed.
    ///
    /// Inlined: returned through memory by an out-of-line call, its result was read back wider
    /// than it was written (a store-forwarding stall on every allocation of a section, perf).
    #[inline(always)]
    fn take_big(&mut self, order: u8, sets: [usize; 2]) -> Result<Big, NoBlock> {
        // No split section holds a whole free section: those are on the zone's own list.
        let found = (order < MAX_ORDER)
            .then(|| {
                self.fullest_section(sets[0], order)
                    .or_else(|| self.fullest_section(sets[1], order))
            })
            .flatten();
        let (r, mut k) = match found {
            Some((r, k)) => {
                self.unlink_big(Big::Pb(r), k);
                (r, k)
            }
            None => {
                let s = SecRef::unpack(self.whole).ok_or(NoBlock::Empty)?;
                self.unlink_big(Big::Section(s), MAX_ORDER);
                if order == MAX_ORDER {
                    return Ok(Big::Section(s));
                }
                let template = PbHeader {
                    state: PbState::FreeTail,
                    flags: self.meta.section(s).map_or(0, |x| x.flags),
                    ..PbHeader::NEW
                };
                if let Err(short) = self.meta.split_section(s, template, self.need) {
                    self.push_big(Big::Section(s), MAX_ORDER);
                    return Err(short.into());
                }
                let first = self.meta.span(s.span).map_or(0, |x| x.first_pb(s.index));
                let r = PbRef {
                    span: s.span,
                    index: first,
                };
                (r, MAX_ORDER)
            }
        };
        while k > order {
            k -= 1;
            self.push_big(Big::Pb(Self::pb_plus(r, 1 << (k - PB_SHIFT as u8))), k);
        }
        Ok(Big::Pb(r))
    }

    /// Allocates a block of `order` (9..=18) as `what`: its head `Allocated`, its other
    /// pageblocks `AllocatedTail`. The block keeps its dirty flags (a pool page's say whether
    /// it is dirty).
    pub(crate) fn alloc_big(&mut self, order: u8, what: Use) -> Result<Got, NoBlock> {
        let b = match self.take_big(order, [PLAIN, SMALL]) {
            Err(NoBlock::Empty) if self.release_spares() => self.take_big(order, [PLAIN, SMALL])?,
            r => r?,
        };
        match b {
            Big::Pb(r) if order == PB_SHIFT as u8 => return Ok(self.alloc_pb(r, what)),
            Big::Section(s) => return Ok(self.alloc_section(s, what)),
            Big::Pb(_) => {}
        }
        self.dirty_pages -= self.block_dirty(b, order);
        let dirty = self.block_dirty_range(b, order);
        self.mark_allocated(b, order, what);
        self.free_pages -= 1 << order;
        Ok(Got::within(self.base(b), dirty))
    }

    /// The end of [`FreeArea::alloc_big`] for one pageblock `r`, off its list, in one access
    /// to its header: what `block_dirty`, `block_dirty_range` and `mark_allocated` do for it.
    fn alloc_pb(&mut self, r: PbRef, what: Use) -> Got {
        let order = PB_SHIFT as u8;
        let flags = self
            .meta
            .update_pb(r, |h| {
                let flags = h.flags;
                h.flags &= !flag::REPORTED;
                h.state = PbState::Allocated { order, what };
                flags
            })
            .unwrap_or(0);
        let dirty = if flags & flag::DIRTY != 0 {
            FRAMES as u64
        } else {
            0
        };
        self.taken_whole(self.pb_base(r), order, flags, dirty)
    }

    /// [`FreeArea::alloc_pb`] for a whole section `s`, in one access to its entry.
    fn alloc_section(&mut self, s: SecRef, what: Use) -> Got {
        let sec = self.meta.update_section(s, |x| {
            let before = *x;
            x.flags &= !flag::REPORTED;
            x.state = SectionState::Allocated(what);
            before
        });
        let (flags, dirty) = sec.map_or((0, 0), |x| (x.flags, dirty::section_frames_dirty(&x)));
        self.taken_whole(self.base(Big::Section(s)), MAX_ORDER, flags, dirty)
    }

    /// The counts of the block of `order` at `pfn` that `alloc_pb` or `alloc_section` took,
    /// whose flags were `flags` and whose last `dirty` frames may be dirty; reported memory
    /// goes through the install hook.
    fn taken_whole(&mut self, pfn: Pfn, order: u8, flags: u8, dirty: u64) -> Got {
        let frames = 1u64 << order;
        if flags & flag::REPORTED != 0 {
            self.reported_pages -= frames;
            self.install_at(pfn, order);
        }
        self.dirty_pages -= dirty;
        self.free_pages -= frames;
        Got::part(pfn, frames - dirty, dirty)
    }

    fn mark_allocated(&mut self, b: Big, order: u8, what: Use) {
        self.reuse(b, order);
        match b {
            Big::Section(s) => {
                self.meta
                    .update_section(s, |x| x.state = SectionState::Allocated(what));
            }
            Big::Pb(r) => {
                let mut state = PbState::Allocated { order, what };
                self.meta.update_pbs(r, 1 << (order - PB_SHIFT as u8), |h| {
                    h.state = core::mem::replace(&mut state, PbState::AllocatedTail);
                });
            }
        }
    }

    /// Frees the block of `order` (9..=18) at `pfn`, dirty or clean, merging it with its free
    /// buddies; the caller checked it is allocated as such.
    fn free_big(&mut self, pfn: Pfn, order: u8, dirty: bool) {
        self.free_pages += 1 << order;
        if dirty {
            self.dirty_pages += 1 << order;
        }
        if order == MAX_ORDER {
            if let Some(s) = self.sec_ref(pfn) {
                self.set_block_dirty(Big::Section(s), order, dirty);
                self.push_big(Big::Section(s), MAX_ORDER);
            }
            return;
        }
        if let Some(r) = self.pb_ref(pfn) {
            self.set_block_dirty(Big::Pb(r), order, dirty);
            self.merge_big(r, order);
        }
    }

    /// Puts the free block of `order` headed by `r` on its list, merged with its free buddies,
    /// up to a whole section (which then gives its array back to the pool). The merged block is
    /// reported only if all its parts were.
    pub(super) fn merge_big(&mut self, mut r: PbRef, mut order: u8) {
        let Some(span) = self.meta.span(r.span).copied() else {
            return;
        };
        let mut reported = self.is_reported(Big::Pb(r));
        while order < MAX_ORDER - 1 {
            let step = 1u32 << (order - PB_SHIFT as u8);
            let base = span.pb_base(r.index).get();
            let buddy_base = base ^ (1u64 << order);
            if buddy_base < span.range.start().get()
                || buddy_base + (1u64 << order) > span.range.end().get()
            {
                break;
            }
            let buddy = if buddy_base > base {
                Self::pb_plus(r, step)
            } else {
                PbRef {
                    span: r.span,
                    index: r.index - step,
                }
            };
            if self.meta.pb(buddy).map(|h| h.state) != Some(PbState::Free { order }) {
                break;
            }
            self.unlink_big(Big::Pb(buddy), order);
            reported = self.merge_marks(reported, Big::Pb(r), Big::Pb(buddy), order);
            r = if buddy_base < base { buddy } else { r };
            order += 1;
        }
        if order == MAX_ORDER - 1 {
            // The two halves of a section: if both are free, the section is one free block.
            let s = span.section_of(span.pb_base(r.index));
            let half = 1u32 << (order - PB_SHIFT as u8);
            let first = span.first_pb(s);
            let other = if r.index == first {
                Self::pb_plus(r, half)
            } else {
                PbRef {
                    span: r.span,
                    index: first,
                }
            };
            if section_is_whole(span.range, u64::from(s))
                && self.meta.pb(other).map(|h| h.state) == Some(PbState::Free { order })
            {
                self.unlink_big(Big::Pb(other), order);
                reported = self.merge_marks(reported, Big::Pb(r), Big::Pb(other), order);
                let sec = SecRef {
                    span: r.span,
                    index: s,
                };
                let head = PbRef {
                    span: r.span,
                    index: first,
                };
                // The merged section keeps its clean prefix; a clean pageblock after its first
                // dirty one now counts as dirty.
                let before = self.block_dirty(Big::Pb(head), MAX_ORDER - 1)
                    + self.block_dirty(Big::Pb(Self::pb_plus(head, half)), MAX_ORDER - 1);
                let first_dirty = (0..PBS_PER_SECTION as u32).find(|&i| {
                    self.meta
                        .pb(Self::pb_plus(head, i))
                        .is_some_and(|h| h.flags & flag::DIRTY != 0)
                });
                self.meta.join_section(sec, SectionState::Free);
                self.meta.update_section(sec, |x| {
                    x.flags = if first_dirty.is_some() {
                        flag::DIRTY
                    } else {
                        0
                    } | if reported { flag::REPORTED } else { 0 };
                    x.first_dirty = first_dirty.unwrap_or(0) as u16;
                });
                let after = self.block_dirty(Big::Section(sec), MAX_ORDER);
                self.dirty_pages = (self.dirty_pages + after).saturating_sub(before);
                self.push_big(Big::Section(sec), MAX_ORDER);
                return;
            }
        }
        self.push_big(Big::Pb(r), order);
    }

    /// Merges every spare pageblock back into the buddy; `true` if there was one.
    pub(crate) fn release_spares(&mut self) -> bool {
        let mut any = false;
        for c in Class::ALL {
            if let Some(r) = self.spare[c.index()].take() {
                self.unsplit(r);
                any = true;
            }
        }
        any
    }

    /// Turns a wholly free split pageblock back into a free order-9 block (its planes go back
    /// to the pool) and merges it.
    fn unsplit(&mut self, r: PbRef) {
        let before = self.pb_dirty(r);
        if self.isolated(r.span) {
            // Its free frames join the block `merge_big` pushes.
            let free = self.meta.pb(r).map_or(0, |h| u64::from(h.free));
            self.iso_less(r.span, free);
        }
        self.meta.drop_planes(r);
        self.count_split(r, false);
        self.meta.update_pb(r, |h| {
            h.free = 0;
            h.multi = 0;
            h.bucket = 0;
            if before > 0 {
                h.flags |= flag::DIRTY;
            } else {
                h.flags &= !flag::DIRTY;
            }
        });
        // A pageblock with a dirty frame is dirty as a whole once it is not split.
        if before > 0 {
            self.dirty_pages += FRAMES as u64 - before;
        }
        self.merge_big(r, PB_SHIFT as u8);
    }

    /// Checks that `pfn` heads a whole-pageblock block allocated with `order` as `what` and
    /// frees it, dirty or clean; on error nothing changes.
    pub(crate) fn free_whole(
        &mut self,
        pfn: Pfn,
        order: u8,
        what: Use,
        dirty: bool,
    ) -> Result<(), FreeError> {
        let found = self.whole_at(pfn)?;
        match found {
            Some((o, w)) if o == order && w == what => {
                self.free_big(pfn, order, dirty);
                Ok(())
            }
            Some((_, Use::Pooled | Use::Scrub)) => Err(FreeError::DoubleFree { pfn }),
            Some((_, w)) if w != what => Err(if w == Use::Huge {
                FreeError::HugePage { pfn }
            } else {
                FreeError::NotAllocated { pfn }
            }),
            Some((o, _)) => Err(FreeError::WrongOrder {
                pfn,
                given: Order::new(order),
                allocated: Order::new(o),
            }),
            None => Err(FreeError::NotAllocated { pfn }),
        }
    }

    /// The `(order, use)` of the whole-pageblock block headed at `pfn`, `None` if `pfn` heads
    /// none; `DoubleFree` if it lies in a free one.
    fn whole_at(&self, pfn: Pfn) -> Result<Option<(u8, Use)>, FreeError> {
        let s = self.sec_ref(pfn).ok_or(FreeError::Foreign { pfn })?;
        let sec = self.meta.section(s).ok_or(FreeError::Foreign { pfn })?;
        let sec_base = self.base(Big::Section(s));
        match sec.state {
            SectionState::Free | SectionState::Allocated(Use::Scrub) => {
                Err(FreeError::DoubleFree { pfn })
            }
            SectionState::Allocated(w) => Ok((pfn == sec_base).then_some((MAX_ORDER, w))),
            SectionState::Split => {
                let r = self.pb_ref(pfn).ok_or(FreeError::Foreign { pfn })?;
                let h = self.meta.pb(r).ok_or(FreeError::Foreign { pfn })?;
                let head = self.pb_base(r) == pfn;
                match h.state {
                    PbState::Free { .. }
                    | PbState::FreeTail
                    | PbState::Allocated {
                        what: Use::Scrub, ..
                    } => Err(FreeError::DoubleFree { pfn }),
                    PbState::Allocated { order, what } => Ok(head.then_some((order, what))),
                    _ => Ok(None),
                }
            }
        }
    }

    /// Moves one block of a huge-page `order` from the buddy into the pool.
    pub(crate) fn pool_grow(&mut self, order: Order) -> Result<(), NoBlock> {
        let i = pool_index(order).ok_or(NoBlock::Empty)?;
        let pfn = self.alloc_big(order.get(), Use::Pooled)?.pfn;
        self.pool_link(i, pfn);
        self.pools[i].total += 1;
        Ok(())
    }

    fn pool_ref(&self, i: usize, pfn: Pfn) -> Option<u32> {
        if i == 1 {
            self.sec_ref(pfn).map(SecRef::pack)
        } else {
            self.pb_ref(pfn).map(PbRef::pack)
        }
    }

    fn pool_link(&mut self, i: usize, pfn: Pfn) {
        let Some(me) = self.pool_ref(i, pfn) else {
            return;
        };
        let head = self.pools[i].head;
        let b = if i == 1 {
            SecRef::unpack(me).map(Big::Section)
        } else {
            PbRef::unpack(me).map(Big::Pb)
        };
        if let Some(b) = b {
            self.set_links(b, Some(head), Some(NIL));
        }
        self.pools[i].head = me;
        self.pools[i].free += 1;
    }

    fn pool_pop(&mut self, i: usize) -> Option<Pfn> {
        let head = self.pools[i].head;
        let b = if i == 1 {
            SecRef::unpack(head).map(Big::Section)
        } else {
            PbRef::unpack(head).map(Big::Pb)
        }?;
        self.pools[i].head = self.links(b).0;
        self.set_links(b, Some(NIL), Some(NIL));
        self.pools[i].free -= 1;
        Some(self.base(b))
    }

    fn set_use(&mut self, pfn: Pfn, order: Order, what: Use) {
        if order == Order::MAX {
            if let Some(s) = self.sec_ref(pfn) {
                self.meta
                    .update_section(s, |x| x.state = SectionState::Allocated(what));
            }
        } else if let Some(r) = self.pb_ref(pfn) {
            self.meta.update_pb(r, |h| {
                h.state = PbState::Allocated {
                    order: order.get(),
                    what,
                }
            });
        }
    }

    /// The block of a pool page of `order` at `pfn`.
    fn pool_block(&self, pfn: Pfn, order: Order) -> Option<Big> {
        if order == Order::MAX {
            self.sec_ref(pfn).map(Big::Section)
        } else {
            self.pb_ref(pfn).map(Big::Pb)
        }
    }

    /// Takes a free page from the pool of `order`, with the part of it that may be dirty.
    pub(crate) fn pool_take(&mut self, order: Order) -> Option<Got> {
        let pfn = self.pool_pop(pool_index(order)?)?;
        self.set_use(pfn, order, Use::Huge);
        let dirty = self
            .pool_block(pfn, order)
            .and_then(|b| self.block_dirty_range(b, order.get()));
        Some(Got::within(pfn, dirty))
    }

    /// Returns a pool page; on error nothing changes.
    pub(crate) fn pool_put(&mut self, pfn: Pfn, order: Order) -> Result<(), FreeError> {
        let i = pool_index(order).ok_or(FreeError::NotAllocated { pfn })?;
        match self.find(pfn, order)? {
            Found::Whole {
                order: o,
                what: Use::Huge,
            } if o == order.get() => {}
            Found::Whole {
                what: Use::Pooled | Use::Scrub,
                ..
            } => return Err(FreeError::DoubleFree { pfn }),
            Found::Whole { order: o, .. } | Found::Small { order: o, .. } => {
                return Err(if o == order.get() {
                    FreeError::NotAllocated { pfn }
                } else {
                    FreeError::WrongOrder {
                        pfn,
                        given: order,
                        allocated: Order::new(o),
                    }
                });
            }
            Found::Hot { .. } => return Err(FreeError::NotAllocated { pfn }),
        }
        if self.put_isolated(pfn, order) {
            return Ok(());
        }
        self.set_use(pfn, order, Use::Pooled);
        // Its last owner's data is in it.
        if let Some(b) = self.pool_block(pfn, order) {
            self.set_block_dirty(b, order.get(), true);
        }
        self.pool_link(i, pfn);
        Ok(())
    }

    /// Gives one free pool page of `order` back to the buddy; `false` if none is free.
    pub(crate) fn pool_shrink(&mut self, order: Order) -> bool {
        let Some(i) = pool_index(order) else {
            return false;
        };
        let Some(pfn) = self.pool_pop(i) else {
            return false;
        };
        self.pools[i].total -= 1;
        let dirty = self
            .pool_block(pfn, order)
            .is_some_and(|b| self.block_dirty(b, order.get()) > 0);
        self.free_big(pfn, order.get(), dirty);
        true
    }

    /// `(total, free)` pages of the pool of `order`.
    pub(crate) fn pool_counts(&self, order: Order) -> (u64, u64) {
        pool_index(order).map_or((0, 0), |i| (self.pools[i].total, self.pools[i].free))
    }

    /// Free frames in free blocks of at least `order` (for the unusable index and HBA).
    pub(crate) fn free_in_blocks_of(&self, order: Order) -> u64 {
        let from = order.get().max(PB_SHIFT as u8);
        // A unit a scrub holds is still free.
        let held = self
            .scrub_held_block()
            .filter(|&k| k >= from)
            .map_or(0, |k| 1u64 << k);
        let big: u64 = (from..=MAX_ORDER)
            .map(|k| self.counts[Self::list(k)] << k)
            .sum::<u64>()
            + held;
        let spares = self.spare.iter().flatten().count() as u64;
        if order.get() < PB_SHIFT as u8 {
            // A spare is a split pageblock: `small_free_in_blocks_of` counts its frames.
            big + self.small_free_in_blocks_of(order)
        } else if order.get() == PB_SHIFT as u8 {
            big + (spares << PB_SHIFT)
        } else {
            big
        }
    }
}

/// What a free is about to return: a block of whole pageblocks, or frames of a split one.
pub(crate) use small::Found;

#[cfg(test)]
mod tests;
