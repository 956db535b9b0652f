//! Per-frame metadata, outside the frames, initialised lazily.
//!
//! Every frame of a span has a 12-byte [`Entry`] in a metadata region the platform maps from
//! the span's own node. An entry is non-zero exactly when its frame heads a block, free or
//! allocated, so a free checks one entry and misuse is caught in O(1).
//!
//! Boot must not cost O(frames), and memory handed out in 1 GiB blocks should carry no
//! per-frame metadata at all. So the region is initialised on demand, in two levels, the way
//! Linux backs its vmemmap:
//! - a *section* is the part of a naturally aligned order-18 (1 GiB) range inside the span;
//! - a *subsection* is the part of a naturally aligned order-9 (2 MiB) range inside the span.
//!
//! The first frame of a section (its anchor) always has a valid entry. The other entries of a
//! section are valid only once the section is *active*; then each subsection anchor is valid,
//! and the remaining entries of a subsection once the subsection is active. An invalid entry
//! reads as zero. [`Span::prepare`] activates what a write needs, zeroing what becomes valid:
//! 511 entries for a section, 511 for a subsection. Boot writes one state byte and one anchor
//! per section; splitting 1 GiB into 2 MiB pages never touches a subsection.
//!
//! This module owns all raw access to the region; everything it exposes is safe.

use core::mem::MaybeUninit;
use core::ptr::NonNull;

use crate::addr::{Order, Pfn, PhysRange};
use crate::sync::{AtomicU8, AtomicUsize, Ordering, RawAtomicU32, UnsafeCell, spin_loop};

const SECTION_SHIFT: u32 = 18;
const SUBSECTION_SHIFT: u32 = 9;
const INACTIVE: u8 = 0;
const ACTIVE: u8 = 1;

/// Most spans (boot ranges plus hot-added ranges) one zone can hold.
pub const MAX_SPANS_PER_ZONE: usize = 8;

/// "No link" in a free list.
pub(crate) const NIL: u32 = u32::MAX;

/// The metadata of one frame. The tag is atomic so that checks outside the zone lock (per-CPU
/// frees) never race. The links belong to whoever owns the block: the zone for free blocks and
/// pooled huge pages (zone-relative indices, under the zone lock), a per-CPU cache for the
/// frames it holds (one absolute frame number, under that CPU's lock).
#[repr(C)]
pub(crate) struct Entry {
    next: u32,
    prev: u32,
    tag: RawAtomicU32,
}

/// Bits of an entry's tag. Zero means "does not head a block".
pub(crate) mod tag {
    /// The block's order.
    pub(crate) const ORDER_MASK: u32 = 0x1f;
    /// The block is on a free list.
    pub(crate) const FREE: u32 = 1 << 8;
    /// The block is handed out.
    pub(crate) const ALLOCATED: u32 = 1 << 9;
    /// The allocated block belongs to a huge-page pool.
    pub(crate) const HUGE: u32 = 1 << 10;
    /// The allocated frame sits in a per-CPU cache.
    pub(crate) const CACHED: u32 = 1 << 11;
    /// The allocated frame is claimed by a bulk free in progress.
    pub(crate) const CLAIMED: u32 = 1 << 12;
    /// The huge page is free in its pool (linked through `next`).
    pub(crate) const POOLED: u32 = 1 << 13;
}

/// Size of one entry: 12 bytes per 4 KiB frame, 0.29% of memory.
pub(crate) const ENTRY_BYTES: u64 = core::mem::size_of::<Entry>() as u64;

/// A contiguous range of frames with its metadata region.
///
/// Invariants: `entries` points to `range.frames()` entries, followed by one anchor entry per
/// section, one per subsection, one state byte per section and one per subsection, all valid for the allocator's lifetime and used only through
/// this type, under the owning zone's lock. Entries obey the validity rules of the module doc.
#[derive(Clone, Copy)]
pub(crate) struct Span {
    range: PhysRange,
    entries: NonNull<Entry>,
    sec_anchors: NonNull<Entry>,
    sub_anchors: NonNull<Entry>,
    sections: NonNull<AtomicU8>,
    subsections: NonNull<AtomicU8>,
}

