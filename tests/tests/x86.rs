//! numaframe as the `x86_64` crate's frame allocator (feature `x86_64`), on simulated machines:
//! 4 KiB, 2 MiB and 1 GiB frames from the right node, policies, the huge-page pools, refused
//! frees, and the crate's own page-table mapper building tables in frames numaframe hands out.

use numaframe::HugeSize;
use numaframe::policy::{Policy, TaskPolicy};
use numaframe::{
    AllocFlags, BootOptions, FreeError, Machine, NodeId, NodeMask, NumaFrameAllocator, PhysAddr,
};
use numaframe_hosted::presets::preset;
use numaframe_hosted::sim::Sim;
use numaframe_hosted::spec::{MachineSpec, NodeSpec};
use x86_64::VirtAddr;
use x86_64::structures::paging::{
    FrameAllocator, FrameDeallocator, Mapper, OffsetPageTable, Page, PageSize, PageTable,
    PageTableFlags, PhysFrame, Size1GiB, Size2MiB, Size4KiB, Translate,
};

fn n(i: usize) -> NodeId {
    NodeId::new(i)
}

fn opts() -> BootOptions<'static> {
    BootOptions {
        min_free_kbytes: Some(0),
        ..BootOptions::default()
    }
}

/// The machine's `x86_64` frame allocator for a CPU of `node`.
fn frame_allocator<'m, 'a>(m: &'m Machine<'a>, node: NodeId) -> NumaFrameAllocator<'m, 'a> {
    // SAFETY: the tests free the allocator's frames only through the allocator itself.
    unsafe { NumaFrameAllocator::new(m, node) }
}

fn node_of<S: PageSize>(m: &Machine<'_>, f: PhysFrame<S>) -> Option<NodeId> {
    m.node_of(PhysAddr::new(f.start_address().as_u64()).pfn())
}

/// Takes `count` frames through the trait, as a page-table mapper would.
fn take<S: PageSize>(a: &mut impl FrameAllocator<S>, count: usize) -> Vec<PhysFrame<S>> {
    (0..count)
        .map(|_| a.allocate_frame().expect("memory left"))
        .collect()
}

fn free_pages(m: &Machine<'_>) -> Vec<u64> {
    m.nodes().iter().map(|x| x.free_pages()).collect()
}

#[test]
fn every_size_comes_from_the_cpu_node_and_goes_back() {
    let spec = preset("amd-4node").unwrap();
    let sim = Sim::new(&spec).unwrap();
    let m = sim.boot(opts()).unwrap();
    let before = free_pages(&m);
    let mut a = frame_allocator(&m, n(2));
    let small: Vec<PhysFrame<Size4KiB>> = take(&mut a, 100);
    let mid: Vec<PhysFrame<Size2MiB>> = take(&mut a, 4);
    let big: Vec<PhysFrame<Size1GiB>> = take(&mut a, 2);
    assert!(small.iter().all(|f| node_of(&m, *f) == Some(n(2))));
    assert!(mid.iter().all(|f| node_of(&m, *f) == Some(n(2))));
    assert!(big.iter().all(|f| node_of(&m, *f) == Some(n(2))));
    assert!(
        big.iter()
            .all(|f| f.start_address().is_aligned(Size1GiB::SIZE))
    );
    let used = (100 + 4 * 512 + 2 * 262_144) as u64;
    assert_eq!(free_pages(&m)[2], before[2] - used);
    for f in small {
        // SAFETY: the frame came from `a` and nothing uses it.
        unsafe { a.deallocate_frame(f) };
    }
    for f in mid {
        // SAFETY: as above.
        unsafe { a.deallocate_frame(f) };
    }
    for f in big {
        // SAFETY: as above.
        unsafe { a.deallocate_frame(f) };
    }
    assert_eq!(a.take_error(), None);
    assert_eq!(free_pages(&m), before, "every frame went back");
    m.check_invariants().unwrap();
}

