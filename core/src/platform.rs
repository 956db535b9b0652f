//! The platform memory seam, and boot memory carved from the managed ranges.
//!
//! The core never assumes how the platform maps physical memory. It asks a [`PhysMemory`] for a
//! pointer to a physical range, and only ever for ranges it keeps for its own tables: the
//! tables carved at boot (the machine-wide ones, each node's and each CPU's, one range each)
//! and each span's section table carved at boot and hot-add, and, at run
//! time, the few frames at a time it takes from its own free memory for pageblock metadata
//! (always with no allocator lock held), which it unmaps before it gives them back. It never
//! asks for a frame it hands out, and never reads or writes the contents of a free frame.
//!
//! Clearing frames goes through a seam of its own, [`FrameClearer`]: the core asks the platform
//! to zero frames it is about to hand out zeroed, or free frames it scrubs, and never writes
//! them itself. The `poison` debug mode reads frames through it too, and fills the frames
//! freed dirty with its pattern, only through it.

use core::mem::{align_of, size_of};
use core::ptr::NonNull;

use crate::addr::{PAGE_SIZE, Pfn, PhysRange};

/// How the platform reaches physical memory.
///
/// # Safety
/// For every range `r` on which `map(r)` returns `Some(p)`, the implementation guarantees:
/// 1. `p` is aligned to [`PAGE_SIZE`] and valid for reads and writes of `r.bytes()` bytes for as
///    long as `self` is borrowed;
/// 2. nothing else reads or writes those bytes while the allocator may use them: the ranges the
///    platform hands to the allocator (at boot or hot-add) belong to the allocator alone.
///
/// numaframe maps a frame again only after it gave up the earlier view with
/// [`unmap`](PhysMemory::unmap), so mutable views never alias: a frame it took for its metadata
/// stays metadata until [`Machine::trim_metadata`](crate::Machine::trim_metadata) unmaps it and
/// gives it back to free memory, or [`Machine::offline`](crate::Machine::offline) unmaps it with
/// the memory it takes away (a span's metadata region through the `PhysMemory` the span was
/// added with). Any CPU may call `map` and `unmap` (the allocator grows its
/// metadata from whichever CPU needs it), with no allocator lock held, hence `Sync`.
pub unsafe trait PhysMemory: Sync {
    /// A pointer to the first byte of `range`, or `None` if the platform cannot map it.
    fn map(&self, range: PhysRange) -> Option<NonNull<u8>>;

    /// The allocator is done with `range`, which `map` returned `ptr` for: it never reads or
    /// writes through `ptr` again, and the frames go back to its free memory, or to the
    /// platform when they leave with memory taken offline (either way a later `map` may ask for
    /// them again). The default keeps the mapping, which suits a platform whose `map` only
    /// translates addresses.
    fn unmap(&self, range: PhysRange, ptr: NonNull<u8>) {
        let _ = (range, ptr);
    }
}

/// How the platform clears frames: the only way frame contents change on the core's behalf.
///
/// The core calls [`clear`](FrameClearer::clear) and [`clear_cold`](FrameClearer::clear_cold)
/// only on frames that belong to nobody at that moment: frames it is about to return from an
/// allocation, or free frames it took off its lists to scrub. It holds no lock while it does,
/// so any CPU may call it, hence `Sync`. The
/// methods of the `poison` debug mode ([`first_other`](FrameClearer::first_other),
/// [`fill`](FrameClearer::fill)) have defaults that do nothing; the mode's fill runs under the
/// lock of the freed frames' zone (or their CPU's cache), so it must not call into the machine.
pub trait FrameClearer: Sync {
    /// Writes zeros over every byte of `range`, so that whoever reads the frames next sees
    /// zeros, including a reader that bypasses the caches (a guest running with caches off, a
    /// device): where the architecture needs it, the implementation cleans the lines to the
    /// point of coherency before it returns.
    fn clear(&self, range: PhysRange);

