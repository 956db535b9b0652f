//! Pageblock metadata, outside the frames: the one module that reaches it through raw pointers.
//!
//! Two levels, as Linux's pageblocks and LLFree's trees suggest:
//! - every *section* (the part of a naturally aligned 1 GiB range inside a span) has a
//!   [`Section`] in a dense table carved from the span's own end at boot or hot-add (a few dozen
//!   bytes per GiB, never freed);
//! - a section that is not one whole block has an array of [`PbHeader`]s, one per *pageblock*
//!   (the part of an aligned 2 MiB range inside the span); a pageblock split below 2 MiB has an
//!   allocation [`Plane`] of its 512 frames and, where it needs one, an extra plane (head marks
//!   of allocated blocks, dirty marks of free frames).
//!
//! Arrays and planes come from a per-zone [`Pool`] of frames the zone gave itself. Everything
//! here is reached through [`ZoneMeta`], which lives inside its zone's lock, so holding a
//! `&mut ZoneMeta` is holding the lock: safe code cannot reach a cell without it. Handles
//! ([`SecRef`], [`PbRef`], [`PlaneRef`]) are plain indices or pool slots checked on every access.
//! The cells are [`UnsafeCell`]s of the `sync` shim, so loom sees every access.
//!
//! Edge sections (those the span covers only partly) and edge pageblocks stay split forever;
//! their frames outside the span are marked allocated and never change. Their arrays come from
//! the span's own end, so splitting them needs nothing from the pool.

use core::mem::{align_of, size_of};
use core::ptr::NonNull;

use crate::addr::{PAGE_SIZE, Pfn, PhysRange};
use crate::bitmap::{FRAMES, Plane};
use crate::platform::{Mapped, PhysMemory};
use crate::sync::UnsafeCell;

/// Most spans (boot ranges plus hot-added ranges) one zone can hold.
pub const MAX_SPANS_PER_ZONE: usize = 8;
/// log2 of the frames in a pageblock (2 MiB).
pub(crate) const PB_SHIFT: u32 = 9;
/// log2 of the frames in a section (1 GiB).
pub(crate) const SECTION_SHIFT: u32 = 18;
/// Pageblocks in a whole section.
pub(crate) const PBS_PER_SECTION: usize = 1 << (SECTION_SHIFT - PB_SHIFT);
/// log2 of the frames one span may hold less than (256 TiB): its pageblock indices and list
/// links are `u32`s, with room left for the `NIL` link.
pub(crate) const SPAN_LIMIT_SHIFT: u32 = 36;
/// "No entry" in a list link.
pub(crate) const NIL: u32 = u32::MAX;

/// Which lifetime a pageblock's allocations have: each split pageblock serves one class, so
/// long-lived allocations do not pin memory that short-lived ones would soon give back.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum Class {
    /// Page tables, the VMM's own structures: the default.
    #[default]
    Long = 0,
    /// I/O buffers and other allocations given back soon.
    Short = 1,
}

impl Class {
    /// Both classes.
    pub const ALL: [Class; 2] = [Class::Long, Class::Short];
    /// Index into per-class arrays.
    pub const fn index(self) -> usize {
        self as usize
    }
}

/// What a whole block is: handed out normally, a huge-page pool page handed out, a pool page
/// free in its pool, or a free block taken off its list while a scrub clears it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Use {
    Normal,
    Huge,
    Pooled,
    Scrub,
}

/// The state of a section.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SectionState {
    /// One free 1 GiB block.
    Free,
    /// One allocated 1 GiB block.
    Allocated(Use),
    /// Described pageblock by pageblock, by the array in `pbs`.
    Split,
}

/// Flags of a free block (a whole section or a pageblock).
pub(crate) mod flag {
    /// Some free frame of the block may hold data of its last owner.
    pub(crate) const DIRTY: u8 = 1 << 0;
    /// The block was reported to the host since it last became free.
    pub(crate) const REPORTED: u8 = 1 << 1;
    /// A split pageblock the metadata pool keeps for itself: every frame reads as allocated,
    /// and every free of one is refused as foreign.
    pub(crate) const POOL: u8 = 1 << 2;
}

/// Free-block lists of orders 9..=17 in one section.
pub(crate) const SECTION_LISTS: usize = (SECTION_SHIFT - PB_SHIFT) as usize;

/// One section. Invariants: it has a pageblock array exactly when the state is `Split`;
/// `next`/`prev` link the section on its zone's order-18 free list while it is `Free`, and in
/// its zone's section bucket for `free_pbs` while it is `Split` with free pageblocks.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Section {
    pub(crate) state: SectionState,
    pub(crate) flags: u8,
    /// With [`flag::DIRTY`] set on a free section, its pageblocks before this one are clean
    /// and the rest may be dirty (Xen's `first_dirty`, per pageblock): what a merge of a dirty
    /// block with clean buddies, or a scrub cut short, leaves.
    pub(crate) first_dirty: u16,
    pub(crate) next: u32,
    pub(crate) prev: u32,
    /// While split: the heads of its free lists of whole-pageblock blocks, orders 9..=17.
    pub(crate) heads: [u32; SECTION_LISTS],
    /// While split: the pageblocks in those blocks.
    pub(crate) free_pbs: u16,
    /// While split: its pageblocks split below 2 MiB (lent ones and edges included).
    pub(crate) split_pbs: u16,
}