#[test]
fn frames_follow_the_fallback_order_then_run_out() {
    // Two nodes of 64 MiB: node 0's 2 MiB frames run out, then node 1 serves, then nothing.
    let spec = MachineSpec::new(
        "two",
        (0..2)
            .map(|i| NodeSpec {
                cpus: vec![i],
                memory_bytes: 64 << 20,
                ..NodeSpec::default()
            })
            .collect(),
        vec![10, 20, 20, 10],
        None,
    )
    .unwrap();
    let sim = Sim::new(&spec).unwrap();
    let m = sim.boot(opts()).unwrap();
    let mut a = frame_allocator(&m, n(0));
    let mut frames: Vec<PhysFrame<Size2MiB>> = Vec::new();
    while let Some(f) = FrameAllocator::<Size2MiB>::allocate_frame(&mut a) {
        frames.push(f);
    }
    let on = |i| {
        frames
            .iter()
            .filter(|f| node_of(&m, **f) == Some(n(i)))
            .count()
    };
    assert!(on(0) >= 30 && on(1) >= 30, "{} + {}", on(0), on(1));
    let first_remote = frames.iter().position(|f| node_of(&m, *f) == Some(n(1)));
    assert_eq!(first_remote, Some(on(0)), "local frames first");
    let none: Option<PhysFrame<Size1GiB>> = a.allocate_frame();
    assert_eq!(none, None, "no 1 GiB block in 64 MiB nodes");
    let mut this = frame_allocator(&m, n(1)).with_flags(AllocFlags::THISNODE);
    assert_eq!(
        FrameAllocator::<Size4KiB>::allocate_frame(&mut this).map(|f| node_of(&m, f)),
        Some(Some(n(1)))
    );
    for f in frames {
        // SAFETY: the frame came from `a` and nothing uses it.
        unsafe { a.deallocate_frame(f) };
    }
    assert_eq!(a.take_error(), None);
}

#[test]
fn a_policy_places_the_frames() {
    let spec = preset("amd-4node").unwrap();
    let sim = Sim::new(&spec).unwrap();
    let m = sim.boot(opts()).unwrap();
    let all = NodeMask::first_n(4);
    let policy = TaskPolicy::new(&m, Policy::Interleave(all), false).unwrap();
    let mut a = frame_allocator(&m, n(0)).with_policy(policy);
    let frames: Vec<PhysFrame<Size4KiB>> = take(&mut a, 40);
    for i in 0..4 {
        let count = frames
            .iter()
            .filter(|f| node_of(&m, **f) == Some(n(i)))
            .count();
        assert_eq!(count, 10, "node {i}");
    }
    assert!(a.policy().is_some());
    let bind = TaskPolicy::new(&m, Policy::Bind(NodeMask::single(n(3))), false).unwrap();
    let mut b = frame_allocator(&m, n(0)).with_policy(bind);
    let f: Vec<PhysFrame<Size1GiB>> = take(&mut b, 3);
    assert!(f.iter().all(|f| node_of(&m, *f) == Some(n(3))));
}

