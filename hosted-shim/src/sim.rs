//! Simulated physical memory: one anonymous `MAP_NORESERVE` mapping per node, so a 12 TiB
//! machine costs only the pages the allocator touches, and a [`Sim`] that boots the core
//! over it.
//!
//! Nodes are laid out back to back from physical address 0, node 0 first, so node 0 holds the
//! `Dma32` zone.

use std::ptr::NonNull;
use std::sync::Mutex;

use numaframe::{
    BootError, BootOptions, FrameClearer, Machine, MemoryRange, NodeId, PAGE_SIZE, Pfn, PhysMemory,
    PhysRange,
};

use crate::spec::MachineSpec;

/// One node's arena: `len` bytes of address space standing for physical `base..base + len`.
#[derive(Debug)]
struct Arena {
    base: u64,
    len: u64,
    ptr: NonNull<u8>,
}

impl Arena {
    fn new(base: u64, len: u64) -> std::io::Result<Arena> {
        let size = usize::try_from(len).map_err(std::io::Error::other)?;
        // SAFETY: an anonymous private mapping at an address of the kernel's choosing; it
        // aliases nothing, and MAP_NORESERVE makes untouched pages free.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let ptr = NonNull::new(p.cast::<u8>())
            .ok_or_else(|| std::io::Error::other("mmap returned null"))?;
        Ok(Arena { base, len, ptr })
    }