/// A section's cell: the section, and the array handle only this module follows.
#[derive(Debug)]
struct SectionCell {
    section: Section,
    pbs: Option<ArrayRef>,
}

/// The state of a pageblock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum PbState {
    /// The head of a free block of `order` (9..=17) made of whole pageblocks.
    Free { order: u8 },
    /// A pageblock inside a larger free block.
    FreeTail,
    /// The head of an allocated block of `order` (9..=17).
    Allocated { order: u8, what: Use },
    /// A pageblock inside a larger allocated block.
    AllocatedTail,
    /// Split below 2 MiB: the planes say which frames are free.
    Split,
    /// Split and lent to a CPU, whose state array is the truth for its frames (see `percpu`);
    /// `next` holds the CPU and `prev` its slot.
    Hot,
}

/// One pageblock. Invariants (checked by the zone's invariant walk):
/// - it has an allocation plane exactly in the states `Split` and `Hot`, and an extra plane
///   only with one;
/// - for a split pageblock, `free` counts the clear bits of the allocation plane;
/// - `multi` counts allocated blocks of order 1..=8, and is 0 without an extra plane;
/// - `next`/`prev` link the pageblock on one list of its zone (a free list of its order, or an
///   occupancy bucket of its class) or are `NIL`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PbHeader {
    pub(crate) state: PbState,
    pub(crate) class: Class,
    pub(crate) flags: u8,
    pub(crate) free: u16,
    pub(crate) multi: u16,
    /// The occupancy bucket the pageblock sits in (see `buddy`).
    pub(crate) bucket: u16,
    pub(crate) next: u32,
    pub(crate) prev: u32,
}

impl PbHeader {
    pub(crate) const NEW: PbHeader = PbHeader {
        state: PbState::FreeTail,
        class: Class::Long,
        flags: 0,
        free: 0,
        multi: 0,
        bucket: 0,
        next: NIL,
        prev: NIL,
    };
}

/// A pageblock's cell: the header other modules see, and the plane handle only this module
/// follows: one plane (allocation only) or a pair (allocation, extra), so a header is one
/// pointer and 32 bytes in all.
#[derive(Debug)]
struct PbCell {
    header: PbHeader,
    planes: Option<PlaneRef>,
}

/// Which plane of a pageblock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Which {
    /// Bit set: the frame is allocated (or outside the span).
    Alloc = 0,
    /// For an allocated frame, set on the head of its block; for a free frame, set if dirty.
    Extra = 1,
}

/// A section of a span: `(span slot, index of the section in the span)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct SecRef {
    pub(crate) span: u8,
    pub(crate) index: u32,
}

/// A pageblock of a span: `(span slot, index of the pageblock in the span)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct PbRef {
    pub(crate) span: u8,
    pub(crate) index: u32,
}

impl PbRef {
    /// The packed form used in list links.
    pub(crate) fn pack(self) -> u32 {
        u32::from(self.span) << 28 | self.index
    }
    /// The inverse of [`PbRef::pack`] (`None` for `NIL`).
    pub(crate) fn unpack(v: u32) -> Option<PbRef> {
        (v != NIL).then_some(PbRef {
            span: (v >> 28) as u8,
            index: v & ((1 << 28) - 1),
        })
    }
}

impl SecRef {
    /// The packed form used in list links.
    pub(crate) fn pack(self) -> u32 {
        u32::from(self.span) << 28 | self.index
    }
    /// The inverse of [`SecRef::pack`] (`None` for `NIL`).
    pub(crate) fn unpack(v: u32) -> Option<SecRef> {
        (v != NIL).then_some(SecRef {
            span: (v >> 28) as u8,
            index: v & ((1 << 28) - 1),
        })
    }
}

/// The planes of a pageblock, from a zone's pool. Never leaves this module: other modules name
/// planes by their pageblock and [`Which`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PlaneRef {
    Single(NonNull<UnsafeCell<Plane>>),
    Pair(NonNull<UnsafeCell<[Plane; 2]>>),
}

/// A pageblock array: from a span's end (edge sections) or a zone's pool (whole sections).
/// Never leaves this module.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct ArrayRef {
    ptr: NonNull<UnsafeCell<PbCell>>,
    len: u16,
    /// `true` if it came from the pool (and goes back to it when the section is whole again).
    pooled: bool,
}

// SAFETY: the handles point into metadata memory that lives as long as the machine and is only
// reached through the `ZoneMeta` of its zone, behind the zone's lock.
unsafe impl Send for PlaneRef {}
// SAFETY: as above.
unsafe impl Sync for PlaneRef {}
// SAFETY: as above.
unsafe impl Send for ArrayRef {}
// SAFETY: as above.
unsafe impl Sync for ArrayRef {}

/// Bytes of one pool slab of pageblock arrays: a whole section's array.
pub(crate) const ARRAY_BYTES: usize = PBS_PER_SECTION * size_of::<UnsafeCell<PbCell>>();

/// The frames of one span and where its section table lives.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SpanMeta {
    pub(crate) range: PhysRange,
    /// The frames of the span's region (its section table, edge arrays and pool seed).
    pub(crate) region: PhysRange,
    sections: NonNull<UnsafeCell<SectionCell>>,
    nsec: u32,
}

