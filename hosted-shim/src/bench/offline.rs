//! Memory offlining: how long `Machine::offline` takes for a free range, for a range with 1% of
//! its frames in use (the refusal), and how long `hot_add` of the same range takes to bring it
//! back.
//!
//! The machine: node 0 of 1 GiB at 4 GiB, and a range of `frames` right above it hot-added to
//! node 0 too, so both spans share the `Normal` zone and its metadata pool (the range's region
//! seeds the pool, and its frames grow it: offlining has to move the boot span's metadata out).
//! Four cases, each the median of `runs` runs on a fresh machine:
//! - *fresh*: the range as hot-added, never used: whole free sections;
//! - *after use*: every frame of node 0 handed out in 4 KiB frames (bulks), then, in random
//!   order, all of the range's freed and the boot span's in every other pageblock: the range's
//!   sections were split and merged back, the pool grew from its frames, and the planes of the
//!   boot span's full pageblocks partly lie in the range's memory and must move out (into
//!   slabs carved from the boot span's free pageblocks);
//! - *1% busy*: the same, but 1% of the range's frames (random ones) stay allocated, so the
//!   offline is refused after isolating, draining and checking the range;
//! - *re-add*: `hot_add` of the range after the successful offline.
#![deny(unsafe_code)]

use std::io;
use std::time::Instant;

use numaframe::zonelist::FallbackOptions;
use numaframe::{
    AllocFlags, BootOptions, Machine, MemoryRange, NodeId, OfflineError, OfflineOptions, Order,
    PAGE_SIZE, Pfn, PhysAddr, PhysRange,
};
use serde::Serialize;

use super::{NODE_BASE, Rng, report::median};
use crate::sim::SimMemory;
use crate::spec::{MachineSpec, NodeSpec};

/// Bytes of the boot node.
const BOOT_BYTES: u64 = (1 << 30) + (16 << 20);
/// Where the range starts: the first 1 GiB boundary above the boot node.
const RANGE_BASE: u64 = NODE_BASE + (2 << 30);

/// One timed case.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Case {
    /// Median ns of one call.
    pub ns: f64,
    /// Bytes of the range per second, GiB/s.
    pub gib_per_s: f64,
}

/// What the offline experiment measured.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Offline {
    /// Bytes of the range.
    pub range_bytes: u64,
    /// Offline of the range as hot-added.
    pub fresh: Case,
    /// Offline of the range after every frame of it was used and freed.
    pub after_use: Case,
    /// The refused offline with 1% of the frames in use.
    pub busy: Case,
    /// Pageblocks the refusal counted as busy.
    pub busy_pageblocks: u64,
    /// `hot_add` of the range after it went offline.
    pub re_add: Case,
}

/// A machine with the range hot-added, over its own simulated memory.
struct World {
    spec: MachineSpec,
    memory: SimMemory,
    range: PhysRange,
}

impl World {
    fn new(frames: u64) -> io::Result<World> {
        let node = NodeSpec {
            cpus: vec![0],
            memory_bytes: BOOT_BYTES,
            socket: Some(0),
            ..NodeSpec::default()
        };
        let spec = MachineSpec::new("bench-offline", vec![node], vec![10], None)
            .map_err(|e| io::Error::other(e.to_string()))?;
        let bytes = frames * PAGE_SIZE;
        let memory = SimMemory::new(&[(NODE_BASE, BOOT_BYTES), (RANGE_BASE, bytes)])?;
        let range = PhysRange::from_bytes(PhysAddr::new(RANGE_BASE), bytes)
            .ok_or_else(|| io::Error::other("offline range"))?;
        Ok(World {
            spec,
            memory,
            range,
        })
    }

    fn boot(&self) -> io::Result<Machine<'_>> {
        let boot = PhysRange::from_bytes(PhysAddr::new(NODE_BASE), BOOT_BYTES)
            .ok_or_else(|| io::Error::other("boot range"))?;
        let cpus = [NodeId::new(0)];
        let m = Machine::boot(
            self.spec.topology(),
            &self.memory,
            &[MemoryRange {
                node: NodeId::new(0),
                range: boot,
            }],
            BootOptions {
                cpus: &cpus,
                min_free_kbytes: Some(0),
                lowmem_reserve_ratio: 0,
                ..BootOptions::default()
            },
        )
        .map_err(|e| io::Error::other(format!("boot: {e}")))?;
        self.add(&m)?;
        Ok(m)
    }

    fn add<'a>(&'a self, m: &Machine<'a>) -> io::Result<()> {
        m.hot_add(
            &self.memory,
            NodeId::new(0),
            self.range,
            FallbackOptions::default(),
        )
        .map_err(|e| io::Error::other(format!("hot_add: {e}")))
    }
}