    fn contains(&self, start: u64, bytes: u64) -> bool {
        start >= self.base
            && start
                .checked_add(bytes)
                .is_some_and(|end| end <= self.base + self.len)
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` are exactly the mapping made in `Arena::new`, unmapped once here;
        // every borrow of it (the machine) ended before the arena is dropped.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len as usize) };
    }
}

/// Simulated physical memory of a whole machine.
#[derive(Debug)]
pub struct SimMemory {
    arenas: Vec<Arena>,
    mapped: Mutex<Vec<PhysRange>>,
}

// SAFETY: the arenas are plain memory owned by this value; the raw pointers are only
// dereferenced by whoever `map` handed a range to, under that range's own rules.
unsafe impl Send for SimMemory {}
// SAFETY: as above; `mapped` is behind a mutex.
unsafe impl Sync for SimMemory {}

impl SimMemory {
    /// Arenas for the given `(physical base, bytes)` ranges. Any base works for clearing and
    /// for the owner's accessors; [`PhysMemory::map`] maps only arenas at a page-aligned base
    /// (a machine boots only on those), as its pointers must be page aligned.
    ///
    /// # Errors
    /// If the kernel refuses a mapping.
    pub fn new(ranges: &[(u64, u64)]) -> std::io::Result<SimMemory> {
        let arenas = ranges
            .iter()
            .map(|&(b, l)| Arena::new(b, l))
            .collect::<Result<_, _>>()?;
        Ok(SimMemory {
            arenas,
            mapped: Mutex::new(Vec::new()),
        })
    }

    /// A pointer to the first byte of `range`, if it lies inside one arena.
    fn range_ptr(&self, range: PhysRange) -> Option<NonNull<u8>> {
        let start = range.start().addr().get();
        let a = self
            .arenas
            .iter()
            .find(|a| a.contains(start, range.bytes()))?;
        // SAFETY: `contains` checked that the range lies inside this arena's mapping.
        Some(unsafe { a.ptr.add((start - a.base) as usize) })
    }

    /// A pointer to the first byte of frame `pfn`, for the frame's owner (a test standing in for
    /// a guest) to read or write a frame it was handed.
    pub fn frame_ptr(&self, pfn: Pfn) -> Option<NonNull<u8>> {
        let addr = pfn.addr().get();
        let a = self.arenas.iter().find(|a| a.contains(addr, PAGE_SIZE))?;
        // SAFETY: `contains` checked that the frame lies inside this arena's mapping.
        Some(unsafe { a.ptr.add((addr - a.base) as usize) })
    }

    /// Writes `byte` over every byte of `range` (a guest writing its memory); a range outside
    /// every arena is left alone.
    ///
    /// # Safety
    /// The caller owns the frames of `range`: the allocator handed them out and they are not
    /// freed, so nothing else reads or writes them meanwhile.
    pub unsafe fn fill(&self, range: PhysRange, byte: u8) {
        if let Some(p) = self.range_ptr(range) {
            // SAFETY: inside an arena's mapping (`range_ptr`), and the caller's frames.
            unsafe { p.as_ptr().write_bytes(byte, range.bytes() as usize) };
        }
    }

    /// [`SimMemory::fill`] with zeros through stores that bypass the caches, for frames nobody
    /// reads soon (see [`FrameClearer::clear_cold`]).
    ///
    /// # Safety
    /// As for [`SimMemory::fill`].
    unsafe fn zero_cold(&self, range: PhysRange) {
        match self.range_ptr(range) {
            // SAFETY: inside an arena's mapping (`range_ptr`), 16-byte aligned, whole frames (a
            // multiple of 16 bytes), and the caller's frames.
            Some(p) if p.as_ptr().align_offset(16) == 0 => unsafe {
                stream_zeros(p, range.bytes() as usize)
            },
            // An arena at a base that is not 16-byte aligned (`new` takes any): streaming stores
            // would fault there, so plain ones clear it.
            // SAFETY: the caller's frames.
            _ => unsafe { self.fill(range, 0) },
        }
    }

    /// The first 8 bytes of frame `pfn`, for its owner to check.
    pub fn first_word(&self, pfn: Pfn) -> Option<u64> {
        let p = self.frame_ptr(pfn)?;
        // SAFETY: the frame lies in an arena (`frame_ptr`), is page aligned, and a read of
        // plain memory (its contents are whatever its last writer left) is always defined.
        Some(unsafe { p.cast::<u64>().as_ptr().read_volatile() })
    }

    /// Gives the frames of `range` back to Linux (`madvise(MADV_DONTNEED)`): they stop being
    /// resident, and read as zero when next touched (the arenas are private anonymous
    /// mappings). `false`, changing nothing, if the range lies outside every arena or the
    /// kernel refuses.
    ///
    /// Only for frames nobody owns: free frames the allocator reports (their contents are
    /// lost).
    pub fn discard(&self, range: PhysRange) -> bool {
        let Some(p) = self.range_ptr(range) else {
            return false;
        };
        // SAFETY: the range lies inside an arena's mapping (`range_ptr`) and is page aligned
        // (whole frames of a page-aligned mapping); MADV_DONTNEED on a private anonymous
        // mapping only drops its pages, which the caller says nobody owns.
        let rc = unsafe {
            libc::madvise(
                p.as_ptr().cast(),
                range.bytes() as usize,
                libc::MADV_DONTNEED,
            )
        };
        rc == 0
    }

    /// Bytes of the arenas that are resident (touched), from `mincore`.
    pub fn resident_bytes(&self) -> u64 {
        let page = 4096u64;
        let mut total = 0;
        for a in &self.arenas {
            let mut off = 0u64;
            let chunk = 1u64 << 30;
            let mut vec = vec![0u8; (chunk / page) as usize];
            while off < a.len {
                let len = chunk.min(a.len - off);
                // SAFETY: the range lies in the arena's mapping and `vec` holds one byte per page.
                let rc = unsafe {
                    libc::mincore(
                        a.ptr.as_ptr().add(off as usize).cast(),
                        len as usize,
                        vec.as_mut_ptr(),
                    )
                };
                if rc == 0 {
                    total += vec[..len.div_ceil(page) as usize]
                        .iter()
                        .filter(|b| **b & 1 != 0)
                        .count() as u64
                        * page;
                }
                off += len;
            }
        }
        total
    }
}

/// The process's resident memory in bytes (`/proc/self/statm`'s second field, in pages of
/// the kernel's page size); `None` where there is no such file.
pub fn process_rss_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf only reads a system constant.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    Some(pages * u64::try_from(page).ok()?)
}

// SAFETY:
// 1. a range is mapped only if it lies inside one arena, so the pointer is valid for its
//    bytes as long as `self` lives (arenas are unmapped only on drop), and only if its pointer
//    is page aligned (mmap returns page-aligned memory, so that is every range of an arena whose
//    base is page aligned, and none of one whose base is not);
// 2. a range overlapping one mapped and not unmapped is refused, so no two views alias; the
//    frames the allocator hands out are never mapped through here.
unsafe impl PhysMemory for SimMemory {
    fn map(&self, range: PhysRange) -> Option<NonNull<u8>> {
        let start = range.start().addr().get();
        let a = self
            .arenas
            .iter()
            .find(|a| a.contains(start, range.bytes()))?;
        // A frame of an arena whose base is not page aligned is not page aligned in it.
        if !(start - a.base).is_multiple_of(PAGE_SIZE) {
            return None;
        }
        let mut mapped = self.mapped.lock().ok()?;
        if mapped.iter().any(|m| m.overlaps(&range)) {
            return None;
        }
        mapped.push(range);
        // SAFETY: `contains` checked that the range lies inside the arena's mapping.
        Some(unsafe { a.ptr.add((start - a.base) as usize) })
    }

    fn unmap(&self, range: PhysRange, _: NonNull<u8>) {
        if let Ok(mut mapped) = self.mapped.lock() {
            mapped.retain(|m| *m != range);
        }
    }
}

/// Clears frames with a plain `memset` of the arena (the host's caches are coherent, so no
/// clean to memory follows), and reads and fills them for the `poison` debug mode. A range
/// outside every arena is left alone, and holds only the byte asked about as far as this can
/// tell.
impl FrameClearer for SimMemory {
    fn clear(&self, range: PhysRange) {
        // SAFETY: the allocator clears only frames that nobody owns while it does (free frames
        // it scrubs, or frames it is about to hand out), so it stands in for their owner.
        unsafe { SimMemory::fill(self, range, 0) };
    }

    /// Non-temporal stores (`movntdq`), then a store fence, so that the zeros are in memory,
    /// ordered before the scrub hands the frames back, and no stale line of them stays cached.
    fn clear_cold(&self, range: PhysRange) {
        // SAFETY: as for `clear`: the scrub clears only free frames it holds off its lists.
        unsafe { self.zero_cold(range) };
    }

    fn fill(&self, range: PhysRange, byte: u8) {
        // SAFETY: the allocator fills only frames freed dirty that nobody owns while it does
        // (the free checked them handed out, and no one can take them before it is done).
        unsafe { SimMemory::fill(self, range, byte) };
    }

    fn first_other(&self, range: PhysRange, byte: u8) -> Option<Pfn> {
        let base = self.range_ptr(range)?.cast::<u64>();
        let words = (PAGE_SIZE / 8) as usize;
        let want = u64::from_ne_bytes([byte; 8]);
        (0..range.frames()).find_map(|f| {
            let written = (0..words).any(|w| {
                // SAFETY: word `w` of frame `f` lies in the range, inside the arena (aligned
                // only if the arena's base is: the read is unaligned); the allocator asks only
                // about frames nobody owns while it does, so nothing writes them meanwhile, and
                // a read of plain memory is always defined.
                unsafe { base.as_ptr().add(f as usize * words + w).read_unaligned() != want }
            });

            written.then(|| Pfn::new(range.start().get() + f))
        })
    }
}

/// Writes zeros over the `len` bytes from `p` with non-temporal stores and fences them.
///
/// # Safety
/// `p` is 16-byte aligned, `len` a multiple of 16, and the bytes are the caller's to write
/// (every `x86_64` CPU has SSE2).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse2")]
unsafe fn stream_zeros(p: NonNull<u8>, len: usize) {
    use std::arch::x86_64::{__m128i, _mm_setzero_si128, _mm_sfence, _mm_stream_si128};
    let zero = _mm_setzero_si128();
    let lanes = p.as_ptr().cast::<__m128i>();
    for i in 0..len / 16 {
        // SAFETY: lane `i` lies in the caller's bytes, 16-byte aligned since `p` is.
        unsafe { _mm_stream_si128(lanes.add(i), zero) };
    }
    // Non-temporal stores are weakly ordered: the fence orders them before the scrub's release
    // of the frames to the zone.
    _mm_sfence();
}

/// Elsewhere, plain stores.
///
/// # Safety
/// The bytes are the caller's to write.
#[cfg(not(target_arch = "x86_64"))]
unsafe fn stream_zeros(p: NonNull<u8>, len: usize) {
    // SAFETY: the caller's bytes.
    unsafe { p.as_ptr().write_bytes(0, len) };
}

/// A simulated machine: the memory and the memory ranges of a [`MachineSpec`].
#[derive(Debug)]
pub struct Sim<'s> {
    spec: &'s MachineSpec,
    ranges: Vec<MemoryRange>,
    memory: SimMemory,
}

impl<'s> Sim<'s> {
    /// Lays the spec's nodes out back to back from address 0 and maps an arena for each.
    ///
    /// # Errors
    /// If the kernel refuses a mapping, or a node's memory is not a whole number of pages.
    pub fn new(spec: &'s MachineSpec) -> std::io::Result<Sim<'s>> {
        Sim::with_spare(spec, &[])
    }

    /// [`Sim::new`] with arenas for `spare` `(physical base, bytes)` ranges too, memory the
    /// machine does not boot with: a platform's memory that a hot-add brings in later (the
    /// machine's [`numaframe::PhysMemory`] must map hot-added memory as well).
    ///
    /// # Errors
    /// As [`Sim::new`].
    pub fn with_spare(spec: &'s MachineSpec, spare: &[(u64, u64)]) -> std::io::Result<Sim<'s>> {
        let mut ranges = Vec::new();
        let mut arenas = Vec::new();
        let mut base = 0u64;
        for (i, node) in spec.nodes().iter().enumerate() {
            let bytes = node.memory_bytes;
            if bytes == 0 {
                continue;
            }
            let range =
                PhysRange::from_bytes(numaframe::PhysAddr::new(base), bytes).ok_or_else(|| {
                    std::io::Error::other(format!(
                        "node {i}: memory is not a whole number of 4 KiB pages"
                    ))
                })?;
            ranges.push(MemoryRange {
                node: NodeId::new(i),
                range,
            });
            arenas.push((base, bytes));
            base += bytes;
        }
        arenas.extend_from_slice(spare);
        Ok(Sim {
            spec,
            ranges,
            memory: SimMemory::new(&arenas)?,
        })
    }

    /// Boots the core over the simulated memory, clearing frames through it.
    ///
    /// # Errors
    /// The core's [`BootError`].
    pub fn boot(&self, opts: BootOptions) -> Result<Machine<'_>, BootError> {
        Machine::boot(self.spec.topology(), &self.memory, &self.ranges, opts)
            .map(|m| m.with_clearer(&self.memory))
    }

    /// The memory ranges handed to the core.
    pub fn ranges(&self) -> &[MemoryRange] {
        &self.ranges
    }

    /// The simulated memory.
    pub fn memory(&self) -> &SimMemory {
        &self.memory
    }

    /// The spec the machine was built from.
    pub fn spec(&self) -> &'s MachineSpec {
        self.spec
    }
}