// SAFETY: the section table is only reached through the zone's `ZoneMeta`, behind its lock.
unsafe impl Send for SpanMeta {}
// SAFETY: as above.
unsafe impl Sync for SpanMeta {}

fn count(range: PhysRange, shift: u32) -> u64 {
    if range.is_empty() {
        0
    } else {
        ((range.end().get() - 1) >> shift) - (range.start().get() >> shift) + 1
    }
}

/// Pageblocks of section `s` of a span over `range` (fewer than 512 only at the span's edges).
fn pbs_in_section(range: PhysRange, s: u64) -> u64 {
    let base = ((range.start().get() >> SECTION_SHIFT) + s) << SECTION_SHIFT;
    let lo = base.max(range.start().get()) >> PB_SHIFT;
    let hi = (base + (1 << SECTION_SHIFT))
        .min(range.end().get())
        .div_ceil(1 << PB_SHIFT);
    hi - lo
}

/// `true` if section `s` of a span over `range` is a whole aligned 1 GiB inside the span.
pub(crate) fn section_is_whole(range: PhysRange, s: u64) -> bool {
    let base = ((range.start().get() >> SECTION_SHIFT) + s) << SECTION_SHIFT;
    base >= range.start().get() && base + (1 << SECTION_SHIFT) <= range.end().get()
}

/// Edge sections of a span over `range`: the first and the last if they are not whole.
fn edge_sections(range: PhysRange) -> impl Iterator<Item = u64> {
    let n = count(range, SECTION_SHIFT);
    let last = n.saturating_sub(1);
    [0, last]
        .into_iter()
        .enumerate()
        .filter(move |&(i, s)| n > 0 && (i == 0 || s != 0) && !section_is_whole(range, s))
        .map(|(_, s)| s)
}

/// The pool's seed in each span's region: one slab of each kind, so that the pool can grow
/// (growth splits a section and a pageblock to carve its slab from).
const SEED: [Short; 3] = [Short::Arrays, Short::Singles, Short::Pairs];

fn seed_bytes() -> u64 {
    SEED.iter().map(|s| Pool::slab_frames(*s) * PAGE_SIZE).sum()
}

/// Bytes of the region a span over `range` needs: the pool's seed, its section table and the
/// arrays of its edge sections, with alignment slack.
pub(crate) fn region_bytes(range: PhysRange) -> u64 {
    let sections = count(range, SECTION_SHIFT) * size_of::<UnsafeCell<SectionCell>>() as u64;
    let edges: u64 = edge_sections(range)
        .map(|s| pbs_in_section(range, s) * size_of::<UnsafeCell<PbCell>>() as u64)
        .sum();
    seed_bytes() + sections + edges + 2 * align_of::<UnsafeCell<PbCell>>() as u64
}

/// Bytes of region enough for a span over any part of `range` that starts where `range` starts:
/// cutting frames off its end (for its own region, or for the machine's tables) can turn its
/// last section into an edge one, which needs an array.
pub(crate) fn region_bytes_bound(range: PhysRange) -> u64 {
    let sections = count(range, SECTION_SHIFT) * size_of::<UnsafeCell<SectionCell>>() as u64;
    let edge = (PBS_PER_SECTION * size_of::<UnsafeCell<PbCell>>()) as u64;
    seed_bytes() + sections + 2 * edge + 2 * align_of::<UnsafeCell<PbCell>>() as u64
}

/// The seed slabs of a span's region, for its zone's pool.
#[derive(Debug)]
pub(crate) struct Seed(NonNull<u8>);

// SAFETY: a handle to memory only the zone that adds it to its pool uses.
unsafe impl Send for Seed {}

impl SpanMeta {
    /// Maps `meta` through `mem` and lays out a span over `range` in it: every whole section
    /// starts `Allocated` (the caller then frees the span's blocks), every edge section `Split`
    /// with its array from the region and every pageblock allocated. `None` if `meta` is too
    /// small, overlaps `range`, or cannot be mapped (or is mapped misaligned).
    pub(crate) fn map<M: PhysMemory + ?Sized>(
        mem: &M,
        range: PhysRange,
        meta: PhysRange,
    ) -> Option<(SpanMeta, Seed)> {
        if meta.bytes() < region_bytes(range) || meta.overlaps(&range) {
            return None;
        }
        let region = crate::platform::map_checked(mem, meta)?;
        let nsec = u32::try_from(count(range, SECTION_SHIFT)).ok()?;
        // SAFETY: the seed comes first in the region (`region_bytes`), a whole number of pages.
        let sections =
            unsafe { region.add(seed_bytes() as usize) }.cast::<UnsafeCell<SectionCell>>();
        // SAFETY: the section table ends inside the region (`region_bytes`).
        let mut cursor = unsafe { sections.add(nsec as usize) }.cast::<u8>();
        let mut edges: [Option<(u64, ArrayRef)>; 2] = [None, None];
        for (slot, s) in edges.iter_mut().zip(edge_sections(range)) {
            let len = pbs_in_section(range, s) as usize;
            let align = align_of::<UnsafeCell<PbCell>>();
            let offset = cursor.as_ptr().addr().next_multiple_of(align) - cursor.as_ptr().addr();
            // SAFETY: `region_bytes` counted the alignment slack, then `len` cells for this
            // edge section after the table, so `ptr` and the writes below stay inside the
            // region, which is ours (PhysMemory's contract) and seen by nothing else yet.
            let ptr = unsafe { cursor.add(offset) }.cast::<UnsafeCell<PbCell>>();
            for i in 0..len {
                // SAFETY: as above.
                unsafe {
                    ptr.add(i).write(UnsafeCell::new(PbCell {
                        header: PbHeader {
                            state: PbState::AllocatedTail,
                            ..PbHeader::NEW
                        },
                        planes: None,
                    }))
                };
            }
            *slot = Some((
                s,
                ArrayRef {
                    ptr,
                    len: len as u16,
                    pooled: false,
                },
            ));
            // SAFETY: one past the array, still inside (or at the end of) the region.
            cursor = unsafe { ptr.add(len) }.cast::<u8>();
        }
        for s in 0..u64::from(nsec) {
            let pbs = edges
                .iter()
                .flatten()
                .find(|(e, _)| *e == s)
                .map(|(_, a)| *a);
            let section = Section {
                state: if pbs.is_some() {
                    SectionState::Split
                } else {
                    SectionState::Allocated(Use::Normal)
                },
                flags: 0,
                first_dirty: 0,
                next: NIL,
                prev: NIL,
                heads: [NIL; SECTION_LISTS],
                free_pbs: 0,
                split_pbs: 0,
            };
            // SAFETY: `s < nsec`, inside the table at the start of the region (see above).
            unsafe {
                sections
                    .add(s as usize)
                    .write(UnsafeCell::new(SectionCell { section, pbs }))
            };
        }
        Some((
            SpanMeta {
                range,
                region: meta,
                sections,
                nsec,
            },
            Seed(region),
        ))
    }

