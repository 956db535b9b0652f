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
//! Arrays and planes come from a per-zone [`Pool`] of frames the zone gave itself, which gives
//! them back as memory merges whole again. Everything
//! here is reached through [`ZoneMeta`], which lives inside its zone's lock, so holding a
//! `&mut ZoneMeta` is holding the lock: safe code cannot reach a cell without it. Handles
//! ([`SecRef`], [`PbRef`], [`PlaneRef`]) are plain indices or pool slots checked on every access.
//! The cells are [`UnsafeCell`]s of the `sync` shim, so loom sees every access.
//!
//! Edge sections (those the span covers only partly) and edge pageblocks stay split forever;
//! their frames outside the span are marked allocated and never change. Their arrays come from
//! the span's own end, so splitting them needs nothing from the pool.

use core::mem::{MaybeUninit, align_of, size_of};
use core::num::NonZero;
use core::ptr::NonNull;

use crate::addr::{PAGE_SIZE, Pfn, PhysRange};
use crate::bitmap::{FRAMES, Occupancy, Plane};
use crate::platform::{Mapped, PhysMemory};
use crate::sync::UnsafeCell;

/// Most spans (boot ranges plus hot-added ranges) one zone can hold: as many as the 4-bit span
/// slot of the metadata's packed list links names.
pub const MAX_SPANS_PER_ZONE: usize = 16;
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
    /// Described pageblock by pageblock, by its pageblock array.
    Split,
}

/// Flags of a free block (a whole section or a pageblock).
pub(crate) mod flag {
    /// Some free frame of the block may hold data of its last owner.
    pub(crate) const DIRTY: u8 = 1 << 0;
    /// The block was reported to the host since it last became free.
    pub(crate) const REPORTED: u8 = 1 << 1;
    /// A bulk free under way turned this clean split pageblock without an extra plane dirty
    /// (giving it an extra plane if the pool could spare one): an undo of the bulk makes it
    /// clean again, without an extra plane. Cleared when the bulk ends.
    pub(crate) const BULK: u8 = 1 << 2;
}

/// Free-block lists of orders 9..=17 in one section.
pub(crate) const SECTION_LISTS: usize = (SECTION_SHIFT - PB_SHIFT) as usize;

/// One section. Invariants: it has a pageblock array exactly when the state is `Split`;
/// `next`/`prev` link the section on its zone's order-18 free list while it is `Free`, and in
/// its zone's section bucket for `free_pbs` while it is `Split` with free pageblocks. The heads
/// of a split section's free lists lie apart, in its [`Cold`] part ([`Heads`]).
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
    /// While split: the pageblocks in those blocks.
    pub(crate) free_pbs: u16,
    /// While split: its pageblocks split below 2 MiB (lent ones and edges included).
    pub(crate) split_pbs: u16,
}

/// The heads of a split section's free lists of whole-pageblock blocks, orders 9..=17.
pub(crate) type Heads = [u32; SECTION_LISTS];

/// A section's cell, written for every section of a span when it is laid out: the section, and
/// where its pageblock array lies (only this module follows it). `array` is `Some` exactly when
/// the section has an array, which then holds a cell for each of the section's pageblocks
/// ([`SpanMeta::section_pbs`]; whole sections' arrays hold [`PBS_PER_SECTION`], so the array's
/// length need not be kept). The section's [`Cold`] part is written when it gets one, and may
/// be read only while it has one (before, its slot may hold anything; after, what it last held).
#[derive(Debug)]
struct SectionCell {
    section: Section,
    array: Option<Array>,
}

// 24 bytes a section: the table is what a boot writes per GiB.
const _: () = assert!(size_of::<SectionCell>() == 24);

/// What only a section with an array needs, in a table of its own that is written when the
/// section gets an array: the pages of the table that cover sections never split are never
/// written, so a boot writes 24 bytes per GiB of section table rather than 88 (a 12 TiB span
/// 288 KiB rather than 1.03 MiB).
#[derive(Debug)]
struct Cold {
    origin: Origin,
    heads: Heads,
}

/// A [`Cold`] part's slot: initialised while its section's cell has an array.
type ColdSlot = MaybeUninit<UnsafeCell<Cold>>;

/// Where a pageblock array lies.
type Array = NonNull<UnsafeCell<PbCell>>;

/// Writes a fresh cold part into `slot` for a section that gets an array from `origin`: its
/// free lists start empty, whatever the slot held.
///
/// # Safety
/// `slot` must be a slot of a span's cold table whose section has no array (so nothing refers
/// to the slot), with no other access to it meanwhile.
unsafe fn open_cold(slot: NonNull<ColdSlot>, origin: Origin) {
    // SAFETY: the caller's guarantee.
    unsafe {
        slot.as_ptr().write(MaybeUninit::new(UnsafeCell::new(Cold {
            origin,
            heads: [NIL; SECTION_LISTS],
        })))
    };
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
    /// Kept by the zone's metadata pool, which carves its slabs from it: its allocation plane
    /// marks the frames slabs use and `free` counts the others; a free of any of its frames is
    /// refused as foreign. Back to the buddy when no slab uses it.
    Pool,
}

/// One pageblock. Invariants (checked by the zone's invariant walk):
/// - it has an allocation plane exactly in the states `Split`, `Hot` and `Pool`, and an extra
///   plane only in `Split` and `Hot`;
/// - for a split pageblock, `free` counts the clear bits of the allocation plane;
/// - `multi` counts allocated blocks of order 1..=8, and is 0 without an extra plane;
/// - `next`/`prev` link the pageblock on one list of its zone (a free list of its order, an
///   occupancy bucket of its class, or the pool pageblocks with room for a slab) or are `NIL`.
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

/// Fullness bands of split sections, by which a zone's occupancy buckets rank pageblocks
/// first (`buddy`): band 0 for most, band 1 for sections that are emptying.
pub(crate) const BANDS: usize = 2;

/// Where one class's occupancy-bucket heads lie: memory carved for them, its contents
/// anything until written.
type HeadStore = [MaybeUninit<u32>; BANDS * FRAMES];

/// Room for one class's bucket heads, carved at boot ([`crate::platform::BootCarve::head_room`])
/// and never initialised: see [`PbBuckets`].
#[derive(Debug)]
pub(crate) struct HeadRoom(NonNull<HeadStore>);

// SAFETY: a handle to memory only the buckets it is given to use, behind their zone's lock.
unsafe impl Send for HeadRoom {}

impl HeadRoom {
    /// The room at `at`.
    ///
    /// # Safety
    /// `at` must be aligned for a `u32` and valid for reads and writes of
    /// `size_of::<HeadStore>()` bytes for as long as the buckets it is given to live, and used
    /// by nothing else.
    pub(crate) unsafe fn new(at: NonNull<u8>) -> Self {
        HeadRoom(at.cast())
    }

    /// Bytes of one room.
    pub(crate) const BYTES: usize = size_of::<HeadStore>();
}

/// Occupancy buckets of one class's split pageblocks, ranked by (band of their section, free
/// frames). The key `band * FRAMES + free` of bucket `(band, free)` is what a pageblock's
/// `bucket` records (0: in none). A pageblock sits under the band and the free count it had
/// when it was put there: neither frees nor a section's change of band move it (it is moved
/// when an allocation finds it in a bucket that is out of date), allocations do.
///
/// A zone has `BANDS * FRAMES` buckets per class (16 KiB of heads per node), most of them
/// empty. A bucket's head is written when the bucket gets its first pageblock and read only
/// while the bucket's bit says it has one, so the heads need no initial value: boot writes
/// only those of the buckets its edge pageblocks go to (they were most of a `Node`,
/// which is built and then moved into place).
#[derive(Debug)]
pub(crate) struct PbBuckets {
    /// `nonempty[band]` has bit `free` set while that bucket is not empty: exactly the buckets
    /// whose head in `heads` has been written since.
    nonempty: [Occupancy; BANDS],
    heads: HeadRoom,
}

impl PbBuckets {
    /// Empty buckets whose heads lie in `heads`.
    pub(crate) fn new(heads: HeadRoom) -> Self {
        PbBuckets {
            nonempty: [Occupancy::EMPTY; BANDS],
            heads,
        }
    }

    /// Which buckets of `band` are not empty.
    pub(crate) fn nonempty(&self, band: usize) -> &Occupancy {
        &self.nonempty[band]
    }

    /// `true` if the bucket of `key` is not empty.
    #[inline(always)]
    pub(crate) fn occupied(&self, key: usize) -> bool {
        self.nonempty[key / FRAMES].get(key % FRAMES)
    }

    /// The first pageblock (packed) of the bucket of `key`, [`NIL`] if it is empty.
    #[inline(always)]
    pub(crate) fn head(&self, key: usize) -> u32 {
        if self.occupied(key) {
            // SAFETY: the bucket's bit is set, so `set_head` wrote its head (the bit's index
            // bounds `key` to the store), and `HeadRoom::new`'s caller keeps the store valid.
            unsafe { self.heads.0.as_ref()[key].assume_init() }
        } else {
            NIL
        }
    }

    /// The first bucket of `band` at or after `free` that is not empty, and its first
    /// pageblock (packed).
    #[inline(always)]
    pub(crate) fn first_from(&self, band: usize, free: usize) -> Option<(usize, u32)> {
        let b = self.nonempty[band].next_set(free)?;
        debug_assert!(self.nonempty[band].get(b));
        // SAFETY: bucket `b` of `band` has its bit set, so `set_head` wrote its head (and
        // `next_set` returns only the index of a bit, inside the store).
        Some((b, unsafe {
            self.heads.0.as_ref()[band * FRAMES + b].assume_init()
        }))
    }

    /// Makes `head` (packed; [`NIL`] for none) the first pageblock of the bucket of `key`.
    #[inline(always)]
    pub(crate) fn set_head(&mut self, key: usize, head: u32) {
        let (band, b) = (key / FRAMES, key % FRAMES);
        if head == NIL {
            self.nonempty[band].put(b, false);
        } else {
            // SAFETY: `HeadRoom::new`'s caller keeps the store valid and ours alone; `&mut
            // self` excludes every other access. The index is checked.
            unsafe { self.heads.0.as_mut()[key] = MaybeUninit::new(head) };
            self.nonempty[band].put(b, true);
        }
    }
}

/// A pageblock's cell: the header other modules see, and the plane handle only this module
/// follows: one plane (allocation only) or a pair (allocation, extra), one pointer wide, so a
/// cell is 32 bytes: two to a cache line, never across one (arrays are laid out at
/// [`CELL_ALIGN`]: pool arrays on pages, edge arrays in a span's region explicitly).
#[derive(Debug)]
struct PbCell {
    header: PbHeader,
    planes: Option<PlaneRef>,
}

const _: () = assert!(size_of::<PbCell>() == 32);

/// Where a pageblock array starts: a multiple of a cell's size, so that no cell crosses a
/// cache line (or of the cell's alignment if larger, as under loom, whose cells are bigger).
const CELL_ALIGN: usize = {
    let a = align_of::<UnsafeCell<PbCell>>();
    if a > size_of::<PbCell>() {
        a
    } else {
        size_of::<PbCell>()
    }
};

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

/// Bits of a packed list link below its span slot: the index of a pageblock or section in its
/// span. A span holds fewer than 2^[`SPAN_LIMIT_SHIFT`] frames, so it touches at most
/// 2^27 + 1 pageblocks (two partly): no index reaches `2^28 - 1`, and no link of span slot 15
/// is `NIL`.
const LINK_INDEX_BITS: u32 = 28;
const _: () = assert!(MAX_SPANS_PER_ZONE <= 1 << (u32::BITS - LINK_INDEX_BITS));
const _: () = assert!((1u64 << (SPAN_LIMIT_SHIFT - PB_SHIFT)) + 1 < (1 << LINK_INDEX_BITS) - 1);

impl PbRef {
    /// The packed form used in list links: the span slot above [`LINK_INDEX_BITS`].
    pub(crate) fn pack(self) -> u32 {
        u32::from(self.span) << LINK_INDEX_BITS | self.index
    }
    /// The inverse of [`PbRef::pack`] (`None` for `NIL`).
    pub(crate) fn unpack(v: u32) -> Option<PbRef> {
        (v != NIL).then_some(PbRef {
            span: (v >> LINK_INDEX_BITS) as u8,
            index: v & ((1 << LINK_INDEX_BITS) - 1),
        })
    }
}

impl SecRef {
    /// The packed form used in list links.
    pub(crate) fn pack(self) -> u32 {
        u32::from(self.span) << LINK_INDEX_BITS | self.index
    }
    /// The inverse of [`SecRef::pack`] (`None` for `NIL`).
    pub(crate) fn unpack(v: u32) -> Option<SecRef> {
        (v != NIL).then_some(SecRef {
            span: (v >> LINK_INDEX_BITS) as u8,
            index: v & ((1 << LINK_INDEX_BITS) - 1),
        })
    }
}

/// The planes of a pageblock, from a zone's pool: the address of their slot, with bit 0 set for
/// a pair (slots are aligned as planes are, so the bit is free). Never leaves this module:
/// other modules name planes by their pageblock and [`Which`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct PlaneRef(NonNull<u8>);

/// What a [`PlaneRef`] holds, unpacked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Planes {
    Single(NonNull<UnsafeCell<Plane>>),
    Pair(NonNull<UnsafeCell<[Plane; 2]>>),
}

const _: () = assert!(align_of::<UnsafeCell<Plane>>() >= 2);

/// A pageblock array: from a span's end (edge sections) or a zone's pool (whole sections).
/// Never leaves this module.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct ArrayRef {
    ptr: NonNull<UnsafeCell<PbCell>>,
    /// Cells the array holds initialised: its section's pageblocks (from
    /// [`ZoneMeta::section_cell_copy`]), or all [`PBS_PER_SECTION`] of a fresh array.
    len: u16,
    origin: Origin,
}

/// Where a pageblock array came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Origin {
    /// The section's own memory (an edge array in its span's region, or a hosted array in the
    /// section's first frames): it stays with the section for good.
    Section,
    /// A seed in a span's region: it goes back to the pool when the section is whole again.
    Seed,
    /// A slab of these frames of the zone: back to the pool as well, or retired.
    Slab(PhysRange),
    /// The first frames (mapped as these) of the whole section it describes, which holds it
    /// for good as [`Origin::Section`] does; they leave with the section's span.
    Hosted(PhysRange),
}

impl PlaneRef {
    /// A handle on a single plane in slot `p`.
    fn single(p: NonNull<UnsafeCell<Plane>>) -> PlaneRef {
        debug_assert!(p.is_aligned());
        PlaneRef(p.cast())
    }

    /// A handle on a pair of planes in slot `p`.
    fn pair(p: NonNull<UnsafeCell<[Plane; 2]>>) -> PlaneRef {
        debug_assert!(p.is_aligned());
        PlaneRef(p.cast::<u8>().map_addr(|a| a | 1))
    }

    /// The planes this handle names.
    #[inline]
    fn get(self) -> Planes {
        // The slot's address is aligned and not null, so clearing bit 0 keeps it non-zero.
        let slot = self.0.map_addr(|a| NonZero::new(a.get() & !1).unwrap_or(a));
        if self.0.addr().get() & 1 == 0 {
            Planes::Single(slot.cast())
        } else {
            Planes::Pair(slot.cast())
        }
    }