impl core::fmt::Debug for Span {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Span")
            .field("range", &self.range)
            .finish_non_exhaustive()
    }
}

// SAFETY: a Span is a handle to a metadata region that only the owning zone touches, under its
// lock (links) or atomically (tags); moving the handle between threads moves no data.
unsafe impl Send for Span {}
// SAFETY: shared access only reads the immutable fields and tags, which are atomic.
unsafe impl Sync for Span {}

fn count(range: PhysRange, shift: u32) -> u64 {
    if range.is_empty() {
        0
    } else {
        ((range.end().get() - 1) >> shift) - (range.start().get() >> shift) + 1
    }
}

impl Span {
    /// Bytes of metadata region a span over `range` needs.
    pub(crate) fn region_bytes(range: PhysRange) -> u64 {
        let (nsec, nsub) = (count(range, SECTION_SHIFT), count(range, SUBSECTION_SHIFT));
        (range.frames() + nsec + nsub) * ENTRY_BYTES + nsec + nsub
    }

    /// Maps `meta` through `mem` and builds a span over `range` with it. `None` if `meta` is
    /// too small or cannot be mapped. The caller never maps `meta` again nor hands out its frames.
    pub(crate) fn map<M: crate::platform::PhysMemory + ?Sized>(
        mem: &M,
        range: PhysRange,
        meta: PhysRange,
    ) -> Option<Span> {
        if meta.bytes() < Span::region_bytes(range) || meta.overlaps(&range) {
            return None;
        }
        let region = crate::platform::map_checked(mem, meta)?;
        // SAFETY: PhysMemory's contract makes `region` page aligned and valid, for as long as
        // `mem` is borrowed (the machine's lifetime), for `meta.bytes()` bytes, which is at least
        // `region_bytes(range)`; the allocator maps each metadata range once, so it is ours alone.
        Some(unsafe { Span::new(range, region) })
    }

    /// Builds the span and initialises its metadata lazily: every section inactive, and the
    /// anchor entry of every section zeroed. Costs O(sections).
    ///
    /// # Safety
    /// `region` must be aligned to 4 bytes, valid for reads and writes of
    /// [`Span::region_bytes`]`(range)` bytes for as long as the span (or a copy) is used, and
    /// used by nothing else.
    pub(crate) unsafe fn new(range: PhysRange, region: NonNull<u8>) -> Span {
        let entries = region.cast::<Entry>();
        let frames = range.frames() as usize;
        let nsec = count(range, SECTION_SHIFT) as usize;
        let nsub = count(range, SUBSECTION_SHIFT) as usize;
        // SAFETY: the region holds `frames + nsec + nsub` entries, then `nsec` section bytes and
        // `nsub` subsection bytes (caller's guarantee, see `region_bytes`), so every offset stays
        // inside it; entry tables start at multiples of 12 bytes, so they stay 4-aligned.
        let (sec_anchors, sub_anchors, sections, subsections) = unsafe {
            let sec_anchors = entries.add(frames);
            let sub_anchors = sec_anchors.add(nsec);
            let sections = sub_anchors.add(nsub).cast::<AtomicU8>();
            (sec_anchors, sub_anchors, sections, sections.add(nsec))
        };
        let span = Span {
            range,
            entries,
            sec_anchors,
            sub_anchors,
            sections,
            subsections,
        };
        for s in 0..nsec {
            // SAFETY: `s < nsec`, so the byte is inside the section table; nothing reads it
            // before the span is published.
            unsafe { sections.add(s).write(AtomicU8::new(INACTIVE)) };
            span.zero(span.section_anchor(s));
        }
        span
    }

    /// The frames this span covers.
    pub(crate) fn range(&self) -> PhysRange {
        self.range
    }

    /// `true` if the whole block `pfn .. pfn + 2^order` lies in the span.
    pub(crate) fn holds(&self, pfn: Pfn, order: Order) -> bool {
        self.range.contains(pfn) && pfn.get() + order.frames() <= self.range.end().get()
    }

