//! The kernel's own page tables, built from numaframe frames with the `x86_64` crate's mapper
//! (numaframe's `x86_64` feature: `NumaFrameAllocator` is the mapper's frame allocator), which
//! replace the boot map.
//!
//! They identity-map the memory the kernel uses (RAM and the firmware's ACPI areas, with 2 MiB
//! pages wherever a range covers one whole, 4 KiB pages at its edges), the first MiB (BIOS data
//! and the boot information), and the registers of the local APIC and the HPET uncached. Then a
//! check maps a 2 MiB block from numaframe at an address outside the identity map, writes
//! through it, reads it back through the identity map, unmaps it, and gives the block and the
//! page tables that mapping needed back through the same allocator (`FrameDeallocator`).

use core::arch::asm;

use numaframe::{Machine, NodeId, NumaFrameAllocator};
use x86_64::structures::paging::mapper::{CleanUp, MapToError, MapperFlush};
use x86_64::structures::paging::{
    FrameAllocator, FrameDeallocator, Mapper, OffsetPageTable, Page, PageSize, PageTable,
    PageTableFlags, PhysFrame, Size2MiB, Size4KiB, Translate,
};
use x86_64::{PhysAddr, VirtAddr};

/// The most ranges the identity map covers.
pub const MAX_REGIONS: usize = 64;
/// Where the check maps its block: the start of the upper half, outside the identity map.
const PROBE: u64 = 0xffff_8000_0000_0000;

/// What went wrong building the tables.
#[derive(Clone, Copy, Debug)]
pub enum PagingError {
    /// numaframe had no frame for a table.
    NoFrame,
    /// The mapper refused a mapping.
    Map(u64),
    /// More ranges than [`MAX_REGIONS`].
    TooManyRegions,
    /// The probe read back something else.
    Probe(u64),
    /// An address does not translate to itself.
    NotIdentity(u64),
    /// numaframe refused a frame given back.
    Free,
}

impl core::fmt::Display for PagingError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            PagingError::NoFrame => f.write_str("no frame for a page table"),
            PagingError::Map(a) => write!(f, "cannot map {a:#x}"),
            PagingError::TooManyRegions => write!(f, "more than {MAX_REGIONS} regions to map"),
            PagingError::Probe(v) => write!(f, "the probe page read back {v:#x}"),
            PagingError::NotIdentity(a) => write!(f, "{a:#x} does not map to itself"),
            PagingError::Free => f.write_str("numaframe refused a page-table frame given back"),
        }
    }
}

/// A frame allocator that counts the 4 KiB frames it hands out.
struct Counting<'m, 'a> {
    inner: NumaFrameAllocator<'m, 'a>,
    frames: u64,
}

// SAFETY: every frame comes from `NumaFrameAllocator`, whose frames are unique and unused.
unsafe impl FrameAllocator<Size4KiB> for Counting<'_, '_> {
    fn allocate_frame(&mut self) -> Option<PhysFrame<Size4KiB>> {
        let f = self.inner.allocate_frame();
        self.frames += u64::from(f.is_some());
        f
    }
}

impl FrameDeallocator<Size4KiB> for Counting<'_, '_> {
    unsafe fn deallocate_frame(&mut self, frame: PhysFrame<Size4KiB>) {
        // SAFETY: the caller's promise: the frame is unused now, and it came from here.
        unsafe { self.inner.deallocate_frame(frame) };
        self.frames -= 1;
    }
}

/// What [`build`] did.
#[derive(Clone, Copy, Debug)]
pub struct Report {
    /// Physical address of the new PML4.
    pub cr3: u64,
    /// Page-table frames the identity map took from numaframe.
    pub table_frames: u64,
    /// Bytes identity-mapped.
    pub mapped: u64,
    /// Page-table frames the probe mapping took and gave back.
    pub probe_tables: u64,
}