    /// The slab kind and the slot the planes occupy.
    fn slot(self) -> (Short, NonNull<u8>) {
        match self.get() {
            Planes::Single(p) => (Short::Singles, p.cast()),
            Planes::Pair(p) => (Short::Pairs, p.cast()),
        }
    }
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
    /// The frames of the span's region (its pool seed, section table, cold table and edge
    /// arrays).
    pub(crate) region: PhysRange,
    sections: NonNull<UnsafeCell<SectionCell>>,
    /// The [`Cold`] parts, one slot per section after the section table.
    cold: NonNull<ColdSlot>,
    nsec: u32,
    /// Pageblocks of the span (every header lookup checks against it).
    npb: u32,
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

/// `true` if mask `mask` (bit `i`: the span in slot `i`) holds the span in `slot`.
pub(crate) fn in_mask(mask: u32, slot: u8) -> bool {
    mask & 1 << slot != 0
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

/// Bytes of the region a span over `range` needs: the pool's seed, its section table and cold
/// table, and the arrays of its edge sections, with alignment slack.
pub(crate) fn region_bytes(range: PhysRange) -> u64 {
    let edges: u64 = edge_sections(range)
        .map(|s| pbs_in_section(range, s) * size_of::<UnsafeCell<PbCell>>() as u64)
        .sum();
    seed_bytes() + table_bytes(range) + edges + 2 * CELL_ALIGN as u64
}

/// Bytes of region enough for a span over any part of `range` that starts where `range` starts:
/// cutting frames off its end (for its own region, or for the machine's tables) can turn its
/// last section into an edge one, which needs an array.
pub(crate) fn region_bytes_bound(range: PhysRange) -> u64 {
    let edge = (PBS_PER_SECTION * size_of::<UnsafeCell<PbCell>>()) as u64;
    seed_bytes() + table_bytes(range) + 2 * edge + 2 * CELL_ALIGN as u64
}

/// Bytes of a span's section table over `range` and the table of its cold parts after it, with
/// the alignment slack of the second.
fn table_bytes(range: PhysRange) -> u64 {
    let per = size_of::<UnsafeCell<SectionCell>>() + size_of::<ColdSlot>();
    count(range, SECTION_SHIFT) * per as u64 + align_of::<ColdSlot>() as u64
}

/// The seed slabs of a span's region, for its zone's pool.
#[derive(Debug)]
pub(crate) struct Seed(NonNull<u8>);

// SAFETY: a handle to memory only the zone that adds it to its pool uses.
unsafe impl Send for Seed {}

impl Seed {
    /// Where the span's region is mapped (the seed comes first in it): for giving the mapping
    /// back when the span never joins its zone.
    pub(crate) fn region_ptr(&self) -> NonNull<u8> {
        self.0
    }
}

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
        let nsec = u32::try_from(count(range, SECTION_SHIFT)).ok()?;
        let region = crate::platform::map_checked(mem, meta)?;
        // SAFETY: the seed comes first in the region (`region_bytes`), a whole number of pages.
        let sections =
            unsafe { region.add(seed_bytes() as usize) }.cast::<UnsafeCell<SectionCell>>();
        // SAFETY: the section table ends inside the region (`region_bytes`).
        let end = unsafe { sections.add(nsec as usize) }.cast::<u8>();
        let offset =
            end.as_ptr().addr().next_multiple_of(align_of::<ColdSlot>()) - end.as_ptr().addr();
        // SAFETY: `region_bytes` counted the alignment slack and a slot per section after the
        // section table (`table_bytes`). The slots stay unwritten until their section gets an
        // array.
        let cold = unsafe { end.add(offset) }.cast::<ColdSlot>();
        // SAFETY: as above.
        let mut cursor = unsafe { cold.add(nsec as usize) }.cast::<u8>();
        // Each edge section, with its array (a cell for each of its pageblocks).
        let mut edges: [Option<(u64, Array)>; 2] = [None, None];
        for (slot, s) in edges.iter_mut().zip(edge_sections(range)) {
            let len = pbs_in_section(range, s) as usize;
            let offset =
                cursor.as_ptr().addr().next_multiple_of(CELL_ALIGN) - cursor.as_ptr().addr();
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
            // SAFETY: `s < nsec`: the slot lies in the region (see above), which nothing else
            // sees yet.
            unsafe { open_cold(cold.add(s as usize), Origin::Section) };
            *slot = Some((s, ptr));
            // SAFETY: one past the array, still inside (or at the end of) the region.
            cursor = unsafe { ptr.add(len) }.cast::<u8>();
        }
        for s in 0..u64::from(nsec) {
            let array = edges
                .iter()
                .flatten()
                .find(|(e, _)| *e == s)
                .map(|&(_, ptr)| ptr);
            let section = Section {
                state: if array.is_some() {
                    SectionState::Split
                } else {
                    SectionState::Allocated(Use::Normal)
                },
                flags: 0,
                first_dirty: 0,
                next: NIL,
                prev: NIL,
                free_pbs: 0,
                split_pbs: 0,
            };
            // SAFETY: `s < nsec`, inside the table at the start of the region (see above).
            unsafe {
                sections
                    .add(s as usize)
                    .write(UnsafeCell::new(SectionCell { section, array }))
            };
        }
        Some((
            SpanMeta {
                range,
                region: meta,
                sections,
                cold,
                nsec,
                npb: count(range, PB_SHIFT) as u32,
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
        self.npb
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

/// The pool's list of free seed arrays (in spans' regions).
const SEED_ARRAYS: usize = 0;
/// The pool's list of free arrays in slabs of the zone's frames.
const ZONE_ARRAYS: usize = 1;

/// A zone's pool of metadata memory: pageblock arrays for whole sections, single planes and
/// plane pairs. Its memory is slabs of frames the zone gave itself, mapped through the
/// platform and never handed out, and the seed slabs in its spans' regions.
///
/// Planes live in one-page slabs, each headed by a [`SlabHead`] in its first slot that knows
/// which slots are in use; per kind, the slabs with a slot in use and one free are on one list,
/// the wholly free slabs of the zone's frames on another. An array is a slab of its own; free
/// arrays are linked through their first words, seeds and the zone's apart. When asked
/// ([`Pool::retire_spare`]), the pool *retires* the wholly free slabs of the zone's frames it
/// does not need for its reserve and one slab more: they leave the pool, and the zone unmaps
/// them and takes the frames back ([`Pool::pop_retired`]), so the pool shrinks as memory merges
/// whole again. Seed slabs stay with their spans.
#[derive(Debug, Default)]
pub(crate) struct Pool {
    singles: Slabs,
    pairs: Slabs,
    /// Free arrays: seeds ([`SEED_ARRAYS`]), and the zone's ([`ZONE_ARRAYS`]).
    arrays: [Option<NonNull<FreeArray>>; 2],
    free_arrays: u64,
    retired: Option<NonNull<Retired>>,
    /// Bytes of memory the pool holds from its zone (its seeds live in the spans' regions).
    pub(crate) bytes: u64,
    /// The metadata memory of spans being taken offline, out of service (see
    /// [`Pool::quarantine`]).
    away: [Option<Away>; MAX_SPANS_PER_ZONE],
    /// Some entry of `away` is set.
    avoiding: bool,
    /// Free arrays lying in `away`, out of service.
    q_arrays: Option<NonNull<FreeArray>>,
    /// The spans' seeds. A seed's slab is *closed* until the pool first needs it: only then is
    /// it written (and its memory touched), so adding a span writes none of its seed. A closed
    /// slab counts as free for the reserve and the retiring (see [`Pool::closed`]) but is on
    /// no list.
    seeds: [Option<SeedSlabs>; MAX_SPANS_PER_ZONE],
    /// Seeds added so far: plane slots come from the newest seed with room, by when its span
    /// was added (as the seed lists ordered them when every seed was opened at once, until a
    /// failed offline put the released seeds first).
    seeds_added: u64,
}

/// A span's seed: where it is mapped, its slabs still closed (see [`Pool::seed_bit`]), and
/// when it was added.
#[derive(Clone, Copy, Debug)]
struct SeedSlabs {
    at: NonNull<u8>,
    closed: u8,
    added: u64,
}

// SAFETY: the pool's memory is only reached through the `ZoneMeta` that owns it, behind its
// zone's lock.
unsafe impl Send for Pool {}
// SAFETY: as above.
unsafe impl Sync for Pool {}

/// The plane slabs of one kind.
#[derive(Debug, Default)]
struct Slabs {
    /// The opened seed slabs (in the spans' regions), full or not, linked through their heads
    /// (closed ones are on no list: [`Pool::seeds`]).
    seeds: Option<NonNull<SlabHead>>,
    /// The slabs of the zone's frames with a free slot and one in use.
    partial: Option<NonNull<SlabHead>>,
    /// The wholly free slabs of the zone's frames.
    empty: Option<NonNull<SlabHead>>,
    /// The slabs of the zone's frames with every slot in use.
    full: Option<NonNull<SlabHead>>,
    /// The slabs lying in the pool's `away` memory, seeds or not: out of service, so no plane
    /// is put there any more; their free slots are not counted.
    quarantine: Option<NonNull<SlabHead>>,
    /// The free slots of them all (but the quarantined ones).
    free: u64,
}

/// The head of a plane slab, in its first slots. The owner index follows it: one `u32` per
/// slot, the packed [`PbRef`] of the pageblock whose planes the slot holds ([`NIL`] for a free
/// slot), so that any plane of the slab can be moved (its owner repointed) and a slab emptied.
struct SlabHead {
    next: Option<NonNull<SlabHead>>,
    prev: Option<NonNull<SlabHead>>,
    /// Bit `i` set: slot `i` is in use (the first [`Pool::head_slots`] hold this head and the
    /// owner index).
    used: u64,
    /// The slab's frames; `None` for a seed slab, which stays in its span's region.
    slab: Option<PhysRange>,
}

/// A free array, in its own first words.
struct FreeArray {
    next: Option<NonNull<FreeArray>>,
    /// As [`SlabHead::slab`].
    slab: Option<PhysRange>,
}

/// A retired slab, in its own first words, until its zone takes the frames back.
struct Retired {
    next: Option<NonNull<Retired>>,
    slab: PhysRange,
}

const _: () = {
    // A slab head and its owner index leave most of a slab's slots to planes, and a slab has
    // at most 64 slots; the owner index is aligned for its `u32`s.
    assert!(Pool::head_slots(Short::Singles) <= 5 && Pool::head_slots(Short::Pairs) <= 2);
    assert!(PAGE_SIZE as usize / size_of::<UnsafeCell<Plane>>() <= 64);
    assert!(size_of::<SlabHead>().is_multiple_of(align_of::<u32>()));
    assert!(size_of::<FreeArray>() <= ARRAY_BYTES && size_of::<Retired>() <= ARRAY_BYTES);
    assert!(size_of::<Retired>() <= size_of::<UnsafeCell<Plane>>());
};

/// Objects of each kind the pool keeps back for its own growth. A slab is carved from a
/// pageblock the pool keeps for slabs of its size (so that pageblock needs one single plane):
/// growth may have to claim a free pageblock for it (one single plane), but never splits a
/// section while one is split already, and needs no pair. Arrays are not kept back, so the
/// first split of a span's whole section takes the span's seed array and no frame of that
/// section goes to metadata.
const fn reserve(what: Short) -> u64 {
    match what {
        Short::Singles => 1,
        Short::Pairs | Short::Arrays => 0,
    }
}

/// Free arrays the pool keeps before it retires one of the zone's.
const KEEP_ARRAYS: u64 = 1;

/// Which list of a kind's plane slabs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum List {
    Seeds,
    Partial,
    Empty,
    Full,
    Quarantine,
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

impl Pool {
    /// Frames of a slab of `what`: one page of planes, or the pages of one array.
    pub(crate) fn slab_frames(what: Short) -> u64 {
        match what {
            Short::Singles | Short::Pairs => 1,
            Short::Arrays => (ARRAY_BYTES as u64).div_ceil(PAGE_SIZE),
        }
    }

    /// `true` if the pool is at or below its reserve of `what` (closed seeds count as free).
    pub(crate) fn low(&self, what: Short) -> bool {
        self.free_of(what) <= reserve(what)
    }

    /// Free objects of `what`: slots, or arrays, on the lists and in closed seeds.
    fn free_of(&self, what: Short) -> u64 {
        let listed = match what {
            Short::Singles => self.singles.free,
            Short::Pairs => self.pairs.free,
            Short::Arrays => self.free_arrays,
        };
        listed + self.closed(what)
    }

    /// Free objects of `what` in closed seeds that may be opened (not in `away` memory).
    fn closed(&self, what: Short) -> u64 {
        let bit = Self::seed_bit(what);
        let per = match what {
            Short::Arrays => 1,
            Short::Singles | Short::Pairs => Self::per_slab(what),
        };
        self.seeds
            .iter()
            .flatten()
            .filter(|c| c.closed & bit != 0 && !self.away_holds(None, c.at))
            .count() as u64
            * per
    }

    /// The bit of `what` in [`SeedSlabs::closed`].
    const fn seed_bit(what: Short) -> u8 {
        match what {
            Short::Arrays => 1 << 0,
            Short::Singles => 1 << 1,
            Short::Pairs => 1 << 2,
        }
    }

    /// Where `what`'s slab lies in a seed (the slabs follow each other in [`SEED`]'s order).
    fn seed_offset(what: Short) -> usize {
        SEED.iter()
            .take_while(|&&w| w != what)
            .map(|&w| Self::slab_frames(w) * PAGE_SIZE)
            .sum::<u64>() as usize
    }

    /// Records a span's seed at `at`, every slab closed.
    ///
    /// # Safety
    /// As [`Pool::add_raw`]'s, for the seed's `seed_bytes()` bytes: `at` is the page-aligned
    /// start of a span's region, laid out by [`SpanMeta::map`].
    unsafe fn add_seed(&mut self, at: NonNull<u8>) -> bool {
        let Some(slot) = self.seeds.iter_mut().find(|c| c.is_none()) else {
            return false;
        };
        *slot = Some(SeedSlabs {
            at,
            closed: SEED.iter().fold(0, |k, &w| k | Self::seed_bit(w)),
            added: self.seeds_added,
        });
        self.seeds_added += 1;
        true
    }

    /// Seed `i`'s `what` slab, opened if it was closed: written and put on its seed list.
    /// `None` if there is no seed `i`.
    fn open_seed(&mut self, i: usize, what: Short) -> Option<NonNull<u8>> {
        let bit = Self::seed_bit(what);
        let c = self.seeds.get_mut(i)?.as_mut()?;
        // SAFETY: `add_seed`'s caller laid the seed's slabs out in `SEED`'s order from `at`.
        let at = unsafe { c.at.add(Self::seed_offset(what)) };
        if c.closed & bit != 0 {
            c.closed &= !bit;
            // SAFETY: `add_seed`'s caller's guarantee: the slab lives as long as the machine,
            // and, closed until now, nothing uses it.
            unsafe { self.add_raw(what, at, None) };
        }
        Some(at)
    }

    /// The seeds that may serve (not in `away` memory), newest first.
    fn seeds_newest_first(&self) -> impl Iterator<Item = usize> + use<> {
        let mut order = [(0u64, usize::MAX); MAX_SPANS_PER_ZONE];
        for (i, c) in self.seeds.iter().enumerate() {
            if let Some(c) = c
                && !self.away_holds(None, c.at)
            {
                order[i] = (c.added + 1, i);
            }
        }
        order.sort_unstable_by(|a, b| b.cmp(a));
        order
            .into_iter()
            .take_while(|&(added, _)| added > 0)
            .map(|(_, i)| i)
    }

    /// The newest seed slab of `kind` with a free slot, opened if it was closed (then it is
    /// wholly free).
    fn seed_with_room(&mut self, kind: Short) -> Option<NonNull<SlabHead>> {
        let bit = Self::seed_bit(kind);
        for i in self.seeds_newest_first() {
            let closed = self.seeds[i].is_some_and(|c| c.closed & bit != 0);
            let Some(head) = self.open_seed(i, kind).map(NonNull::cast::<SlabHead>) else {
                continue;
            };
            // SAFETY: an opened seed slab holds a live slab head (`add_raw`).
            if closed || unsafe { (*head.as_ptr()).used } != Self::full(kind) {
                return Some(head);
            }
        }
        None
    }

    /// Forgets the seeds in `away` memory (they leave with their region).
    fn forget_seeds(&mut self, away: Away) {
        for c in &mut self.seeds {
            if c.is_some_and(|x| away.holds(None, x.at)) {
                *c = None;
            }
        }
    }

    /// The bytes of one slot of a plane kind.
    const fn slot_bytes(kind: Short) -> usize {
        match kind {
            Short::Pairs => size_of::<UnsafeCell<[Plane; 2]>>(),
            Short::Singles | Short::Arrays => size_of::<UnsafeCell<Plane>>(),
        }
    }

    /// Slots of a plane slab of `kind`.
    const fn slots(kind: Short) -> usize {
        PAGE_SIZE as usize / Self::slot_bytes(kind)
    }

    /// The first slots of a plane slab, which hold its head and owner index.
    const fn head_slots(kind: Short) -> usize {
        (size_of::<SlabHead>() + Self::slots(kind) * size_of::<u32>())
            .div_ceil(Self::slot_bytes(kind))
    }

    /// `used` of a plane slab with no plane in it: the head's slots.
    fn head_mask(kind: Short) -> u64 {
        u64::MAX >> (64 - Self::head_slots(kind))
    }

    /// `used` of a plane slab with every slot in use.
    fn full(kind: Short) -> u64 {
        u64::MAX >> (64 - Self::slots(kind))
    }

    /// Objects of one plane slab of `kind` (its slots but the head's).
    fn per_slab(kind: Short) -> u64 {
        (Self::slots(kind) - Self::head_slots(kind)) as u64
    }

    /// The owner index of the slab `head` heads.
    fn owners(head: NonNull<SlabHead>) -> NonNull<u32> {
        // SAFETY: the index follows the head inside the slab's page (`head_slots`), aligned
        // for `u32` (checked at compile time above).
        unsafe { head.add(1) }.cast::<u32>()
    }

    /// The head of the plane slab slot `p` lies in, and the slot's number.
    fn head_of(kind: Short, p: NonNull<u8>) -> (NonNull<SlabHead>, usize) {
        let off = p.as_ptr().addr() % PAGE_SIZE as usize;
        // SAFETY: `p` is a slot of a plane slab of this pool, `off` bytes into its page, whose
        // first slot holds its head.
        let head = unsafe { p.byte_sub(off) }.cast::<SlabHead>();
        (head, off / Self::slot_bytes(kind))
    }

    /// Records that plane slot `p` of `kind` holds the planes of `owner` (a packed [`PbRef`],
    /// or [`NIL`] for none).
    fn set_owner(kind: Short, p: NonNull<u8>, owner: u32) {
        let (head, slot) = Self::head_of(kind, p);
        // SAFETY: `slot` is below the slab's slot count, so inside the owner index, which only
        // this pool reaches.
        unsafe { Self::owners(head).add(slot).write(owner) };
    }

    /// The owner of plane slot `p` of `kind` (a packed [`PbRef`], or [`NIL`]).
    fn owner(kind: Short, p: NonNull<u8>) -> u32 {
        let (head, slot) = Self::head_of(kind, p);
        // SAFETY: as in `set_owner`; the index was written when the slab joined the pool.
        unsafe { Self::owners(head).add(slot).read() }
    }

    fn slabs(&mut self, kind: Short) -> &mut Slabs {
        match kind {
            Short::Pairs => &mut self.pairs,
            Short::Singles | Short::Arrays => &mut self.singles,
        }
    }

    fn list(&mut self, kind: Short, list: List) -> &mut Option<NonNull<SlabHead>> {
        let s = self.slabs(kind);
        match list {
            List::Seeds => &mut s.seeds,
            List::Partial => &mut s.partial,
            List::Empty => &mut s.empty,
            List::Full => &mut s.full,
            List::Quarantine => &mut s.quarantine,
        }
    }

    /// Puts plane slab `head` at the front of one of `kind`'s lists.
    fn link(&mut self, kind: Short, list: List, head: NonNull<SlabHead>) {
        let old = self.list(kind, list).replace(head);
        // SAFETY: `head` and every slab on the lists are live slab heads of this pool, reached
        // only through it.
        unsafe {
            (*head.as_ptr()).next = old;
            (*head.as_ptr()).prev = None;
            if let Some(o) = old {
                (*o.as_ptr()).prev = Some(head);
            }
        }
    }

    /// Takes plane slab `head` off the list of `kind`'s it is on.
    fn unlink(&mut self, kind: Short, list: List, head: NonNull<SlabHead>) {
        // SAFETY: as in `link`; `head` is on the list.
        let (next, prev) = unsafe { ((*head.as_ptr()).next, (*head.as_ptr()).prev) };
        match prev {
            // SAFETY: as above.
            Some(p) => unsafe { (*p.as_ptr()).next = next },
            None => *self.list(kind, list) = next,
        }
        if let Some(n) = next {
            // SAFETY: as above.
            unsafe { (*n.as_ptr()).prev = prev };
        }
    }

    /// Adds a mapped slab of `what` to the pool; a slab smaller than `what` needs is refused.
    pub(crate) fn add_slab(&mut self, what: Short, slab: Mapped) {
        let bytes = Self::slab_frames(what) * PAGE_SIZE;
        if slab.range.bytes() < bytes {
            return;
        }
        self.bytes += slab.range.bytes();
        // SAFETY: a `Mapped` holds PhysMemory's promises for its range (page aligned, valid for
        // its bytes for the machine's lifetime, ours alone), which covers the slab.
        unsafe { self.add_raw(what, slab.ptr, Some(slab.range)) };
        if self.avoiding {
            // Carved from a span that started going offline while the slab was being mapped.
            self.sweep();
        }
    }

    /// [`Pool::add_slab`] for memory the caller vouches for: the frames `slab` if it is the
    /// zone's (it may be retired then), `None` for a seed.
    ///
    /// # Safety
    /// `ptr` must be aligned to [`PAGE_SIZE`] and valid for reads and writes of
    /// `slab_frames(what) * PAGE_SIZE` bytes (all of `slab`'s, if given) for as long as the
    /// machine lives, and used by nothing else.
    unsafe fn add_raw(&mut self, what: Short, ptr: NonNull<u8>, slab: Option<PhysRange>) {
        match what {
            Short::Singles | Short::Pairs => {
                let head = ptr.cast::<SlabHead>();
                // SAFETY: the caller's guarantee: the page is ours, and its first slots hold a
                // head at its alignment and its owner index (checked at compile time above).
                unsafe {
                    head.write(SlabHead {
                        next: None,
                        prev: None,
                        used: Self::head_mask(what),
                        slab,
                    });
                    for i in 0..Self::slots(what) {
                        Self::owners(head).add(i).write(NIL);
                    }
                };
                let list = if slab.is_some() {
                    List::Empty
                } else {
                    List::Seeds
                };
                self.link(what, list, head);
                self.slabs(what).free += Self::per_slab(what);
            }
            Short::Arrays => {
                // SAFETY: as above, for an array.
                unsafe { self.push_array(ptr.cast(), slab) };
            }
        }
    }

    /// Links a free array.
    ///
    /// # Safety
    /// `a` must be an array of this pool that nothing uses any more.
    unsafe fn push_array(&mut self, a: NonNull<FreeArray>, slab: Option<PhysRange>) {
        let list = &mut self.arrays[if slab.is_some() {
            ZONE_ARRAYS
        } else {
            SEED_ARRAYS
        }];
        // SAFETY: the caller's guarantee; an array is larger than its link.
        unsafe { a.write(FreeArray { next: *list, slab }) };
        *list = Some(a);
        self.free_arrays += 1;
    }

    /// Retires the zone's free arrays beyond the ones the pool keeps.
    fn retire_spare_arrays(&mut self) {
        while self.free_of(Short::Arrays) > KEEP_ARRAYS
            && let Some((z, slab)) = self.unlink_array(ZONE_ARRAYS, |_| true)
        {
            if let Some(slab) = slab {
                self.retire(z.cast(), slab);
            }
        }
    }

    /// Retires what the pool can spare: the wholly free plane slabs of the zone's frames while
    /// it keeps, without each, its reserve and a slab's worth of free slots more, and the free
    /// arrays of the zone's beyond the ones it keeps.
    pub(crate) fn retire_spare(&mut self) {
        self.retire_spare_slabs(Short::Singles);
        self.retire_spare_slabs(Short::Pairs);
        self.retire_spare_arrays();
    }

    fn retire_spare_slabs(&mut self, kind: Short) {
        let per = Self::per_slab(kind);
        while self.free_of(kind) >= reserve(kind) + 2 * per
            && let Some(head) = self.slabs(kind).empty
        {
            self.unlink(kind, List::Empty, head);
            self.slabs(kind).free -= per;
            // SAFETY: a slab on the empty list is a live slab head of the zone's frames.
            if let Some(slab) = unsafe { (*head.as_ptr()).slab } {
                self.retire(head.cast(), slab);
            }
        }
    }

    /// Moves slab `slab`, at `ptr` and no longer in the pool, onto the retired list.
    fn retire(&mut self, ptr: NonNull<u8>, slab: PhysRange) {
        let r = ptr.cast::<Retired>();
        // SAFETY: the slab is the pool's and nothing uses it; a slab holds a `Retired`.
        unsafe {
            r.write(Retired {
                next: self.retired,
                slab,
            })
        };
        self.retired = Some(r);
        self.bytes -= slab.bytes();
    }

    /// A retired slab, zeroed (its frames held only metadata, so they are clean again), and
    /// the pointer it was mapped at, for the zone to unmap and take back; `None` if none is
    /// retired.
    pub(crate) fn pop_retired(&mut self) -> Option<(PhysRange, NonNull<u8>)> {
        let r = self.retired?;
        // SAFETY: `r` heads the retired list: a slab of this pool's memory that `retire`
        // wrote a `Retired` into and nothing else uses.
        let Retired { next, slab } = unsafe { r.read() };
        self.retired = next;
        // SAFETY: as above; the slab is mapped for all its frames (`add_slab`), and zeroing it
        // makes its frames clean again: they held only metadata.
        unsafe { r.cast::<u8>().write_bytes(0, slab.bytes() as usize) };
        Some((slab, r.cast()))
    }

    /// A free slot of `kind`'s plane slabs, if `need` may have one. Normal needs take from a
    /// slab of the zone's in use if there is one (so wholly free slabs stay free), then from a
    /// wholly free one, then from a seed; the pool's own growth (the planes of pool
    /// pageblocks, of edge pageblocks) from a seed first, so what lives as long as those
    /// pageblocks does not keep a slab of the zone's frames.
    fn take_slot(&mut self, kind: Short, need: Need) -> Option<NonNull<u8>> {
        if need == Need::Normal && self.low(kind) {
            return None;
        }
        let order = match need {
            Need::Normal => [List::Partial, List::Empty, List::Seeds],
            Need::Growth => [List::Seeds, List::Partial, List::Empty],
        };
        order.into_iter().find_map(|list| {
            let head = self.first_with_room_or_open(kind, list, None)?;
            Some(self.take_from(kind, head, list))
        })
    }

    /// [`Pool::first_with_room`], for the seed list [`Pool::seed_with_room`] (seeds lie
    /// outside any frames).
    fn first_with_room_or_open(
        &mut self,
        kind: Short,
        list: List,
        away: Option<PhysRange>,
    ) -> Option<NonNull<SlabHead>> {
        if list == List::Seeds {
            self.seed_with_room(kind)
        } else {
            self.first_with_room(kind, list, away)
        }
    }

    /// A free slot of `kind` in a slab outside the frames `away` (a seed's first), to move an
    /// object to; reserve or not.
    fn take_slot_outside(&mut self, kind: Short, away: PhysRange) -> Option<NonNull<u8>> {
        [List::Seeds, List::Partial, List::Empty]
            .into_iter()
            .find_map(|list| {
                let head = self.first_with_room_or_open(kind, list, Some(away))?;
                Some(self.take_from(kind, head, list))
            })
    }

    /// The first slab on `list` of `kind`'s with a free slot and outside `away`.
    fn first_with_room(
        &mut self,
        kind: Short,
        list: List,
        away: Option<PhysRange>,
    ) -> Option<NonNull<SlabHead>> {
        let mut cur = *self.list(kind, list);
        while let Some(h) = cur {
            // SAFETY: the lists hold live slab heads of this pool.
            let (next, used, slab) =
                unsafe { ((*h.as_ptr()).next, (*h.as_ptr()).used, (*h.as_ptr()).slab) };
            let outside = !slab.zip(away).is_some_and(|(x, y)| x.overlaps(&y));
            if used != Self::full(kind) && outside {
                return Some(h);
            }
            cur = next;
        }
        None
    }

    /// Takes the lowest free slot of slab `head`, which is on `list` of `kind`'s.
    fn take_from(&mut self, kind: Short, head: NonNull<SlabHead>, list: List) -> NonNull<u8> {
        if list == List::Empty {
            self.unlink(kind, List::Empty, head);
            self.link(kind, List::Partial, head);
        }
        self.slabs(kind).free -= 1;
        // SAFETY: `head` is a live slab head of this pool with a free slot, so the lowest clear
        // bit of `used` is a slot inside its page.
        let (slot, used) = unsafe {
            let h = head.as_ptr();
            let slot = (!(*h).used).trailing_zeros() as usize;
            (*h).used |= 1 << slot;
            (slot, (*h).used)
        };
        if used == Self::full(kind) && list != List::Seeds {
            self.unlink(kind, List::Partial, head);
            self.link(kind, List::Full, head);
        }
        // SAFETY: the slot lies inside the slab's page (see above).
        unsafe { head.cast::<u8>().add(slot * Self::slot_bytes(kind)) }
    }

    /// The frames of the plane slab slot `p` lies in (`None` for a seed's).
    fn slab_of(p: NonNull<u8>) -> Option<PhysRange> {
        let off = p.as_ptr().addr() % PAGE_SIZE as usize;
        // SAFETY: `p` is a slot of a live plane slab of this pool, `off` bytes into its page,
        // whose first slot holds its head.
        unsafe { (*p.byte_sub(off).cast::<SlabHead>().as_ptr()).slab }
    }

    /// Gives slot `p` of a `kind` plane slab back; a slab of the zone's frames left wholly free
    /// moves to the empty list.
    fn put_slot(&mut self, kind: Short, p: NonNull<u8>) {
        Self::set_owner(kind, p, NIL);
        let (head, slot) = Self::head_of(kind, p);
        let bit = 1u64 << slot;
        // SAFETY: `head` heads a live plane slab of this pool.
        let (was, slab) = unsafe {
            let h = head.as_ptr();
            let was = (*h).used;
            (*h).used &= !bit;
            (was, (*h).slab)
        };
        if self.avoiding && self.away_holds(slab, head.cast()) {
            // Out of service: it stays quarantined, its free slots uncounted.
            return;
        }
        self.slabs(kind).free += 1;
        if slab.is_some() {
            if was == Self::full(kind) {
                self.unlink(kind, List::Full, head);
                self.link(kind, List::Partial, head);
            }
            if was & !bit == Self::head_mask(kind) {
                self.unlink(kind, List::Partial, head);
                self.link(kind, List::Empty, head);
            }
        }
    }

    /// Retires every wholly free slab and free array of the zone's that lies in the frames
    /// `away`, spare or not: a pool pageblock about to empty should not be kept by them.
    pub(crate) fn retire_in(&mut self, away: PhysRange) {
        for kind in [Short::Singles, Short::Pairs] {
            let mut cur = self.slabs(kind).empty;
            while let Some(h) = cur {
                // SAFETY: the empty list holds live slab heads of the zone's frames.
                let (next, slab) = unsafe { ((*h.as_ptr()).next, (*h.as_ptr()).slab) };
                if let Some(slab) = slab.filter(|x| x.overlaps(&away)) {
                    self.unlink(kind, List::Empty, h);
                    self.slabs(kind).free -= Self::per_slab(kind);
                    self.retire(h.cast(), slab);
                }
                cur = next;
            }
        }
        while let Some((a, slab)) = self.pop_zone_array_in(away) {
            self.retire(a.cast(), slab);
        }
    }

    /// Unlinks a free array of the zone's lying in `away`.
    fn pop_zone_array_in(&mut self, away: PhysRange) -> Option<(NonNull<FreeArray>, PhysRange)> {
        let (a, slab) = self.unlink_array(ZONE_ARRAYS, |s| s.is_some_and(|x| x.overlaps(&away)))?;
        Some((a, slab?))
    }

    /// Unlinks the first free array of list `list` (`SEED_ARRAYS` or `ZONE_ARRAYS`) whose slab
    /// (`None` for a seed) `take` accepts: the one walk over a free-array list's links.
    fn unlink_array(
        &mut self,
        list: usize,
        take: impl Fn(Option<PhysRange>) -> bool,
    ) -> Option<(NonNull<FreeArray>, Option<PhysRange>)> {
        let mut link: *mut Option<NonNull<FreeArray>> = self.arrays.get_mut(list)?;
        // SAFETY: `link` is a list head of this pool or the link word of a free array on it
        // (written by `push_array`); nothing else reaches them.
        while let Some(a) = unsafe { *link } {
            // SAFETY: as above.
            let FreeArray { next, slab } = unsafe { a.read() };
            if take(slab) {
                // SAFETY: as above.
                unsafe { *link = next };
                self.free_arrays -= 1;
                return Some((a, slab));
            }
            // SAFETY: as above; the link word is the first field of the array.
            link = unsafe { &raw mut (*a.as_ptr()).next };
        }
        None
    }

    fn take_array(&mut self, need: Need) -> Option<ArrayRef> {
        if need == Need::Normal && self.low(Short::Arrays) {
            return None;
        }
        let a = self.pop_array(None)?;
        Some(Self::init_array(a))
    }

    /// Unlinks a free array outside the frames `away` (any, without): a seed first, so the
    /// zone's arrays are the ones left free to retire.
    fn pop_array(
        &mut self,
        away: Option<PhysRange>,
    ) -> Option<(NonNull<FreeArray>, Option<PhysRange>)> {
        let outside =
            |slab: Option<PhysRange>| !slab.zip(away).is_some_and(|(x, y)| x.overlaps(&y));
        self.unlink_array(SEED_ARRAYS, outside)
            .or_else(|| {
                let bit = Self::seed_bit(Short::Arrays);
                let i = self
                    .seeds_newest_first()
                    .find(|&i| self.seeds[i].is_some_and(|c| c.closed & bit != 0))?;
                self.open_seed(i, Short::Arrays)?;
                self.unlink_array(SEED_ARRAYS, outside)
            })
            .or_else(|| self.unlink_array(ZONE_ARRAYS, outside))
    }

    /// A free array, popped, made an array of fresh cells.
    fn init_array((a, slab): (NonNull<FreeArray>, Option<PhysRange>)) -> ArrayRef {
        let a = a.cast::<UnsafeCell<PbCell>>();
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
        ArrayRef {
            ptr: a,
            len: PBS_PER_SECTION as u16,
            origin: slab.map_or(Origin::Seed, Origin::Slab),
        }
    }

    /// Gives an array back (an edge or hosted array is not the pool's and stays with its
    /// section); the zone's free arrays beyond the few the pool keeps are retired.
    fn put_array(&mut self, a: ArrayRef) {
        let slab = match a.origin {
            Origin::Section | Origin::Hosted(_) => return,
            Origin::Seed => None,
            Origin::Slab(s) => Some(s),
        };
        if self.avoiding && self.away_holds(slab, a.ptr.cast()) {
            // SAFETY: the array is this pool's and its section gave it up.
            unsafe { self.quarantine_array(a.ptr.cast(), slab) };
            return;
        }
        // SAFETY: the array is this pool's and its section gave it up.
        unsafe { self.push_array(a.ptr.cast(), slab) };
    }

    /// Planes holding `alloc` (and `extra`, for a pair), owned by pageblock `owner`.
    fn take_planes(
        &mut self,
        alloc: Plane,
        extra: Option<Plane>,
        need: Need,
        owner: PbRef,
    ) -> Option<PlaneRef> {
        Some(match extra {
            None => {
                let slot = self.take_slot(Short::Singles, need)?;
                Self::set_owner(Short::Singles, slot, owner.pack());
                let p = slot.cast::<UnsafeCell<Plane>>();
                // SAFETY: the slot is ours now, sized and aligned for a plane, and seen by
                // nothing else.
                unsafe { p.write(UnsafeCell::new(alloc)) };
                PlaneRef::single(p)
            }
            Some(x) => {
                let slot = self.take_slot(Short::Pairs, need)?;
                Self::set_owner(Short::Pairs, slot, owner.pack());
                let p = slot.cast::<UnsafeCell<[Plane; 2]>>();
                // SAFETY: as above, for a pair.
                unsafe { p.write(UnsafeCell::new([alloc, x])) };
                PlaneRef::pair(p)
            }
        })
    }

    fn put_planes(&mut self, p: PlaneRef) {
        let (kind, slot) = p.slot();
        self.put_slot(kind, slot);
    }

    /// `true` if the pool's lists agree with its counts: every plane slab on a list has its
    /// head's bit and is of the list's kind (seeds; the zone's partly used; the zone's wholly
    /// free), their free slots and the free arrays are as counted, and no slab waits to be
    /// taken back.
    pub(crate) fn consistent(&self) -> bool {
        let walk = |kind: Short, head: Option<NonNull<SlabHead>>, list: List| {
            let (mut free, mut prev, mut cur) = (0u64, None, head);
            while let Some(h) = cur {
                // SAFETY: the lists hold live slab heads of this pool; `&self` excludes writes.
                let x = unsafe { h.as_ref() };
                let full = Self::full(kind);
                let head = Self::head_mask(kind);
                let held = self.away_holds(x.slab, h.cast());
                let shape = match list {
                    List::Seeds => x.slab.is_none(),
                    List::Partial => x.slab.is_some() && x.used != head && x.used != full,
                    List::Empty => x.slab.is_some() && x.used == head,
                    List::Full => x.slab.is_some() && x.used == full,
                    List::Quarantine => true,
                };
                if !shape
                    || held != (list == List::Quarantine)
                    || x.used & head != head
                    || x.used & !full != 0
                    || x.prev != prev
                {
                    return None;
                }
                if !held {
                    free += Self::slots(kind) as u64 - u64::from(x.used.count_ones());
                }
                (prev, cur) = (Some(h), x.next);
            }
            Some(free)
        };
        let slabs_ok = |kind: Short, s: &Slabs| {
            let seeds = walk(kind, s.seeds, List::Seeds);
            let partial = walk(kind, s.partial, List::Partial);
            let empty = walk(kind, s.empty, List::Empty);
            let full = walk(kind, s.full, List::Full);
            let quarantined = walk(kind, s.quarantine, List::Quarantine);
            seeds
                .zip(partial)
                .zip(empty)
                .zip(full)
                .zip(quarantined)
                .is_some_and(|((((a, b), c), d), _)| a + b + c + d == s.free)
        };
        // Free arrays on one list, and whether they lie in `away` (`None` if some does and
        // some does not).
        let count = |mut cur: Option<NonNull<FreeArray>>, held: bool| {
            let mut n = 0u64;
            while let Some(a) = cur {
                n += 1;
                // SAFETY: the list holds free arrays of this pool, linked by `push_array`.
                let x = unsafe { a.as_ref() };
                if self.away_holds(x.slab, a.cast()) != held {
                    return None;
                }
                cur = x.next;
            }
            Some(n)
        };
        let arrays =
            count(self.arrays[SEED_ARRAYS], false).zip(count(self.arrays[ZONE_ARRAYS], false));
        slabs_ok(Short::Singles, &self.singles)
            && slabs_ok(Short::Pairs, &self.pairs)
            && arrays.is_some_and(|(a, b)| a + b == self.free_arrays)
            && count(self.q_arrays, true).is_some()
            && self.avoiding == self.away.iter().any(Option::is_some)
            && self.retired.is_none()
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
        match (p.get(), which) {
            (Planes::Single(q), Which::Alloc) => Some(q.as_ref().with(|c| *c)),
            (Planes::Single(_), Which::Extra) => None,
            (Planes::Pair(q), Which::Alloc) => Some(q.as_ref().with(|c| (*c)[0])),
            (Planes::Pair(q), Which::Extra) => Some(q.as_ref().with(|c| (*c)[1])),
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

    /// Adds a span in the next free slot, and its seed to the pool (closed: nothing of it is
    /// written until the pool needs it); returns the slot.
    pub(crate) fn add(&mut self, span: SpanMeta, seed: Seed) -> Option<u8> {
        let slot = self.spans.iter().position(Option::is_none)?;
        // SAFETY: `SpanMeta::map` laid the seed slabs out at the page-aligned start of the
        // span's region, which lives as long as the machine and is used by nothing else.
        if !unsafe { self.pool.add_seed(seed.0) } {
            return None;
        }
        self.spans[slot] = Some(span);
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

    /// Section `s`'s cell, and its cold part if the section has an array (else the slot may
    /// be unwritten), in one lookup.
    fn section_cells(
        &self,
        s: SecRef,
    ) -> Option<(&UnsafeCell<SectionCell>, Option<&UnsafeCell<Cold>>)> {
        let span = self.span(s.span)?;
        let cell = self.section_cell(s)?;
        // SAFETY: as in `section_cell_copy`.
        let split = cell.with(|p| unsafe { (*p).array.is_some() });
        // SAFETY: `section_cell` checked `s.index < nsec`, so the slot lies in the span's cold
        // table (`SpanMeta::map`); the cell has an array, so the slot was written when it got
        // it (see `SectionCell`), and it stays so while `&self` excludes writers.
        let cold =
            split.then(|| unsafe { span.cold.add(s.index as usize).as_ref().assume_init_ref() });
        Some((cell, cold))
    }

    /// Section `s`'s cold part, if the section has an array.
    fn cold(&self, s: SecRef) -> Option<&UnsafeCell<Cold>> {
        self.section_cells(s)?.1
    }

    fn section_cell_copy(&self, s: SecRef) -> Option<(Section, Option<ArrayRef>)> {
        let (cell, cold) = self.section_cells(s)?;
        // SAFETY: `&self` borrows the zone's locked metadata, so no write to the cell runs
        // meanwhile (writes take `&mut self`).
        let (section, array) = cell.with(|p| unsafe { ((*p).section, (*p).array) });
        let len = self.span(s.span)?.section_pbs(s.index).len() as u16;
        let pbs = array.zip(cold).map(|(ptr, c)| ArrayRef {
            ptr,
            len,
            // SAFETY: as above, for the cold part.
            origin: c.with(|p| unsafe { (*p).origin }),
        });
        Some((section, pbs))
    }

    /// The heads of split section `s`'s free lists (`None` if it has no array).
    pub(crate) fn section_heads(&self, s: SecRef) -> Option<Heads> {
        // SAFETY: as in `section_cell_copy`.
        self.cold(s).map(|c| c.with(|p| unsafe { (*p).heads }))
    }

    /// Runs `f` on split section `s` and its heads where they lie (`None` if it has no array),
    /// for the callers that read a field or two: a copy of the whole entry costs more.
    pub(crate) fn with_split<R>(
        &self,
        s: SecRef,
        f: impl FnOnce(&Section, &Heads) -> R,
    ) -> Option<R> {
        let (cell, cold) = self.section_cells(s)?;
        let cold = cold?;
        Some(cell.with(|p| {
            cold.with(|h| {
                // SAFETY: as in `section_cell_copy`, for the cell and its cold part alike.
                let (x, heads) = unsafe { (&(*p).section, &(*h).heads) };
                f(x, heads)
            })
        }))
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

    /// Changes section `s` through `f`, with its heads if it has an array.
    pub(crate) fn update_split<R>(
        &mut self,
        s: SecRef,
        f: impl FnOnce(&mut Section, Option<&mut Heads>) -> R,
    ) -> Option<R> {
        let (cell, cold) = self.section_cells(s)?;
        Some(cell.with_mut(|p| match cold {
            Some(c) => c.with_mut(|h| {
                // SAFETY: as in `update_section`, for the cell and its cold part (a distinct
                // object) alike.
                let (x, heads) = unsafe { (&mut (*p).section, &mut (*h).heads) };
                f(x, Some(heads))
            }),
            // SAFETY: as in `update_section`.
            None => f(unsafe { &mut (*p).section }, None),
        }))
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
                origin: Origin::Hosted(slab.range),
            }),
        );
        self.update_section(s, |sec| sec.state = SectionState::Split);
        true
    }

    /// Takes section `s`'s pool array back (its pageblocks' planes must be gone already) and
    /// gives the section `state`. Edge sections keep their arrays and stay split.
    pub(crate) fn join_section(&mut self, s: SecRef, state: SectionState) {
        if let Some((_, Some(array))) = self.section_cell_copy(s)
            && !matches!(array.origin, Origin::Section | Origin::Hosted(_))
        {
            self.set_section_array(s, None);
            self.pool.put_array(array);
            self.update_section(s, |sec| sec.state = state);
        }
    }

    /// Gives section `s` the array `pbs` (its heads stay if it had one, else start empty), or
    /// takes its array away.
    ///
    /// # Panics
    /// If `pbs` holds fewer cells than the section has pageblocks (a bug: every header lookup
    /// relies on it).
    fn set_section_array(&mut self, s: SecRef, pbs: Option<ArrayRef>) {
        let (Some(span), Some((c, cold))) = (self.span(s.span), self.section_cells(s)) else {
            return;
        };
        if let Some(a) = pbs {
            assert!(
                usize::from(a.len) >= span.section_pbs(s.index).len(),
                "an array shorter than its section"
            );
        }
        match (pbs, cold) {
            // SAFETY: `&mut self` is exclusive access to the zone's metadata.
            (Some(a), Some(cold)) => cold.with_mut(|p| unsafe { (*p).origin = a.origin }),
            // SAFETY: `section_cells` checked `s.index < nsec`, so the slot lies in the span's
            // cold table; the cell has no array, so nothing refers to the slot, and `&mut self`
            // excludes every other access.
            (Some(a), None) => unsafe { open_cold(span.cold.add(s.index as usize), a.origin) },
            (None, _) => {}
        }
        // SAFETY: `&mut self` is exclusive access to the zone's metadata.
        c.with_mut(|p| unsafe { (*p).array = pbs.map(|a| a.ptr) });
    }

    fn pb_cell(&self, r: PbRef) -> Option<&UnsafeCell<PbCell>> {
        let span = self.span(r.span)?;
        if r.index >= span.pageblocks() {
            return None;
        }
        // `i` is below the section's pageblocks, as `r.index` is below the span's
        // (`locate_pb`; the test `pageblocks_locate_inside_their_sections`).
        let (s, i) = span.locate_pb(r.index);
        debug_assert!(i < span.section_pbs(s).len());
        // Only the array's pointer, not the whole cell: every header access comes through here.
        // SAFETY: as in `section_cell_copy`.
        let ptr = self
            .section_cell(SecRef {
                span: r.span,
                index: s,
            })?
            .with(|p| unsafe { (*p).array })?;
        // SAFETY: `i` is below the section's pageblocks (above), and a section's array holds an
        // initialised cell for each of them for as long as the section refers to it
        // (`SectionCell`; `set_section_array` checks the length).
        Some(unsafe { ptr.add(i).as_ref() })
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

    /// Changes the headers of the `n` pageblocks from `r` on through `f`, with one lookup of
    /// their section's array: a block's pageblocks, which lie in one section. `false`, changing
    /// nothing, if they do not (or the section is not split).
    pub(crate) fn update_pbs(
        &mut self,
        r: PbRef,
        n: u32,
        mut f: impl FnMut(&mut PbHeader),
    ) -> bool {
        match n {
            0 => return true,
            1 => return self.update_pb(r, f).is_some(),
            _ => {}
        }
        let Some(span) = self.span(r.span) else {
            return false;
        };
        let Some(last) = r.index.checked_add(n - 1) else {
            return false;
        };
        if last >= span.pageblocks() {
            return false;
        }
        // A section's pageblocks are consecutive in the span: the first and the last in one
        // section put every one between them there.
        let (s, i) = span.locate_pb(r.index);
        if span.locate_pb(last).0 != s {
            return false;
        }
        let Some(cell) = self.section_cell(SecRef {
            span: r.span,
            index: s,
        }) else {
            return false;
        };
        // SAFETY: as in `section_cell_copy`.
        let Some(ptr) = cell.with(|p| unsafe { (*p).array }) else {
            return false;
        };
        for j in 0..n as usize {
            // SAFETY: pageblock `r.index + j` lies in section `s` (checked above) at index
            // `i + j` of its array, so the cell lies in the array (as in `pb_cell`); `&mut self`
            // makes this the only access to it while `f` runs (as in `update_section`).
            unsafe { ptr.add(i + j).as_ref() }.with_mut(|p| {
                // SAFETY: as above.
                f(unsafe { &mut (*p).header });
            });
        }
        true
    }

    /// Runs `f` on the header of pageblock `r` and its allocation and extra planes (those it
    /// has), found with one lookup; `None` if its section is not split.
    #[inline]
    pub(crate) fn with_pb<R>(
        &self,
        r: PbRef,
        f: impl FnOnce(&PbHeader, Option<&Plane>, Option<&Plane>) -> R,
    ) -> Option<R> {
        let cell = self.pb_cell(r)?;
        // SAFETY: as in `section_cell_copy`: `&self` excludes writers for as long as `f` runs;
        // the planes are this zone's pool's, held by this header, distinct from the cell.
        Some(cell.with(|p| unsafe {
            let c = &*p;
            match c.planes.map(PlaneRef::get) {
                None => f(&c.header, None, None),
                Some(Planes::Single(q)) => q.as_ref().with(|a| f(&c.header, Some(&*a), None)),
                Some(Planes::Pair(q)) => q
                    .as_ref()
                    .with(|a| f(&c.header, Some(&(*a)[0]), Some(&(*a)[1]))),
            }
        }))
    }

    /// Changes the header of pageblock `r` and its planes (those it has) through `f`, found
    /// with one lookup; `None` if its section is not split.
    #[inline]
    pub(crate) fn with_pb_mut<R>(
        &mut self,
        r: PbRef,
        f: impl FnOnce(&mut PbHeader, Option<&mut Plane>, Option<&mut Plane>) -> R,
    ) -> Option<R> {
        let cell = self.pb_cell(r)?;
        // SAFETY: as in `update_section`: `&mut self` makes this the only access to the cell
        // and to the planes its handle names (this zone's pool's, distinct from the cell).
        Some(cell.with_mut(|p| unsafe {
            let c = &mut *p;
            match c.planes.map(PlaneRef::get) {
                None => f(&mut c.header, None, None),
                Some(Planes::Single(q)) => q
                    .as_ref()
                    .with_mut(|a| f(&mut c.header, Some(&mut *a), None)),
                Some(Planes::Pair(q)) => q.as_ref().with_mut(|a| {
                    let [x, y] = &mut *a;
                    f(&mut c.header, Some(x), Some(y))
                }),
            }
        }))
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
            (self.plane_ref(r).map(PlaneRef::get), which),
            (Some(_), Which::Alloc) | (Some(Planes::Pair(_)), Which::Extra)
        )
    }

    /// A copy of plane `which` of pageblock `r`.
    pub(crate) fn plane(&self, r: PbRef, which: Which) -> Option<Plane> {
        let p = self.plane_ref(r)?;
        // SAFETY: the handle is held by this zone's header and came from this zone's pool;
        // `&self` excludes writers (they take `&mut self`).
        unsafe { read_plane(p, which) }
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
            match p.get() {
                Planes::Single(q) => q.as_ref().with_mut(|c| f(&mut *c, None)),
                Planes::Pair(q) => q.as_ref().with_mut(|c| {
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
        let new = self.pool.take_planes(alloc, extra, need, r).ok_or(short)?;
        if let Some(old) = self.plane_ref(r) {
            self.pool.put_planes(old);
        }
        self.set_plane_ref(r, Some(new));
        Ok(())
    }

    /// Moves every plane and pool array in use that lies in the frames `away` (a pool
    /// pageblock's) into the pool's room elsewhere, so that the slabs there empty: the owner
    /// index names each plane's pageblock, and every section is looked at for its array. What
    /// finds no room stays where it is; the pool does not grow for it.
    pub(crate) fn move_all_out(&mut self, away: PhysRange) {
        // A move can take a slot of the slab the walk reaches next and send it to another
        // list: another pass starts from the heads again, until one moves nothing.
        while self.move_planes_pass(away) {}
        for span in 0..MAX_SPANS_PER_ZONE as u8 {
            let Some(sections) = self.span(span).map(SpanMeta::sections) else {
                continue;
            };
            for index in 0..sections {
                self.move_array_out(SecRef { span, index }, away);
            }
        }
    }

    /// What still holds slabs in the frames `away` (a pool pageblock's) once
    /// [`ZoneMeta::move_all_out`] moved what found room: [`Short::Arrays`] if a section's array
    /// lies there, else the kind of a plane in use there; `None` if nothing does.
    pub(crate) fn stuck_in(&mut self, away: PhysRange) -> Option<Short> {
        let array = (0..MAX_SPANS_PER_ZONE as u8).any(|span| {
            let sections = self.span(span).map_or(0, SpanMeta::sections);
            (0..sections).any(|index| {
                matches!(
                    self.section_cell_copy(SecRef { span, index }),
                    Some((_, Some(a))) if matches!(a.origin, Origin::Slab(x) if x.overlaps(&away))
                )
            })
        });
        if array {
            return Some(Short::Arrays);
        }
        [Short::Singles, Short::Pairs].into_iter().find(|&kind| {
            [List::Full, List::Partial].into_iter().any(|list| {
                let mut cur = *self.pool.list(kind, list);
                while let Some(h) = cur {
                    // SAFETY: the lists hold live slab heads of this pool.
                    let (next, slab) = unsafe { ((*h.as_ptr()).next, (*h.as_ptr()).slab) };
                    if slab.is_some_and(|x| x.overlaps(&away)) {
                        return true;
                    }
                    cur = next;
                }
                false
            })
        })
    }

    /// `true` if section `s` holds its own array in the frames `away`: they stay carved for
    /// good (see [`ZoneMeta::host_section`]).
    pub(crate) fn hosts_array_in(&self, s: SecRef, away: PhysRange) -> bool {
        matches!(
            self.section_cell_copy(s),
            Some((_, Some(a))) if matches!(a.origin, Origin::Hosted(x) if x.overlaps(&away))
        )
    }

    /// One walk of the plane slabs in use for [`ZoneMeta::move_all_out`]; `true` if it moved
    /// a plane.
    fn move_planes_pass(&mut self, away: PhysRange) -> bool {
        let mut moved = false;
        for kind in [Short::Singles, Short::Pairs] {
            for list in [List::Full, List::Partial] {
                let mut cur = *self.pool.list(kind, list);
                while let Some(h) = cur {
                    // SAFETY: the lists hold live slab heads of this pool.
                    let (next, used, slab) =
                        unsafe { ((*h.as_ptr()).next, (*h.as_ptr()).used, (*h.as_ptr()).slab) };
                    if slab.is_some_and(|x| x.overlaps(&away)) {
                        for i in Pool::head_slots(kind)..Pool::slots(kind) {
                            // SAFETY: slot `i` lies inside the slab's page.
                            let at = unsafe { h.cast::<u8>().add(i * Pool::slot_bytes(kind)) };
                            if used & 1 << i != 0
                                && let Some(o) = PbRef::unpack(Pool::owner(kind, at))
                            {
                                moved |= self.move_planes_out(o, away);
                            }
                        }
                    }
                    cur = next;
                }
            }
        }
        moved
    }

    /// Moves pageblock `r`'s planes out of the frames `away` if they lie there and the pool has
    /// a slot elsewhere; `true` if they moved.
    fn move_planes_out(&mut self, r: PbRef, away: PhysRange) -> bool {
        let Some(old) = self.plane_ref(r) else {
            return false;
        };
        let (kind, p) = old.slot();
        if !Pool::slab_of(p).is_some_and(|x| x.overlaps(&away)) {
            return false;
        }
        let Some(q) = self.pool.take_slot_outside(kind, away) else {
            return false;
        };
        // SAFETY: the pool just handed `q` out as a free slot of `old`'s kind, and `old` is what
        // `r`'s header holds.
        unsafe { self.repoint_planes(r, old, q) };
        true
    }

    /// Copies pageblock `r`'s planes `old` into the slot `q`, records `r` as the slot's owner,
    /// repoints `r` to it and gives the old slot back: the one place planes move.
    ///
    /// # Safety
    /// `q` must be a free slot of this pool for `old`'s kind, just handed out by it, and `old`
    /// the planes `r`'s header holds.
    unsafe fn repoint_planes(&mut self, r: PbRef, old: PlaneRef, q: NonNull<u8>) {
        let (kind, _) = old.slot();
        Pool::set_owner(kind, q, r.pack());
        // SAFETY: the caller's guarantee: `old` is held by `r`'s live header, and `q` is a free
        // slot of this pool's, sized and aligned for its kind; `&mut self` excludes every other
        // access.
        let new = unsafe {
            match old.get() {
                Planes::Single(p) => {
                    let q = q.cast::<UnsafeCell<Plane>>();
                    q.write(UnsafeCell::new(p.as_ref().with(|c| *c)));
                    PlaneRef::single(q)
                }
                Planes::Pair(p) => {
                    let q = q.cast::<UnsafeCell<[Plane; 2]>>();
                    q.write(UnsafeCell::new(p.as_ref().with(|c| *c)));
                    PlaneRef::pair(q)
                }
            }
        };
        self.set_plane_ref(r, Some(new));
        self.pool.put_planes(old);
    }

    /// Moves section `s`'s pool array out of the frames `away` if it lies there and the pool
    /// has a free array elsewhere, as [`ZoneMeta::move_planes_out`] does for planes.
    fn move_array_out(&mut self, s: SecRef, away: PhysRange) {
        let Some((_, Some(old))) = self.section_cell_copy(s) else {
            return;
        };
        if !matches!(old.origin, Origin::Slab(x) if x.overlaps(&away)) {
            return;
        }
        let Some(new) = self.pool.pop_array(Some(away)) else {
            return;
        };
        // SAFETY: the pool just handed `new` out, and `old` is what `s`'s entry holds.
        unsafe { self.repoint_array(s, old, new) };
    }

    /// Copies section `s`'s array `old` into the free array `new` (with its slab), repoints
    /// the section to it and gives the old one back: the one place arrays move.
    ///
    /// # Safety
    /// `new` must be a free array of this pool, just handed out by it, and `old` the array
    /// `s`'s entry holds.
    unsafe fn repoint_array(
        &mut self,
        s: SecRef,
        old: ArrayRef,
        (a, slab): (NonNull<FreeArray>, Option<PhysRange>),
    ) {
        let ptr = a.cast::<UnsafeCell<PbCell>>();
        for i in 0..usize::from(old.len) {
            // SAFETY: the caller's guarantee: the old array holds `len` live cells and the new
            // one, ours now, room for as many (`ARRAY_BYTES`); `&mut self` excludes every other
            // access.
            unsafe {
                let (header, planes) = old.ptr.add(i).as_ref().with(|c| ((*c).header, (*c).planes));
                ptr.add(i).write(UnsafeCell::new(PbCell { header, planes }));
            }
        }
        self.set_section_array(
            s,
            Some(ArrayRef {
                ptr,
                len: old.len,
                origin: slab.map_or(Origin::Seed, Origin::Slab),
            }),
        );
        self.pool.put_array(old);
    }

    /// `true` if the owner index agrees with pageblock `r`'s planes: it has none, or they sit
    /// in a slot in use of a slab of their kind whose owner is `r`.
    pub(crate) fn owner_agrees(&self, r: PbRef) -> bool {
        let Some(p) = self.plane_ref(r) else {
            return true;
        };
        let (kind, slot) = p.slot();
        let (head, i) = Pool::head_of(kind, slot);
        // SAFETY: `head` heads the live slab the pageblock's planes lie in; `&self` excludes
        // writers.
        let used = unsafe { (*head.as_ptr()).used };
        i >= Pool::head_slots(kind) && used & 1 << i != 0 && Pool::owner(kind, slot) == r.pack()
    }

    /// `true` if every plane slot in use of the slabs on the pool's lists names an owner
    /// whose planes are that slot, and every free one names none.
    pub(crate) fn owners_consistent(&self) -> bool {
        [Short::Singles, Short::Pairs].into_iter().all(|kind| {
            let s = match kind {
                Short::Pairs => &self.pool.pairs,
                Short::Singles | Short::Arrays => &self.pool.singles,
            };
            [s.seeds, s.partial, s.empty, s.full, s.quarantine]
                .into_iter()
                .all(|list| self.slabs_agree(kind, list))
        })
    }

    /// [`ZoneMeta::owners_consistent`] for the plane slabs of `kind` linked from `head`.
    fn slabs_agree(&self, kind: Short, mut cur: Option<NonNull<SlabHead>>) -> bool {
        while let Some(h) = cur {
            // SAFETY: the pool's lists hold live slab heads; `&self` excludes writers.
            let (next, used) = unsafe { ((*h.as_ptr()).next, (*h.as_ptr()).used) };
            for i in Pool::head_slots(kind)..Pool::slots(kind) {
                // SAFETY: slot `i` lies inside the slab's page.
                let slot = unsafe { h.cast::<u8>().add(i * Pool::slot_bytes(kind)) };
                let owner = Pool::owner(kind, slot);
                let ok = if used & 1 << i == 0 {
                    owner == NIL
                } else {
                    PbRef::unpack(owner)
                        .and_then(|o| self.plane_ref(o))
                        .is_some_and(|p| p.slot() == (kind, slot))
                };
                if !ok {
                    return false;
                }
            }
            cur = next;
        }
        true
    }

    /// Swaps the planes of pageblocks `a` and `b` behind the owner index's back: for tests of
    /// the invariant walk.
    #[cfg(test)]
    pub(crate) fn swap_planes(&mut self, a: PbRef, b: PbRef) {
        let (pa, pb) = (self.plane_ref(a), self.plane_ref(b));
        self.set_plane_ref(a, pb);
        self.set_plane_ref(b, pa);
    }

    /// Takes pageblock `r`'s planes back into the pool.
    pub(crate) fn drop_planes(&mut self, r: PbRef) {
        if let Some(old) = self.plane_ref(r) {
            self.set_plane_ref(r, None);
            self.pool.put_planes(old);
        }
    }
}

/// The metadata memory a span takes with it when it leaves its zone: the pool slabs carved
/// from its frames (known by their frames) and the seed slabs of its region (known by their
/// addresses).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Away {
    frames: PhysRange,
    seed: (usize, usize),
}

impl Away {
    /// `true` if a slab of the frames `slab` (`None`: a seed), mapped at `at`, lies in this
    /// memory.
    fn holds(&self, slab: Option<PhysRange>, at: NonNull<u8>) -> bool {
        match slab {
            Some(r) => r.overlaps(&self.frames),
            None => (self.seed.0..self.seed.1).contains(&at.as_ptr().addr()),
        }
    }
}

impl SpanMeta {
    /// The metadata memory the span takes with it when it leaves its zone.
    pub(crate) fn away(&self) -> Away {
        let end = self.sections.as_ptr().addr();
        Away {
            frames: self.range,
            seed: (end - seed_bytes() as usize, end),
        }
    }

    /// Where the span's region is mapped: the seed comes first in it, then the section table.
    fn region_at(&self) -> NonNull<u8> {
        // SAFETY: `map` put the section table `seed_bytes()` into the mapped region.
        unsafe { self.sections.cast::<u8>().sub(seed_bytes() as usize) }
    }
}

/// The memory a span left its zone with, for the machine to unmap with no lock held: its
/// region, and the slabs of its frames the pool held (and the arrays of its sections that held
/// their own), linked through their own first words, which nothing else reaches any more.
#[derive(Debug)]
pub(crate) struct Leaving {
    /// The span's region, and where it is mapped.
    pub(crate) region: (PhysRange, NonNull<u8>),
    head: Option<NonNull<Retired>>,
}

// SAFETY: the list's memory is reached only through this value.
unsafe impl Send for Leaving {}

impl Leaving {
    /// Links the slab `slab`, mapped at `at`.
    ///
    /// # Safety
    /// `at` must be the mapping of `slab` (at least a `Retired`'s bytes, aligned for it), and
    /// nothing may use that memory any more.
    unsafe fn push(&mut self, at: NonNull<u8>, slab: PhysRange) {
        let r = at.cast::<Retired>();
        // SAFETY: the caller's guarantee.
        unsafe {
            r.write(Retired {
                next: self.head,
                slab,
            })
        };
        self.head = Some(r);
    }

    /// The next slab to unmap, and where it is mapped.
    pub(crate) fn pop(&mut self) -> Option<(PhysRange, NonNull<u8>)> {
        let r = self.head?;
        // SAFETY: `push` wrote a `Retired` there, in memory only this list reaches.
        let Retired { next, slab } = unsafe { r.read() };
        self.head = next;
        Some((slab, r.cast()))
    }
}

impl Pool {
    /// `true` if a slab of the frames `slab` (`None`: a seed), mapped at `at`, lies in the
    /// memory of a span going offline.
    fn away_holds(&self, slab: Option<PhysRange>, at: NonNull<u8>) -> bool {
        self.avoiding && self.away.iter().flatten().any(|a| a.holds(slab, at))
    }

    /// Takes the metadata memory `away` out of service while its span goes offline: its plane
    /// slabs move to the quarantine lists and its free arrays to theirs, none of their free
    /// objects counts or serves any more, and objects given back into it stay there. Objects
    /// in use there stay until [`ZoneMeta::evacuate`] moves them out.
    pub(crate) fn quarantine(&mut self, away: Away) {
        if !self.away.contains(&Some(away))
            && let Some(slot) = self.away.iter_mut().find(|a| a.is_none())
        {
            *slot = Some(away);
        }
        self.avoiding = self.away.iter().any(Option::is_some);
        self.sweep();
    }

    /// Moves every listed slab and free array that lies in `away` memory to the quarantine.
    fn sweep(&mut self) {
        for kind in [Short::Singles, Short::Pairs] {
            for list in [List::Seeds, List::Partial, List::Empty, List::Full] {
                let mut cur = *self.list(kind, list);
                while let Some(h) = cur {
                    // SAFETY: the lists hold live slab heads of this pool.
                    let (next, used, slab) =
                        unsafe { ((*h.as_ptr()).next, (*h.as_ptr()).used, (*h.as_ptr()).slab) };
                    if self.away_holds(slab, h.cast()) {
                        self.unlink(kind, list, h);
                        self.link(kind, List::Quarantine, h);
                        self.slabs(kind).free -=
                            Self::slots(kind) as u64 - u64::from(used.count_ones());
                    }
                    cur = next;
                }
            }
        }
        for list in 0..2 {
            while let Some((a, slab)) = self.pop_held_array(list) {
                // SAFETY: the array just left its free list, and nothing uses it.
                unsafe { self.quarantine_array(a, slab) };
            }
        }
    }

    /// Unlinks a free array of list `list` (seeds, the zone's) lying in `away` memory.
    fn pop_held_array(&mut self, list: usize) -> Option<(NonNull<FreeArray>, Option<PhysRange>)> {
        let mut link: *mut Option<NonNull<FreeArray>> = &mut self.arrays[list];
        // SAFETY: `link` is a list head of this pool or the link word of a free array on it
        // (written by `push_array`); nothing else reaches them.
        while let Some(a) = unsafe { *link } {
            // SAFETY: as above.
            let FreeArray { next, slab } = unsafe { a.read() };
            if self.away_holds(slab, a.cast()) {
                // SAFETY: as above.
                unsafe { *link = next };
                self.free_arrays -= 1;
                return Some((a, slab));
            }
            // SAFETY: as above; the link word is the first field of the array.
            link = unsafe { &raw mut (*a.as_ptr()).next };
        }
        None
    }

    /// Links a free array lying in `away` memory on the quarantine.
    ///
    /// # Safety
    /// `a` must be an array of this pool that nothing uses and no list holds.
    unsafe fn quarantine_array(&mut self, a: NonNull<FreeArray>, slab: Option<PhysRange>) {
        // SAFETY: the caller's guarantee; an array is larger than its link.
        unsafe {
            a.write(FreeArray {
                next: self.q_arrays,
                slab,
            })
        };
        self.q_arrays = Some(a);
    }

    /// Forgets `away`, and puts what no other entry holds back in service.
    fn unavoid(&mut self, away: Away) {
        for a in &mut self.away {
            if *a == Some(away) {
                *a = None;
            }
        }
        self.avoiding = self.away.iter().any(Option::is_some);
    }

    /// Puts `away` memory back in service (its span stays after all): its slabs go back to the
    /// lists their shapes call for, its free arrays to theirs.
    pub(crate) fn release(&mut self, away: Away) {
        self.unavoid(away);
        for kind in [Short::Singles, Short::Pairs] {
            let mut cur = self.slabs(kind).quarantine;
            while let Some(h) = cur {
                // SAFETY: the quarantine lists hold live slab heads of this pool.
                let (next, used, slab) =
                    unsafe { ((*h.as_ptr()).next, (*h.as_ptr()).used, (*h.as_ptr()).slab) };
                if !self.away_holds(slab, h.cast()) {
                    self.unlink(kind, List::Quarantine, h);
                    let list = if slab.is_none() {
                        List::Seeds
                    } else if used == Self::head_mask(kind) {
                        List::Empty
                    } else if used == Self::full(kind) {
                        List::Full
                    } else {
                        List::Partial
                    };
                    self.link(kind, list, h);
                    self.slabs(kind).free +=
                        Self::slots(kind) as u64 - u64::from(used.count_ones());
                }
                cur = next;
            }
        }
        let mut cur = self.q_arrays.take();
        while let Some(a) = cur {
            // SAFETY: the quarantine's free arrays, linked by `quarantine_array`.
            let FreeArray { next, slab } = unsafe { a.read() };
            // SAFETY: each leaves the list it was on before it is relinked.
            unsafe {
                if self.away_holds(slab, a.cast()) {
                    self.quarantine_array(a, slab);
                } else {
                    self.push_array(a, slab);
                }
            }
            cur = next;
        }
    }

    /// `true` if some plane slab lying in `away` memory still holds a plane.
    fn holds_planes(&self, away: Away) -> bool {
        [&self.singles, &self.pairs]
            .into_iter()
            .zip([Short::Singles, Short::Pairs])
            .any(|(s, kind)| {
                let mut cur = s.quarantine;
                while let Some(h) = cur {
                    // SAFETY: the quarantine lists hold live slab heads; `&self` excludes
                    // writers.
                    let x = unsafe { h.as_ref() };
                    if away.holds(x.slab, h.cast()) && x.used != Self::head_mask(kind) {
                        return true;
                    }
                    cur = x.next;
                }
                false
            })
    }

    /// Takes `away` memory out of the pool for good, none of it in use: its slabs and free
    /// arrays of the zone's frames, and the retired ones waiting to be taken back, go onto
    /// `out` for the caller to unmap; its seeds are forgotten (they leave with the region).
    fn leave(&mut self, away: Away, out: &mut Leaving) {
        self.unavoid(away);
        self.forget_seeds(away);
        for kind in [Short::Singles, Short::Pairs] {
            let mut cur = self.slabs(kind).quarantine;
            while let Some(h) = cur {
                // SAFETY: the quarantine lists hold live slab heads of this pool.
                let (next, slab) = unsafe { ((*h.as_ptr()).next, (*h.as_ptr()).slab) };
                if away.holds(slab, h.cast()) {
                    self.unlink(kind, List::Quarantine, h);
                    if let Some(r) = slab {
                        self.bytes -= r.bytes();
                        // SAFETY: the slab is mapped at its head, holds nothing, and no list
                        // reaches it any more.
                        unsafe { out.push(h.cast(), r) };
                    }
                }
                cur = next;
            }
        }
        let mut cur = self.q_arrays.take();
        while let Some(a) = cur {
            // SAFETY: the quarantine's free arrays, linked by `quarantine_array`.
            let FreeArray { next, slab } = unsafe { a.read() };
            // SAFETY: each leaves the list it was on before it is relinked or handed out; a
            // free array is mapped at its start.
            unsafe {
                match slab {
                    _ if !away.holds(slab, a.cast()) => self.quarantine_array(a, slab),
                    Some(r) => {
                        self.bytes -= r.bytes();
                        out.push(a.cast(), r);
                    }
                    None => {}
                }
            }
            cur = next;
        }
        let mut link: *mut Option<NonNull<Retired>> = &mut self.retired;
        // SAFETY: `link` is the head of the retired list or the link word of a slab on it
        // (written by `retire`); nothing else reaches them.
        while let Some(r) = unsafe { *link } {
            // SAFETY: as above.
            let Retired { next, slab } = unsafe { r.read() };
            if slab.overlaps(&away.frames) {
                // SAFETY: as above; it leaves the retired list before it joins `out`.
                unsafe {
                    *link = next;
                    out.push(r.cast(), slab);
                }
            } else {
                // SAFETY: as above; the link word is the first field of the slab.
                link = unsafe { &raw mut (*r.as_ptr()).next };
            }
        }
    }
}

impl ZoneMeta {
    /// Takes the metadata memory of the span in `slot` out of service (see
    /// [`Pool::quarantine`]).
    pub(crate) fn quarantine(&mut self, slot: u8) {
        if let Some(away) = self.span(slot).map(SpanMeta::away) {
            self.pool.quarantine(away);
        }
    }

    /// Puts the metadata memory of the span in `slot` back in service.
    pub(crate) fn release_quarantine(&mut self, slot: u8) {
        if let Some(away) = self.span(slot).map(SpanMeta::away) {
            self.pool.release(away);
        }
    }

    /// Moves every plane and array in use that lies in the metadata memory of the span in
    /// `slot` (its quarantined slabs) and describes the pageblocks of a span staying in the
    /// zone out, into memory in service: the owner index names each plane's pageblock, and the
    /// sections of the other spans are looked at for arrays. The spans of mask `leaving`
    /// (`slot` among them) leave with it, so their planes and arrays stay: they go back to the
    /// pool before any of that memory leaves (see [`FreeArea::remove_spans`]). `Err` names
    /// what the pool is short of; what moved stays moved, so the caller grows the pool and
    /// calls again.
    ///
    /// [`FreeArea::remove_spans`]: crate::buddy::FreeArea::remove_spans
    pub(crate) fn evacuate(&mut self, slot: u8, leaving: u32) -> Result<(), Short> {
        let away = self.span(slot).ok_or(Short::Singles)?.away();
        for kind in [Short::Singles, Short::Pairs] {
            let mut cur = *self.pool.list(kind, List::Quarantine);
            while let Some(h) = cur {
                // SAFETY: the quarantine lists hold live slab heads of this pool.
                let (next, used, slab) =
                    unsafe { ((*h.as_ptr()).next, (*h.as_ptr()).used, (*h.as_ptr()).slab) };
                if away.holds(slab, h.cast()) {
                    for i in Pool::head_slots(kind)..Pool::slots(kind) {
                        // SAFETY: slot `i` lies inside the slab's page.
                        let at = unsafe { h.cast::<u8>().add(i * Pool::slot_bytes(kind)) };
                        if used & 1 << i != 0
                            && let Some(o) = PbRef::unpack(Pool::owner(kind, at))
                            && !in_mask(leaving, o.span)
                        {
                            self.relocate_planes(o)?;
                        }
                    }
                }
                cur = next;
            }
        }
        for (other, nsec) in self.other_spans(slot) {
            if in_mask(leaving, other) {
                continue;
            }
            for index in 0..nsec {
                let s = SecRef { span: other, index };
                if let Some((_, Some(a))) = self.section_cell_copy(s) {
                    let slab = match a.origin {
                        Origin::Seed => None,
                        Origin::Slab(r) => Some(r),
                        Origin::Section | Origin::Hosted(_) => continue,
                    };
                    if away.holds(slab, a.ptr.cast()) {
                        self.relocate_array(s)?;
                    }
                }
            }
        }
        Ok(())
    }

    /// `true` if a section of a span outside mask `except` has a pool array lying in `away`
    /// memory.
    fn arrays_in(&self, away: Away, except: u32) -> bool {
        self.spans()
            .filter(|(i, _)| !in_mask(except, *i))
            .any(|(i, span)| {
                (0..span.sections()).any(|index| {
                    match self.section_cell_copy(SecRef { span: i, index }) {
                        Some((_, Some(a))) => match a.origin {
                            Origin::Seed => away.holds(None, a.ptr.cast()),
                            Origin::Slab(r) => away.holds(Some(r), a.ptr.cast()),
                            Origin::Section | Origin::Hosted(_) => false,
                        },
                        _ => false,
                    }
                })
            })
    }

    /// `true` if nothing of a span staying in the zone is left in the metadata memory of the
    /// span in `slot`: every plane in its slabs is a pageblock's of a span of mask `leaving`
    /// (`slot` among them), and no other span's section has its array there (what
    /// [`ZoneMeta::evacuate`] achieves).
    pub(crate) fn evacuated(&self, slot: u8, leaving: u32) -> bool {
        let Some(away) = self.span(slot).map(SpanMeta::away) else {
            return false;
        };
        let planes = [
            (&self.pool.singles, Short::Singles),
            (&self.pool.pairs, Short::Pairs),
        ]
        .into_iter()
        .all(|(s, kind)| {
            let mut cur = s.quarantine;
            while let Some(h) = cur {
                // SAFETY: the quarantine lists hold live slab heads; `&self` excludes
                // writers.
                let x = unsafe { h.as_ref() };
                if away.holds(x.slab, h.cast()) {
                    for i in Pool::head_slots(kind)..Pool::slots(kind) {
                        // SAFETY: slot `i` lies inside the slab's page.
                        let at = unsafe { h.cast::<u8>().add(i * Pool::slot_bytes(kind)) };
                        if x.used & 1 << i != 0
                            && PbRef::unpack(Pool::owner(kind, at))
                                .is_none_or(|o| !in_mask(leaving, o.span))
                        {
                            return false;
                        }
                    }
                }
                cur = x.next;
            }
            true
        });
        planes && !self.arrays_in(away, leaving)
    }

    /// The planes and arrays of other spans lying in the metadata memory of the span in
    /// `slot` (its seed and the slabs of its frames), quarantined or not: for tests that
    /// offlining moves some.
    #[cfg(test)]
    pub(crate) fn foreign_objects(&self, slot: u8) -> usize {
        let Some(away) = self.span(slot).map(SpanMeta::away) else {
            return 0;
        };
        let mut n = 0;
        for (i, span) in self.spans().filter(|(i, _)| *i != slot) {
            for pb in 0..span.pageblocks() {
                let r = PbRef { span: i, index: pb };
                if let Some(p) = self.plane_ref(r) {
                    let (kind, at) = p.slot();
                    let (head, _) = Pool::head_of(kind, at);
                    // SAFETY: the head of the live slab `r`'s planes lie in.
                    let slab = unsafe { (*head.as_ptr()).slab };
                    n += usize::from(away.holds(slab, head.cast()));
                }
            }
            for index in 0..span.sections() {
                if let Some((_, Some(a))) = self.section_cell_copy(SecRef { span: i, index }) {
                    let slab = match a.origin {
                        Origin::Seed => None,
                        Origin::Slab(r) => Some(r),
                        Origin::Section | Origin::Hosted(_) => continue,
                    };
                    n += usize::from(away.holds(slab, a.ptr.cast()));
                }
            }
        }
        n
    }

    /// `true` if the metadata memory of the span in `slot` is out of service.
    pub(crate) fn quarantined(&self, slot: u8) -> bool {
        self.span(slot)
            .is_some_and(|s| self.pool.away.contains(&Some(s.away())))
    }

    /// How many spans' metadata memory is out of service.
    pub(crate) fn quarantined_spans(&self) -> usize {
        self.pool.away.iter().flatten().count()
    }

    /// Calls `f` with the frames of every slab of the zone's frames the pool knows of: plane
    /// slabs on any list, free arrays, retired slabs, and the pool arrays and arrays of their
    /// own memory that sections hold.
    pub(crate) fn for_each_slab(&self, mut f: impl FnMut(PhysRange)) {
        for s in [&self.pool.singles, &self.pool.pairs] {
            for mut cur in [s.seeds, s.partial, s.empty, s.full, s.quarantine] {
                while let Some(h) = cur {
                    // SAFETY: the pool's lists hold live slab heads; `&self` excludes writers.
                    let x = unsafe { h.as_ref() };
                    if let Some(r) = x.slab {
                        f(r);
                    }
                    cur = x.next;
                }
            }
        }
        for mut cur in [
            self.pool.arrays[SEED_ARRAYS],
            self.pool.arrays[ZONE_ARRAYS],
            self.pool.q_arrays,
        ] {
            while let Some(a) = cur {
                // SAFETY: free arrays of this pool, linked by `push_array` or
                // `quarantine_array`.
                let x = unsafe { a.as_ref() };
                if let Some(r) = x.slab {
                    f(r);
                }
                cur = x.next;
            }
        }
        let mut cur = self.pool.retired;
        while let Some(r) = cur {
            // SAFETY: retired slabs of this pool, linked by `retire`.
            let x = unsafe { r.as_ref() };
            f(x.slab);
            cur = x.next;
        }
        for (i, span) in self.spans() {
            for index in 0..span.sections() {
                if let Some((_, Some(a))) = self.section_cell_copy(SecRef { span: i, index })
                    && let Origin::Slab(r) | Origin::Hosted(r) = a.origin
                {
                    f(r);
                }
            }
        }
    }

    /// The slots of the spans but `slot`, with their section counts.
    fn other_spans(&self, slot: u8) -> [(u8, u32); MAX_SPANS_PER_ZONE] {
        let mut out = [(0, 0); MAX_SPANS_PER_ZONE];
        for (o, (i, span)) in out.iter_mut().zip(self.spans().filter(|(i, _)| *i != slot)) {
            *o = (i, span.sections());
        }
        out
    }

    /// Moves pageblock `r`'s planes into a slot in service; `Err` if the pool has none to spare.
    fn relocate_planes(&mut self, r: PbRef) -> Result<(), Short> {
        let Some(old) = self.plane_ref(r) else {
            return Ok(());
        };
        let (kind, _) = old.slot();
        let q = self.pool.take_slot(kind, Need::Normal).ok_or(kind)?;
        // SAFETY: the pool just handed `q` out as a free slot of `old`'s kind, and `old` is what
        // `r`'s header holds.
        unsafe { self.repoint_planes(r, old, q) };
        Ok(())
    }

    /// Moves section `s`'s array into a free array in service; `Err` if the pool has none.
    fn relocate_array(&mut self, s: SecRef) -> Result<(), Short> {
        let Some((_, Some(old))) = self.section_cell_copy(s) else {
            return Ok(());
        };
        let new = self.pool.pop_array(None).ok_or(Short::Arrays)?;
        // SAFETY: the pool just handed `new` out, and `old` is what `s`'s entry holds.
        unsafe { self.repoint_array(s, old, new) };
        Ok(())
    }

    /// Gives section `s`'s pool array back (its pageblocks must have no planes any more),
    /// leaving the section without one; an array of its own memory stays with it.
    pub(crate) fn drop_array(&mut self, s: SecRef) {
        if let Some((_, Some(array))) = self.section_cell_copy(s)
            && matches!(array.origin, Origin::Seed | Origin::Slab(_))
        {
            self.set_section_array(s, None);
            self.pool.put_array(array);
        }
    }

    /// Removes the span in `slot` and its metadata memory from the zone, once nothing of it is
    /// in use: no other span's planes or arrays lie in it ([`ZoneMeta::evacuate`]) and its own
    /// pageblocks' planes and its sections' pool arrays went back ([`ZoneMeta::drop_planes`],
    /// [`ZoneMeta::drop_array`]). Returns the memory to unmap; `None` (changing nothing) if
    /// some of it is still in use.
    pub(crate) fn remove(&mut self, slot: u8) -> Option<Leaving> {
        let span = *self.span(slot)?;
        let away = span.away();
        if self.pool.holds_planes(away) || self.arrays_in(away, 0) {
            return None;
        }
        let mut out = Leaving {
            region: (span.region, span.region_at()),
            head: None,
        };
        for index in 0..span.sections() {
            if let Some((_, Some(a))) = self.section_cell_copy(SecRef { span: slot, index })
                && let Origin::Hosted(r) = a.origin
            {
                self.pool.bytes -= r.bytes();
                // SAFETY: a hosted array is mapped at its start, and its section, whose
                // memory it describes, leaves with the span: nothing uses it any more.
                unsafe { out.push(a.ptr.cast(), r) };
            }
        }
        self.pool.leave(away, &mut out);
        self.spans[usize::from(slot)] = None;
        Some(out)
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::alloc::{Layout, alloc_zeroed, dealloc};
    use std::vec::Vec;

    use super::*;

    /// Every span slot a zone has, with the largest index a span can reach (a span just under
    /// 2^36 frames, starting and ending inside pageblocks), survives a list link and is never
    /// taken for its end.
    #[test]
    fn links_of_every_span_slot_round_trip() {
        let largest = ((1u64 << SPAN_LIMIT_SHIFT) - 1).div_ceil(FRAMES as u64) + 1;
        for span in 0..MAX_SPANS_PER_ZONE as u8 {
            for index in [0, 1, u32::try_from(largest).unwrap()] {
                let pb = PbRef { span, index };
                assert_ne!(pb.pack(), NIL);
                assert_eq!(PbRef::unpack(pb.pack()), Some(pb));
                let sec = SecRef { span, index };
                assert_ne!(sec.pack(), NIL);
                assert_eq!(SecRef::unpack(sec.pack()), Some(sec));
            }
        }
    }

    /// Page-aligned memory standing in for mapped slabs, freed on drop.
    struct Pages {
        ptr: NonNull<u8>,
        layout: Layout,
    }

    impl Pages {
        fn new(pages: usize) -> Pages {
            let layout =
                Layout::from_size_align(pages * PAGE_SIZE as usize, PAGE_SIZE as usize).unwrap();
            // SAFETY: the layout is not zero-sized.
            let ptr = NonNull::new(unsafe { alloc_zeroed(layout) }).unwrap();
            Pages { ptr, layout }
        }

        fn page(&self, i: usize) -> NonNull<u8> {
            // SAFETY: the tests ask only for pages inside the allocation.
            unsafe { self.ptr.add(i * PAGE_SIZE as usize) }
        }

        fn bytes(&self) -> &[u8] {
            // SAFETY: the allocation is initialised (zeroed at first) and live.
            unsafe { core::slice::from_raw_parts(self.ptr.as_ptr(), self.layout.size()) }
        }
    }

    impl Drop for Pages {
        fn drop(&mut self) {
            // SAFETY: allocated with this layout in `new`.
            unsafe { dealloc(self.ptr.as_ptr(), self.layout) };
        }
    }

    fn frames(start: u64, n: u64) -> PhysRange {
        PhysRange::new(Pfn::new(start), Pfn::new(start + n)).unwrap()
    }

    /// The number word docs/architecture.md writes right after `phrase` ("one" to "eight").
    fn doc_number(phrase: &str) -> u64 {
        let doc = include_str!("../../docs/architecture.md").replace("\n  ", " ");
        let at = doc
            .find(phrase)
            .unwrap_or_else(|| panic!("{phrase:?} not in the doc"))
            + phrase.len();
        let word = doc[at..]
            .split(|c: char| !c.is_ascii_alphabetic())
            .next()
            .unwrap();
        let words = [
            "one", "two", "three", "four", "five", "six", "seven", "eight",
        ];
        words
            .iter()
            .position(|w| *w == word)
            .unwrap_or_else(|| panic!("{word:?}")) as u64
            + 1
    }

    /// docs/architecture.md, "Where the metadata comes from": a pool pageblock's plane marks the
    /// frames its slabs use, "a plane slab is one frame, an array slab" as many as the pages of
    /// an array of a cell per pageblock of a section.
    #[test]
    fn the_architecture_doc_gives_the_frames_of_each_slab() {
        assert_eq!(
            doc_number("a plane slab is "),
            Pool::slab_frames(Short::Singles)
        );
        assert_eq!(
            doc_number("a plane slab is "),
            Pool::slab_frames(Short::Pairs)
        );
        let array_pages = (PBS_PER_SECTION * size_of::<PbCell>()) as u64 / PAGE_SIZE;
        assert_eq!(doc_number("an array slab "), array_pages);
        assert_eq!(Pool::slab_frames(Short::Arrays), array_pages);
    }

    /// docs/architecture.md, "Budget": "a fixed region of about N KiB per span (the pool's
    /// seed, room for two edge arrays)": what a span's region holds besides its section
    /// tables, and what boot carves for a one-section span.
    #[test]
    fn the_architecture_doc_gives_the_fixed_region_of_a_span() {
        let doc = include_str!("../../docs/architecture.md").replace("\n  ", " ");
        let phrase = "a fixed region of about ";
        let at = doc.find(phrase).expect("the budget's region line") + phrase.len();
        let kib: u64 = doc[at..].split(' ').next().unwrap().parse().unwrap();
        // One slab of each kind (an array, a page of single planes, a page of pairs), and a
        // cell for each pageblock of two edge sections.
        let array = (PBS_PER_SECTION * size_of::<PbCell>()) as u64;
        let fixed = array + 2 * PAGE_SIZE + 2 * array;
        assert_eq!(kib, fixed >> 10);
        let one_section = frames(1 << 18, 1 << 18);
        let carved = region_bytes_bound(one_section).div_ceil(PAGE_SIZE) * PAGE_SIZE;
        assert!(
            (kib << 10..=(kib + 4) << 10).contains(&carved),
            "{carved} bytes carved for one section"
        );
    }

    /// Lays a span over `range` out in `mem`, its region at 8 GiB.
    fn map_span(mem: &crate::test_util::SparseMem, range: PhysRange) -> (SpanMeta, Seed) {
        let region = frames(8 << 18, region_bytes(range).div_ceil(PAGE_SIZE));
        SpanMeta::map(mem, range, region).unwrap()
    }

    fn retired(pool: &mut Pool) -> Vec<PhysRange> {
        pool.retire_spare();
        core::iter::from_fn(|| pool.pop_retired().map(|(r, _)| r)).collect()
    }

    #[test]
    fn wholly_free_plane_slabs_of_the_zone_are_retired_and_seeds_stay() {
        let seed_pages = (seed_bytes() / PAGE_SIZE) as usize;
        let mem = Pages::new(seed_pages + 3);
        let mut pool = Pool::default();
        // The first pages are a seed; the three after it slabs of frames 101..104.
        // SAFETY: the pages are page aligned, ours, and used by nothing else.
        assert!(unsafe { pool.add_seed(mem.page(0)) });
        for i in 1..4 {
            let at = mem.page(seed_pages + i - 1);
            // SAFETY: as above.
            unsafe { pool.add_raw(Short::Singles, at, Some(frames(100 + i as u64, 1))) };
        }
        pool.bytes = 3 * PAGE_SIZE;
        let per = Pool::per_slab(Short::Singles);
        let mut taken = Vec::new();
        let owner = PbRef { span: 0, index: 7 };
        while let Some(p) = pool.take_planes(Plane::FULL, None, Need::Growth, owner) {
            taken.push(p);
        }
        assert_eq!(taken.len() as u64, 4 * per);
        assert!(pool.consistent() && pool.low(Short::Singles));
        assert!(retired(&mut pool).is_empty());
        for p in taken {
            pool.put_planes(p);
        }
        let gone = retired(&mut pool);
        // The seed never goes; of the zone's three slabs, at most one stays for the next
        // growth.
        assert!(gone.len() >= 2, "{gone:?}");
        for r in &gone {
            assert!((101..104).contains(&r.start().get()) && r.frames() == 1);
        }
        assert_eq!(pool.bytes, (3 - gone.len() as u64) * PAGE_SIZE);
        assert!(pool.consistent());
        // What is left serves again, and the retired pages were zeroed.
        let left = 4 - gone.len() as u64;
        assert_eq!(pool.singles.free, left * per);
        for r in &gone {
            let i = (seed_pages + (r.start().get() - 101) as usize) * PAGE_SIZE as usize;
            assert!(
                mem.bytes()[i..i + PAGE_SIZE as usize]
                    .iter()
                    .all(|&b| b == 0)
            );
        }
    }

    #[test]
    fn the_owner_index_names_each_slot_s_pageblock_until_it_is_given_back() {
        let mem = Pages::new(2);
        let mut pool = Pool::default();
        // SAFETY: two pages, page aligned, ours alone: a zone slab of each plane kind.
        unsafe {
            pool.add_raw(Short::Singles, mem.page(0), Some(frames(300, 1)));
            pool.add_raw(Short::Pairs, mem.page(1), Some(frames(301, 1)));
        }
        pool.bytes = 2 * PAGE_SIZE;
        let (singles, pairs) = (Pool::per_slab(Short::Singles), Pool::per_slab(Short::Pairs));
        // The head and its index take a few slots, no more.
        assert_eq!(Pool::slots(Short::Singles) as u64 - singles, 5);
        assert_eq!(Pool::slots(Short::Pairs) as u64 - pairs, 2);
        let owner = |i: u32| PbRef {
            span: (i % 3) as u8,
            index: 1000 + i,
        };
        let mut taken = Vec::new();
        for i in 0..singles as u32 {
            let p = pool
                .take_planes(Plane::EMPTY, None, Need::Growth, owner(i))
                .unwrap();
            let (kind, slot) = p.slot();
            assert_eq!(Pool::owner(kind, slot), owner(i).pack());
            taken.push((p, owner(i)));
        }
        // The slab is full: off the partial list, on the full one, and nothing is free.
        assert!(pool.singles.partial.is_none() && pool.singles.full.is_some());
        assert!(pool.consistent());
        let q = pool
            .take_planes(Plane::EMPTY, Some(Plane::FULL), Need::Growth, owner(99))
            .unwrap();
        assert_eq!(q.slot().0, Short::Pairs);
        assert_eq!(Pool::owner(Short::Pairs, q.slot().1), owner(99).pack());
        // Every slot names its own owner, distinct slots for distinct owners.
        let mut slots: Vec<_> = taken.iter().map(|(p, _)| p.slot().1).collect();
        slots.sort();
        slots.dedup();
        assert_eq!(slots.len(), taken.len());
        let (first, _) = taken.remove(0);
        pool.put_planes(first);
        assert_eq!(Pool::owner(Short::Singles, first.slot().1), NIL);
        assert!(pool.singles.full.is_none() && pool.singles.partial.is_some());
        for (p, o) in &taken {
            assert_eq!(Pool::owner(Short::Singles, p.slot().1), o.pack());
        }
        for (p, _) in taken {
            pool.put_planes(p);
        }
        pool.put_planes(q);
        assert!(pool.singles.empty.is_some() && pool.pairs.empty.is_some());
        assert_eq!(pool.singles.free, singles);
        assert!(pool.consistent());
    }

    #[test]
    fn a_zone_array_is_retired_once_the_pool_keeps_another() {
        let mem = Pages::new(16);
        let mut pool = Pool::default();
        let slab = |i: u64| Some(frames(200 + 8 * i, 8));
        // SAFETY: two runs of 8 pages, page aligned, ours alone.
        unsafe {
            pool.add_raw(Short::Arrays, mem.page(0), slab(0));
            pool.add_raw(Short::Arrays, mem.page(8), slab(1));
        }
        pool.bytes = 16 * PAGE_SIZE;
        let a = pool.take_array(Need::Normal).unwrap();
        let b = pool.take_array(Need::Normal).unwrap();
        assert!(pool.take_array(Need::Normal).is_none());
        pool.put_array(a);
        assert!(retired(&mut pool).is_empty(), "the first one back is kept");
        pool.put_array(b);
        let gone = retired(&mut pool);
        assert_eq!(gone.len(), 1);
        assert_eq!(pool.bytes, 8 * PAGE_SIZE);
        assert!(pool.consistent());
        assert!(pool.take_array(Need::Normal).is_some());
    }

    /// The trim's packing at the metadata's level (Miri reaches it here: the machine-level
    /// tests need thousands of frames): the planes of two pageblocks and a section's array lie
    /// in a pool pageblock's frames; `move_all_out` moves the planes into the seed's room,
    /// keeping their bits and owners, while the array waits for a free array elsewhere, and
    /// moves once one joins. Then nothing holds those frames and their slabs retire.
    #[test]
    fn packing_moves_planes_and_arrays_in_use_out_of_a_pool_pageblock() {
        use crate::test_util::SparseMem;
        let g = 1u64 << 18;
        let range = frames(4 * g, 2 * g);
        let mem = SparseMem::default();
        let (span, seed) = map_span(&mem, range);
        let mut zm = ZoneMeta::default();
        let slot = zm.add(span, seed).unwrap();
        // A pool pageblock's frames at 100 << 9: a singles slab and an array slab there, and
        // an array slab outside it that joins later.
        let away = frames(100 << 9, 512);
        let array_pages = Pool::slab_frames(Short::Arrays) as usize;
        let mem_slabs = Pages::new(1 + 2 * array_pages);
        // SAFETY: distinct page-aligned runs of `mem_slabs`, ours alone.
        unsafe {
            zm.pool
                .add_raw(Short::Singles, mem_slabs.page(0), Some(frames(100 << 9, 1)));
            zm.pool.add_raw(
                Short::Arrays,
                mem_slabs.page(1),
                Some(frames((100 << 9) + 8, array_pages as u64)),
            );
        }
        zm.pool.bytes = (1 + array_pages as u64) * PAGE_SIZE;
        // Section 0 takes the seed's array (seeds first), section 1 the one in `away`.
        for index in [0, 1] {
            let s = SecRef { span: slot, index };
            zm.split_section(s, PbHeader::NEW, Need::Normal).unwrap();
        }
        let pb = |i: u32| PbRef {
            span: slot,
            index: PBS_PER_SECTION as u32 + i,
        };
        let (r1, r2) = (pb(3), pb(7));
        let mut bits = Plane::EMPTY;
        bits.fill(5, 9, true);
        // The zone's slab is taken before the seed (what normal needs do).
        zm.set_planes(r1, bits, None, Need::Normal).unwrap();
        zm.set_planes(r2, Plane::FULL, None, Need::Normal).unwrap();
        zm.update_pb(r2, |h| h.free = 7);
        let lies_in = |zm: &ZoneMeta, r: PbRef| {
            let (_, at) = zm.plane_ref(r).unwrap().slot();
            Pool::slab_of(at).is_some_and(|x| x.overlaps(&away))
        };
        assert!(lies_in(&zm, r1) && lies_in(&zm, r2));
        assert_eq!(zm.stuck_in(away), Some(Short::Arrays));
        zm.move_all_out(away);
        assert!(!lies_in(&zm, r1) && !lies_in(&zm, r2));
        assert_eq!(zm.plane(r1, Which::Alloc), Some(bits));
        assert_eq!(zm.plane(r2, Which::Alloc), Some(Plane::FULL));
        assert!(zm.owner_agrees(r1) && zm.owner_agrees(r2) && zm.owners_consistent());
        assert_eq!(zm.pb(r2).map(|h| h.free), Some(7));
        // No free array outside `away`: section 1's stays.
        assert_eq!(zm.stuck_in(away), Some(Short::Arrays));
        // SAFETY: a page-aligned run of `mem_slabs` no slab uses, ours alone.
        unsafe {
            zm.pool.add_raw(
                Short::Arrays,
                mem_slabs.page(1 + array_pages),
                Some(frames(300 << 9, array_pages as u64)),
            );
        }
        zm.pool.bytes += array_pages as u64 * PAGE_SIZE;
        zm.move_all_out(away);
        assert_eq!(zm.stuck_in(away), None);
        // The headers came along: r2's count, read through the moved array.
        assert_eq!(zm.pb(r2).map(|h| h.free), Some(7));
        assert_eq!(zm.plane(r1, Which::Alloc), Some(bits));
        assert!(zm.pool.consistent() && zm.owners_consistent());
        zm.pool.retire_in(away);
        let mut gone: Vec<PhysRange> =
            core::iter::from_fn(|| zm.pool.pop_retired().map(|(r, _)| r)).collect();
        gone.sort_by_key(|r| r.start());
        assert_eq!(
            gone,
            [
                frames(100 << 9, 1),
                frames((100 << 9) + 8, array_pages as u64)
            ]
        );
    }

    /// Bucket heads need no initial value: over memory never written (uninitialised, which
    /// Miri would catch a read of), buckets set and cleared at random read back as a plain
    /// model of them says, and a cleared bucket reads as empty.
    #[test]
    fn bucket_heads_are_read_only_where_written() {
        use std::alloc::alloc;
        let layout = Layout::new::<HeadStore>();
        // SAFETY: the layout is not zero-sized.
        let at = NonNull::new(unsafe { alloc(layout) }).unwrap();
        // SAFETY: the allocation is sized and aligned for the heads, and ours until freed below.
        let mut b = PbBuckets::new(unsafe { HeadRoom::new(at) });
        let mut model = std::vec![NIL; BANDS * FRAMES];
        let mut x = 0x243f_6a88_85a3_08d3u64;
        for step in 0..400u32 {
            x = x
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            let key = (x >> 33) as usize % (BANDS * FRAMES);
            let head = if x & 3 == 0 { NIL } else { step };
            b.set_head(key, head);
            model[key] = head;
            for band in 0..BANDS {
                let first = model[band * FRAMES + 1..(band + 1) * FRAMES]
                    .iter()
                    .position(|&h| h != NIL)
                    .map(|i| (i + 1, model[band * FRAMES + i + 1]));
                assert_eq!(b.first_from(band, 1), first);
            }
            if step % 8 == 0 {
                for (k, &want) in model.iter().enumerate() {
                    assert_eq!(b.head(k), want);
                    assert_eq!(b.occupied(k), want != NIL);
                }
            }
        }
        // SAFETY: allocated above with this layout; the buckets are not used after this.
        unsafe { std::alloc::dealloc(at.as_ptr(), layout) };
    }

    /// Adding a span writes none of its seed: each slab is written when the pool first takes
    /// from it, yet counts as free before (the pool is not low, so the zone does not grow it).
    #[test]
    fn a_span_s_seed_slabs_are_written_when_first_used() {
        use crate::test_util::SparseMem;
        let g = 1u64 << 18;
        let range = frames(4 * g, 2 * g);
        let mem = SparseMem::default();
        let (span, seed) = map_span(&mem, range);
        let at = seed.0;
        let untouched = |what: Short| {
            // SAFETY: the seed's slabs lie in the region, mapped and filled by `SparseMem`
            // (with its garbage byte where nothing wrote).
            let bytes = unsafe {
                core::slice::from_raw_parts(
                    at.add(Pool::seed_offset(what)).as_ptr(),
                    (Pool::slab_frames(what) * PAGE_SIZE) as usize,
                )
            };
            bytes.iter().all(|&b| b == 0xa5)
        };
        let mut zm = ZoneMeta::default();
        let slot = zm.add(span, seed).unwrap();
        for what in SEED {
            assert!(untouched(what), "{what:?} written when the span was added");
            assert!(!zm.pool.low(what), "{what:?}: a closed seed counts as free");
        }
        assert!(zm.pool.consistent());
        // The first split takes the seed's array; the plane slabs stay closed.
        zm.split_section(
            SecRef {
                span: slot,
                index: 0,
            },
            PbHeader::NEW,
            Need::Normal,
        )
        .unwrap();
        assert!(!untouched(Short::Arrays));
        assert!(zm.pool.low(Short::Arrays));
        assert!(untouched(Short::Singles) && untouched(Short::Pairs));
        // A plane opens the singles slab, which then serves from its list.
        let r = PbRef {
            span: slot,
            index: 0,
        };
        let p = zm
            .pool
            .take_planes(Plane::EMPTY, None, Need::Normal, r)
            .unwrap();
        assert!(!untouched(Short::Singles) && untouched(Short::Pairs));
        assert_eq!(
            zm.pool.free_of(Short::Singles),
            Pool::per_slab(Short::Singles) - 1
        );
        assert!(zm.pool.consistent());
        zm.pool.put_planes(p);
        assert!(zm.pool.consistent());
    }

    /// Every pageblock of a span lies inside its section's share of the span, at the index
    /// `locate_pb` gives, and an edge section's array has a cell for each of the section's
    /// pageblocks: what header lookups rely on, since the section table keeps no array length.
    #[test]
    fn pageblocks_locate_inside_their_sections() {
        let g = 1u64 << 18;
        let mut ranges = std::vec![
            frames(0, g),
            frames(4 * g, 3 * g),
            frames(4 * g + 3 * 512, 3 * g - 3 * 512),
            frames(4 * g + 7, 2 * g - 9),
            frames(g - 1, 2),
            frames(5 * g + 1000, 511),
            frames(5 * g + 512, 16 * 512),
        ];
        // And some from a plainly seeded generator (SplitMix64's constants).
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..16 {
            x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let start = (x >> 20) % (64 * g);
            let len = 1 + (x >> 7) % (3 * g);
            ranges.push(frames(start, len));
        }
        for range in ranges {
            let span = SpanMeta {
                range,
                region: range,
                sections: NonNull::dangling(),
                cold: NonNull::dangling(),
                nsec: count(range, SECTION_SHIFT) as u32,
                npb: count(range, PB_SHIFT) as u32,
            };
            let mut seen = 0u64;
            for s in 0..span.sections() {
                let pbs = span.section_pbs(s);
                // The oracle: the pageblocks of the section's GiB that overlap the range.
                let base = ((range.start().get() >> SECTION_SHIFT) + u64::from(s)) << 9;
                let lo = base.max(range.start().get() >> PB_SHIFT);
                let hi = (base + 512).min((range.end().get() + 511) >> PB_SHIFT);
                assert_eq!(pbs.len() as u64, hi - lo, "{range:?} section {s}");
                assert_eq!(pbs_in_section(range, u64::from(s)), hi - lo);
                assert_eq!(u64::from(pbs.start), seen, "{range:?} section {s}");
                seen += hi - lo;
                for pb in pbs.clone() {
                    let (at, i) = span.locate_pb(pb);
                    assert_eq!((at, i), (s, (pb - pbs.start) as usize), "{range:?} pb {pb}");
                }
            }
            assert_eq!(seen, u64::from(span.pageblocks()), "{range:?}");
        }
    }

    /// A span's cold table is written only for sections with an array: boot leaves the slots
    /// of whole sections as the memory was, and a section split again after it joined starts
    /// with empty lists, whatever its slot held.
    #[test]
    fn only_sections_with_an_array_write_their_cold_part() {
        use crate::test_util::SparseMem;
        let g = 1u64 << 18;
        // Section 0 is an edge one, 1 and 2 are whole.
        let range = frames(4 * g + 3 * 512, 3 * g - 3 * 512);
        let mem = SparseMem::default();
        let (span, seed) = map_span(&mem, range);
        let cold = span.cold;
        let mut zm = ZoneMeta::default();
        let slot = zm.add(span, seed).unwrap();
        let sec = |index| SecRef { span: slot, index };
        let untouched = |i: usize| {
            // SAFETY: slot `i < nsec` lies in the region, mapped and filled by `SparseMem`
            // (with its garbage byte where nothing wrote).
            let bytes = unsafe {
                core::slice::from_raw_parts(
                    cold.add(i).cast::<u8>().as_ptr(),
                    size_of::<ColdSlot>(),
                )
            };
            bytes.iter().all(|&b| b == 0xa5)
        };
        assert_eq!(zm.section_heads(sec(0)), Some([NIL; SECTION_LISTS]));
        assert!(!untouched(0));
        for i in [1, 2] {
            assert_eq!(zm.section_heads(sec(i)), None);
            assert!(untouched(i as usize), "section {i}'s cold slot was written");
        }
        // The seed's array splits section 1; a head set there is gone once it joins and
        // splits again.
        zm.split_section(sec(1), PbHeader::NEW, Need::Normal)
            .unwrap();
        assert_eq!(zm.section_heads(sec(1)), Some([NIL; SECTION_LISTS]));
        zm.update_split(sec(1), |_, heads| heads.unwrap()[3] = 42);
        assert_eq!(zm.section_heads(sec(1)).unwrap()[3], 42);
        zm.join_section(sec(1), SectionState::Free);
        assert_eq!(zm.section_heads(sec(1)), None);
        assert!(zm.update_split(sec(1), |_, heads| heads.is_none()).unwrap());
        zm.split_section(sec(1), PbHeader::NEW, Need::Normal)
            .unwrap();
        assert_eq!(zm.section_heads(sec(1)), Some([NIL; SECTION_LISTS]));
        assert!(untouched(2));
    }
}