    fn section_index(&self, pfn: Pfn) -> usize {
        ((pfn.get() >> SECTION_SHIFT) - (self.range.start().get() >> SECTION_SHIFT)) as usize
    }

    fn subsection_index(&self, pfn: Pfn) -> usize {
        ((pfn.get() >> SUBSECTION_SHIFT) - (self.range.start().get() >> SUBSECTION_SHIFT)) as usize
    }

    fn section_anchor(&self, s: usize) -> Pfn {
        let start = ((self.range.start().get() >> SECTION_SHIFT) + s as u64) << SECTION_SHIFT;
        Pfn::new(start.max(self.range.start().get()))
    }

    fn anchor_of(&self, pfn: Pfn, shift: u32) -> Pfn {
        Pfn::new(((pfn.get() >> shift) << shift).max(self.range.start().get()))
    }

    /// Where the entry of `pfn` lives, or `None` for a frame outside the span. Anchors sit in
    /// their own dense tables, so that boot and huge-page reservation touch a few contiguous
    /// pages instead of one page per anchor.
    fn entry(&self, pfn: Pfn) -> Option<*mut Entry> {
        if !self.range.contains(pfn) {
            return None;
        }
        // SAFETY: `pfn` is a frame of the span, so its section and subsection indices are below
        // the table sizes and its frame offset is below `range.frames()` (the region layout of
        // `Span::new`).
        Some(unsafe { self.entry_unchecked(pfn) })
    }

    /// [`Span::entry`] without the range check.
    ///
    /// # Safety
    /// `pfn` must be a frame of the span.
    unsafe fn entry_unchecked(&self, pfn: Pfn) -> *mut Entry {
        // SAFETY: the caller guarantees `pfn` lies in the span; see `entry`.
        unsafe {
            if pfn == self.anchor_of(pfn, SECTION_SHIFT) {
                self.sec_anchors.as_ptr().add(self.section_index(pfn))
            } else if pfn == self.anchor_of(pfn, SUBSECTION_SHIFT) {
                self.sub_anchors.as_ptr().add(self.subsection_index(pfn))
            } else {
                self.entries
                    .as_ptr()
                    .add((pfn.get() - self.range.start().get()) as usize)
            }
        }
    }

    /// The section state byte of a frame of the span.
    fn section_byte(&self, pfn: Pfn) -> &AtomicU8 {
        debug_assert!(self.range.contains(pfn));
        // SAFETY: callers pass frames of the span (checked by `entry` before any of them runs),
        // whose section index is below the section count; the byte was written in `new`.
        unsafe { &*self.sections.as_ptr().add(self.section_index(pfn)) }
    }

    /// The subsection state byte of a frame of the span (written when its section activated).
    fn subsection_byte(&self, pfn: Pfn) -> &AtomicU8 {
        debug_assert!(self.range.contains(pfn));
        // SAFETY: as in `section_byte`, for the subsection table; the byte was written when the
        // section became active, which callers checked first.
        unsafe { &*self.subsections.as_ptr().add(self.subsection_index(pfn)) }
    }

    /// `true` if the entry of `pfn` (a frame of the span) is valid. Acquire: pairs with the
    /// Release in `prepare`, so the zeroed entries are seen by a reader without the zone lock.
    fn is_valid(&self, pfn: Pfn) -> bool {
        if pfn == self.anchor_of(pfn, SECTION_SHIFT) {
            return true;
        }
        self.section_byte(pfn).load(Ordering::Acquire) == ACTIVE
            && (pfn == self.anchor_of(pfn, SUBSECTION_SHIFT)
                || self.subsection_byte(pfn).load(Ordering::Acquire) == ACTIVE)
    }

    fn zero(&self, pfn: Pfn) {
        if let Some(e) = self.entry(pfn) {
            // SAFETY: `entry` points into the region, which is ours and aligned; a zeroed Entry
            // is a valid Entry (plain integers and an atomic integer).
            unsafe { e.write_bytes(0, 1) };
        }
    }

