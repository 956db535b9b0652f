//! Page-aligned heap buffers for mock physical memory.
//!
//! numaframe's `PhysMemory` contract: a mapped range is page aligned, valid for its bytes while
//! the memory lives, and touched by nobody else. [`RawMemory`] keeps it for any caller: every map
//! gets a fresh buffer of its own, and a range that overlaps one mapped and not unmapped is
//! refused, so the allocator mapping a frame twice (which it promises never to do) fails instead
//! of aliasing.
//! [`impl_phys_memory!`](crate::impl_phys_memory) turns a type holding a `RawMemory` into a
//! `PhysMemory` of the calling crate.

use std::alloc::{Layout, alloc, dealloc};
use std::ptr::NonNull;
use std::sync::Mutex;

/// The alignment of every buffer: numaframe's `PAGE_SIZE` (the typed kit checks that they agree).
pub const PAGE_ALIGN: usize = 4096;

/// One mapped range and its buffer.
#[derive(Debug)]
struct Region {
    start: u64,
    bytes: u64,
    ptr: NonNull<u8>,
    layout: Layout,
}

/// Heap-backed physical memory that exists only where it is mapped: each map gets a fresh
/// [`PAGE_ALIGN`]-aligned buffer filled with one byte value, freed when the memory is dropped.
///
/// Filling with a byte other than 0 makes sure that metadata the allocator initialises lazily
/// never trusts what it finds. Addresses are physical byte addresses; they only name ranges (for
/// the overlap check) and have nothing to do with where the buffers are.
#[derive(Debug)]
pub struct RawMemory {
    fill: u8,
    limit: u64,
    regions: Mutex<Vec<Region>>,
}

// SAFETY: the buffers are plain heap memory owned by this value; the raw pointers in the region
// list are only handles, dereferenced by whoever `map` handed a range to.
unsafe impl Send for RawMemory {}
// SAFETY: as above; the region list is behind a mutex.
unsafe impl Sync for RawMemory {}

impl RawMemory {
    /// Memory whose fresh buffers read as `fill` bytes.
    pub const fn new(fill: u8) -> RawMemory {
        RawMemory::with_map_limit(fill, u64::MAX)
    }

    /// Memory whose fresh buffers read as `fill` bytes and that refuses any map of more than
    /// `limit` bytes (so that a fuzzed hot-add of terabytes is the allocator's typed error for an
    /// unmappable range, not an out-of-memory abort of the test).
    pub const fn with_map_limit(fill: u8, limit: u64) -> RawMemory {
        RawMemory {
            fill,
            limit,
            regions: Mutex::new(Vec::new()),
        }
    }

    /// A fresh buffer for the `bytes` bytes at physical address `start`, aligned to
    /// [`PAGE_ALIGN`] and filled with the fill byte; it lives until `self` is dropped and is
    /// never handed out again. `None` for an empty range, one above the limit, one that overlaps
    /// a range mapped before (or wraps past the end of the address space), or if the heap has no
    /// room.
    pub fn map(&self, start: u64, bytes: u64) -> Option<NonNull<u8>> {
        let end = start.checked_add(bytes)?;
        if bytes == 0 || bytes > self.limit {
            return None;
        }
        let mut regions = self.regions.lock().ok()?;
        if regions
            .iter()
            .any(|r| r.start < end && start < r.start + r.bytes)
        {
            return None;
        }
        let layout = Layout::from_size_align(usize::try_from(bytes).ok()?, PAGE_ALIGN).ok()?;
        // SAFETY: the layout has a non-zero size (checked above).
        let ptr = NonNull::new(unsafe { alloc(layout) })?;
        // SAFETY: the allocation just made holds `layout.size()` bytes.
        unsafe { ptr.as_ptr().write_bytes(self.fill, layout.size()) };
        regions.push(Region {
            start,
            bytes,
            ptr,
            layout,
        });
        Some(ptr)
    }
}

impl RawMemory {
    /// Gives up the mapping of the `bytes` bytes at `start` that `map` returned: its buffer is
    /// freed, and the range can be mapped again. A range that is not exactly one mapped before
    /// is ignored.
    pub fn unmap(&self, start: u64, bytes: u64) {
        let Ok(mut regions) = self.regions.lock() else {
            return;
        };
        if let Some(i) = regions
            .iter()
            .position(|r| r.start == start && r.bytes == bytes)
        {
            let r = regions.swap_remove(i);
            // SAFETY: `ptr` was returned by `alloc(layout)` in `map` and is freed once, here;
            // whoever mapped it gave it up.
            unsafe { dealloc(r.ptr.as_ptr(), r.layout) };
        }
    }
}