    /// [`clear`](FrameClearer::clear) for frames nobody is about to use: the background scrub
    /// ([`Machine::scrub`](crate::Machine::scrub)) clears through it, a pageblock at a time,
    /// while a zeroed allocation clears through `clear`. The same promise as `clear`; only the
    /// way may differ: stores that bypass the caches (Xen's `clear_page_cold` against its
    /// `clear_page_hot`) clear memory nobody reads soon without evicting what the CPU is
    /// working on, and, in pieces of 2 MiB, faster than cached stores, which first read each
    /// line they write. The default is `clear`.
    fn clear_cold(&self, range: PhysRange) {
        self.clear(range);
    }

    /// The first frame of `range` holding a byte other than `byte`, or `None` if every byte
    /// reads as `byte`. The default cannot read frames and finds none.
    ///
    /// Only the core's `poison` debug mode calls it, on frames nobody owns while it runs (as
    /// for [`clear`](FrameClearer::clear)): free frames it is about to hand out or to scrub,
    /// to find the ones written while they were free. It asks with zero for frames it holds as
    /// clean and with the pattern (`POISON_BYTE`, 0xaa) for frames freed dirty.
    fn first_other(&self, range: PhysRange, byte: u8) -> Option<Pfn> {
        let _ = (range, byte);
        None
    }

    /// Writes `byte` over every byte of `range`. The default does nothing.
    ///
    /// Only the core's `poison` debug mode calls it: it fills frames freed dirty with the
    /// pattern, once the free has found them handed out and before anyone can take them again.
    /// No cache clean is needed: nothing but the mode itself reads the pattern on purpose.
    fn fill(&self, range: PhysRange, byte: u8) {
        let _ = (range, byte);
    }
}

/// How the core fills frames freed dirty in the `poison` debug mode: the machine's clearer
/// there (if it has one); nothing, and no field, in other builds, so every fill compiles away.
#[derive(Clone, Copy, Default)]
pub(crate) struct Poison<'a> {
    #[cfg(feature = "poison")]
    clearer: Option<&'a dyn FrameClearer>,
    _clearer: core::marker::PhantomData<&'a dyn FrameClearer>,
}

impl<'a> Poison<'a> {
    /// Fills through `clearer` in the `poison` debug mode (a build without it ignores it).
    pub(crate) fn new(clearer: Option<&'a dyn FrameClearer>) -> Self {
        #[cfg(not(feature = "poison"))]
        let _ = clearer;
        Self {
            #[cfg(feature = "poison")]
            clearer,
            _clearer: core::marker::PhantomData,
        }
    }

    /// `true` if [`Poison::fill`] writes frames: a `poison` build with a clearer.
    #[inline]
    pub(crate) fn on(self) -> bool {
        #[cfg(feature = "poison")]
        return self.clearer.is_some();
        #[cfg(not(feature = "poison"))]
        false
    }

    /// Fills the `frames` frames from `pfn` with the pattern. The caller freed them dirty and
    /// owns them until it publishes the free: no other CPU can take them meanwhile.
    #[inline]
    pub(crate) fn fill(self, pfn: Pfn, frames: u64) {
        #[cfg(feature = "poison")]
        if let (Some(c), Some(range)) = (
            self.clearer,
            PhysRange::new(pfn, Pfn::new(pfn.get() + frames)),
        ) {
            c.fill(range, crate::POISON_BYTE);
        }
        #[cfg(not(feature = "poison"))]
        let _ = (pfn, frames);
    }
}

