//! Physical memory for fuzzing: every range the allocator maps gets a fresh page-aligned heap
//! buffer filled with a garbage byte, so lazily initialised metadata must never trust what it
//! finds. Overlapping maps are refused (the allocator must never map a range twice), and so is
//! any map above [`MAP_LIMIT`], so a fuzzed hot-add of terabytes is a typed `MapFailed`, not an
//! out-of-memory abort.

use std::alloc::{Layout, alloc, dealloc};
use std::ptr::NonNull;
use std::sync::Mutex;

use numaframe::{PAGE_SIZE, PhysMemory, PhysRange};

/// The largest range one `map` call serves (64 MiB of metadata covers 20 GiB of frames).
pub const MAP_LIMIT: u64 = 64 << 20;

/// One mapped region.
#[derive(Debug)]
struct Region {
    range: PhysRange,
    ptr: NonNull<u8>,
    layout: Layout,
}

/// Heap-backed physical memory that exists only where the allocator maps it.
#[derive(Debug)]
pub struct HeapMem {
    fill: u8,
    regions: Mutex<Vec<Region>>,
}

// SAFETY: the regions are plain heap buffers owned by this value; the pointers are only
// dereferenced by whoever `map` handed a range to.
unsafe impl Send for HeapMem {}
// SAFETY: as above; the region list is behind a mutex.
unsafe impl Sync for HeapMem {}

impl HeapMem {
    /// Memory whose fresh regions read as `fill` bytes.
    pub fn new(fill: u8) -> Self {
        Self {
            fill,
            regions: Mutex::new(Vec::new()),
        }
    }

    /// The ranges mapped so far (the allocator's own tables and metadata).
    pub fn mapped(&self) -> Vec<PhysRange> {
        self.regions
            .lock()
            .map(|r| r.iter().map(|r| r.range).collect())
            .unwrap_or_default()
    }
}

impl Drop for HeapMem {
    fn drop(&mut self) {
        let regions = self
            .regions
            .get_mut()
            .map(std::mem::take)
            .unwrap_or_default();
        for r in regions {
            // SAFETY: `ptr` was returned by `alloc(layout)` in `map` and is freed once, here;
            // every borrow of `self` (the machine) has ended.
            unsafe { dealloc(r.ptr.as_ptr(), r.layout) };
        }
    }
}

// SAFETY:
// 1. every mapped range gets its own allocation of exactly `range.bytes()` bytes, aligned to
//    PAGE_SIZE, that lives until `self` is dropped;
// 2. a range overlapping one mapped before is refused, so no two views alias, and nothing but
//    the caller of `map` touches a region.
unsafe impl PhysMemory for HeapMem {
    fn map(&self, range: PhysRange) -> Option<NonNull<u8>> {
        let bytes = range.bytes();
        if bytes == 0 || bytes > MAP_LIMIT {
            return None;
        }
        let mut regions = self.regions.lock().ok()?;
        if regions.iter().any(|r| r.range.overlaps(&range)) {
            return None;
        }
        let layout =
            Layout::from_size_align(usize::try_from(bytes).ok()?, PAGE_SIZE as usize).ok()?;
        // SAFETY: the layout has a non-zero size (checked above).
        let ptr = NonNull::new(unsafe { alloc(layout) })?;
        // SAFETY: the allocation holds `layout.size()` bytes.
        unsafe { ptr.as_ptr().write_bytes(self.fill, layout.size()) };
        regions.push(Region { range, ptr, layout });
        Some(ptr)
    }
}