#[test]
fn huge_frames_from_the_pools_and_refused_frees() {
    let spec = preset("amd-4node").unwrap();
    let sim = Sim::new(&spec).unwrap();
    let m = sim.boot(opts()).unwrap();
    assert_eq!(m.reserve_huge(n(1), HugeSize::Size2M, 3), 3);
    assert_eq!(m.reserve_huge(n(1), HugeSize::Size1G, 1), 1);
    let mut a = frame_allocator(&m, n(1)).with_huge_pools();
    let two: Vec<PhysFrame<Size2MiB>> = take(&mut a, 3);
    assert_eq!(
        m.huge_counts(n(1), HugeSize::Size2M),
        numaframe::HugeCounts { total: 3, free: 0 }
    );
    let one: PhysFrame<Size1GiB> = a.allocate_frame().unwrap();
    assert_eq!(
        FrameAllocator::<Size1GiB>::allocate_frame(&mut a),
        None,
        "the 1 GiB pools are empty on every node"
    );
    let four_k: PhysFrame<Size4KiB> = a.allocate_frame().unwrap();
    // SAFETY: the frame came from `a` and nothing uses it.
    unsafe { a.deallocate_frame(one) };
    assert_eq!(
        m.huge_counts(n(1), HugeSize::Size1G),
        numaframe::HugeCounts { total: 1, free: 1 }
    );
    for f in &two {
        // SAFETY: as above.
        unsafe { a.deallocate_frame(*f) };
    }
    assert_eq!(
        m.huge_counts(n(1), HugeSize::Size2M),
        numaframe::HugeCounts { total: 3, free: 3 }
    );
    assert_eq!(a.take_error(), None);
    let before = free_pages(&m);
    // A pool page handed back twice, and a 4 KiB frame freed as a 2 MiB one: refused,
    // reported, nothing changes.
    // SAFETY: deliberately wrong frees; the allocator refuses them without touching memory.
    unsafe { a.deallocate_frame(two[0]) };
    let err = a.take_error().unwrap();
    assert!(matches!(err, FreeError::DoubleFree { .. }), "{err:?}");
    let wrong = PhysFrame::<Size2MiB>::containing_address(four_k.start_address());
    // SAFETY: as above.
    unsafe { a.deallocate_frame(wrong) };
    assert!(a.take_error().is_some());
    assert_eq!(a.take_error(), None, "one error per take");
    assert_eq!(free_pages(&m), before);
    // SAFETY: the frame came from `a` and nothing uses it.
    unsafe { a.deallocate_frame(four_k) };
    assert_eq!(a.take_error(), None);
    m.check_invariants().unwrap();
}

/// The `x86_64` crate's own mapper builds a four-level page table in frames numaframe hands
/// out: simulated physical memory is one arena, so the direct map is a constant offset.
#[test]
fn the_crates_mapper_builds_tables_in_numaframe_frames() {
    let spec = MachineSpec::new(
        "one",
        vec![NodeSpec {
            cpus: vec![0],
            memory_bytes: 64 << 20,
            ..NodeSpec::default()
        }],
        vec![10],
        None,
    )
    .unwrap();
    let sim = Sim::new(&spec).unwrap();
    let m = sim.boot(opts()).unwrap();
    let offset = sim
        .memory()
        .frame_ptr(numaframe::Pfn::new(0))
        .unwrap()
        .as_ptr()
        .addr() as u64;
    let mut a = frame_allocator(&m, n(0));
    let l4: PhysFrame<Size4KiB> = a.allocate_frame().unwrap();
    let l4_ptr = (offset + l4.start_address().as_u64()) as *mut PageTable;
    // SAFETY: the frame is ours (just allocated), lies in the simulated arena at `offset`, and
    // is page aligned; we write a fresh table into it and use it only through `mapper`.
    let mut mapper = unsafe {
        l4_ptr.write(PageTable::new());
        OffsetPageTable::new(&mut *l4_ptr, VirtAddr::new(offset))
    };
    let flags = PageTableFlags::PRESENT | PageTableFlags::WRITABLE;
    let mut mapped = Vec::new();
    for i in 0..8u64 {
        let page = Page::<Size4KiB>::containing_address(VirtAddr::new(
            0xffff_8000_0000_0000 + i * 0x4020_1000,
        ));
        let frame: PhysFrame<Size4KiB> = a.allocate_frame().unwrap();
        // SAFETY: the page maps a frame nobody else uses into a table nobody else reads.
        unsafe { mapper.map_to(page, frame, flags, &mut a) }
            .unwrap()
            .ignore();
        mapped.push((page, frame));
    }
    let huge = Page::<Size2MiB>::containing_address(VirtAddr::new(0x7f00_0000_0000));
    let hframe: PhysFrame<Size2MiB> = a.allocate_frame().unwrap();
    // SAFETY: as above.
    unsafe { mapper.map_to(huge, hframe, flags | PageTableFlags::HUGE_PAGE, &mut a) }
        .unwrap()
        .ignore();
    for (page, frame) in &mapped {
        assert_eq!(
            mapper.translate_addr(page.start_address() + 0x123u64),
            Some(frame.start_address() + 0x123u64)
        );
    }
    assert_eq!(
        mapper.translate_addr(huge.start_address() + 0x1234u64),
        Some(hframe.start_address() + 0x1234u64)
    );
    // The tables themselves are numaframe frames, allocated on node 0.
    let tables = m.node(n(0)).unwrap().managed_pages() - m.node(n(0)).unwrap().free_pages();
    assert!(
        tables >= 1 + 8 + 512 + 3,
        "l4 + 8 frames + huge + some tables: {tables}"
    );
    m.check_invariants().unwrap();
}