/// What the platform does before memory it took back through
/// [`Machine::report`](crate::Machine::report) is used again (HyperAlloc's "install": a host
/// that unmapped reported memory maps it back in).
///
/// The core calls [`install`](InstallHook::install) with a block that was reported, at the
/// moment it leaves the zone's free memory marked as reported: when an allocation takes it
/// whole, when it is split to serve smaller frames (the whole 2 MiB pageblock), when it
/// moves into a huge-page pool, or when [`Machine::scrub`](crate::Machine::scrub) takes it to
/// clear it (reported memory keeps its dirty state unless the host zeroes it, so a scrub after
/// a report brings the memory back: scrub first, then report). The call runs under that zone's lock, before any frame of the
/// block is handed out: it must not call into the machine, and it should be quick (a hypercall
/// that does not wait for the host to fill the memory). A block of memory that was never
/// reported, or that merged with unreported memory since, never reaches it. Any CPU may call
/// it, hence `Sync`.
pub trait InstallHook: Sync {
    /// Makes `range`, which the host had taken back, usable memory again.
    fn install(&self, range: PhysRange);
}

/// Maps `range` through `mem`, refusing a pointer that breaks the alignment promise of
/// [`PhysMemory`] (the tables carved from it rely on it).
pub(crate) fn map_checked<M: PhysMemory + ?Sized>(
    mem: &M,
    range: PhysRange,
) -> Option<NonNull<u8>> {
    let p = mem.map(range)?;
    if (p.as_ptr().addr() as u64).is_multiple_of(PAGE_SIZE) {
        Some(p)
    } else {
        // Not used: give the mapping back, so that a retry may map the range again.
        mem.unmap(range, p);
        None
    }
}

/// A range of the allocator's own frames, mapped through the platform for its metadata. Only
/// [`Mapped::new`] makes one, so holding one is holding `PhysMemory`'s promises for it: page
/// aligned, valid for `range.bytes()` for the machine's lifetime, used by nothing else.
#[derive(Debug)]
pub(crate) struct Mapped {
    pub(crate) ptr: NonNull<u8>,
    pub(crate) range: PhysRange,
}

impl Mapped {
    /// Maps `range` (frames the caller took from its own free memory and never hands out).
    pub(crate) fn new(mem: &dyn PhysMemory, range: PhysRange) -> Option<Mapped> {
        Some(Mapped {
            ptr: map_checked(mem, range)?,
            range,
        })
    }

    /// Maps the `frames` frames from `start` (as [`Mapped::new`]): the slabs the metadata pool
    /// carves.
    pub(crate) fn frames(mem: &dyn PhysMemory, start: Pfn, frames: u64) -> Option<Mapped> {
        let range = PhysRange::new(start, Pfn::new(start.get().checked_add(frames)?))?;
        Self::new(mem, range)
    }
}

/// A cursor that carves typed tables off the end of one physical range (Linux's memblock, for
/// the tables a machine makes once at boot: its machine-wide tables, each node's own, each
/// CPU's own).
pub(crate) struct BootCarve<'a> {
    base: NonNull<u8>,
    /// Bytes still free at the start of the mapped region.
    left: usize,
    _mem: core::marker::PhantomData<&'a ()>,
}

impl<'a> BootCarve<'a> {
    /// Maps `range` through `mem` for carving. The caller must never hand out frames of `range`
    /// afterwards and never map it again.
    pub(crate) fn new<M: PhysMemory + ?Sized>(mem: &'a M, range: PhysRange) -> Option<Self> {
        let left = usize::try_from(range.bytes()).ok()?;
        Some(Self {
            base: map_checked(mem, range)?,
            left,
            _mem: core::marker::PhantomData,
        })
    }