    /// Makes the entry of `pfn` valid for writing, activating its section and subsection as
    /// needed (zeroing the entries that become valid). The caller holds the zone lock. Returns
    /// the entry, or `None` for a frame outside the span.
    fn prepare(&self, pfn: Pfn) -> Option<*mut Entry> {
        let e = self.entry(pfn)?;
        if self.is_valid(pfn) {
            return Some(e);
        }
        let sec_anchor = self.anchor_of(pfn, SECTION_SHIFT);
        if self.section_byte(pfn).load(Ordering::Relaxed) != ACTIVE {
            let sec_end = ((sec_anchor.get() >> SECTION_SHIFT) + 1) << SECTION_SHIFT;
            let end = sec_end.min(self.range.end().get());
            let mut sub = sec_anchor.get();
            while sub < end {
                let p = Pfn::new(sub);
                // SAFETY: `p` is a frame of the span, so its subsection byte exists; no reader
                // looks at it before the section byte below says ACTIVE.
                unsafe {
                    self.subsections
                        .as_ptr()
                        .add(self.subsection_index(p))
                        .write(AtomicU8::new(INACTIVE))
                };
                if p != sec_anchor {
                    self.zero(p);
                }
                sub = ((sub >> SUBSECTION_SHIFT) + 1) << SUBSECTION_SHIFT;
            }
            // Release: a reader that sees ACTIVE sees the bytes and entries written above.
            self.section_byte(pfn).store(ACTIVE, Ordering::Release);
        }
        let sub_anchor = self.anchor_of(pfn, SUBSECTION_SHIFT);
        if pfn != sub_anchor && self.subsection_byte(pfn).load(Ordering::Relaxed) != ACTIVE {
            let sub_end = (((sub_anchor.get() >> SUBSECTION_SHIFT) + 1) << SUBSECTION_SHIFT)
                .min(self.range.end().get());
            let first = Pfn::new(sub_anchor.get() + 1);
            let count = (sub_end - first.get()) as usize;
            // SAFETY: `first..sub_end` are frames of the span that are neither section nor
            // subsection anchors, so their entries are consecutive in the frame table.
            unsafe { self.entry_unchecked(first).write_bytes(0, count) };
            // Release: as for the section byte.
            self.subsection_byte(pfn).store(ACTIVE, Ordering::Release);
        }
        Some(e)
    }

    /// The entry of `pfn` if it is valid (a frame of the span whose metadata is initialised).
    fn valid_entry(&self, pfn: Pfn) -> Option<*mut Entry> {
        let e = self.entry(pfn)?;
        self.is_valid(pfn).then_some(e)
    }

    /// The tag of `pfn` (zero for a frame outside the span or an entry not yet valid).
    /// Callable without the zone lock.
    pub(crate) fn tag(&self, pfn: Pfn) -> u32 {
        let Some(e) = self.valid_entry(pfn) else {
            return 0;
        };
        // SAFETY: the entry is valid and inside the region; the tag is only accessed atomically.
        unsafe { (*e).tag.load(Ordering::Acquire) }
    }

    /// Sets the tag of `pfn`, preparing its entry first. The caller holds the zone lock.
    pub(crate) fn set_tag(&self, pfn: Pfn, value: u32) {
        if let Some(e) = self.prepare(pfn) {
            // SAFETY: the entry is valid after `prepare`; the tag is only accessed atomically.
            // Release: a per-CPU free that reads this tag sees the block's state complete.
            unsafe { (*e).tag.store(value, Ordering::Release) };
        }
    }

    /// The link of an allocated frame as one absolute frame number, for the owner of the frame
    /// (a per-CPU cache, under its own lock); `None` if `pfn` heads no block of the span.
    pub(crate) fn owner_link(&self, pfn: Pfn) -> Option<u64> {
        let e = self.valid_entry(pfn)?;
        // SAFETY: the entry is valid and inside the region; the links of an allocated frame are
        // used only by its owner, who holds the lock that owns it.
        Some(unsafe { u64::from((*e).next) | u64::from((*e).prev) << 32 })
    }

    /// Sets the owner link of an allocated frame; see [`Span::owner_link`].
    pub(crate) fn set_owner_link(&self, pfn: Pfn, link: u64) {
        if let Some(e) = self.valid_entry(pfn) {
            // SAFETY: as in `owner_link`.
            unsafe {
                (*e).next = link as u32;
                (*e).prev = (link >> 32) as u32;
            }
        }
    }