    /// Number of sections.
    pub(crate) fn sections(&self) -> u32 {
        self.nsec
    }

    /// The first frame of section `s`, clamped to the span.
    pub(crate) fn section_start(&self, s: u32) -> Pfn {
        let base = ((self.range.start().get() >> SECTION_SHIFT) + u64::from(s)) << SECTION_SHIFT;
        Pfn::new(base.max(self.range.start().get()))
    }

    /// Number of pageblocks of the span.
    pub(crate) fn pageblocks(&self) -> u32 {
        count(self.range, PB_SHIFT) as u32
    }

    /// The section of pageblock `pb` and the pageblock's index in that section's array.
    pub(crate) fn locate_pb(&self, pb: u32) -> (u32, usize) {
        let first = self.range.start().get() >> PB_SHIFT;
        let g = first + u64::from(pb);
        let s = (g >> (SECTION_SHIFT - PB_SHIFT)) - (self.range.start().get() >> SECTION_SHIFT);
        let sec_first = (g >> (SECTION_SHIFT - PB_SHIFT)) << (SECTION_SHIFT - PB_SHIFT);
        (s as u32, (g - sec_first.max(first)) as usize)
    }

    /// The index in the span of the first pageblock of section `s`.
    pub(crate) fn first_pb(&self, s: u32) -> u32 {
        let first = self.range.start().get() >> PB_SHIFT;
        let sec = (self.range.start().get() >> SECTION_SHIFT) + u64::from(s);
        ((sec << (SECTION_SHIFT - PB_SHIFT)).max(first) - first) as u32
    }

    /// The pageblocks of section `s`, as indices in the span.
    pub(crate) fn section_pbs(&self, s: u32) -> core::ops::Range<u32> {
        let last = if s + 1 == self.sections() {
            self.pageblocks()
        } else {
            self.first_pb(s + 1)
        };
        self.first_pb(s)..last
    }

    /// The pageblock holding `pfn` (a frame of the span).
    pub(crate) fn pb_of(&self, pfn: Pfn) -> u32 {
        ((pfn.get() >> PB_SHIFT) - (self.range.start().get() >> PB_SHIFT)) as u32
    }

    /// The section holding `pfn` (a frame of the span).
    pub(crate) fn section_of(&self, pfn: Pfn) -> u32 {
        ((pfn.get() >> SECTION_SHIFT) - (self.range.start().get() >> SECTION_SHIFT)) as u32
    }

    /// The first frame of pageblock `pb` (its aligned start, which may lie before the span).
    pub(crate) fn pb_base(&self, pb: u32) -> Pfn {
        Pfn::new(((self.range.start().get() >> PB_SHIFT) + u64::from(pb)) << PB_SHIFT)
    }

    /// The frames of pageblock `pb` inside the span, as offsets `lo..hi` from its base.
    pub(crate) fn pb_frames(&self, pb: u32) -> (usize, usize) {
        let base = self.pb_base(pb).get();
        let lo = self.range.start().get().max(base) - base;
        let hi = self.range.end().get().min(base + FRAMES as u64) - base;
        (lo as usize, hi as usize)
    }

    /// `true` if pageblock `pb` lies wholly inside the span.
    pub(crate) fn pb_is_whole(&self, pb: u32) -> bool {
        self.pb_frames(pb) == (0, FRAMES)
    }
}

/// A zone's pool of metadata memory: pageblock arrays for whole sections, single planes and
/// plane pairs. Its memory is frames the zone gave itself, mapped through the platform, never
/// handed out. Free objects are linked through their first word, which holds a pointer (so the
/// links keep provenance).
#[derive(Debug, Default)]
pub(crate) struct Pool {
    singles: Option<NonNull<UnsafeCell<Plane>>>,
    free_singles: u64,
    pairs: Option<NonNull<UnsafeCell<[Plane; 2]>>>,
    free_pairs: u64,
    arrays: Option<NonNull<UnsafeCell<PbCell>>>,
    free_arrays: u64,
    /// Bytes of memory the pool took from its zone (its seeds live in the spans' regions).
    pub(crate) bytes: u64,
}

