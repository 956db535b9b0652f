//! Runs LLFree's "repeat" pattern on the benchmark's exact 1 GiB node through one numaframe API,
//! for instruction counts under a profiler: every frame held, then a free of a random held
//! frame and an allocation, over and over (`numaframe bench`'s repeat row, `bench::ops::repeat`).
//! Run it at two counts and divide the difference in instructions by the difference in rounds,
//! so that booting and the fill cancel out.
//!
//! `valgrind --tool=callgrind target/release/examples/repeat cpu 20000`, with the API `node`
//! (`Machine::alloc`/`free` on node 0) or `cpu` (`alloc_cpu`/`free_cpu`). It prints the wall
//! time per round too (a rough figure: `numaframe bench` is the measurement).
#![deny(unsafe_code)]

use std::process::ExitCode;

use numaframe::{AllocFlags, NodeId};
use numaframe_hosted::bench::ops::{Rng, repeat};
use numaframe_hosted::bench::{FRAMES_1G, Frames, NumaCpu, NumaNode, OneNode};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(api), Some(Ok(rounds))) = (args.first(), args.get(1).map(|n| n.parse::<u64>()))
    else {
        eprintln!("error: usage: repeat node|cpu ROUNDS");
        return ExitCode::from(2);
    };
    let node = match OneNode::exact(FRAMES_1G) {
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
        "cpu" => Box::new(NumaCpu::new(&m, 0)),
        other => {
            eprintln!("error: unknown API {other:?} (node or cpu)");
            return ExitCode::from(2);
        }
    };
    let (mut held, mut rng) = (Vec::new(), Rng::new(0x7e9e_a700));
    let s = repeat(&mut *frames, &mut held, &mut rng, rounds);
    let ns = s.time.as_nanos() as f64 / rounds.max(1) as f64;
    println!("{api}: {rounds} rounds of LLFree's repeat, {ns:.2} ns per round");
    ExitCode::SUCCESS
}