/// `with_flags` says the allocator "allocates with flags": a 2 MiB frame from the pools under
/// `AllocFlags::ZERO` must read as zero, as `Machine::alloc_huge_with(.., ZERO)` gives it.
#[test]
fn zeroed_huge_frames_from_the_pools_read_as_zero() {
    let spec = preset("amd-4node").unwrap();
    let sim = Sim::new(&spec).unwrap();
    let m = sim.boot(opts()).unwrap();
    assert_eq!(m.reserve_huge(n(1), HugeSize::Size2M, 1), 1);
    // A guest used the page and gave it back: the pool now holds it dirty.
    let pfn = m.alloc_huge(n(1), HugeSize::Size2M).unwrap();
    let p = sim.memory().frame_ptr(pfn).unwrap();
    // SAFETY: the page was handed out to the test and lies in the simulated memory.
    unsafe { p.as_ptr().write_bytes(0x5a, 4096) };
    m.free_huge(pfn, HugeSize::Size2M).unwrap();
    let mut a = frame_allocator(&m, n(1))
        .with_flags(AllocFlags::ZERO)
        .with_huge_pools();
    let f: PhysFrame<Size2MiB> = a.allocate_frame().unwrap();
    let got = PhysAddr::new(f.start_address().as_u64()).pfn();
    assert_eq!(got, pfn, "the pool's one page");
    assert_eq!(
        sim.memory().first_word(got),
        Some(0),
        "a frame allocated with AllocFlags::ZERO holds the last owner's data"
    );
}

/// On amd-4node with one 2 MiB page reserved, in node 0's pool (from its `Normal` zone, above
/// 4 GiB: node 0 starts at 0 and its pool takes from `Normal` first), the 2 MiB frame an
/// allocator of node `cpu_node` with `flags` takes from the pools: its node and address.
fn pool_frame(cpu_node: NodeId, flags: AllocFlags) -> Option<(Option<NodeId>, u64)> {
    let spec = preset("amd-4node").unwrap();
    let sim = Sim::new(&spec).unwrap();
    let m = sim.boot(opts()).unwrap();
    assert_eq!(m.reserve_huge(n(0), HugeSize::Size2M, 1), 1);
    let mut a = frame_allocator(&m, cpu_node)
        .with_flags(flags)
        .with_huge_pools();
    let f: PhysFrame<Size2MiB> = a.allocate_frame()?;
    Some((node_of(&m, f), f.start_address().as_u64()))
}

/// `with_flags(AllocFlags::THISNODE)` asks for frames of the CPU's node: with the huge-page
/// pools, an empty pool on that node must not be served from another node's pool (Linux's
/// `dequeue_hugetlb_folio_nodemask` walks the `__GFP_THISNODE` zonelist, that node alone).
#[test]
fn thisnode_huge_frames_stay_on_the_cpu_node() {
    assert_eq!(
        pool_frame(n(1), AllocFlags::THISNODE),
        None,
        "node 1's pool is empty, yet a THISNODE frame came from another node"
    );
    assert!(
        pool_frame(n(0), AllocFlags::THISNODE).is_some(),
        "node 0's own page"
    );
}

/// `with_flags(AllocFlags::DMA32)` is documented as giving "frames a 32-bit device reaches":
/// a 2 MiB frame from the pools under it must lie below 4 GiB (the one pooled page lies above).
#[test]
fn dma32_huge_frames_from_the_pools_lie_below_4_gib() {
    assert!(pool_frame(n(0), AllocFlags::empty()).is_some_and(|(_, at)| at >= 1 << 32));
    if let Some((_, at)) = pool_frame(n(0), AllocFlags::DMA32) {
        assert!(at + Size2MiB::SIZE <= 1 << 32, "a DMA32 frame at {at:#x}");
    }
}
