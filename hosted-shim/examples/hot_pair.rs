//! Runs a number of hot order-0 pairs through one numaframe API on the 1 GiB benchmark node,
//! for instruction counts under a profiler: run it at two counts and divide the difference in
//! instructions by the difference in pairs, so that booting cancels out.
//!
//! `valgrind --tool=callgrind target/release/examples/hot_pair handle 100000 [ORDER]`, with the API one
//! of `node` (`Machine::alloc`/`free` on node 0: the zone's own path, no per-CPU cache), `cpu`
//! (`alloc_cpu`/`free_cpu`), `handle` (a claimed `CpuHandle`), `unchecked` (the handle's
//! `free_unchecked`) or `bulk` (each pair a `Machine::alloc_bulk` of 512 frames and their
//! `Machine::free_bulk`, timed per frame). It prints the wall time per pair too (of a loop through
//! `dyn Frames`, as the bench's cells are not: a rough figure, `numaframe bench` is the
//! measurement). `ORDER` (default 0) is the order of each pair's block; the per-CPU APIs send
//! orders above 0 to the zones.
#![deny(unsafe_code)]

use std::hint::black_box;
use std::process::ExitCode;
use std::time::Instant;

use numaframe::{AllocFlags, NodeId, Order, Pfn};
use numaframe_hosted::bench::{FRAMES_1G, Frames, NumaCpu, NumaHandle, NumaNode, OneNode};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(api), Some(Ok(pairs)), Ok(order)) = (
        args.first(),
        args.get(1).map(|n| n.parse::<u64>()),
        args.get(2).map_or(Ok(0), |o| o.parse::<u8>()),
    ) else {
        eprintln!("error: usage: hot_pair node|cpu|handle|unchecked|bulk PAIRS [ORDER]");
        return ExitCode::from(2);
    };
    if Order::try_new(order).is_none() {
        eprintln!("error: order {order} is above the largest order");
        return ExitCode::from(2);
    }
    let node = match OneNode::new(FRAMES_1G) {
        Ok(n) => n,
        Err(e) => {
            eprintln!("error: mapping the node: {e}");
            return ExitCode::FAILURE;
        }
    };
    let m = match node.boot() {
        Ok(m) => m,
        Err(e) => {
            eprintln!("error: booting the node: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut frames: Box<dyn Frames> = match api.as_str() {
        "node" => Box::new(NumaNode::new(&m, NodeId::new(0), AllocFlags::empty())),
        "cpu" | "bulk" => Box::new(NumaCpu::new(&m, 0)),
        "handle" => Box::new(NumaHandle::claim(&m, 0)),
        #[allow(unsafe_code)]
        // SAFETY: the loop below frees each frame it allocates once, right after.
        "unchecked" => Box::new(unsafe { NumaHandle::claim(&m, 0).unchecked() }),
        other => {
            eprintln!("error: unknown API {other:?} (node, cpu, handle, unchecked or bulk)");
            return ExitCode::from(2);
        }
    };
    let bulk = api == "bulk";
    let mut batch = vec![Pfn::new(0); 512];
    let start = Instant::now();
    for _ in 0..pairs {
        if bulk {
            let n = frames.alloc_bulk(&mut batch);
            frames.free_bulk(black_box(&batch[..n]));
        } else {
            let f = frames.alloc(order).expect("a fresh node has a free block");
            frames.free(black_box(f), order);
        }
    }
    let per = if bulk { batch.len() as u64 } else { 1 };
    let ns = start.elapsed().as_nanos() as f64 / (pairs * per).max(1) as f64;
    let unit = if bulk { "frame" } else { "pair" };
    println!("{api}: {pairs} pairs of order {order}, {ns:.2} ns per {unit}");
    ExitCode::SUCCESS
}