    /// Stores the tag of an entry that heads a block (so is valid), without preparing it.
    pub(crate) fn store_tag(&self, pfn: Pfn, value: u32) {
        if let Some(e) = self.valid_entry(pfn) {
            // SAFETY: the entry is valid and inside the region; the tag is only accessed
            // atomically. Release: as in `set_tag`.
            unsafe { (*e).tag.store(value, Ordering::Release) };
        }
    }

    /// Atomically replaces the tag `old` by `new`; `Err(found)` if the tag was not `old`.
    /// Used where two CPUs may race on one frame (a double free from two CPUs).
    pub(crate) fn swap_tag(&self, pfn: Pfn, old: u32, new: u32) -> Result<(), u32> {
        let e = self.valid_entry(pfn).ok_or(0u32)?;
        // SAFETY: the entry is valid and inside the region; the tag is only accessed atomically.
        // AcqRel: the winner sees the frame as its last owner left it and publishes the change.
        unsafe {
            (*e).tag
                .compare_exchange(old, new, Ordering::AcqRel, Ordering::Acquire)
                .map(|_| ())
        }
    }

    /// The free-list links `(next, prev)` of a valid entry (`(NIL, NIL)` otherwise). The caller
    /// holds the zone lock.
    pub(crate) fn links(&self, pfn: Pfn) -> (u32, u32) {
        let Some(e) = self.valid_entry(pfn) else {
            return (NIL, NIL);
        };
        // SAFETY: the entry is valid and inside the region; links are only accessed under the
        // zone lock, which the caller holds.
        unsafe { ((*e).next, (*e).prev) }
    }

    /// Writes the whole entry of `pfn` (a block head going onto a free list), preparing it once.
    /// The caller holds the zone lock.
    pub(crate) fn set_entry(&self, pfn: Pfn, tag: u32, next: u32, prev: u32) {
        if let Some(e) = self.prepare(pfn) {
            // SAFETY: the entry is valid after `prepare`; links are only accessed under the zone
            // lock, and the tag only atomically. Release: as in `set_tag`.
            unsafe {
                (*e).next = next;
                (*e).prev = prev;
                (*e).tag.store(tag, Ordering::Release);
            }
        }
    }

    /// Sets the `next` link of `pfn`. The caller holds the zone lock.
    pub(crate) fn set_next(&self, pfn: Pfn, next: u32) {
        if let Some(e) = self.prepare(pfn) {
            // SAFETY: the entry is valid after `prepare`; links are only accessed under the
            // zone lock.
            unsafe { (*e).next = next };
        }
    }

    /// Sets the `prev` link of `pfn`. The caller holds the zone lock.
    pub(crate) fn set_prev(&self, pfn: Pfn, prev: u32) {
        if let Some(e) = self.prepare(pfn) {
            // SAFETY: the entry is valid after `prepare`; links are only accessed under the
            // zone lock.
            unsafe { (*e).prev = prev };
        }
    }
}

/// The spans of one zone: an append-only list that readers search without the zone lock (a
/// per-CPU cache finding the metadata of a frame it holds).
///
/// Invariant: slots `..published` are initialised and never change again; `reserved >=
/// published`, and slot `i` is written only by the push that reserved it.
pub(crate) struct SpanList {
    slots: [UnsafeCell<MaybeUninit<Span>>; MAX_SPANS_PER_ZONE],
    reserved: AtomicUsize,
    published: AtomicUsize,
}

// SAFETY: published slots are immutable, and each unpublished slot is written by exactly one
// pusher (the one that reserved it) before it is published with Release.
unsafe impl Sync for SpanList {}
// SAFETY: the spans are handles (see `Span`'s Send); moving the list moves no shared data.
unsafe impl Send for SpanList {}

impl core::fmt::Debug for SpanList {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl SpanList {
    /// An empty list.
    pub(crate) fn new() -> Self {
        Self {
            slots: core::array::from_fn(|_| UnsafeCell::new(MaybeUninit::uninit())),
            reserved: AtomicUsize::new(0),
            published: AtomicUsize::new(0),
        }
    }

