//! Boot-time huge-page reservation on the two big presets, 1 thread and 2
//! threads side by side:
//! - `12tb-2node`, `hugepagesz=1G hugepages=11776` (65.2 s on Linux, 18.3 s with padata);
//! - `1tb-2node`, `hugepagesz=2M hugepages=500000` (2 s on Linux, 1 s with padata).
//!
//! `reserve/…` times the reservation alone on a machine booted once; after each iteration the
//! pages go back to the buddy (untimed), so later iterations find the lazily built metadata of
//! split 1 GiB blocks already in place. `boot+reserve/…` boots a fresh simulated machine in
//! every iteration and times the boot and the reservation together, as the targets
//! (under 100 ms each) count them; mapping and unmapping the simulated memory is not timed.
//!
//! `cargo bench -p numaframe-hosted --bench hugepages`

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use numaframe::HugeSize;
use numaframe::hugetlb::ReservationPlan;
use numaframe::hugetlb::cmdline::parse;
use numaframe::{BootOptions, Machine};
use numaframe_hosted::hugepages::reserve;
use numaframe_hosted::presets::preset;
use numaframe_hosted::sim::Sim;

const THREADS: [usize; 2] = [1, 2];

fn label(threads: usize) -> String {
    format!("{threads} thread{}", if threads == 1 { "" } else { "s" })
}

/// Gives every pool page back to the buddy.
fn release_all(machine: &Machine<'_>) {
    for node in machine.topology().node_ids() {
        for size in HugeSize::ALL {
            machine.release_huge(node, size, u64::MAX);
        }
    }
}

fn scenario(c: &mut Criterion, name: &str, preset_name: &str, cmdline: &str, pages: u64) {
    let spec = preset(preset_name).expect("preset");
    let config = parse(cmdline).expect("command line");
    let mut group = c.benchmark_group(name);
    group
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));

    let sim = Sim::new(&spec).expect("simulated memory");
    let machine = sim.boot(BootOptions::default()).expect("boot");
    for threads in THREADS {
        group.bench_function(BenchmarkId::new("reserve", label(threads)), |b| {
            b.iter_custom(|iters| {
                let mut timed = Duration::ZERO;
                for _ in 0..iters {
                    let start = Instant::now();
                    let mut plan = ReservationPlan::new(&config, &machine).expect("plan");
                    let got = reserve(&mut plan, &machine, threads);
                    timed += start.elapsed();
                    assert_eq!(got, pages);
                    release_all(&machine);
                }
                timed
            });
        });
    }

    for threads in THREADS {
        group.bench_function(BenchmarkId::new("boot+reserve", label(threads)), |b| {
            b.iter_custom(|iters| {
                let mut timed = Duration::ZERO;
                for _ in 0..iters {
                    let sim = Sim::new(&spec).expect("simulated memory");
                    let start = Instant::now();
                    let machine = sim.boot(BootOptions::default()).expect("boot");
                    let mut plan = ReservationPlan::new(&config, &machine).expect("plan");
                    let got = reserve(&mut plan, &machine, threads);
                    timed += start.elapsed();
                    assert_eq!(black_box(got), pages);
                }
                timed
            });
        });
    }
    group.finish();
}

fn hugepages(c: &mut Criterion) {
    scenario(
        c,
        "hugepages/12tb-2node 1G x11776",
        "12tb-2node",
        "hugepagesz=1G hugepages=11776",
        11_776,
    );
    scenario(
        c,
        "hugepages/1tb-2node 2M x500000",
        "1tb-2node",
        "hugepagesz=2M hugepages=500000",
        500_000,
    );
}

criterion_group!(benches, hugepages);
criterion_main!(benches);
