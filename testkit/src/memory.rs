//! The mock platform memory.

use numaframe::PAGE_SIZE;
use numaframe_testkit_base::{PAGE_ALIGN, RawMemory};

// The buffers must be as aligned as `PhysMemory` promises.
const _: () = assert!(PAGE_ALIGN as u64 == PAGE_SIZE);

/// Physical memory that exists only where the allocator maps it: each mapped range gets a fresh
/// page-aligned heap buffer filled with a garbage byte (so lazily initialised metadata must
/// never trust what it finds), ranges overlapping one mapped before are refused, and everything
/// is freed on drop.
#[derive(Debug)]
pub struct SparseMem(RawMemory);

numaframe_testkit_base::impl_phys_memory!(numaframe, SparseMem, 0);

impl SparseMem {
    /// Memory whose fresh ranges read as `fill` bytes.
    pub const fn new(fill: u8) -> SparseMem {
        SparseMem(RawMemory::new(fill))
    }

    /// Memory whose fresh ranges read as `fill` bytes and that refuses to map more than `limit`
    /// bytes at once.
    pub const fn with_map_limit(fill: u8, limit: u64) -> SparseMem {
        SparseMem(RawMemory::with_map_limit(fill, limit))
    }
}

impl Default for SparseMem {
    /// Memory filled with `0xa5`.
    fn default() -> SparseMem {
        SparseMem::new(0xa5)
    }
}

#[cfg(test)]
mod tests {
    use numaframe::{Pfn, PhysAddr, PhysMemory, PhysRange};

    use super::*;

    #[test]
    fn maps_whole_frames_once() {
        let mem = SparseMem::new(0x5a);
        let r = |s, e| PhysRange::new(Pfn::new(s), Pfn::new(e)).unwrap();
        let p = mem.map(r(10, 12)).unwrap();
        assert!((p.as_ptr().addr() as u64).is_multiple_of(PAGE_SIZE));
        // SAFETY: the two frames are mapped and ours alone.
        let bytes = unsafe { std::slice::from_raw_parts(p.as_ptr(), 2 * PAGE_SIZE as usize) };
        assert!(bytes.iter().all(|&b| b == 0x5a));
        assert!(mem.map(r(11, 13)).is_none());
        assert!(mem.map(r(12, 13)).is_some());
        let from_bytes = PhysRange::from_bytes(PhysAddr::new(9 * PAGE_SIZE), PAGE_SIZE).unwrap();
        assert!(mem.map(from_bytes).is_some());
        assert!(
            SparseMem::with_map_limit(0, PAGE_SIZE)
                .map(r(0, 2))
                .is_none()
        );
    }
}