    /// Number of published spans.
    pub(crate) fn len(&self) -> usize {
        // Acquire: pairs with the Release in `push`, so the slots below are initialised.
        self.published.load(Ordering::Acquire)
    }

    /// The published spans.
    pub(crate) fn iter(&self) -> impl Iterator<Item = Span> + '_ {
        (0..self.len()).map(|i| {
            // SAFETY: `i < published`, so the slot is initialised and never written again.
            self.slots[i].with(|p| unsafe { (*p).assume_init() })
        })
    }

    /// The span holding `pfn`.
    pub(crate) fn find(&self, pfn: Pfn) -> Option<Span> {
        self.iter().find(|s| s.range.contains(pfn))
    }

    /// Appends a span; `false` if the list is full.
    pub(crate) fn push(&self, span: Span) -> bool {
        let mut i = self.reserved.load(Ordering::Relaxed);
        loop {
            if i == MAX_SPANS_PER_ZONE {
                return false;
            }
            // Relaxed: reserving a slot publishes nothing; `published` does.
            match self
                .reserved
                .compare_exchange(i, i + 1, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => break,
                Err(now) => i = now,
            }
        }
        // SAFETY: slot `i` was reserved by this call alone and is not yet published, so no
        // reader or other writer touches it.
        self.slots[i].with_mut(|p| unsafe { (*p).write(span) });
        // Earlier reservations publish first, so `published` counts initialised slots.
        while self.published.load(Ordering::Acquire) != i {
            spin_loop();
        }
        // Release: readers that see `i + 1` see the slot written above.
        self.published.store(i + 1, Ordering::Release);
        true
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use std::vec;

    fn span(start: u64, frames: u64) -> (Span, std::vec::Vec<u32>) {
        let range = PhysRange::new(Pfn::new(start), Pfn::new(start + frames)).unwrap();
        // Fill with garbage: the lazy rules must never read it as a tag.
        let mut buf = vec![0xdead_beef_u32; (Span::region_bytes(range) as usize).div_ceil(4)];
        // SAFETY: the buffer is 4-aligned, large enough, and outlives the span in each test.
        let s = unsafe { Span::new(range, NonNull::new(buf.as_mut_ptr().cast()).unwrap()) };
        (s, buf)
    }

    #[test]
    fn garbage_reads_as_zero_until_prepared() {
        let (s, _buf) = span(0, 1 << 19);
        for pfn in [1, 511, 512, 513, 262_143, 262_145, 300_000] {
            assert_eq!(s.tag(Pfn::new(pfn)), 0, "pfn {pfn}");
        }
        assert_eq!(s.tag(Pfn::new(0)), 0);
        assert_eq!(s.tag(Pfn::new(262_144)), 0);
        s.set_tag(Pfn::new(513), 7);
        assert_eq!(s.tag(Pfn::new(513)), 7);
        assert_eq!(s.tag(Pfn::new(514)), 0);
        assert_eq!(s.tag(Pfn::new(1024)), 0);
        s.set_tag(Pfn::new(1024), 9);
        assert_eq!(s.tag(Pfn::new(1024)), 9);
        assert_eq!(s.tag(Pfn::new(1025)), 0, "subsection of 1024 still lazy");
        assert_eq!(
            s.tag(Pfn::new(513)),
            7,
            "earlier writes survive later activations"
        );
    }

    #[test]
    fn unaligned_span_anchors() {
        let (s, _buf) = span(262_144 - 3, 10);
        assert_eq!(s.tag(Pfn::new(262_141)), 0);
        s.set_tag(Pfn::new(262_142), 3);
        s.set_tag(Pfn::new(262_144), 4);
        assert_eq!(s.tag(Pfn::new(262_142)), 3);
        assert_eq!(s.tag(Pfn::new(262_144)), 4);
        assert!(s.holds(Pfn::new(262_144), Order::new(2)));
        assert!(!s.holds(Pfn::new(262_144), Order::new(3)));
    }
}