impl Drop for RawMemory {
    fn drop(&mut self) {
        let regions = self
            .regions
            .get_mut()
            .map(std::mem::take)
            .unwrap_or_default();
        for r in regions {
            // SAFETY: `ptr` was returned by `alloc(layout)` in `map` and is freed once, here;
            // whatever borrowed this memory (a machine) is gone, since it borrowed `self`.
            unsafe { dealloc(r.ptr.as_ptr(), r.layout) };
        }
    }
}

/// Implements numaframe's `PhysMemory` for a type that holds a [`RawMemory`], in the calling
/// crate: `impl_phys_memory!(numaframe, Mem, 0)` for `struct Mem(RawMemory)` in a crate that
/// depends on numaframe, `impl_phys_memory!(crate, Mem, 0)` in the core's own unit tests. The
/// first argument is the path of the crate root that exports `PhysMemory` and `PhysRange`, the
/// last the field that holds the memory.
///
/// The impl maps a `PhysRange` as the bytes from its first frame's address, refuses a map
/// overlapping a range mapped and not unmapped, and frees a range's buffer when it is unmapped.
#[macro_export]
macro_rules! impl_phys_memory {
    ($numaframe:ident, $ty:ty, $field:tt) => {
        // SAFETY: `RawMemory::map` returns, for each range it accepts, a fresh buffer of exactly
        // `range.bytes()` bytes aligned to `PAGE_ALIGN` (the page size) that lives as long as the
        // memory, so as long as `self`; it refuses a range overlapping one mapped before, so no
        // two views alias, and nothing but the caller of `map` ever reaches a buffer.
        unsafe impl $numaframe::PhysMemory for $ty {
            fn map(&self, range: $numaframe::PhysRange) -> Option<::core::ptr::NonNull<u8>> {
                $crate::RawMemory::map(&self.$field, range.start().addr().get(), range.bytes())
            }
            fn unmap(&self, range: $numaframe::PhysRange, _: ::core::ptr::NonNull<u8>) {
                $crate::RawMemory::unmap(&self.$field, range.start().addr().get(), range.bytes())
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_aligned_filled_and_distinct() {
        let mem = RawMemory::new(0xa5);
        let a = mem.map(0, 3 * 4096).unwrap();
        let b = mem.map(3 * 4096, 4096).unwrap();
        for p in [a, b] {
            assert!((p.as_ptr().addr()).is_multiple_of(PAGE_ALIGN));
        }
        // SAFETY: `a` holds 3 pages, `b` one page; both are ours alone.
        let (a, b) = unsafe {
            (
                std::slice::from_raw_parts(a.as_ptr(), 3 * 4096),
                std::slice::from_raw_parts(b.as_ptr(), 4096),
            )
        };
        assert!(a.iter().chain(b).all(|&x| x == 0xa5));
        assert!(a.as_ptr_range().end <= b.as_ptr() || b.as_ptr_range().end <= a.as_ptr());
    }

    #[test]
    fn overlapping_empty_wrapping_and_oversized_maps_are_refused() {
        let mem = RawMemory::with_map_limit(0, 8 * 4096);
        assert!(mem.map(4 * 4096, 2 * 4096).is_some());
        for (start, bytes) in [
            (4 * 4096, 4096),     // the same first page
            (5 * 4096, 4096),     // its last page
            (3 * 4096, 2 * 4096), // from below into it
            (0, 4096 * 8),        // around it
        ] {
            assert!(mem.map(start, bytes).is_none(), "{start:#x}+{bytes:#x}");
        }
        assert!(mem.map(0, 0).is_none());
        assert!(mem.map(u64::MAX - 4095, 8192).is_none());
        assert!(mem.map(64 * 4096, 9 * 4096).is_none());
        // Next to it on both sides is free.
        assert!(mem.map(3 * 4096, 4096).is_some());
        assert!(mem.map(6 * 4096, 4096).is_some());
    }
}