/// Sorts `ranges` (byte ranges, rounded out to 4 KiB) and merges overlapping or touching ones;
/// returns how many remain.
fn merge(ranges: &mut [(u64, u64)]) -> usize {
    for r in ranges.iter_mut() {
        *r = (r.0 & !0xfff, r.1.next_multiple_of(0x1000));
    }
    ranges.sort_unstable();
    let mut n = 0;
    for i in 0..ranges.len() {
        let r = ranges[i];
        if r.0 >= r.1 {
            continue;
        }
        if n > 0 && r.0 <= ranges[n - 1].1 {
            ranges[n - 1].1 = ranges[n - 1].1.max(r.1);
        } else {
            ranges[n] = r;
            n += 1;
        }
    }
    n
}

fn map<S: PageSize>(
    mapper: &mut OffsetPageTable<'_>,
    at: u64,
    flags: PageTableFlags,
    frames: &mut Counting<'_, '_>,
) -> Result<MapperFlush<S>, PagingError>
where
    for<'t> OffsetPageTable<'t>: Mapper<S>,
{
    let page =
        Page::<S>::from_start_address(VirtAddr::new(at)).map_err(|_| PagingError::Map(at))?;
    let frame =
        PhysFrame::<S>::from_start_address(PhysAddr::new(at)).map_err(|_| PagingError::Map(at))?;
    // SAFETY: an identity mapping of memory that is already identity-mapped by the boot map:
    // it aliases nothing that the kernel does not already reach at the same address.
    unsafe { mapper.map_to(page, frame, flags, frames) }.map_err(|e| match e {
        MapToError::FrameAllocationFailed => PagingError::NoFrame,
        _ => PagingError::Map(at),
    })
}

/// Builds the tables on frames from `node` (then its fallback order), covering `regions`
/// (bytes: start, end) and the `uncached` register ranges (bytes: base, length), switches to
/// them and checks them.
///
/// # Errors
/// A [`PagingError`]; the boot map is then still in force.
pub fn build(
    machine: &Machine<'_>,
    node: NodeId,
    regions: &[(u64, u64)],
    uncached: &[Option<(u64, u64)>],
) -> Result<Report, PagingError> {
    let mut frames = Counting {
        // SAFETY: the page tables' frames go back only through this allocator.
        inner: unsafe { NumaFrameAllocator::new(machine, node) },
        frames: 0,
    };
    let pml4_frame = frames.allocate_frame().ok_or(PagingError::NoFrame)?;
    let pml4_addr = pml4_frame.start_address().as_u64();
    // SAFETY: the frame is fresh from numaframe, identity-mapped by the boot map and aligned;
    // nothing else refers to it.
    let pml4 =
        unsafe { &mut *core::ptr::with_exposed_provenance_mut::<PageTable>(pml4_addr as usize) };
    pml4.zero();
    // SAFETY: every page-table frame the mapper will touch comes from numaframe and lies in the
    // memory the boot map (offset 0) identity-maps.
    let mut mapper = unsafe { OffsetPageTable::new(pml4, VirtAddr::new(0)) };

    let mut ranges = [(0, 0); MAX_REGIONS];
    if regions.len() + 1 > MAX_REGIONS {
        return Err(PagingError::TooManyRegions);
    }
    ranges[..regions.len()].copy_from_slice(regions);
    ranges[regions.len()] = (0, 1 << 20);
    let n = merge(&mut ranges[..=regions.len()]);
    let rw = PageTableFlags::PRESENT | PageTableFlags::WRITABLE;
    let mut mapped = 0;
    for &(start, end) in &ranges[..n] {
        let mut at = start;
        while at < end {
            if at % Size2MiB::SIZE == 0 && end - at >= Size2MiB::SIZE {
                map::<Size2MiB>(&mut mapper, at, rw | PageTableFlags::HUGE_PAGE, &mut frames)?
                    .ignore();
                at += Size2MiB::SIZE;
            } else {
                map::<Size4KiB>(&mut mapper, at, rw, &mut frames)?.ignore();
                at += Size4KiB::SIZE;
            }
        }
        mapped += end - start;
    }
    for &(base, len) in uncached.iter().flatten() {
        let mmio = rw | PageTableFlags::NO_CACHE | PageTableFlags::WRITE_THROUGH;
        for at in (base & !0xfff..base + len).step_by(0x1000) {
            map::<Size4KiB>(&mut mapper, at, mmio, &mut frames)?.ignore();
        }
    }
    for &(start, end) in &ranges[..n] {
        for a in [start, end - 1] {
            if mapper.translate_addr(VirtAddr::new(a)) != Some(PhysAddr::new(a)) {
                return Err(PagingError::NotIdentity(a));
            }
        }
    }
    let table_frames = frames.frames;
    // SAFETY: the new tables map the image (code, data, stack), the boot information and all
    // the memory numaframe manages at the addresses the boot map gave them, so every address
    // in use keeps its meaning.
    unsafe { asm!("mov cr3, {}", in(reg) pml4_addr, options(nostack, preserves_flags)) };

    let probe_tables = probe(&mut mapper, &mut frames, machine, node)?;
    Ok(Report {
        cr3: pml4_addr,
        table_frames,
        mapped,
        probe_tables,
    })
}

