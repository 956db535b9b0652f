//! The `poison` debug mode: frames freed dirty are filled with the pattern, and a write into a
//! free frame (freed clean or dirty) is reported on the allocation or the scrub that finds it,
//! on every allocation and free path; nothing is reported when no such write happened, and a
//! refused double free leaves the frame's bytes alone.
//!
//! The planted write goes straight into the simulated memory, as a buggy owner that kept a
//! pointer to a frame it freed would. The tests' own plain reads of that memory are the
//! oracle for what a frame holds.

use numaframe::policy::{Policy, TaskPolicy};
use numaframe::zonelist::FallbackOptions;
use numaframe::{
    AllocFlags, BootOptions, CpuId, FreeError, HugeSize, Machine, MemoryRange, NodeId, NodeMask,
    Order, PAGE_SIZE, Pfn, PhysRange,
};
use numaframe_hosted::sim::{Sim, SimMemory};
use numaframe_hosted::spec::{MachineSpec, NodeSpec};

const MIB: u64 = 1 << 20;
const N0: NodeId = NodeId::new(0);
/// The pattern, as the mode documents it (Linux's `PAGE_POISON`).
const PATTERN: u8 = 0xaa;

fn spec() -> MachineSpec {
    let node = NodeSpec {
        cpus: vec![0],
        memory_bytes: 64 * MIB,
        socket: None,
        initiator: None,
        bandwidth_gbps: None,
    };
    MachineSpec::new("poison", vec![node], vec![10], None).unwrap()
}

fn boot<'a>(sim: &'a Sim<'_>) -> Machine<'a> {
    boot_on(sim.spec(), sim.memory(), sim.ranges(), false)
}

/// Boots `ranges` of `mem` with one CPU, the memory declared zeroed or not, and gives the
/// machine `mem` as its clearer.
fn boot_on<'a>(
    spec: &'a MachineSpec,
    mem: &'a SimMemory,
    ranges: &[MemoryRange],
    zeroed: bool,
) -> Machine<'a> {
    let cpus = [N0];
    Machine::boot(
        spec.topology(),
        mem,
        ranges,
        BootOptions {
            cpus: &cpus,
            zeroed,
            ..BootOptions::default()
        },
    )
    .unwrap()
    .with_clearer(mem)
}

/// Writes `byte` at byte `at` of frame `pfn`.
///
/// The frame may be free: this is the write after free the tests plant (or an owner writing
/// its own frame). The tests run on one thread, so nothing else touches the frame meanwhile.
fn poke(mem: &SimMemory, pfn: Pfn, at: usize, byte: u8) {
    assert!(at < PAGE_SIZE as usize);
    let p = mem.frame_ptr(pfn).unwrap();
    // SAFETY: byte `at` lies in the frame, inside the simulated memory's mapping (`frame_ptr`,
    // and the assert); plain memory, and no other thread reads or writes it meanwhile.
    unsafe { p.as_ptr().add(at).write_volatile(byte) };
}

/// Byte `at` of frame `pfn` (a plain read; the frame is the test's own or free, and no other
/// thread touches it meanwhile).
fn peek(mem: &SimMemory, pfn: Pfn, at: usize) -> u8 {
    assert!(at < PAGE_SIZE as usize);
    let p = mem.frame_ptr(pfn).unwrap();
    // SAFETY: byte `at` lies in the frame, inside the simulated memory's mapping (`frame_ptr`,
    // and the assert); plain memory, and no other thread writes it meanwhile.
    unsafe { p.as_ptr().add(at).read_volatile() }
}

/// `true` if every byte of frame `pfn` reads as `byte` (an oracle of its own: a plain read).
fn reads_as(mem: &SimMemory, pfn: Pfn, byte: u8) -> bool {
    let p = mem.frame_ptr(pfn).unwrap();
    (0..PAGE_SIZE as usize).all(|i| {
        // SAFETY: byte `i` lies in the frame, inside the simulated memory's mapping; the frame
        // is the test's own or free, and no other thread touches it meanwhile.
        unsafe { p.as_ptr().add(i).read_volatile() == byte }
    })
}

/// What `m` found written after free so far: how many frames, and the last one.
fn found(m: &Machine<'_>) -> (u64, Option<Pfn>) {
    let seen = m.writes_after_free();
    (seen.frames, seen.last)
}

