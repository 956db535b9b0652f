//! The `--report` part of `numaframe demo`: a guest touches its memory and is torn down, the
//! machine reports its free memory to Linux, and the process's resident memory shows it.
#![deny(unsafe_code)]

use std::time::Instant;

use numaframe::{AllocFlags, FrameClearer, Machine, NodeId, Order, Pfn, PhysRange, ZoneKind};
use serde_json::{Value, json};

use crate::reporting::HostReporter;
use crate::sim::{Sim, process_rss_bytes};

/// The guest's memory: 1 GiB, or the first memory node's free memory in 2 MiB blocks if less.
const GUEST_BYTES: u64 = 1 << 30;

/// What the guest and the report did.
pub(super) struct GuestReport {
    node: NodeId,
    guest_bytes: u64,
    /// Resident bytes before the guest, with it running, after its teardown, after the report.
    rss: [u64; 4],
    blocks: u64,
    frames: u64,
    batches: u64,
    released: u64,
    elapsed_ms: f64,
    /// `(node, [Dma32, Normal] reported pages, free pages)`.
    nodes: Vec<(usize, [u64; 2], u64)>,
}

/// Runs a guest on the first memory node, tears it down and reports every memory node.
pub(super) fn guest_teardown(sim: &Sim<'_>, machine: &Machine<'_>) -> GuestReport {
    let rss = || process_rss_bytes().unwrap_or(0);
    let node = machine
        .memory_nodes()
        .iter()
        .next()
        .unwrap_or(NodeId::new(0));
    let before = rss();
    let mut guest = Vec::new();
    let order = Order::HUGE_2M;
    while (guest.len() as u64) * order.frames() * numaframe::PAGE_SIZE < GUEST_BYTES {
        let Some(p) = machine.alloc(node, order, AllocFlags::THISNODE) else {
            break;
        };
        // The guest writes all its memory (zeros: what it writes does not matter, that it
        // touches every page does).
        if let Some(r) = PhysRange::new(p, Pfn::new(p.get() + order.frames())) {
            sim.memory().clear(r);
        }
        guest.push(p);
    }
    let guest_bytes = guest.len() as u64 * order.frames() * numaframe::PAGE_SIZE;
    let running = rss();
    for p in guest {
        // The guest frees exactly the blocks it was given.
        let _ = machine.free(p, order);
    }
    let torn_down = rss();
    let host = HostReporter::new(sim.memory());
    let (mut blocks, mut frames, mut batches) = (0, 0, 0);
    let t = Instant::now();
    for id in machine.memory_nodes().iter() {
        if let Ok(done) = host.report(machine, id, order) {
            blocks += done.blocks;
            frames += done.frames;
            batches += done.batches;
        }
    }
    let elapsed_ms = t.elapsed().as_secs_f64() * 1e3;
    let nodes = machine
        .memory_nodes()
        .iter()
        .filter_map(|id| {
            let n = machine.node(id)?;
            Some((
                id.index(),
                ZoneKind::ALL.map(|k| n.zone(k).counters().reported),
                n.free_pages(),
            ))
        })
        .collect();
    GuestReport {
        node,
        guest_bytes,
        rss: [before, running, torn_down, rss()],
        blocks,
        frames,
        batches,
        released: host.released_frames(),
        elapsed_ms,
        nodes,
    }
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1 << 20) as f64)
}

impl GuestReport {
    pub(super) fn json(&self) -> Value {
        json!({
            "guest_node": self.node.index(),
            "guest_bytes": self.guest_bytes,
            "rss_bytes": {
                "before_guest": self.rss[0],
                "guest": self.rss[1],
                "torn_down": self.rss[2],
                "reported": self.rss[3],
            },
            "blocks": self.blocks,
            "frames": self.frames,
            "batches": self.batches,
            "released_frames": self.released,
            "elapsed_ms": self.elapsed_ms,
            "reported": self.nodes.iter().map(|(n, r, free)| json!({
                "node": n, "dma32": r[0], "normal": r[1], "free": free,
            })).collect::<Vec<_>>(),
        })
    }

    pub(super) fn text(&self) -> String {
        let bytes = self.frames * numaframe::PAGE_SIZE;
        let secs = self.elapsed_ms / 1e3;
        let mut s = format!(
            "Free-page reporting: a guest of {} on node {} touches its memory and is torn down, then every node reports its free blocks of 2 MiB or more to Linux (madvise(MADV_DONTNEED))\n  process RSS (/proc/self/statm): {} before the guest, {} with it, {} after its teardown, {} after the report\n  reported {} blocks ({:.2} GiB) in {} batches in {:.1} ms ({:.0} GiB/s); reported free pages per zone:\n  {:>5} {:>12} {:>12} {:>12}",
            mib(self.guest_bytes),
            self.node,
            mib(self.rss[0]),
            mib(self.rss[1]),
            mib(self.rss[2]),
            mib(self.rss[3]),
            self.blocks,
            bytes as f64 / (1u64 << 30) as f64,
            self.batches,
            self.elapsed_ms,
            if secs > 0.0 {
                bytes as f64 / (1u64 << 30) as f64 / secs
            } else {
                0.0
            },
            "node",
            "Dma32",
            "Normal",
            "free",
        );
        for (n, r, free) in &self.nodes {
            s.push_str(&format!("\n  {n:>5} {:>12} {:>12} {free:>12}", r[0], r[1]));
        }
        s
    }
}