// SAFETY: the pool's memory is only reached through the `ZoneMeta` that owns it, behind its
// zone's lock.
unsafe impl Send for Pool {}
// SAFETY: as above.
unsafe impl Sync for Pool {}

/// Objects of each kind the pool keeps back for its own growth. A slab is carved from order-0
/// frames (so its pageblock needs no extra plane): growth may have to claim a free pageblock for
/// it (one single plane), but never splits a section while one is split already, and needs no
/// pair. Arrays are not kept back, so the first split of a span's whole section takes the
/// span's seed array and no frame of that section goes to metadata.
const fn reserve(what: Short) -> u64 {
    match what {
        Short::Singles => 1,
        Short::Pairs | Short::Arrays => 0,
    }
}

/// Who asks the pool: its own growth may use the reserve, everyone else may not.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Need {
    Normal,
    Growth,
}

/// What the pool is short of: the kind of slab it must grow by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Short {
    Singles,
    Pairs,
    Arrays,
}

/// Reads the free-list link in the first word of a free object.
///
/// # Safety
/// `p` must be a free object of a pool, whose first word was written by [`write_link`].
unsafe fn read_link<T>(p: NonNull<T>) -> Option<NonNull<T>> {
    // SAFETY: the caller's guarantee; the word holds an `Option<NonNull<T>>`.
    unsafe { p.cast::<Option<NonNull<T>>>().read() }
}

/// Writes the free-list link into the first word of an object the pool owns again.
///
/// # Safety
/// `p` must be valid for writes of a pointer and used by nothing else.
unsafe fn write_link<T>(p: NonNull<T>, next: Option<NonNull<T>>) {
    // SAFETY: the caller's guarantee; every pool object is pointer aligned and larger.
    unsafe { p.cast::<Option<NonNull<T>>>().write(next) };
}

/// A free list of pool objects of one kind.
struct FreeList<'p, T> {
    head: &'p mut Option<NonNull<T>>,
    free: &'p mut u64,
    reserve: u64,
}

impl<T> FreeList<'_, T> {
    fn pop(self, need: Need) -> Option<NonNull<T>> {
        if need == Need::Normal && *self.free <= self.reserve {
            return None;
        }
        let p = (*self.head)?;
        // SAFETY: `p` heads this pool's free list, so its first word is a link.
        *self.head = unsafe { read_link(p) };
        *self.free -= 1;
        Some(p)
    }

    fn push(self, p: NonNull<T>) {
        // SAFETY: the object belongs to this pool and nobody uses it any more.
        unsafe { write_link(p, *self.head) };
        *self.head = Some(p);
        *self.free += 1;
    }
}

impl Pool {
    /// Frames of a slab of `what`: one page of planes, or the pages of one array.
    pub(crate) fn slab_frames(what: Short) -> u64 {
        match what {
            Short::Singles | Short::Pairs => 1,
            Short::Arrays => (ARRAY_BYTES as u64).div_ceil(PAGE_SIZE),
        }
    }

    /// `true` if the pool is at or below its reserve of `what`.
    pub(crate) fn low(&self, what: Short) -> bool {
        let free = match what {
            Short::Singles => self.free_singles,
            Short::Pairs => self.free_pairs,
            Short::Arrays => self.free_arrays,
        };
        free <= reserve(what)
    }