/// `true` if every byte of frame `pfn` reads as zero.
fn reads_zero(mem: &SimMemory, pfn: Pfn) -> bool {
    reads_as(mem, pfn, 0)
}

#[derive(Clone, Copy, Debug)]
enum Path {
    /// `Machine::alloc`: the zonelist walk.
    Walk,
    /// `Machine::alloc_cpu`: a CPU's cache, refilled from the zone.
    Cpu,
    /// `Machine::alloc_bulk`.
    Bulk,
    /// A claimed CPU's handle (`Machine::claim_cpu`): its hot slot, refilled from the zone.
    Handle,
    /// `CpuHandle::alloc_bulk`: runs off the hot slot's stack.
    HandleBulk,
    /// `TaskPolicy::alloc` under an interleave policy.
    Interleave,
}

const PATHS: [Path; 6] = [
    Path::Walk,
    Path::Cpu,
    Path::Bulk,
    Path::Handle,
    Path::HandleBulk,
    Path::Interleave,
];

/// Takes every free frame of the node through `path`, in order-0 frames.
fn take_all(m: &Machine<'_>, path: Path, flags: AllocFlags) -> Vec<Pfn> {
    let flags = flags | AllocFlags::RESERVE | AllocFlags::THISNODE;
    let cpu: CpuId = m.cpu(0).unwrap();
    let mut got = Vec::new();
    loop {
        match path {
            Path::Walk => match m.alloc(N0, Order::ZERO, flags) {
                Some(p) => got.push(p),
                None => break,
            },
            Path::Cpu => match m.alloc_cpu(cpu, Order::ZERO, flags) {
                Some(p) => got.push(p),
                None => break,
            },
            Path::Handle => {
                let mut h = m.claim_cpu(cpu).unwrap();
                while let Some(p) = h.alloc(Order::ZERO, flags) {
                    got.push(p);
                }
                break;
            }
            Path::HandleBulk => {
                let mut h = m.claim_cpu(cpu).unwrap();
                let mut out = [Pfn::new(0); 64];
                loop {
                    let n = h.alloc_bulk(flags, &mut out);
                    got.extend_from_slice(&out[..n]);
                    if n == 0 {
                        break;
                    }
                }
                break;
            }
            Path::Interleave => {
                let mut t =
                    TaskPolicy::new(m, Policy::Interleave(NodeMask::from_nodes([N0])), false)
                        .unwrap();
                while let Some(p) = t.alloc(m, N0, Order::ZERO, flags) {
                    got.push(p);
                }
                break;
            }
            Path::Bulk => {
                let mut out = [Pfn::new(0); 64];
                let n = m.alloc_bulk(N0, flags, &mut out);
                got.extend_from_slice(&out[..n]);
                if n == 0 {
                    break;
                }
            }
        }
    }
    got
}

fn give_back(m: &Machine<'_>, frames: &[Pfn]) {
    for &p in frames {
        m.free(p, Order::ZERO).unwrap();
    }
}

/// Boots, scrubs all boot memory, and returns a frame freed dirty, then scrubbed, and a frame
/// freed clean: both free and clean, both watched.
fn two_clean_free_frames<'a>(sim: &'a Sim<'_>) -> (Machine<'a>, Pfn, Pfn) {
    let m = boot(sim);
    while m.scrub(N0, u64::MAX) > 0 {}
    let a = m.alloc(N0, Order::ZERO, AllocFlags::THISNODE).unwrap();
    let b = m.alloc(N0, Order::ZERO, AllocFlags::ZERO).unwrap();
    poke(sim.memory(), a, 100, 0x5a);
    m.free(a, Order::ZERO).unwrap();
    assert_eq!(m.scrub(N0, u64::MAX), 0);
    // `b` still reads as zero: it goes back clean.
    m.free_clean(b, Order::ZERO).unwrap();
    (m, a, b)
}