/// Every frame node 0 has, in 4 KiB frames, then in random order all but `keep` of the range's
/// freed, and those of the boot span's odd pageblocks; returns the frames kept of the range,
/// and of the boot span.
fn use_all(
    m: &Machine<'_>,
    range: PhysRange,
    keep: f64,
    rng: &mut Rng,
) -> io::Result<(Vec<Pfn>, Vec<Pfn>)> {
    let mut all = Vec::new();
    let mut out = vec![Pfn::new(0); 1 << 16];
    loop {
        let got = m.alloc_bulk(NodeId::new(0), AllocFlags::empty(), &mut out);
        all.extend_from_slice(&out[..got]);
        if got < out.len() {
            break;
        }
    }
    for i in (1..all.len()).rev() {
        all.swap(i, rng.below(i as u64 + 1) as usize);
    }
    let (mut kept, mut boot) = (Vec::new(), Vec::new());
    for p in all {
        if range.contains(p) {
            if (rng.below(1_000_000) as f64) < keep * 1e6 {
                kept.push(p);
                continue;
            }
        } else if (p.get() >> 9) % 2 == 0 {
            boot.push(p);
            continue;
        }
        m.free(p, Order::ZERO).map_err(io::Error::other)?;
    }
    Ok((kept, boot))
}

fn case(bytes: u64, times: &mut [f64]) -> Case {
    let ns = median(times);
    Case {
        ns,
        gib_per_s: bytes as f64 / (1u64 << 30) as f64 / (ns / 1e9),
    }
}

/// Runs the four cases over a range of `frames` frames, `runs` times each.
///
/// # Errors
/// If a machine cannot be built, or an offline that should succeed fails (or one that should
/// fail succeeds).
pub fn run(frames: u64, runs: usize) -> io::Result<Offline> {
    let mut rng = Rng::new(0x0ff1_1e5e);
    let (mut fresh, mut after_use, mut busy, mut re_add) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut busy_pageblocks = 0;
    let opts = OfflineOptions::default();
    let mut bytes = 0;
    for _ in 0..runs {
        let w = World::new(frames)?;
        let m = w.boot()?;
        bytes = w.range.bytes();
        let t = Instant::now();
        m.offline(&w.memory, w.range, opts)
            .map_err(io::Error::other)?;
        fresh.push(t.elapsed().as_nanos() as f64);

        let t = Instant::now();
        w.add(&m)?;
        re_add.push(t.elapsed().as_nanos() as f64);

        let (kept, boot) = use_all(&m, w.range, 0.01, &mut rng)?;
        let t = Instant::now();
        match m.offline(&w.memory, w.range, opts) {
            Err(OfflineError::Busy { busy: n, .. }) => busy_pageblocks = n,
            other => return Err(io::Error::other(format!("1% busy: {other:?}"))),
        }
        busy.push(t.elapsed().as_nanos() as f64);
        for p in kept {
            m.free(p, Order::ZERO).map_err(io::Error::other)?;
        }
        m.drain_all();
        let t = Instant::now();
        m.offline(&w.memory, w.range, opts)
            .map_err(io::Error::other)?;
        after_use.push(t.elapsed().as_nanos() as f64);
        m.check_invariants()
            .map_err(|e| io::Error::other(format!("after the offline: {e:?}")))?;
        for p in boot {
            m.free(p, Order::ZERO).map_err(io::Error::other)?;
        }
    }
    Ok(Offline {
        range_bytes: bytes,
        fresh: case(bytes, &mut fresh),
        after_use: case(bytes, &mut after_use),
        busy: case(bytes, &mut busy),
        busy_pageblocks,
        re_add: case(bytes, &mut re_add),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_case_runs_on_a_small_range() {
        let r = run(1 << 16, 1).unwrap();
        assert_eq!(r.range_bytes, (1 << 16) * PAGE_SIZE);
        // 1% of 65536 frames over 128 pageblocks: nearly every pageblock holds one.
        assert!(r.busy_pageblocks > 64, "{}", r.busy_pageblocks);
        for c in [r.fresh, r.after_use, r.busy, r.re_add] {
            assert!(c.ns > 0.0 && c.gib_per_s > 0.0);
        }
    }
}