    fn singles(&mut self) -> FreeList<'_, UnsafeCell<Plane>> {
        FreeList {
            head: &mut self.singles,
            free: &mut self.free_singles,
            reserve: reserve(Short::Singles),
        }
    }

    fn pairs(&mut self) -> FreeList<'_, UnsafeCell<[Plane; 2]>> {
        FreeList {
            head: &mut self.pairs,
            free: &mut self.free_pairs,
            reserve: reserve(Short::Pairs),
        }
    }

    fn arrays(&mut self) -> FreeList<'_, UnsafeCell<PbCell>> {
        FreeList {
            head: &mut self.arrays,
            free: &mut self.free_arrays,
            reserve: reserve(Short::Arrays),
        }
    }

    /// Adds a mapped slab of `what` to the pool; a slab smaller than `what` needs is refused.
    pub(crate) fn add_slab(&mut self, what: Short, slab: Mapped) {
        let bytes = (Self::slab_frames(what) * PAGE_SIZE) as usize;
        if slab.range.bytes() < bytes as u64 {
            return;
        }
        self.bytes += slab.range.bytes();
        // SAFETY: a `Mapped` holds PhysMemory's promises for its range (page aligned, valid for
        // its bytes for the machine's lifetime, ours alone), which covers the slab.
        unsafe { self.add_raw(what, slab.ptr) };
    }

    /// [`Pool::add_slab`] for memory the caller vouches for.
    ///
    /// # Safety
    /// `ptr` must be aligned to [`PAGE_SIZE`] and valid for reads and writes of
    /// `slab_frames(what) * PAGE_SIZE` bytes for as long as the machine lives, and used by
    /// nothing else.
    unsafe fn add_raw(&mut self, what: Short, ptr: NonNull<u8>) {
        let bytes = (Self::slab_frames(what) * PAGE_SIZE) as usize;
        match what {
            Short::Singles => {
                let planes = ptr.cast::<UnsafeCell<Plane>>();
                for i in 0..bytes / size_of::<UnsafeCell<Plane>>() {
                    // SAFETY: the caller's guarantee: the slab is ours, and a page holds whole
                    // planes at their alignment.
                    self.singles().push(unsafe { planes.add(i) });
                }
            }
            Short::Pairs => {
                let pairs = ptr.cast::<UnsafeCell<[Plane; 2]>>();
                for i in 0..bytes / size_of::<UnsafeCell<[Plane; 2]>>() {
                    // SAFETY: as above, for pairs.
                    self.pairs().push(unsafe { pairs.add(i) });
                }
            }
            Short::Arrays => self.arrays().push(ptr.cast::<UnsafeCell<PbCell>>()),
        }
    }

    fn take_array(&mut self, need: Need) -> Option<ArrayRef> {
        let a = self.arrays().pop(need)?;
        for i in 0..PBS_PER_SECTION {
            // SAFETY: the array is ours now, holds `PBS_PER_SECTION` cells (`ARRAY_BYTES`) and
            // is seen by nothing else.
            unsafe {
                a.add(i).write(UnsafeCell::new(PbCell {
                    header: PbHeader::NEW,
                    planes: None,
                }))
            };
        }
        Some(ArrayRef {
            ptr: a,
            len: PBS_PER_SECTION as u16,
            pooled: true,
        })
    }

    /// Gives an array back (an edge array is not the pool's and stays with its span).
    fn put_array(&mut self, a: ArrayRef) {
        if a.pooled {
            self.arrays().push(a.ptr);
        }
    }

    /// Planes holding `alloc` (and `extra`, for a pair).
    fn take_planes(&mut self, alloc: Plane, extra: Option<Plane>, need: Need) -> Option<PlaneRef> {
        Some(match extra {
            None => {
                let p = self.singles().pop(need)?;
                // SAFETY: the plane is ours now and seen by nothing else.
                unsafe { p.write(UnsafeCell::new(alloc)) };
                PlaneRef::Single(p)
            }
            Some(x) => {
                let p = self.pairs().pop(need)?;
                // SAFETY: as above.
                unsafe { p.write(UnsafeCell::new([alloc, x])) };
                PlaneRef::Pair(p)
            }
        })
    }

    fn put_planes(&mut self, p: PlaneRef) {
        match p {
            PlaneRef::Single(p) => self.singles().push(p),
            PlaneRef::Pair(p) => self.pairs().push(p),
        }
    }
}

/// Reads plane `which` behind a handle (`None` for the extra plane of a single).
///
/// # Safety
/// `p` must come from a pool whose memory is valid, be held by a live header, and no write to
/// it may run meanwhile.
unsafe fn read_plane(p: PlaneRef, which: Which) -> Option<Plane> {
    // SAFETY: the caller's guarantee.
    unsafe {
        match (p, which) {
            (PlaneRef::Single(q), Which::Alloc) => Some(q.as_ref().with(|c| *c)),
            (PlaneRef::Single(_), Which::Extra) => None,
            (PlaneRef::Pair(q), Which::Alloc) => Some(q.as_ref().with(|c| (*c)[0])),
            (PlaneRef::Pair(q), Which::Extra) => Some(q.as_ref().with(|c| (*c)[1])),
        }
    }
}

/// All the metadata of one zone: its spans' section tables and its pool. Lives inside the zone's
/// lock; every access goes through it, and handles resolve against it, so a handle of one zone
/// can never reach another zone's cells.
#[derive(Debug)]
pub(crate) struct ZoneMeta {
    spans: [Option<SpanMeta>; MAX_SPANS_PER_ZONE],
    pub(crate) pool: Pool,
}

impl Default for ZoneMeta {
    fn default() -> Self {
        Self {
            spans: [None; MAX_SPANS_PER_ZONE],
            pool: Pool::default(),
        }
    }
}

impl ZoneMeta {
    /// Bytes of metadata memory: the spans' regions and what the pool took from the zone.
    pub(crate) fn bytes(&self) -> u64 {
        self.spans().map(|(_, s)| s.region.bytes()).sum::<u64>() + self.pool.bytes
    }

    /// Adds a span in the next free slot, and its seed to the pool; returns the slot.
    pub(crate) fn add(&mut self, span: SpanMeta, seed: Seed) -> Option<u8> {
        let slot = self.spans.iter().position(Option::is_none)?;
        self.spans[slot] = Some(span);
        let mut at = seed.0;
        for what in SEED {
            // SAFETY: `SpanMeta::map` laid the seed slabs out at the page-aligned start of the
            // span's region, which lives as long as the machine and is used by nothing else.
            unsafe { self.pool.add_raw(what, at) };
            // SAFETY: the next slab follows inside the region.
            at = unsafe { at.add((Pool::slab_frames(what) * PAGE_SIZE) as usize) };
        }
        Some(slot as u8)
    }

    /// The span in `slot`.
    pub(crate) fn span(&self, slot: u8) -> Option<&SpanMeta> {
        self.spans.get(usize::from(slot))?.as_ref()
    }