#[test]
fn a_write_into_a_free_clean_frame_is_reported_on_every_path() {
    let spec = spec();
    for path in PATHS {
        for flags in [AllocFlags::empty(), AllocFlags::ZERO] {
            let sim = Sim::new(&spec).unwrap();
            let (m, a, b) = two_clean_free_frames(&sim);
            assert_eq!(m.writes_after_free().frames, 0, "{path:?}");
            poke(sim.memory(), a, 7, 1);
            let got = take_all(&m, path, flags);
            assert!(
                got.contains(&a),
                "{path:?} {flags:?}: the written frame was handed out"
            );
            let seen = m.writes_after_free();
            assert_eq!(seen.frames, 1, "{path:?} {flags:?}");
            assert_eq!(seen.last, Some(a), "{path:?} {flags:?}");
            if flags.contains(AllocFlags::ZERO) {
                // The promise of zeros holds for the written frame too.
                assert!(got.iter().all(|&p| reads_zero(sim.memory(), p)), "{path:?}");
            }
            give_back(&m, &got);
            m.drain_all();
            // The frame freed clean, written after its free.
            while m.scrub(N0, u64::MAX) > 0 {}
            let c = m.alloc(N0, Order::ZERO, AllocFlags::ZERO).unwrap();
            m.free_clean(c, Order::ZERO).unwrap();
            poke(sim.memory(), b, PAGE_SIZE as usize - 1, 0xff);
            poke(sim.memory(), c, 0, 0xff);
            let got = take_all(&m, path, flags);
            let seen = m.writes_after_free();
            assert_eq!(
                seen.frames,
                if b == c { 2 } else { 3 },
                "{path:?} {flags:?}"
            );
            assert!(seen.last == Some(b) || seen.last == Some(c), "{path:?}");
            give_back(&m, &got);
            m.check_invariants().unwrap();
        }
    }
}

#[test]
fn nothing_is_reported_without_a_write_after_free() {
    let spec = spec();
    for path in PATHS {
        for flags in [AllocFlags::empty(), AllocFlags::ZERO] {
            let sim = Sim::new(&spec).unwrap();
            let (m, _, _) = two_clean_free_frames(&sim);
            // Owners write their frames, then free half of them dirty, clear and free the
            // other half clean, and a scrub cleans some of the dirty ones.
            let got = take_all(&m, path, flags);
            for (i, &p) in got.iter().enumerate() {
                poke(sim.memory(), p, i % PAGE_SIZE as usize, 0xa5);
                if i % 2 == 0 {
                    m.free(p, Order::ZERO).unwrap();
                } else {
                    poke(sim.memory(), p, i % PAGE_SIZE as usize, 0);
                    m.free_clean(p, Order::ZERO).unwrap();
                }
            }
            m.drain_all();
            m.scrub(N0, got.len() as u64 / 4);
            let again = take_all(&m, path, flags);
            assert_eq!(again.len(), got.len(), "{path:?} {flags:?}");
            assert_eq!(found(&m), (0, None), "{path:?} {flags:?}");
            give_back(&m, &again);
            m.check_invariants().unwrap();
        }
    }
}

/// How the owner frees the frames it took (each way takes its frames so that the free goes
/// down the path it names).
#[derive(Clone, Copy, Debug)]
enum Free {
    /// `Machine::free` of frames the walk took from the zone.
    Zone,
    /// `Machine::free` of an order-3 block from the zone.
    Block,
    /// `Machine::free` of frames lent to the CPU's cache (`alloc_cpu`): a remote free.
    Remote,
    /// `Machine::free_cpu` into the CPU's own pageblock.
    Cpu,
    /// `CpuHandle::free` into the CPU's own pageblock.
    Handle,
    /// `Machine::free_bulk` of frames from the zone and from the CPU's cache.
    Bulk,
    /// `CpuHandle::free_bulk` of frames of the CPU's own pageblock.
    HandleBulk,
}

const FREES: [Free; 7] = [
    Free::Zone,
    Free::Block,
    Free::Remote,
    Free::Cpu,
    Free::Handle,
    Free::Bulk,
    Free::HandleBulk,
];

/// Takes frames for `free` to free, and writes each of them whole, as their owner would.
fn own(m: &Machine<'_>, mem: &SimMemory, free: Free) -> Vec<Pfn> {
    let cpu = m.cpu(0).unwrap();
    let flags = AllocFlags::THISNODE;
    let walk = || m.alloc(N0, Order::ZERO, flags).unwrap();
    let cached = || m.alloc_cpu(cpu, Order::ZERO, flags).unwrap();
    let got: Vec<Pfn> = match free {
        Free::Zone => (0..4).map(|_| walk()).collect(),
        Free::Block => {
            let p = m.alloc(N0, Order::new(3), flags).unwrap();
            (0..8).map(|i| Pfn::new(p.get() + i)).collect()
        }
        Free::Remote | Free::Cpu => (0..4).map(|_| cached()).collect(),
        Free::Handle | Free::HandleBulk => {
            let mut h = m.claim_cpu(cpu).unwrap();
            (0..4)
                .map(|_| h.alloc(Order::ZERO, flags).unwrap())
                .collect()
        }
        Free::Bulk => vec![walk(), cached(), walk(), cached()],
    };
    for &p in &got {
        // SAFETY: the allocator handed the frame to this test, which has not freed it.
        unsafe { mem.fill(PhysRange::new(p, Pfn::new(p.get() + 1)).unwrap(), 0x5a) };
    }
    got
}

