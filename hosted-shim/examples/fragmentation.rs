//! Runs the two fragmentation scenarios of `numaframe bench` on their own, for numaframe and
//! the oracles only: LLFree's churn (`HBA_9`/`HBA_18` by round, the order-9 probe) and host and
//! guests (`HBA_18` by day, the guest memory backed by 1 GiB frames), so a placement change can
//! be measured in a minute instead of the whole bench's run.
//!
//! `cargo run --release -p numaframe-hosted --example fragmentation [GIB]` (default 16): both
//! scenarios over a node of `GIB` GiB, with the full run's rounds and days, through the same
//! APIs the bench uses (churn: per-CPU caches and the node API; host and guests: the node API);
//! prints each run's outcome as JSON.
#![deny(unsafe_code)]

use std::io::{self, Write};
use std::process::ExitCode;

use numaframe::{AllocFlags, NodeId, PAGE_SIZE};
use numaframe_hosted::bench::experiments::Sizes;
use numaframe_hosted::bench::oracle::Oracle;
use numaframe_hosted::bench::{NODE_BASE, NumaCpu, NumaNode, OneNode, churn, guests};
use serde_json::{Value, json};

fn main() -> ExitCode {
    let gib = match std::env::args().nth(1).map(|a| a.parse::<u64>()) {
        None => 16,
        Some(Ok(g)) if (1..=256).contains(&g) => g,
        Some(_) => {
            eprintln!("error: usage: fragmentation [GIB], GIB a whole number from 1 to 256");
            return ExitCode::from(2);
        }
    };
    let result = run((gib << 30) / PAGE_SIZE).and_then(|v| {
        let json = serde_json::to_string_pretty(&v).map_err(io::Error::other)?;
        writeln!(io::stdout(), "{json}")
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Both scenarios over `frames` frames.
fn run(frames: u64) -> io::Result<Value> {
    let (rounds, days) = (Sizes::FULL.churn_rounds, Sizes::FULL.guest_days);
    let base = NODE_BASE / PAGE_SIZE;
    let failed = |what: &'static str| move |e: String| io::Error::other(format!("{what}: {e}"));
    let churn_cpu = {
        let node = OneNode::exact(frames)?;
        let m = node.boot()?;
        let mut a = NumaCpu::new(&m, 0);
        churn::run(&mut a, base, frames, rounds, true, &mut |_| m.drain_all())
            .map_err(failed("churn, numaframe"))?
    };
    let churn_node = {
        let node = OneNode::exact(frames)?;
        let m = node.boot()?;
        let mut a = NumaNode::new(&m, NodeId::new(0), AllocFlags::empty());
        churn::run(&mut a, base, frames, rounds, true, &mut |_| {})
            .map_err(failed("churn, numaframe-node"))?
    };
    let churn_oracle = churn::run(
        &mut Oracle::blocks(frames),
        0,
        frames,
        rounds,
        true,
        &mut |_| {},
    )
    .map_err(failed("churn, oracle"))?;

    let guests_node = {
        let node = OneNode::exact(frames)?;
        let m = node.boot()?;
        let mut a = NumaNode::new(&m, NodeId::new(0), AllocFlags::empty());
        guests::run(&mut a, base, frames, days).map_err(failed("host and guests, numaframe"))?
    };
    let guests_oracle = guests::run(&mut Oracle::sections(frames), 0, frames, days)
        .map_err(failed("host and guests, oracle"))?;

    Ok(json!({
        "frames": frames,
        "churn": {
            "rounds": rounds,
            "numaframe": churn_cpu,
            "numaframe-node": churn_node,
            "oracle-blocks": churn_oracle,
        },
        "guests": {
            "days": days,
            "numaframe-node": guests_node,
            "oracle-sections": guests_oracle,
        },
    }))
}