    /// The spans, with their slots.
    pub(crate) fn spans(&self) -> impl Iterator<Item = (u8, &SpanMeta)> {
        self.spans
            .iter()
            .enumerate()
            .filter_map(|(i, s)| Some((i as u8, s.as_ref()?)))
    }

    /// The slot of the span holding `pfn`.
    pub(crate) fn span_of(&self, pfn: Pfn) -> Option<u8> {
        self.spans()
            .find(|(_, s)| s.range.contains(pfn))
            .map(|(i, _)| i)
    }

    fn section_cell(&self, s: SecRef) -> Option<&UnsafeCell<SectionCell>> {
        let span = self.span(s.span)?;
        if s.index >= span.nsec {
            return None;
        }
        // SAFETY: `s.index < nsec`, and the span's table holds `nsec` initialised cells for the
        // machine's lifetime (`SpanMeta::map`).
        Some(unsafe { span.sections.add(s.index as usize).as_ref() })
    }

    fn section_cell_copy(&self, s: SecRef) -> Option<(Section, Option<ArrayRef>)> {
        // SAFETY: `&self` borrows the zone's locked metadata, so no write to the cell runs
        // meanwhile (writes take `&mut self`).
        self.section_cell(s)
            .map(|c| c.with(|p| unsafe { ((*p).section, (*p).pbs) }))
    }

    /// A copy of section `s`.
    pub(crate) fn section(&self, s: SecRef) -> Option<Section> {
        self.section_cell_copy(s).map(|(sec, _)| sec)
    }

    /// Changes section `s` through `f`.
    pub(crate) fn update_section<R>(
        &mut self,
        s: SecRef,
        f: impl FnOnce(&mut Section) -> R,
    ) -> Option<R> {
        // SAFETY: `&mut self` is exclusive access to the zone's metadata, so this is the only
        // access to the cell while `f` runs.
        self.section_cell(s)
            .map(|c| c.with_mut(|p| f(unsafe { &mut (*p).section })))
    }

    /// Gives section `s` a pageblock array (from the pool) with every header `template`, and
    /// sets it `Split`. `Err(Short::Arrays)` if the pool has none to spare for `need`; nothing
    /// changes then. A section that has one keeps it. With [`flag::DIRTY`] in the template,
    /// the pageblocks before the section's `first_dirty` get it cleared: the clean part of a
    /// free section stays known clean.
    pub(crate) fn split_section(
        &mut self,
        s: SecRef,
        template: PbHeader,
        need: Need,
    ) -> Result<(), Short> {
        let (sec, pbs) = self.section_cell_copy(s).ok_or(Short::Arrays)?;
        if pbs.is_none() {
            let array = self.pool.take_array(need).ok_or(Short::Arrays)?;
            let clean_below = if template.flags & flag::DIRTY != 0 {
                usize::from(sec.first_dirty)
            } else {
                0
            };
            for i in 0..usize::from(array.len) {
                let header = if i < clean_below {
                    PbHeader {
                        flags: template.flags & !flag::DIRTY,
                        ..template
                    }
                } else {
                    template
                };
                // SAFETY: the array is ours (just taken) and holds `len` cells; the `&mut self`
                // borrow excludes every other access.
                unsafe { array.ptr.add(i).as_ref() }.with_mut(|p| {
                    // SAFETY: as above.
                    unsafe { (*p).header = header };
                });
            }
            self.set_section_array(s, Some(array));
        }
        self.update_section(s, |sec| sec.state = SectionState::Split);
        Ok(())
    }

    /// Gives section `s` (not split) the array in `slab`, memory of its own first frames, with
    /// every header `template`, and sets it `Split`: the last resort when no split section has
    /// room for a new array. The array stays with the section for good. `false` (changing
    /// nothing) if the section has an array already or the slab is too small.
    pub(crate) fn host_section(&mut self, s: SecRef, slab: Mapped, template: PbHeader) -> bool {
        let Some((_, None)) = self.section_cell_copy(s) else {
            return false;
        };
        if slab.range.bytes() < ARRAY_BYTES as u64 {
            return false;
        }
        self.pool.bytes += slab.range.bytes();
        let ptr = slab.ptr.cast::<UnsafeCell<PbCell>>();
        for i in 0..PBS_PER_SECTION {
            // SAFETY: a `Mapped` holds PhysMemory's promises for its range, which holds a whole
            // array (checked above); nothing else sees it.
            unsafe {
                ptr.add(i).write(UnsafeCell::new(PbCell {
                    header: template,
                    planes: None,
                }))
            };
        }
        self.set_section_array(
            s,
            Some(ArrayRef {
                ptr,
                len: PBS_PER_SECTION as u16,
                pooled: false,
            }),
        );
        self.update_section(s, |sec| sec.state = SectionState::Split);
        true
    }

    /// Takes section `s`'s pool array back (its pageblocks' planes must be gone already) and
    /// gives the section `state`. Edge sections keep their arrays and stay split.
    pub(crate) fn join_section(&mut self, s: SecRef, state: SectionState) {
        if let Some((_, Some(array))) = self.section_cell_copy(s)
            && array.pooled
        {
            self.set_section_array(s, None);
            self.pool.put_array(array);
            self.update_section(s, |sec| sec.state = state);
        }
    }

    fn set_section_array(&mut self, s: SecRef, pbs: Option<ArrayRef>) {
        if let Some(c) = self.section_cell(s) {
            // SAFETY: `&mut self` is exclusive access to the zone's metadata.
            c.with_mut(|p| unsafe { (*p).pbs = pbs });
        }
    }