/// Frees the frames [`own`] took for `free`, dirty, down its path.
fn release(m: &Machine<'_>, free: Free, frames: &[Pfn]) -> Result<(), FreeError> {
    let cpu = m.cpu(0).unwrap();
    match free {
        Free::Zone | Free::Remote => frames.iter().try_for_each(|&p| m.free(p, Order::ZERO)),
        Free::Block => m.free(frames[0], Order::new(3)),
        Free::Cpu => frames
            .iter()
            .try_for_each(|&p| m.free_cpu(cpu, p, Order::ZERO)),
        Free::Handle => {
            let mut h = m.claim_cpu(cpu).unwrap();
            frames.iter().try_for_each(|&p| h.free(p, Order::ZERO))
        }
        Free::Bulk => m.free_bulk(frames).map_err(|e| e.error),
        Free::HandleBulk => m
            .claim_cpu(cpu)
            .unwrap()
            .free_bulk(frames)
            .map_err(|e| e.error),
    }
}

#[test]
fn the_pattern_is_linuxs_page_poison() {
    assert_eq!(numaframe::POISON_BYTE, PATTERN);
}

#[test]
fn a_write_into_a_frame_freed_dirty_is_reported_on_every_path() {
    let spec = spec();
    for path in PATHS {
        for flags in [AllocFlags::empty(), AllocFlags::ZERO] {
            for free in FREES {
                let sim = Sim::new(&spec).unwrap();
                let mem = sim.memory();
                let m = boot(&sim);
                let victims = own(&m, mem, free);
                release(&m, free, &victims).unwrap();
                // The free filled them: the owner's bytes are gone.
                for &v in &victims {
                    assert!(reads_as(mem, v, PATTERN), "{free:?}: {v:?} after its free");
                }
                let written = victims[1];
                poke(mem, written, 9, 0x11);
                let got = take_all(&m, path, flags);
                let case = format!("{path:?} {flags:?} {free:?}");
                assert!(
                    got.contains(&written),
                    "{case}: the written frame was handed out"
                );
                assert_eq!(found(&m), (1, Some(written)), "{case}");
                if flags.contains(AllocFlags::ZERO) {
                    assert!(got.iter().all(|&p| reads_zero(mem, p)), "{case}");
                } else {
                    // Boot memory and the frames freed dirty alike: every frame but the
                    // written one comes back holding the pattern.
                    let other = got.iter().filter(|&&p| p != written);
                    assert!(other.copied().all(|p| reads_as(mem, p, PATTERN)), "{case}");
                }
                give_back(&m, &got);
                m.check_invariants().unwrap();
            }
        }
    }
}

#[test]
fn boot_memory_holds_what_it_was_declared_and_reports_nothing() {
    let spec = spec();
    for path in PATHS {
        for zeroed in [false, true] {
            let sim = Sim::new(&spec).unwrap();
            let mem = sim.memory();
            let m = boot_on(&spec, mem, sim.ranges(), zeroed);
            let got = take_all(&m, path, AllocFlags::empty());
            assert!(!got.is_empty());
            let byte = if zeroed { 0 } else { PATTERN };
            assert!(
                got.iter().all(|&p| reads_as(mem, p, byte)),
                "{path:?} {zeroed}"
            );
            assert_eq!(
                m.writes_after_free(),
                Default::default(),
                "{path:?} {zeroed}"
            );
        }
    }
}