/// Maps a 2 MiB block from numaframe at [`PROBE`], writes through that mapping, reads back
/// through the identity map, and unmaps and frees it all; returns the tables it needed.
fn probe(
    mapper: &mut OffsetPageTable<'_>,
    frames: &mut Counting<'_, '_>,
    machine: &Machine<'_>,
    node: NodeId,
) -> Result<u64, PagingError> {
    // SAFETY: the probe's block goes back only through this allocator.
    let mut blocks = unsafe { NumaFrameAllocator::new(machine, node) };
    let block: PhysFrame<Size2MiB> = blocks.allocate_frame().ok_or(PagingError::NoFrame)?;
    let before = frames.frames;
    let page = Page::<Size2MiB>::containing_address(VirtAddr::new(PROBE));
    let flags = PageTableFlags::PRESENT | PageTableFlags::WRITABLE | PageTableFlags::HUGE_PAGE;
    // SAFETY: the block is fresh from numaframe and the page is outside every other mapping.
    unsafe { mapper.map_to(page, block, flags, frames) }
        .map_err(|_| PagingError::Map(PROBE))?
        .ignore();
    let tables = frames.frames - before;
    let pattern = 0x6e75_6d61_6672_6d65u64 ^ block.start_address().as_u64();
    let last = Size2MiB::SIZE as usize / 8 - 1;
    let through_probe = core::ptr::with_exposed_provenance_mut::<u64>(PROBE as usize);
    let through_identity =
        core::ptr::with_exposed_provenance::<u64>(block.start_address().as_u64() as usize);
    // SAFETY: the block is mapped at PROBE (just now, in the active tables: PROBE was never
    // mapped, so no stale TLB entry exists) and identity-mapped; it is ours until freed below.
    let read = unsafe {
        through_probe.write_volatile(pattern);
        through_probe.add(last).write_volatile(!pattern);
        (
            through_identity.read_volatile(),
            through_identity.add(last).read_volatile(),
        )
    };
    let (frame, flush) = mapper.unmap(page).map_err(|_| PagingError::Map(PROBE))?;
    flush.ignore();
    // SAFETY: the page was just unmapped; dropping its TLB entry has no other effect.
    unsafe { asm!("invlpg [{}]", in(reg) PROBE, options(nostack, preserves_flags)) };
    // SAFETY: the block is mapped nowhere now and no reference to it remains.
    unsafe { blocks.deallocate_frame(frame) };
    // SAFETY: the mapper's tables each serve one range of this page table only, and the probe's
    // tables are empty after the unmap; their TLB entries went with the `invlpg` above.
    unsafe { mapper.clean_up(frames) };
    if blocks.take_error().is_some() || frames.inner.take_error().is_some() {
        return Err(PagingError::Free);
    }
    if frames.frames != before {
        return Err(PagingError::Free);
    }
    if read != (pattern, !pattern) {
        return Err(PagingError::Probe(read.0));
    }
    Ok(tables)
}