    fn pb_cell(&self, r: PbRef) -> Option<&UnsafeCell<PbCell>> {
        let span = self.span(r.span)?;
        if r.index >= span.pageblocks() {
            return None;
        }
        let (s, i) = span.locate_pb(r.index);
        let (_, array) = self.section_cell_copy(SecRef {
            span: r.span,
            index: s,
        })?;
        let array = array?;
        if i >= usize::from(array.len) {
            return None;
        }
        // SAFETY: `i < len`, and a section's array holds `len` initialised cells for as long as
        // the section refers to it.
        Some(unsafe { array.ptr.add(i).as_ref() })
    }

    /// A copy of the header of pageblock `r` (`None` if its section is not split).
    pub(crate) fn pb(&self, r: PbRef) -> Option<PbHeader> {
        // SAFETY: as in `section_cell_copy`.
        self.pb_cell(r).map(|c| c.with(|p| unsafe { (*p).header }))
    }

    /// Changes the header of pageblock `r` through `f`.
    pub(crate) fn update_pb<R>(
        &mut self,
        r: PbRef,
        f: impl FnOnce(&mut PbHeader) -> R,
    ) -> Option<R> {
        // SAFETY: as in `update_section`.
        self.pb_cell(r)
            .map(|c| c.with_mut(|p| f(unsafe { &mut (*p).header })))
    }

    fn plane_ref(&self, r: PbRef) -> Option<PlaneRef> {
        // SAFETY: as in `section_cell_copy`.
        self.pb_cell(r)
            .and_then(|c| c.with(|p| unsafe { (*p).planes }))
    }

    fn set_plane_ref(&mut self, r: PbRef, planes: Option<PlaneRef>) {
        if let Some(c) = self.pb_cell(r) {
            // SAFETY: `&mut self` is exclusive access to the zone's metadata.
            c.with_mut(|p| unsafe { (*p).planes = planes });
        }
    }

    /// `true` if pageblock `r` has the plane `which`.
    pub(crate) fn has_plane(&self, r: PbRef, which: Which) -> bool {
        matches!(
            (self.plane_ref(r), which),
            (Some(_), Which::Alloc) | (Some(PlaneRef::Pair(_)), Which::Extra)
        )
    }

    /// A copy of plane `which` of pageblock `r`.
    pub(crate) fn plane(&self, r: PbRef, which: Which) -> Option<Plane> {
        let p = self.plane_ref(r)?;
        // SAFETY: the handle is held by this zone's header and came from this zone's pool;
        // `&self` excludes writers (they take `&mut self`).
        unsafe { read_plane(p, which) }
    }

    /// Runs `f` on the allocation plane of pageblock `r` and its extra plane, if it has one,
    /// without copying them; `None` if it has no allocation plane.
    pub(crate) fn with_planes<R>(
        &self,
        r: PbRef,
        f: impl FnOnce(&Plane, Option<&Plane>) -> R,
    ) -> Option<R> {
        let p = self.plane_ref(r)?;
        // SAFETY: as in `plane`: `&self` excludes writers for as long as `f` runs.
        Some(unsafe {
            match p {
                PlaneRef::Single(q) => q.as_ref().with(|c| f(&*c, None)),
                PlaneRef::Pair(q) => q.as_ref().with(|c| f(&(*c)[0], Some(&(*c)[1]))),
            }
        })
    }

    /// Changes the planes of pageblock `r` through `f(alloc, extra)`; `None` if it has no
    /// allocation plane.
    pub(crate) fn update_planes<R>(
        &mut self,
        r: PbRef,
        f: impl FnOnce(&mut Plane, Option<&mut Plane>) -> R,
    ) -> Option<R> {
        let p = self.plane_ref(r)?;
        // SAFETY: as in `plane`; `&mut self` makes this the only access.
        Some(unsafe {
            match p {
                PlaneRef::Single(q) => q.as_ref().with_mut(|c| f(&mut *c, None)),
                PlaneRef::Pair(q) => q.as_ref().with_mut(|c| {
                    let [a, x] = &mut *c;
                    f(a, Some(x))
                }),
            }
        })
    }

    /// Gives pageblock `r` an allocation plane holding `alloc` (and an extra plane holding
    /// `extra`, if given), replacing the planes it had. `Err` names what the pool cannot spare
    /// for `need`; nothing changes then.
    pub(crate) fn set_planes(
        &mut self,
        r: PbRef,
        alloc: Plane,
        extra: Option<Plane>,
        need: Need,
    ) -> Result<(), Short> {
        self.pb_cell(r).ok_or(Short::Singles)?;
        let short = if extra.is_some() {
            Short::Pairs
        } else {
            Short::Singles
        };
        let new = self.pool.take_planes(alloc, extra, need).ok_or(short)?;
        if let Some(old) = self.plane_ref(r) {
            self.pool.put_planes(old);
        }
        self.set_plane_ref(r, Some(new));
        Ok(())
    }

    /// Takes pageblock `r`'s planes back into the pool.
    pub(crate) fn drop_planes(&mut self, r: PbRef) {
        if let Some(old) = self.plane_ref(r) {
            self.set_plane_ref(r, None);
            self.pool.put_planes(old);
        }
    }
}