#[test]
fn hot_added_memory_holds_the_pattern_and_a_write_into_it_is_reported() {
    let spec = spec();
    let frames = 64 * MIB / PAGE_SIZE;
    let mem = SimMemory::new(&[(0, 128 * MIB)]).unwrap();
    let range = |from: u64| PhysRange::new(Pfn::new(from), Pfn::new(from + frames)).unwrap();
    let booted = [MemoryRange {
        node: N0,
        range: range(0),
    }];
    let m = boot_on(&spec, &mem, &booted, true);
    m.hot_add(&mem, N0, range(frames), FallbackOptions::default())
        .unwrap();
    let got = take_all(&m, Path::Walk, AllocFlags::empty());
    let added: Vec<Pfn> = got
        .iter()
        .copied()
        .filter(|&p| range(frames).contains(p))
        .collect();
    assert!(added.len() as u64 > frames / 2);
    assert!(added.iter().all(|&p| reads_as(&mem, p, PATTERN)));
    assert_eq!(m.writes_after_free().frames, 0);
    // Freed again (filled again), one of them written after its free.
    give_back(&m, &added);
    poke(&mem, added[7], 0, 0);
    let again = take_all(&m, Path::Walk, AllocFlags::empty());
    assert!(again.contains(&added[7]));
    assert_eq!(found(&m), (1, Some(added[7])));
}

#[test]
fn a_scrub_finds_a_write_into_a_frame_freed_dirty() {
    let spec = spec();
    for free in [Free::Zone, Free::Block, Free::Bulk] {
        let sim = Sim::new(&spec).unwrap();
        let mem = sim.memory();
        let m = boot(&sim);
        let victims = own(&m, mem, free);
        // The CPU's cache gives its pageblock back: only the zones' free frames are scrubbed.
        m.drain_all();
        // Boot memory holds the pattern: scrubbing it finds nothing.
        while m.scrub(N0, u64::MAX) > 0 {}
        assert_eq!(m.writes_after_free().frames, 0, "{free:?}");
        release(&m, free, &victims).unwrap();
        m.drain_all();
        poke(mem, victims[2], PAGE_SIZE as usize - 1, 0x01);
        while m.scrub(N0, u64::MAX) > 0 {}
        assert_eq!(found(&m), (1, Some(victims[2])), "{free:?}");
        assert!(victims.iter().all(|&v| reads_zero(mem, v)), "{free:?}");
        // Scrubbed, the frames are clean: nothing more is found when they are handed out.
        let got = take_all(&m, Path::Walk, AllocFlags::empty());
        assert_eq!(m.writes_after_free().frames, 1, "{free:?}");
        give_back(&m, &got);
    }
}

#[test]
fn a_double_free_is_refused_and_leaves_the_frames_alone() {
    let spec = spec();
    for free in FREES {
        let sim = Sim::new(&spec).unwrap();
        let mem = sim.memory();
        let m = boot(&sim);
        let victims = own(&m, mem, free);
        release(&m, free, &victims).unwrap();
        // Free frames whose bytes the test knows: the pattern, one marked byte each.
        for (i, &v) in victims.iter().enumerate() {
            poke(mem, v, i, 0x33);
        }
        let err = release(&m, free, &victims).unwrap_err();
        assert!(
            matches!(err, FreeError::DoubleFree { .. }),
            "{free:?}: {err:?}"
        );
        for (i, &v) in victims.iter().enumerate() {
            let kept = peek(mem, v, i) == 0x33;
            poke(mem, v, i, PATTERN);
            assert!(
                kept && reads_as(mem, v, PATTERN),
                "{free:?}: the refused free wrote {v:?}"
            );
            poke(mem, v, i, 0x33);
        }
        // Handed out again, each marked frame is reported.
        let got = take_all(&m, Path::Walk, AllocFlags::empty());
        assert_eq!(
            m.writes_after_free().frames,
            victims.len() as u64,
            "{free:?}"
        );
        give_back(&m, &got);
        m.check_invariants().unwrap();
    }
}

