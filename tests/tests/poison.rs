//! The `poison` debug mode: a write into a frame while it is free and clean is reported on the
//! allocation that hands the frame out, on every allocation path, and nothing is reported when
//! no such write happened.
//!
//! The planted write goes straight into the simulated memory, as a buggy owner that kept a
//! pointer to a frame it freed would.

use numaframe::{AllocFlags, BootOptions, CpuId, Machine, NodeId, Order, PAGE_SIZE, Pfn};
use numaframe_hosted::sim::{Sim, SimMemory};
use numaframe_hosted::spec::{MachineSpec, NodeSpec};

const MIB: u64 = 1 << 20;
const N0: NodeId = NodeId::new(0);

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
    let cpus = [N0];
    Machine::boot(
        sim.spec().topology(),
        sim.memory(),
        sim.ranges(),
        BootOptions {
            cpus: &cpus,
            ..BootOptions::default()
        },
    )
    .unwrap()
    .with_clearer(sim.memory())
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

/// `true` if every byte of frame `pfn` reads as zero (an oracle of its own: a plain read).
fn reads_zero(mem: &SimMemory, pfn: Pfn) -> bool {
    let p = mem.frame_ptr(pfn).unwrap();
    (0..PAGE_SIZE as usize).all(|i| {
        // SAFETY: byte `i` lies in the frame, which the test was handed and has not freed.
        unsafe { p.as_ptr().add(i).read_volatile() == 0 }
    })
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
}

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
    for path in [Path::Walk, Path::Cpu, Path::Bulk, Path::Handle] {
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
    for path in [Path::Walk, Path::Cpu, Path::Bulk, Path::Handle] {
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
            assert_eq!(m.writes_after_free().frames, 0, "{path:?} {flags:?}");
            assert_eq!(m.writes_after_free().last, None, "{path:?} {flags:?}");
            give_back(&m, &again);
            m.check_invariants().unwrap();
        }
    }
}