    /// Carves a slice of `n` values, each made by `init(i)`. `None` if the range is too small.
    pub(crate) fn slice<T>(
        &mut self,
        n: usize,
        mut init: impl FnMut(usize) -> T,
    ) -> Option<&'a mut [T]> {
        self.try_slice(n, |i| Ok::<T, ()>(init(i)))?.ok()
    }

    /// Carves one value made by `init`. `None` if the range is too small (then `init` never
    /// ran).
    pub(crate) fn one<T>(&mut self, init: impl FnOnce() -> T) -> Option<&'a mut T> {
        let ptr = self.reserve::<T>(1)?;
        // SAFETY: `reserve` gave room for one `T` at `ptr`, aligned, in the region, ours alone.
        unsafe { ptr.write(init()) };
        // SAFETY: initialised above; valid for `'a` by PhysMemory's contract, and no other
        // reference to it exists (the cursor moved past it).
        Some(unsafe { &mut *ptr })
    }

    /// Carves room for one class's occupancy-bucket heads, leaving it unwritten. `None` if the
    /// range is too small.
    ///
    /// # Safety
    /// The room, which carries no lifetime, must go only to buckets that live no longer than
    /// `'a` (a table carved from this region, say).
    pub(crate) unsafe fn head_room(&mut self) -> Option<crate::meta::HeadRoom> {
        let ptr = self.reserve::<u32>(crate::meta::HeadRoom::BYTES / size_of::<u32>())?;
        // SAFETY: `reserve` gave room for the heads at `ptr`, aligned for a `u32`, in the
        // region, which is valid for `'a` (PhysMemory's contract) and ours alone (the cursor
        // moved past it); the caller keeps the buckets within `'a`.
        Some(unsafe { crate::meta::HeadRoom::new(NonNull::new_unchecked(ptr).cast()) })
    }

    /// Leaves `bytes` bytes uncarved (and untouched) before the next table: a cache colour, so
    /// that the same table carved in several regions does not land at the same offset of a page
    /// in each. `None` if the range is too small.
    pub(crate) fn skip(&mut self, bytes: usize) -> Option<()> {
        self.left = self.left.checked_sub(bytes)?;
        Some(())
    }

    /// Carves a slice of `n` values, each made by `init(i)`, stopping at the first error, which
    /// it returns inside `Some`. `None` if the range is too small (then `init` never ran). The
    /// values made before an error stay in the region, never dropped (the caller gives up the
    /// whole region then).
    pub(crate) fn try_slice<T, E>(
        &mut self,
        n: usize,
        mut init: impl FnMut(usize) -> Result<T, E>,
    ) -> Option<Result<&'a mut [T], E>> {
        let ptr = self.reserve::<T>(n)?;
        for i in 0..n {
            let v = match init(i) {
                Ok(v) => v,
                Err(e) => return Some(Err(e)),
            };
            // SAFETY: `reserve` gave room for `n` values of `T` from `ptr`, aligned, in the
            // region, ours alone; `i < n`.
            unsafe { ptr.add(i).write(v) };
        }
        // SAFETY: all `n` elements were initialised above, the memory is valid for `'a` by
        // PhysMemory's contract, and no other reference to it exists (the cursor moved past it).
        Some(Ok(unsafe { core::slice::from_raw_parts_mut(ptr, n) }))
    }

    /// Moves the cursor past room for `n` values of `T` and returns where they go: `None` if
    /// the range is too small. The room lies inside the mapped region, aligned for `T` (the
    /// region is page aligned and the start is rounded down to `T`'s alignment), and is never
    /// handed out again (PhysMemory's contract makes the bytes ours alone).
    fn reserve<T>(&mut self, n: usize) -> Option<*mut T> {
        let bytes = size_of::<T>().checked_mul(n)?;
        let end = self.left.checked_sub(bytes)?;
        let start = end & !(align_of::<T>() - 1);
        self.left = start;
        // SAFETY: `start <= self.left`, which is within the mapped region.
        Some(unsafe { self.base.as_ptr().add(start) }.cast::<T>())
    }
}

/// Bytes a set of carved tables needs, rounded up to whole pages, with slack for alignment
/// (128 bytes per table: the per-CPU tables are 128-byte aligned).
pub(crate) fn pages_for(bytes: usize, tables: usize) -> u64 {
    let total = bytes as u64 + 128 * tables as u64;
    total.div_ceil(PAGE_SIZE)
}

/// The frames `range.end - frames .. range.end`, or `None` if the range is smaller.
pub(crate) fn tail(range: PhysRange, frames: u64) -> Option<PhysRange> {
    let start = range.end().get().checked_sub(frames)?;
    if start < range.start().get() {
        return None;
    }
    PhysRange::new(Pfn::new(start), range.end())
}