#[test]
fn a_huge_page_given_back_holds_the_pattern_and_a_write_into_it_is_reported() {
    let spec = spec();
    let size = HugeSize::Size2M;
    let frames = size.order().frames();
    for flags in [AllocFlags::empty(), AllocFlags::ZERO] {
        let sim = Sim::new(&spec).unwrap();
        let mem = sim.memory();
        let m = boot(&sim);
        assert_eq!(m.reserve_huge(N0, size, 1), 1);
        let p = m.alloc_huge(N0, size).unwrap();
        let block = PhysRange::new(p, Pfn::new(p.get() + frames)).unwrap();
        // SAFETY: the pool handed the page to this test, which has not given it back.
        unsafe { mem.fill(block, 0x5a) };
        m.free_huge(p, size).unwrap();
        let pages = || (0..frames).map(|i| Pfn::new(p.get() + i));
        assert!(pages().all(|f| reads_as(mem, f, PATTERN)));
        // A second return is refused and writes nothing.
        poke(mem, p, 3, 0x33);
        assert!(matches!(
            m.free_huge(p, size),
            Err(FreeError::DoubleFree { .. })
        ));
        assert_eq!(peek(mem, p, 3), 0x33);
        poke(mem, p, 3, PATTERN);
        assert!(pages().all(|f| reads_as(mem, f, PATTERN)));
        let written = Pfn::new(p.get() + 100);
        poke(mem, written, 64, 0x77);
        assert_eq!(m.alloc_huge_with(N0, size, flags), Some(p));
        assert_eq!(found(&m), (1, Some(written)), "{flags:?}");
        let byte = if flags.contains(AllocFlags::ZERO) {
            0
        } else {
            PATTERN
        };
        assert!(
            pages()
                .filter(|&f| f != written)
                .all(|f| reads_as(mem, f, byte)),
            "{flags:?}"
        );
    }
}

/// Two frees of one frame of a pageblock lent to CPU 0 race (a caller's double free): one frees
/// it clean (the caller zeroed it), the other dirty. When the clean free wins, the refused dirty
/// free must leave the frame's bytes alone: the frame is free and clean and must read as zero.
/// Before the fix the dirty free filled the frame between its check of the state byte and its
/// swap, whichever free then won.
fn racing_double_free(owner_clean: bool) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let node = NodeSpec {
        cpus: vec![0, 1],
        memory_bytes: 64 * MIB,
        socket: None,
        initiator: None,
        bandwidth_gbps: None,
    };
    let spec = MachineSpec::new("poison-race", vec![node], vec![10], None).unwrap();
    let sim = Sim::new(&spec).unwrap();
    let mem = sim.memory();
    let cpus = [N0, N0];
    let m = Machine::boot(
        spec.topology(),
        mem,
        sim.ranges(),
        BootOptions {
            cpus: &cpus,
            ..BootOptions::default()
        },
    )
    .unwrap()
    .with_clearer(mem);
    let c0 = m.cpu(0).unwrap();
    // Before the fix, both directions failed within 11 to 232 rounds.
    for round in 0..2_000 {
        let x = m.alloc_cpu(c0, Order::ZERO, AllocFlags::empty()).unwrap();
        // The caller clears the frame before its clean free (the promise of `free_clean`).
        numaframe::FrameClearer::clear(mem, PhysRange::new(x, Pfn::new(x.get() + 1)).unwrap());
        let go = AtomicUsize::new(0);
        let (mine, theirs) = std::thread::scope(|s| {
            let other = s.spawn(|| {
                go.fetch_add(1, Ordering::SeqCst);
                while go.load(Ordering::SeqCst) < 2 {
                    std::hint::spin_loop();
                }
                if owner_clean {
                    m.free(x, Order::ZERO)
                } else {
                    m.free_clean(x, Order::ZERO)
                }
            });
            go.fetch_add(1, Ordering::SeqCst);
            while go.load(Ordering::SeqCst) < 2 {
                std::hint::spin_loop();
            }
            // Sweeps the owner's free across the other free's window.
            for _ in 0..(round * 7919) % 600 {
                std::hint::spin_loop();
            }
            let mine = if owner_clean {
                m.free_cpu_clean(c0, x, Order::ZERO)
            } else {
                m.free_cpu(c0, x, Order::ZERO)
            };
            (mine, other.join().unwrap())
        });
        assert!(
            mine.is_ok() != theirs.is_ok(),
            "one free wins: {mine:?} {theirs:?}"
        );
        if mine.is_ok() == owner_clean {
            assert!(
                reads_zero(mem, x),
                "owner_clean {owner_clean} round {round}: the refused dirty free ({mine:?} / \
                 {theirs:?}) filled {x:?}, which is free and clean"
            );
        } else {
            assert!(reads_as(mem, x, PATTERN), "the dirty free filled {x:?}");
        }
    }
    assert_eq!(found(&m).0, 0, "nothing was written after free");
    m.check_invariants().unwrap();
}

#[test]
fn a_refused_remote_poisoning_free_leaves_the_owners_clean_frame_alone() {
    racing_double_free(true);
}

#[test]
fn a_refused_owner_poisoning_free_leaves_a_remote_clean_frame_alone() {
    racing_double_free(false);
}
